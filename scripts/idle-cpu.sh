#!/usr/bin/env bash
# CPU an idle node uses: starts `shardmq serve` (SHARDS shards, default 2) with no client,
# waits for it to be ready, and reads its user + system time from /proc over SECONDS (20).
# Prints the share of one core. Usage: scripts/idle-cpu.sh [BINARY] [SECONDS]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
binary=${1:-target/release/shardmq}
seconds=${2:-20}
shards=${SHARDS:-2}
dir=$(mktemp -d /tmp/shardmq-idle-XXXXXX)
port=$(( 20000 + RANDOM % 20000 ))
log="$dir/out.log"
"$binary" serve --shards "$shards" --data-dir "$dir/data" --namesrv-port "$port" \
    --broker-port $(( port + 20 )) --segment-size-mib 64 ${EXTRA:-} >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
wait_ready "$log" "$pid" 20
sleep 3   # start-up work (zero-fill of the first window) settles
# Nanoseconds on a CPU, summed over every thread (schedstat's first field).
cpu_ns() { cat /proc/$pid/task/*/schedstat | awk '{ sum += $1 } END { printf "%d", sum }'; }
wakeups() { cat /proc/$pid/task/*/status | awk '/^voluntary_ctxt_switches/ { sum += $2 } END { printf "%d", sum }'; }
before=$(cpu_ns); woke_before=$(wakeups)
sleep "$seconds"
after=$(cpu_ns); woke_after=$(wakeups)
awk -v b="$before" -v a="$after" -v s="$seconds" -v n="$shards" -v wb="$woke_before" -v wa="$woke_after" \
    'BEGIN { printf "idle %d-shard node: %.3f%% of one core over %d s, %.1f wake-ups/s (all threads)\n", n, 100 * (a - b) / 1e9 / s, s, (wa - wb) / s }'

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
# Per thread: its id, nanoseconds on a CPU (schedstat's first field), voluntary switches.
threads() {
    for task in /proc/$pid/task/*; do
        printf '%s %s %s\n' "${task##*/}" "$(cut -d' ' -f1 "$task/schedstat" 2>/dev/null)" \
            "$(awk '/^voluntary_ctxt_switches/ {print $2}' "$task/status" 2>/dev/null)"
    done
}
threads > "$dir/before"
sleep "$seconds"
threads > "$dir/after"
# Summed over the threads alive at both ends (io_uring's workers come and go: a thread that
# exits takes its counts with it); the threads that came or went are counted apart.
awk -v s="$seconds" -v n="$shards" '
    NR == FNR { cpu[$1] = $2; woke[$1] = $3; next }
    $1 in cpu { c += $2 - cpu[$1]; w += $3 - woke[$1]; both++; delete cpu[$1]; next }
    { came++ }
    END {
        for (t in cpu) went++
        printf "idle %d-shard node: %.3f%% of one core over %d s, %.1f wake-ups/s (%d threads; %d came, %d went meanwhile, not counted)\n",
            n, 100 * c / 1e9 / s, s, w / s, both, came, went
    }' "$dir/before" "$dir/after"

#!/usr/bin/env bash
# What idle connections cost a busy shard (issue 17): for each round, each shardmq BINARY in
# turn runs one shard on CPU 0 (a fresh broker), with the bench on CPU 1, and prints p50 /
# p99 / p99.9 and the CPU time of the shard's thread for `shardmq-bench producer --rate 20000
# --in-flight 4` over 8 and over 500 connections, then the same while IDLE connections
# (default 5,000) are held open by another process. The CPU time is what the figures compare:
# at this rate it barely moves with the noise of this shared machine, the tail does.
#   [SKIP_BUILD=1] [ROUNDS=2] [SECS=5] [IDLE=5000] scripts/bench-idle-shard.sh BINARY...
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,8p' "$0"; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq-bench
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
bench=(taskset -c 1 target/release/shardmq-bench)
secs=${SECS:-5}
idle=${IDLE:-5000}
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-idle-shard.XXXXXX")
pid=""
holder=""
trap 'kill $pid $holder 2>/dev/null; wait $pid $holder 2>/dev/null; rm -rf "$dir"' EXIT
# Below the ephemeral range (32768-60999), as in bench-connections.sh.
ns=127.0.0.1:27876

# CPU time (clock ticks) of the shard's thread.
shard_ticks() {
    local task
    for task in /proc/"$pid"/task/*; do
        if [ "$(cat "$task/comm")" = shard-0 ]; then
            awk '{print $14 + $15; exit}' "$task/stat"
            return
        fi
    done
}

run() {
    local before after
    before=$(shard_ticks)
    "${bench[@]}" producer --namesrv $ns --topic C --connections-per-broker "$1" --in-flight 4 \
        --rate 20000 --duration-secs "$secs" --no-progress > "$dir/run.log" 2>&1
    after=$(shard_ticks)
    printf '%s | shard CPU %s s' "$(awk -f scripts/whole-run.awk "$dir/run.log" | cut -d'|' -f1,6)" \
        "$(echo "$before $after $(getconf CLK_TCK)" | awk '{printf "%.2f", ($2 - $1) / $3}')"
}

for round in $(seq "${ROUNDS:-2}"); do
    for binary in "$@"; do
        echo "== round $round: $binary"
        rm -rf "$dir/data"
        taskset -c 0 "$binary" serve --shards 1 --cpus 0 --data-dir "$dir/data" \
            --namesrv-port 27876 --broker-port 28911 --log-level warn > "$dir/broker.log" 2>&1 &
        pid=$!
        until "${bench[@]}" producer --namesrv $ns --topic C --queues 8 --messages 1000 \
            --no-progress > /dev/null 2>&1; do
            kill -0 $pid 2>/dev/null || { echo "the broker stopped:"; cat "$dir/broker.log"; exit 1; }
            sleep 0.2
        done
        # Another process may hold the ports and answer in its place: the broker must be ours.
        kill -0 $pid 2>/dev/null || { echo "the broker stopped:"; cat "$dir/broker.log"; exit 1; }
        # A first run opens and closes 500 connections once (a fresh broker's first run has a
        # start-up stall of its own).
        run 500 > /dev/null
        echo "  8 connections:   $(run 8)"
        echo "  500 connections: $(run 500)"
        rm -f "$dir/ready"
        taskset -c 1 python3 scripts/hold-connections.py "$idle" 28911 "$dir/ready" &
        holder=$!
        until [ -e "$dir/ready" ]; do
            kill -0 $holder 2>/dev/null || { echo "could not open $idle idle connections"; exit 1; }
            sleep 0.2
        done
        echo "  8 + $idle idle:   $(run 8)"
        echo "  500 + $idle idle: $(run 500)"
        kill $holder $pid; wait $holder $pid 2>/dev/null
        holder=""
        pid=""
    done
done

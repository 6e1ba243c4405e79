#!/usr/bin/env bash
# Tuning profiles (or knob values) side by side: for each round, each PROFILE in turn (a
# built-in name or a TOML file) runs one shard on CPU 0 with the bench on CPU 1, and prints
#   - p99 / p99.9 of 20,000 msgs/s in open loop (4 in flight) over 8 connections and over
#     500 (the cost of many connections at a low rate each, issue 17),
#   - closed-loop msgs/s, 4 connections x 64 in flight, async and (SYNC=1) SYNC_FLUSH.
# Each figure is of a whole run of SECS seconds, on a fresh broker. On one CPU the bench and
# the shard share it (noted in the output).
#   [SKIP_BUILD=1] [ROUNDS=3] [SECS=5] [SYNC=1] [BIN_DIR=target/release]
#   scripts/bench-profiles.sh PROFILE [PROFILE ...]
# For one knob, copy a profile and change the line, e.g.
#   sed 's/^preempt_timer_us = .*/preempt_timer_us = 1000/' tuning/default.toml > /tmp/p.toml
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bin_dir=${BIN_DIR:-target/release}
secs=${SECS:-5}
bench_cpu=1
if [ "$(nproc)" -lt 2 ]; then
    echo "one CPU: the bench and the shard share it"
    bench_cpu=0
fi
bench=(taskset -c "$bench_cpu" "$bin_dir/shardmq-bench")
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-profiles.XXXXXX")
pid=""
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT

# Starts a broker of profile $1 (extra flags after it) on fresh ports; sets pid and ns.
# Below the ephemeral range (32768-60999): a client socket of the runs (or one of an earlier
# run, closing) may have one of ours as its port, and the start fails: address in use.
port=21000
start() {
    local profile=$1
    shift
    port=$((port + 100))
    ns=127.0.0.1:$port
    rm -rf "$dir/data"
    "$bin_dir/shardmq" serve --profile "$profile" --cpus 0 "$@" --data-dir "$dir/data" \
        --namesrv-port "$port" --broker-port $((port + 20)) --log-level warn \
        > "$dir/broker.log" 2>&1 &
    pid=$!
    until "${bench[@]}" producer --namesrv "$ns" --topic C --queues 8 --messages 1000 \
        --no-progress > /dev/null 2>&1; do
        kill -0 $pid 2>/dev/null || { echo "the broker stopped:"; cat "$dir/broker.log"; exit 1; }
        sleep 0.2
    done
}
stop() { kill $pid; wait $pid 2>/dev/null; pid=""; }

open_loop() {
    "${bench[@]}" producer --namesrv "$ns" --topic C --connections-per-broker "$1" \
        --in-flight 4 --rate 20000 --duration-secs "$secs" --no-progress 2>&1 |
        awk -f scripts/whole-run.awk |
        awk '{printf "p99 %.2f p99.9 %.2f ms", $(NF - 2) / 1000, $(NF - 1) / 1000}'
}
closed_loop() {
    "${bench[@]}" producer --namesrv "$ns" --topic C --connections-per-broker 4 \
        --in-flight 64 --duration-secs "$secs" --no-progress 2>&1 |
        awk -f scripts/whole-run.awk | awk '{print $3}'
}

for round in $(seq "${ROUNDS:-3}"); do
    for profile in "$@"; do
        start "$profile"
        line="round $round $(basename "$profile" .toml): 8 conns $(open_loop 8)"
        line="$line | 500 conns $(open_loop 500) | closed $(closed_loop) msgs/s"
        stop
        if [ "${SYNC:-0}" = 1 ]; then
            start "$profile" --flush sync
            line="$line | SYNC closed $(closed_loop) msgs/s"
            stop
        fi
        echo "$line"
    done
done

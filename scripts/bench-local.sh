#!/usr/bin/env bash
# Produce benchmark on this machine: starts `shardmq serve` (1 shard by default, so the bench
# tool has a core of its own on a 2-core box), runs `shardmq-bench producer` against it for
# each flush mode, and prints msgs/s together with the broker's busy CPU (from /proc), so
# msgs/s per busy broker core can be read off.
#   scripts/bench-local.sh [SECONDS] [SHARDS] [MESSAGE_SIZE] [IN_FLIGHT]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
# A broker still running when the script ends (an error, a closed pipe) goes with it.
trap 'jobs -p | xargs -r kill 2>/dev/null' EXIT
seconds=${1:-10}; shards=${2:-1}; size=${3:-1024}; in_flight=${4:-256}
cargo build --release -q -p shardmq -p shardmq-bench
ticks=$(getconf CLK_TCK)
for flush in async sync; do
    dir=$(mktemp -d)
    target/release/shardmq serve --shards "$shards" --flush "$flush" --data-dir "$dir" \
        --namesrv-port 13876 --broker-port 13911 > "$dir/broker.log" 2>&1 &
    broker=$!
    wait_ready "$dir/broker.log" "$broker"
    cpu_before=$(awk '{print $14 + $15}' /proc/$broker/stat)
    started=$(date +%s.%N)
    target/release/shardmq-bench producer --namesrv 127.0.0.1:13876 --topic "Bench_$flush" \
        --message-size "$size" --in-flight "$in_flight" --duration-secs "$seconds" \
        --report "$dir/report.json" | tail -4
    elapsed=$(echo "$(date +%s.%N) - $started" | bc)
    cpu_after=$(awk '{print $14 + $15}' /proc/$broker/stat)
    busy=$(echo "scale=2; ($cpu_after - $cpu_before) / $ticks / $elapsed" | bc)
    echo "flush=$flush shards=$shards size=$size in_flight=$in_flight: broker busy cores $busy"
    kill "$broker"; wait "$broker" || true
    rm -rf "$dir"
done

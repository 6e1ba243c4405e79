#!/usr/bin/env bash
# Two broker binaries side by side, alternating runs in one session (these VMs are noisy:
# compare ratios within a run, never figures across runs). Each run starts a one-shard
# broker, drives `shardmq-bench producer` (1 KiB, IN_FLIGHT in flight) for SECONDS and prints
# msgs/s, the broker's busy cores from /proc and msgs/s per busy core.
#   scripts/bench-ab.sh BROKER_A BROKER_B [ROUNDS] [SECONDS] [FLUSH_MODES]
#   e.g. scripts/bench-ab.sh /tmp/shardmq-before target/release/shardmq 3 6 "async sync"
# Environment: SIZE (1024), IN_FLIGHT (256), BATCH (messages per send; unset: single sends),
# PREFILL (seconds of the same load run first and not measured: the store is then past its
# first segments, in steady state; default 0), PROFILE (default), WARM (seconds the idle broker
# runs before the bench starts, so that its zero-fill is ahead of the writes as it is in a
# broker past its first segment; default 0).
set -uo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
# A broker still running when the script ends (an error, a closed pipe) goes with it.
trap 'jobs -p | xargs -r kill 2>/dev/null' EXIT
a=$1; b=$2; rounds=${3:-3}; seconds=${4:-6}; modes=${5:-async sync}
size=${SIZE:-1024}; in_flight=${IN_FLIGHT:-256}; profile=${PROFILE:-default}; warm=${WARM:-0}
batch=${BATCH:-}; prefill=${PREFILL:-0}
cargo build --release -q -p shardmq-bench
ticks=$(getconf CLK_TCK)
run() { # binary flush
    local dir broker c0 c1 t0 t1 out msgs busy
    dir=$(mktemp -d)
    "$1" serve --profile "$profile" --shards 1 --flush "$2" --data-dir "$dir" \
        --namesrv-port 11876 --broker-port 11911 > "$dir/broker.log" 2>&1 &
    broker=$!
    wait_ready "$dir/broker.log" "$broker"
    sleep "$warm"
    if [ "$prefill" != 0 ]; then
        target/release/shardmq-bench producer --namesrv 127.0.0.1:11876 --topic "Bench_$2" \
            --message-size "$size" --in-flight "$in_flight" --duration-secs "$prefill" \
            ${batch:+--batch "$batch"} --no-progress > /dev/null 2>&1
    fi
    c0=$(awk '{print $14 + $15}' /proc/$broker/stat); t0=$(date +%s.%N)
    out=$(target/release/shardmq-bench producer --namesrv 127.0.0.1:11876 --topic "Bench_$2" \
        --message-size "$size" --in-flight "$in_flight" --duration-secs "$seconds" \
        ${batch:+--batch "$batch"} --no-progress 2>&1)
    t1=$(date +%s.%N); c1=$(awk '{print $14 + $15}' /proc/$broker/stat)
    kill "$broker"; wait "$broker" 2>/dev/null; rm -rf "$dir"
    msgs=$(echo "$out" | grep -oP 'Throughput: \K[0-9]+')
    busy=$(echo "scale=3; ($c1 - $c0) / $ticks / ($t1 - $t0)" | bc)
    printf "%-3s %-5s msgs/s %7d  busy cores %5s  per busy core %7d  p50 %5d us  p99 %5d us\n" \
        "$3" "$2" "$msgs" "$busy" "$(echo "$msgs / $busy" | bc)" \
        "$(echo "$out" | grep -oP 'p50 \K[0-9]+' | tail -1)" "$(echo "$out" | grep -oP 'p99 \K[0-9]+' | tail -1)"
}
echo "A = $a"; echo "B = $b"
for _ in $(seq "$rounds"); do
    for mode in $modes; do run "$a" "$mode" A; run "$b" "$mode" B; done
done

#!/usr/bin/env bash
# The cost of the metrics (issue 15): shardmq with its Prometheus endpoint scraped every
# second (curl) vs `--metrics-port 0`, alternated in one run: one shard on CPU 0, the bench on
# CPU 1 (taskset), 1 KiB single sends at 256 in flight over 8 queues, async flush, a fresh
# data directory per run; prints msgs/s, latency and the shard's CPU, then on / off.
#   scripts/bench-metrics.sh [SECONDS] [ROUNDS] [DATA_PARENT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}; rounds=${2:-3}; parent=${3:-${TMPDIR:-/var/tmp}}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bench=target/release/shardmq-bench
dir=$(mktemp -d "$parent/bench-metrics.XXXXXX")
pid=""; scraper=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; [ -n "$scraper" ] && kill "$scraper" 2>/dev/null; rm -rf "$dir"' EXIT
ticks() { awk '{print $14 + $15}' /proc/"$1"/task/*/stat | awk '{s += $1} END {print s}'; }
declare -A total
for round in $(seq "$rounds"); do
    for mode in off on; do
        rm -rf "$dir/data"; mkdir -p "$dir/data"
        port=0; [ "$mode" = on ] && port=14557
        target/release/shardmq serve --cpus 0 --flush async --data-dir "$dir/data" \
            --log-level warn --metrics-port "$port" > "$dir/server.log" 2>&1 &
        pid=$!
        topic="T$RANDOM"
        for _ in $(seq 100); do
            taskset -c 1 "$bench" producer --topic "$topic" --queues 8 --messages 1 \
                --no-progress > /dev/null 2>&1 && break
            sleep 0.2
        done
        if [ "$mode" = on ]; then
            (while true; do curl -s -o /dev/null "http://127.0.0.1:$port/metrics"; sleep 1; done) &
            scraper=$!
        fi
        t0=$(ticks "$pid")
        line=$(taskset -c 1 "$bench" producer --topic "$topic" --in-flight 256 \
            --duration-secs "$seconds" --no-progress 2>&1 | awk -f scripts/whole-run.awk)
        t1=$(ticks "$pid")
        [ -n "$scraper" ] && { kill "$scraper"; wait "$scraper" 2>/dev/null || true; scraper=""; }
        tps=$(echo "$line" | awk '{print $3}')
        total[$mode]=$(( ${total[$mode]:-0} + tps ))
        busy=$(awk -v a="$t0" -v b="$t1" -v s="$seconds" 'BEGIN {printf "%.2f", (b - a) / 100 / s}')
        echo "round $round metrics $mode: $(echo "$line" | cut -d'|' -f1,3,6) | broker cores: $busy"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    done
done
awk -v on="${total[on]}" -v off="${total[off]}" 'BEGIN {printf "metrics on / off: %.3f\n", on / off}'

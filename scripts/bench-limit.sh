#!/usr/bin/env bash
# shardmq against `shardmq-bench limit` (the bare-core ceiling), alternated in one run (issue
# 17): one shard on CPU 0, the bench on CPU 1 (taskset), 1 KiB single sends at 256 in flight
# over 8 queues, a fresh data directory per run; prints msgs/s, latency and the CPU of each
# server's threads (the shard and its io_uring workers).
#   scripts/bench-limit.sh [sync|async] [SECONDS] [ROUNDS] [DATA_PARENT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
flush=${1:-sync}; seconds=${2:-10}; rounds=${3:-2}; parent=${4:-${TMPDIR:-/var/tmp}}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bench=target/release/shardmq-bench
dir=$(mktemp -d "$parent/bench-limit.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
threads() { # pid: "name ticks" per thread name (numbers stripped)
    for t in /proc/"$1"/task/*; do
        echo "$(tr -d '0-9' < "$t/comm" | sed 's/-*$//') $(awk '{print $14 + $15}' "$t/stat")"
    done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
for round in $(seq "$rounds"); do
    for target in limit shardmq; do
        rm -rf "$dir/data"; mkdir -p "$dir/data"
        if [ "$target" = limit ]; then
            "$bench" limit --cpus 0 --flush "$flush" --data-dir "$dir/data" > "$dir/server.log" 2>&1 &
            pid=$!; ready="shard 0 ready"
        else
            target/release/shardmq serve --cpus 0 --flush "$flush" --data-dir "$dir/data" \
                --log-level warn > "$dir/server.log" 2>&1 &
            pid=$!; ready=""
        fi
        for _ in $(seq 100); do
            if [ -z "$ready" ] || grep -q "$ready" "$dir/server.log"; then
                taskset -c 1 "$bench" producer --topic "Warm$RANDOM" --queues 8 --messages 1 \
                    --no-progress > /dev/null 2>&1 && break
            fi
            sleep 0.2
        done
        threads "$pid" > "$dir/t0"
        line=$(taskset -c 1 "$bench" producer --topic "T$RANDOM" --queues 8 --in-flight 256 \
            --duration-secs "$seconds" --no-progress 2>&1 | awk -f scripts/whole-run.awk)
        threads "$pid" > "$dir/t1"
        busy=$(join "$dir/t0" "$dir/t1" | awk -v s="$seconds" '{d = ($3 - $2) / 100 / s; if (d > 0.01) printf "%s %.2f  ", $1, d}')
        echo "$flush round $round $target: $(echo "$line" | cut -d'|' -f1,3,6) | busy: $busy"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    done
done

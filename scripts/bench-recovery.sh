#!/usr/bin/env bash
# Full-scan recovery rate (issue 13: ≥ 1 GiB/s of commitlog scanned, checks included).
#
#   scripts/bench-recovery.sh [GIB...]      (default: 4 16)
#
# For each size: one shard with 1 GiB segments in a fresh directory under /var/tmp (it needs
# GIB + 2 GiB free), filled with 1 KiB messages (batches of 32), stopped cleanly; then the
# checkpoint is removed (recovery must scan and check every record and rebuild every consume
# queue and the index) and the node is started twice: with the page cache dropped first
# (cold: the disk's speed), and again at once (warm: the checks' speed). It prints the
# broker's own "store open" line for each start. Uses the release binaries as built.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
SIZES=${*:-4 16}
NS_PORT=19976
BROKER_PORT=20011

start_and_stop() { # dir, label
    local dir=$1 label=$2
    "$BIN/shardmq" serve --data-dir "$dir/data" --shards 1 --segment-size-mib 1024 \
        --namesrv-port $NS_PORT --broker-port $BROKER_PORT --listen-ip 127.0.0.1 \
        >"$dir/$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        grep -q "ready" "$dir/$label.log" && break
        sleep 0.1
    done
    kill -TERM $pid
    wait $pid || true
    echo "$label: $(grep -o 'store open in .*' "$dir/$label.log")"
}

for gib in $SIZES; do
    dir=$(mktemp -d /var/tmp/shardmq-bench-recovery.XXXXXX)
    echo "=== $gib GiB of 1 KiB messages"
    "$BIN/shardmq" serve --data-dir "$dir/data" --shards 1 --segment-size-mib 1024 \
        --namesrv-port $NS_PORT --broker-port $BROKER_PORT --listen-ip 127.0.0.1 \
        >"$dir/fill.log" 2>&1 &
    pid=$!
    sleep 2
    messages=$(( gib * 1024 * 1024 * 1024 / 1200 / 32 * 32 ))
    "$BIN/shardmq-bench" producer --namesrv 127.0.0.1:$NS_PORT --topic BenchRecovery \
        --queues 8 --batch 32 --messages "$messages" --no-progress 2>&1 | grep Throughput
    kill -TERM $pid
    wait $pid || true
    du -sh "$dir/data/shard-0/commitlog"
    rm -f "$dir/data/shard-0/checkpoint"
    sync
    if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
        start_and_stop "$dir" cold
    else
        echo "cold: cannot drop the page cache here (not root?): skipped"
    fi
    rm -f "$dir/data/shard-0/checkpoint"
    start_and_stop "$dir" warm
    rm -rf "$dir"
done

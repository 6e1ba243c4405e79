#!/usr/bin/env bash
# Send latency while retention deletes 1 GiB segments, side by side with the same load when
# nothing is deleted (issue 13: an unlink of 1 GiB must not stall a shard's requests).
#
#   scripts/bench-retention.sh [DIR] [ROUNDS] [RATE]
#
# One shard with 1 GiB segments in DIR (default: a fresh directory under /var/tmp; it needs
# about 4 GiB free per round). Each round fills 3 GiB, waits for those segments to expire
# (fileReservedTime 0.005 h = 18 s; deleteWhen is an hour that is not now, so only the manual
# trigger deletes), then runs the open-loop producer (RATE msgs/s of 1 KiB, default 20000)
# twice for 12 s: once untouched ("keep"), once with `shardmq admin deleteExpiredCommitLog`
# at 4 s ("delete"), in alternating order from round to round. It prints each second's p99 and max of both runs, and the deletions the
# broker logged with the time each unlink took.
set -euo pipefail
cd "$(dirname "$0")/.."
# Uses the release binaries as built (cargo build --release).
DIR=${1:-$(mktemp -d /var/tmp/shardmq-bench-retention.XXXXXX)}
ROUNDS=${2:-2}
RATE=${3:-20000}
BIN=target/release
NS_PORT=19876
BROKER_PORT=19911
NAMESRV=127.0.0.1:$NS_PORT

hour=$(( (10#$(date +%H) + 12) % 24 ))
mkdir -p "$DIR"
"$BIN/shardmq" serve --data-dir "$DIR/data" --shards 1 --segment-size-mib 1024 \
    --namesrv-port $NS_PORT --broker-port $BROKER_PORT --listen-ip 127.0.0.1 \
    --fileReservedTime 0.005 --deleteWhen "$hour" --diskMaxUsedSpaceRatio 95 \
    --diskSpaceCleanForciblyRatio 97 --diskSpaceWarningLevelRatio 98 >"$DIR/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$DIR/data"' EXIT
sleep 2

latency_run() { # label, trigger-at-seconds or 0
    local label=$1 trigger=$2
    "$BIN/shardmq-bench" producer --namesrv $NAMESRV --topic BenchLatency --queues 8 \
        --rate "$RATE" --duration-secs 12 --no-progress >"$DIR/$label.out" 2>&1 &
    local bench=$!
    if [ "$trigger" -gt 0 ]; then
        sleep "$trigger"
        "$BIN/shardmq" admin -n $NAMESRV deleteExpiredCommitLog >/dev/null
    fi
    wait $bench
    echo "--- $label: per second (p50 p99 p99.9 p99.99 in us, then max RT)"
    grep '^Send TPS' "$DIR/$label.out" | sed -E 's/.*Max RT\(ms\): ([0-9.]+).*\(us\): (.*)/\2  max \1 ms/' \
        | nl -w2 -s': '
    grep -E '^Send latency' "$DIR/$label.out"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "=== round $round: fill 3 GiB, wait 20 s for it to expire"
    "$BIN/shardmq-bench" producer --namesrv $NAMESRV --topic BenchFill --queues 8 \
        --message-size 65536 --in-flight 16 --messages 49152 --no-progress 2>&1 | grep Throughput
    sync  # the fill's writeback would otherwise stall whichever run comes first
    sleep 20
    if [ $((round % 2)) -eq 1 ]; then
        latency_run "keep-$round" 0
        latency_run "delete-$round" 4
    else
        latency_run "delete-$round" 4
        latency_run "keep-$round" 0
    fi
    echo "--- deletions the broker logged"
    grep 'retention deleted' "$DIR/broker.log" | sed -E 's/.*segment ([0-9]+) \(([0-9]+ MiB).* in ([0-9]+ ms).*/segment \1 (\2): unlink \3/' | tail -n +1
done

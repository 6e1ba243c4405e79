#!/bin/bash
set -uo pipefail
# Idle queues give their maps back (issue 17): a fresh two-shard node (256 MiB segments) takes
# FILL seconds (20) of `shardmq-bench producer --topics TOPICS --queues 8`, then sits idle;
# every STEP seconds (20) for WATCH seconds (200) its RSS and its map count are printed.
# Writing many queues needs vm.max_map_count above 65,530 (one map per written queue).
#   scripts/bench-idle-maps.sh BINARY TOPICS
cd "$(dirname "$0")/.."
fill=${FILL:-20} step=${STEP:-20} watch=${WATCH:-200}
dir=$(mktemp -d /var/tmp/shardmq-idle.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf $dir' EXIT
$1 serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 43876 \
    --broker-port 44911 --listen-ip 127.0.0.1 > $dir/broker.log 2>&1 &
pid=$!
until grep -q "shardmq: ready" $dir/broker.log; do sleep 0.1; done
target/release/shardmq-bench producer --namesrv 127.0.0.1:43876 --topic BT --topics $2 \
    --queues 8 --in-flight 64 --no-progress --duration-secs $fill 2>&1 | grep -E "Created|Throughput"
echo "queue files: $(find $dir/data/shard-*/consumequeue -type f | wc -l)"
for t in $(seq 0 $step $watch); do
    echo "idle ${t} s: RSS $(( $(awk '/VmRSS/ {print $2}' /proc/$pid/status) / 1024 )) MB, maps $(wc -l < /proc/$pid/maps)"
    sleep $step
done

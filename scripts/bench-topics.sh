#!/bin/bash
set -uo pipefail
# Many topics (issue 17): a fresh two-shard node (256 MiB segments), `shardmq-bench producer
# --topics N --queues 8` (1 KiB single sends at 64 in flight) for a 6 s warm-up and a 10 s
# measured run; then the consume-queue disk use, RSS and the time a restart takes to be ready.
# Right after many files were deleted (the previous run), ext4 allocates inodes slowly: leave
# ~45 s between runs.
#   scripts/bench-topics.sh BINARY TOPICS
cd "$(dirname "$0")/.."
dir=$(mktemp -d /var/tmp/shardmq-topics.XXXXXX)
$1 serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 43876 --broker-port 44911 --listen-ip 127.0.0.1 > $dir/broker.log 2>&1 &
pid=$!
until grep -q "shardmq: ready" $dir/broker.log; do sleep 0.1; done
args="--namesrv 127.0.0.1:43876 --topic BT --queues 8 --in-flight 64 --no-progress"
[ "$2" -gt 1 ] && args="$args --topics $2"
target/release/shardmq-bench producer $args --duration-secs 6 2>&1 | grep -E "Created|Throughput"
out=$(target/release/shardmq-bench producer $args --duration-secs 10 2>&1)
echo "$out" | grep -E "Throughput|SYSTEM_BUSY|Created"
echo "topics $2: consumequeue $(du -sh $dir/data/shard-*/consumequeue | awk '{print $1}' | paste -sd+), RSS $(awk '/VmRSS/ {print $2 " kB"}' /proc/$pid/status), queue dirs $(find $dir/data/shard-0/consumequeue -mindepth 2 -maxdepth 2 -type d | wc -l)"
kill $pid; wait $pid 2>/dev/null
start=$(date +%s.%N)
$1 serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 43876 --broker-port 44911 --listen-ip 127.0.0.1 > $dir/broker2.log 2>&1 &
pid=$!
until grep -q "shardmq: ready" $dir/broker2.log; do sleep 0.05; done
echo "restart to ready: $(echo "$(date +%s.%N) - $start" | bc) s"
kill $pid; wait $pid 2>/dev/null
rm -rf $dir

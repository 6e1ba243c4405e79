#!/bin/bash
set -uo pipefail
# Memory and disk per idle queue (issue 17). Two fresh two-shard nodes, one after the other:
# one topic, then TOPICS topics, each × 8 queues a shard. Each node's RSS (and anonymous
# memory, /proc/PID/smaps_rollup):
#   1. after `shardmq-bench producer --topics T --queues 8 --messages 1` (every topic created,
#      one message sent: queues that exist and hold nothing),
#   2. after MESSAGES sends spread over the topics' queues (the queues written: each holds a
#      map of its file),
#   3. after IDLE s without traffic (queues unused for a pass let go of their maps,
#      `shards/src/store/idle_maps.rs`).
# The same sends go to both nodes, so what the second holds beyond the first, divided by the
# queues it has beyond the first, is what a queue costs; and the consume-queue disk per
# written queue. With 10,000 topics raise vm.max_map_count first
# (`sysctl -w vm.max_map_count=655360`, and back after).
#   [MESSAGES=N] [IDLE=S] scripts/bench-idle-queues.sh BINARY TOPICS
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
bin=$1 topics=$2 messages=${MESSAGES:-400000} idle=${IDLE:-75}
dir=$(mktemp -d /var/tmp/shardmq-idle.XXXXXX)
pid=
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf $dir' EXIT
mem() { awk '/^Rss:/ {r = $2} /^Anonymous:/ {a = $2} END {print r, a}' /proc/$pid/smaps_rollup; }
# Runs one node with T topics; sets rss1..3 and anon1..3 (kB).
node() {
    local t=$1 args
    rm -rf $dir/data
    $bin serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 13476 \
        --broker-port 13511 --listen-ip 127.0.0.1 > $dir/broker.log 2>&1 &
    pid=$!
    wait_ready $dir/broker.log $pid
    args="--namesrv 127.0.0.1:13476 --topic IQ --queues 8 --in-flight 64 --no-progress"
    [ "$t" -gt 1 ] && args="$args --topics $t"
    target/release/shardmq-bench producer $args --messages 1 2>&1 | grep -E "Created"
    sleep 2
    read rss1 anon1 < <(mem)
    target/release/shardmq-bench producer $args --messages $messages 2>&1 | grep -E "Throughput|SYSTEM_BUSY"
    sleep 2
    read rss2 anon2 < <(mem)
    local files=$(find $dir/data/shard-*/consumequeue -mindepth 3 -maxdepth 3 -type f | wc -l)
    local cq=$(du -sk $dir/data/shard-*/consumequeue | awk '{s += $1} END {print s}')
    echo "$t topics: $files queue files, consume-queue disk $cq KiB ($((cq / files)) KiB a queue file), $(wc -l < /proc/$pid/maps) maps"
    sleep $idle
    read rss3 anon3 < <(mem)
    echo "$t topics: RSS / anonymous kB: created $rss1 / $anon1, written $rss2 / $anon2, idle ${idle} s $rss3 / $anon3, $(wc -l < /proc/$pid/maps) maps"
    grep -o "[0-9]* consume queues idle for a pass.*" $dir/broker.log | sed 's/^/    /'
    kill $pid; wait $pid 2>/dev/null
    pid=
}
node 1
base=($rss1 $anon1 $rss2 $anon2 $rss3 $anon3)
sleep 5
node $topics
now=($rss1 $anon1 $rss2 $anon2 $rss3 $anon3)
queues=$(((topics - 1) * 16))
for i in 0 2 4; do
    step=$(echo "created written idle" | cut -d' ' -f$((i / 2 + 1)))
    echo "per queue, $step: RSS $(((now[i] - base[i]) * 1024 / queues)) bytes, anonymous $(((now[i + 1] - base[i + 1]) * 1024 / queues)) bytes"
done

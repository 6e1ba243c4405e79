#!/bin/bash
set -uo pipefail
# Many topics, two builds side by side (issue 17): for each round, OLD then NEW, a fresh
# two-shard node (256 MiB segments) takes `shardmq-bench producer --topics N --queues 8`
# (1 KiB single sends at 64 in flight) for a WARM s warm-up and a 15 s measured run, with the
# broker's minor page faults a second over that run; then a kill -9 and the time the restart
# takes to be ready, with what each shard's recovery scanned.
# With 10,000 topics the shards map 80,000 queue files: raise vm.max_map_count first
# (`sysctl -w vm.max_map_count=655360`, and back after).
#   scripts/bench-topics-ab.sh OLD_BINARY NEW_BINARY TOPICS [WARM_S] [ROUNDS]
cd "$(dirname "$0")/.."
old=$1 new=$2 topics=$3 warm=${4:-10} rounds=${5:-2}
ports="--namesrv-port 43876 --broker-port 44911 --listen-ip 127.0.0.1"
args="--namesrv 127.0.0.1:43876 --topic BT --topics $topics --queues 8 --in-flight 64 --no-progress"
minflt() { awk '{print $10}' /proc/$1/stat; }
# Starts `serve` on $dir/data logging to $dir/$2 and waits for its ready line; sets pid and
# start (the time of the try that came up). A try that exits first (a port the killed node
# held still in use) is made again a second later.
start_node() {
    local bin=$1 log=$2 tries=0
    while :; do
        start=$(date +%s.%N)
        $bin serve --shards 2 --segment-size-mib 256 --data-dir $dir/data $ports > $dir/$log 2>&1 &
        pid=$!
        until grep -q "shardmq: ready" $dir/$log || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
        kill -0 $pid 2>/dev/null && return 0
        tries=$((tries + 1))
        if [ $tries -ge 30 ]; then
            echo "  $bin did not start: $(tail -n 1 $dir/$log)"
            exit 1
        fi
        sleep 1
    done
}
one() {
    local bin=$1 before after out
    dir=$(mktemp -d /var/tmp/shardmq-topics-ab.XXXXXX)
    start_node $bin broker.log
    target/release/shardmq-bench producer $args --duration-secs $warm > /dev/null 2>&1
    before=$(minflt $pid)
    out=$(target/release/shardmq-bench producer $args --duration-secs 15 2>&1)
    after=$(minflt $pid)
    echo "$bin: $(echo "$out" | grep -E "Throughput" | head -1)"
    echo "$out" | grep -E "SYSTEM_BUSY" | head -2
    echo "  broker minor faults: $(((after - before) / 15))/s"
    kill -9 $pid; wait $pid 2>/dev/null
    start_node $bin broker2.log
    echo "  kill -9, restart to ready: $(echo "$(date +%s.%N) - $start" | bc) s"
    grep -o "shard [0-9]: store open in .*" $dir/broker2.log | sed 's/^/    /'
    kill $pid; wait $pid 2>/dev/null
    rm -rf $dir
    # ext4 allocates inodes slowly right after many files were deleted.
    sleep 30
}
for round in $(seq 1 $rounds); do
    echo "== round $round"
    one $old
    one $new
done

#!/bin/bash
set -uo pipefail
# Start-up with many queues (issue 17): fills a fresh two-shard node (256 MiB segments) with
# `shardmq-bench producer --topics TOPICS --queues 8` for FILL seconds, stops it, then restarts
# it ROUNDS times with each binary in turn (A, B, A, B, ...) and prints the seconds each took to
# be ready (every shard registered). STOP=kill sends SIGKILL to each restarted node instead of
# SIGTERM, so the next start recovers after a crash; COLD=1 drops the page cache before each
# start (root), after a start and clean stop by the same build (a clean stop writes the queue
# catalog the next start reads). CRASHED=1 ends the fill with a SIGKILL right after the last send and starts
# every round from a fresh copy of that crashed data directory, so each binary recovers the
# same crash (the copy is taken before each start, page cache warm). Many queues need
# vm.max_map_count above 65,530 (one map per written queue).
#   scripts/bench-restart.sh BINARY_A BINARY_B TOPICS [ROUNDS]
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
a=$1 b=$2 topics=$3 rounds=${4:-3}
fill=${FILL:-20} stop=${STOP:-term}
dir=$(mktemp -d /var/tmp/shardmq-restart.XXXXXX)
trap 'rm -rf $dir' EXIT
serve() {
    $1 serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 15076 \
        --broker-port 15111 --listen-ip 127.0.0.1 > $dir/broker.log 2>&1 &
    pid=$!
    wait_ready $dir/broker.log $pid
}
serve $a
target/release/shardmq-bench producer --namesrv 127.0.0.1:15076 --topic BT --topics $topics \
    --queues 8 --in-flight 64 --no-progress --duration-secs $fill 2>&1 | grep -E "Created|Throughput"
crashed=${CRASHED:-0} filled=$dir/data
if [ $crashed = 1 ]; then
    kill -9 $pid; wait $pid 2>/dev/null
    # Each start gets a copy of it (below).
    filled=$dir/crashed
    mv $dir/data $filled
else
    kill $pid; wait $pid 2>/dev/null
fi
echo "queue dirs (shard 0): $(find $filled/shard-0/consumequeue -mindepth 2 -maxdepth 2 -type d | wc -l), consumequeue $(du -sh $filled/shard-*/consumequeue | awk '{print $1}' | paste -sd+)"
for round in $(seq $rounds); do
    for which in A B; do
        binary=$a; [ $which = B ] && binary=$b
        if [ $crashed = 1 ]; then
            rm -rf $dir/data; cp -a $filled $dir/data
        fi
        if [ "${COLD:-0}" = 1 ]; then
            # As after a reboot: the node was last stopped by this build, the cache is cold.
            if [ $crashed = 0 ]; then serve $binary; kill $pid; wait $pid 2>/dev/null; fi
            sync; echo 3 > /proc/sys/vm/drop_caches
        fi
        sync
        start=$(date +%s.%N)
        serve $binary
        took=$(echo "$(date +%s.%N) - $start" | bc)
        rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
        echo "round $round $which: ready in $took s, RSS $((rss / 1024)) MB"
        grep -o "shard [0-9]: store open in .*" $dir/broker.log | tail -2 | sed 's/^/    /'
        if [ $stop = kill ]; then kill -9 $pid; else kill $pid; fi
        wait $pid 2>/dev/null
    done
done

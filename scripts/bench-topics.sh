#!/bin/bash
set -uo pipefail
# Many topics (issue 17): a fresh two-shard node (256 MiB segments), `shardmq-bench producer
# --topics N --queues 8` (1 KiB single sends at 64 in flight) for a WARM s warm-up (6) and a
# MEASURE s measured run (10), with the broker's minor page faults a second and the writes of
# the data directory's disk over that run; then the consume-queue disk use, RSS, and the time
# a restart takes to be ready after a clean stop, or after a SIGKILL with STOP=kill (then
# with what each shard's recovery scanned). Right after many files were deleted (the previous run), ext4 allocates inodes
# slowly: leave ~45 s between runs (`scripts/bench-topics-ab.sh` does).
# With 10,000 topics the shards map 80,000 queue files: raise vm.max_map_count first
# (`sysctl -w vm.max_map_count=655360`, and back after).
#   [WARM=S] [MEASURE=S] [STOP=kill] scripts/bench-topics.sh BINARY TOPICS
cd "$(dirname "$0")/.."
bin=$1 topics=$2 warm=${WARM:-6} measure=${MEASURE:-10} stop=${STOP:-term}
dir=$(mktemp -d /var/tmp/shardmq-topics.XXXXXX)
trap 'rm -rf $dir' EXIT
# Starts `serve` logging to $dir/$1 and waits for its ready line; sets pid and start (the
# time of the try that came up). A try that exits first (a port still held, or taken as an
# ephemeral port meanwhile) is made again a second later, up to 30 times.
start_node() {
    local log=$1 tries=0
    while :; do
        start=$(date +%s.%N)
        $bin serve --shards 2 --segment-size-mib 256 --data-dir $dir/data --namesrv-port 15476 \
            --broker-port 15511 --listen-ip 127.0.0.1 > $dir/$log 2>&1 &
        pid=$!
        until grep -q "shardmq: ready" $dir/$log || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
        kill -0 $pid 2>/dev/null && return 0
        tries=$((tries + 1))
        if [ $tries -ge 30 ]; then
            echo "$bin did not start: $(tail -n 1 $dir/$log)"
            exit 1
        fi
        sleep 1
    done
}
minflt() { awk '{print $10}' /proc/$1/stat; }
# Writes, sectors written and ms spent writing of the data directory's disk (/proc/diskstats).
disk=$(basename "$(df --output=source $dir | tail -n 1)")
disk_writes() { awk -v d=$disk '$3 == d {print $8, $10, $11}' /proc/diskstats; }
start_node broker.log
args="--namesrv 127.0.0.1:15476 --topic BT --queues 8 --in-flight 64 --no-progress"
[ "$topics" -gt 1 ] && args="$args --topics $topics"
target/release/shardmq-bench producer $args --duration-secs $warm 2>&1 | grep -E "Created|Throughput"
before=$(minflt $pid) disk_before=$(disk_writes)
out=$(target/release/shardmq-bench producer $args --duration-secs $measure 2>&1)
after=$(minflt $pid) disk_after=$(disk_writes)
echo "$out" | grep -E "Throughput|SYSTEM_BUSY|Created"
echo "broker minor faults: $(((after - before) / measure))/s"
echo "$disk_before $disk_after" | awk -v s=$measure -v d=$disk '{printf "disk %s: %d writes/s, %.1f MB/s written, %d ms/s writing\n", d, ($4-$1)/s, ($5-$2)*512/s/1e6, ($6-$3)/s}'
echo "topics $topics: consumequeue $(du -sh $dir/data/shard-*/consumequeue | awk '{print $1}' | paste -sd+), RSS $(awk '/VmRSS/ {print $2 " kB"}' /proc/$pid/status), queue dirs $(find $dir/data/shard-0/consumequeue -mindepth 2 -maxdepth 2 -type d | wc -l)"
if [ $stop = kill ]; then kill -9 $pid; else kill $pid; fi
wait $pid 2>/dev/null
start_node broker2.log
echo "restart to ready (after STOP=$stop): $(echo "$(date +%s.%N) - $start" | bc) s"
[ $stop = kill ] && grep -o "shard [0-9]: store open in .*" $dir/broker2.log | sed 's/^/    /'
kill $pid; wait $pid 2>/dev/null

#!/bin/bash
set -uo pipefail
# Recovery after a power loss with many queues (issue 17; root). Fills a fresh two-shard node
# (256 MiB segments) on a loop-mounted ext4 image made here (1 GiB journal): FIRST sends to
# TOPICS topics x 8 queues, SETTLE seconds for the queues' files, then FILL more sends, then a
# SIGKILL. The node's light checkpoints go (they hold only within the boot that wrote them), so
# a start recovers from the last synced checkpoint, as after a restart of the machine. Each
# round then starts each binary in turn (A, B, A, B, ...) on a fresh copy of that image with
# the page cache dropped, and prints the seconds to the ready line. Unlike a real power loss,
# the queue files keep what the kernel had not written yet at the kill. B fills the node (a
# start after a restart of the machine takes the queues from the catalog of the synced
# checkpoint, where the binary that wrote it made one). After the ready line each start is
# given SETTLED seconds (default 60) to settle those queues, and its log line is printed. With
# CATCHUP=1 a new group first reads everything stored, right after the ready line (its
# pulls timed by the bench). Needs
# ~3x the image's used space free in /var/tmp, and vm.max_map_count above 65,530 for the fill.
#   scripts/bench-power-loss.sh BINARY_A BINARY_B TOPICS [ROUNDS]
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
a=$1 b=$2 topics=$3 rounds=${4:-3}
base=$(mktemp -d /var/tmp/shardmq-power.XXXXXX)
mnt=$base/mnt pid=
mkdir -p $mnt
cleanup() {
    [ -n "$pid" ] && kill -9 $pid 2>/dev/null && wait $pid 2>/dev/null
    umount $mnt 2>/dev/null
    rm -rf $base
}
trap cleanup EXIT
serve() {
    $1 serve --shards 2 --segment-size-mib 256 --data-dir $mnt/data --namesrv-port 14276 \
        --broker-port 14311 --listen-ip 127.0.0.1 > $mnt/broker.log 2>&1 &
    pid=$!
    wait_ready $mnt/broker.log $pid
}
truncate -s ${IMAGE_GIB:-20}G $base/work.img
mkfs.ext4 -q -F -J size=1024 $base/work.img || { echo "could not run: mkfs.ext4 failed"; exit 1; }
mount -o loop $base/work.img $mnt || { echo "could not run: no loop mount here"; exit 1; }
serve $b
send() {
    target/release/shardmq-bench producer --namesrv 127.0.0.1:14276 --topic BP --topics $topics \
        --queues 8 --in-flight 64 --no-progress --messages $1 2>&1 | grep -E "Throughput"
}
send ${FIRST:-200000}
sleep ${SETTLE:-40}
send ${FILL:-400000}
kill -9 $pid; wait $pid 2>/dev/null; pid=
rm -f $mnt/data/shard-*/checkpoint.light
echo "queue dirs (shard 0): $(find $mnt/data/shard-0/consumequeue -mindepth 2 -maxdepth 2 -type d | wc -l)"
umount $mnt
mv $base/work.img $base/crashed.img
for round in $(seq $rounds); do
    for which in A B; do
        binary=$a; [ $which = B ] && binary=$b
        cp --sparse=always $base/crashed.img $base/work.img
        mount -o loop $base/work.img $mnt
        sync; echo 3 > /proc/sys/vm/drop_caches
        start=$(date +%s.%N)
        serve $binary
        took=$(echo "$(date +%s.%N) - $start" | bc)
        echo "round $round $which: ready in $took s"
        grep -o "shard [0-9]: store open in .*" $mnt/broker.log | tail -2 | sed 's/^/    /'
        if [ -n "${CATCHUP:-}" ]; then
            # Everything stored, read by a new group right after the ready line (after the
            # bench has updated its topics, which is not counted).
            out=$(target/release/shardmq-bench consumer --namesrv 127.0.0.1:14276 --topic BP \
                --topics $topics --queues 8 --catch-up --no-progress 2>&1)
            echo "$out" | grep -E "^(Consumed|Elapsed)" | sed 's/^/    catch-up: /'
            pulled=$(echo "$out" | grep -oE "^Elapsed: [0-9.]+" | grep -oE "[0-9.]+$")
            echo "    ready + catch-up: $(echo "$took + ${pulled:-0}" | bc) s (start to caught up, the topics' update included: $(echo "$(date +%s.%N) - $start" | bc) s)"
        fi
        for _ in $(seq $((${SETTLED:-60} * 10))); do
            [ "$(grep -c "settled the" $mnt/broker.log)" -ge 2 ] && break
            grep -q "queues from the catalog" $mnt/broker.log || break
            sleep 0.1
        done
        grep -o "settled the .*" $mnt/broker.log | sed 's/^/    /'
        kill $pid; wait $pid 2>/dev/null; pid=
        umount $mnt
    done
done

#!/usr/bin/env bash
# A closed-loop produce run longer than the disk holds (issue 13): retention keeps a small
# data filesystem bounded while the bench goes on at steady throughput.
#
#   scripts/bench-small-disk.sh [SECONDS] [FS_MIB]      (default: 600 s, 4096 MiB)
#   IN_FLIGHT=N (default 256) requests in flight; BIG=1 runs the same on a plain directory
#   of the root filesystem instead (the side-by-side without a small disk).
#
# Makes an ext4 image of FS_MIB, loop-mounts it (root), runs one shard on it with 64 MiB
# segments and RocketMQ's default retention except the pause between deletions (10 ms: a
# disk written at ~1 GB/s frees 64 MiB segments faster than one per 100 ms), and runs
# `shardmq-bench producer --batch 32` (1 KiB messages) for SECONDS. It prints the bench's
# summary, throughput per minute, the highest disk use seen, the segments deleted and the
# refused sends. Uses the release binaries as built.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-600}
FS_MIB=${2:-4096}
BIN=target/release
NS_PORT=20176
BROKER_PORT=20211
work=$(mktemp -d /var/tmp/shardmq-bench-small-disk.XXXXXX)
cleanup() {
    [ -n "${broker:-}" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
    [ -n "${watch:-}" ] && kill "$watch" 2>/dev/null
    umount "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/mnt"
if [ -z "${BIG:-}" ]; then
    truncate -s "${FS_MIB}M" "$work/fs.img"
    mkfs.ext4 -q "$work/fs.img"
    if ! mount -o loop "$work/fs.img" "$work/mnt"; then
        echo "cannot loop-mount an ext4 image here (needs root and loop devices): not run"
        exit 1
    fi
fi
"$BIN/shardmq" serve --data-dir "$work/mnt/data" --shards 1 --segment-size-mib 64 \
    --allocation-window-mib 64 --deleteCommitLogFilesInterval 10 \
    --namesrv-port $NS_PORT --broker-port $BROKER_PORT --listen-ip 127.0.0.1 \
    >"$work/broker.log" 2>&1 &
broker=$!
sleep 2
(while true; do df --output=pcent "$work/mnt" | tail -1 | tr -d ' %'; sleep 0.5; done \
    >"$work/df") &
watch=$!
"$BIN/shardmq-bench" producer --namesrv 127.0.0.1:$NS_PORT --topic BenchSmallDisk --queues 8 \
    --batch 32 --in-flight "${IN_FLIGHT:-256}" --duration-secs "$SECONDS_TO_RUN" --no-progress --report "$work/report.json" \
    >"$work/bench.out" 2>&1 || true
grep -A8 -- "--- shardmq-bench producer summary" "$work/bench.out" || tail -20 "$work/bench.out"
python3 - "$work/report.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
series = report.get("intervals", [])
per_minute = {}
for point in series:
    minute = int(point["t_secs"] // 60)
    per_minute.setdefault(minute, []).append(point["send_tps"])
for minute, rates in sorted(per_minute.items()):
    print("minute {:2d}: {:,.0f} msgs/s (mean of {} seconds)".format(
        minute + 1, sum(rates) / len(rates), len(rates)))
EOF
where=${FS_MIB}MiB; [ -n "${BIG:-}" ] && where="the root filesystem"
echo "disk use at most: $(sort -n "$work/df" | tail -1)% of $where"
echo "segments deleted: $(grep -c 'retention deleted commitlog segment' "$work/broker.log")"
echo "refusal lines in the broker log: $(grep -c 'sends are refused' "$work/broker.log" || true)"

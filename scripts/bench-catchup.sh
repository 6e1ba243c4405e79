#!/usr/bin/env bash
# Catch-up of a backlog that is on disk only, against the disk's own sequential read
# bandwidth, in one run: fio (1 MiB O_DIRECT reads, depth 4, io_uring) of a file on the
# filesystem that holds the broker's data; then a broker is filled with GIB GiB by batches,
# stopped, the page cache dropped (so nothing of the backlog is in memory), started again, and
# `shardmq-bench consumer --catch-up` reads every message; prints MB/s, the ratio to fio's and
# the broker's RSS at the end (what the broker kept of what it read).
#   scripts/bench-catchup.sh [GIB] [MESSAGE_SIZE] [DATA_PARENT_DIR]
# Environment: SHARDS (1). Needs root (drop_caches), fio (`apt-get install fio`), python3.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
gib=${1:-6}; size=${2:-4096}; parent=${3:-${TMPDIR:-/var/tmp}}; shards=${SHARDS:-1}
command -v fio >/dev/null || { echo "bench-catchup: fio is not installed (apt-get install fio)" >&2; exit 1; }
[ -w /proc/sys/vm/drop_caches ] || { echo "bench-catchup: needs root to drop the page cache" >&2; exit 1; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
scratch=$(mktemp -d "$parent/bench-catchup.XXXXXX")
broker=""
trap '[ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null; rm -rf "$scratch"' EXIT

fio --name=prep --filename="$scratch/fio.dat" --size=4G --bs=1M --rw=write --direct=1 \
    --ioengine=io_uring --iodepth=4 > /dev/null 2>&1
sync; echo 3 > /proc/sys/vm/drop_caches
fio_mbs=$(fio --name=seqread --filename="$scratch/fio.dat" --size=4G --bs=1M --rw=read \
    --direct=1 --ioengine=io_uring --iodepth=4 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))')
rm -f "$scratch/fio.dat"
echo "fio O_DIRECT sequential read (1 MiB, depth 4): $fio_mbs MB/s"

start_broker() {
    target/release/shardmq serve --shards "$shards" --segment-size-mib 1024 \
        --data-dir "$scratch/data" --namesrv-port 12276 --broker-port 12311 \
        > "$scratch/broker.log" 2>&1 &
    broker=$!
    wait_ready "$scratch/broker.log" "$broker"
}
messages=$((gib * 1024 * 1024 * 1024 / size))
start_broker
echo "filling: $messages messages of $size B ($gib GiB) by batches of 16"
target/release/shardmq-bench producer --namesrv 127.0.0.1:12276 --topic Backlog --queues 8 \
    --messages "$messages" --message-size "$size" --batch 16 --in-flight 16 --no-progress \
    | grep -E "^(Throughput|Sent)" || true
kill "$broker"; wait "$broker" || true
sync; echo 3 > /proc/sys/vm/drop_caches
start_broker
rss_before=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$broker/status")
out=$(target/release/shardmq-bench consumer --namesrv 127.0.0.1:12276 --topic Backlog \
    --catch-up --no-progress --report "$scratch/catchup.json" 2>&1)
rss_after=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$broker/status")
python3 - "$scratch/catchup.json" "$fio_mbs" "$messages" "$rss_before" "$rss_after" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))["consumer"]
fio, messages, before, after = float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
mbs = report["payload_mb_per_sec"]
print(f"catch-up: {report['consumed']} of {messages} messages, {report['messages_per_sec']:,.0f} msgs/s, "
      f"{mbs:,.0f} MB/s of payload = {100 * mbs / fio:.0f}% of fio's {fio:,.0f} MB/s; "
      f"broker RSS {before} -> {after} MB")
PY

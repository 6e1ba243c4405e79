#!/usr/bin/env bash
# Catch-up of a backlog that is on disk only, against the disk's own sequential read
# bandwidth, in one run: a broker is filled with GIB GiB by batches and stopped; then, each
# round, fio (1 MiB O_DIRECT reads, depth 4, io_uring) reads a file on the filesystem that
# holds the broker's data, and for each build in turn the page cache is dropped (so nothing of
# the backlog is in memory), the build serves the backlog, and `shardmq-bench consumer
# --catch-up` reads every message. Prints, for each: MB/s of payload, its ratio to that
# round's fio, the broker's CPU time (all threads) and its RSS at the end (what it kept of
# what it read).
#   scripts/bench-catchup.sh [GIB] [MESSAGE_SIZE] [DATA_PARENT_DIR]
# Environment: SHARDS (1); QUEUES (the topic's queues, 8; spread over the shards: a consumer
# keeps one pull a queue in flight, so 8 a shard keeps each shard as busy as one shard of 8);
# BINARIES (shardmq builds to compare, alternated; default
# $BIN_DIR/shardmq, which also fills the backlog); BIN_DIR (target/release: shardmq-bench);
# ROUNDS (1); SKIP_BUILD=1; BROKER_ARGS (more `serve` arguments, e.g. `--cpus 2,3`);
# BENCH_CPUS (taskset for the producer and the consumer); CONSUMER_THREADS (the consumer's
# threads, default one a shard: each shard is an endpoint of its own); CONGESTION_CONTROLS
# (e.g. "cubic bbr": each round serves the backlog under each TCP congestion control in turn,
# net.ipv4.tcp_congestion_control set for the run and put back at the end; default the
# host's own, left as it is). Every line says which one the connections used.
# CONSUMER_ARGS: more `shardmq-bench consumer` arguments (`--groups 4`: each group reads the
# whole backlog, and the MB/s is what all of them got, not what the disk gave).
# Needs root (drop_caches) and python3; fio (`apt-get install fio`), or, where it is missing
# (a machine nothing can be installed on), scripts/disk-read.py reads the same way, said so.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
gib=${1:-6}; size=${2:-4096}; parent=${3:-${TMPDIR:-/var/tmp}}; shards=${SHARDS:-1}
bin_dir=${BIN_DIR:-target/release}
binaries=${BINARIES:-$bin_dir/shardmq}; rounds=${ROUNDS:-1}
consumer_threads=${CONSUMER_THREADS:-$shards}
pin=()
[ -n "${BENCH_CPUS:-}" ] && pin=(taskset -c "$BENCH_CPUS")
bench=("${pin[@]}" "$bin_dir/shardmq-bench")
reader=fio
if ! command -v fio >/dev/null; then
    reader=disk-read.py
    echo "bench-catchup: fio is not installed here; the disk is read by scripts/disk-read.py instead (1 MiB O_DIRECT reads, 4 in flight)"
fi
[ -w /proc/sys/vm/drop_caches ] || { echo "bench-catchup: needs root to drop the page cache" >&2; exit 1; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
scratch=$(mktemp -d "$parent/bench-catchup.XXXXXX")
broker=""
cc_setting=/proc/sys/net/ipv4/tcp_congestion_control
cc_host=$(cat "$cc_setting" 2>/dev/null || echo unknown)
controls=${CONGESTION_CONTROLS:-$cc_host}
if [ -n "${CONGESTION_CONTROLS:-}" ]; then
    for cc in $controls; do
        grep -qw "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null || {
            echo "bench-catchup: congestion control $cc is not available here ($(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null))" >&2
            exit 1
        }
    done
fi
trap '[ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null; rm -rf "$scratch"; [ -n "${CONGESTION_CONTROLS:-}" ] && echo "$cc_host" > "$cc_setting"' EXIT

fio_read() { # MB/s of 1 MiB O_DIRECT sequential reads of a 4 GiB file, the cache dropped
    if [ "$reader" != fio ]; then
        dd if=/dev/zero of="$scratch/fio.dat" bs=4M count=1024 oflag=direct 2> /dev/null
        sync; echo 3 > /proc/sys/vm/drop_caches
        python3 scripts/disk-read.py "$scratch/fio.dat" 4
        rm -f "$scratch/fio.dat"
        return
    fi
    fio --name=prep --filename="$scratch/fio.dat" --size=4G --bs=1M --rw=write --direct=1 \
        --ioengine=io_uring --iodepth=4 > /dev/null 2>&1
    sync; echo 3 > /proc/sys/vm/drop_caches
    fio --name=seqread --filename="$scratch/fio.dat" --size=4G --bs=1M --rw=read \
        --direct=1 --ioengine=io_uring --iodepth=4 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))'
    rm -f "$scratch/fio.dat"
}
start_broker() { # BINARY
    # shellcheck disable=SC2086 # BROKER_ARGS is a list of arguments
    "$1" serve --shards "$shards" --segment-size-mib 1024 ${BROKER_ARGS:-} \
        --data-dir "$scratch/data" --namesrv-port 12276 --broker-port 12311 \
        > "$scratch/broker.log" 2>&1 &
    broker=$!
    wait_ready "$scratch/broker.log" "$broker"
}
stop_broker() {
    kill "$broker"; wait "$broker" || true
    broker=""
}
messages=$((gib * 1024 * 1024 * 1024 / size))
start_broker "${binaries%% *}"
echo "filling: $messages messages of $size B ($gib GiB) in ${QUEUES:-8} queues by batches of 16"
"${bench[@]}" producer --namesrv 127.0.0.1:12276 --topic Backlog --queues "${QUEUES:-8}" \
    --messages "$messages" --message-size "$size" --batch 16 --in-flight 16 --no-progress \
    | grep -E "^(Throughput|Sent)" || true
stop_broker
serve_backlog() { # BINARY CONGESTION_CONTROL: one catch-up of the whole backlog, one line
    local binary=$1 cc=$2 ticks rss
    [ -n "${CONGESTION_CONTROLS:-}" ] && echo "$cc" > "$cc_setting"
    sync; echo 3 > /proc/sys/vm/drop_caches
    start_broker "$binary"
    ticks=$(awk '{print $14 + $15}' "/proc/$broker/stat")
    # shellcheck disable=SC2086 # CONSUMER_ARGS is a list of arguments
    "${bench[@]}" consumer --namesrv 127.0.0.1:12276 --topic Backlog \
        --consumer-threads "$consumer_threads" --catch-up --no-progress --report "$scratch/catchup.json" \
        ${CONSUMER_ARGS:-} > /dev/null 2>&1
    ticks=$(( $(awk '{print $14 + $15}' "/proc/$broker/stat") - ticks ))
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$broker/status")
    stop_broker
    python3 - "$scratch/catchup.json" "$fio_mbs" "$messages" "$ticks" "$(getconf CLK_TCK)" \
        "$rss" "$binary" "$cc" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))["consumer"]
fio, messages, ticks, hz, rss, binary, cc = (float(sys.argv[2]), int(sys.argv[3]),
                                             int(sys.argv[4]), int(sys.argv[5]), sys.argv[6],
                                             sys.argv[7], sys.argv[8])
mbs = report["payload_mb_per_sec"]
reads = report["consumed"] / messages
# Several groups read the backlog once each: the disk gave it once, the MB/s is delivered.
versus = (f"{100 * mbs / fio:.0f}% of the disk's" if reads <= 1 else
          f"delivered to {reads:.0f} groups, {100 * mbs / fio:.0f}% of the disk's in all")
print(f"  {binary} (tcp {cc}): {report['consumed']} messages of {messages} stored, "
      f"{report['messages_per_sec']:,.0f} msgs/s, {mbs:,.0f} MB/s of payload = {versus}; "
      f"broker CPU {ticks / hz:.2f} s; RSS {rss} MB")
PY
}
for round in $(seq 1 "$rounds"); do
    fio_mbs=$(fio_read)
    echo "round $round: $reader O_DIRECT sequential read (1 MiB, depth 4): $fio_mbs MB/s"
    for cc in $controls; do
        for binary in $binaries; do
            serve_backlog "$binary" "$cc"
        done
    done
done

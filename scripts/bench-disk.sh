#!/usr/bin/env bash
# Batched produce against the disk's own O_DIRECT sequential write bandwidth, in one run:
# fio (1 MiB writes, depth 4, io_uring, O_DIRECT) on the filesystem that holds the broker's
# data, then `shardmq-bench producer --batch` against a one-shard broker on the same
# filesystem, for a few message sizes; prints MB/s and the ratio to fio's. fio runs twice: on
# an idle machine, and while one loopback TCP stream moves bytes as fast as it can (what the
# bench's traffic costs the machine: on small VMs the disk's bandwidth drops with CPU load).
#   scripts/bench-disk.sh [SECONDS] [PROFILE] [DATA_PARENT_DIR]
# Environment: SHARDS (1): shards of the broker (e.g. SHARDS=2 with the small-vm profile).
# Needs fio (`apt-get install fio`) and python3.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
seconds=${1:-6}; profile=${2:-default}; parent=${3:-${TMPDIR:-/tmp}}; shards=${SHARDS:-1}
command -v fio >/dev/null || { echo "bench-disk: fio is not installed (apt-get install fio)" >&2; exit 1; }
cargo build --release -q -p shardmq -p shardmq-bench
ticks=$(getconf CLK_TCK)
scratch=$(mktemp -d "$parent/bench-disk.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
fio_run() {
    fio --name=seqwrite --filename="$scratch/fio.dat" --size=4G --bs=1M --rw=write \
        --direct=1 --ioengine=io_uring --iodepth=4 --runtime="$seconds" --time_based \
        --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6))'
    rm -f "$scratch/fio.dat"
}
# One loopback TCP stream for $1 seconds: a sender and a receiver thread, 1 MiB writes.
loopback_stream() {
    python3 - "$1" <<'PY'
import socket, sys, threading, time
end = time.time() + float(sys.argv[1])
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
def drain():
    peer, _ = server.accept(); buf = bytearray(1 << 20)
    while peer.recv_into(buf):
        pass
threading.Thread(target=drain, daemon=True).start()
out = socket.create_connection(server.getsockname()); chunk = b"x" * (1 << 20)
while time.time() < end:
    out.sendall(chunk)
out.close()
PY
}
fio_mbs=$(fio_run)
echo "fio O_DIRECT sequential write (1 MiB, depth 4): $fio_mbs MB/s"
loopback_stream "$((seconds + 2))" &
loader=$!
sleep 1
fio_loaded_mbs=$(fio_run)
wait "$loader"
echo "the same while one loopback TCP stream runs: $fio_loaded_mbs MB/s"
printf "%-28s %10s %8s %14s %14s %12s\n" "workload" "msgs/s" "MB/s" "of fio's MB/s" "of loaded fio" "busy cores"
for cfg in "1024 64 16" "4096 32 16" "16384 16 16"; do
    set -- $cfg
    dir="$scratch/data-$1"
    target/release/shardmq serve --profile "$profile" --shards "$shards" --data-dir "$dir" \
        --namesrv-port 12676 --broker-port 12711 > "$scratch/broker.log" 2>&1 &
    broker=$!
    wait_ready "$scratch/broker.log" "$broker"
    c0=$(awk '{print $14 + $15}' /proc/$broker/stat); t0=$(date +%s.%N)
    out=$(target/release/shardmq-bench producer --namesrv 127.0.0.1:12676 --topic BenchDisk \
        --message-size "$1" --batch "$2" --in-flight "$3" --duration-secs "$seconds" --no-progress 2>&1)
    t1=$(date +%s.%N); c1=$(awk '{print $14 + $15}' /proc/$broker/stat)
    kill "$broker"; wait "$broker" || true
    rm -rf "$dir"
    msgs=$(echo "$out" | grep -oP 'Throughput: \K[0-9]+')
    mbs=$(echo "$out" | grep -oP 'msgs/s \K[0-9.]+(?= MB/s)')
    busy=$(echo "scale=2; ($c1 - $c0) / $ticks / ($t1 - $t0)" | bc)
    printf "%-28s %10s %8s %13s%% %13s%% %12s\n" "$1 B x $2 per batch, $3 in flight" "$msgs" \
        "$mbs" "$(echo "scale=0; 100 * $mbs / $fio_mbs" | bc)" \
        "$(echo "scale=0; 100 * $mbs / $fio_loaded_mbs" | bc)" "$busy"
done

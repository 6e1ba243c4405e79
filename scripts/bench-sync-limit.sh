#!/usr/bin/env bash
# SYNC_FLUSH of two broker builds against the bare-core limit (`shardmq-bench limit`), in one
# session: each round runs the limit, then A, then B, each a fresh one-shard node on CPU 0
# with the bench on CPU 1 (1 KiB single sends, CONNECTIONS connections × IN_FLIGHT in
# flight), a WARM s warm-up, then SECONDS measured. Prints msgs/s, the answers that refused a
# send (SYSTEM_BUSY and the like), send p50/p99, the server's
# busy cores, what the data directory's disk did meanwhile (/proc/diskstats: writes, MB and
# cache flushes a second, ms spent writing a second) and each build's ratio to the limit of
# its round. These VMs are noisy: compare within a round.
#   scripts/bench-sync-limit.sh BROKER_A BROKER_B [ROUNDS] [SECONDS]
# Environment: PROFILE (small-vm), WARM (3), IN_FLIGHT (256), CONNECTIONS (2), MODE (sync),
# DATA_PARENT (/var/tmp: a directory on the disk to measure), LIMIT_ARGS (more arguments for
# the limit, e.g. "--unwritten": its ring allocated, not zeroed), RING_MIB (the limit's
# ring, 256; with --unwritten larger than a run writes, e.g. 8192).
set -uo pipefail
cd "$(dirname "$0")/.."
a=$1; b=$2; rounds=${3:-3}; seconds=${4:-12}
profile=${PROFILE:-small-vm}; warm=${WARM:-3}; in_flight=${IN_FLIGHT:-256}
connections=${CONNECTIONS:-2}; mode=${MODE:-sync}; parent=${DATA_PARENT:-/var/tmp}
cargo build --release -q -p shardmq-bench
ticks=$(getconf CLK_TCK)
namesrv_port=23877
. scripts/sync-bench-common.sh
limit_msgs=1
# Ports below the ephemeral range (32768-60999): a bench's own connections never hold them.
run() { # name binary|limit
    local dir pid c0 c1 d0 d1 out msgs
    dir=$(mktemp -d "$parent/bench-sync-limit.XXXXXX")
    if [ "$2" = limit ]; then
        target/release/shardmq-bench limit --cpus 0 --flush "$mode" --data-dir "$dir/data" \
            --namesrv-port "$namesrv_port" --broker-port 24912 --ring-mib "${RING_MIB:-256}" ${LIMIT_ARGS:-} \
            > "$dir/log" 2>&1 &
    else
        "$2" serve --profile "$profile" --cpus 0 --flush "$mode" --data-dir "$dir/data" \
            --namesrv-port "$namesrv_port" --broker-port 24912 --listen-ip 127.0.0.1 \
            --log-level warn > "$dir/log" 2>&1 &
    fi
    pid=$!
    until bench --topic Ready --messages 1 > /dev/null 2>&1; do sleep 0.2; done
    bench --topic S1 --duration-secs "$warm" > /dev/null 2>&1
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat"); d0=$(disk)
    out=$(bench --topic S1 --duration-secs "$seconds" 2>&1)
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat"); d1=$(disk)
    kill -9 "$pid"; wait "$pid" 2>/dev/null; rm -rf "$dir"
    msgs=$(echo "$out" | grep -oP 'Throughput: \K[0-9]+')
    [ "$2" = limit ] && limit_msgs=$msgs
    printf "%-5s msgs/s %7d  refused %5d  p50 %5d us  p99 %6d us  busy %5s  " "$1" "$msgs" \
        "$(echo "$out" | grep -oP 'Response Failed: \K[0-9]+' | tail -1)" \
        "$(echo "$out" | grep -oP 'p50 \K[0-9]+' | tail -1)" \
        "$(echo "$out" | grep -oP 'p99 \K[0-9]+' | tail -1)" \
        "$(echo "scale=2; ($c1 - $c0) / $ticks / $seconds" | bc)"
    disk_figures "$d0" "$d1" "$seconds" "$msgs" "$limit_msgs"
    echo
}
echo "A = $a"; echo "B = $b"; echo "disk: $device; $mode; profile $profile"
for _ in $(seq "$rounds"); do
    run limit limit; run A "$a"; run B "$b"
done

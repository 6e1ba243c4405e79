#!/usr/bin/env bash
# SYNC_FLUSH over recycled commitlog segments against the same load over fresh ones, and both
# against the bare-core limit (`shardmq-bench limit`, its ring zeroed: durable writes over
# written blocks), in one session. Each round runs the limit, then "fresh" (a one-shard node
# whose retention keeps everything: every durable write lands on fallocated blocks and also
# commits their extent conversion), then "recycled" (the same node, but segments expire
# FILE_RESERVED_TIME hours after their last write and retention, every 200 ms at any hour,
# gives their files to later segments instead of deleting them). Every node runs SEGMENT_MIB
# segments on CPU 0 with the bench on CPU 1 (1 KiB single sends, CONNECTIONS connections x
# IN_FLIGHT in flight); WARM s of load first (long enough for "recycled" to write over its
# recycled files: several segments plus the allocation window), then SECONDS measured.
# Prints msgs/s, send p50/p99, the server's busy cores, the disk's figures
# (/proc/diskstats), the ratio to the round's limit, and for "recycled" how many segments
# its retention recycled (the broker's log) and how many recycled files its data holds.
#   scripts/bench-recycle.sh BROKER [ROUNDS] [SECONDS]
# Environment: WARM (25), SEGMENT_MIB (64), FILE_RESERVED_TIME (0.0002 h = 0.72 s),
# IN_FLIGHT (256), CONNECTIONS (2), PROFILE (small-vm), DATA_PARENT (/var/tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
broker=$1; rounds=${2:-3}; seconds=${3:-10}
warm=${WARM:-25}; segment_mib=${SEGMENT_MIB:-64}; reserved=${FILE_RESERVED_TIME:-0.0002}
in_flight=${IN_FLIGHT:-256}; connections=${CONNECTIONS:-2}; profile=${PROFILE:-small-vm}
parent=${DATA_PARENT:-/var/tmp}
cargo build --release -q -p shardmq-bench
ticks=$(getconf CLK_TCK)
namesrv_port=25877
. scripts/sync-bench-common.sh
all_hours=$(seq -s ';' -f '%02g' 0 23)
limit_msgs=1
# Ports below the ephemeral range (32768-60999): a bench's own connections never hold them.
run() { # name: limit | fresh | recycled
    local dir pid c0 c1 d0 d1 out msgs extra=()
    dir=$(mktemp -d "$parent/bench-recycle.XXXXXX")
    if [ "$1" = limit ]; then
        target/release/shardmq-bench limit --cpus 0 --flush sync --data-dir "$dir/data" \
            --namesrv-port "$namesrv_port" --broker-port 26912 > "$dir/log" 2>&1 &
    else
        if [ "$1" = recycled ]; then
            extra=(--fileReservedTime "$reserved" --deleteWhen "$all_hours"
                --cleanResourceInterval 200 --deleteCommitLogFilesInterval 0)
        fi
        "$broker" serve --profile "$profile" --cpus 0 --flush sync --data-dir "$dir/data" \
            --segment-size-mib "$segment_mib" --namesrv-port "$namesrv_port" --broker-port 26912 \
            --listen-ip 127.0.0.1 --log-level info "${extra[@]}" > "$dir/log" 2>&1 &
    fi
    pid=$!
    until bench --topic Ready --messages 1 > /dev/null 2>&1; do sleep 0.2; done
    bench --topic S1 --duration-secs "$warm" > /dev/null 2>&1
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat"); d0=$(disk)
    local recycled0
    recycled0=$(grep -c "recycled as segment" "$dir/log")
    out=$(bench --topic S1 --duration-secs "$seconds" 2>&1)
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat"); d1=$(disk)
    local recycled1 files
    recycled1=$(grep -c "recycled as segment" "$dir/log")
    files=$(find "$dir/data" -path '*commitlog/*' -name '*.recycled' | wc -l)
    kill -9 "$pid"; wait "$pid" 2>/dev/null; rm -rf "$dir"
    msgs=$(echo "$out" | grep -oP 'Throughput: \K[0-9]+')
    [ "$1" = limit ] && limit_msgs=$msgs
    printf "%-8s msgs/s %7d  p50 %5d us  p99 %6d us  busy %5s  " "$1" "$msgs" \
        "$(echo "$out" | grep -oP 'p50 \K[0-9]+' | tail -1)" \
        "$(echo "$out" | grep -oP 'p99 \K[0-9]+' | tail -1)" \
        "$(echo "scale=2; ($c1 - $c0) / $ticks / $seconds" | bc)"
    disk_figures "$d0" "$d1" "$seconds" "$msgs" "$limit_msgs"
    if [ "$1" = recycled ]; then
        printf "  recycled: %d before, %d while measured, %d files now" \
            "$recycled0" "$((recycled1 - recycled0))" "$files"
    fi
    echo
}
echo "broker = $broker"; echo "disk: $device; $segment_mib MiB segments; profile $profile"
for _ in $(seq "$rounds"); do
    run limit; run fresh; run recycled
done

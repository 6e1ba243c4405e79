#!/usr/bin/env bash
# Consumer groups catching up at different places in one backlog: a fresh one-shard node gets
# MESSAGES x 1 KiB sent to 8 queues (no longer in memory once they are durable: the tail is
# small), then GROUPS single-group `shardmq-bench consumer --catch-up` start DELAY s apart,
# so each lags by a different amount. Prints, for each build: the time until every group has
# read the whole backlog, the bytes read from the disk holding the data meanwhile
# (/sys/block/*/stat), the broker's CPU time and its read cache's counters (brokerStatus).
# Groups reading the log once each would read GROUPS x the backlog; past 16 places they
# cannot share the read cache's windows (shards/src/store/read_cache.rs).
#   scripts/bench-places.sh [GROUPS] [MESSAGES] [DELAY] [DATA_PARENT_DIR]
# Environment: BINARIES (shardmq builds to compare, alternated; default
# target/release/shardmq); BROKER_ARGS (more `serve` arguments, e.g. `--profile FILE` with a
# larger store.read_cache_mib); ROUNDS (1); SKIP_BUILD=1. The broker runs on CPU 0 and the
# consumers on CPU 1 where there are two.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
groups=${1:-24}; messages=${2:-400000}; delay=${3:-0.2}; parent=${4:-${TMPDIR:-/var/tmp}}
binaries=${BINARIES:-target/release/shardmq}; rounds=${ROUNDS:-1}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bench=target/release/shardmq-bench
scratch=$(mktemp -d "$parent/bench-places.XXXXXX")
broker=""
trap '[ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null; rm -rf "$scratch"' EXIT
pin=(); [ "$(nproc)" -ge 2 ] && pin=(taskset -c 1)

# The disk under the data directory: sectors read, from /sys/block/<disk>/stat.
source_dev=$(findmnt -no SOURCE -T "$scratch" 2>/dev/null || true)
disk=$(lsblk -no PKNAME "$source_dev" 2>/dev/null | head -n 1 || true)
[ -n "$disk" ] || disk=$(basename "${source_dev:-none}")
sectors_read() {
    if [ -r "/sys/block/$disk/stat" ]; then awk '{print $3}' "/sys/block/$disk/stat"; else echo 0; fi
}
[ -r "/sys/block/$disk/stat" ] || echo "bench-places: no /sys/block stat for '$disk'; disk bytes not shown"

for round in $(seq 1 "$rounds"); do
    for binary in $binaries; do
        rm -rf "$scratch/data"
        # shellcheck disable=SC2086 # BROKER_ARGS is a list of words
        "$binary" serve ${BROKER_ARGS:-} --cpus 0 --data-dir "$scratch/data" --namesrv-port 12276 \
            --broker-port 12311 > "$scratch/broker.log" 2>&1 &
        broker=$!
        wait_ready "$scratch/broker.log" "$broker"
        "${pin[@]}" "$bench" producer --namesrv 127.0.0.1:12276 --topic Places --queues 8 \
            --messages "$messages" --in-flight 256 --no-progress > /dev/null
        sectors=$(sectors_read); ticks=$(awk '{print $14 + $15}' "/proc/$broker/stat")
        started=$(date +%s.%N)
        consumers=()
        for g in $(seq 1 "$groups"); do
            "${pin[@]}" "$bench" consumer --namesrv 127.0.0.1:12276 --topic Places \
                --consumer-group "places$g" --catch-up --no-progress > "$scratch/c$g" 2>&1 &
            consumers+=($!)
            sleep "$delay"
        done
        wait "${consumers[@]}"
        took=$(echo "$(date +%s.%N) - $started" | bc)
        ticks=$(( $(awk '{print $14 + $15}' "/proc/$broker/stat") - ticks ))
        mb=$(( ($(sectors_read) - sectors) / 2048 ))
        got=$(cat "$scratch"/c* | grep -oP 'Consumed: \K[0-9]+' | paste -sd+ | bc)
        cache=$("$binary" admin --namesrv 127.0.0.1:12276 brokerStatus 2>&1 |
            grep -E "storeReadCache" | tr -s ' ' | tr '\n' ' ')
        printf 'round %s %s: %s groups consumed %s of %s in %.1f s; %s MB read from %s; broker CPU %.1f s\n  %s\n' \
            "$round" "$binary" "$groups" "$got" $((groups * messages)) "$took" "$mb" "$disk" \
            "$(echo "$ticks / $(getconf CLK_TCK)" | bc -l)" "$cache"
        kill "$broker"; wait "$broker" || true
        broker=""
    done
done

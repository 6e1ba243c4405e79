#!/usr/bin/env bash
# The cost of replication (issue 14), modes alternated in one run: a one-shard master on
# CPU 0 (127.0.0.1) alone, with an ASYNC slave (127.0.0.2), and as SYNC_MASTER with its
# slave; the bench (1 KiB single sends, IN_FLIGHT in flight) and the slave share CPU 1 (this
# is a 2-core machine: read the slave's effect on the bench into the figures). Prints msgs/s,
# p99, the master's busy cores and the largest replication lag seen (sampled every 0.5 s from
# brokerStatus), then a slave's catch-up rate: an empty slave copying everything the master
# holds (--ha-start-from oldest), for haTransferBatchSize 32 KiB and 1 MiB.
# SHARDMQ_BIN runs another broker binary (A/B). MODES picks the modes (default "alone async sync"); CATCH_UP=0 skips the catch-up.
# FLUSH sets the master's and slave's flushDiskType (default async).
# BENCH_CPU=0 puts the bench on the master's core instead, leaving CPU 1 to the slave alone
# (the slave's lag when it has a core of its own; the master then shares its core).
#   scripts/bench-ha.sh [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-8}; rounds=${2:-2}; in_flight=${IN_FLIGHT:-256}; bench_cpu=${BENCH_CPU:-1}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bin=${SHARDMQ_BIN:-target/release/shardmq}; bench=target/release/shardmq-bench
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-ha.XXXXXX")
ns=127.0.0.1:13076
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
ticks() { awk '{print $14 + $15}' /proc/"$1"/task/*/stat | awk '{s += $1} END {print s}'; }
wait_log() { until grep -q "$2" "$1" 2>/dev/null; do sleep 0.1; done; }
status() { # addr key
    "$bin" admin -n "$ns" --json brokerStatus -b "$1" 2>/dev/null |
        python3 -c "import json,sys
try: print(json.load(sys.stdin)['brokers'][0]['runtime'].get('$2', ''))
except (KeyError, IndexError, ValueError): print('')"
}

"$bin" namesrv --namesrv-port 13076 --shards 1 --cpus 1 --data-dir "$dir/ns" \
    --log-level warn > "$dir/ns.log" 2>&1 &
pids+=($!)
until (echo > /dev/tcp/127.0.0.1/13076) 2>/dev/null; do sleep 0.1; done

started=""
start_broker() { # name ip cpus extra-args...; sets $started to its pid
    local name=$1 ip=$2 cpus=$3; shift 3
    rm -rf "$dir/$name"; mkdir -p "$dir/$name"
    "$bin" broker --namesrv "$ns" --broker-port 13111 --listen-ip "$ip" --broker-ip "$ip" \
        --cpus "$cpus" --flush "${FLUSH:-async}" --data-dir "$dir/$name" --metrics-port 0 \
        --haSendHeartbeatInterval 1000 "$@" > "$dir/$name.log" 2>&1 &
    started=$!
    pids+=("$started")
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

run() { # mode
    local mode=$1 master slave="" topic="Tha$RANDOM" t0 t1 out lag max_lag=0 sampler
    case $mode in
        sync) start_broker master 127.0.0.1 0 --brokerRole SYNC_MASTER ;;
        *) start_broker master 127.0.0.1 0 ;;
    esac
    master=$started
    wait_log "$dir/master.log" "ready"
    if [ "$mode" != alone ]; then
        start_broker slave 127.0.0.2 1 --brokerRole SLAVE --brokerId 1 --ha-start-from oldest
        slave=$started
        wait_log "$dir/slave.log" "connected to master"
    fi
    "$bin" admin -n "$ns" updateTopic -t "$topic" -c DefaultCluster > /dev/null 2>&1 || true
    sleep 1
    : > "$dir/lag"
    if [ -n "$slave" ]; then
        (while true; do
            lag_ms=$(status 127.0.0.1:13111 haReplicationLagMs)
            echo "$(status 127.0.0.1:13111 haReplicationLagBytes) ${lag_ms:-0}" >> "$dir/lag"
            sleep 0.5
        done) &
        sampler=$!
    fi
    t0=$(ticks "$master")
    out=$(taskset -c "$bench_cpu" "$bench" producer --namesrv "$ns" --topic "$topic" --in-flight "$in_flight" \
        --duration-secs "$seconds" --no-progress 2>&1 | awk -f scripts/whole-run.awk)
    t1=$(ticks "$master")
    [ -n "$slave" ] && { kill "$sampler"; wait "$sampler" 2>/dev/null || true; }
    max_lag=$(sort -n "$dir/lag" | tail -1 | cut -d' ' -f1); max_lag=${max_lag:-0}
    max_lag_ms=$(sort -n -k2 "$dir/lag" | tail -1 | cut -d' ' -f2); max_lag_ms=${max_lag_ms:-0}
    echo "$mode: $(echo "$out" | cut -d'|' -f1,6) | master cores $(awk -v a="$t0" -v b="$t1" \
        -v s="$seconds" 'BEGIN {printf "%.2f", (b - a) / 100 / s}') | max slave lag ${max_lag} bytes, ${max_lag_ms} ms"
    [ -n "$slave" ] && stop "$slave"
    stop "$master"
}

for round in $(seq "$rounds"); do
    echo "== round $round"
    for mode in ${MODES:-alone async sync}; do run "$mode"; done
done
[ "${CATCH_UP:-1}" = 1 ] || exit 0

echo "== catch-up: an empty slave copying what the master holds"
start_broker master 127.0.0.1 0
master=$started
wait_log "$dir/master.log" "ready"
"$bin" admin -n "$ns" updateTopic -t Tcatch -c DefaultCluster > /dev/null 2>&1 || true
sleep 1
taskset -c 1 "$bench" producer --namesrv "$ns" --topic Tcatch --in-flight "$in_flight" \
    --duration-secs "$seconds" --no-progress > /dev/null 2>&1
end=$(status 127.0.0.1:13111 commitLogMaxOffset)
for batch in 32768 1048576; do
    start=$(date +%s.%N)
    start_broker slave 127.0.0.2 1 --brokerRole SLAVE --brokerId 1 \
        --ha-start-from oldest --haTransferBatchSize "$batch"
    slave=$started
    until [ "$(status 127.0.0.2:13111 commitLogMaxOffset)" = "$end" ]; do sleep 0.2; done
    stop=$(date +%s.%N)
    echo "haTransferBatchSize $batch: $end bytes in $(awk -v a="$start" -v b="$stop" \
        'BEGIN {printf "%.2f s: %.0f MB/s", b - a, '"$end"' / (b - a) / 1e6}') (includes the slave's start)"
    stop "$slave"
done
stop "$master"

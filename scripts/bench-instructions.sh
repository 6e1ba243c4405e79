#!/usr/bin/env bash
# Instructions a shard executes per message (issue 17), counted by callgrind: on these noisy
# shared machines a change of a few percent in CPU a message is lost in the spread of
# throughput runs, and an instruction count is not. For each shardmq BINARY in turn: a fresh
# one-shard broker (small-vm profile, FLUSH flush) runs under `valgrind --tool=callgrind`;
# `shardmq-bench producer` sends 10,000 1 KiB messages over 8 queues (2 connections × 64 in
# flight) to warm it, the counters are zeroed, MESSAGES more are sent, and the broker stops.
# Prints the shard thread's instructions a message and its TOP functions by instructions of
# their own (inlined code is counted where callgrind's debug info puts it). The count moves
# by ~1% (once 2.6% under SYNC_FLUSH) between runs of one build: how many requests a read or
# a turn of the loop takes differs a little. Under valgrind the broker runs ~50x slower, so
# those batches are not those of a real run; system calls and page faults are not counted.
#   [SKIP_BUILD=1] [FLUSH=async] [MESSAGES=20000] [TOP=25] scripts/bench-instructions.sh BINARY...
# Needs valgrind (`apt-get install valgrind`).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
command -v valgrind > /dev/null ||
    { echo "bench-instructions: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq-bench
flush=${FLUSH:-async}
messages=${MESSAGES:-20000}
top=${TOP:-25}
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-instructions.XXXXXX")
pid=""
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
# Below the ephemeral range (32768-60999).
namesrv_port=29876
broker_port=30911

bench() {
    timeout 300 target/release/shardmq-bench producer --namesrv 127.0.0.1:$namesrv_port \
        --queues 8 --in-flight 64 --threads 1 --connections-per-broker 2 --no-progress "$@"
}

for binary in "$@"; do
    rm -rf "$dir/data" "$dir"/callgrind.out*
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/callgrind.out" \
        "$binary" serve --profile small-vm --cpus 0 --flush "$flush" --data-dir "$dir/data" \
        --namesrv-port $namesrv_port --broker-port $broker_port --listen-ip 127.0.0.1 \
        --log-level warn > "$dir/log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do
        bench --topic Ready --messages 1 > /dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    # The broker must be ours (one left on these ports would answer in its place).
    kill -0 "$pid" 2>/dev/null || { echo "$binary: the broker did not start:"; tail "$dir/log"; exit 1; }
    bench --topic Warm --messages 10000 > /dev/null 2>&1
    callgrind_control --zero "$pid" > /dev/null 2>&1
    bench --topic Warm --messages "$messages" > "$dir/bench.log" 2>&1
    sent=$(grep -oP 'Sent: \K[0-9]+' "$dir/bench.log")
    kill "$pid"; wait "$pid" 2>/dev/null; pid=""
    # The shard's thread is the one that executed the most since the counters were zeroed.
    shard=$(grep -H '^totals:' "$dir"/callgrind.out-* | sort -t' ' -k2 -n | tail -1 | cut -d: -f1)
    total=$(grep '^totals:' "$shard" | awk '{print $2}')
    echo "$binary ($flush flush): $sent messages sent, shard thread $total instructions," \
        "$((total / messages)) a message"
    callgrind_annotate --inclusive=no --threshold=100 --auto=no "$shard" 2>/dev/null |
        grep -E '^ *[0-9,]+ \(' | grep -v 'PROGRAM TOTALS' |
        awk -v n="$messages" '{
            ir = $1; gsub(/,/, "", ir)
            name = $0; sub(/^ *[0-9,]+ \([^)]*\) +/, "", name); sub(/ \[[^]]*\]$/, "", name)
            sub(/^[^:]*:/, "", name)
            own[name] += ir
        } END { for (name in own) printf "%9.1f  %s\n", own[name] / n, name }' |
        grep -v -E '  (clone|start_thread|.*thread_start|.*call_once\{\{vtable.shim\}\})$' |
        sort -rn | head -"$top"
done

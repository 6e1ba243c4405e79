#!/usr/bin/env bash
# Throughput against the number of queues, two broker binaries alternated (issue 17).
#
#   scripts/bench-queues.sh BROKER_A BROKER_B [QUEUES...]      (default: 8 256 1024)
#
# For each queue count and binary: a fresh two-shard node (64 MiB segments), a topic of that
# many queues per shard created by the bench, a 6 s warm-up run, then a 10 s measured run of
# 1 KiB single sends at 64 in flight (`shardmq-bench producer --queues N`). Prints msgs/s, the
# SYSTEM_BUSY answers, the consume-queue directory's disk use and the broker's RSS.
set -uo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
a=$1; b=$2; shift 2
counts=${*:-8 256 1024}
BENCH=target/release/shardmq-bench
run() { # binary queues
    local dir pid out msgs busy
    dir=$(mktemp -d /var/tmp/shardmq-bench-queues.XXXXXX)
    "$1" serve --shards 2 --segment-size-mib 64 --data-dir "$dir/data" \
        --namesrv-port 14676 --broker-port 14711 --listen-ip 127.0.0.1 >"$dir/broker.log" 2>&1 &
    pid=$!
    wait_ready "$dir/broker.log" "$pid"
    "$BENCH" producer --namesrv 127.0.0.1:14676 --topic "BenchQ$2" --queues "$2" \
        --in-flight 64 --duration-secs 6 --no-progress >/dev/null 2>&1
    out=$("$BENCH" producer --namesrv 127.0.0.1:14676 --topic "BenchQ$2" --queues "$2" \
        --in-flight 64 --duration-secs 10 --no-progress 2>&1)
    msgs=$(echo "$out" | grep -oP 'Throughput: \K[0-9]+')
    busy=$(echo "$out" | grep -oP 'code 2 \(SYSTEM_BUSY\): \K[0-9]+' || echo 0)
    printf '%-28s queues %5s  msgs/s %7s  SYSTEM_BUSY %6s  consumequeue %6s  RSS %s\n' \
        "$1" "$2" "${msgs:-?}" "${busy:-0}" \
        "$(du -sh "$dir"/data/shard-*/consumequeue 2>/dev/null | awk '{print $1}' | paste -sd+)" \
        "$(awk '/VmRSS/ {print $2 " kB"}' /proc/$pid/status)"
    kill "$pid"; wait "$pid" 2>/dev/null; rm -rf "$dir"
}
for n in $counts; do
    run "$a" "$n"
    run "$b" "$n"
done

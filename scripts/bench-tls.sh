#!/usr/bin/env bash
# The cost of TLS (issue 16): one node in the default permissive mode (TLS and plaintext on
# the same port), 1 KiB single sends at 256 in flight over 8 queues, plaintext and TLS runs
# alternated against it: one shard on CPU 0, the bench on CPU 1 (taskset), async flush.
# Prints msgs/s, latency and the shard's CPU per run, then TLS / plaintext.
#   scripts/bench-tls.sh [SECONDS] [ROUNDS] [DATA_PARENT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}; rounds=${2:-3}; parent=${3:-${TMPDIR:-/var/tmp}}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bench=target/release/shardmq-bench
dir=$(mktemp -d "$parent/bench-tls.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
target/release/shardmq serve --cpus 0 --flush async --data-dir "$dir/data" --log-level warn \
    > "$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
    taskset -c 1 "$bench" producer --topic T --queues 8 --messages 1 --no-progress \
        > /dev/null 2>&1 && break
    sleep 0.2
done
ticks() { awk '{print $14 + $15}' /proc/"$1"/task/*/stat | awk '{s += $1} END {print s}'; }
declare -A total
for round in $(seq "$rounds"); do
    for mode in plain tls; do
        flags=()
        [ "$mode" = tls ] && flags=(--tls --tls-trust-cert-path "$dir/data/tls/test-cert.pem")
        t0=$(ticks "$pid")
        line=$(taskset -c 1 "$bench" producer --topic T --in-flight 256 \
            --duration-secs "$seconds" --no-progress "${flags[@]}" 2>&1 | awk -f scripts/whole-run.awk)
        t1=$(ticks "$pid")
        tps=$(echo "$line" | awk '{print $3}')
        total[$mode]=$(( ${total[$mode]:-0} + tps ))
        busy=$(awk -v a="$t0" -v b="$t1" -v s="$seconds" 'BEGIN {printf "%.2f", (b - a) / 100 / s}')
        echo "round $round $mode: $(echo "$line" | cut -d'|' -f1,3,6) | broker cores: $busy"
    done
done
awk -v t="${total[tls]}" -v p="${total[plain]}" 'BEGIN {printf "TLS / plaintext: %.2f\n", t / p}'

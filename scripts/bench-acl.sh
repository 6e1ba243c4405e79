#!/usr/bin/env bash
# The cost of ACL (issue 16): shardmq without ACL vs with --acl-file (every request signed by
# the bench and checked by the broker: HmacSHA1 over the extField values and the 1 KiB body),
# alternated in one run: one shard on CPU 0, the bench on CPU 1 (taskset), 1 KiB single sends
# at 256 in flight over 8 queues, async flush, a fresh data directory per run; prints msgs/s,
# latency and the shard's CPU.
#   scripts/bench-acl.sh [SECONDS] [ROUNDS] [DATA_PARENT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}; rounds=${2:-2}; parent=${3:-${TMPDIR:-/var/tmp}}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bench=target/release/shardmq-bench
dir=$(mktemp -d "$parent/bench-acl.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
cat > "$dir/plain_acl.yml" <<'YAML'
accounts:
  - accessKey: bench-admin
    secretKey: bench-admin-secret
    admin: true
  - accessKey: bench-app
    secretKey: bench-app-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
YAML
ticks() { awk '{print $14 + $15}' /proc/"$1"/task/*/stat | awk '{s += $1} END {print s}'; }
for round in $(seq "$rounds"); do
    for mode in off on; do
        rm -rf "$dir/data"; mkdir -p "$dir/data"
        acl=(); keys=()
        if [ "$mode" = on ]; then
            acl=(--acl-file "$dir/plain_acl.yml")
            admin_keys=(--access-key bench-admin --secret-key bench-admin-secret)
            keys=(--access-key bench-app --secret-key bench-app-secret)
        else
            admin_keys=()
        fi
        target/release/shardmq serve --cpus 0 --flush async --data-dir "$dir/data" \
            --log-level warn "${acl[@]}" > "$dir/server.log" 2>&1 &
        pid=$!
        topic="T$RANDOM"
        for _ in $(seq 100); do
            taskset -c 1 "$bench" producer --topic "$topic" --queues 8 --messages 1 \
                --no-progress "${admin_keys[@]}" > /dev/null 2>&1 && break
            sleep 0.2
        done
        t0=$(ticks "$pid")
        line=$(taskset -c 1 "$bench" producer --topic "$topic" --in-flight 256 ${RATE:+--rate "$RATE"} \
            --duration-secs "$seconds" --no-progress "${keys[@]}" 2>&1 | awk -f scripts/whole-run.awk)
        t1=$(ticks "$pid")
        busy=$(awk -v a="$t0" -v b="$t1" -v s="$seconds" 'BEGIN {printf "%.2f", (b - a) / 100 / s}')
        echo "round $round acl $mode: $(echo "$line" | cut -d'|' -f1,3,6) | broker cores: $busy"
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    done
done

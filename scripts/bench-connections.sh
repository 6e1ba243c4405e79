#!/usr/bin/env bash
# Many connections (issue 17): a two-shard node; `shardmq-bench producer --rate 20000
# --in-flight 4` for 10 s over 16 connections, then over 1,000, twice; then the same with 9,000
# idle connections held open by another process (1,000 from each of 127.0.0.2, .3, ...).
# Prints p50/p99 and the bench's CPU time of each run, the broker's RSS idle, with the idle
# connections and at the end, and the bench's other output lines (an error shows there).
# BROKER_ARGS places the shards (default: two, unpinned), BENCH_CPUS the bench and the idle
# connections' holder (taskset; default: anywhere), BIN_DIR the binaries (target/release).
# BENCHES="A B" names several shardmq-bench binaries: each run is made with each in turn,
# against the same broker, its line prefixed with the binary's number (a change to the bench
# itself, compared side by side).
#   [SKIP_BUILD=1] [BIN_DIR=DIR] [BROKER_ARGS="--shards 2 --no-pin"] [BENCH_CPUS=4-15]
#   [ROUNDS=2] [BENCHES="PATH PATH"]
#   scripts/bench-connections.sh [IDLE_CONNECTIONS]
set -uo pipefail
cd "$(dirname "$0")/.."
idle=${1:-9000}
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench
bin_dir=${BIN_DIR:-target/release}
pin=()
[ -n "${BENCH_CPUS:-}" ] && pin=(taskset -c "$BENCH_CPUS")
bench=("${pin[@]}" "$bin_dir/shardmq-bench")
read -r -a benches <<< "${BENCHES:-$bin_dir/shardmq-bench}"
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-connections.XXXXXX")
# Ports below the ephemeral range (32768-60999): a client socket of the runs (or one of an
# earlier run, closing) may have one of ours as its port, and the start fails: address in use.
# shellcheck disable=SC2086 # BROKER_ARGS is a list of arguments
"$bin_dir/shardmq" serve ${BROKER_ARGS:---shards 2 --no-pin} --data-dir "$dir/data" --namesrv-port 25876 \
    --broker-port 26911 --log-level warn > "$dir/broker.log" 2>&1 &
pid=$!
holder=""
trap 'kill $pid $holder 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
ns=127.0.0.1:25876
until "${bench[@]}" producer --namesrv $ns --topic C --queues 8 --messages 1000 --no-progress \
    > /dev/null 2>&1; do
    kill -0 $pid 2>/dev/null || { echo "the broker stopped:"; cat "$dir/broker.log"; exit 1; }
    sleep 0.2
done
# Another process may hold the ports and answer in its place: the broker must be ours.
kill -0 $pid 2>/dev/null || { echo "the broker stopped:"; cat "$dir/broker.log"; exit 1; }
rss() { awk '/VmRSS/ {printf "%.0f MB", $2 / 1024}' "/proc/$pid/status"; }
run() {
    local number=0 binary
    for binary in "${benches[@]}"; do
        number=$((number + 1))
        [ ${#benches[@]} -gt 1 ] && printf '\n  bench %d: ' "$number"
        { time "${pin[@]}" "$binary" producer --namesrv $ns --topic C \
            --connections-per-broker "$1" --in-flight 4 --rate 20000 --duration-secs 10 \
            --no-progress > "$dir/run.log" 2>&1; } 2> "$dir/cpu"
        cat "$dir/run.log" >> "$dir/bench.log"
        printf '%s | bench CPU user sys (s): %s' \
            "$(awk -f scripts/whole-run.awk "$dir/run.log" | cut -d'|' -f1,6)" "$(cat "$dir/cpu")"
    done
}
TIMEFORMAT='%U %S'
echo "broker RSS, idle: $(rss)"
for _ in $(seq "${ROUNDS:-2}"); do echo "16 connections: $(run 8)"; echo "1000 connections: $(run 500)"; done
"${pin[@]}" python3 scripts/hold-connections.py "$idle" 26911 "$dir/ready" &
holder=$!
until [ -f "$dir/ready" ]; do sleep 0.2; done
sleep 1
echo "broker RSS with $idle idle connections: $(rss)"
for _ in $(seq "${ROUNDS:-2}"); do
    echo "16 connections + $idle idle: $(run 8)"
    echo "1000 connections + $idle idle: $(run 500)"
done
echo "broker RSS at the end: $(rss)"
grep -v "^Send TPS" "$dir/bench.log" | sort | uniq -c | sort -rn | head -5

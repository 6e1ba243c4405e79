#!/usr/bin/env bash
# Side-by-side comparison: runs the same workloads, in one run, against shardmq (started here
# with a tuning profile) and against a second RocketMQ-compatible broker (the "peer"), and
# prints each figure with the ratio shardmq / peer.
#
#   scripts/bench-compare.sh [--peer HOST:PORT] [--profile NAME|PATH] [--seconds N]
#                            [--catchup-messages N] [--catchup-size BYTES] [--e2e-rate N]
#                            [--out DIR] [--skip-build]
#
# The peer is, in order: the namesrv given with --peer (or PEER_NAMESRV); else rocketmq-rust
# started here, when `rocketmq-namesrv-rust` and `rocketmq-broker-rust` are on PATH or in
# $ROCKETMQ_RUST_BIN (cargo install rocketmq-namesrv rocketmq-broker --version 1.0.0); else
# none, and only shardmq's figures are printed (the script says so).
#
# Workloads (each --seconds long unless said):
#   W1 1 KiB single sends, 64 in flight per connection        (msgs/s, p50/p99 send latency)
#   W2 1 KiB batches of 64 messages, 16 batches in flight      (msgs/s, p99 per batch)
#   W3 100-byte single sends, 64 in flight                     (msgs/s, p99)
#   W4 W1 again with SYNC flush (shardmq restarted with --flush sync; a peer started here is
#      restarted with flushDiskType=SYNC_FLUSH), and SYNC/ASYNC of each broker
#   W5 end to end, open loop at --e2e-rate msg/s               (latency from intended send time)
#   W6 consumer catch-up of --catchup-messages stored messages (msgs/s, MB/s); stored first by
#      batches of 64, 16 in flight (the fill itself is not a figure)
# Every topic is created with 4 queues per broker (shardmq: per shard). Busy broker cores are
# read from /proc/<pid>/stat (utime + stime) around each run, for brokers started here.
# W1 and W4 also run against `shardmq-bench limit` (as many shards as shardmq ran, its data
# beside shardmq's): the bare-core ceiling of this machine (O_DIRECT append, ack after write +
# fdatasync, no broker logic), printed as a second table with shardmq / limit.
# Reports (JSON + SVG) of every run stay in --out. Compare figures taken in one run only.
set -euo pipefail
cd "$(dirname "$0")/.."

peer=${PEER_NAMESRV:-}
profile=small-vm
seconds=10
catchup_messages=1000000
catchup_size=1024
e2e_rate=10000
out=""
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --peer) peer=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --catchup-messages) catchup_messages=$2; shift 2 ;;
        --catchup-size) catchup_size=$2; shift 2 ;;
        --e2e-rate) e2e_rate=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --skip-build) build=0; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

target_dir=${CARGO_TARGET_DIR:-target}
if [ "$build" = 1 ]; then
    cargo build --release -q -p shardmq -p shardmq-bench
fi
shardmq="$target_dir/release/shardmq"
bench="$target_dir/release/shardmq-bench"
work=$(mktemp -d /tmp/shardmq-compare.XXXXXX)
out=${out:-$work/reports}
mkdir -p "$out"
ticks=$(getconf CLK_TCK)
pids_to_stop=()

cleanup() {
    for pid in "${pids_to_stop[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids_to_stop[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work/data"
    rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT

# A port block nobody listens on: namesrv at $1, brokers at $1 + 35 ... (stride 10).
free_base() {
    local base
    for base in $(seq 16000 100 18900); do
        if ! (ss -ltn 2>/dev/null | awk '{print $4}' | grep -qE ":($base|$((base + 35))|$((base + 45))|$((base + 33)))$"); then
            echo "$base"; return
        fi
    done
    echo "no free port block" >&2; exit 1
}

# CPU ticks used so far by the given pids.
cpu_ticks() {
    local total=0 pid
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}

# Waits until a namesrv answers with at least one broker able to create a topic.
wait_ready() {
    local namesrv=$1 tries=0
    until "$bench" producer --namesrv "$namesrv" --topic "Ready_$RANDOM" --queues 1 \
            --messages 1 --no-progress > /dev/null 2>&1; do
        tries=$((tries + 1))
        if [ "$tries" -gt 60 ]; then echo "broker at $namesrv never got ready" >&2; exit 1; fi
        sleep 1
    done
}

start_shardmq() {
    local flush=$1 base
    base=$(free_base)
    mkdir -p "$work/data/shardmq-$flush"
    "$shardmq" serve --profile "$profile" --flush "$flush" --segment-size-mib 256 \
        --data-dir "$work/data/shardmq-$flush" --namesrv-port "$base" \
        --broker-port $((base + 35)) > "$out/shardmq-$flush.log" 2>&1 &
    broker_pids=($!)
    pids_to_stop+=($!)
    namesrv="127.0.0.1:$base"
    wait_ready "$namesrv"
}

start_limit() {
    local flush=$1 base shards
    base=$(free_base)
    shards=$(grep -oE '[0-9]+ shard\(s\), profile' "$out/shardmq-async.log" | head -1 | cut -d' ' -f1)
    mkdir -p "$work/data/limit-$flush"
    "$bench" limit --shards "${shards:-1}" --flush "$flush" --data-dir "$work/data/limit-$flush" \
        --namesrv-port "$base" --broker-port $((base + 35)) > "$out/limit-$flush.log" 2>&1 &
    broker_pids=($!)
    pids_to_stop+=($!)
    namesrv="127.0.0.1:$base"
    wait_ready "$namesrv"
}

stop_pids() {
    local pid
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

rocketmq_rust_bin() {
    local dir
    for dir in "${ROCKETMQ_RUST_BIN:-}" $(echo "$PATH" | tr ':' ' '); do
        if [ -n "$dir" ] && [ -x "$dir/rocketmq-namesrv-rust" ] && [ -x "$dir/rocketmq-broker-rust" ]; then
            echo "$dir"; return
        fi
    done
}

start_rocketmq_rust() {
    local flush=$1 bin base home
    bin=$(rocketmq_rust_bin)
    base=$(free_base)
    home="$work/data/rocketmq-rust-$flush"
    mkdir -p "$home/conf" "$home/store"
    cat > "$home/conf/broker.properties" <<EOF
brokerClusterName=DefaultCluster
brokerName=peer-broker
brokerId=0
brokerIP1=127.0.0.1
listenPort=$((base + 35))
namesrvAddr=127.0.0.1:$base
storePathRootDir=$home/store
flushDiskType=$flush
autoCreateTopicEnable=true
mappedFileSizeCommitLog=268435456
EOF
    ROCKETMQ_HOME="$home" "$bin/rocketmq-namesrv-rust" --listenPort "$base" --bindAddress 127.0.0.1 \
        --rocketmqHome "$home" --kvConfigPath "$home/kvConfig.json" > "$out/peer-namesrv-$flush.log" 2>&1 &
    local namesrv_pid=$!
    pids_to_stop+=($namesrv_pid)
    sleep 1
    ROCKETMQ_HOME="$home" NAMESRV_ADDR="127.0.0.1:$base" "$bin/rocketmq-broker-rust" \
        -c "$home/conf/broker.properties" -n "127.0.0.1:$base" > "$out/peer-broker-$flush.log" 2>&1 &
    broker_pids=($namesrv_pid $!)
    pids_to_stop+=($!)
    namesrv="127.0.0.1:$base"
    wait_ready "$namesrv"
}

# run TARGET WORKLOAD bench-args...: one bench run, its report and the busy broker cores.
run() {
    local target=$1 workload=$2; shift 2
    local report="$out/$target-$workload.json" before after started elapsed
    before=$(cpu_ticks "${broker_pids[@]}")
    started=$(date +%s.%N)
    if ! "$bench" "$@" --namesrv "$namesrv" --no-progress --report "$report" \
            > "$out/$target-$workload.txt" 2>&1; then
        echo "  $target $workload failed (see $out/$target-$workload.txt)" >&2
        rm -f "$report"
        return 0
    fi
    elapsed=$(echo "$(date +%s.%N) - $started" | bc)
    after=$(cpu_ticks "${broker_pids[@]}")
    if [ "${#broker_pids[@]}" -gt 0 ]; then
        echo "scale=2; ($after - $before) / $ticks / $elapsed" | bc > "$out/$target-$workload.busy"
    fi
    echo "  $target $workload done"
}

# The workloads that run on an async-flush broker.
run_async_workloads() {
    local target=$1 tag=$RANDOM
    run "$target" W1 producer --topic "W1_$tag" --queues 4 --duration-secs "$seconds" \
        --message-size 1024 --in-flight 64
    run "$target" W2 producer --topic "W2_$tag" --queues 4 --duration-secs "$seconds" \
        --message-size 1024 --batch 64 --in-flight 16
    run "$target" W3 producer --topic "W3_$tag" --queues 4 --duration-secs "$seconds" \
        --message-size 100 --in-flight 64
    run "$target" W5 e2e --topic "W5_$tag" --queues 4 --duration-secs "$seconds" \
        --message-size 1024 --rate "$e2e_rate"
    # --messages sends busy-refused batches again, so exactly that many are stored.
    run "$target" W6-fill producer --topic "W6_$tag" --queues 4 --messages "$catchup_messages" \
        --message-size "$catchup_size" --batch 64 --in-flight 16
    run "$target" W6 consumer --topic "W6_$tag" --catch-up
}

run_sync_workload() {
    run "$1" W4 producer --topic "W4_$RANDOM" --queues 4 --duration-secs "$seconds" \
        --message-size 1024 --in-flight 64
}

echo "==> shardmq (profile $profile), reports in $out"
start_shardmq async
run_async_workloads shardmq
stop_pids "${broker_pids[@]}"
start_shardmq sync
run_sync_workload shardmq
stop_pids "${broker_pids[@]}"

echo "==> shardmq-bench limit (the bare-core ceiling)"
start_limit async
run limit W1 producer --topic "W1_$RANDOM" --queues 4 --duration-secs "$seconds" \
    --message-size 1024 --in-flight 64
stop_pids "${broker_pids[@]}"
start_limit sync
run_sync_workload limit
stop_pids "${broker_pids[@]}"

peer_name=""
if [ -n "$peer" ]; then
    peer_name="peer at $peer"
    echo "==> $peer_name (given; busy cores not measured)"
    namesrv=$peer
    broker_pids=()
    wait_ready "$namesrv"
    run_async_workloads peer
    run_sync_workload peer
elif [ -n "$(rocketmq_rust_bin)" ]; then
    peer_name="rocketmq-rust ($(rocketmq_rust_bin)/rocketmq-broker-rust)"
    echo "==> $peer_name, started here"
    start_rocketmq_rust ASYNC_FLUSH
    run_async_workloads peer
    stop_pids "${broker_pids[@]}"
    start_rocketmq_rust SYNC_FLUSH
    run_sync_workload peer
    stop_pids "${broker_pids[@]}"
else
    echo "==> no peer: give --peer HOST:PORT (or PEER_NAMESRV), or put rocketmq-namesrv-rust and"
    echo "    rocketmq-broker-rust on PATH (cargo install rocketmq-namesrv rocketmq-broker"
    echo "    --version 1.0.0); only shardmq's figures follow"
fi

python3 - "$out" "${peer_name:-none}" "$profile" "$seconds" "$catchup_messages" "$catchup_size" "$e2e_rate" <<'PY'
import json, os, sys
out, peer_name, profile, seconds, catchup_messages, catchup_size, e2e_rate = sys.argv[1:]

def load(target, workload):
    path = os.path.join(out, f"{target}-{workload}.json")
    return json.load(open(path)) if os.path.exists(path) else None

def busy(target, workload):
    path = os.path.join(out, f"{target}-{workload}.busy")
    try:
        return float(open(path).read())
    except (OSError, ValueError):
        return None

def pick(report, *path):
    for key in path:
        if report is None:
            return None
        report = report.get(key)
    return report

rows = []
def row(workload, figure, better, get):
    values = [get(t) for t in ("shardmq", "peer")]
    rows.append((workload, figure, better, *values))

def send_rows(workload, title):
    row(title, "msgs/s", "higher", lambda t: pick(load(t, workload), "producer", "messages_per_sec"))
    row(title, "p50 send latency (us)", "lower", lambda t: pick(load(t, workload), "producer", "latency_us", "p50"))
    row(title, "p99 send latency (us)", "lower", lambda t: pick(load(t, workload), "producer", "latency_us", "p99"))
    row(title, "p99.9 send latency (us)", "lower", lambda t: pick(load(t, workload), "producer", "latency_us", "p99_9"))
    row(title, "busy broker cores", "lower", lambda t: busy(t, workload))
    def per_core(t):
        rate, cores = pick(load(t, workload), "producer", "messages_per_sec"), busy(t, workload)
        return rate / cores if rate and cores else None
    row(title, "msgs/s per busy core", "higher", per_core)

send_rows("W1", "W1 1 KiB sends, 64 in flight")
send_rows("W2", "W2 1 KiB batches of 64")
send_rows("W3", "W3 100 B sends, 64 in flight")
send_rows("W4", "W4 1 KiB sends, SYNC flush")
def sync_ratio(t):
    sync, asynch = pick(load(t, "W4"), "producer", "messages_per_sec"), pick(load(t, "W1"), "producer", "messages_per_sec")
    return sync / asynch if sync and asynch else None
row("W4 1 KiB sends, SYNC flush", "SYNC / ASYNC msgs/s", "higher", sync_ratio)
e2e = "W5 end to end at %s msg/s" % e2e_rate
for name, key in (("p50", "p50"), ("p99", "p99"), ("p99.9", "p99_9"), ("p99.99", "p99_99")):
    row(e2e, f"{name} e2e latency (us)", "lower", lambda t, key=key: pick(load(t, "W5"), "consumer", "end_to_end_latency_us", key))
row(e2e, "received msgs/s", "higher", lambda t: pick(load(t, "W5"), "consumer", "messages_per_sec"))
row(e2e, "busy broker cores", "lower", lambda t: busy(t, "W5"))
catchup = f"W6 catch-up of {catchup_messages} x {catchup_size} B"
row(catchup, "msgs/s", "higher", lambda t: pick(load(t, "W6"), "consumer", "messages_per_sec"))
row(catchup, "MB/s", "higher", lambda t: pick(load(t, "W6"), "consumer", "payload_mb_per_sec"))
row(catchup, "stored by the fill", "same", lambda t: pick(load(t, "W6-fill"), "producer", "sent"))
row(catchup, "received", "same", lambda t: pick(load(t, "W6"), "consumer", "consumed"))
row(catchup, "busy broker cores", "lower", lambda t: busy(t, "W6"))

def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float) and value < 10:
        return f"{value:.2f}"
    return f"{value:,.0f}"

header = ("workload", "figure", "better", "shardmq", "peer", "shardmq/peer")
lines = []
for workload, figure, better, mine, theirs in rows:
    ratio = f"{mine / theirs:.2f}" if mine is not None and theirs else "-"
    lines.append((workload, figure, better, fmt(mine), fmt(theirs), ratio))
widths = [max(len(str(r[i])) for r in [header] + lines) for i in range(len(header))]
print()
print(f"shardmq (profile {profile}) vs peer: {peer_name}; {seconds} s per timed workload")
for r in [header] + lines:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
with open(os.path.join(out, "compare.md"), "w") as md:
    md.write(f"shardmq (profile {profile}) vs {peer_name}; {seconds} s per timed workload\n\n")
    md.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
    for r in lines:
        md.write("| " + " | ".join(r) + " |\n")
limit_rows = []
for workload, title in (("W1", "W1 1 KiB sends, 64 in flight"), ("W4", "W4 1 KiB sends, SYNC flush")):
    for figure, better, get in (
            ("msgs/s", "higher", lambda t, w=workload: pick(load(t, w), "producer", "messages_per_sec")),
            ("p99 send latency (us)", "lower", lambda t, w=workload: pick(load(t, w), "producer", "latency_us", "p99")),
            ("busy broker cores", "lower", lambda t, w=workload: busy(t, w))):
        mine, limit = get("shardmq"), get("limit")
        ratio = f"{mine / limit:.2f}" if mine is not None and limit else "-"
        limit_rows.append((title, figure, better, fmt(mine), fmt(limit), ratio))
header = ("workload", "figure", "better", "shardmq", "limit", "shardmq/limit")
widths = [max(len(str(r[i])) for r in [header] + limit_rows) for i in range(len(header))]
print()
print("shardmq vs shardmq-bench limit (bare core: O_DIRECT append, ack after write + fdatasync)")
for r in [header] + limit_rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
with open(os.path.join(out, "compare.md"), "a") as md:
    md.write("\nshardmq vs shardmq-bench limit (the bare-core ceiling of this machine)\n\n")
    md.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
    for r in limit_rows:
        md.write("| " + " | ".join(r) + " |\n")
print(f"\nMarkdown table: {os.path.join(out, 'compare.md')}")
PY

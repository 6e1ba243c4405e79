#!/usr/bin/env bash
# Every figure of issue 17 that needs a many-core host, in one unattended run on a lent
# machine (one call, then give it back), most wanted first:
#   1. groups: 1 and 16 consumer groups on one topic at the full produce rate
#      (scripts/bench-groups.sh: do the 16 keep up, the producer within 80% of one group?);
#   2. catch-up: a backlog on disk only, served by 1, 2 and 4 shards against the disk's
#      sequential read in the same run (scripts/bench-catchup.sh; target 70%);
#   3. scaling: 1, 2, 4 and 8 shards, async and SYNC_FLUSH, beside the bare-core limit
#      (scripts/bench-scaling.sh, the disk only);
#   4. connections: 16 against 1,000 producing connections, then with 9,000 idle ones
#      (scripts/bench-connections.sh).
# Each step runs only if its estimate fits in what is left of BUDGET_S, and under a timeout,
# so a run cut short still reports what it measured; every line goes to $OUT/device.txt (and
# the steps' own files beside it). On a machine with fewer than 16 CPUs it runs a small
# version of each step (a dry run: do the scripts still work?), not figures to report.
#
# Prepare here, then run there (the binaries travel stripped, as an ignored path):
#   scripts/bench-device.sh --prepare      # release build, stripped copies in target/device
#   BIN_DIR=target/device scripts/bench-device.sh
#   [BUDGET_S=450] [OUT=device-out] [STEPS="groups catchup scaling connections"]
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --prepare ]; then
    cargo build --release -q -p shardmq -p shardmq-bench || exit 1
    mkdir -p target/device
    for binary in shardmq shardmq-bench; do
        cp target/release/$binary target/device/ && strip target/device/$binary || exit 1
    done
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes')" \
        > target/device/COMMIT
    ls -l target/device
    echo "run there with: BIN_DIR=target/device scripts/bench-device.sh (carry target/device)"
    exit 0
fi
bin_dir=${BIN_DIR:-target/release}
budget=${BUDGET_S:-450}
steps=${STEPS:-groups catchup scaling connections}
out=${OUT:-device-out}
mkdir -p "$out"
report=$out/device.txt
began=$(date +%s)
say() { echo "$*" | tee -a "$report"; }
for binary in shardmq shardmq-bench; do
    [ -x "$bin_dir/$binary" ] || { say "bench-device: no $bin_dir/$binary (scripts/bench-device.sh --prepare)"; exit 1; }
done
ulimit -l unlimited 2>/dev/null
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
cpus=$(nproc)
say "# bench-device $(date -u +%FT%TZ): $cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), kernel $(uname -r),"
say "# $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), memlock $(ulimit -l), fio: $(command -v fio || echo 'none (scripts/disk-read.py reads instead)'),"
say "# tcp congestion control $(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown) (bbr paces loopback too: a catch-up's MB/s is lower under it, docs/performance.md),"
say "# binaries $bin_dir (commit $(cat "$bin_dir/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)), budget $budget s, steps: $steps"
if ((cpus >= 16)); then
    small=0
else
    small=1
    say "# fewer than 16 CPUs: a dry run of each step, smaller; its figures are not the issue's"
fi

# run NAME ESTIMATE_S COMMAND...: the command, if ESTIMATE_S fits in the budget left, under a
# timeout of twice that (never past the budget's end by more than the estimate).
run() {
    local name=$1 estimate=$2 spent left
    shift 2
    spent=$(($(date +%s) - began))
    left=$((budget - spent))
    if ((estimate > left)); then
        say "## $name: skipped ($spent s spent of $budget, it needs about $estimate)"
        return
    fi
    say "## $name ($spent s in)"
    timeout --kill-after=10 $((estimate * 2)) "$@" 2>&1 | tee -a "$report"
    local status=${PIPESTATUS[0]}
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        say "## $name: stopped after $((estimate * 2)) s (timeout)"
        # what the step's script started and had no time to stop
        pkill -9 -f "^$bin_dir/shardmq" 2>/dev/null
    fi
    say "## $name: $(($(date +%s) - began - spent)) s, status $status"
}

# the shards on cores 2.. (0-1 left to the OS, as the dedicated-16 profile does), the bench on
# the cores after them
span() { seq -s, "$1" "$2"; }
export SKIP_BUILD=1 BIN_DIR="$bin_dir" OUT="$out"
for step in $steps; do
    case $step in
    groups)
        if ((small)); then
            run groups 60 env SHARD_CPUS=0 PRODUCER_CPUS=1 CONSUMER_CPUS=1 PROFILE=small-vm \
                GROUP_COUNTS="1 4" SECONDS_RUN=3 scripts/bench-groups.sh
        else
            run groups 60 env SHARD_CPUS=2,3 PRODUCER_CPUS=4,5 CONSUMER_CPUS=6-15 \
                GROUP_COUNTS="1 16" SECONDS_RUN=10 scripts/bench-groups.sh
        fi
        ;;
    catchup)
        for shards in $( ((small)) && echo 1 2 || echo 1 2 4); do
            if ((small)); then
                cpu_args="" bench_cpus=""
                ((shards == 1)) && cpu_args="--cpus 0" bench_cpus=1
                gib=1
            else
                cpu_args="--cpus $(span 2 $((shards + 1)))"
                bench_cpus=$(span $((shards + 2)) 15)
                gib=$((shards < 4 ? 4 : 8))
            fi
            # 8 queues a shard: a consumer keeps one pull a queue in flight, and one group
            # of 8 queues is bound by its 8 pulls' round trip (docs/performance.md).
            run "catch-up, $shards shard(s), $((8 * shards)) queues, $gib GiB of 4 KiB messages" \
                $((10 + 5 * gib)) env SHARDS="$shards" QUEUES=$((8 * shards)) \
                BROKER_ARGS="$cpu_args" BENCH_CPUS="$bench_cpus" \
                scripts/bench-catchup.sh "$gib" 4096
        done
        ;;
    scaling)
        if ((small)); then
            run scaling 60 env SHARDS=1 MODES="async sync" STORES=disk PROFILE=small-vm \
                WARM=1 MEASURE=2 SKIP_DISK_PROBE=1 scripts/bench-scaling.sh
        else
            run scaling 200 env SHARDS="1 2 4 8" MODES="async sync" STORES=disk WARM=2 \
                MEASURE=5 scripts/bench-scaling.sh
        fi
        ;;
    connections)
        if ((small)); then
            run connections 90 env ROUNDS=1 BROKER_ARGS="--shards 1 --cpus 0" BENCH_CPUS=1 \
                scripts/bench-connections.sh 500
        else
            run connections 120 env ROUNDS=1 BROKER_ARGS="--shards 2 --cpus 2,3" \
                BENCH_CPUS=4-15 scripts/bench-connections.sh 9000
        fi
        ;;
    *) say "## $step: no such step (groups, catchup, scaling, connections)" ;;
    esac
done
say "# bench-device done after $(($(date +%s) - began)) s"

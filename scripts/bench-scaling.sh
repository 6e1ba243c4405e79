#!/usr/bin/env bash
# The scaling series (issue 17): produce throughput of one node as its shard count grows, on a
# 16-core host with the `dedicated-16` profile (shards on cores 2, 3, …; cores 0-1 for the OS),
# beside the bare-core ceiling (`shardmq-bench limit`) on the same cores. The bench runs, with
# taskset, on every core the shards leave free (at 14 shards only cores 0-1: say so when it is
# the limit, from its busy cores). Each point is a fresh data directory, a warm-up run, then a
# measured run of 1 KiB single sends, 2 connections a shard with 256 in flight each, 8 queues
# per shard; it prints msgs/s, latency and the busy cores of the server and of the bench (/proc).
# Made to run once, unattended, on a lent machine: it writes each line to $OUT (or ./scaling-out)
# as it goes (and every log in logs.tar.gz), so a run cut short still reports what it measured.
#   [SKIP_BUILD=1] [BIN_DIR=target/release] [SHARDS="1 2 4 8 14"] [MODES="async sync"]
#   [TARGETS="shardmq limit"] [STORES="disk tmpfs"] [WARM=2] [MEASURE=6] [PROFILE=dedicated-16]
#   [CONNS_PER_SHARD=2] [TMPFS_MODES="async"]
#   [DATA_PARENT=/var/tmp] scripts/bench-scaling.sh
set -uo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench || exit 1
bin_dir=${BIN_DIR:-target/release}
shard_counts=${SHARDS:-1 2 4 8 14}
modes=${MODES:-async sync}
targets=${TARGETS:-shardmq limit}
stores=${STORES:-disk tmpfs}
warm=${WARM:-2}
measure=${MEASURE:-6}
profile=${PROFILE:-dedicated-16}
per_shard_conns=${CONNS_PER_SHARD:-2}
out=${OUT:-scaling-out}
mkdir -p "$out"
report=$out/scaling.txt
parent=$(mktemp -d "${DATA_PARENT:-/var/tmp}/bench-scaling.XXXXXX")
shm=""
pid=""
logs=$parent/logs
mkdir -p "$logs"
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    [ -n "$shm" ] && umount "$shm" 2>/dev/null
    rm -rf "$parent"
}
trap cleanup EXIT
say() { echo "$*" | tee -a "$report"; }

ulimit -l unlimited 2>/dev/null || say "note: could not raise RLIMIT_MEMLOCK ($(ulimit -l) KiB)"
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
online=$(nproc --all)
reserved=2
[ "$profile" = dedicated-16 ] || reserved=${RESERVED:-0}
say "# bench-scaling $(date -u +%FT%TZ): $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
say "# kernel $(uname -r), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), io_uring_disabled=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo n/a)"
say "# disk of $parent: $(df -h --output=size,avail "$parent" | tail -1 | awk '{print $1 " total, " $2 " free"}')"
if [ "${SKIP_DISK_PROBE:-0}" != 1 ]; then
    rate=$(dd if=/dev/zero of="$parent/probe" bs=4M count=512 oflag=direct 2>&1 | tail -1 | awk -F, '{print $NF}')
    sync_rate=$(dd if=/dev/zero of="$parent/probe" bs=256k count=2048 oflag=direct,dsync conv=notrunc 2>&1 | tail -1 | awk -F, '{print $NF}')
    rm -f "$parent/probe"
    say "# disk write, O_DIRECT 4 MiB blocks:$rate; O_DIRECT|O_DSYNC 256 KiB blocks:$sync_rate"
fi
if [[ " $stores " == *" tmpfs "* ]]; then
    shm=$parent/shm
    mkdir -p "$shm"
    if ! mount -t tmpfs -o size=80g tmpfs "$shm" 2>/dev/null; then
        say "# tmpfs: could not mount one here (not root?); the tmpfs points are skipped"
        rmdir "$shm"; shm=""
    fi
fi

# "name ticks" per thread name of a process, digits stripped (shard-3 → shard).
thread_ticks() {
    for t in /proc/"$1"/task/*; do
        echo "$(tr -d '0-9' < "$t/comm" 2>/dev/null | sed 's/-*$//') $(awk '{print $14 + $15}' "$t/stat" 2>/dev/null)"
    done | awk 'NF == 2 {a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
ticks() { awk '{print $14 + $15}' /proc/"$1"/stat 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)

# cores for N shards under the profile, and the cores left for the bench
shard_cpus() { seq -s, "$reserved" $((reserved + $1 - 1)); }
bench_cpus() {
    local n=$1 free=()
    for ((c = 0; c < online; c++)); do
        if ((c < reserved || c >= reserved + n)); then free+=("$c"); fi
    done
    (IFS=,; echo "${free[*]}")
}

say "| store | flush | server | shards | msgs/s | per shard | per busy server core | p50 µs | p99 µs | server busy cores | shard threads busy | bench cores | bench busy | failed |"
say "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
# ports below the ephemeral range (32768-60999), a fresh pair for each point
port_base=20000
for store in $stores; do
    if [ "$store" = tmpfs ]; then [ -n "$shm" ] || continue; root=$shm; else root=$parent; fi
    store_modes=$modes
    [ "$store" = tmpfs ] && store_modes=${TMPFS_MODES:-async}
    for mode in $store_modes; do
        for target in $targets; do
            for n in $shard_counts; do
                if ((reserved + n > online)); then say "# $n shards do not fit in $online CPUs; skipped"; continue; fi
                port_base=$((port_base + 200))
                namesrv_port=$port_base broker_port=$((port_base + 11))
                data=$root/data
                rm -rf "$data"; mkdir -p "$data"
                log=$logs/server-$store-$mode-$target-$n.log
                cpus=$(shard_cpus "$n")
                if [ "$target" = limit ]; then
                    "$bin_dir/shardmq-bench" limit --cpus "$cpus" --flush "$mode" --data-dir "$data" \
                        --namesrv-port "$namesrv_port" --broker-port "$broker_port" --ring-mib 512 > "$log" 2>&1 &
                    pid=$!; ready="shard $((n - 1)) ready"
                else
                    "$bin_dir/shardmq" serve --profile "$profile" --cpus "$cpus" --flush "$mode" \
                        --data-dir "$data" --namesrv-port "$namesrv_port" --broker-port "$broker_port" \
                        --listen-ip 127.0.0.1 --log-level warn > "$log" 2>&1 &
                    pid=$!; ready=""
                fi
                bcpus=$(bench_cpus "$n")
                # the same load per shard at every point: CONNS_PER_SHARD connections of 256
                # in flight each, on as many bench threads as it has cores (at most one a
                # connection)
                threads=$(echo "$bcpus" | tr , '\n' | wc -l)
                threads=$((threads < n * per_shard_conns ? threads : n * per_shard_conns))
                bench=(taskset -c "$bcpus" "$bin_dir/shardmq-bench" producer
                    --namesrv "127.0.0.1:$namesrv_port" --queues 8 --in-flight 256 --no-progress
                    --threads "$threads" --connections-per-broker "$per_shard_conns")
                up=0
                for _ in $(seq 150); do
                    kill -0 "$pid" 2>/dev/null || break
                    if [ -z "$ready" ] || grep -q "$ready" "$log"; then
                        if "${bench[@]}" --topic "Ready$n" --messages 1 > /dev/null 2>&1; then up=1; break; fi
                    fi
                    sleep 0.2
                done
                if [ $up = 0 ]; then
                    say "| $store | $mode | $target | $n | did not start: $(tail -n 2 "$log" | tr '\n|' ' /') |"
                    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""
                    tar -czf "$out/logs.tar.gz" -C "$parent" logs 2>/dev/null
                    continue
                fi
                topic="S${mode}$n$target"
                "${bench[@]}" --topic "$topic" --duration-secs "$warm" > /dev/null 2>&1
                server0=$(ticks "$pid"); thread_ticks "$pid" > "$parent/t0"
                started=$(date +%s.%N)
                TIMEFORMAT='%U %S'
                { time "${bench[@]}" --topic "$topic" --duration-secs "$measure" > "$parent/bench.out" 2>&1; } 2> "$parent/bench.time"
                elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", b - a}')
                server1=$(ticks "$pid"); thread_ticks "$pid" > "$parent/t1"
                summary=$(sed -n '/producer summary/,$p' "$parent/bench.out")
                tps=$(echo "$summary" | grep -oE "Throughput: [0-9]+" | awk '{print $2}')
                p50=$(echo "$summary" | grep -oE "Send latency.* p50 [0-9]+" | awk '{print $NF}')
                p99=$(echo "$summary" | grep -oE "Send latency.* p99 [0-9]+" | awk '{print $NF}')
                failed=$(echo "$summary" | grep -oE "Send Failed: [0-9]+ Response Failed: [0-9]+" | awk '{print $3 + $6}')
                busy=$(echo "$server0 $server1" | awk -v s="$elapsed" -v hz="$hz" '{printf "%.2f", ($2 - $1) / hz / s}')
                shard_busy=$(join "$parent/t0" "$parent/t1" | awk -v s="$elapsed" -v hz="$hz" '$1 == "shard" {printf "%.2f", ($3 - $2) / hz / s}')
                bench_busy=$(awk -v s="$elapsed" '{printf "%.2f", ($1 + $2) / s}' "$parent/bench.time")
                per_shard=$(( ${tps:-0} / n ))
                per_core=$(echo "$busy" | awk -v t="${tps:-0}" '$1 > 0 {printf "%.0f", t / $1}')
                say "| $store | $mode | $target | $n | ${tps:-?} | $per_shard | ${per_core:-?} | ${p50:-?} | ${p99:-?} | $busy | ${shard_busy:-n/a} | $bcpus | ${bench_busy:-?} | ${failed:-?} |"
                cp "$parent/bench.out" "$logs/bench-$store-$mode-$target-$n.out" 2>/dev/null
                tar -czf "$out/logs.tar.gz" -C "$parent" logs 2>/dev/null
                kill "$pid" 2>/dev/null
                for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""
                rm -rf "$data"
            done
        done
    done
done
say "# done $(date -u +%FT%TZ)"

#!/usr/bin/env bash
# Many consumer groups on one topic at the full produce rate (issue 17): a fresh node per
# point, one 8-queue topic, G consumer groups each pulled by its own `shardmq-bench consumer`
# process (one thread each, from the last offset, started before the producer), and one
# `shardmq-bench producer` (1 KiB single sends, 256 in flight per connection) for SECONDS_RUN.
# Each group must receive every message sent: it prints the producer's msgs/s, what the
# groups received (least and most), the largest average born-to-consume delay of a group and
# the lag (sent minus the least any group received, SECONDS_RUN + 4 s after the producer began).
# Shards, producer and consumers each get their own cores (taskset); made for a 16-core host
# (defaults) and to run unattended there, writing each line to $OUT (or ./groups-out).
#   [SKIP_BUILD=1] [BIN_DIR=target/release] [PROFILE=dedicated-16] [SHARD_CPUS=2,3]
#   [PRODUCER_CPUS=4,5] [CONSUMER_CPUS=6-15] [GROUP_COUNTS="1 16"] [SECONDS_RUN=10]
#   scripts/bench-groups.sh
set -uo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p shardmq -p shardmq-bench || exit 1
bin_dir=${BIN_DIR:-target/release}
profile=${PROFILE:-dedicated-16}
shard_cpus=${SHARD_CPUS:-2,3}
producer_cpus=${PRODUCER_CPUS:-4,5}
consumer_cpus=${CONSUMER_CPUS:-6-15}
seconds=${SECONDS_RUN:-10}
out=${OUT:-groups-out}
mkdir -p "$out"
report=$out/groups.txt
dir=$(mktemp -d "${DATA_PARENT:-/var/tmp}/bench-groups.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
say() { echo "$*" | tee -a "$report"; }
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
producer_threads=$(echo "$producer_cpus" | tr , '\n' | wc -l)
shards=$(echo "$shard_cpus" | tr , '\n' | wc -l)
say "# bench-groups $(date -u +%FT%TZ): shards on CPUs $shard_cpus, producer on $producer_cpus, consumers on $consumer_cpus, ${seconds} s"
say "| shards | groups | producer msgs/s | sent | received per group (least / most) | lag (sent − least) | largest group AVG(B2C) ms | consumer msgs/s (all groups) | producer p99 µs |"
say "|---|---|---|---|---|---|---|---|---|"
port=22000
for groups in ${GROUP_COUNTS:-1 16}; do
    port=$((port + 200))
    rm -rf "$dir/data"; mkdir -p "$dir/data"
    "$bin_dir/shardmq" serve --profile "$profile" --cpus "$shard_cpus" --data-dir "$dir/data" \
        --namesrv-port "$port" --broker-port $((port + 11)) --listen-ip 127.0.0.1 \
        --log-level warn > "$dir/server-$groups.log" 2>&1 &
    pid=$!
    ns=127.0.0.1:$port
    up=0
    for _ in $(seq 150); do
        kill -0 "$pid" 2>/dev/null || break
        if taskset -c "$producer_cpus" "$bin_dir/shardmq-bench" producer --namesrv "$ns" \
            --topic G --queues 8 --messages 1 --no-progress > /dev/null 2>&1; then up=1; break; fi
        sleep 0.2
    done
    if [ $up = 0 ]; then
        say "| $shards | $groups | did not start: $(tail -n 2 "$dir/server-$groups.log" | tr '\n|' ' /') |"
        continue
    fi
    consumers=()
    for ((g = 0; g < groups; g++)); do
        taskset -c "$consumer_cpus" "$bin_dir/shardmq-bench" consumer --namesrv "$ns" --topic G \
            --consumer-group "group-$g" --duration-secs $((seconds + 5)) --no-progress \
            > "$dir/consumer-$groups-$g.out" 2>&1 &
        consumers+=($!)
    done
    sleep 1
    taskset -c "$producer_cpus" "$bin_dir/shardmq-bench" producer --namesrv "$ns" --topic G \
        --in-flight 256 --threads "$producer_threads" --connections-per-broker 2 \
        --duration-secs "$seconds" --no-progress > "$dir/producer-$groups.out" 2>&1
    wait "${consumers[@]}"
    sent=$(grep -oE "^Sent: [0-9]+" "$dir/producer-$groups.out" | awk '{print $2}')
    tps=$(grep -oE "Throughput: [0-9]+" "$dir/producer-$groups.out" | awk '{print $2}')
    p99=$(grep -oE "Send latency.* p99 [0-9]+" "$dir/producer-$groups.out" | awk '{print $NF}')
    received=$(cat "$dir"/consumer-"$groups"-*.out | grep -oE "^Consumed: [0-9]+" | awk '{print $2}' | sort -n)
    least=$(echo "$received" | head -1); most=$(echo "$received" | tail -1)
    b2c=$(cat "$dir"/consumer-"$groups"-*.out | grep -oE "AVG\(B2C\) [0-9.]+" | awk '{print $2}' | sort -g | tail -1)
    consumed_rate=$(cat "$dir"/consumer-"$groups"-*.out | grep -oE "Throughput: [0-9]+" | awk '{s += $2} END {print s}')
    say "| $shards | $groups | ${tps:-?} | ${sent:-?} | ${least:-?} / ${most:-?} | $(( ${sent:-0} - ${least:-0} )) | ${b2c:-?} | ${consumed_rate:-?} | ${p99:-?} |"
    tar -czf "$out/groups-logs.tar.gz" -C "$dir" --exclude data . 2>/dev/null
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""
done

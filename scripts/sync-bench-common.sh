# Sourced by bench-sync-limit.sh and bench-recycle.sh: the data disk's counters, the
# closed-loop producer on CPU 1, and a run's disk figures. The caller sets parent (a
# directory on the disk to measure), in_flight, connections and namesrv_port.
device=$(basename "$(df --output=source "$parent" | tail -1)")
# A filesystem with no block device of its own (tmpfs) shows no disk figures (all 0).
grep -q " $device " /proc/diskstats || echo "note: $parent is on $device, not a disk in /proc/diskstats"
disk() { # writes, sectors written, ms writing, cache flushes, as /proc/diskstats counts them
    awk -v d="$device" '$3 == d {f = 1; print $8, $10, $11, $19} END {if (!f) print 0, 0, 0, 0}' \
        /proc/diskstats
}
bench() { # args...
    taskset -c 1 target/release/shardmq-bench producer --namesrv "127.0.0.1:$namesrv_port" \
        --queues 8 --in-flight "$in_flight" --threads 1 --connections-per-broker "$connections" \
        --no-progress "$@"
}
disk_figures() { # disk-before disk-after seconds msgs/s limit-msgs/s (no newline)
    echo "$1 $2" | awk -v s="$3" -v m="$4" -v l="$5" '{
        printf "disk: %5.0f writes/s %6.1f MB/s %5.0f flushes/s %5.0f ms writing/s  of limit %.2f",
            ($5 - $1) / s, ($6 - $2) * 512 / 1e6 / s, ($8 - $4) / s, ($7 - $3) / s, m / l }'
}

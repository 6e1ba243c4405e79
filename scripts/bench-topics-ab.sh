#!/bin/bash
set -uo pipefail
# Many topics, two builds side by side (issue 17): for each round, OLD then NEW, one run of
# `scripts/bench-topics.sh` each (a fresh two-shard node, `shardmq-bench producer --topics N
# --queues 8`: a WARM s warm-up, a 15 s measured run with the broker's page faults, then a
# kill -9 and the restart, with what each shard's recovery scanned), 30 s apart.
# With 10,000 topics raise vm.max_map_count first (`sysctl -w vm.max_map_count=655360`, and
# back after).
#   scripts/bench-topics-ab.sh OLD_BINARY NEW_BINARY TOPICS [WARM_S] [ROUNDS]
cd "$(dirname "$0")/.."
old=$1 new=$2 topics=$3 warm=${4:-10} rounds=${5:-2}
for round in $(seq 1 $rounds); do
    echo "== round $round"
    for bin in $old $new; do
        echo "-- $bin"
        WARM=$warm MEASURE=15 STOP=kill scripts/bench-topics.sh $bin $topics
        # ext4 allocates inodes slowly right after many files were deleted.
        sleep 30
    done
done

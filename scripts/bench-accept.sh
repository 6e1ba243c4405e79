#!/usr/bin/env bash
# Connection churn: for each round, each shardmq BINARY in turn serves a fresh two-shard node
# (unpinned) while THREADS client threads each connect to the broker port, send one request
# (an unknown code: the cheapest answer), read the answer and close, for SECS seconds. Prints
# connections a second, the connect-to-answer p50 / p99 / max, and the node's CPU time a
# connection (all its threads, from /proc: the client's speed does not move it) per binary
# and round, so a change to how connections are accepted is compared side by side.
#   [ROUNDS=2] [SECS=10] [THREADS=8] scripts/bench-accept.sh BINARY...
set -uo pipefail
. "$(dirname "$0")/bench-lib.sh"
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,8p' "$0"; exit 2; }
rounds=${ROUNDS:-2}
secs=${SECS:-10}
threads=${THREADS:-8}
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-accept.XXXXXX")
pid=""
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
# Below the ephemeral range (32768-60999), as in bench-connections.sh.
ns_port=27976
broker_port=27996

# The node's user + system time in clock ticks.
node_ticks() { awk '{print $14 + $15}' /proc/"$pid"/stat; }

churn() {
    python3 - "$1" "$secs" "$threads" "$dir/count" <<'EOF'
import os, sys, threading, time
sys.path.insert(0, os.path.join("tests", "python"))
import remoting
address, secs, threads, count_file = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
UNKNOWN_CODE = 9_999
host, port = address.rsplit(":", 1)
latencies, failures = [], []
def client():
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        began = time.perf_counter()
        try:
            with remoting.RemotingClient(host, int(port), timeout_s=10) as conn:
                conn.call(UNKNOWN_CODE)
            latencies.append(time.perf_counter() - began)
        except (OSError, remoting.ConnectionClosed) as error:
            failures.append(repr(error))
workers = [threading.Thread(target=client) for _ in range(threads)]
for worker in workers: worker.start()
for worker in workers: worker.join()
latencies.sort()
open(count_file, "w").write(str(len(latencies) + len(failures)))
at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
print("{:6.0f} conn/s  p50 {:5.2f} ms  p99 {:5.2f} ms  max {:6.1f} ms  failed {}{}".format(
    len(latencies) / secs, at(0.5), at(0.99), latencies[-1] * 1000, len(failures),
    "  first: " + failures[0] if failures else ""))
EOF
}

for round in $(seq 1 "$rounds"); do
    number=0
    for binary in "$@"; do
        number=$((number + 1))
        rm -rf "$dir/data"
        "$binary" serve --shards 2 --no-pin --data-dir "$dir/data" --namesrv-port $ns_port \
            --broker-port $broker_port --segment-size-mib 64 > "$dir/node.log" 2>&1 &
        pid=$!
        wait_ready "$dir/node.log" "$pid" 20
        printf 'round %d binary %d: ' "$round" "$number"
        ticks=$(node_ticks)
        churn 127.0.0.1:$broker_port | tr -d '\n'
        ticks=$(( $(node_ticks) - ticks ))
        awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v n="$(cat "$dir/count")" \
            'BEGIN { printf "  node CPU %.1f us a connection\n", t / hz * 1e6 / n }'
        kill $pid; wait $pid 2>/dev/null; pid=""
    done
done

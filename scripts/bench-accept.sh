#!/usr/bin/env bash
# Connection churn: for each round, each shardmq BINARY in turn serves a fresh two-shard node
# (unpinned) while THREADS client threads each connect to the broker port, send one request
# (an unknown code: the cheapest answer), read the answer and close, for SECS seconds. Prints
# connections a second and the connect-to-answer p50 / p99 / max per binary and round, so
# a change to how connections are accepted is compared side by side.
#   [ROUNDS=2] [SECS=10] [THREADS=8] scripts/bench-accept.sh BINARY...
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,7p' "$0"; exit 2; }
rounds=${ROUNDS:-2}
secs=${SECS:-10}
threads=${THREADS:-8}
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-accept.XXXXXX")
pid=""
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
# Below the ephemeral range (32768-60999), as in bench-connections.sh.
ns_port=27976
broker_port=27996

churn() {
    python3 - "$1" "$secs" "$threads" <<'EOF'
import os, socket, statistics, sys, threading, time
sys.path.insert(0, os.path.join("tests", "python"))
import remoting
address, secs, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
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
at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000
print("{:8.0f} conn/s  p50 {:6.2f} ms  p99 {:6.2f} ms  max {:7.1f} ms  failed {}{}".format(
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
        for _ in $(seq 1 200); do grep -q "shardmq: ready" "$dir/node.log" && break; sleep 0.1; done
        grep -q "shardmq: ready" "$dir/node.log" || { echo "not ready"; cat "$dir/node.log"; exit 1; }
        printf 'round %d binary %d: ' "$round" "$number"
        churn 127.0.0.1:$broker_port
        kill $pid; wait $pid 2>/dev/null; pid=""
    done
done

# Sourced by the bench scripts: what they share to run a node.

# wait_ready LOG PID [SECONDS]: returns once LOG holds the node's ready line. Exits the script
# with LOG's last lines if process PID ends first, or if SECONDS (120) pass without it: a
# node that cannot start must not leave a bench waiting for ever.
wait_ready() {
    local log=$1 pid=$2 limit=${3:-120} waited=0
    until grep -q "shardmq: ready" "$log" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "the node exited before it was ready; the end of $log:" >&2
            tail -n 5 "$log" >&2
            exit 1
        fi
        if [ "$waited" -ge $((limit * 20)) ]; then
            echo "the node was not ready in $limit s; the end of $log:" >&2
            tail -n 5 "$log" >&2
            exit 1
        fi
        sleep 0.05
        waited=$((waited + 1))
    done
}

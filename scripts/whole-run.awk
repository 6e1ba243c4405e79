# The bench's summary of a whole producer run, as one line shaped like its per-second
# "Send TPS" lines (which the bench scripts used to take the last of: one second's figures):
#   shardmq-bench producer ... 2>&1 | awk -f scripts/whole-run.awk
# Send TPS: msgs/s of the run | Max RT(ms) | Average RT(ms) | Send Failed | Response Failed |
# p50 p99 p99.9 p99.99 (us), all of the run. Prints nothing when the run printed no summary.
/^Sent: / {
    for (i = 1; i < NF; i++) {
        if ($i == "Failed:" && $(i - 1) == "Send") send_failed = $(i + 1)
        if ($i == "Failed:" && $(i - 1) == "Response") response_failed = $(i + 1)
    }
}
/^Elapsed: / {
    for (i = 1; i < NF; i++) if ($i == "Throughput:") tps = $(i + 1)
}
/^Send latency \(us\): / {
    for (i = 1; i < NF; i++) {
        if ($i == "p50") p50 = $(i + 1)
        if ($i == "p99") p99 = $(i + 1)
        if ($i == "p99.9") p999 = $(i + 1)
        if ($i == "p99.99") p9999 = $(i + 1)
        if ($i == "max") max = $(i + 1)
        if ($i == "mean") mean = $(i + 1)
    }
    seen = 1
}
END {
    if (seen && tps != "")
        printf "Send TPS: %s | Max RT(ms): %.3f | Average RT(ms): %.3f | Send Failed: %s | " \
            "Response Failed: %s | p50 p99 p99.9 p99.99 (us): %s %s %s %s\n", tps, max / 1000,
            mean / 1000, send_failed, response_failed, p50, p99, p999, p9999
}

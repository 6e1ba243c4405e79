#!/usr/bin/env python3
"""Cost of creating subscription groups or topics one after the other (what `mqadmin
updateSubGroup` / `updateTopic` send in a loop), and what it does to another client of the
same shard (issue 17).

    scripts/bench-config-tables.py BROKER_ADDR COUNT [groups|topics]

One connection sends UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) or UPDATE_AND_CREATE_TOPIC (17,
8 queues) for COUNT new names, each waiting for its answer; a second connection sends
GET_MAX_OFFSET (30) every 2 ms meanwhile. Prints, per 1,000 created, the time per creation and
the probe's p50/p99."""

import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import remoting  # noqa: E402

address, count = sys.argv[1], int(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "groups"
stop = False
latencies = []


def probe():
    client = remoting.RemotingClient.connect(address)
    while not stop:
        started = time.perf_counter()
        client.call(30, {"topic": "TBW102", "queueId": "0"})
        latencies.append((time.perf_counter() - started) * 1000)
        time.sleep(0.002)


thread = threading.Thread(target=probe, daemon=True)
thread.start()
time.sleep(0.5)
print("idle probe p50 {:.2f} ms".format(statistics.median(latencies)))
latencies.clear()
client = remoting.RemotingClient.connect(address)
run = int(time.time())
started = time.perf_counter()
for i in range(count):
    name = "B{}_{}".format(run, i)
    if kind == "groups":
        response = client.call(200, {}, body=json.dumps({"groupName": name}).encode())
    else:
        response = client.call(17, {
            "topic": name, "defaultTopic": "TBW102", "readQueueNums": "8",
            "writeQueueNums": "8", "perm": "6", "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0", "order": "false"})
    assert response.code == 0, response
    if (i + 1) % 1000 == 0:
        now = time.perf_counter()
        probes = sorted(latencies)
        latencies.clear()
        print("{} {:>6}..{:>6}: {:.2f} ms each, probe p50 {:.2f} ms p99 {:.2f} ms".format(
            kind, i - 998, i + 1, now - started, probes[len(probes) // 2],
            probes[int(len(probes) * 0.99)]), flush=True)
        started = now
stop = True

#!/usr/bin/env python3
"""Slow consumers that close (issue 17): CONNS connections each send PULLS pulls of 32 and
never read their answers; 3 s later they close with RST. Meanwhile a probe sends GET_MAX_OFFSET
every 2 ms to the same shard and the broker's RSS is sampled every 50 ms. Prints the RSS before,
with the slow consumers, its peak after the close and 5 s later, and the probe's latency before
and after the close.

    scripts/bench-slow-consumers.py BROKER_ADDR BROKER_PID TOPIC CONNS PULLS

The topic must hold messages in queues 0..7 (e.g. `shardmq-bench producer --topic Slow --queues 8
--messages 400000 --batch 32`)."""
import json, os, socket, struct, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import remoting
addr, pid, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
conns, pulls = int(sys.argv[4]), int(sys.argv[5])
host, port = addr.split(":")
def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) / 1024
stop = False; samples = []; rss = []
def probe():
    c = remoting.RemotingClient.connect(addr)
    while not stop:
        t = time.perf_counter(); c.call(30, {"topic": topic, "queueId": "0"})
        samples.append((time.perf_counter(), (time.perf_counter() - t) * 1000)); time.sleep(0.002)
def watch():
    while not stop: rss.append((time.perf_counter(), rss_mb())); time.sleep(0.05)
threading.Thread(target=probe, daemon=True).start(); threading.Thread(target=watch, daemon=True).start()
time.sleep(0.5)
print(f"RSS before {rss_mb():.0f} MB")
socks = []
for i in range(conns):
    s = socket.create_connection((host, int(port))); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    frames = b"".join(remoting.encode_request(11, i * pulls + j + 1, remoting.pull_message_ext(f"slow{i}", topic, j % 8, queue_offset=(j // 8) * 32, max_msg_nums=32)) for j in range(pulls))
    s.setblocking(False)
    sent = 0
    deadline = time.time() + 5
    while sent < len(frames) and time.time() < deadline:
        try: sent += s.send(frames[sent:])
        except BlockingIOError: time.sleep(0.01)
    socks.append(s)
    print(f"conn {i}: sent {sent}/{len(frames)} bytes of {pulls} pulls")
time.sleep(3)
t_close = time.perf_counter()
print(f"RSS with {conns} slow consumers: {rss_mb():.0f} MB")
for s in socks:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close()
time.sleep(5); stop = True; time.sleep(0.1)
before = sorted(ms for t, ms in samples if t < t_close and t > t_close - 2)
after = sorted(ms for t, ms in samples if t >= t_close)
peak = max(m for t, m in rss if t >= t_close - 3.5)
def pct(xs, p): return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float('nan')
print(f"probe before close: n={len(before)} p50 {pct(before,.5):.2f} p99 {pct(before,.99):.2f} max {max(before):.2f} ms")
print(f"probe after close (5 s): n={len(after)} p50 {pct(after,.5):.2f} p99 {pct(after,.99):.2f} max {max(after):.2f} ms")
slow = [ (t - t_close, ms) for t, ms in samples if t >= t_close and ms > 20]
print(f"probes over 20 ms after close: {len(slow)}; first/last at {slow[0][0]:.2f}/{slow[-1][0]:.2f} s" if slow else "no probe over 20 ms after close")
print(f"RSS peak {peak:.0f} MB, at end {rss[-1][1]:.0f} MB")

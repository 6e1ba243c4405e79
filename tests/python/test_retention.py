"""Retention on a small filesystem (real binary, a loop-mounted ext4 made here, the real C++
client): a producer writes five times the filesystem's size while segments past
fileReservedTime are deleted behind it; disk use stays under the warning ratio and no send is
refused; a consumer that kept up receives everything; a consumer group that fell behind is
moved to each queue's minimum by the C++ client's own handling of PULL_OFFSET_MOVED and
receives everything from there, nothing twice. Below diskMaxUsedSpaceRatio the expired
segments' files are recycled as later segments, and the node is killed (kill -9) before the
laggard comes back: it recovers over their old records. Last, recycling is turned off
(segmentRecycleEnable=false): the next start makes the recycled files plain again, and what
is written after survives another kill -9.
"""

import os
import threading
import time

import pytest
import remoting
from mq import Collector, make_consumer, unique, wait_for_keys, wait_until
from smallfs import KEEP_ALL_ARGS, RETENTION_ARGS, small_filesystem

FS_MIB = 512
SEGMENT_MIB = 64
BODY_BYTES = 64 * 1024
QUEUES = 2
SHARDS = 1  # each shard holds an active and a preallocated segment: 128 MiB of 512
WRITE_FACTOR = 5  # bytes written / filesystem size
LAGGARD_MESSAGES = 200
LEAD_MAX = 100  # messages the producer may be ahead of the consumer that keeps up
# The write rate is held here: what the disk must hold is the two live segments plus what
# arrives within fileReservedTime and one cleanResourceInterval (~2 s), so an unpaced producer
# on a fast machine (160 MB/s) came within 0.3% of the warning ratio. At 96 MiB/s that is
# ~200 MiB of 512 on top of the live segments.
RATE_BYTES_PER_S = 96 << 20
WARNING_RATIO = 0.90
CONSUME_TIMEOUT_S = 180


def used_ratio(path):
    """df's Use%, as the broker computes it."""
    stat = os.statvfs(path)
    used = stat.f_blocks - stat.f_bfree
    return used / float(used + stat.f_bavail)


class DiskWatch(threading.Thread):
    """Samples the filesystem's used ratio every 50 ms; keeps the highest."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.highest = 0.0
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            self.highest = max(self.highest, used_ratio(self.path))
            time.sleep(0.05)


def properties(key):
    return "KEYS\x01{k}\x02TAGS\x01TagA\x02test_key\x01{k}\x02".format(k=key)


def body_of(key):
    return (key.encode() + b" ") * (BODY_BYTES // (len(key) + 1))


def min_offset(address, topic, queue_id):
    with remoting.RemotingClient.connect(address) as client:
        response = client.call(remoting.GET_MIN_OFFSET, {"topic": topic, "queueId": queue_id})
    assert response.code == remoting.SUCCESS, response
    return int(response.ext["offset"])


class Producer:
    """Raw sends over every shard and queue in turn; remembers where each key went."""

    def __init__(self, node, topic, run):
        self.clients = [remoting.RemotingClient.connect(a) for a in node.broker_addrs]
        self.topic = topic
        self.run = run
        self.placed = {}  # key -> (shard, queue id, queue offset)
        self.sent = 0
        self.refused = []

    def send(self):
        key = "ret-{}-{:07d}".format(self.run, self.sent)
        shard = self.sent % len(self.clients)
        queue_id = (self.sent // len(self.clients)) % QUEUES
        # SYSTEM_BUSY (a stalled shard) is retried; anything else (a full disk: 14) is a
        # refusal.
        response = remoting.call_retrying_busy(
            self.clients[shard], remoting.SEND_MESSAGE,
            remoting.send_message_ext(self.topic, queue_id, properties(key)),
            body=body_of(key), timeout_s=30)
        self.sent += 1
        if response.code != remoting.SUCCESS:
            self.refused.append(response)
            return
        self.placed[key] = (shard, int(response.ext["queueId"]), int(response.ext["queueOffset"]))

    def close(self):
        for client in self.clients:
            client.close()


def pulled_body(address, topic, queue_id, offset):
    """The body of the message at (topic, queue, offset) on one endpoint (a raw pull)."""
    with remoting.RemotingClient.connect(address) as client:
        response = remoting.call_retrying_busy(
            client, remoting.PULL_MESSAGE,
            remoting.pull_message_ext(unique("cg_check"), topic, queue_id, offset,
                                      max_msg_nums=1))
    assert response.code == remoting.SUCCESS, (topic, queue_id, offset, response)
    records = list(remoting.stored_records(response.body))
    assert records and records[0][0] == offset, (offset, [r[0] for r in records])
    return records[0][1]


def wait_registered(node, group):
    for address in node.broker_addrs:
        wait_until(lambda: remoting.consumer_ids(address, group), 45, interval_s=0.2,
                   message="{} to register on {}".format(group, address))


def committed_total(node, group, topic):
    total = 0
    for address in node.broker_addrs:
        for queue_id in range(QUEUES):
            total += remoting.query_consumer_offset(address, group, topic, queue_id) or 0
    return total


def logged_retention(node):
    """(segments deleted, of them recycled) as the node's log tells, over all its starts."""
    with open(node.log_path) as log:
        text = log.read()
    return (text.count("retention deleted commitlog segment"),
            text.count("its file recycled as segment"))


@pytest.mark.long
def test_retention_keeps_the_disk_bounded_and_moves_laggards_to_the_minimum(shardmq_factory):
    with small_filesystem(FS_MIB) as mount_point:
        data_dir = os.path.join(mount_point, "data")
        node = shardmq_factory(data_dir=data_dir, segment_size_mib=SEGMENT_MIB, shards=SHARDS,
                               extra_args=RETENTION_ARGS)
        keeper = laggard = None
        producer = None
        watch = DiskWatch(mount_point)
        try:
            topic = unique("Tret")
            assert remoting.create_topic(node.broker_addr(0), topic, QUEUES).code == 0
            run = unique("r")
            keeper_seen = Collector("kept up")
            laggard_seen = Collector("laggard")
            keeper_group, laggard_group = unique("cg_keep"), unique("cg_lag")
            keeper = make_consumer(node.namesrv_addr, topic, keeper_seen, group=keeper_group)
            laggard = make_consumer(node.namesrv_addr, topic, laggard_seen, group=laggard_group)
            wait_registered(node, keeper_group)
            wait_registered(node, laggard_group)

            # The laggard reads the first messages, commits, and goes away.
            producer = Producer(node, topic, run)
            while producer.sent < LAGGARD_MESSAGES:
                producer.send()
            first = list(producer.placed)
            wait_for_keys([laggard_seen], first, 60, label="first messages (laggard)")
            wait_until(lambda: committed_total(node, laggard_group, topic) >= len(first), 30,
                       interval_s=0.5, message="the laggard to commit its offsets")
            laggard.shutdown()
            laggard = None

            # Five times the filesystem, never far ahead of the consumer that keeps up.
            watch.start()
            total = WRITE_FACTOR * (FS_MIB << 20) // BODY_BYTES
            started = time.monotonic()
            while producer.sent < total and not producer.refused:
                while len(producer.placed) - keeper_seen.count_distinct() > LEAD_MAX:
                    time.sleep(0.002)
                due = started + (producer.sent - LAGGARD_MESSAGES) * BODY_BYTES / RATE_BYTES_PER_S
                ahead = due - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                producer.send()
            elapsed = time.monotonic() - started
            wait_for_keys([keeper_seen], producer.placed, CONSUME_TIMEOUT_S,
                          label="messages (consumer that kept up)")
            watch.stopping.set()
            watch.join()
            written_mib = (producer.sent * BODY_BYTES) >> 20
            print("wrote {} MiB ({:.1f}x the filesystem) in {:.1f} s; disk at most {:.1%} used"
                  .format(written_mib, written_mib / FS_MIB, elapsed, watch.highest))
            if remoting.busy_retries:
                print("{} SYSTEM_BUSY answers retried; first: {}".format(
                    len(remoting.busy_retries), remoting.busy_retries[0]))
            assert not producer.refused, "sends refused: {!r}".format(producer.refused[:3])
            assert watch.highest < WARNING_RATIO, "disk reached {:.1%}".format(watch.highest)
            snapshot = keeper_seen.snapshot()
            twice = sorted(k for k, got in snapshot.items() if len(got) > 1)
            assert not twice, "the consumer that kept up got {} twice, e.g. {}".format(
                len(twice), twice[:5])
            assert not keeper_seen.errors, keeper_seen.errors[:3]
            for key, got in snapshot.items():
                assert got[0].body == body_of(key), key

            placed = producer.placed
            producer.close()
            producer = None
            # With the sends stopped, retention still takes what expires behind the segment
            # being written: wait until it has settled (the node's counters and its log agree,
            # and stay so past a retention pass), then nothing more is deleted and the
            # minimums stay where retention left them.
            seen = []

            def settled():
                status = remoting.runtime_info(node.broker_addr(0))
                counts = (int(status["retentionDeletedSegments"]),
                          int(status["retentionRecycledSegments"]))
                seen.append(counts)
                return counts == logged_retention(node) and seen[-2:] == [counts, counts]

            wait_until(settled, 60, interval_s=2.0, message="retention to settle")
            status_counts = seen[-1]
            node.extra_args = KEEP_ALL_ARGS
            # kill -9: recovery meets the recycled files' old records past the log's end.
            node.kill9()
            node.start(keep_ports=True, allow_port_change=True)
            # Below diskMaxUsedSpaceRatio an expired segment's file becomes a later segment
            # (recycled: its records then carry a seal); the consumer above read through them.
            deletions, recycled = logged_retention(node)
            minimums = {}
            for shard, address in enumerate(node.broker_addrs):
                for queue_id in range(QUEUES):
                    minimums[(shard, queue_id)] = min_offset(address, topic, queue_id)
            print("{} segments deleted ({} of them recycled); queue minimums {}".format(
                deletions, recycled, minimums))
            assert deletions >= 10, "only {} segments deleted".format(deletions)
            assert recycled >= 1, "no segment was recycled"
            assert status_counts == (deletions, recycled), (
                "brokerStatus says {} deleted, {} recycled".format(*status_counts))
            assert all(m > 0 for m in minimums.values()), minimums
            committed = {}
            for shard, address in enumerate(node.broker_addrs):
                for queue_id in range(QUEUES):
                    committed[(shard, queue_id)] = remoting.query_consumer_offset(
                        address, laggard_group, topic, queue_id) or 0
            assert any(committed[q] < minimums[q] for q in minimums), (
                "the laggard was not behind any minimum: {} vs {}".format(committed, minimums))

            # The laggard comes back: it gets PULL_OFFSET_MOVED below the minimum, its client
            # moves there, and it receives exactly what is still held past its position.
            expected = sorted(
                key for key, (shard, queue_id, offset) in placed.items()
                if offset >= max(minimums[(shard, queue_id)], committed[(shard, queue_id)]))
            back_seen = Collector("laggard again")
            laggard = make_consumer(node.namesrv_addr, topic, back_seen, group=laggard_group)
            wait_for_keys([back_seen], expected, CONSUME_TIMEOUT_S,
                          label="messages past the minimum (laggard)")
            time.sleep(2)  # nothing else may trail in
            got = back_seen.snapshot()
            unexpected = sorted(set(got) - set(expected))
            assert not unexpected, "{} messages below the minimum or already consumed, e.g. " \
                "{}".format(len(unexpected), unexpected[:5])
            twice = sorted(k for k, items in got.items() if len(items) > 1)
            assert not twice, "the laggard got {} twice, e.g. {}".format(len(twice), twice[:5])
            print("the laggard received the {} messages past the minimums".format(len(expected)))
            laggard.shutdown()
            laggard = None

            # Recycling turned off (segmentRecycleEnable=false): the start makes the recycled
            # files plain again, and what is written since (unsealed) survives a kill -9.
            commitlog = os.path.join(data_dir, "shard-0", "commitlog")

            def recycled_names():
                return sorted(n for n in os.listdir(commitlog) if n.endswith(".recycled"))

            before = recycled_names()
            node.stop()
            node.extra_args = KEEP_ALL_ARGS + ["--segment-recycle-enable", "false"]
            log_from = os.path.getsize(node.log_path)
            node.start(keep_ports=True, allow_port_change=True)
            assert not recycled_names(), recycled_names()
            with open(node.log_path) as log:
                log.seek(log_from)
                made_plain = "recycled commitlog files made plain again" in log.read()
            print("recycling off: {} recycled file(s) made plain at start".format(len(before)))
            assert made_plain == bool(before), (before, made_plain)
            producer = Producer(node, topic, unique("r"))
            while producer.sent < LAGGARD_MESSAGES:
                producer.send()
            assert not producer.refused, "sends refused: {!r}".format(producer.refused[:3])
            written = producer.placed
            producer.close()
            producer = None
            # ASYNC_FLUSH writes what it took within flushIntervalCommitLog (200 ms): a kill -9
            # before then would lose the last sends whatever the files.
            time.sleep(1)
            node.kill9()
            node.start(keep_ports=True, allow_port_change=True)
            assert not recycled_names(), recycled_names()
            for key, (shard, queue_id, offset) in sorted(written.items()):
                assert pulled_body(node.broker_addrs[shard], topic, queue_id, offset) == \
                    body_of(key), key
            print("the {} messages sent with recycling off are all there after a kill -9"
                  .format(len(written)))
        finally:
            watch.stopping.set()
            if producer is not None:
                producer.close()
            for consumer in (keeper, laggard):
                if consumer is not None:
                    consumer.shutdown()
            if node.is_running():
                node.stop()

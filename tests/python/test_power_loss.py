"""Power cuts under SYNC_FLUSH (real binary, a disk that loses what it was not told to keep).

A two-shard node runs on ext4 over a loop device whose file is served by FUSE from this test
(`powercut.py`): every block written since the disk's last flush may come back old or new, at
random, as from a disk with a volatile write cache. Producers send over raw remoting while
retention deletes and recycles 16 MiB segments behind them; six times while they send, the
disk is cut: a copy of it is taken as the power cut would leave it. Each copy is then mounted
(ext4 replays its journal) and a node started on it: every message acknowledged before the
cut at a queue offset the queue still holds (past retention's minimum) is there, whole, and
`shardmq verify` finds no damage after a clean stop. Some of those messages sat in recycled
segments, where the old records past the log's end look like records until their seal is read.
"""

import os
import random
import subprocess
import threading
import time

import remoting
from conftest import _binary
from powercut import mounted_image, power_cut_disk

FS_MIB = 1024
SEGMENT_MIB = 16
SHARDS = 2
QUEUES = 2
BODY_BYTES = 16 * 1024
SENDERS_PER_SHARD = 2
CUTS_AT_S = (8, 11, 14, 17, 20, 23)  # seconds into the sends
SEND_FOR_S = 25
GET_MIN_OFFSET = 31
PULL_BATCH = 32
EVERY_HOUR = ";".join(str(hour) for hour in range(24))
RETENTION_ARGS = [
    "--allocation-window-mib", "64",
    "--fileReservedTime", "0.0002",  # 0.72 s
    "--deleteWhen", EVERY_HOUR,
    "--cleanResourceInterval", "1000",
]
KEEP_ALL_ARGS = ["--allocation-window-mib", "64", "--cleanFileForciblyEnable", "false"]


def properties(key):
    return "KEYS\x01{k}\x02TAGS\x01TagP\x02".format(k=key)


def body_of(key):
    return (key.encode() + b" ") * (BODY_BYTES // (len(key) + 1))


class Sender(threading.Thread):
    """Sends one message at a time over its own connection to one shard, until told to stop;
    `acked` holds (key, queue id, queue offset, commitlog offset) of each SUCCESS."""

    def __init__(self, address, shard, index, topic, run, stopping):
        super().__init__(daemon=True)
        self.client = remoting.RemotingClient.connect(address, timeout_s=30)
        self.shard, self.index, self.topic, self.run_id = shard, index, topic, run
        self.stopping = stopping
        self.acked = []
        self.refused = []
        self.error = None

    def run(self):
        sent = 0
        try:
            while not self.stopping.is_set():
                key = "pc-{}-{}-{}-{:07d}".format(self.run_id, self.shard, self.index, sent)
                queue_id = sent % QUEUES
                response = remoting.call_retrying_busy(
                    self.client, remoting.SEND_MESSAGE,
                    remoting.send_message_ext(self.topic, queue_id, properties(key)),
                    body=body_of(key), timeout_s=30)
                sent += 1
                if response.code != remoting.SUCCESS:
                    self.refused.append(response)
                    continue
                # The offset message id ends with the record's commitlog offset (8 bytes).
                physical = int(response.ext["msgId"][-16:], 16)
                self.acked.append((key, int(response.ext["queueId"]),
                                   int(response.ext["queueOffset"]), physical))
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error
        finally:
            self.client.close()


def queue_bounds(address, topic, queue_id):
    with remoting.RemotingClient.connect(address) as client:
        low = client.call(GET_MIN_OFFSET, {"topic": topic, "queueId": queue_id})
        high = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    assert low.code == remoting.SUCCESS and high.code == remoting.SUCCESS, (low, high)
    return int(low.ext["offset"]), int(high.ext["offset"])


def stored_bodies(address, topic, queue_id, low, high):
    """{queue offset: body} of every record from `low` to `high` of one queue, pulled."""
    bodies = {}
    offset = low
    with remoting.RemotingClient.connect(address, timeout_s=30) as client:
        while offset < high:
            response = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(
                "power_check", topic, queue_id, offset, PULL_BATCH))
            assert response.code == remoting.SUCCESS, (
                "pull at {} of queue {} ({}..{}) answered {!r}".format(
                    offset, queue_id, low, high, response))
            got = list(remoting.stored_records(response.body))
            assert got, "an empty pull at {}".format(offset)
            for queue_offset, body in got:
                bodies[queue_offset] = body
            offset = got[-1][0] + 1
    return bodies


def recycled_segments(data_dir, shard):
    commitlog = os.path.join(data_dir, "shard-{}".format(shard), "commitlog")
    return {int(name.split(".")[0]) for name in os.listdir(commitlog)
            if name.endswith(".recycled")}


def check_cut(shardmq_factory, image, cut, topic):
    """Starts a node on the disk a cut left and finds every message acknowledged before it."""
    checked = in_recycled = expired = 0
    with mounted_image(image) as mount_point:
        data_dir = os.path.join(mount_point, "data")
        recycled = {shard: recycled_segments(data_dir, shard) for shard in range(SHARDS)}
        node = shardmq_factory(data_dir=data_dir, segment_size_mib=SEGMENT_MIB, shards=SHARDS,
                               flush="sync", extra_args=KEEP_ALL_ARGS)
        try:
            for shard, address in enumerate(node.broker_addrs):
                acked = [a for a in cut["acked"] if a[0].split("-")[2] == str(shard)]
                for queue_id in range(QUEUES):
                    ours = [a for a in acked if a[1] == queue_id]
                    low, high = queue_bounds(address, topic, queue_id)
                    wanted = [a for a in ours if a[2] >= low]
                    expired += len(ours) - len(wanted)
                    newest = max((a[2] for a in ours), default=-1)
                    assert newest < high, (
                        "shard {} queue {}: acknowledged offset {} but the queue ends at {} "
                        "after {}".format(shard, queue_id, newest, high, cut["name"]))
                    bodies = stored_bodies(address, topic, queue_id,
                                           min((a[2] for a in wanted), default=high), high)
                    for key, _, queue_offset, physical in wanted:
                        assert bodies.get(queue_offset) == body_of(key), (
                            "shard {} queue {} offset {}: {} lost or damaged after {} ({})"
                            .format(shard, queue_id, queue_offset, key, cut["name"],
                                    cut["counts"]))
                        checked += 1
                        segment = physical - physical % (SEGMENT_MIB << 20)
                        in_recycled += segment in recycled[shard]
        finally:
            stopped = node.stop()
        assert stopped == 0, node.log_tail()
        verified = subprocess.run([_binary(), "verify", "--data-dir", data_dir],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True)
        assert verified.returncode == 0, "shardmq verify after {}:\n{}".format(
            cut["name"], verified.stdout[-2000:])
    print("{} ({}): {} acknowledged messages found whole, {} of them in recycled segments; "
          "{} below retention's minimum".format(cut["name"], cut["counts"], checked,
                                                in_recycled, expired))
    return checked, in_recycled


def test_every_message_acknowledged_before_a_power_cut_is_there_after_it(shardmq_factory):
    with power_cut_disk(FS_MIB) as disk:
        node = shardmq_factory(data_dir=os.path.join(disk.mount_point, "data"),
                               segment_size_mib=SEGMENT_MIB, shards=SHARDS, flush="sync",
                               extra_args=RETENTION_ARGS)
        topic = "Tpower"
        assert remoting.create_topic(node.broker_addr(0), topic, QUEUES).code == 0
        run = "r{}".format(random.randrange(1 << 30))
        stopping = threading.Event()
        senders = [Sender(address, shard, index, topic, run, stopping)
                   for shard, address in enumerate(node.broker_addrs)
                   for index in range(SENDERS_PER_SHARD)]
        cuts = []
        started = time.monotonic()
        for sender in senders:
            sender.start()
        try:
            for number, at in enumerate(CUTS_AT_S, 1):
                time.sleep(max(0.0, started + at - time.monotonic()))
                # Everything acknowledged so far, then the cut: each of these was on the disk
                # (flushed) before its answer left the broker.
                acked = [a for sender in senders for a in list(sender.acked)]
                image = os.path.join(disk.workdir, "cut{}.img".format(number))
                counts = disk.cut(image, seed=number)
                cuts.append(dict(name="cut {} at {} s".format(number, at), image=image,
                                 acked=acked, counts=counts))
            time.sleep(max(0.0, started + SEND_FOR_S - time.monotonic()))
        finally:
            stopping.set()
            for sender in senders:
                sender.join(60)
            if any(sender.is_alive() for sender in senders):
                node.kill9()  # the disk is unmounted next: nothing may hold it
        for sender in senders:
            assert sender.error is None, repr(sender.error)
            assert not sender.refused, sender.refused[:3]
        with open(node.log_path) as log:
            text = log.read()
        print("{} messages acknowledged; {} segments deleted, {} of them recycled".format(
            sum(len(s.acked) for s in senders),
            text.count("retention deleted commitlog segment"),
            text.count("its file recycled as segment")))
        assert node.stop() == 0, node.log_tail()

        total_checked = total_in_recycled = 0
        for cut in cuts:
            checked, in_recycled = check_cut(shardmq_factory, cut["image"], cut, topic)
            os.remove(cut["image"])
            total_checked += checked
            total_in_recycled += in_recycled
        assert total_checked > 1000, "only {} messages checked".format(total_checked)
        assert total_in_recycled > 0, "no acknowledged message sat in a recycled segment"

"""Power cuts (real binary, a disk that loses what it was not told to keep).

A two-shard node runs on ext4 over a loop device whose file is served by FUSE from this test
(`powercut.py`): every block written since the disk's last flush may come back old or new, at
random, as from a disk with a volatile write cache. Producers send over raw remoting, to one
topic with large bodies and to small topics with small ones (a new topic every 40 sends,
auto-created by the send), while retention deletes
and recycles 16 MiB segments behind them; several times while they send, the disk is cut: a
copy of it is taken as the power cut would leave it (the last one once a recycled segment
holds records). Each copy is then mounted (ext4 replays its journal), its light checkpoints
marked as of an earlier boot (a power loss restarts the machine), and a node started on it.
Every record it holds, from each queue's minimum to its end, is the one the node that went on
placed at that offset, whole; `shardmq verify` finds no damage after a clean stop. Under
SYNC_FLUSH every message acknowledged before the cut is among them (unless retention took it
before the cut), also when the power goes again, twice, while a node starts on what the last
cut left; under ASYNC_FLUSH the last ones may be lost, and the test says how many were. Some
of the records sat in recycled segments, where the old records past the log's end look like
records until their seal is read.
"""

import os
import random
import subprocess
import threading
import time

import pytest
import remoting
from conftest import _binary
from powercut import forget_light_checkpoints, mounted_image, power_cut_disk
from smallfs import KEEP_ALL_ARGS, RETENTION_ARGS

FS_MIB = 1024
SEGMENT_MIB = 16
SHARDS = 2
# Every other send goes to the big topic's queues with a large body (it fills the segments
# retention recycles); the others go to small topics, a new one every SENDS_PER_SMALL_TOPIC,
# auto-created by that first send (topics, queue files and catalogs made while the disk is
# cut). The big topic is created by UPDATE_AND_CREATE_TOPIC first.
BIG_TOPIC, BIG_QUEUES, BIG_BODY_BYTES = "Tpower", 2, 16 * 1024
SMALL_QUEUES, SMALL_BODY_BYTES, SENDS_PER_SMALL_TOPIC = 4, 1024, 40
SENDERS_PER_SHARD = 2
SYNC_CUTS_AT_S = (9, 14, 19)  # seconds into the sends
ASYNC_CUTS_AT_S = (12, 19)
SEND_FOR_S = 20
# After the last SYNC_FLUSH cut the power comes back and goes again while the node starts
# on what it left: cuts this long after one another from the start.
AGAIN_CUTS_AFTER_S = (0.2, 0.4)
# The last cut also waits (at most this long past its time) until a recycled segment holds
# this many bytes of acknowledged records on some shard: how soon retention recycles depends
# on how fast the senders go, which depends on what else the machine is running.
RECYCLED_WAIT_MAX_S = 60
RECYCLED_WRITTEN_BYTES = 1 << 20
PULL_BATCH = 32


def properties(key):
    return "KEYS\x01{k}\x02TAGS\x01TagP\x02".format(k=key)


def body_of(key, size):
    return (key.encode() + b" ") * (size // (len(key) + 1))


class Sender(threading.Thread):
    """Sends one message at a time over its own connection to one shard, until told to stop;
    `acked` holds (key, topic, queue id, queue offset, commitlog offset) of each SUCCESS."""

    def __init__(self, address, shard, index, run, stopping):
        super().__init__(daemon=True)
        self.client = remoting.RemotingClient.connect(address, timeout_s=30)
        self.shard, self.index, self.run_id = shard, index, run
        self.stopping = stopping
        self.acked = []
        self.refused = []
        self.error = None

    def run(self):
        sent = 0
        try:
            while not self.stopping.is_set():
                key = "pc-{}-{}-{}-{:07d}".format(self.run_id, self.shard, self.index, sent)
                turn = sent // 2
                if sent % 2 == 0:
                    topic, queue_id, size = BIG_TOPIC, turn % BIG_QUEUES, BIG_BODY_BYTES
                else:
                    topic = "Tpower{}{}-{:04d}".format(
                        self.shard, self.index, turn // SENDS_PER_SMALL_TOPIC)
                    queue_id = turn % SMALL_QUEUES
                    size = SMALL_BODY_BYTES
                response = remoting.call_retrying_busy(
                    self.client, remoting.SEND_MESSAGE,
                    remoting.send_message_ext(topic, queue_id, properties(key)),
                    body=body_of(key, size), timeout_s=30)
                sent += 1
                if response.code != remoting.SUCCESS:
                    self.refused.append(response)
                    continue
                # The offset message id ends with the record's commitlog offset (8 bytes).
                physical = int(response.ext["msgId"][-16:], 16)
                self.acked.append((key, topic, int(response.ext["queueId"]),
                                   int(response.ext["queueOffset"]), physical))
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error
        finally:
            self.client.close()


def queue_bounds(client, topic, queue_id):
    low = client.call(remoting.GET_MIN_OFFSET, {"topic": topic, "queueId": queue_id})
    high = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    assert low.code == remoting.SUCCESS and high.code == remoting.SUCCESS, (low, high)
    return int(low.ext["offset"]), int(high.ext["offset"])


def stored_bodies(client, topic, queue_id, low, high):
    """{queue offset: body} of every record from `low` to `high` of one queue, pulled; None
    when the node has no such topic."""
    bodies = {}
    offset = low
    while offset < high:
        response = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(
            "power_check", topic, queue_id, offset, PULL_BATCH))
        if response.code == remoting.TOPIC_NOT_EXIST and offset == low:
            return None
        assert response.code == remoting.SUCCESS, (
            "pull at {} of {} queue {} ({}..{}) answered {!r}".format(
                offset, topic, queue_id, low, high, response))
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


def records_in_recycled(data_dir, senders):
    """Whether some shard has acknowledged records RECYCLED_WRITTEN_BYTES or more into one of
    its recycled segments (the live data directory's, as the senders' answers place them)."""
    for shard in range(SHARDS):
        written = max((sender.acked[-1][4] for sender in senders
                       if sender.shard == shard and sender.acked), default=-1)
        if any(base + RECYCLED_WRITTEN_BYTES <= written
               for base in recycled_segments(data_dir, shard)):
            return True
    return False


def placed_by_queue(senders_acked):
    """{(shard, topic, queue id): {queue offset: (key, commitlog offset)}} of acknowledged
    sends, from [(shard, acked)]."""
    placed = {}
    for shard, acked in senders_acked:
        for key, topic, queue_id, queue_offset, physical in acked:
            placed.setdefault((shard, topic, queue_id), {})[queue_offset] = (key, physical)
    return placed


def check_cut(shardmq_factory, image, cut, final, flush):
    """Starts a node on the disk a cut left. Every record it holds is the one the node that
    went on placed at that queue offset (`final`), and under SYNC_FLUSH every message
    acknowledged before the cut is among them, unless retention took it before the cut."""
    before = placed_by_queue(cut["acked"])
    found = in_recycled = expired = lost = untopiced = 0
    with mounted_image(image) as mount_point:
        data_dir = os.path.join(mount_point, "data")
        recycled = {shard: recycled_segments(data_dir, shard) for shard in range(SHARDS)}
        forgotten = forget_light_checkpoints(data_dir)
        node = shardmq_factory(data_dir=data_dir, segment_size_mib=SEGMENT_MIB, shards=SHARDS,
                               flush=flush, extra_args=KEEP_ALL_ARGS)
        clients = [remoting.RemotingClient.connect(address, timeout_s=30)
                   for address in node.broker_addrs]
        try:
            for (shard, topic, queue_id), placed in sorted(final.items()):
                where = "shard {} {} queue {}".format(shard, topic, queue_id)
                low, high = queue_bounds(clients[shard], topic, queue_id)
                acked = before.get((shard, topic, queue_id), {})
                expired += sum(1 for offset in acked if offset < low)
                newest = max(acked, default=-1)
                if flush == "sync":
                    assert newest < high, "{}: acknowledged offset {} but the queue ends at " \
                        "{} after {} ({})".format(where, newest, high, cut["name"],
                                                  cut["counts"])
                else:
                    lost += sum(1 for offset in acked if offset >= max(low, high))
                bodies = stored_bodies(clients[shard], topic, queue_id, low, high)
                if bodies is None:
                    # A topic auto-created by a send the cut came before the answer to: its
                    # records may be back without its config, but no send to it was answered
                    # (a send that creates a topic is answered once its config is on disk).
                    answered = [q for q in before if q[:2] == (shard, topic) and before[q]]
                    assert not answered, "{}: no such topic after {} ({}), though sends to it " \
                        "were acknowledged before".format(where, cut["name"], cut["counts"])
                    untopiced += high - low
                    continue
                size = BIG_BODY_BYTES if topic == BIG_TOPIC else SMALL_BODY_BYTES
                for queue_offset in range(low, high):
                    key, physical = placed.get(queue_offset, (None, None))
                    assert key is not None and bodies.get(queue_offset) == body_of(key, size), (
                        "{} offset {}: not the record placed there ({}) after {} ({})".format(
                            where, queue_offset, key, cut["name"], cut["counts"]))
                    found += 1
                    segment = physical - physical % (SEGMENT_MIB << 20)
                    in_recycled += segment in recycled[shard]
        finally:
            for client in clients:
                client.close()
            stopped = node.stop()
        assert stopped == 0, node.log_tail()
        verified = subprocess.run([_binary(), "verify", "--data-dir", data_dir],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True)
        assert verified.returncode == 0, "shardmq verify after {}:\n{}".format(
            cut["name"], verified.stdout[-2000:])
    print("{} ({}; {} light checkpoints of this boot): {} messages in {} queues found whole, "
          "{} of them in recycled segments; {} of a topic the cut took, never acknowledged; of "
          "those acknowledged before the cut {} below retention's minimum, {} lost".format(
              cut["name"], cut["counts"], forgotten, found, len(final), in_recycled,
              untopiced, expired, lost))
    return found, in_recycled


@pytest.mark.long
def test_every_message_acknowledged_before_a_power_cut_is_there_after_it(shardmq_factory):
    power_cuts(shardmq_factory, "sync", SYNC_CUTS_AT_S, again=True)


@pytest.mark.long
def test_after_a_power_cut_under_async_flush_each_queue_holds_what_was_placed(
        shardmq_factory):
    """ASYNC_FLUSH acknowledges before the disk has the message, and a power cut may take the
    last ones: what comes back must still be, queue by queue, exactly what was placed there,
    with no damage left for `shardmq verify` to find."""
    power_cuts(shardmq_factory, "async", ASYNC_CUTS_AT_S)


def power_cuts(shardmq_factory, flush, cuts_at, again=False):
    with power_cut_disk(FS_MIB) as disk:
        data_dir = os.path.join(disk.mount_point, "data")
        node = shardmq_factory(data_dir=data_dir,
                               segment_size_mib=SEGMENT_MIB, shards=SHARDS, flush=flush,
                               extra_args=RETENTION_ARGS)
        assert remoting.create_topic(node.broker_addr(0), BIG_TOPIC, BIG_QUEUES).code == 0
        run = "r{}".format(random.randrange(1 << 30))
        stopping = threading.Event()
        senders = [Sender(address, shard, index, run, stopping)
                   for shard, address in enumerate(node.broker_addrs)
                   for index in range(SENDERS_PER_SHARD)]
        cuts = []
        started = time.monotonic()
        for sender in senders:
            sender.start()
        try:
            for number, at in enumerate(cuts_at, 1):
                time.sleep(max(0.0, started + at - time.monotonic()))
                if number == len(cuts_at):
                    deadline = started + at + RECYCLED_WAIT_MAX_S
                    while (not records_in_recycled(data_dir, senders)
                           and time.monotonic() < deadline):
                        time.sleep(0.2)
                    at = round(time.monotonic() - started, 1)
                # Everything acknowledged so far, then the cut: under SYNC_FLUSH each of these
                # was on the disk (flushed) before its answer left the broker.
                acked = [(sender.shard, list(sender.acked)) for sender in senders]
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

        final = placed_by_queue([(sender.shard, sender.acked) for sender in senders])
        if again:
            # What the last cut left, for the start that the power goes again under.
            last = dict(cuts[-1], image=os.path.join(disk.workdir, "last-cut.img"))
            copied = subprocess.run(["cp", "--sparse=always", cuts[-1]["image"], last["image"]])
            assert copied.returncode == 0
            cuts += cuts_while_starting(shardmq_factory, last, disk.workdir, flush)
            os.remove(last["image"])
        total_found = total_in_recycled = 0
        for cut in cuts:
            found, in_recycled = check_cut(shardmq_factory, cut["image"], cut, final, flush)
            os.remove(cut["image"])
            total_found += found
            total_in_recycled += in_recycled
        assert total_found > 1000, "only {} messages found".format(total_found)
        assert total_in_recycled > 0, "no message found sat in a recycled segment"


def cuts_while_starting(shardmq_factory, cut, keep_in, flush):
    """The power comes back after `cut` and goes again while a node starts on what it left
    (recovers, settles the queues it took from the synced checkpoint's catalog, writes its
    first checkpoints): the copies those cuts leave, as cuts (kept in `keep_in`)."""
    again = []
    with power_cut_disk(FS_MIB, image=cut["image"]) as disk:
        data_dir = os.path.join(disk.mount_point, "data")
        forget_light_checkpoints(data_dir)

        def cutting():
            for number, after in enumerate(AGAIN_CUTS_AFTER_S, 1):
                time.sleep(after)
                image = os.path.join(keep_in, "again{}.img".format(number))
                counts = disk.cut(image, seed=100 + number)
                again.append(dict(cut, name="{}, then cut {} of the start after it".format(
                    cut["name"], number), image=image, counts=counts))

        cutter = threading.Thread(target=cutting, daemon=True)
        cutter.start()
        node = shardmq_factory(data_dir=data_dir, segment_size_mib=SEGMENT_MIB, shards=SHARDS,
                               flush=flush, extra_args=KEEP_ALL_ARGS)
        cutter.join(180)
        assert not cutter.is_alive(), "the cuts while the node started did not finish"
        assert node.stop() == 0, node.log_tail()
    assert len(again) == len(AGAIN_CUTS_AFTER_S)
    return again

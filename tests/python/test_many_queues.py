"""10,000 queues on one shard (issue 17): created, written, and recovered after kill -9 and
after a clean stop (its queues taken from the stop's catalog) and after a restart of the machine
(its queues taken from the synced checkpoint's catalog) with every acknowledged message
readable at its queue offset; the
consume-queue disk of those near-empty queues stays under 64 KiB a queue.

A kill -9 loses no page cache, so the queue files still hold every unit when the node comes
back. To make recovery rebuild units, the test also plays a power loss after a checkpoint: it
puts back a checkpoint of the first round only and zeroes the later units of every queue
file (pages that never reached the disk); recovery must keep the first round's units and
write the rest again from the commitlog.

The sends and reads go over one pipelined connection (64 in flight) with the raw remoting
client: the point is the broker's store, not a client's routing.
"""

import json
import os
import time

import pytest
import remoting
from mq import wait_until
from powercut import forget_light_checkpoints
from remoting import PULL_MESSAGE, SEND_MESSAGE, SUCCESS, SYSTEM_BUSY

TOPICS = 1_250
QUEUES = 8  # 10,000 queues
IN_FLIGHT = 64
DISK_PER_QUEUE_BOUND_BYTES = 64 * 1024


def topic_name(i):
    return "TmanyQ-{:05d}".format(i)


def every_queue():
    return [(topic_name(t), q) for t in range(TOPICS) for q in range(QUEUES)]


def pipelined(address, requests):
    """Sends every (key, code, ext, body) with IN_FLIGHT outstanding, again after SYSTEM_BUSY;
    returns {key: answer}."""
    answers = {}
    todo = list(reversed(requests))
    pending = {}
    opaque = 0
    with remoting.RemotingClient.connect(address, timeout_s=60) as client:
        while todo or pending:
            while todo and len(pending) < IN_FLIGHT:
                opaque += 1
                key, code, ext, body = request = todo.pop()
                client.send_raw(remoting.encode_request(code, opaque, ext, body))
                pending[opaque] = request
            answer = client.read_frame()
            request = pending.pop(answer.opaque)
            if answer.code == SYSTEM_BUSY:
                todo.append(request)
                continue
            answers[request[0]] = answer
    return answers


def send_round(node, round_no, acked):
    """One message to every queue; keeps (topic, queue) -> {queue offset: body} of SUCCESS.
    Returns the commitlog offsets of the round's messages (from their offset msgIds)."""
    requests = []
    for topic, queue_id in every_queue():
        body = "{}/{}/round-{}".format(topic, queue_id, round_no).encode()
        requests.append(((topic, queue_id, body), SEND_MESSAGE,
                         remoting.send_message_ext(topic, queue_id), body))
    answers = pipelined(node.broker_addr(0), requests)
    failed = [(key, a.code, a.remark) for key, a in answers.items() if a.code != SUCCESS]
    assert not failed, failed[:5]
    for (topic, queue_id, body), answer in answers.items():
        acked.setdefault((topic, queue_id), {})[int(answer.ext["queueOffset"])] = body
    # An offset msgId: the broker's IPv4 address and port, then the commitlog offset (hex).
    return [int(answer.ext["msgId"][16:32], 16) for answer in answers.values()]


def check_readable(node, acked, label):
    """Every acknowledged message is read back from its queue at its offset."""
    requests = [((topic, queue_id), PULL_MESSAGE,
                 remoting.pull_message_ext("cg_manyq", topic, queue_id, 0, 32), b"")
                for topic, queue_id in every_queue()]
    answers = pipelined(node.broker_addr(0), requests)
    wrong = []
    for key, expected in acked.items():
        answer = answers[key]
        held = dict(remoting.stored_records(answer.body)) if answer.code == SUCCESS else {}
        if held != expected:
            wrong.append((key, answer.code, answer.remark, sorted(held), sorted(expected)))
    print("{}: {} queues read, {} with a wrong answer".format(label, len(answers), len(wrong)))
    assert not wrong, wrong[:3]


def consume_queue_disk_bytes(node):
    root = os.path.join(node.data_dir, "shard-0", "consumequeue")
    total = 0
    for directory, subdirs, files in os.walk(root):
        for name in subdirs + files:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def lose_units_after_first_round(node, second_round_offsets):
    """A power loss after the checkpoint that followed the first round: the checkpoint says
    one unit a queue, up to the second round's first record; the second unit of every queue
    file is zeros again. Returns how many units were zeroed."""
    shard = os.path.join(node.data_dir, "shard-0")
    checkpoint = {
        "commitlog_offset": min(second_round_offsets),
        "clean": False,
        "queues": {topic_name(t): {str(q): 1 for q in range(QUEUES)} for t in range(TOPICS)},
    }
    with open(os.path.join(shard, "checkpoint"), "w") as out:
        json.dump(checkpoint, out)
    # A power loss restarts the machine: a light checkpoint (written without a sync of the
    # queue files, trusted only in the boot it names) no longer holds.
    forget_light_checkpoints(node.data_dir)
    zeroed = 0
    for topic, queue_id in every_queue():
        path = os.path.join(shard, "consumequeue", topic, str(queue_id), "0" * 20)
        with open(path, "r+b") as queue_file:
            queue_file.seek(20)
            assert queue_file.read(20) != bytes(20), "unit 1 of {} was never written".format(path)
            queue_file.seek(20)
            queue_file.write(bytes(20))
            zeroed += 1
    return zeroed


def awaiting_mark(node):
    """What the last checkpoint says of new queues that awaited their files."""
    shard = os.path.join(node.data_dir, "shard-0")
    for name in ("checkpoint.light", "checkpoint"):
        try:
            with open(os.path.join(shard, name)) as checkpoint_file:
                checkpoint = json.load(checkpoint_file)
        except FileNotFoundError:
            continue
        if checkpoint.get("awaiting_from") is None:
            return "{}: no queue awaited its files".format(name)
        return "{}: queues awaited their files, units from commitlog offset {}".format(
            name, checkpoint["awaiting_from"])
    return "no checkpoint"


def wait_for_queue_files(node, units, timeout_s=120):
    """Until every queue's first file is on disk holding its first `units` units. The files
    are made off the shard, a batch at a time, and the units the shard held meanwhile are
    written into a file only once its batch is made: a file that exists may still be zeros."""
    shard = os.path.join(node.data_dir, "shard-0", "consumequeue")
    unit_bytes = 20
    deadline = time.monotonic() + timeout_s

    def written(topic, queue_id):
        path = os.path.join(shard, topic, str(queue_id), "0" * 20)
        try:
            with open(path, "rb") as queue_file:
                head = queue_file.read(units * unit_bytes)
        except FileNotFoundError:
            return False
        return len(head) == units * unit_bytes and all(
            head[i:i + unit_bytes] != bytes(unit_bytes)
            for i in range(0, len(head), unit_bytes))

    missing = every_queue()
    while missing:
        missing = [queue for queue in missing if not written(*queue)]
        assert time.monotonic() < deadline, "{} queues without their units in files".format(
            len(missing))
        if missing:
            time.sleep(0.2)


def wait_for_synced_catalog(node, timeout_s=60):
    """Until shard 0's synced checkpoint names a queue catalog; returns how many queues it
    counts."""
    path = os.path.join(node.data_dir, "shard-0", "checkpoint")

    def counted():
        with open(path) as checkpoint_file:
            checkpoint = json.load(checkpoint_file)
        if checkpoint.get("catalog") and not checkpoint["clean"]:
            return sum(len(queues) for queues in checkpoint["queues"].values())
        return None
    return wait_until(counted, timeout_s, interval_s=0.2,
                      message="a synced checkpoint to name a catalog")


def wait_for_log(node, text, timeout_s=120):
    def logged():
        with open(node.log_path) as log:
            return any(text in line for line in log)
    wait_until(logged, timeout_s, interval_s=0.2, message="{!r} in the log".format(text))


def timed_start(node, how):
    started = time.monotonic()
    node.start(keep_ports=True)
    print("restart after {}: ready in {:.2f} s".format(how, time.monotonic() - started))


@pytest.mark.long
def test_ten_thousand_queues_on_one_shard_survive_kill9_and_restart(shardmq_factory):
    node = shardmq_factory(shards=1, flush="sync")
    started = time.monotonic()
    with remoting.RemotingClient.connect(node.broker_addr(0), timeout_s=60) as client:
        for t in range(TOPICS):
            answer = client.call(remoting.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic_name(t), "defaultTopic": "TBW102", "readQueueNums": QUEUES,
                "writeQueueNums": QUEUES, "perm": 6, "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0, "order": "false"})
            assert answer.code == SUCCESS, answer
    print("{} topics x {} queues created in {:.2f} s".format(
        TOPICS, QUEUES, time.monotonic() - started))
    acked = {}
    offsets = []
    for round_no in range(2):
        started = time.monotonic()
        offsets = send_round(node, round_no, acked)
        print("round {}: {} sends in {:.2f} s".format(
            round_no, TOPICS * QUEUES, time.monotonic() - started))
        if round_no == 0:
            # A crash while the new queues' files are being made (off the shard): recovery
            # holds their units in memory and opens without making them. A second crash
            # right after that start rebuilds them again.
            for crash in ("kill -9 after the first sends", "kill -9 right after that start"):
                node.kill9()
                print("{}: {}".format(crash, awaiting_mark(node)))
                timed_start(node, crash)
            check_readable(node, acked, "after two kill -9 while the queues were new")
    per_queue = consume_queue_disk_bytes(node) / (TOPICS * QUEUES)
    print("consume-queue disk: {:.1f} KiB a queue".format(per_queue / 1024))
    assert per_queue < DISK_PER_QUEUE_BOUND_BYTES, per_queue

    # A crash right after the last answer: each queue's units come back, past the checkpoint
    # rebuilt from the commitlog.
    node.kill9()
    timed_start(node, "kill -9")
    check_readable(node, acked, "after kill -9")

    # The same with the second round's units lost to a power loss: rebuilt from the commitlog.
    wait_for_queue_files(node, units=2)
    node.kill9()
    zeroed = lose_units_after_first_round(node, offsets)
    timed_start(node, "a power loss ({} units zeroed)".format(zeroed))
    check_readable(node, acked, "after the lost units")

    # More, then a clean stop: the units below the checkpoint are kept, not written again,
    # and the start takes the queues from the stop's catalog, reading no queue directory.
    send_round(node, 2, acked)
    assert node.stop() == 0
    catalog = os.path.join(node.data_dir, "shard-0", "consumequeue.catalog")
    assert os.path.exists(catalog), "the clean stop wrote no queue catalog"
    timed_start(node, "a clean stop")
    with open(node.log_path) as log:
        opens = [line for line in log if "store open in" in line]
    assert "queues from the catalog" in opens[-1], opens[-1]
    assert not os.path.exists(catalog), "the catalog outlived the start"
    check_readable(node, acked, "after a clean stop")
    send_round(node, 3, acked)
    check_readable(node, acked, "after more sends")
    # A crash after a start from the catalog recovers as any other.
    node.kill9()
    timed_start(node, "kill -9 after a start from the catalog")
    check_readable(node, acked, "after kill -9 after a start from the catalog")

    # A restart of the machine after more sends: the start takes the queues from the synced
    # checkpoint's catalog, reading no queue directory, rebuilds the later units in memory
    # and settles the queues once it serves.
    synced = wait_for_synced_catalog(node)
    send_round(node, 4, acked)
    node.kill9()
    forget_light_checkpoints(node.data_dir)
    timed_start(node, "a restart of the machine ({} queues in the synced catalog)".format(synced))
    with open(node.log_path) as log:
        opens = [line for line in log if "store open in" in line]
    assert "queues from the catalog" in opens[-1], opens[-1]
    check_readable(node, acked, "after a restart of the machine")
    wait_for_log(node, "settled the")
    # What the settling wrote reads back after one more crash, from the directories.
    node.kill9()
    timed_start(node, "kill -9 after the queues were settled")
    check_readable(node, acked, "after kill -9 after the queues were settled")

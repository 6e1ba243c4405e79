"""`shardmq admin` against messages of the real client (PyPI `rocketmq`, C++ core).

Messages sent with keys are found by key and by the msgId the send returned, before and
after a clean restart and after a crash (kill -9) right behind the sends, when the message
index must be rebuilt from the commitlog. A real push consumer's group shows the lag that
was produced and consumed in `consumerProgress`.
"""

import json
import subprocess

from mq import (closing, Collector, create_topic, Expected, make_consumer, make_producer,
                send_one, unique, wait_for_keys, wait_until)
from rocketmq.client import SendStatus

ADMIN_TIMEOUT_S = 60
BATCH_BEFORE_RESTART = 20
BATCH_BEFORE_CRASH = 10
SAMPLE_EVERY = 4  # messages looked up one by one (by key and by id): every fourth
PROGRESS_MESSAGES = 40
PROGRESS_BACKLOG = 7
CONSUME_TIMEOUT_S = 60
COMMIT_TIMEOUT_S = 30  # the C++ client commits offsets every 5 s and at shutdown


def admin(node, *args):
    """Runs `shardmq admin <args> --json` against node; returns the parsed document."""
    command = [node.binary, "admin", *args, "--json", "-n", node.namesrv_addr]
    result = subprocess.run(command, capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S)
    assert result.returncode == 0, "{} failed ({}):\nstdout: {}\nstderr: {}".format(
        " ".join(command), result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def send_batch(node, topic, run, shared_key, count):
    """Sync-sends count messages, each with its own key and shared_key; returns
    [(own key, msg_id the send returned, body)]."""
    sent = []
    with closing(make_producer(node.namesrv_addr)) as producer:
        for index in range(count):
            own = "k-{}-{}".format(run, index)
            body = "body of {}".format(own).encode()
            result = send_one(producer, topic, Expected("{} {}".format(own, shared_key), "TagQ",
                                                        body))
            assert result.status == SendStatus.OK, result
            msg_id = result.msg_id.decode() if isinstance(result.msg_id, bytes) else result.msg_id
            sent.append((own, msg_id, body.decode()))
    return sent


def check_found(node, topic, shared_key, sent):
    """Every message of sent is found by the shared key; a sample by its own key and by its
    msgId (with and without the topic)."""
    by_shared = admin(node, "queryMsgByKey", "-t", topic, "-k", shared_key)
    found_bodies = {m["bodyPreview"] for m in by_shared["messages"]}
    assert found_bodies == {body for _, _, body in sent}, (
        "queryMsgByKey {} found {} of {} messages".format(
            shared_key, len(found_bodies), len(sent)))
    for own, msg_id, body in sent[::SAMPLE_EVERY]:
        by_key = admin(node, "queryMsgByKey", "-t", topic, "-k", own)["messages"]
        assert by_key and all(m["bodyPreview"] == body for m in by_key), (own, by_key)
        assert all(own in m["keys"].split(" ") and m["tags"] == "TagQ" for m in by_key)
        for extra in ((), ("-t", topic)):
            found = admin(node, "queryMsgById", "-i", msg_id, *extra)
            assert found["messages"], (msg_id, found)
            message = found["messages"][0]
            assert message["bodyPreview"] == body, (msg_id, message)
            assert msg_id in (message["uniqKey"], message["msgId"]), (msg_id, message)
            assert message["properties"]["test_key"] == "{} {}".format(own, shared_key)


def test_messages_found_by_key_and_msg_id_after_restart_and_crash(shardmq_factory):
    node = shardmq_factory(flush="sync")
    topic = create_topic(node, "Tquery")
    run = unique("q")
    first_key, second_key = "shared-a-" + run, "shared-b-" + run
    first = send_batch(node, topic, run + "a", first_key, BATCH_BEFORE_RESTART)
    check_found(node, topic, first_key, first)

    node.restart()
    check_found(node, topic, first_key, first)

    # Sent and acknowledged (SYNC_FLUSH) right before a kill -9: the index entries may not be
    # covered by a checkpoint yet, so recovery must index these records again.
    second = send_batch(node, topic, run + "b", second_key, BATCH_BEFORE_CRASH)
    node.kill9()
    node.start(keep_ports=True)
    check_found(node, topic, first_key, first)
    check_found(node, topic, second_key, second)


def test_consumer_progress_of_a_real_consumer(shardmq):
    topic = create_topic(shardmq, "Tprogress")
    group = unique("cg_progress")
    run = unique("p")
    collector = Collector("progress")
    consumer = make_consumer(shardmq.namesrv_addr, topic, collector, group=group)
    try:
        sent = send_batch(shardmq, topic, run, "p-" + run, PROGRESS_MESSAGES)
        wait_for_keys([collector], {"{} p-{}".format(own, run) for own, _, _ in sent},
                      CONSUME_TIMEOUT_S)

        def caught_up():
            progress = admin(shardmq, "consumerProgress", "-g", group, "-t", topic)
            consumed = sum(q["consumerOffset"] for q in progress["queues"])
            return progress if progress["totalLag"] == 0 and consumed == PROGRESS_MESSAGES \
                else None

        progress = wait_until(caught_up, COMMIT_TIMEOUT_S, interval_s=0.5,
                              message="the group's committed offsets to cover every message")
        assert sum(q["brokerOffset"] for q in progress["queues"]) == PROGRESS_MESSAGES
        assert progress["online"] is True
        assert len(progress["clients"]) == 1, progress["clients"]
        assert progress["clients"][0]["language"] == "CPP"
        assert topic in {s["topic"] for s in progress["subscriptions"]}
    finally:
        consumer.shutdown()

    backlog = send_batch(shardmq, topic, run + "x", "x-" + run, PROGRESS_BACKLOG)
    assert len(backlog) == PROGRESS_BACKLOG

    def offline_with_backlog():
        progress = admin(shardmq, "consumerProgress", "-g", group, "-t", topic)
        return progress if not progress["online"] else None

    progress = wait_until(offline_with_backlog, COMMIT_TIMEOUT_S, interval_s=0.5,
                          message="the group to go offline")
    assert progress["totalLag"] == PROGRESS_BACKLOG, progress
    assert sum(q["brokerOffset"] for q in progress["queues"]) == (
        PROGRESS_MESSAGES + PROGRESS_BACKLOG)
    assert progress["clients"] == []

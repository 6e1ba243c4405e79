"""A full disk is an answer, not a poison (real binary, a small loop-mounted ext4 made here).

Sends on a full disk get SERVICE_NOT_AVAILABLE (14) with RocketMQ's disk-full remark and
store nothing; every acknowledged message stays readable by the real C++ client; freeing
space brings sends back without a restart; a SIGTERM while the disk is full, and a restart
on the still-full disk, lose no acknowledged message (both flush modes). A config change on a
full disk is not answered SUCCESS, and is written once space returns.
"""

import json
import os
import time

import pytest

import remoting
from mq import (Collector, Expected, check_delivered, create_topic, make_consumer, unique,
                wait_for_keys, wait_until)
from smallfs import fill, small_filesystem

FS_MIB = 400
SEGMENT_MIB = 64
ALLOCATION_WINDOW_MIB = 64
BODY_BYTES = 32 * 1024
QUEUES = 2
LEAVE_FREE_BYTES = 24 << 20
REFUSALS_TO_STOP = 3  # consecutive refusals per shard that mean "full"
HEAL_TIMEOUT_S = 15
# Topics a full disk may still take (journal lines in the space of a block already held).
FULL_DISK_TOPICS_MAX = 200
CONSUME_TIMEOUT_S = 120
SERVICE_NOT_AVAILABLE = 14
DISK_FULL_REMARK = "the broker's disk is full"
SYSTEM_ERROR = 1
# The disk filled to ENOSPC itself: the warning ratio past what the filler leaves, and no
# forced deletion (test_retention.py covers the ratios and deletion).
ENOSPC_ARGS = ["--diskSpaceWarningLevelRatio", "99", "--cleanFileForciblyEnable", "false"]


def item(run, index):
    key = "full-{}-{:06d}".format(run, index)
    tag = "TagA"
    body = (key + " ").encode() * (BODY_BYTES // (len(key) + 1))
    return Expected(key, tag, body)


def send(client, topic, queue_id, message):
    properties = "KEYS\x01{k}\x02TAGS\x01{t}\x02test_key\x01{k}\x02".format(
        k=message.key, t=message.tag)
    return client.call(remoting.SEND_MESSAGE,
                       remoting.send_message_ext(topic, queue_id, properties),
                       body=message.body, timeout_s=30)


def produce_until_full(node, topic, run, start_index):
    """Sends to every shard in turn until each refuses REFUSALS_TO_STOP times in a row.
    Returns (acknowledged messages, a refusal response, messages sent in all)."""
    clients = [remoting.RemotingClient.connect(address) for address in node.broker_addrs]
    acked, refusal = [], None
    refused_in_a_row = [0] * len(clients)
    index = start_index
    try:
        while min(refused_in_a_row) < REFUSALS_TO_STOP:
            for shard, client in enumerate(clients):
                if refused_in_a_row[shard] >= REFUSALS_TO_STOP:
                    continue
                message = item(run, index)
                index += 1
                response = send(client, topic, index % QUEUES, message)
                if response.code == remoting.SUCCESS:
                    acked.append(message)
                    refused_in_a_row[shard] = 0
                else:
                    assert response.code in (SERVICE_NOT_AVAILABLE, remoting.SYSTEM_BUSY), (
                        "a send on a filling disk answered {!r}".format(response))
                    if response.code == SERVICE_NOT_AVAILABLE:
                        refusal = response
                    refused_in_a_row[shard] += 1
                    time.sleep(0.05)
            assert index - start_index < 100_000, "the disk never filled"
    finally:
        for client in clients:
            client.close()
    return acked, refusal, index - start_index


def send_succeeds_everywhere(node, topic, run, index):
    for shard, address in enumerate(node.broker_addrs):
        with remoting.RemotingClient.connect(address) as client:
            if send(client, topic, 0, item(run, index + shard)).code != remoting.SUCCESS:
                return False
    return True


def consume_all(node, topic, expected):
    """A fresh group of the real C++ client reads the whole topic: exactly `expected`."""
    collector = Collector("full-disk reader")
    consumer = make_consumer(node.namesrv_addr, topic, collector, group=unique("cg_full"))
    try:
        wait_for_keys([collector], [m.key for m in expected], CONSUME_TIMEOUT_S,
                      label="acknowledged messages")
        time.sleep(1)  # nothing unexpected may trail in
    finally:
        consumer.shutdown()
    check_delivered(expected, collector.snapshot(), label="reader after the full disk")


@pytest.mark.long
@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_full_disk_refuses_sends_serves_reads_heals_and_loses_nothing(shardmq_factory, flush):
    with small_filesystem(FS_MIB) as mount_point:
        node = shardmq_factory(
            data_dir=os.path.join(mount_point, "data"), flush=flush,
            segment_size_mib=SEGMENT_MIB,
            extra_args=["--allocation-window-mib", str(ALLOCATION_WINDOW_MIB)] + ENOSPC_ARGS)
        try:
            topic = create_topic(node, "Tfull", queue_nums=QUEUES)
            run = unique("r")
            filler = fill(mount_point, LEAVE_FREE_BYTES)
            acked, refusal, sent = produce_until_full(node, topic, run, 0)
            print("{} flush: {} of {} sends acknowledged before the disk was full".format(
                flush, len(acked), sent))
            assert acked, "nothing was acknowledged"
            assert refusal is not None, "no send was refused with code 14"
            assert DISK_FULL_REMARK in (refusal.remark or ""), refusal.remark
            consume_all(node, topic, acked)

            # Space returns: sends come back by themselves, without a restart.
            os.remove(filler)
            healed_at = time.monotonic()
            wait_until(lambda: send_succeeds_everywhere(node, topic, run, 500_000),
                       HEAL_TIMEOUT_S, interval_s=0.5,
                       message="sends to succeed again once space was freed")
            print("sends resumed {:.1f} s after space was freed".format(
                time.monotonic() - healed_at))
            acked += [item(run, 500_000 + shard) for shard in range(node.shards)]

            # Full again, then SIGTERM while full, and a restart on the still-full disk.
            filler = fill(mount_point, LEAVE_FREE_BYTES // 4)
            more, _, _ = produce_until_full(node, topic, run, 1_000_000)
            acked += more
            code = node.stop()
            assert code == 0, "SIGTERM while the disk was full: exit {}\n{}".format(
                code, node.log_tail())
            node.start(keep_ports=True)
            consume_all(node, topic, acked)
            os.remove(filler)
        finally:
            if node.is_running():
                node.stop()


def topic_configs(address):
    with remoting.RemotingClient.connect(address) as client:
        response = client.call(remoting.GET_ALL_TOPIC_CONFIG, {})
    assert response.code == remoting.SUCCESS, response
    return json.loads(response.body.decode("utf-8"))["topicConfigTable"]


def test_a_topic_created_on_a_full_disk_is_not_answered_success_until_written(
        shardmq_factory):
    with small_filesystem(FS_MIB) as mount_point:
        data_dir = os.path.join(mount_point, "data")
        node = shardmq_factory(data_dir=data_dir, segment_size_mib=SEGMENT_MIB,
                               extra_args=["--allocation-window-mib",
                                           str(ALLOCATION_WINDOW_MIB)] + ENOSPC_ARGS)
        try:
            filler = fill(mount_point, 0)
            # A change is one line appended to topics.json.journal: a few fit in the space a
            # block already holds, then an append needs a block the disk does not have.
            acked, refused = [], None
            for _ in range(FULL_DISK_TOPICS_MAX):
                topic = unique("Tcfg")
                response = remoting.create_topic(node.broker_addr(0), topic, 2)
                if response.code == remoting.SUCCESS:
                    acked.append(topic)
                    continue
                assert response.code == SYSTEM_ERROR, (
                    "a topic created on a full disk was answered {!r}".format(response))
                assert "not yet on disk" in (response.remark or ""), response.remark
                refused = topic
                break
            assert refused, "{} topics created on a full disk, every one answered SUCCESS".format(
                len(acked))
            print("{} topic(s) fit in the journal's last block; the next was refused".format(
                len(acked)))
            leftovers = [name for _, _, files in os.walk(data_dir) for name in files
                         if name.endswith(".tmp")]
            assert not leftovers, "temp files left behind: {}".format(leftovers)
            os.remove(filler)
            # Each shard's writer tries again by itself, on its own timer; once every one has,
            # the topic is on disk.
            config_paths = [os.path.join(data_dir, "shard-{}".format(shard), "config",
                                         "topics.json")
                            for shard in range(len(node.broker_addrs))]
            wait_until(lambda: all(refused in open(path).read() for path in config_paths),
                       HEAL_TIMEOUT_S, interval_s=0.2,
                       message="every shard's topics.json to be written once space returned")
            node.kill9()
            node.start(keep_ports=True)
            for address in node.broker_addrs:
                listed = topic_configs(address)
                for topic in acked + [refused]:
                    assert topic in listed, "topic {} lost on {}".format(topic, address)
        finally:
            if node.is_running():
                node.stop()

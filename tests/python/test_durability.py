"""What survives a clean restart (SIGTERM) and a crash (kill -9)."""

import threading
import time

import remoting
from mq import (build_messages, check_delivered, closing, Collector, create_topic, make_consumer,
                make_producer, send_all, send_one, unique, wait_for_keys, wait_until)
from rocketmq.client import SendStatus

QUEUES_PER_SHARD = 4
RESTART_MESSAGE_COUNT = 2_000
SLOW_CONSUME_DELAY_S = 0.05  # per message once half is consumed, so shutdown lands mid-way
CONSUME_TIMEOUT_S = 120
OFFSET_SETTLE_TIMEOUT_S = 20
CRASH_ACKED_BEFORE_KILL = 1_500
CRASH_PRODUCE_TIMEOUT_S = 60


def committed_offsets(shardmq, group, topic):
    """{(shard, queue id): committed offset or None} for every queue of the topic."""
    return {
        (shard, queue_id): remoting.query_consumer_offset(address, group, topic, queue_id)
        for shard, address in enumerate(shardmq.broker_addrs)
        for queue_id in range(QUEUES_PER_SHARD)
    }


def wait_offsets_settled(shardmq, group, topic):
    """Offsets the consumer committed at shutdown, once two reads 0.5 s apart agree."""
    previous = None

    def settled():
        nonlocal previous
        current = committed_offsets(shardmq, group, topic)
        done = current == previous and any(v for v in current.values())
        previous = current
        return done

    wait_until(settled, OFFSET_SETTLE_TIMEOUT_S, interval_s=0.5,
               message="committed offsets of group {} to appear and settle".format(group))
    return previous


def test_restart_keeps_messages_and_committed_offsets(shardmq):
    topic = create_topic(shardmq, "Trestart")
    group = unique("cg_restart")
    expected = build_messages(topic, RESTART_MESSAGE_COUNT)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)

    half = RESTART_MESSAGE_COUNT // 2
    stopping = threading.Event()

    def slow_after_half(collector, _received):
        if collector.count_distinct() >= half and not stopping.is_set():
            time.sleep(SLOW_CONSUME_DELAY_S)

    first = Collector("before restart", on_message=slow_after_half)
    consumer = make_consumer(shardmq.namesrv_addr, topic, first, group=group, thread_count=2)
    try:
        wait_until(lambda: first.count_distinct() >= half, CONSUME_TIMEOUT_S,
                   message="the first consumer to get half of the messages")
    finally:
        stopping.set()
        consumer.shutdown()
    consumed_before = first.keys()
    offsets_before = wait_offsets_settled(shardmq, group, topic)
    committed_total = sum(v or 0 for v in offsets_before.values())
    print("consumed {} before restart; committed offsets {} (total {})".format(
        len(consumed_before), offsets_before, committed_total))
    assert committed_total <= RESTART_MESSAGE_COUNT, "committed more than was sent: {}".format(
        offsets_before)

    shardmq.restart()

    offsets_after = committed_offsets(shardmq, group, topic)
    assert offsets_after == offsets_before, (
        "committed offsets changed across a clean restart:\nbefore {}\nafter  {}".format(
            offsets_before, offsets_after))

    second = Collector("after restart")
    with closing(make_consumer(shardmq.namesrv_addr, topic, second, group=group)):
        remaining = [item.key for item in expected if item.key not in consumed_before]
        wait_for_keys([second], remaining, CONSUME_TIMEOUT_S,
                      label="messages not consumed before the restart")
    union = first.snapshot()
    for key, items in second.snapshot().items():
        union.setdefault(key, []).extend(items)
    check_delivered(expected, union, label="both consumers")
    redelivered = consumed_before & second.keys()
    print("after restart: {} delivered, {} of them already consumed before".format(
        second.count_distinct(), len(redelivered)))
    assert second.count_distinct() < RESTART_MESSAGE_COUNT, (
        "everything ({} messages) was delivered again after the restart: committed offsets "
        "were not used".format(second.count_distinct()))
    # The second consumer starts at the committed offsets: it sees the messages at or past
    # them, i.e. everything except the committed_total messages below them.
    assert second.count_distinct() <= RESTART_MESSAGE_COUNT - committed_total, (
        "{} messages delivered after the restart, but only {} lie at or past the committed "
        "offsets {}".format(second.count_distinct(), RESTART_MESSAGE_COUNT - committed_total,
                            offsets_before))


def test_kill9_keeps_every_acknowledged_message(shardmq_factory):
    shardmq = shardmq_factory(flush="sync")
    topic = create_topic(shardmq, "Tcrash")
    attempted, acked, failures = [], [], []
    stop = threading.Event()
    source = iter(lambda: build_messages(topic, 500), None)

    def produce(producer):
        while not stop.is_set():
            for item in next(source):
                if stop.is_set():
                    return
                attempted.append(item)
                try:
                    result = send_one(producer, topic, item)
                except Exception as error:  # the broker is gone: expected after the kill
                    failures.append(repr(error))
                    continue
                if result.status == SendStatus.OK:
                    acked.append(item)

    producer = make_producer(shardmq.namesrv_addr, timeout_ms=3000)
    thread = threading.Thread(target=produce, args=(producer,), daemon=True)
    try:
        thread.start()
        wait_until(lambda: len(acked) >= CRASH_ACKED_BEFORE_KILL or not thread.is_alive(),
                   CRASH_PRODUCE_TIMEOUT_S, interval_s=0.01,
                   message="{} acknowledged sends".format(CRASH_ACKED_BEFORE_KILL))
        assert thread.is_alive(), "producer thread ended early: failures {}".format(failures[:5])
        shardmq.kill9()
        killed_at = len(acked)
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "producer thread still blocked 60 s after the kill"
    finally:
        stop.set()
        producer.shutdown()
    print("acked {} ({} when killed), attempted {}, failed {}".format(
        len(acked), killed_at, len(attempted), len(failures)))

    shardmq.start(keep_ports=True)

    collector = Collector("after crash")
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector)):
        wait_for_keys([collector], [item.key for item in acked], CONSUME_TIMEOUT_S,
                      label="acknowledged messages")
    check_delivered(attempted, collector.snapshot(), label="after crash", allow_missing=True)
    assert not collector.errors, "consumer callback errors: {}".format(collector.errors[:5])


def test_clean_restart_rebinds_the_same_ports_at_once(shardmq):
    """Operators restart in place: the namesrv and broker ports must be bindable again right
    after a clean stop, although closed connections linger in TIME_WAIT (SO_REUSEADDR)."""
    topic = create_topic(shardmq, "Trebind")
    expected = build_messages(topic, 20)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)
    ports = (shardmq.namesrv_port, shardmq.broker_port)
    # Connections open across the stop make the server the active closer, so its side of
    # each lingers (FIN_WAIT_2, then TIME_WAIT once we close ours) on the listening ports.
    lingering = [remoting.RemotingClient.connect(address)
                 for address in [shardmq.namesrv_addr] + shardmq.broker_addrs]
    for client in lingering[1:]:
        client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    code = shardmq.stop()
    assert code == 0, "shardmq exited with code {} on SIGTERM".format(code)
    for client in lingering:
        client.close()
    try:
        shardmq.start(keep_ports=True, allow_port_change=False)
    except RuntimeError as error:
        raise AssertionError("shardmq could not bind its own ports again right after a clean "
                             "stop (closed connections linger on them; SO_REUSEADDR?): {}"
                             .format(error))
    assert (shardmq.namesrv_port, shardmq.broker_port) == ports
    route = remoting.route_info(shardmq.namesrv_addr, topic)
    assert route.code == remoting.SUCCESS, "route after restart: {!r}".format(route)

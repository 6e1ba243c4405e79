"""Tag subscriptions and queue sharing between the consumers of one group."""

import time

import remoting
from mq import (build_messages, check_delivered, closing, Collector, create_topic, make_consumer,
                make_producer, send_all, send_one, unique, wait_for_keys, wait_until)
from rocketmq.client import SendStatus

TAG_MESSAGE_COUNT = 2_000
SHARED_MESSAGE_COUNT_MIN = 2_000
SHARED_PRODUCE_TIMEOUT_S = 90
CONSUME_TIMEOUT_S = 120
STRAGGLER_WAIT_S = 2.0  # after the last wanted message: time for an unwanted one to show up


def test_tag_subscription_receives_only_its_tags(shardmq):
    topic = create_topic(shardmq, "Ttags")
    expected = build_messages(topic, TAG_MESSAGE_COUNT)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)

    wanted = [item for item in expected if item.tag in ("TagA", "TagB")]
    collector = Collector()
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector,
                               expression="TagA || TagB")):
        wait_for_keys([collector], [item.key for item in wanted], CONSUME_TIMEOUT_S,
                      label="TagA/TagB messages")
        time.sleep(STRAGGLER_WAIT_S)
    received = collector.snapshot()
    others = sorted({r.tag for items in received.values() for r in items} - {"TagA", "TagB"})
    assert not others, "subscription 'TagA || TagB' also received tags {}".format(others)
    check_delivered(wanted, received, label="tag consumer")
    assert not collector.errors, "consumer callback errors: {}".format(collector.errors[:5])


def test_two_consumers_in_one_group_split_the_queues(shardmq):
    topic = create_topic(shardmq, "Tshared")
    group = unique("cg_shared")
    first, second = Collector("first"), Collector("second")
    with closing(make_consumer(shardmq.namesrv_addr, topic, first, group=group)), \
            closing(make_consumer(shardmq.namesrv_addr, topic, second, group=group)):
        started = time.monotonic()
        for address in shardmq.broker_addrs:
            # 45 s: a heartbeat lost at start is repeated by the C++ client after 30 s.
            wait_until(lambda: len(remoting.consumer_ids(address, group)) == 2, 45,
                       message="both consumers registered on {}".format(address))
        print("both consumers registered after {:.1f} s".format(time.monotonic() - started))

        # Keep producing until the rebalance has given both consumers queues (the C++ client
        # rebalances on NOTIFY_CONSUMER_IDS_CHANGED and every 10 s), and at least the minimum.
        expected = []
        batches = iter(lambda: build_messages(topic, 200), None)
        deadline = time.monotonic() + SHARED_PRODUCE_TIMEOUT_S
        with closing(make_producer(shardmq.namesrv_addr)) as producer:
            while (len(expected) < SHARED_MESSAGE_COUNT_MIN
                   or not (first.deliveries and second.deliveries)):
                assert time.monotonic() < deadline, (
                    "after {} messages in {} s one consumer still has nothing: first {}, "
                    "second {}".format(len(expected), SHARED_PRODUCE_TIMEOUT_S,
                                       first.deliveries, second.deliveries))
                batch = next(batches)
                for item in batch:
                    result = send_one(producer, topic, item)
                    assert result.status == SendStatus.OK, "send returned {}".format(result)
                expected += batch

        print("{} messages produced until both consumers had some, after {:.1f} s".format(
            len(expected), time.monotonic() - started))
        wait_for_keys([first, second], [item.key for item in expected], CONSUME_TIMEOUT_S)
        print("all consumed after {:.1f} s".format(time.monotonic() - started))

    union = first.snapshot()
    for key, items in second.snapshot().items():
        union.setdefault(key, []).extend(items)
    check_delivered(expected, union, label="union of both consumers")
    assert first.count_distinct() > 0 and second.count_distinct() > 0, (
        "queues were not split: first got {}, second got {}".format(
            first.count_distinct(), second.count_distinct()))
    queues_first = {(r.queue_id) for items in first.snapshot().values() for r in items}
    queues_second = {(r.queue_id) for items in second.snapshot().values() for r in items}
    print("first: {} messages from queue ids {}, second: {} from {}".format(
        first.count_distinct(), sorted(queues_first), second.count_distinct(),
        sorted(queues_second)))
    assert not first.errors and not second.errors, "callback errors: {} {}".format(
        first.errors[:5], second.errors[:5])

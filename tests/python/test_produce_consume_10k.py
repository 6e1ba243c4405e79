"""10,000 messages through the real C++ client: sync sends, one clustering push consumer."""

import remoting
from mq import (build_messages, check_delivered, closing, Collector, create_topic, make_consumer,
                make_producer, send_all, unique, wait_for_keys, wait_until)

MESSAGE_COUNT = 10_000
CONSUME_TIMEOUT_S = 120


def produce_and_consume(shardmq, topic):
    expected = build_messages(topic, MESSAGE_COUNT)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)

    collector = Collector()
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector)):
        wait_for_keys([collector], [item.key for item in expected], CONSUME_TIMEOUT_S)
    assert not collector.errors, "consumer callback errors: {}".format(collector.errors[:5])
    _, duplicates = check_delivered(expected, collector.snapshot())
    queues = {(r.queue_id) for items in collector.snapshot().values() for r in items}
    assert len(queues) > 1, "all messages came from one queue id: {}".format(queues)
    print("{} messages, {} duplicate deliveries".format(MESSAGE_COUNT, duplicates))


def test_10k_on_topic_created_with_code_17(shardmq):
    topic = create_topic(shardmq, "T10k_created")
    produce_and_consume(shardmq, topic)


def test_10k_on_topic_auto_created_by_first_send(shardmq):
    topic = unique("T10k_auto")
    route = remoting.route_info(shardmq.namesrv_addr, topic)
    assert route.code == remoting.TOPIC_NOT_EXIST, (
        "topic {} should not exist before the first send: {!r}".format(topic, route))
    produce_and_consume(shardmq, topic)

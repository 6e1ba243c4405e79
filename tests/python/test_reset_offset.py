"""Offset reset by time with the real C++ client: a live push consumer that has consumed
everything gets it all again once the group is reset (INVOKE_BROKER_TO_RESET_OFFSET, 222,
sent to every shard as mqadmin's resetOffsetByTime sends it to every broker of the route).

The broker sends C++ consumers no RESET_CONSUMER_CLIENT_OFFSET push (this client deadlocks
handling the pushes of two shards while its long polls are held, see src/broker/reset.rs):
their held pulls are woken and answered with the reset offset as nextBeginOffset, and they
pull from there."""

import re
import time

import remoting
from mq import (build_messages, check_delivered, closing, Collector, create_topic, make_consumer,
                make_producer, send_all, unique, wait_for_keys, wait_until)

INVOKE_BROKER_TO_RESET_OFFSET = 222
MESSAGE_COUNT = 200
CONSUME_TIMEOUT_S = 60
REGISTER_TIMEOUT_S = 45  # a heartbeat lost at start is repeated by the C++ client after 30 s
REDELIVERY_TIMEOUT_S = 60

# One entry of fastjson's ResetOffsetBody: {"brokerName":…,"queueId":…,"topic":…}:offset
_ENTRY = re.compile(rb'\{"brokerName":"([^"]*)","queueId":(\d+),"topic":"([^"]*)"\}:(-?\d+)')


def parse_reset_body(body):
    """(brokerName, queueId) -> offset from the admin's answer (fastjson object-key form)."""
    assert body.startswith(b'{"offsetTable":{'), body[:100]
    return {(broker.decode(), int(queue)): int(offset)
            for broker, queue, _topic, offset in _ENTRY.findall(body)}


def reset_everywhere(shardmq, topic, group, timestamp_ms):
    """222 to every shard; returns the union of their tables."""
    table = {}
    for address in shardmq.broker_addrs:
        with remoting.RemotingClient.connect(address) as admin:
            response = admin.call(INVOKE_BROKER_TO_RESET_OFFSET, {
                "topic": topic, "group": group, "timestamp": timestamp_ms, "isForce": "true"})
        assert response.code == remoting.SUCCESS, response
        table.update(parse_reset_body(response.body))
    return table


def test_reset_by_time_redelivers_to_the_live_consumer(shardmq):
    topic = create_topic(shardmq, "Treset")
    group = unique("cg_reset")
    before_first = int(time.time() * 1000) - 1
    expected = build_messages(topic, MESSAGE_COUNT)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)
    keys = [item.key for item in expected]

    collector = Collector()
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector, group=group)):
        wait_for_keys([collector], keys, CONSUME_TIMEOUT_S, label="first delivery")
        for address in shardmq.broker_addrs:
            wait_until(lambda: remoting.consumer_ids(address, group), REGISTER_TIMEOUT_S,
                       message="the consumer registered on {}".format(address))
        first_round = collector.deliveries
        print("first round: {} deliveries of {} messages".format(first_round, MESSAGE_COUNT))

        started = time.monotonic()
        table = reset_everywhere(shardmq, topic, group, before_first)
        brokers = {broker for broker, _queue in table}
        assert len(brokers) == shardmq.shards, "tables from {} shards: {}".format(
            len(brokers), table)
        assert table and set(table.values()) == {0}, table

        def all_twice():
            snapshot = collector.snapshot()
            return len(snapshot) == MESSAGE_COUNT and all(
                len(deliveries) >= 2 for deliveries in snapshot.values())

        wait_until(all_twice, REDELIVERY_TIMEOUT_S, interval_s=0.2,
                   message="every message delivered again after the reset")
        print("redelivered after {:.1f} s; {} deliveries in all".format(
            time.monotonic() - started, collector.deliveries))

    check_delivered(expected, collector.snapshot(), label="consumer after reset")
    assert not collector.errors, "consumer callback errors: {}".format(collector.errors[:5])

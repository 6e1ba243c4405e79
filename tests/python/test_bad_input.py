"""Raw-socket abuse of a broker endpoint: the broker answers or closes, and never falls over.

Every test ends by checking the process is alive and a fresh connection still gets answers.
"""

import struct
import time

import pytest

import mq
import remoting
from remoting import RemotingClient
from mq import (build_messages, check_delivered, closing, Collector, make_consumer, make_producer,
                send_all, unique, wait_for_keys)

UNKNOWN_REQUEST_CODE = 9999
MESSAGE_BODY_MAX_BYTES = 4 * 1024 * 1024
CLOSE_TIMEOUT_S = 10
STORED_BEFORE_ABUSE = 200
CONSUME_TIMEOUT_S = 60


def assert_well_formed(response, request_code):
    """Emission rules of REMOTING.md §1.3: a response, JSON, every ext value a string."""
    assert response.flag & remoting.FLAG_RESPONSE, (
        "answer to request {} lacks the response flag: {!r}".format(request_code, response))
    assert isinstance(response.code, int), "code is not an int: {!r}".format(response)
    for key, value in response.ext.items():
        assert isinstance(value, str), "ext field {}={!r} is not a string in {!r}".format(
            key, value, response)


def create_topic(shardmq):
    return mq.create_topic(shardmq, "Tbad")


def assert_broker_serves(shardmq, topic=None):
    """The process lives and a new connection to every endpoint gets a proper answer."""
    assert shardmq.is_running(), "shardmq died:\n{}".format(shardmq.log_tail())
    for address in shardmq.broker_addrs:
        with RemotingClient.connect(address) as client:
            if topic is None:
                response = client.call(UNKNOWN_REQUEST_CODE)
                assert response.code == remoting.REQUEST_CODE_NOT_SUPPORTED, (
                    "{} answered {!r} to an unknown code on a fresh connection".format(
                        address, response))
            else:
                response = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
                assert response.code == remoting.SUCCESS, (
                    "{} answered GET_MAX_OFFSET with {!r} on a fresh connection".format(
                        address, response))
    route = remoting.route_info(shardmq.namesrv_addr, "TBW102")
    assert route.code == remoting.SUCCESS, "namesrv answered {!r}".format(route)


# ---- the individual abuses (each returns nothing; asserts on what the broker did) ------------

def unknown_code_keeps_connection(address, topic):
    with RemotingClient.connect(address) as client:
        response = client.call(UNKNOWN_REQUEST_CODE)
        assert_well_formed(response, UNKNOWN_REQUEST_CODE)
        assert response.code == remoting.REQUEST_CODE_NOT_SUPPORTED, (
            "unknown request code {} answered {!r}, want code 3".format(
                UNKNOWN_REQUEST_CODE, response))
        assert response.remark and str(UNKNOWN_REQUEST_CODE) in response.remark, (
            "code 3 answer should carry a remark naming the code: {!r}".format(response))
        follow_up = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
        assert_well_formed(follow_up, remoting.GET_MAX_OFFSET)
        assert follow_up.code == remoting.SUCCESS and "offset" in follow_up.ext, (
            "after code 3 the same connection answered GET_MAX_OFFSET with {!r}".format(
                follow_up))


def huge_length_prefix_closes(address):
    with RemotingClient.connect(address) as client:
        client.send_raw(struct.pack(">I", 0x7FFFFFFF) + struct.pack(">I", 20) + b"{" * 64)
        assert client.wait_closed(CLOSE_TIMEOUT_S), (
            "connection still open {} s after a 0x7FFFFFFF length prefix".format(
                CLOSE_TIMEOUT_S))


def garbage_header_closes(address, header_bytes):
    with RemotingClient.connect(address) as client:
        client.send_raw(remoting.encode_frame(header_bytes, b"body"))
        assert client.wait_closed(CLOSE_TIMEOUT_S), (
            "connection still open {} s after header {!r}".format(CLOSE_TIMEOUT_S, header_bytes))


def send_answers(address, topic, body, want_code, what):
    with RemotingClient.connect(address, timeout_s=30) as client:
        # A shard that stalled on this shared machine answers SYSTEM_BUSY before it reads the
        # request, as RocketMQ's flow control does; clients retry that, and so does this.
        response = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                               remoting.send_message_ext(topic), body=body)
        assert_well_formed(response, remoting.SEND_MESSAGE)
        assert response.code == want_code, "SEND_MESSAGE with {} answered {!r}, want {}".format(
            what, response, want_code)


def pull_answers(address, topic, queue_id, want_code, what):
    with RemotingClient.connect(address) as client:
        response = client.call(remoting.PULL_MESSAGE,
                               remoting.pull_message_ext(unique("raw_cg"), topic, queue_id))
        assert_well_formed(response, remoting.PULL_MESSAGE)
        assert response.code == want_code, "PULL_MESSAGE for {} answered {!r}, want {}".format(
            what, response, want_code)


GARBAGE_HEADERS = {
    "not json": b"{this is not json at all",
    "binary noise": bytes(range(256)) * 2,
    "truncated json": b'{"code":10,"opaque":1,"extFields":{"topic":',
}


# ---- tests ---------------------------------------------------------------------------------

def test_unknown_request_code_gets_code_3_and_connection_stays_usable(shardmq):
    topic = create_topic(shardmq)
    unknown_code_keeps_connection(shardmq.broker_addr(0), topic)
    assert_broker_serves(shardmq, topic)


def test_huge_length_prefix_closes_connection_only(shardmq):
    huge_length_prefix_closes(shardmq.broker_addr(0))
    assert_broker_serves(shardmq)


@pytest.mark.parametrize("kind", sorted(GARBAGE_HEADERS))
def test_garbage_json_header_closes_connection_only(shardmq, kind):
    garbage_header_closes(shardmq.broker_addr(0), GARBAGE_HEADERS[kind])
    assert_broker_serves(shardmq)


def test_send_to_invalid_topic_name_gets_invalid_parameter(shardmq):
    send_answers(shardmq.broker_addr(0), "bad topic!", b"hello", remoting.INVALID_PARAMETER,
                 "topic 'bad topic!'")
    assert_broker_serves(shardmq)


def test_send_body_over_4_mib_gets_message_illegal(shardmq):
    topic = create_topic(shardmq)
    send_answers(shardmq.broker_addr(0), topic, b"x" * (MESSAGE_BODY_MAX_BYTES + 1),
                 remoting.MESSAGE_ILLEGAL, "a {} byte body".format(MESSAGE_BODY_MAX_BYTES + 1))
    assert_broker_serves(shardmq, topic)


def test_pull_from_unknown_topic_gets_topic_not_exist(shardmq):
    pull_answers(shardmq.broker_addr(0), unique("Tnever_created"), 0, remoting.TOPIC_NOT_EXIST,
                 "a topic that does not exist")
    assert_broker_serves(shardmq)


def test_pull_from_queue_99_gets_invalid_parameter(shardmq):
    topic = create_topic(shardmq)
    pull_answers(shardmq.broker_addr(0), topic, 99, remoting.INVALID_PARAMETER,
                 "queueId 99 of a 4-queue topic")
    assert_broker_serves(shardmq, topic)


def test_stored_messages_survive_all_bad_input(shardmq):
    topic = create_topic(shardmq)
    expected = build_messages(topic, STORED_BEFORE_ABUSE)
    with closing(make_producer(shardmq.namesrv_addr)) as producer:
        send_all(producer, topic, expected)

    failures = []
    abuses = [
        ("unknown code", lambda a: unknown_code_keeps_connection(a, topic)),
        ("huge length prefix", huge_length_prefix_closes),
        ("invalid topic name", lambda a: send_answers(
            a, "bad topic!", b"hello", remoting.INVALID_PARAMETER, "topic 'bad topic!'")),
        ("oversized body", lambda a: send_answers(
            a, topic, b"x" * (MESSAGE_BODY_MAX_BYTES + 1), remoting.MESSAGE_ILLEGAL,
            "an oversized body")),
        ("pull unknown topic", lambda a: pull_answers(
            a, unique("Tnever_created"), 0, remoting.TOPIC_NOT_EXIST, "an unknown topic")),
        ("pull queue 99", lambda a: pull_answers(
            a, topic, 99, remoting.INVALID_PARAMETER, "queue 99")),
    ] + [("garbage header: " + kind, lambda a, h=header: garbage_header_closes(a, h))
         for kind, header in sorted(GARBAGE_HEADERS.items())]
    for address in shardmq.broker_addrs:
        for name, abuse in abuses:
            try:
                abuse(address)
            except (AssertionError, OSError, remoting.ConnectionClosed) as error:
                failures.append("{} on {}: {}".format(name, address, error))
            assert shardmq.is_running(), "shardmq died after {} on {}:\n{}".format(
                name, address, shardmq.log_tail())
    time.sleep(0.2)
    assert_broker_serves(shardmq, topic)

    collector = Collector()
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector)):
        wait_for_keys([collector], [item.key for item in expected], CONSUME_TIMEOUT_S,
                      label="messages stored before the bad input")
    check_delivered(expected, collector.snapshot(), label="after bad input")
    assert not failures, "some abuses were not answered as expected (the messages survived):\n" \
        + "\n".join(failures)

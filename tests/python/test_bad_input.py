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


# RocketMQ's request codes all lie below this; the codes in between that nobody defines are
# sent as well (they must not be answered either).
REQUEST_CODES_END = 1000
# Sent last: they delete or refuse what the codes before them read.
DESTRUCTIVE_CODES = {25, 27, 104, 205, 207, 215, 216, 306, 316, 329}
# Time for answers a handler gives later (a store read, a file written) to come back.
LATE_ANSWERS_WAIT_S = 1.0


def oneway_requests_answered(address, fields, bodies, marker):
    """Sends every request code below REQUEST_CODES_END as a oneway request on one connection
    (destructive ones last), then `marker` (code, ext) twice, the second time after a pause;
    returns the request codes whose oneway request got an answer."""
    codes = sorted(range(REQUEST_CODES_END), key=lambda code: (code in DESTRUCTIVE_CODES, code))
    opaque_base = 100000
    with RemotingClient.connect(address, timeout_s=30) as client:
        client.send_raw(b"".join(
            remoting.encode_request(code, opaque_base + code, fields,
                                    bodies.get(code, b"oneway"), flag=remoting.FLAG_ONEWAY)
            for code in codes))
        frames = []

        def read_until_marker(opaque):
            client.send_raw(remoting.encode_request(marker[0], opaque, marker[1]))
            while True:
                frame = client.read_frame()
                if frame.flag & remoting.FLAG_RESPONSE and frame.opaque == opaque:
                    return
                frames.append(frame)

        read_until_marker(1)
        time.sleep(LATE_ANSWERS_WAIT_S)
        read_until_marker(2)
    return sorted({frame.opaque - opaque_base for frame in frames
                   if frame.flag & remoting.FLAG_RESPONSE
                   and 0 <= frame.opaque - opaque_base < REQUEST_CODES_END})


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


def test_no_request_code_answers_a_oneway_request(shardmq):
    """RocketMQ never answers a request flagged oneway (its clients drop such answers with a
    warning): every code, with fields and state that let the common ones succeed."""
    topic = create_topic(shardmq)
    group = unique("oneway_cg")
    broker = shardmq.broker_addr(0)
    with RemotingClient.connect(broker) as client:
        sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                           remoting.send_message_ext(topic, properties="KEYS\u0001k1\u0002"),
                                           body=b"stored")
        assert sent.code == remoting.SUCCESS, sent
        committed = client.call(remoting.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 1})
        assert committed.code == remoting.SUCCESS, committed
    with RemotingClient.connect(shardmq.namesrv_addr) as client:
        put = client.call(remoting.PUT_KV_CONFIG, {"namespace": "oneway", "key": "k",
                                                   "value": "v"})
        assert put.code == remoting.SUCCESS, put
    fields = dict(remoting.send_message_ext(topic, properties="KEYS\u0001k1\u0002"))
    fields.update(remoting.pull_message_ext(group, topic, 0))
    fields.update({
        "group": group, "offset": 0, "timestamp": 0, "key": "k1", "maxNum": 4,
        "beginTimestamp": 0, "endTimestamp": int(time.time() * 1000) + 60000,
        "namespace": "oneway", "value": "v", "clusterName": "DefaultCluster",
        "brokerAddr": broker, "brokerName": "broker-0", "brokerId": 0, "clientID": "oneway",
        "isForce": "false", "timeoutMillis": 1000,
    })
    bodies = {25: b"fileReservedTime=72\n"}
    answered = {
        "broker": oneway_requests_answered(
            broker, fields, bodies, (remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})),
        "namesrv": oneway_requests_answered(
            shardmq.namesrv_addr, fields, bodies,
            (remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})),
    }
    assert shardmq.is_running(), "shardmq died:\n{}".format(shardmq.log_tail())
    assert answered == {"broker": [], "namesrv": []}, (
        "request codes answered though sent oneway: {}".format(answered))

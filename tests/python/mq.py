"""Helpers around the real third-party client: PyPI `rocketmq` 0.4.4 (rocketmq-client-cpp 2.x).

Client quirks handled here:
- the namesrv address must be "127.0.0.1:PORT";
- every client gets a unique group and a unique instance name: the C++ client shares one
  client factory per "ip@instanceName", so two consumers of one group in one process would
  otherwise look like a single client to the broker, and a factory could outlive a test and
  keep an old namesrv address;
- consumer callbacks run on C++ threads: the Collector is guarded by a lock, and never raises
  (an exception would turn into RECONSUME_LATER);
- clients are always shut down in finally blocks (`closing`).
"""

import contextlib
import itertools
import json
import os
import threading
import time
import uuid

from rocketmq.client import Message, Producer, PushConsumer, SendStatus
from rocketmq.exceptions import ProducerSendSyncFailed
from rocketmq.ffi import MessageModel, dll

import remoting

SEND_TIMEOUT_MS = 5000
# The wheel's C++ client fails a send at once ("GetTransport of:<addr> get timed_mutex
# timeout" in ~/logs/rocketmq-cpp, surfacing as "No route info of this topic") whenever another
# client thread holds its connection-table lock, e.g. while connecting right after start: its
# std::timed_mutex::try_lock_for does not wait the configured 3 s. The broker never sees those
# sends, so the tests retry them; every retry is recorded in send_retries.
SEND_ATTEMPTS_MAX = 5
SEND_RETRY_BACKOFF_S = 0.05
send_retries = []
_send_retries_lock = threading.Lock()
TAGS = ("TagA", "TagB", "TagC", "TagD")
_sequence = itertools.count()


def unique(prefix):
    """A name no other test (or earlier run against a kept data dir) has used."""
    return "{}_{}_{}_{}".format(prefix, os.getpid(), next(_sequence), uuid.uuid4().hex[:8])


def wait_until(predicate, timeout_s, interval_s=0.1, message="condition"):
    """Poll predicate until it is truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after {:.0f} s waiting for {}".format(
                timeout_s, message))
        time.sleep(interval_s)


def make_producer(namesrv_addr, group=None, timeout_ms=SEND_TIMEOUT_MS):
    producer = Producer(group or unique("pg"), timeout=timeout_ms)
    dll.SetProducerInstanceName(producer._handle, unique("pi").encode())
    producer.set_namesrv_addr(namesrv_addr)
    producer.start()
    return producer


@contextlib.contextmanager
def closing(client):
    try:
        yield client
    finally:
        client.shutdown()


class Expected:
    """One message the test sent: what the consumer must see."""
    __slots__ = ("key", "tag", "body")

    def __init__(self, key, tag, body):
        self.key, self.tag, self.body = key, tag, body


def build_messages(topic, count, tags=TAGS, run=None):
    """count messages with unique keys, round-robin tags and bodies that name both."""
    run = run or uuid.uuid4().hex[:8]
    expected = []
    for index in range(count):
        key = "k-{}-{:06d}".format(run, index)
        tag = tags[index % len(tags)]
        body = "body {} {} {}".format(key, tag, "x" * (index % 64))
        expected.append(Expected(key, tag, body.encode()))
    return expected


def send_one(producer, topic, item, attempts=SEND_ATTEMPTS_MAX):
    """Sync send with a few client-side retries (see SEND_ATTEMPTS_MAX); a retried send may
    store the message twice, which the consumer checks tolerate (at-least-once)."""
    message = Message(topic)
    message.set_keys(item.key)
    message.set_tags(item.tag)
    message.set_body(item.body)
    message.set_property("test_key", item.key)
    for attempt in range(1, attempts + 1):
        try:
            return producer.send_sync(message)
        except ProducerSendSyncFailed as error:
            if attempt == attempts:
                raise
            with _send_retries_lock:
                send_retries.append("{}: {}".format(item.key, error))
            time.sleep(SEND_RETRY_BACKOFF_S * attempt)


def send_all(producer, topic, expected):
    """Sync-send every message; fails on the first send that is not SendStatus.OK."""
    for index, item in enumerate(expected):
        result = send_one(producer, topic, item)
        assert result.status == SendStatus.OK, (
            "send #{} ({}) returned status {}".format(index, item.key, result.status))


class Received:
    __slots__ = ("key", "tag", "body", "queue_id", "queue_offset", "topic", "property_key")


class Collector:
    """Thread-safe record of everything a push consumer delivered."""

    def __init__(self, name="consumer", on_message=None):
        self.name = name
        self.lock = threading.Lock()
        self.by_key = {}
        self.deliveries = 0
        self.errors = []
        self.on_message = on_message

    def __call__(self, message):
        try:
            received = Received()
            received.topic = message.topic
            received.key = (message.keys or b"").decode("utf-8", "replace")
            received.tag = (message.tags or b"").decode("utf-8", "replace")
            received.body = message.body or b""
            received.queue_id = message.queue_id
            received.queue_offset = message.queue_offset
            received.property_key = (message.get_property("test_key") or b"").decode(
                "utf-8", "replace")
            with self.lock:
                self.deliveries += 1
                self.by_key.setdefault(received.key, []).append(received)
            if self.on_message is not None:
                self.on_message(self, received)
        except Exception as error:  # never let an exception reach the C++ thread
            with self.lock:
                self.errors.append(repr(error))

    def keys(self):
        with self.lock:
            return set(self.by_key)

    def count_distinct(self):
        with self.lock:
            return len(self.by_key)

    def snapshot(self):
        with self.lock:
            return {key: list(items) for key, items in self.by_key.items()}


def make_consumer(namesrv_addr, topic, collector, group=None, expression="*",
                  thread_count=None, start=True):
    consumer = PushConsumer(group or unique("cg"), message_model=MessageModel.CLUSTERING)
    consumer.set_instance_name(unique("ci"))
    consumer.set_namesrv_addr(namesrv_addr)
    if thread_count is not None:
        consumer.set_thread_count(thread_count)
    consumer.subscribe(topic, collector, expression)
    if start:
        consumer.start()
    return consumer


def check_delivered(expected, received_by_key, label="consumer", allow_missing=False):
    """Every expected message arrived with the right body, tag and key. Returns (missing,
    wrong, duplicates) counts after asserting; nothing unexpected may arrive."""
    expected_by_key = {item.key: item for item in expected}
    missing = sorted(set(expected_by_key) - set(received_by_key))
    unexpected = sorted(set(received_by_key) - set(expected_by_key))
    wrong = []
    duplicates = 0
    for key, deliveries in received_by_key.items():
        item = expected_by_key.get(key)
        if item is None:
            continue
        duplicates += len(deliveries) - 1
        for got in deliveries:
            if got.body != item.body or got.tag != item.tag or got.property_key != item.key:
                wrong.append("{}: got tag={!r} body={!r} property test_key={!r}; want tag={!r} "
                             "body={!r}".format(key, got.tag, got.body[:80], got.property_key,
                                                item.tag, item.body[:80]))
    assert not wrong, "{}: {} deliveries with wrong content, e.g.\n{}".format(
        label, len(wrong), "\n".join(wrong[:10]))
    assert not unexpected, "{}: {} messages nobody sent, e.g. {}".format(
        label, len(unexpected), unexpected[:10])
    if not allow_missing:
        assert not missing, "{}: {} of {} messages never arrived, e.g. {}".format(
            label, len(missing), len(expected), missing[:10])
    return missing, duplicates


def wait_for_keys(collectors, keys, timeout_s, label="messages"):
    """Wait until the union of what the collectors received covers keys."""
    keys = set(keys)

    def covered():
        seen = set()
        for collector in collectors:
            seen |= collector.keys()
        return keys <= seen

    try:
        wait_until(covered, timeout_s, interval_s=0.2, message=label)
    except AssertionError:
        seen = set()
        for collector in collectors:
            seen |= collector.keys()
        missing = sorted(keys - seen)
        raise AssertionError("timed out after {:.0f} s: {} of {} {} still missing, e.g. {}; "
                             "deliveries so far: {}".format(
                                 timeout_s, len(missing), len(keys), label, missing[:10],
                                 {c.name: c.deliveries for c in collectors}))


ROUTE_CONVERGE_TIMEOUT_S = 35  # a shard's periodic re-registration comes every 30 s at worst


def route_shard_count(namesrv_addr, topic):
    """Number of brokers (shards) in the namesrv route of topic; 0 when there is none."""
    response = remoting.route_info(namesrv_addr, topic)
    if response.code != remoting.SUCCESS:
        return 0
    return len(json.loads(response.body.decode("utf-8")).get("queueDatas", []))


def create_topic(shardmq, prefix, queue_nums=4):
    """UPDATE_AND_CREATE_TOPIC, then wait until the namesrv route lists every shard.

    The wait matters: a C++ client that fetches a partial route (shardmq briefly answers with
    broker-0 only after code 17, see test_namesrv_route) ignores the other shards until its
    30 s route refresh. test_namesrv_route checks the route right after the answer; the other
    tests only need a topic that is fully there."""
    topic = unique(prefix)
    response = remoting.create_topic(shardmq.broker_addr(0), topic, queue_nums)
    assert response.code == remoting.SUCCESS, "UPDATE_AND_CREATE_TOPIC answered {!r}".format(
        response)
    wait_until(lambda: route_shard_count(shardmq.namesrv_addr, topic) == shardmq.shards,
               ROUTE_CONVERGE_TIMEOUT_S, interval_s=0.05,
               message="the route of {} to list all {} shards".format(topic, shardmq.shards))
    return topic

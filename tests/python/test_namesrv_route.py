"""GET_ROUTEINFO_BY_TOPIC (105) on the namesrv port, read byte for byte."""

import json
import time

import remoting
from mq import ROUTE_CONVERGE_TIMEOUT_S, route_shard_count, unique, wait_until

ROUTE_ATTEMPTS = 10


def route_body(shardmq, topic):
    response = remoting.route_info(shardmq.namesrv_addr, topic)
    assert response.code == remoting.SUCCESS, "route for {} answered {!r}".format(
        topic, response)
    text = response.body.decode("utf-8")
    try:
        return json.loads(text)  # strict standard JSON (REMOTING.md §4.2): quoted numeric keys
    except ValueError as error:
        raise AssertionError("route body is not standard JSON ({}): {!r}".format(
            error, text[:500]))


def check_route(shardmq, route, queue_nums=None):
    shards = shardmq.shards
    names = ["broker-{}".format(i) for i in range(shards)]
    for key in ("queueDatas", "brokerDatas", "filterServerTable"):
        assert key in route, "route lacks {}: {}".format(key, route)

    queue_datas = {q["brokerName"]: q for q in route["queueDatas"]}
    assert len(route["queueDatas"]) == shards and sorted(queue_datas) == names, (
        "want one queueData per shard {}, got {}".format(names, route["queueDatas"]))
    for queue_data in route["queueDatas"]:
        for key in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"):
            assert isinstance(queue_data.get(key), int), "queueData.{} missing or not an int: "\
                "{}".format(key, queue_data)
        assert queue_data["perm"] & 0x6 == 0x6, "queue not readable and writable: {}".format(
            queue_data)
        if queue_nums is not None:
            assert queue_data["readQueueNums"] == queue_data["writeQueueNums"] == queue_nums, (
                "want {} queues: {}".format(queue_nums, queue_data))

    broker_datas = {b["brokerName"]: b for b in route["brokerDatas"]}
    assert len(route["brokerDatas"]) == shards and sorted(broker_datas) == names, (
        "want one brokerData per shard {}, got {}".format(names, route["brokerDatas"]))
    for shard in range(shards):
        broker_data = broker_datas["broker-{}".format(shard)]
        want = "127.0.0.1:{}".format(shardmq.broker_port + 10 * shard)
        assert broker_data.get("brokerAddrs") == {"0": want}, (
            "broker-{} should be master at {}: {}".format(shard, want, broker_data))
        assert isinstance(broker_data.get("cluster"), str), "brokerData lacks cluster: {}".format(
            broker_data)


def test_route_of_tbw102_lists_every_shard(shardmq):
    check_route(shardmq, route_body(shardmq, "TBW102"))


def test_route_of_created_topic_and_missing_topic(shardmq):
    topic = unique("Troute")
    missing = remoting.route_info(shardmq.namesrv_addr, topic)
    assert missing.code == remoting.TOPIC_NOT_EXIST, "unknown topic answered {!r}".format(
        missing)
    assert all(isinstance(v, str) for v in missing.ext.values()), missing
    created = remoting.create_topic(shardmq.broker_addr(0), topic, queue_nums=4)
    assert created.code == remoting.SUCCESS, "UPDATE_AND_CREATE_TOPIC answered {!r}".format(
        created)
    wait_until(lambda: route_shard_count(shardmq.namesrv_addr, topic) == shardmq.shards,
               ROUTE_CONVERGE_TIMEOUT_S, interval_s=0.05,
               message="namesrv route for {} to list every shard".format(topic))
    check_route(shardmq, route_body(shardmq, topic), queue_nums=4)


def test_route_lists_every_shard_as_soon_as_create_topic_answers(shardmq):
    """Java's broker registers a new topic with the namesrv before it answers code 17, so a
    client may fetch the route at once. A partial route is not harmless: a C++ consumer that
    sees only broker-0 ignores the other shards' queues until its 30 s route refresh."""
    partial = []
    for attempt in range(ROUTE_ATTEMPTS):
        topic = unique("Troute_now")
        created = remoting.create_topic(shardmq.broker_addr(0), topic, queue_nums=4)
        assert created.code == remoting.SUCCESS, "UPDATE_AND_CREATE_TOPIC answered {!r}".format(
            created)
        listed = route_shard_count(shardmq.namesrv_addr, topic)
        started = time.monotonic()
        wait_until(lambda: route_shard_count(shardmq.namesrv_addr, topic) == shardmq.shards,
                   ROUTE_CONVERGE_TIMEOUT_S, interval_s=0.01,
                   message="namesrv route for {} to list every shard".format(topic))
        if listed != shardmq.shards:
            partial.append("{}: {} of {} shards right after the answer, all after {:.3f} s"
                           .format(topic, listed, shardmq.shards, time.monotonic() - started))
    assert not partial, ("the route was partial right after UPDATE_AND_CREATE_TOPIC answered "
                         "SUCCESS in {} of {} tries:\n{}".format(
                             len(partial), ROUTE_ATTEMPTS, "\n".join(partial)))

"""GET_ROUTEINFO_BY_TOPIC (105) on the namesrv port, read byte for byte."""

import json
import time

import remoting
from mq import unique, wait_until

ROUTE_CONVERGE_TIMEOUT_S = 35  # a shard's periodic re-registration is every 30 s at worst


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
    # Registration of the new topic with the namesrv may lag the broker's answer a little
    # (each shard registers its own queues).
    started = time.monotonic()

    def route_lists_every_shard():
        response = remoting.route_info(shardmq.namesrv_addr, topic)
        if response.code != remoting.SUCCESS:
            return False
        return len(json.loads(response.body.decode("utf-8"))["queueDatas"]) == shardmq.shards

    try:
        wait_until(route_lists_every_shard, ROUTE_CONVERGE_TIMEOUT_S,
                   message="namesrv route for {} to list every shard".format(topic))
    finally:
        print("route converged (or gave up) after {:.2f} s".format(time.monotonic() - started))
    check_route(shardmq, route_body(shardmq, topic), queue_nums=4)

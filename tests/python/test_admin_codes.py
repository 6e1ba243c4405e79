"""What RocketMQ's tools ask a broker, in raw frames against the shapes the Java tools parse:
GET_BROKER_RUNTIME_INFO (28, every key of AdminBrokerProcessor.prepareRuntimeInfo and
StoreStatsService.getRuntimeInfo, rates as "10 s 60 s 600 s" triples), VIEW_BROKER_STATS_DATA
(315, BrokerStatsData: statsMinute/statsHour/statsDay of sum, tps, avgpt), GET_BROKER_CONFIG
(26, properties text + a `version` data version) and UPDATE_BROKER_CONFIG (25, live keys only).
"""

import json
import os
import re
import time

import remoting
from mq import Collector, closing, create_topic, make_consumer, unique, wait_until

GET_BROKER_RUNTIME_INFO = 28
GET_BROKER_CONFIG = 26
UPDATE_BROKER_CONFIG = 25
VIEW_BROKER_STATS_DATA = 315
MESSAGES = 32  # one pull takes them all (PULL_BATCH_MAX_MESSAGES)
# putTps's 10 s rate needs 11 one-second samples.
RATE_SAMPLES_TIMEOUT_S = 30
# Items are sampled every 10 s; the minute window needs two samples around the sends.
ITEM_SAMPLES_TIMEOUT_S = 45

JAVA_KEYS = [
    "bootTimestamp", "runtime", "putMessageEntireTimeMax", "putMessageTimesTotal",
    "putMessageFailedTimes", "putMessageSizeTotal", "putMessageDistributeTime",
    "putMessageAverageSize", "dispatchMaxBuffer", "getMessageEntireTimeMax", "putTps",
    "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps", "getTransferredTps",
    "putLatency99", "putLatency999", "commitLogDiskRatio", "consumeQueueDiskRatio",
    "commitLogMinOffset", "commitLogMaxOffset", "brokerVersionDesc", "brokerVersion",
    "msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning", "msgPutTotalTodayNow",
    "msgGetTotalYesterdayMorning", "msgGetTotalTodayMorning", "msgGetTotalTodayNow",
    "sendThreadPoolQueueSize", "sendThreadPoolQueueCapacity", "pullThreadPoolQueueSize",
    "pullThreadPoolQueueCapacity", "queryThreadPoolQueueSize", "queryThreadPoolQueueCapacity",
    "EndTransactionQueueSize", "EndTransactionThreadPoolQueueCapacity", "dispatchBehindBytes",
    "pageCacheLockTimeMills", "sendThreadPoolQueueHeadWaitTimeMills",
    "pullThreadPoolQueueHeadWaitTimeMills", "queryThreadPoolQueueHeadWaitTimeMills",
    "earliestMessageTimeStamp", "startAcceptSendRequestTimeStamp",
    "remainTransientStoreBufferNumbs", "remainHowManyDataToFlush", "commitLogDirCapacity",
    "brokerActive",
]
JAVA_DOUBLE = r"-?\d+\.\d+(E-?\d+)?"


def call(node, code, ext=None, body=b"", shard=0):
    with remoting.RemotingClient.connect(node.broker_addr(shard)) as client:
        return remoting.call_retrying_busy(client, code, ext or {}, body=body)


def runtime_table(node):
    answer = call(node, GET_BROKER_RUNTIME_INFO)
    assert answer.code == remoting.SUCCESS, answer
    return json.loads(answer.body)["table"]


def send_and_pull(node, topic, group):
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for index in range(MESSAGES):
            ext = remoting.send_message_ext(topic, queue_id=0,
                                            properties="KEYS\u0001k{}\u0002".format(index))
            answer = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE, ext,
                                                 body=b"x" * 100)
            assert answer.code == remoting.SUCCESS, answer
        pulled = remoting.call_retrying_busy(client, remoting.PULL_MESSAGE,
                                             remoting.pull_message_ext(group, topic, 0))
        assert pulled.code == remoting.SUCCESS, pulled


def test_runtime_info_has_every_java_key_in_java_formats(shardmq):
    topic = create_topic(shardmq, "Truntime")
    send_and_pull(shardmq, topic, unique("cg_runtime"))
    wait_until(lambda: runtime_table(shardmq)["putTps"].split(" ")[0] != "",
               RATE_SAMPLES_TIMEOUT_S, interval_s=0.5, message="a 10 s putTps rate")
    table = runtime_table(shardmq)
    missing = [key for key in JAVA_KEYS if key not in table]
    assert not missing, missing
    for key in ["putTps", "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps"]:
        parts = table[key].split(" ")
        assert len(parts) == 3, (key, table[key])
        assert re.fullmatch(JAVA_DOUBLE, parts[0]), (key, table[key])
        assert parts[2] == "", "the 600 s rate stays empty for 10 minutes, as in RocketMQ"
    assert re.fullmatch(r"\[ 0 days, 0 hours, \d+ minutes, \d+ seconds \]", table["runtime"])
    assert re.fullmatch(r"(\[[^\]]+\]:\d+ ){13}", table["putMessageDistributeTime"]), (
        table["putMessageDistributeTime"])
    assert re.fullmatch(r"\d+\.\d\d", table["putLatency99"]), table["putLatency99"]
    assert re.fullmatch(r"Total : [\d.]+ [KMGTPE]iB, Free : [\d.]+ [KMGTPE]iB\.",
                        table["commitLogDirCapacity"]), table["commitLogDirCapacity"]
    assert re.fullmatch(JAVA_DOUBLE, table["commitLogDiskRatio"]), table["commitLogDiskRatio"]
    assert int(table["msgPutTotalTodayNow"]) >= MESSAGES
    assert int(table["msgGetTotalTodayNow"]) >= MESSAGES
    assert int(table["putMessageSizeTotal"]) >= MESSAGES * 100
    now_ms = time.time() * 1000
    assert now_ms - 600_000 < int(table["earliestMessageTimeStamp"]) <= now_ms
    assert table["flushDiskType"] == "ASYNC_FLUSH"


def stats(node, name, key):
    return call(node, VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})


def test_view_broker_stats_data(shardmq):
    topic = create_topic(shardmq, "Tstats")
    group = unique("cg_stats")
    missing = stats(shardmq, "TOPIC_PUT_NUMS", "TnoSuchTopic")
    assert missing.code == remoting.SYSTEM_ERROR
    assert missing.remark == "The stats <TOPIC_PUT_NUMS> <TnoSuchTopic> not exist"
    send_and_pull(shardmq, topic, group)

    def minute_sum(name, key):
        answer = stats(shardmq, name, key)
        if answer.code != remoting.SUCCESS:
            return None
        return json.loads(answer.body)["statsMinute"]["sum"]

    wait_until(lambda: minute_sum("TOPIC_PUT_NUMS", topic) == MESSAGES, ITEM_SAMPLES_TIMEOUT_S,
               interval_s=1, message="TOPIC_PUT_NUMS to count the sends")
    data = json.loads(stats(shardmq, "TOPIC_PUT_NUMS", topic).body)
    assert set(data) == {"statsMinute", "statsHour", "statsDay"}, data
    assert set(data["statsMinute"]) == {"sum", "tps", "avgpt"}
    assert data["statsMinute"]["tps"] > 0 and data["statsMinute"]["avgpt"] == 1.0, data
    assert minute_sum("TOPIC_PUT_SIZE", topic) == MESSAGES * 100
    wait_until(lambda: minute_sum("GROUP_GET_NUMS", "{}@{}".format(topic, group)) == MESSAGES,
               ITEM_SAMPLES_TIMEOUT_S, interval_s=1, message="GROUP_GET_NUMS of the pull")
    assert minute_sum("BROKER_PUT_NUMS", "DefaultCluster") >= MESSAGES


def broker_config(node, shard=0):
    answer = call(node, GET_BROKER_CONFIG, shard=shard)
    assert answer.code == remoting.SUCCESS, answer
    lines = answer.body.decode().splitlines()
    return dict(line.split("=", 1) for line in lines), answer


def test_get_and_update_broker_config(shardmq):
    config, answer = broker_config(shardmq)
    assert config["brokerName"] == "broker-0" and config["brokerClusterName"] == "DefaultCluster"
    assert config["listenPort"] == str(shardmq.broker_port)
    assert config["flushDiskType"] == "ASYNC_FLUSH" and config["brokerRole"] == "ASYNC_MASTER"
    assert config["messageDelayLevel"].startswith("1s 5s 10s 30s 1m"), config
    assert config["fileReservedTime"] == "72"
    version = json.loads(answer.ext["version"])
    assert {"counter", "timestamp"} <= set(version)
    # An update with nothing in it changes and saves nothing (the counter is checked below).
    for body in (b"", b"# only a comment\n"):
        empty = call(shardmq, UPDATE_BROKER_CONFIG, body=body)
        assert empty.code == remoting.SUCCESS, empty
    saved = os.path.join(shardmq.data_dir, "shard-0", "config", "broker.properties")
    assert not os.path.exists(saved), "an empty update wrote {}".format(saved)

    update = call(shardmq, UPDATE_BROKER_CONFIG,
                  body=b"fileReservedTime=1\ndeleteWhen=03;15\nautoCreateTopicEnable=false\n")
    assert update.code == remoting.SUCCESS, update
    config, answer = broker_config(shardmq)
    assert (config["fileReservedTime"], config["deleteWhen"]) == ("1", "03;15")
    assert json.loads(answer.ext["version"])["counter"] == version["counter"] + 1
    # autoCreateTopicEnable=false: a send through TBW102 is TOPIC_NOT_EXIST on that shard.
    with remoting.RemotingClient.connect(shardmq.broker_addr(0)) as client:
        refused = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                              remoting.send_message_ext(unique("Tnew")),
                                              body=b"x")
    assert refused.code == remoting.TOPIC_NOT_EXIST, refused

    for body, named in [(b"brokerName=other\n", "brokerName=other: cannot change"),
                        (b"diskMaxUsedSpaceRatio=200\n", "diskMaxUsedSpaceRatio"),
                        (b"fileReservedTime=2\nlistenPort=1\n", "listenPort=1")]:
        refused = call(shardmq, UPDATE_BROKER_CONFIG, body=body)
        assert refused.code == remoting.SYSTEM_ERROR, refused
        assert named in refused.remark, refused.remark
    config, _ = broker_config(shardmq)
    assert config["fileReservedTime"] == "1", "a refused update applies nothing"

    # The update was saved (shard 0's config/broker.properties) and outlives a restart;
    # shard 1, not updated, keeps its flags.
    with open(saved) as file:
        text = file.read()
    print(text)
    assert "fileReservedTime=1\n" in text and "deleteWhen=03;15\n" in text, text
    assert "listenPort" not in text and "diskMaxUsedSpaceRatio" not in text, text
    shardmq.restart()
    config, _ = broker_config(shardmq)
    assert (config["fileReservedTime"], config["deleteWhen"]) == ("1", "03;15")
    assert config["autoCreateTopicEnable"] == "false"
    other, _ = broker_config(shardmq, shard=1)
    assert other["fileReservedTime"] == "72", other["fileReservedTime"]
    assert "UPDATE_BROKER_CONFIG of an earlier run" in shardmq.log_tail(200)


GET_CONSUMER_RUNNING_INFO = 307


def test_consumer_running_info_is_asked_of_the_consumer(shardmq):
    """307 goes on to the C++ consumer and its ConsumerRunningInfo comes back."""
    topic = create_topic(shardmq, "Trunning")
    group = unique("cg_running")
    collector = Collector()
    with closing(make_consumer(shardmq.namesrv_addr, topic, collector, group=group)):
        ids = wait_until(lambda: remoting.consumer_ids(shardmq.broker_addr(0), group), 30,
                         message="the consumer's heartbeat")
        answer = call(shardmq, GET_CONSUMER_RUNNING_INFO,
                      {"consumerGroup": group, "clientId": ids[0], "jstackEnable": "false"})
        assert answer.code == remoting.SUCCESS, answer
        text = answer.body.decode("utf-8", "replace")
        print("ConsumerRunningInfo from the C++ client:", text[:300])
        assert topic in text and "properties" in text, text[:500]
    missing = call(shardmq, GET_CONSUMER_RUNNING_INFO,
                   {"consumerGroup": group, "clientId": "nobody@1", "jstackEnable": "false"})
    assert missing.code == remoting.SYSTEM_ERROR
    assert missing.remark == "The Consumer <{}> <nobody@1> not online".format(group)

"""Thousands of subscription groups and topics created with admin requests (what mqadmin
updateSubGroup / updateTopic send in a loop): each one is acknowledged once it is on disk,
through the table's journal, so kill -9 right after the last answer loses none of them; the
restarted broker lists every one, and subscriptionGroup.json / topics.json (the files
RocketMQ's tools read) hold them all once the journal is folded back in."""

import json
import os
import time

import pytest
import remoting
from mq import unique, wait_until

UPDATE_AND_CREATE_TOPIC = 17
GET_ALL_TOPIC_CONFIG = 21
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
DELETE_SUBSCRIPTIONGROUP = 207

GROUPS = 3000
TOPICS = 1000
# Quiet time after which the broker writes a journaled table whole (persist::JOURNAL_QUIET_MS),
# with room for a slow machine.
FOLD_TIMEOUT_S = 20


def table(address, code, key):
    with remoting.RemotingClient.connect(address) as client:
        response = client.call(code, {})
    assert response.code == remoting.SUCCESS, response
    return json.loads(response.body)[key]


def config_file(shardmq, name):
    with open(os.path.join(shardmq.data_dir, "shard-0", "config", name), "rb") as f:
        return json.loads(f.read())


@pytest.mark.long
def test_thousands_of_groups_and_topics_survive_kill9(shardmq_factory):
    shardmq = shardmq_factory(shards=1)
    address = shardmq.broker_addr(0)
    prefix = unique("many")
    groups = ["{}_g{}".format(prefix, i) for i in range(GROUPS)]
    topics = ["{}_t{}".format(prefix, i) for i in range(TOPICS)]
    started = time.monotonic()
    with remoting.RemotingClient.connect(address) as client:
        for group in groups:
            body = json.dumps({"groupName": group, "retryMaxTimes": 5}).encode()
            response = client.call(UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body=body)
            assert response.code == remoting.SUCCESS, response
        deleted = groups[:10]
        for group in deleted:
            response = client.call(DELETE_SUBSCRIPTIONGROUP, {"groupName": group})
            assert response.code == remoting.SUCCESS, response
        for topic in topics:
            response = client.call(UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "8",
                "writeQueueNums": "8", "perm": "6", "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0", "order": "false"})
            assert response.code == remoting.SUCCESS, response
    print("{} groups, 10 deletions and {} topics acknowledged in {:.1f} s".format(
        GROUPS, TOPICS, time.monotonic() - started))
    shardmq.kill9()

    shardmq.start(keep_ports=True)
    address = shardmq.broker_addr(0)
    listed = table(address, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, "subscriptionGroupTable")
    missing = [g for g in groups[10:] if g not in listed]
    assert not missing, "{} acknowledged groups lost, e.g. {}".format(len(missing), missing[:3])
    assert all(listed[g]["retryMaxTimes"] == 5 for g in groups[10:])
    assert not [g for g in deleted if g in listed], "deleted groups came back"
    listed_topics = table(address, GET_ALL_TOPIC_CONFIG, "topicConfigTable")
    missing = [t for t in topics if t not in listed_topics]
    assert not missing, "{} acknowledged topics lost, e.g. {}".format(len(missing), missing[:3])

    # Quiet now: the tables are written whole, as RocketMQ's tools expect to read them.
    def folded():
        on_disk = config_file(shardmq, "subscriptionGroup.json")["subscriptionGroupTable"]
        topics_on_disk = config_file(shardmq, "topics.json")["topicConfigTable"]
        return all(g in on_disk for g in groups[10:]) and all(t in topics_on_disk for t in topics)
    wait_until(folded, FOLD_TIMEOUT_S, interval_s=0.5,
               message="subscriptionGroup.json and topics.json holding every entry")

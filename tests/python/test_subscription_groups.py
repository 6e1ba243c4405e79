"""Subscription groups on the broker, with raw frames (what mqadmin sends) and the C++ client:
create/update/list/delete, persistence across a restart, and the settings that take effect."""

import json

import remoting
from mq import create_topic, unique

UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
DELETE_SUBSCRIPTIONGROUP = 207
GET_SUBSCRIPTIONGROUP_CONFIG = 352
HEART_BEAT = 34
NO_PERMISSION = 16
SUBSCRIPTION_GROUP_NOT_EXIST = 26


def call(address, code, ext=None, body=b""):
    with remoting.RemotingClient.connect(address) as client:
        return client.call(code, ext or {}, body=body)


def all_groups(address):
    response = call(address, GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert response.code == remoting.SUCCESS, response
    return json.loads(response.body)["subscriptionGroupTable"]


def pull(address, group, topic):
    return call(address, remoting.PULL_MESSAGE, remoting.pull_message_ext(group, topic, 0))


def test_groups_are_created_listed_persisted_and_deleted(shardmq):
    address = shardmq.broker_addr(0)
    topic = create_topic(shardmq, "Tgroups")
    group = unique("cg_admin")
    config = {"groupName": group, "consumeEnable": False, "retryMaxTimes": 3,
              "retryQueueNums": 2, "consumeBroadcastEnable": True}
    response = call(address, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(config).encode())
    assert response.code == remoting.SUCCESS, response
    listed = all_groups(address)[group]
    assert listed["consumeEnable"] is False and listed["retryMaxTimes"] == 3
    assert listed["retryQueueNums"] == 2

    # consumeEnable=false: pulls of the group are refused with a clear remark.
    refused = pull(address, group, topic)
    assert refused.code == NO_PERMISSION, refused
    assert group in refused.remark

    # A group used for the first time is created with RocketMQ's defaults.
    fresh = unique("cg_fresh")
    assert pull(address, fresh, topic).code in (remoting.PULL_NOT_FOUND, remoting.SUCCESS)
    created = all_groups(address)[fresh]
    assert created["retryMaxTimes"] == 16 and created["consumeEnable"] is True

    # Out-of-range settings are refused naming the field.
    bad = dict(config, retryQueueNums=0)
    response = call(address, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=json.dumps(bad).encode())
    assert response.code != remoting.SUCCESS and "retryQueueNums" in response.remark, response

    shardmq.restart(allow_port_change=False)
    address = shardmq.broker_addr(0)
    response = call(address, GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group})
    assert response.code == remoting.SUCCESS, response
    assert json.loads(response.body)["retryMaxTimes"] == 3

    response = call(address, DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "cleanOffset": "true"})
    assert response.code == remoting.SUCCESS, response
    assert group not in all_groups(address)
    response = call(address, DELETE_SUBSCRIPTIONGROUP, {"groupName": group})
    assert response.code == SUBSCRIPTION_GROUP_NOT_EXIST, response


def test_broadcast_disabled_group_refuses_broadcasting_consumers(shardmq):
    address = shardmq.broker_addr(0)
    topic = create_topic(shardmq, "Tnobcast")
    group = unique("cg_nobcast")
    config = {"groupName": group, "consumeBroadcastEnable": False}
    assert call(address, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                body=json.dumps(config).encode()).code == remoting.SUCCESS
    heartbeat = {"clientID": "127.0.0.1@bcast", "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "BROADCASTING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [],
                                 "subVersion": 1, "expressionType": "TAG"}]}]}
    with remoting.RemotingClient.connect(address) as client:
        assert client.call(HEART_BEAT, {}, body=json.dumps(heartbeat).encode()).code == \
            remoting.SUCCESS
        refused = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(group, topic, 0))
    assert refused.code == NO_PERMISSION and "broadcast" in refused.remark, refused

"""ACL on the real binary with a plain_acl.yml (RocketMQ's ACL 1.0 file): the real C++ client
(PyPI rocketmq 0.4.4, set_session_credentials) produces and consumes with a PUB|SUB account;
a wrong secret, no credentials, or an account without PUB on the topic is refused with
NO_PERMISSION (16) saying why, and nothing is stored; a SUB-only account can neither create
topics nor reset offsets, an admin account can; editing the file changes the rules within
seconds, a broken edit keeps the previous rules; the namesrv refuses REGISTER_BROKER from
anyone but a signed admin account and the routes stay as they were.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

from rocketmq.client import Message, Producer, PushConsumer, SendStatus
from rocketmq.exceptions import ProducerSendSyncFailed
from rocketmq.ffi import MessageModel, dll

import remoting
from mq import (Collector, build_messages, closing, route_shard_count, send_one, unique,
                wait_for_keys, wait_until)

NO_PERMISSION = 16
INVOKE_BROKER_TO_RESET_OFFSET = 222
SEND_MESSAGE_V2 = 310
TOPIC = "TaclOrders"
OTHER_TOPIC = "TaclAudit"
GROUP = "cg_acl_orders"
CONSUME_TIMEOUT_S = 60
RELOAD_TIMEOUT_S = 10
ADMIN = ("opsadmin1", "ops-secret-1")
PUBSUB = ("orders-app", "orders-secret")
SUBONLY = ("auditor1", "auditor-secret")

RULES = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: opsadmin1
    secretKey: ops-secret-1
    admin: true
  - accessKey: orders-app
    secretKey: orders-secret
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TaclOrders=PUB|SUB
      - TaclAudit=SUB
  - accessKey: auditor1
    secretKey: auditor-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""


def write_rules(path, text):
    # Replaced in one rename, as an editor or a config tool would.
    temporary = str(path) + ".tmp"
    with open(temporary, "w") as out:
        out.write(text)
    os.replace(temporary, str(path))


def start_node(shardmq_factory, tmp_path, rules=RULES):
    acl_file = tmp_path / "plain_acl.yml"
    write_rules(acl_file, rules)
    node = shardmq_factory(extra_args=["--acl-file", str(acl_file)])
    return node, acl_file


def call(address, code, ext, body=b"", account=None):
    if account is not None:
        ext = remoting.signed(ext, body, *account)
    with remoting.RemotingClient.connect(address) as client:
        return client.call(code, ext, body=body)


def create_topic(node, topic, account):
    """UPDATE_AND_CREATE_TOPIC signed by `account`; on success, waits until the namesrv route
    lists every shard (a C++ client that fetched a partial route right after code 17 says "No
    route info" until its 30 s refresh, see mq.create_topic)."""
    ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 4,
           "writeQueueNums": 4, "perm": 6, "topicFilterType": "SINGLE_TAG",
           "topicSysFlag": 0, "order": "false"}
    answer = call(node.broker_addr(0), remoting.UPDATE_AND_CREATE_TOPIC, ext, account=account)
    if answer.code == remoting.SUCCESS:
        wait_until(lambda: route_shard_count(node.namesrv_addr, topic) == node.shards, 30,
                   interval_s=0.05, message="the route of {} to list every shard".format(topic))
    return answer


def stored(node, topic):
    """Messages stored in topic over every shard and queue (asked as the admin)."""
    total = 0
    for address in node.broker_addrs:
        for queue in range(4):
            response = call(address, remoting.GET_MAX_OFFSET,
                            {"topic": topic, "queueId": queue}, account=ADMIN)
            assert response.code == remoting.SUCCESS, response
            total += int(response.ext["offset"])
    return total


def raw_send(node, topic, account, body=b"acl body"):
    ext = {"a": "pg_raw", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0,
           "g": int(time.time() * 1000), "h": 0,
           "i": "UNIQ_KEY\x01{}\x02WAIT\x01true\x02".format(unique("k")), "j": 0,
           "k": "false", "m": "false"}
    return call(node.broker_addr(0), SEND_MESSAGE_V2, ext, body=body, account=account)


def cpp_producer(node, account):
    producer = Producer(unique("pg_acl"), timeout=3000)
    dll.SetProducerInstanceName(producer._handle, unique("pi").encode())
    producer.set_namesrv_addr(node.namesrv_addr)
    if account is not None:
        producer.set_session_credentials(account[0], account[1], "ALIYUN")
    producer.start()
    return producer


def cpp_send(producer, topic, key):
    message = Message(topic)
    message.set_keys(key)
    message.set_tags("TagA")
    message.set_body("body of " + key)
    return producer.send_sync(message)


def test_a_signed_account_produces_and_consumes_with_the_cpp_client(shardmq_factory, tmp_path):
    node, _ = start_node(shardmq_factory, tmp_path)
    assert create_topic(node, TOPIC, ADMIN).code == remoting.SUCCESS
    expected = build_messages(TOPIC, 30)
    with closing(cpp_producer(node, PUBSUB)) as producer:
        for item in expected:
            # send_one retries the C++ client's own lock race ("No route info of this
            # topic" before any request is sent: mq.SEND_ATTEMPTS_MAX).
            assert send_one(producer, TOPIC, item).status == SendStatus.OK
    assert stored(node, TOPIC) == 30

    collector = Collector()
    consumer = PushConsumer(GROUP, message_model=MessageModel.CLUSTERING)
    consumer.set_instance_name(unique("ci"))
    consumer.set_namesrv_addr(node.namesrv_addr)
    consumer.set_session_credentials(PUBSUB[0], PUBSUB[1], "ALIYUN")
    consumer.subscribe(TOPIC, collector, "*")
    consumer.start()
    with closing(consumer):
        wait_for_keys([collector], [item.key for item in expected], CONSUME_TIMEOUT_S,
                      label="signed consumer")
    print("C++ client with AccessKey {}: 30 sent, 30 consumed".format(PUBSUB[0]))


def test_refusals_say_why_and_store_nothing(shardmq_factory, tmp_path):
    node, _ = start_node(shardmq_factory, tmp_path)
    for topic in (TOPIC, OTHER_TOPIC):
        assert create_topic(node, topic, ADMIN).code == remoting.SUCCESS

    cases = [
        ("no credentials", TOPIC, None, "No accessKey is configured"),
        ("a wrong secret", TOPIC, (PUBSUB[0], "not-the-secret"),
         "Check signature failed for accessKey=orders-app"),
        ("an unknown account", TOPIC, ("stranger1", "whatever1"), "No acl config for stranger1"),
        ("SUB only on the topic", OTHER_TOPIC, PUBSUB,
         "No permission for topic:TaclAudit: accessKey=orders-app needs PUB and has SUB"),
        ("SUB-only account", TOPIC, SUBONLY,
         "No default permission for topic:TaclOrders: accessKey=auditor1 needs PUB"),
    ]
    for label, topic, account, remark in cases:
        response = raw_send(node, topic, account)
        print("{}: code {} remark {!r}".format(label, response.code, response.remark))
        assert response.code == NO_PERMISSION, (label, response)
        assert remark in response.remark, (label, response.remark)

    # The real C++ client is refused the same way: no credentials, a wrong secret.
    for label, account in (("no credentials", None), ("wrong secret", (PUBSUB[0], "nope-nope"))):
        with closing(cpp_producer(node, account)) as producer:
            try:
                result = cpp_send(producer, TOPIC, unique(label[:2]))
                raise AssertionError("{}: send answered {}".format(label, result.status))
            except ProducerSendSyncFailed as error:
                print("C++ client, {}: {}".format(label, str(error).splitlines()[0][:160]))
    assert stored(node, TOPIC) == 0
    assert stored(node, OTHER_TOPIC) == 0


def test_only_admins_create_topics_and_reset_offsets(shardmq_factory, tmp_path):
    node, _ = start_node(shardmq_factory, tmp_path)
    response = create_topic(node, TOPIC, SUBONLY)
    assert response.code == NO_PERMISSION, response
    assert "Need admin permission for request code=17" in response.remark, response.remark
    assert "accessKey=auditor1" in response.remark, response.remark
    assert create_topic(node, TOPIC, None).code == NO_PERMISSION
    assert create_topic(node, TOPIC, ADMIN).code == remoting.SUCCESS

    reset = {"topic": TOPIC, "group": GROUP, "timestamp": 0, "isForce": "true"}
    response = call(node.broker_addr(0), INVOKE_BROKER_TO_RESET_OFFSET, reset, account=SUBONLY)
    assert response.code == NO_PERMISSION, response
    assert "request code=222" in response.remark, response.remark
    response = call(node.broker_addr(0), INVOKE_BROKER_TO_RESET_OFFSET, reset, account=ADMIN)
    assert response.code != NO_PERMISSION, response
    print("reset by the admin: code {} remark {!r}".format(response.code, response.remark))


def test_editing_the_file_changes_the_rules_without_a_restart(shardmq_factory, tmp_path):
    node, acl_file = start_node(shardmq_factory, tmp_path)
    assert create_topic(node, OTHER_TOPIC, ADMIN).code == remoting.SUCCESS
    assert raw_send(node, OTHER_TOPIC, PUBSUB).code == NO_PERMISSION

    write_rules(acl_file, RULES.replace("TaclAudit=SUB", "TaclAudit=PUB"))
    started = time.monotonic()
    wait_until(lambda: raw_send(node, OTHER_TOPIC, PUBSUB).code == remoting.SUCCESS,
               RELOAD_TIMEOUT_S, interval_s=0.1, message="the edited rules to apply")
    print("new rules applied {:.2f} s after the edit".format(time.monotonic() - started))

    # A broken edit is not used: the rules before it stay, and the log says why.
    write_rules(acl_file, RULES + "  - accessKey: x\n    bogusKey: 1\n")
    wait_until(lambda: "changed but is not used" in node.log_tail(),
               RELOAD_TIMEOUT_S, message="the broken file to be reported")
    assert raw_send(node, OTHER_TOPIC, PUBSUB).code == remoting.SUCCESS
    assert stored(node, OTHER_TOPIC) >= 2


def test_the_namesrv_takes_registrations_only_from_a_signed_admin(shardmq_factory, tmp_path):
    node, _ = start_node(shardmq_factory, tmp_path)
    assert create_topic(node, TOPIC, ADMIN).code == remoting.SUCCESS

    def brokers():
        response = remoting.route_info(node.namesrv_addr, TOPIC)
        assert response.code == remoting.SUCCESS, response
        return sorted((b["brokerName"], json.dumps(b["brokerAddrs"], sort_keys=True))
                      for b in json.loads(response.body)["brokerDatas"])

    before = brokers()
    assert len(before) == node.shards
    table = {TOPIC: {"topicName": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                     "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}}
    body = json.dumps({"topicConfigSerializeWrapper": {
        "topicConfigTable": table, "dataVersion": {"counter": 1, "timestamp": 1}},
        "filterServerList": []}).encode()
    ext = {"clusterName": "DefaultCluster", "brokerName": "fake-broker",
           "brokerAddr": "127.0.0.1:1", "brokerId": "0", "haServerAddr": "",
           "compressed": "false", "bodyCrc32": "0"}
    for label, account, remark in (
            ("unsigned", None, "No accessKey is configured"),
            ("a non-admin account", PUBSUB, "is not admin"),
            ("a wrong secret", (ADMIN[0], "guessed-secret"), "Check signature failed")):
        response = call(node.namesrv_addr, remoting.REGISTER_BROKER, ext, body=body,
                        account=account)
        print("REGISTER_BROKER, {}: code {} remark {!r}".format(
            label, response.code, response.remark))
        assert response.code == NO_PERMISSION, (label, response)
        assert remark in response.remark, (label, response.remark)
        unregister = {k: ext[k] for k in ("clusterName", "brokerName", "brokerAddr", "brokerId")}
        unregister["brokerName"] = "broker-0"
        assert call(node.namesrv_addr, remoting.UNREGISTER_BROKER, unregister,
                    account=account).code == NO_PERMISSION
    assert brokers() == before
    # Reads stay open to every client, signed or not.
    assert remoting.route_info(node.namesrv_addr, TOPIC).code == remoting.SUCCESS


NODE_CLIENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node")


def run_ali_ons(node, topic, group, account, count, timeout_ms=30000):
    node_binary = shutil.which("node")
    if node_binary is None or not os.path.isdir(os.path.join(NODE_CLIENTS, "node_modules",
                                                             "ali-ons")):
        pytest.skip("could not run: ali-ons needs node and `npm ci` in tests/node "
                    "(scripts/test.sh installs both)")
    script = os.path.join(NODE_CLIENTS, "ali_ons_acl.js")
    done = subprocess.run([node_binary, script, node.namesrv_addr, topic, group, account[0],
                           account[1], str(count), str(timeout_ms)],
                          capture_output=True, timeout=timeout_ms / 1000 + 30, cwd=NODE_CLIENTS)
    lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
    assert lines, "ali-ons printed no result: {}\n{}".format(done.stdout.decode(),
                                                            done.stderr.decode())
    return json.loads(lines[-1])


def test_ali_ons_signs_as_the_broker_verifies(shardmq_factory, tmp_path):
    # ali-ons sends JSON numbers and booleans in its headers ("d":4, "k":false): the broker
    # must sign them as their text for its signatures to match.
    node, _ = start_node(shardmq_factory, tmp_path)
    assert create_topic(node, TOPIC, ADMIN).code == remoting.SUCCESS
    result = run_ali_ons(node, TOPIC, GROUP, PUBSUB, 10)
    print("ali-ons with AccessKey {}: {}".format(PUBSUB[0], result))
    assert result["sent"] == 10 and result["received"] == 10, result
    assert stored(node, TOPIC) == 10

    result = run_ali_ons(node, TOPIC, GROUP + "_x", (PUBSUB[0], "wrong-secret"), 3,
                         timeout_ms=10000)
    print("ali-ons with a wrong secret: {}".format(result))
    # ali-ons reports only that every attempt failed; nothing of them is stored.
    assert result["sent"] == 0 and result["errors"], result
    assert stored(node, TOPIC) == 10

"""The namesrv checks what brokers tell it (real binary, raw REGISTER_BROKER frames over
loopback): invalid names, addresses, ids and topic names are refused with a clear answer and
never become routable; a stranger cannot take or remove a live broker's routes by registering
under its name (from another loopback address, 127.0.0.2), and closing the stranger's
connection leaves the real broker's routes alone.
"""

import json

import remoting
from mq import create_topic

INVALID_PARAMETER = 29  # ResponseCode.INVALID_PARAMETER
NO_PERMISSION = 16
STRANGER_IP = "127.0.0.2"


def registration_body(topics):
    table = {t: {"topicName": t, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
             for t in topics}
    return json.dumps({"topicConfigSerializeWrapper": {
        "topicConfigTable": table, "dataVersion": {"counter": 1, "timestamp": 1}},
        "filterServerList": []}).encode()


def register(client, name, addr, broker_id=0, cluster="DefaultCluster", topics=()):
    ext = {"clusterName": cluster, "brokerName": name, "brokerAddr": addr,
           "brokerId": str(broker_id), "haServerAddr": "", "compressed": "false",
           "bodyCrc32": "0"}
    return client.call(remoting.REGISTER_BROKER, ext, body=registration_body(topics))


def route_brokers(namesrv, topic):
    response = remoting.route_info(namesrv, topic)
    if response.code != remoting.SUCCESS:
        return None
    route = json.loads(response.body)
    return {b["brokerName"]: b["brokerAddrs"] for b in route["brokerDatas"]}


def test_invalid_registrations_are_refused_and_never_routable(shardmq):
    namesrv = shardmq.namesrv_addr
    cases = [
        ("an empty address", dict(name="bx-empty", addr="")),
        ("an address without a port", dict(name="bx-noport", addr="10.0.0.9")),
        ("port 0", dict(name="bx-port0", addr="10.0.0.9:0")),
        ("a 10,000-character name", dict(name="b" * 10000, addr="10.0.0.9:10911")),
        ("a name with a slash", dict(name="../bx", addr="10.0.0.9:10911")),
        ("a negative broker id", dict(name="bx-neg", addr="10.0.0.9:10911", broker_id=-1)),
        ("a topic like ../x", dict(name="bx-topic", addr="10.0.0.9:10911",
                                   topics=["../x", "FineTopic"])),
    ]
    with remoting.RemotingClient.connect(namesrv) as client:
        for label, case in cases:
            response = register(client, **case)
            print("{}: code {} remark {!r}".format(label, response.code, response.remark))
            assert response.code == INVALID_PARAMETER, (label, response)
            assert response.remark, label
    # None of it became routable.
    assert route_brokers(namesrv, "FineTopic") is None
    assert route_brokers(namesrv, "../x") is None


def test_a_stranger_cannot_take_or_remove_a_live_brokers_routes(shardmq):
    namesrv = shardmq.namesrv_addr
    topic = create_topic(shardmq, "Treg", queue_nums=2)
    before = route_brokers(namesrv, topic)
    assert before and "broker-0" in before, before
    real_addr = before["broker-0"]["0"]

    stranger = remoting.RemotingClient.connect(namesrv, source_ip=STRANGER_IP)
    try:
        # Another address under the live broker's name and id: refused.
        response = register(stranger, "broker-0", "10.9.9.9:10911", topics=[topic])
        print("other address: code {} remark {!r}".format(response.code, response.remark))
        assert response.code == NO_PERMISSION, response
        assert "broker-0" in response.remark and real_addr in response.remark, response
        # The live broker's own address, from another host: refused as well.
        response = register(stranger, "broker-0", real_addr, topics=[topic])
        print("same address: code {} remark {!r}".format(response.code, response.remark))
        assert response.code == NO_PERMISSION, response
        assert STRANGER_IP in response.remark, response
        # Nor can the stranger unregister it.
        response = stranger.call(remoting.UNREGISTER_BROKER, {
            "clusterName": "DefaultCluster", "brokerName": "broker-0",
            "brokerAddr": real_addr, "brokerId": "0"})
        assert route_brokers(namesrv, topic) == before
        # A broker of its own name is fine.
        response = register(stranger, "stranger-b", "10.9.9.9:10911", topics=["StrangerTopic"])
        assert response.code == remoting.SUCCESS, response
    finally:
        stranger.close()
    # Closing the stranger's connection removes its own routes, not the real broker's.
    assert route_brokers(namesrv, topic) == before

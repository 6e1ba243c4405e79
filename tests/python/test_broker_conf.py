"""RocketMQ's configuration files (`shardmq serve -c broker.conf`, `shardmq namesrv -c`).

A migrating operator copies a broker's property file: RocketMQ's own distribution file
(`conf/2m-2s-async/broker-a.properties`, in fixtures/) starts a node with its cluster and
broker names on RocketMQ's default ports, and the C++ client produces and consumes through
it. A file with more keys shows where each setting came from (`--print-config`), takes the
store path, flush type, segment size and topic auto-creation it names, and loses to a flag.
Bad files are refused naming the key; namesrv.properties starts a name server.
"""

import json
import os
import shutil
import socket
import subprocess

import pytest

import remoting
from conftest import ShardMQ, port_is_free, ports_needed, pick_ports
from mq import (Collector, build_messages, closing, make_consumer, make_producer, send_all,
                unique, wait_for_keys, wait_until)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "rocketmq-conf")
MESSAGES = 50
ROCKETMQ_NAMESRV_PORT = 9876
ROCKETMQ_LISTEN_PORT = 10911


class ConfNode(ShardMQ):
    """A node started from a property file: only what the file cannot say is a flag."""

    def __init__(self, *args, conf, flags=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.conf = conf
        self.flags = list(flags)

    def _command(self):
        return [self.binary, "serve", "-c", self.conf, "--shards", str(self.shards),
                "--listen-ip", "127.0.0.1", "--metrics-port", "0"] + self.flags


def start_conf_node(binary, tmp_path, conf, namesrv_port, broker_port, flags=()):
    data_dir = tmp_path / "cwd"
    data_dir.mkdir(exist_ok=True)
    log_path = str(tmp_path / "shardmq.log")
    open(log_path, "w").close()
    node = ConfNode(binary, str(data_dir), log_path, shards=2, conf=conf, flags=flags)
    node.namesrv_port, node.broker_port = namesrv_port, broker_port
    return node.start(keep_ports=True, allow_port_change=False)


def admin(node, *args):
    command = [node.binary, "admin", *args, "--json", "-n", node.namesrv_addr]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return json.loads(done.stdout)


def produce_and_consume(node, topic):
    expected = build_messages(topic, MESSAGES)
    with closing(make_producer(node.namesrv_addr)) as producer:
        send_all(producer, topic, expected)
    collector = Collector()
    with closing(make_consumer(node.namesrv_addr, topic, collector, group=unique("cg_conf"))):
        wait_for_keys([collector], [item.key for item in expected], timeout_s=60)


@pytest.fixture
def binary():
    from conftest import _binary
    return _binary()


def test_distribution_file_starts_a_node_with_its_names_and_ports(binary, tmp_path):
    conf = os.path.join(FIXTURES, "2m-2s-async", "broker-a.properties")
    needed = ports_needed(ROCKETMQ_NAMESRV_PORT, ROCKETMQ_LISTEN_PORT, 2)
    taken = [port for port in needed if listening(port)]
    if taken:
        pytest.skip("RocketMQ's default ports {} are taken on this machine, so the file "
                    "cannot start a node on them".format(taken))
    node = start_conf_node(binary, tmp_path, conf, ROCKETMQ_NAMESRV_PORT,
                           ROCKETMQ_LISTEN_PORT)
    try:
        clusters = admin(node, "clusterList")["clusters"]
        assert [cluster["name"] for cluster in clusters] == ["DefaultCluster"], clusters
        brokers = {row["brokerName"]: row for row in clusters[0]["brokers"]}
        assert set(brokers) == {"broker-a-0", "broker-a-1"}, clusters
        for index, name in enumerate(["broker-a-0", "broker-a-1"]):
            row = brokers[name]
            assert row["addr"] == "127.0.0.1:{}".format(ROCKETMQ_LISTEN_PORT + 10 * index), row
        produce_and_consume(node, "TconfAuto")  # auto-created through TBW102, as RocketMQ
    finally:
        assert node.stop() == 0


def listening(port):
    """Whether something accepts connections on the port (a bind test would also fail on
    the TIME_WAIT sockets an earlier test left, which SO_REUSEADDR lets the node bind over)."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def write_conf(path, lines):
    with open(path, "w") as out:
        out.write("# written by test_broker_conf\n" + "\n".join(lines) + "\n")
    return str(path)


def test_file_settings_sources_and_overrides(binary, tmp_path):
    namesrv_port, broker_port = pick_ports(2)
    store = tmp_path / "store"
    conf = write_conf(tmp_path / "broker.conf", [
        "brokerClusterName = MigratedCluster",
        "brokerName = orders",
        "brokerId = 0",
        "brokerRole = ASYNC_MASTER",
        "listenPort = {}".format(broker_port),
        "brokerIP1 = 127.0.0.1",
        "storePathRootDir = {}".format(store),
        "storePathCommitLog = {}".format(store / "commitlog"),
        "mapedFileSizeCommitLog = 67108864",
        "flushDiskType = SYNC_FLUSH",
        "fileReservedTime = 120",
        "autoCreateTopicEnable = false",
        "defaultTopicQueueNums = 4",
        "aclEnable = false",
        "sendMessageThreadPoolNums = 16",
        "transientStorePoolEnable = false",
    ])
    flags = ["--namesrv-port", str(namesrv_port), "--fileReservedTime", "24"]
    shown = subprocess.run([binary, "serve", "-c", conf, "--print-config"] + flags,
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    rows = {}
    for line in shown.stdout.splitlines():
        if line.startswith("--"):
            flag, value, *source = line.split(None, 2)
            rows[flag] = (value, source[0] if source else "")
    assert rows["--cluster-name"] == ("MigratedCluster", "file {}:2 (brokerClusterName)"
                                      .format(conf)), rows["--cluster-name"]
    assert rows["--flush"][0] == "sync" and "flushDiskType" in rows["--flush"][1]
    assert rows["--segment-size-mib"][0] == "64"
    assert rows["--fileReservedTime"] == ("24", "flag"), "a flag wins over the file"
    assert rows["--broker-port"] == (str(broker_port), "file {}:6 (listenPort)".format(conf))
    assert rows["--diskMaxUsedSpaceRatio"] == ("75", "default")
    assert rows["--shards"][1].startswith("profile"), rows["--shards"]
    assert "sendMessageThreadPoolNums ignored: a JVM thread pool" in shown.stdout
    assert "transientStorePoolEnable ignored" in shown.stdout

    node = start_conf_node(binary, tmp_path, conf, namesrv_port, broker_port, flags)
    try:
        with open(node.log_path) as log:
            output = log.read()
        assert "sendMessageThreadPoolNums ignored" in output, "one line per ignored key"
        assert os.path.isdir(store / "shard-0" / "commitlog"), os.listdir(store)
        segments = os.listdir(store / "shard-0" / "commitlog")
        sizes = {os.path.getsize(store / "shard-0" / "commitlog" / name) for name in segments}
        assert sizes <= {64 << 20}, sizes
        # autoCreateTopicEnable=false: a send to a topic nobody created is refused.
        with closing(make_producer(node.namesrv_addr)) as producer:
            with pytest.raises(Exception) as refused:
                send_all(producer, "TconfNotCreated", build_messages("TconfNotCreated", 1))
        assert "not exist" in str(refused.value) or "route" in str(refused.value).lower(), (
            refused.value)
        topic = unique("Tconf")
        admin(node, "updateTopic", "-c", "MigratedCluster", "-t", topic, "-r", "4", "-w", "4")
        wait_until(lambda: remoting.route_info(node.namesrv_addr, topic).code
                   == remoting.SUCCESS, 30, message="the route of " + topic)
        produce_and_consume(node, topic)
        # TBW102 carries defaultTopicQueueNums.
        route = json.loads(remoting.route_info(node.namesrv_addr, "TBW102").body)
        assert {queue["writeQueueNums"] for queue in route["queueDatas"]} == {4}, route
    finally:
        assert node.stop() == 0
    shutil.rmtree(store, ignore_errors=True)


@pytest.mark.parametrize("lines, refusal", [
    (["listenPort = ten"], "line 2, listenPort: \"ten\" is not a port"),
    (["brokerNmae = broker-a"], "line 2: unknown key \"brokerNmae\""),
    (["flushDiskType = SYNC"], "line 2, flushDiskType"),
    (["autoCreateTopicEnable = yes"], "autoCreateTopicEnable: \"yes\" is not true or false"),
    (["aclEnable = true"], "plain_acl.yml"),
    (["storePathRootDir = /a", "storePathCommitLog = /elsewhere/commitlog"],
     "line 3, storePathCommitLog"),
])
def test_bad_files_are_refused_naming_the_key(binary, tmp_path, lines, refusal):
    conf = write_conf(tmp_path / "broker.conf", lines)
    done = subprocess.run([binary, "serve", "-c", conf, "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert refusal in done.stderr, done.stderr
    assert not os.path.exists(tmp_path / "d"), "nothing is started or written"


@pytest.mark.parametrize("name,role,broker_id", [
    ("2m-2s-async/broker-a-s.properties", "SLAVE", "1"),
    ("2m-2s-sync/broker-a.properties", "SYNC_MASTER", "0"),
])
def test_replicated_roles_are_read_from_the_file(binary, tmp_path, name, role, broker_id):
    """RocketMQ's slave and SYNC_MASTER files set the role and id they say (replication
    itself is test_replication's)."""
    path = os.path.join(FIXTURES, name)
    done = subprocess.run([binary, "serve", "-c", path, "--data-dir", str(tmp_path / "d"),
                           "--print-config"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    role_line = [line for line in lines if "brokerRole" in line and "file" in line]
    id_line = [line for line in lines if "brokerId" in line and "file" in line]
    assert role_line and role in role_line[0], done.stdout
    assert id_line and broker_id in id_line[0].split(), done.stdout


def test_namesrv_properties(binary, tmp_path):
    namesrv_port, _ = pick_ports(1)
    conf = write_conf(tmp_path / "namesrv.properties", [
        "listenPort = {}".format(namesrv_port),
        "rocketmqHome = /opt/rocketmq",
        "serverWorkerThreads = 8",
    ])
    log_path = tmp_path / "namesrv.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary, "namesrv", "-c", conf, "--shards", "1",
                                    "--data-dir", str(tmp_path / "ns")],
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: listening(namesrv_port), 30,
                   message="the namesrv to listen on listenPort {}".format(namesrv_port))
        answer = remoting.route_info("127.0.0.1:{}".format(namesrv_port), "TnoSuchTopic")
        assert answer.code == remoting.TOPIC_NOT_EXIST, answer
        with open(log_path) as log:
            output = log.read()
        assert "rocketmqHome ignored" in output and "serverWorkerThreads ignored" in output
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0

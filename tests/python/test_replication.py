"""Master/slave replication per shard (issue 14), with RocketMQ's HA protocol, as separate
hosts on distinct loopback addresses: a name server, a master node on 127.0.0.1 and a slave
node on 127.0.0.2, each broker with two shards (shard i of the slave copies shard i of the
master: broker-i, brokerId 1).

- The real C++ client produces 20,000 messages to the master and a push consumer reads them;
  the master's host goes down a quarter of the way in (its process killed with SIGKILL, its
  broker ports then silent, see `silence`): the consumer moves to the slave by itself,
  receives every message (duplicates only around the switch, counted) and the slave served
  some of them.
- Before the kill, the slave's commitlog is byte-identical to the master's over the common
  range (a checksum per segment).
- SYNC_MASTER: with no slave a send is stored and answered SLAVE_NOT_AVAILABLE; with the
  slave, every acknowledged send of a pipelined load is on the slave when the master is
  killed (read back from the slave alone).
- A slave stopped while the master takes more catches up when it comes back.
- A master whose disk loses power (powercut.py) comes back with less than its slave holds:
  it begins an epoch at its recovered end, and the slave refuses to continue past it.
- A SYNC_FLUSH master killed under load never comes back with less than its slave holds (the
  stream sends durable bytes only): the slave goes on, byte for byte.
"""

import hashlib
import os
import socket
import subprocess
import threading
import time

import pytest

import remoting
from conftest import PORT_STRIDE, ShardMQ, _binary, pick_ports
from mq import (Collector, build_messages, closing, create_topic, make_consumer, make_producer,
                send_all, unique, wait_until)

MASTER_IP = "127.0.0.1"
SLAVE_IP = "127.0.0.2"
MESSAGES = int(os.environ.get("HA_MESSAGES", "20000"))
CATCH_UP_TIMEOUT_S = 60
CONSUME_TIMEOUT_S = 180
GET_MAX_OFFSET = 30
SLAVE_NOT_AVAILABLE = 11


def listening(address):
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, int(port))) == 0


def start_listening(node, address, what):
    """Starts `node`'s process, counted started once `address` listens (for processes that
    print no ready line, or may never)."""
    node.starts += 1
    node._start_offset = os.path.getsize(node.log_path)
    node._log_file = open(node.log_path, "ab")
    node.process = subprocess.Popen(node._command(), stdout=node._log_file,
                                    stderr=subprocess.STDOUT, cwd=node.data_dir)
    wait_until(lambda: listening(address), 30, message="{} to listen".format(what))
    return None


class Namesrv(ShardMQ):
    """`shardmq namesrv` alone: the brokers and the clients find each other through it."""

    def _command(self):
        return [self.binary, "namesrv", "--data-dir", self.data_dir, "--shards", "1",
                "--namesrv-port", str(self.namesrv_port), "--listen-ip", "127.0.0.1", "--no-pin"]

    def _start_once(self):
        return start_listening(self, self.namesrv_addr, "the namesrv")


class Broker(ShardMQ):
    """`shardmq broker` on its own loopback address, registering with `namesrv`."""

    def __init__(self, binary, data_dir, log_path, namesrv, ip, role_args=(), **options):
        super().__init__(binary, data_dir, log_path, **options)
        self.namesrv = namesrv
        self.ip = ip
        self.role_args = list(role_args)

    @property
    def namesrv_addr(self):
        return self.namesrv.namesrv_addr

    def broker_addr(self, shard=0):
        return "{}:{}".format(self.ip, self.broker_port + PORT_STRIDE * shard)

    def _command(self):
        return [self.binary, "broker", "--namesrv", self.namesrv.namesrv_addr,
                "--data-dir", self.data_dir, "--broker-port", str(self.broker_port),
                "--shards", str(self.shards), "--flush", self.flush,
                "--segment-size-mib", str(self.segment_size_mib), "--listen-ip", self.ip,
                "--broker-ip", self.ip, "--metrics-port", "0", "--no-pin",
                "--haSendHeartbeatInterval", "1000"] + self.role_args + self.extra_args

    def start(self, keep_ports=False, allow_port_change=True):
        # pick_ports checks 127.0.0.1; the slave's ports on 127.0.0.2 are the same numbers.
        return super().start(keep_ports=keep_ports or self.broker_port is not None,
                             allow_port_change=False)


@pytest.fixture
def cluster(request, tmp_path):
    """Starts a namesrv, then brokers on demand; stops everything at teardown. A failed
    test's report carries each node's output (conftest's `_shardmq_nodes`)."""
    if not loopback_alias_works():
        pytest.skip("could not run: 127.0.0.2 cannot be bound here (the slave needs its own "
                    "loopback address)")
    binary = _binary()
    started = []
    request.node._shardmq_nodes = started

    def process(kind, name, **options):
        data_dir = tmp_path / name
        data_dir.mkdir(exist_ok=True)
        log_path = str(tmp_path / (name + ".log"))
        open(log_path, "a").close()
        node = kind(binary, str(data_dir), log_path, **options)
        started.append(node)
        return node

    namesrv = process(Namesrv, "namesrv")
    namesrv.namesrv_port, namesrv.broker_port = pick_ports(1)
    namesrv.start(keep_ports=True)
    _, master_port = pick_ports(2)

    def broker(name, ip, role_args=(), kind=None, **options):
        node = process(kind or Broker, name, namesrv=namesrv, ip=ip, role_args=role_args,
                       **options)
        node.namesrv_port = namesrv.namesrv_port
        node.broker_port = master_port
        return node.start()

    broker.port = master_port  # every broker's shard 0 port (on its own address)
    yield broker
    for node in reversed(started):
        if node.process is not None and node.process.poll() is None:
            node.process.kill()
            node.process.wait(10)
        node._reap()


def loopback_alias_works():
    with socket.socket() as sock:
        try:
            sock.bind((SLAVE_IP, 0))
        except OSError:
            return False
    return True


runtime_info = remoting.runtime_info


def silence(addresses):
    """Makes `addresses` answer as those of a host that went down: nothing. Each gets a
    listener whose one-place accept queue is filled at once, so the kernel drops every later
    SYN and a connect waits out its timeout. Returns the sockets; closing them ends it.

    A killed process on a host that stays up answers RST instead, and the C++ client 1.2
    (PyPI rocketmq 0.4.4) sends a failed pull again at once (2.0 waits 1 s, Java 3 s): its
    pull threads then hold its connection table's lock so often that its 30 s route refresh
    fails on it ("GetTransport of:<namesrv> get timed_mutex timeout" in
    ~/logs/rocketmq-cpp), and the consumer stayed on the dead master past 180 s in one CI run.
    docs/operating.md says so (replication, when the master dies)."""
    sockets = []
    try:
        for address in addresses:
            host, port = address.rsplit(":", 1)
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, int(port)))
            listener.listen(0)
            sockets.append(listener)
            filler = socket.socket()
            filler.settimeout(5)
            sockets.append(filler)
            try:
                filler.connect((host, int(port)))
            except OSError:
                pass  # the queue's one place went to a client first: it is full all the same
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def wait_slave_routed(master, topic):
    """Until the namesrv routes every broker name of `topic` to a slave (brokerId 1) too:
    the slave copies its master's topics every 10 s and registers them."""
    import json

    def routed():
        answer = remoting.route_info(master.namesrv_addr, topic)
        if answer.code != remoting.SUCCESS:
            return False
        datas = json.loads(answer.body)["brokerDatas"]
        return len(datas) == master.shards and all(
            "1" in data["brokerAddrs"] for data in datas)
    wait_until(routed, 30, interval_s=0.2, message="the route of {} to list the slaves".format(
        topic))


class Load:
    """`threads` connections sending 4 KiB raw messages to `address` one at a time until
    `stop()`; a kill of the node ends them quietly."""

    def __init__(self, address, topic, threads=1):
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._send, args=(address, topic), daemon=True)
                        for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def _send(self, address, topic):
        try:
            with remoting.RemotingClient.connect(address) as client:
                while not self.stopping.is_set():
                    client.call(remoting.SEND_MESSAGE, remoting.send_message_ext(topic, -1),
                                body=b"x" * 4096)
        except (OSError, remoting.ConnectionClosed):
            pass  # the kill

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)


def wait_caught_up(master, slave):
    """Until every slave shard has everything its master shard holds."""
    def caught_up():
        for shard in range(master.shards):
            ours = runtime_info(master.broker_addr(shard))
            theirs = runtime_info(slave.broker_addr(shard))
            if ours["slaveAckOffset"] != ours["commitLogMaxOffset"] or (
                    theirs["commitLogMaxOffset"] != ours["commitLogMaxOffset"]):
                return False
        return True
    wait_until(caught_up, CATCH_UP_TIMEOUT_S, interval_s=0.2,
               message="the slave to have every byte of the master")


def segment_checksums(node, shard, end):
    """sha256 of each commitlog segment's bytes below `end`, by segment start."""
    directory = os.path.join(node.data_dir, "shard-{}".format(shard), "commitlog")
    sums = {}
    for name in sorted(os.listdir(directory)):
        if not name.isdigit():
            continue
        start = int(name)
        if start >= end:
            continue
        with open(os.path.join(directory, name), "rb") as segment:
            data = segment.read(end - start)
        sums[start] = hashlib.sha256(data).hexdigest()
    return sums


@pytest.mark.long
def test_the_consumer_moves_to_the_slave_and_gets_every_message(cluster):
    master = cluster("master", MASTER_IP)
    slave = cluster("slave", SLAVE_IP, role_args=["--brokerRole", "SLAVE", "--brokerId", "1",
                                                  "--ha-start-from", "oldest"])
    topic = create_topic(master, "Tha")
    expected = build_messages(topic, MESSAGES)
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, expected)
    wait_caught_up(master, slave)
    wait_slave_routed(master, topic)
    time.sleep(1.0)  # the master's async flush puts the last bytes in its files
    for shard in range(master.shards):
        end = int(runtime_info(master.broker_addr(shard))["commitLogMaxOffset"])
        ours, theirs = segment_checksums(master, shard, end), segment_checksums(slave, shard, end)
        print("shard {}: {} bytes in {} segment(s), checksums {}".format(
            shard, end, len(ours), "equal" if ours == theirs else "DIFFER"))
        assert ours == theirs, (shard, ours, theirs)
    # A slave takes no writes.
    with remoting.RemotingClient.connect(slave.broker_addr(0)) as client:
        refused = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                              remoting.send_message_ext(topic), body=b"x")
    assert refused.code == remoting.SERVICE_NOT_AVAILABLE, refused
    assert "SLAVE" in refused.remark

    collector = Collector()
    keys = {item.key for item in expected}
    with closing(make_consumer(master.namesrv_addr, topic, collector, group=unique("cg_ha"))):
        # A quarter: the C++ client pulls up to 1,000 messages a queue ahead of its listener,
        # so a later kill could leave nothing for the slave to serve.
        wait_until(lambda: len(collector.keys()) >= MESSAGES // 4, CONSUME_TIMEOUT_S,
                   message="a quarter of the messages from the master")
        master.process.kill()
        master.process.wait(10)
        master._reap()
        silent = silence([master.broker_addr(shard) for shard in range(master.shards)])
        try:
            killed_at = len(collector.keys())
            time.sleep(2)
            print("route after the kill:", remoting.route_info(master.namesrv_addr, topic).body)
            started = time.monotonic()
            wait_until(lambda: keys <= collector.keys(), CONSUME_TIMEOUT_S, interval_s=0.5,
                       message="every message, from the slave after the master died")
            print("every message {:.1f} s after the route changed".format(
                time.monotonic() - started))
        finally:
            for sock in silent:
                sock.close()
    received = collector.deliveries
    from_slave = sum(int(runtime_info(slave.broker_addr(shard))["msgGetTotalTodayNow"])
                     for shard in range(slave.shards))
    print("received {} deliveries of {} messages ({} duplicates; {} distinct before the "
          "kill); the slave served {} of them".format(received, MESSAGES, received - MESSAGES,
                                                       killed_at, from_slave))
    assert keys <= collector.keys()
    assert from_slave > 0, "the consumer never pulled from the slave"


def test_sync_master_acknowledges_only_what_the_slave_has(cluster):
    master = cluster("master", MASTER_IP, flush="sync",
                     role_args=["--brokerRole", "SYNC_MASTER"])
    topic = create_topic(master, "Tsync")
    # No slave yet: stored, and answered SLAVE_NOT_AVAILABLE (RocketMQ's isSlaveOK).
    with remoting.RemotingClient.connect(master.broker_addr(0)) as client:
        lonely = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                             remoting.send_message_ext(topic), body=b"1")
    assert lonely.code == SLAVE_NOT_AVAILABLE, lonely
    assert lonely.ext.get("msgId"), lonely.ext
    slave = cluster("slave", SLAVE_IP, role_args=["--brokerRole", "SLAVE", "--brokerId", "1",
                                                  "--ha-start-from", "oldest"])
    wait_until(lambda: runtime_info(master.broker_addr(0))["haSlaveInSync"] == "true", 30,
               message="the slave to connect")
    acknowledged = []
    stop = threading.Event()

    def load():
        """Pipelined sends (64 in flight) until the master dies; keeps what was SUCCESS."""
        try:
            with remoting.RemotingClient.connect(master.broker_addr(0), timeout_s=10) as client:
                opaque = 1000
                in_flight = {}
                while not stop.is_set() or in_flight:
                    while len(in_flight) < 64 and not stop.is_set():
                        opaque += 1
                        body = b"sync-%d" % opaque
                        client.send_raw(remoting.encode_request(
                            remoting.SEND_MESSAGE, opaque, remoting.send_message_ext(topic),
                            body))
                        in_flight[opaque] = body
                    answer = client.read_frame()
                    body = in_flight.pop(answer.opaque, None)
                    if body is not None and answer.code == remoting.SUCCESS:
                        acknowledged.append((int(answer.ext["queueOffset"]), body))
        except (OSError, remoting.ConnectionClosed):
            pass
    thread = threading.Thread(target=load)
    thread.start()
    wait_until(lambda: len(acknowledged) >= 2000, 60, message="2,000 acknowledged sends")
    master.process.kill()
    master.process.wait(10)
    master._reap()
    stop.set()
    thread.join(30)
    print("{} sends acknowledged before the kill".format(len(acknowledged)))
    # Every acknowledged message is on the slave, read from the slave alone.
    on_slave = {}
    with remoting.RemotingClient.connect(slave.broker_addr(0)) as client:
        offset = 0
        while True:
            pulled = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(
                unique("cg_check"), topic, 0, queue_offset=offset, max_msg_nums=32))
            if pulled.code != remoting.SUCCESS:
                break
            for queue_offset, body in remoting.stored_records(pulled.body):
                on_slave[queue_offset] = body
            offset = int(pulled.ext["nextBeginOffset"])
    missing = [(o, b) for o, b in acknowledged if on_slave.get(o) != b]
    print("{} messages on the slave's queue 0; acknowledged and missing: {}".format(
        len(on_slave), len(missing)))
    assert not missing, missing[:5]


def test_a_stopped_slave_catches_up(cluster):
    # The master's HA ports set by haListenPort (shard i: + the stride × i); the slave finds
    # them through the namesrv (haServerAddr).
    ha_port = cluster.port + 5
    master = cluster("master", MASTER_IP, role_args=["--haListenPort", str(ha_port)])
    slave = cluster("slave", SLAVE_IP, role_args=["--brokerRole", "SLAVE", "--brokerId", "1",
                                                  "--ha-start-from", "oldest"])
    for shard in range(master.shards):
        wanted = "{}:{}".format(MASTER_IP, ha_port + PORT_STRIDE * shard)
        assert runtime_info(slave.broker_addr(shard))["haMasterAddress"] == wanted
    topic = create_topic(master, "Tcatch")
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, build_messages(topic, 2000))
    wait_caught_up(master, slave)
    assert slave.stop() == 0
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, build_messages(topic, 5000))
    behind = int(runtime_info(master.broker_addr(0))["commitLogMaxOffset"])
    started = time.monotonic()
    slave.start(keep_ports=True)
    wait_caught_up(master, slave)
    print("slave caught up to {} bytes in {:.1f} s after its restart".format(
        behind, time.monotonic() - started))
    for shard in range(master.shards):
        end = int(runtime_info(master.broker_addr(shard))["commitLogMaxOffset"])
        time.sleep(0.5)
        assert segment_checksums(master, shard, end) == segment_checksums(slave, shard, end)


LINK_DELAY_S = 0.005


class DelayedLink:
    """A TCP relay that holds every chunk LINK_DELAY_S before passing it on, each way: the
    replication link of a slave 5 ms away. `tc netem` would do this in the kernel; this
    machine's kernel has no netem qdisc (the test says which one it used)."""

    def __init__(self, target):
        import queue
        self.queue = queue
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.address = "127.0.0.1:{}".format(self.listener.getsockname()[1])
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            for source, sink in ((client, upstream), (upstream, client)):
                self._pump(source, sink)

    def _pump(self, source, sink):
        pending = self.queue.Queue()

        def read():
            while True:
                try:
                    data = source.recv(256 * 1024)
                except OSError:
                    data = b""
                pending.put((time.monotonic() + LINK_DELAY_S, data))
                if not data:
                    return

        def write():
            while True:
                due, data = pending.get()
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if not data:
                    try:
                        sink.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    sink.sendall(data)
                except OSError:
                    return
        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self):
        self.closed = True
        self.listener.close()


def sync_sends(address, topic, count, in_flight=64):
    """`count` sends pipelined `in_flight` deep; (codes seen, seconds, latencies in ms)."""
    codes, latencies = {}, []
    with remoting.RemotingClient.connect(address, timeout_s=20) as client:
        sent_at, opaque, done = {}, 0, 0
        started = time.monotonic()
        while done < count:
            while len(sent_at) < in_flight and opaque < count:
                opaque += 1
                client.send_raw(remoting.encode_request(
                    remoting.SEND_MESSAGE, opaque, remoting.send_message_ext(topic), b"d" * 1024))
                sent_at[opaque] = time.monotonic()
            answer = client.read_frame()
            at = sent_at.pop(answer.opaque, None)
            if at is None:
                continue
            latencies.append((time.monotonic() - at) * 1000)
            codes[answer.code] = codes.get(answer.code, 0) + 1
            done += 1
        return codes, time.monotonic() - started, sorted(latencies)


def test_sync_master_over_a_delayed_link(cluster):
    master = cluster("master", MASTER_IP, role_args=["--brokerRole", "SYNC_MASTER"])
    topic = create_topic(master, "Tdelay")
    host, port = master.broker_addr(0).rsplit(":", 1)
    # Shard 0's HA port through the relay; shard 1 (port + stride) is not used by this test.
    link = DelayedLink("{}:{}".format(host, int(port) + 1))
    print("link delay: a userspace relay, {} ms each way (works where tc netem is missing, as "
          "on kernels without sch_netem)".format(
        LINK_DELAY_S * 1000))
    try:
        cluster("slave", SLAVE_IP, role_args=[
            "--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest",
            "--haMasterAddress", link.address])
        wait_until(lambda: runtime_info(master.broker_addr(0))["haSlaveInSync"] == "true", 30,
                   message="the slave to connect through the relay")
        codes, seconds, latencies = sync_sends(master.broker_addr(0), topic, 3000)
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        print("SYNC_MASTER over a 5 ms link: {} sends in {:.2f} s ({:.0f}/s), codes {}, latency "
              "p50 {:.1f} ms p99 {:.1f} ms".format(3000, seconds, 3000 / seconds, codes, p50, p99))
        assert codes == {remoting.SUCCESS: 3000}, codes
        assert p50 >= LINK_DELAY_S * 2 * 1000, "every answer waited for the slave's report"
    finally:
        link.close()


@pytest.mark.long
def test_a_slave_with_another_shard_count_says_so(cluster):
    master = cluster("master", MASTER_IP)
    slave = cluster("slave", SLAVE_IP, shards=1, role_args=["--brokerRole", "SLAVE",
                                                            "--brokerId", "1"])
    wait_until(lambda: "the master node runs {} shard(s)".format(master.shards)
               in slave.log_tail(100), 60, interval_s=0.5,
               message="the slave to say the shard counts differ")
    note = runtime_info(slave.broker_addr(0))["haShardCountMismatch"]
    print(note)
    assert "same --shards" in note


class UnroutedBroker(Broker):
    """A broker that may never print its ready line (the namesrv refuses it): started once
    its broker port listens."""

    def _start_once(self):
        return start_listening(self, self.broker_addr(0), "the broker")


def admin(node, *args):
    """`shardmq admin <args>` against node's namesrv: (exit status, stdout, stderr)."""
    done = subprocess.run([node.binary, "admin", *args, "-n", node.namesrv_addr],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def master_of(node, broker_name):
    """The address the namesrv lists as brokerId 0 of `broker_name`, or None."""
    import json
    with remoting.RemotingClient.connect(node.namesrv_addr) as client:
        answer = client.call(106)  # GET_BROKER_CLUSTER_INFO
    table = json.loads(answer.body)["brokerAddrTable"]
    return table.get(broker_name, {}).get("brokerAddrs", {}).get("0")


def test_promotion_by_hand_and_the_old_master_back_as_a_slave(cluster):
    slave_args = ["--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest"]
    master = cluster("master", MASTER_IP)
    slave = cluster("slave", SLAVE_IP, role_args=slave_args)
    topic = create_topic(master, "Tpromote")
    first = build_messages(topic, 1000)
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, first)
    wait_caught_up(master, slave)
    wait_slave_routed(master, topic)
    # While the master lives, a promotion would make two masters: refused.
    status, _, err = admin(slave, "promote", "--node", SLAVE_IP, "--yes")
    print("promote with the master alive:", status, err.strip()[-300:])
    assert status == 1 and "still connected" in err, err
    # The master takes sends the slave never gets (ASYNC), then dies.
    assert slave.stop() == 0
    only_on_old = build_messages(topic, 300)
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, only_on_old)
    time.sleep(1.5)  # its async flush writes them: they outlive the kill
    old_end = int(runtime_info(master.broker_addr(0))["commitLogMaxOffset"])
    master.process.kill()
    master.process.wait(10)
    master._reap()
    slave.start(keep_ports=True)
    # Without --yes: the warning, and nothing changes.
    status, out, err = admin(slave, "promote", "--node", SLAVE_IP)
    print("promote without --yes:", status, err.strip())
    assert status == 1 and "ASYNC_MASTER" in err and "nothing promoted" in err, err
    assert runtime_info(slave.broker_addr(0))["brokerRole"] == "SLAVE"
    status, out, err = admin(slave, "promote", "--node", SLAVE_IP, "--yes")
    print("promote --yes:", status, out, err.strip())
    assert status == 0, err
    for shard in range(slave.shards):
        info = runtime_info(slave.broker_addr(shard))
        assert info["brokerRole"] == "ASYNC_MASTER", info
        start = int(info["haEpoch"].split("@")[0])
        assert start == int(info["commitLogMaxOffset"]), info
        if shard == 0:
            epoch_start = start
            assert start < old_end, (start, old_end)
    # A master becomes a slave only by a restart.
    with remoting.RemotingClient.connect(slave.broker_addr(0)) as client:
        demote = client.call(25, body=b"brokerRole=SLAVE\nbrokerId=1\n")  # UPDATE_BROKER_CONFIG
    assert demote.code != remoting.SUCCESS and "only by a restart" in demote.remark, demote
    wait_until(lambda: all(master_of(slave, "broker-{}".format(i)) == slave.broker_addr(i)
                           for i in range(slave.shards)), 30, interval_s=0.2,
               message="the namesrv to route every broker name to the promoted node")
    # The promoted node takes sends, and serves everything it had and took.
    after = build_messages(topic, 500)
    with closing(make_producer(slave.namesrv_addr)) as producer:
        send_all(producer, topic, after)
    collector = Collector()
    wanted = {item.key for item in first + after}
    with closing(make_consumer(slave.namesrv_addr, topic, collector, group=unique("cg_p"))):
        wait_until(lambda: wanted <= collector.keys(), CONSUME_TIMEOUT_S, interval_s=0.5,
                   message="every message the promoted node holds")
    lost = {item.key for item in only_on_old} & collector.keys()
    print("after the promotion: {} of {} consumed; of the 300 only the old master had, {} "
          "seen".format(len(wanted & collector.keys()), len(wanted), len(lost)))
    # The old master, back as a master, is refused by the namesrv and takes no writes.
    old = cluster("master", MASTER_IP, kind=UnroutedBroker)
    wait_until(lambda: "another master holds this broker name" in old.log_tail(200), 30,
               interval_s=0.3, message="the old master to learn it was replaced")
    with remoting.RemotingClient.connect(old.broker_addr(0)) as client:
        refused = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                              remoting.send_message_ext(topic), body=b"x")
    print("a send to the replaced master:", refused.code, refused.remark)
    assert refused.code == remoting.SERVICE_NOT_AVAILABLE and "replaced" in refused.remark
    assert master_of(slave, "broker-0") == slave.broker_addr(0)
    old.process.kill()
    old.process.wait(10)
    old._reap()
    # Back as a slave, its tail past the epoch start is another log's: it does not replicate.
    old = cluster("master", MASTER_IP, role_args=["--brokerRole", "SLAVE", "--brokerId", "1"])
    wait_until(lambda: runtime_info(old.broker_addr(0))["haDiverged"] != "", 30, interval_s=0.3,
               message="the old master, as a slave, to refuse its diverged log")
    note = runtime_info(old.broker_addr(0))["haDiverged"]
    print("old master as a slave:", note)
    assert "past offset" in note
    assert epoch_start < int(runtime_info(old.broker_addr(0))["commitLogMaxOffset"]) == old_end
    assert old.stop() == 0
    # With haResetWhenBehind it discards its store and copies the promoted node's.
    old = cluster("master", MASTER_IP, role_args=[
        "--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest",
        "--ha-reset-when-behind", "true"])
    wait_caught_up(slave, old)
    time.sleep(1.0)
    for shard in range(slave.shards):
        end = int(runtime_info(slave.broker_addr(shard))["commitLogMaxOffset"])
        assert segment_checksums(slave, shard, end) == segment_checksums(old, shard, end)
    print("the old master, reset, holds the promoted node's log byte for byte")


@pytest.mark.long
def test_the_master_returns_and_takes_back_the_offsets(cluster):
    master = cluster("master", MASTER_IP)
    slave = cluster("slave", SLAVE_IP, role_args=["--brokerRole", "SLAVE", "--brokerId", "1",
                                                  "--ha-start-from", "oldest"])
    topic = create_topic(master, "Treturn")
    first = build_messages(topic, 1000)
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, first)
    wait_caught_up(master, slave)
    wait_slave_routed(master, topic)
    master.process.kill()
    master.process.wait(10)
    master._reap()
    group = unique("cg_back")
    collector = Collector()
    with closing(make_consumer(master.namesrv_addr, topic, collector, group=group)):
        wait_until(lambda: {i.key for i in first} <= collector.keys(), CONSUME_TIMEOUT_S,
                   interval_s=0.5, message="every message, from the slave")
        # The client commits its offsets every 5 s; a fixed 6 s wait once saw one queue's
        # commit from before its last 29 messages (they came again from the returned master).
        wait_until(lambda: all(
            remoting.query_consumer_offset(slave.broker_addr(shard), group, topic, queue)
            == remoting.max_offset(slave.broker_addr(shard), topic, queue)
            for shard in range(slave.shards) for queue in range(4)), 30, interval_s=0.5,
            message="the client to commit every consumed offset on the slave")
    committed = {}
    for shard in range(slave.shards):
        for queue in range(4):
            committed[(shard, queue)] = remoting.query_consumer_offset(
                slave.broker_addr(shard), group, topic, queue)
    print("offsets committed on the slave:", committed)
    assert all(offset is not None and offset > 0 for offset in committed.values()), committed
    master = cluster("master", MASTER_IP)

    def handed_back():
        return all(remoting.query_consumer_offset(master.broker_addr(shard), group, topic, queue)
                   == offset for (shard, queue), offset in committed.items())
    wait_until(handed_back, 40, interval_s=0.5,
               message="the slave to hand its offsets back to the master")
    # The slave replicates again, and the group resumes where it was on the slave.
    more = build_messages(topic, 500)
    with closing(make_producer(master.namesrv_addr)) as producer:
        send_all(producer, topic, more)
    wait_caught_up(master, slave)
    again = Collector()
    with closing(make_consumer(master.namesrv_addr, topic, again, group=group)):
        wait_until(lambda: {i.key for i in more} <= again.keys(), CONSUME_TIMEOUT_S,
                   interval_s=0.5, message="the new messages, from the returned master")
        time.sleep(2)
    repeated = {i.key for i in first} & again.keys()
    print("the group on the returned master: {} new received, {} of the earlier 1000 again"
          .format(len(again.keys()) - len(repeated), len(repeated)))
    assert not repeated


FALL_BEHIND_ARGS = ["--allocation-window-mib", "64", "--fileReservedTime", "0.0002",
                    "--deleteWhen", ";".join(str(hour) for hour in range(24)),
                    "--cleanResourceInterval", "500"]


def test_a_slave_behind_the_retained_range_resets_when_asked(cluster):
    master = cluster("master", MASTER_IP, shards=1, segment_size_mib=4,
                     extra_args=FALL_BEHIND_ARGS)
    slave_args = ["--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest"]
    slave = cluster("slave", SLAVE_IP, shards=1, segment_size_mib=4, role_args=slave_args)
    topic = create_topic(master, "Tbehind")
    body = b"b" * (256 << 10)
    with remoting.RemotingClient.connect(master.broker_addr(0), timeout_s=20) as client:
        def send(count):
            for _ in range(count):
                answer = remoting.call_retrying_busy(
                    client, remoting.SEND_MESSAGE, remoting.send_message_ext(topic), body)
                assert answer.code == remoting.SUCCESS, answer
        send(8)
        wait_caught_up(master, slave)
        assert slave.stop() == 0
        send(64)  # 16 MiB: the segments the slave lacks go, with fileReservedTime 0.72 s
    wait_until(lambda: int(runtime_info(master.broker_addr(0))["commitLogMinOffset"]) > 0, 30,
               interval_s=0.3, message="the master to delete its oldest segments")
    master_min = int(runtime_info(master.broker_addr(0))["commitLogMinOffset"])
    slave = cluster("slave", SLAVE_IP, shards=1, segment_size_mib=4, role_args=slave_args)
    wait_until(lambda: runtime_info(slave.broker_addr(0))["slaveFallBehindMuch"] != "", 30,
               interval_s=0.3, message="the slave to say it fell behind")
    print("without haResetWhenBehind:", runtime_info(slave.broker_addr(0))["slaveFallBehindMuch"])
    assert slave.stop() == 0
    slave = cluster("slave", SLAVE_IP, shards=1, segment_size_mib=4,
                    role_args=slave_args + ["--ha-reset-when-behind", "true"])
    wait_caught_up(master, slave)
    ours, theirs = runtime_info(master.broker_addr(0)), runtime_info(slave.broker_addr(0))
    print("with it: the slave holds [{}, {}), the master [{}, {})".format(
        theirs["commitLogMinOffset"], theirs["commitLogMaxOffset"], ours["commitLogMinOffset"],
        ours["commitLogMaxOffset"]))
    assert int(theirs["commitLogMinOffset"]) >= master_min
    time.sleep(1.0)
    end = int(ours["commitLogMaxOffset"])
    start = int(theirs["commitLogMinOffset"])
    mine = {k: v for k, v in segment_checksums(master, 0, end).items() if k >= start}
    assert mine and mine == segment_checksums(slave, 0, end)


def test_a_master_that_lost_its_tail_to_a_power_cut_is_not_continued_by_its_slave(
        cluster, tmp_path):
    """The HA stream sends what the master wrote before it is durable: after a power cut the
    master's log may end before bytes its slave already holds, and the records it takes next
    get those offsets. The master begins an epoch at its recovered end, and the slave, past
    it, refuses to continue (haDiverged) instead of keeping the lost tail and missing the new
    records. The master's disk is the test's (powercut.py); ASYNC_FLUSH keeps its tail
    unflushed for up to half a second."""
    from powercut import forget_light_checkpoints, mounted_image, power_cut_disk
    slave_args = ["--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest"]
    link = tmp_path / "master"
    with power_cut_disk(1024) as disk:
        os.symlink(disk.mount_point, str(link))
        master = cluster("master", MASTER_IP, shards=1)
        slave = cluster("slave", SLAVE_IP, shards=1, role_args=slave_args)
        topic = "Tcut"
        assert remoting.create_topic(master.broker_addr(0), topic, 4).code == 0
        load = Load(master.broker_addr(0), topic)
        time.sleep(3)
        image = os.path.join(disk.workdir, "cut.img")
        counts = disk.cut(image, seed=1)
        load.stop()
        master.kill9()
        slave_end = int(runtime_info(slave.broker_addr(0))["commitLogMaxOffset"])
        os.unlink(str(link))
        with mounted_image(image) as mount_point:
            os.symlink(mount_point, str(link))
            forget_light_checkpoints(mount_point)
            master.start(keep_ports=True)
            info = runtime_info(master.broker_addr(0))
            master_end = int(info["commitLogMaxOffset"])
            print("cut ({}): the master's log ends at {} (epoch {}), the slave's at {}".format(
                counts, master_end, info["haEpoch"], slave_end))
            if master_end >= slave_end:
                master.stop()
                pytest.skip("could not show it: the cut left the master all the slave had")
            assert int(info["haEpoch"].split("@")[0]) == master_end, info
            # The master takes more: past the slave's end, at offsets the slave holds others'.
            with remoting.RemotingClient.connect(master.broker_addr(0)) as client:
                while int(runtime_info(master.broker_addr(0))["commitLogMaxOffset"]) \
                        <= slave_end + 4096:
                    client.call(remoting.SEND_MESSAGE, remoting.send_message_ext(topic, -1),
                                body=b"y" * 4096)
            wait_until(lambda: runtime_info(slave.broker_addr(0))["haDiverged"] != "", 30,
                       interval_s=0.3, message="the slave to refuse the master's new epoch")
            note = runtime_info(slave.broker_addr(0))["haDiverged"]
            print("the slave:", note)
            assert "past offset {}".format(master_end) in note, note
            time.sleep(2)
            assert int(runtime_info(slave.broker_addr(0))["commitLogMaxOffset"]) == slave_end
            assert master.stop() == 0
            os.unlink(str(link))


@pytest.mark.parametrize("flush,role", [("sync", "ASYNC_MASTER"), ("async", "ASYNC_MASTER"),
                                        ("async", "SYNC_MASTER")])
@pytest.mark.long
def test_a_master_killed_under_load_is_continued_by_its_slave(cluster, flush, role):
    """The stream sends only what a crash of the master keeps (durable bytes under
    SYNC_FLUSH, written ones under ASYNC_FLUSH, whose appends wait in memory up to
    flushIntervalCommitLog): a master killed under load comes back with at least what its
    slave holds, and the slave goes on (no haDiverged), ending with the master's bytes. (A
    stream of appended bytes left the slave ahead of the recovered log in 1 of 3 such kills
    under SYNC_FLUSH, and made it halt after most under ASYNC_FLUSH.) A SYNC_MASTER has its
    appends written at once for the slave that its sends wait for."""
    slave_args = ["--brokerRole", "SLAVE", "--brokerId", "1", "--ha-start-from", "oldest"]
    master = cluster("master", MASTER_IP, shards=1, flush=flush,
                     role_args=["--brokerRole", role])
    slave = cluster("slave", SLAVE_IP, shards=1, role_args=slave_args)
    topic = "Tkilled"
    assert remoting.create_topic(master.broker_addr(0), topic, 4).code == 0
    for round_number in range(3):
        load = Load(master.broker_addr(0), topic, threads=4)
        time.sleep(2)
        master.kill9()
        load.stop()
        slave_end = int(runtime_info(slave.broker_addr(0))["commitLogMaxOffset"])
        master.start(keep_ports=True)
        master_end = int(runtime_info(master.broker_addr(0))["commitLogMaxOffset"])
        print("kill {}: the master's log ends at {}, the slave's at {}".format(
            round_number + 1, master_end, slave_end))
        assert slave_end <= master_end
        wait_caught_up(master, slave)
        assert runtime_info(slave.broker_addr(0))["haDiverged"] == ""
    time.sleep(1.0)  # the slave's async flush writes its last bytes
    end = int(runtime_info(master.broker_addr(0))["commitLogMaxOffset"])
    assert segment_checksums(master, 0, end) == segment_checksums(slave, 0, end)

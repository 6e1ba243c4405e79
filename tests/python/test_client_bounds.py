"""Bounds per client on the real binary (issue 16): a profile sets
network.connections_per_address_max and network.partial_frame_timeout_ms low; 10,000
connection attempts from one address get the cap's refusal (closed at once, a log line) while
the shard's RSS stays within budget and a client from another address is served throughout;
a connection that sends part of a frame and stalls, or trickles it, is closed once the frame
is late, and the log says why.
"""

import resource
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import remoting
from mq import create_topic, unique

PER_ADDRESS_MAX = 64
PARTIAL_FRAME_TIMEOUT_MS = 1500
ATTEMPTS = 10000
OTHER_ADDRESS = "127.0.0.2"
# What 10,000 refused attempts may add to the broker's RSS (they are closed at once).
RSS_BUDGET_BYTES = 32 * 1024 * 1024

PROFILE = """\
[network]
connections_per_address_max = {}
partial_frame_timeout_ms = {}
""".format(PER_ADDRESS_MAX, PARTIAL_FRAME_TIMEOUT_MS)


def start(shardmq_factory, tmp_path):
    profile = tmp_path / "bounds.toml"
    profile.write_text(PROFILE)
    return shardmq_factory(extra_args=["--profile", str(profile)])


def rss_bytes(pid):
    with open("/proc/{}/status".format(pid)) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def closed_by_server(sock, timeout_s):
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def listeners(port):
    """What `ss` shows listening on the port, with the processes."""
    shown = subprocess.run(["ss", "-ltnp", "sport = :{}".format(port)], capture_output=True,
                           text=True)
    return shown.stdout + shown.stderr


def workarounds(client):
    """The broker's counters of the runtime workarounds that mattered (runtime info)."""
    table = remoting.runtime_table(client)
    return {key: value for key, value in table.items() if key.startswith("workaround")}


def send_one(client, topic, index):
    response = remoting.call_retrying_busy(
        client, remoting.SEND_MESSAGE, remoting.send_message_ext(topic, 0),
        body="bounds {}".format(index).encode())
    assert response.code == remoting.SUCCESS, response


def test_one_address_cannot_take_every_connection(shardmq_factory, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, PER_ADDRESS_MAX + 4096), hard))
    node = start(shardmq_factory, tmp_path)
    topic = create_topic(node, "Tbounds", queue_nums=1)
    host, port = node.broker_addr(0).rsplit(":", 1)
    well_behaved = remoting.RemotingClient(host, int(port), source_ip=OTHER_ADDRESS)
    send_one(well_behaved, topic, 0)
    before = rss_bytes(node.process.pid)

    held = [socket.create_connection((host, int(port))) for _ in range(PER_ADDRESS_MAX)]
    refused = 0
    started = time.monotonic()
    for attempt in range(ATTEMPTS):
        try:
            sock = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            refused += 1
            continue
        if not closed_by_server(sock, 5):
            # Not 10,000 times 5 s: the first late one fails the test, with what explains it.
            sock.close()
            raise AssertionError(
                "attempt {} past the cap was not closed within 5 s ({} refused before it); "
                "listening on port {}:\n{}\nbroker's workaround counters: {}".format(
                    attempt, refused, port, listeners(port), workarounds(well_behaved)))
        refused += 1
        sock.close()
        if attempt % 1000 == 0:
            send_one(well_behaved, topic, attempt + 1)
    elapsed = time.monotonic() - started
    after = rss_bytes(node.process.pid)
    print("{} attempts past the cap in {:.1f} s: {} refused; RSS {:.1f} -> {:.1f} MiB; "
          "workaround counters {}".format(ATTEMPTS, elapsed, refused, before / 2**20,
                                          after / 2**20, workarounds(well_behaved)))
    assert refused == ATTEMPTS
    assert after - before < RSS_BUDGET_BYTES
    # The connections within the cap are served.
    with remoting.RemotingClient.connect(node.broker_addr(1)) as other_shard:
        send_one(other_shard, topic, -1)
    probe = held[0]
    probe.sendall(remoting.encode_request(remoting.GET_MAX_OFFSET, 7,
                                          {"topic": topic, "queueId": 0}))
    probe.settimeout(5)
    assert len(probe.recv(4)) == 4
    for sock in held:
        sock.close()
    # Places come back once connections close.
    came_back = None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sock = socket.create_connection((host, int(port)))
        if not closed_by_server(sock, 0.3):
            came_back = sock
            break
        sock.close()
    assert came_back is not None, "no place came back after the held connections closed"
    came_back.close()
    send_one(well_behaved, topic, ATTEMPTS + 1)
    well_behaved.close()
    assert "network.connections_per_address_max" in node.log_tail(), node.log_tail()


def test_a_stalled_or_trickled_frame_closes_its_connection(shardmq_factory, tmp_path):
    node = start(shardmq_factory, tmp_path)
    topic = create_topic(node, "Tpartial", queue_nums=1)
    host, port = node.broker_addr(0).rsplit(":", 1)
    # A header that announces a 15 MiB frame, then a little of it.
    claimed = 15 * 1024 * 1024
    start_of_frame = struct.pack(">i", claimed) + struct.pack(">I", 100) + b"{" * 60

    stalled = socket.create_connection((host, int(port)))
    stalled.sendall(start_of_frame)
    trickled = socket.create_connection((host, int(port)))
    trickled.sendall(start_of_frame)
    began = time.monotonic()
    trickled_closed_at = None
    while time.monotonic() - began < PARTIAL_FRAME_TIMEOUT_MS / 1000 * 6:
        try:
            trickled.sendall(b"x" * 1024)
        except OSError:
            trickled_closed_at = time.monotonic() - began
            break
        if closed_by_server(trickled, 0.1):
            trickled_closed_at = time.monotonic() - began
            break
    assert closed_by_server(stalled, 5)
    stalled_closed_at = time.monotonic() - began
    print("stalled frame closed after {:.2f} s, trickled after {}".format(
        stalled_closed_at, trickled_closed_at))
    assert trickled_closed_at is not None, "the trickling connection stayed open"
    assert PARTIAL_FRAME_TIMEOUT_MS / 1000 * 0.9 <= trickled_closed_at
    # A client that sends whole frames, however slowly, is not affected.
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for _ in range(3):
            response = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
            assert response.code == remoting.SUCCESS, response
            time.sleep(PARTIAL_FRAME_TIMEOUT_MS / 1000 * 0.6)
    assert "network.partial_frame_timeout_ms" in node.log_tail()


ARRIVING_FRAMES_MAX_MIB = 16
STALLED_FRAMES = 6
STALLED_FRAME_BYTES = 15 * 1024 * 1024
# What the stalled frames may add to the broker's RSS: one of them (only one fits the room)
# and slack; without the room they would add all six (90 MiB).
ARRIVING_RSS_BUDGET_BYTES = 40 * 1024 * 1024
# A whole large send while stalled frames hold the room: in once their time runs out.
LARGE_SEND_BYTES = 3 * 1024 * 1024


def test_frames_still_arriving_take_bounded_memory(shardmq_factory, tmp_path):
    """Connections that each send most of a 15 MiB frame and stall: the shard reads one such
    frame at a time (network.arriving_frames_max_mib = 16), the others wait unread and are
    closed when their frame's time runs out; small requests and a large whole send are
    served meanwhile."""
    profile = tmp_path / "arriving.toml"
    profile.write_text("[network]\npartial_frame_timeout_ms = {}\narriving_frames_max_mib = {}\n"
                       .format(PARTIAL_FRAME_TIMEOUT_MS, ARRIVING_FRAMES_MAX_MIB))
    node = shardmq_factory(extra_args=["--profile", str(profile)])
    topic = create_topic(node, "Tarriving", queue_nums=1)
    host, port = node.broker_addr(0).rsplit(":", 1)
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        send_one(client, topic, 0)
    before = rss_bytes(node.process.pid)
    header = b"{" * 100
    start_of_frame = struct.pack(">i", STALLED_FRAME_BYTES) + struct.pack(">I", len(header)) \
        + header
    stalled = []
    errors = []

    def send_most_of_a_frame(sock):
        try:
            sock.sendall(start_of_frame + b"x" * (STALLED_FRAME_BYTES - 1024 * 1024))
        except OSError as error:  # closed by the broker while blocked: expected
            errors.append(error)

    senders = []
    for _ in range(STALLED_FRAMES):
        sock = socket.create_connection((host, int(port)))
        stalled.append(sock)
        sender = threading.Thread(target=send_most_of_a_frame, args=(sock,), daemon=True)
        sender.start()
        senders.append(sender)
    time.sleep(PARTIAL_FRAME_TIMEOUT_MS / 1000 / 2)
    held = rss_bytes(node.process.pid)
    # Small requests are served while the room is taken.
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        answer = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
        assert answer.code == remoting.SUCCESS, answer
        # A whole large send waits for room and gets in.
        began = time.monotonic()
        large = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                            remoting.send_message_ext(topic, 0),
                                            body=b"L" * LARGE_SEND_BYTES, timeout_s=30)
        waited = time.monotonic() - began
    assert large.code == remoting.SUCCESS, large
    closed = [closed_by_server(sock, PARTIAL_FRAME_TIMEOUT_MS / 1000 * 4) for sock in stalled]
    for sock in stalled:
        sock.close()
    print("RSS {:.1f} MiB before, {:.1f} MiB with {} frames stalled; the large send waited "
          "{:.2f} s; stalled connections closed: {}".format(
              before / 2**20, held / 2**20, STALLED_FRAMES, waited, closed))
    assert held - before < ARRIVING_RSS_BUDGET_BYTES
    assert all(closed), "a stalled frame's connection stayed open"
    log = node.log_tail(400)
    assert "network.arriving_frames_max_mib" in log, log


SHARD_OUTPUT_MAX_MIB = 16
OUTPUT_PAUSE_KIB = 4096
NON_READERS = 12
PULLS_EACH = 100
STORED_MESSAGE_BYTES = 8 * 1024
STORED_MESSAGES = 512
# What the non-reading connections may add to the broker's RSS: the shard's bound and one
# answer each (19 MiB), with slack; without the bound they hold output_pause_kib each (48 MiB).
NON_READERS_RSS_BUDGET_BYTES = 34 * 1024 * 1024


def test_clients_that_pull_and_never_read_hold_bounded_output(shardmq_factory, tmp_path):
    """Connections that pipeline pulls and never read the answers: the shard's output stops
    at network.shard_output_max_mib (16) instead of output_pause_kib on each, and a consumer
    that reads still gets its messages meanwhile."""
    profile = tmp_path / "output.toml"
    profile.write_text("[network]\noutput_pause_kib = {}\nshard_output_max_mib = {}\n".format(
        OUTPUT_PAUSE_KIB, SHARD_OUTPUT_MAX_MIB))
    node = shardmq_factory(extra_args=["--profile", str(profile)])
    topic = create_topic(node, "Toutput", queue_nums=1)
    host, port = node.broker_addr(0).rsplit(":", 1)
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for index in range(STORED_MESSAGES):
            response = remoting.call_retrying_busy(
                client, remoting.SEND_MESSAGE, remoting.send_message_ext(topic, 0),
                body=bytes([index % 256]) * STORED_MESSAGE_BYTES)
            assert response.code == remoting.SUCCESS, response
    before = rss_bytes(node.process.pid)
    non_readers = []
    for index in range(NON_READERS):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        pulls = b"".join(
            remoting.encode_request(remoting.PULL_MESSAGE, opaque + 1, remoting.pull_message_ext(
                "Gnever_reads{}".format(index), topic, 0, (opaque * 32) % STORED_MESSAGES))
            for opaque in range(PULLS_EACH))
        sock.sendall(pulls)
        non_readers.append(sock)
    time.sleep(2)
    held = rss_bytes(node.process.pid)
    # A consumer that reads gets every message meanwhile.
    received = 0
    with remoting.RemotingClient.connect(node.broker_addr(0), timeout_s=30) as client:
        offset = 0
        while offset < STORED_MESSAGES:
            answer = client.call(remoting.PULL_MESSAGE,
                                 remoting.pull_message_ext("Greads", topic, 0, offset))
            assert answer.code == remoting.SUCCESS, answer
            records = list(remoting.stored_records(answer.body))
            assert records and records[0][0] == offset, (offset, records[:1])
            received += len(records)
            offset = int(answer.ext["nextBeginOffset"])
    for sock in non_readers:
        sock.close()
    print("RSS {:.1f} MiB before, {:.1f} MiB with {} connections not reading; a reading "
          "consumer got {} messages".format(before / 2**20, held / 2**20, NON_READERS,
                                            received))
    assert received == STORED_MESSAGES
    assert held - before < NON_READERS_RSS_BUDGET_BYTES


HA_CONNECTIONS_MAX = 64
METRICS_CONNECTIONS_MAX = 256
PAST_THE_CAP = 10


def connections_closed_at_once(address, count):
    """Opens `count` connections to `address` and sends nothing; returns them and how many
    the server closed within a second."""
    held = [socket.create_connection(address) for _ in range(count)]
    time.sleep(1)
    closed = 0
    for sock in held:
        sock.setblocking(False)
        try:
            closed += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except ConnectionResetError:
            closed += 1
    return held, closed


def test_the_ha_and_metrics_ports_serve_a_bounded_number_of_connections(shardmq_factory):
    """Neither port can take the process's descriptors (they count in its budget): past its
    cap a connection is closed at once, with a log line, and places come back."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    node = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    host, port = node.broker_addr(0).rsplit(":", 1)
    ports = {"HA": ((host, int(port) + 1), HA_CONNECTIONS_MAX),
             "metrics": (("127.0.0.1", metrics_port), METRICS_CONNECTIONS_MAX)}
    for what, (address, cap) in ports.items():
        held, closed = connections_closed_at_once(address, cap + PAST_THE_CAP)
        for sock in held:
            sock.close()
        assert closed == PAST_THE_CAP, "{} port: {} of {} closed at once, want {}".format(
            what, closed, cap + PAST_THE_CAP, PAST_THE_CAP)
        assert "to the {} port: it serves {} at once".format(what, cap) in node.log_tail(400)
    time.sleep(0.5)
    # Places come back: the metrics port answers again, and an HA connection stays open.
    with urllib.request.urlopen("http://127.0.0.1:{}/metrics".format(metrics_port),
                                timeout=10) as answer:
        assert answer.status == 200
    held, closed = connections_closed_at_once(ports["HA"][0], 1)
    held[0].close()
    assert closed == 0, "an HA connection under the cap was closed"


TOPICS_MAX = 100000
PIPELINED_CREATES = 500


def test_no_topic_is_created_past_the_most_a_broker_holds(shardmq_factory):
    """UPDATE_AND_CREATE_TOPIC (pipelined) up to TOPICS_MAX and past it: the ones past it, and
    a send that would auto-create another, are refused with a remark that says why; topics
    held still take sends."""
    node = shardmq_factory()
    answers = {}
    with remoting.RemotingClient.connect(node.broker_addr(0), timeout_s=120) as client:
        for start in range(0, TOPICS_MAX, PIPELINED_CREATES):
            names = range(start, min(TOPICS_MAX, start + PIPELINED_CREATES))
            client.send_raw(b"".join(remoting.encode_request(
                remoting.UPDATE_AND_CREATE_TOPIC, index + 1, {
                    "topic": "Tcap{}".format(index), "defaultTopic": "TBW102",
                    "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
                    "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"})
                for index in names))
            for _ in names:
                answer = client.read_frame()
                answers.setdefault(answer.code, answer.remark)
                if answer.code != remoting.SUCCESS:
                    answers[answer.code, "count"] = answers.get((answer.code, "count"), 0) + 1
        refused = answers.get((remoting.SYSTEM_ERROR, "count"), 0)
        print("creates answered {}".format(answers))
        # The built-in topics count: the last few creates are the ones past the cap.
        assert 1 <= refused < 20, answers
        assert "already holds {} topics".format(TOPICS_MAX) in answers[remoting.SYSTEM_ERROR]
        sent = client.call(remoting.SEND_MESSAGE, remoting.send_message_ext(unique("Tauto")),
                           body=b"x")
        assert sent.code == remoting.SYSTEM_ERROR and "is not created" in sent.remark, sent
        sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                           remoting.send_message_ext("Tcap5"), body=b"x")
        assert sent.code == remoting.SUCCESS, sent


CONSUMER_OFFSETS_MAX = 1000000
OFFSET_QUEUES = 1024
PIPELINED_COMMITS = 2000


def commit_ext(group, topic, queue_id, offset=1):
    return {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}


def test_consumer_offsets_are_kept_for_this_brokers_queues_and_up_to_a_bound(shardmq_factory):
    """UPDATE_CONSUMER_OFFSET for a topic the broker lacks or a queue past the topic's is
    refused (as RocketMQ 5 does); past CONSUMER_OFFSETS_MAX queue offsets a new one is
    refused too, while those kept still move."""
    node = shardmq_factory()
    topic = create_topic(node, "Toffsets", queue_nums=OFFSET_QUEUES)
    with remoting.RemotingClient.connect(node.broker_addr(0), timeout_s=120) as client:
        missing = client.call(remoting.UPDATE_CONSUMER_OFFSET,
                              commit_ext("Gx", unique("Tmissing"), 0))
        assert missing.code == remoting.TOPIC_NOT_EXIST, missing
        past = client.call(remoting.UPDATE_CONSUMER_OFFSET,
                           commit_ext("Gx", topic, OFFSET_QUEUES))
        assert past.code == remoting.INVALID_PARAMETER, past
        codes = {}
        total = CONSUMER_OFFSETS_MAX + 10
        for start in range(0, total, PIPELINED_COMMITS):
            indexes = range(start, min(total, start + PIPELINED_COMMITS))
            client.send_raw(b"".join(remoting.encode_request(
                remoting.UPDATE_CONSUMER_OFFSET, index + 1,
                commit_ext("Gcap{}".format(index // OFFSET_QUEUES), topic,
                           index % OFFSET_QUEUES))
                for index in indexes))
            for _ in indexes:
                answer = client.read_frame()
                codes[answer.code] = codes.get(answer.code, 0) + 1
                if answer.code != remoting.SUCCESS:
                    codes["remark"] = answer.remark
        print("commits answered {}".format(codes))
        assert codes.get(remoting.SYSTEM_ERROR) == 10, codes
        assert "already keeps {} consumer offsets".format(CONSUMER_OFFSETS_MAX) \
            in codes["remark"], codes
        moved = client.call(remoting.UPDATE_CONSUMER_OFFSET, commit_ext("Gcap0", topic, 0, 7))
        assert moved.code == remoting.SUCCESS, moved
        # A pull's commitOffset for a queue offset not kept: the pull is served, the commit
        # is not kept (and logged).
        pull = remoting.pull_message_ext("Gpullcommit", topic, 0)
        pull.update({"sysFlag": 5, "commitOffset": 3})
        pulled = client.call(remoting.PULL_MESSAGE, pull)
        assert pulled.code in (remoting.PULL_NOT_FOUND, remoting.SUCCESS), pulled
    assert remoting.query_consumer_offset(node.broker_addr(0), "Gcap0", topic, 0) == 7
    assert remoting.query_consumer_offset(node.broker_addr(0), "Gpullcommit", topic, 0) != 3
    assert "a pull's commitOffset: this broker already keeps" in node.log_tail(400)


KV_BYTES_MAX = 16 * 1024 * 1024
KV_VALUE_BYTES = 8 * 1024 * 1024


def test_the_namesrvs_kv_config_holds_a_bounded_number_of_bytes(shardmq_factory):
    """PUT_KV_CONFIG values of 8 MiB: the first is kept and may be replaced, a second key of
    that size would pass the 16 MiB bound and is refused, small entries still go in."""
    node = shardmq_factory()
    large = "v" * KV_VALUE_BYTES
    with remoting.RemotingClient.connect(node.namesrv_addr, timeout_s=60) as client:
        def put(key, value):
            return client.call(remoting.PUT_KV_CONFIG, {"namespace": "Nbound", "key": key,
                                                        "value": value})
        assert put("k1", large).code == remoting.SUCCESS
        assert put("k1", large[:-1] + "w").code == remoting.SUCCESS, "a replacement fits"
        refused = put("k2", large)
        assert refused.code == remoting.SYSTEM_ERROR, refused
        assert "past the limit of {}".format(KV_BYTES_MAX) in refused.remark, refused.remark
        assert put("k3", "small").code == remoting.SUCCESS
        got = client.call(remoting.GET_KV_CONFIG, {"namespace": "Nbound", "key": "k2"})
        assert got.code == remoting.QUERY_NOT_FOUND, got


def test_memory_of_closed_connections_goes_back(shardmq_factory):
    # 4,000 connections (from two loopback addresses, under the per-address cap), each with
    # the start of a frame in its buffer, then all closed: the shard gives most of what they
    # took back to the system (glibc keeps freed blocks unless asked: malloc_trim).
    count = 4000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    node = shardmq_factory(shards=1)
    host, port = node.broker_addr(0).rsplit(":", 1)
    before = rss_bytes(node.process.pid)
    socks = []
    for index in range(count):
        source = ("127.0.0.{}".format(2 + index * 2 // count), 0)
        sock = socket.create_connection((host, int(port)), source_address=source)
        sock.sendall(struct.pack(">i", 2000) + b"\0" * 100)
        socks.append(sock)
    time.sleep(1)
    held = rss_bytes(node.process.pid)
    for sock in socks:
        sock.close()
    time.sleep(5)
    after = rss_bytes(node.process.pid)
    print("RSS {:.1f} MiB, with {} connections {:.1f} MiB, after they closed {:.1f} MiB".format(
        before / 2**20, count, held / 2**20, after / 2**20))
    assert after - before < (held - before) / 2, (before, held, after)

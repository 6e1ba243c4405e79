"""The Prometheus endpoint with a real Prometheus server (Debian's `prometheus`, installed by
the test command): it scrapes shardmq's /metrics every second while the C++ client produces
and consumes; through Prometheus's HTTP API, rocketmq_messages_in_total equals what was sent,
rocketmq_messages_out_total what the group received, and rocketmq_consumer_lag_messages of the
group falls to 0 once it has committed.
"""

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from mq import (Collector, build_messages, closing, create_topic, make_consumer, make_producer,
                send_all, unique, wait_for_keys, wait_until)

MESSAGES = 200
SCRAPE_TIMEOUT_S = 60
PROMETHEUS_START_TIMEOUT_S = 30


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def query(prometheus_port, expression):
    """The value of an instant query's single result (None when it has none)."""
    url = "http://127.0.0.1:{}/api/v1/query?query={}".format(
        prometheus_port, urllib.parse.quote(expression))
    with urllib.request.urlopen(url, timeout=5) as answer:
        document = json.load(answer)
    assert document["status"] == "success", document
    results = document["data"]["result"]
    return float(results[0]["value"][1]) if results else None


@pytest.fixture
def prometheus(tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("could not run: no prometheus binary (Debian: apt-get install prometheus; "
                    "scripts/test.sh installs it when it can)")
    started = []

    def start(metrics_port):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: shardmq\n    static_configs:\n"
            "      - targets: ['127.0.0.1:{}']\n".format(metrics_port))
        log = open(str(tmp_path / "prometheus.log"), "w")
        process = subprocess.Popen(
            [binary, "--config.file", str(config), "--storage.tsdb.path",
             str(tmp_path / "tsdb"), "--web.listen-address", "127.0.0.1:{}".format(port)],
            stdout=log, stderr=subprocess.STDOUT)
        started.append(process)

        def ready():
            try:
                with urllib.request.urlopen("http://127.0.0.1:{}/-/ready".format(port),
                                            timeout=1) as answer:
                    return answer.status == 200
            except OSError:
                return False
        wait_until(ready, PROMETHEUS_START_TIMEOUT_S, message="prometheus to be ready")
        return port

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def test_prometheus_sees_what_was_sent_and_the_lag_fall_to_zero(shardmq_factory, prometheus):
    metrics_port = free_port()
    node = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    prometheus_port = prometheus(metrics_port)
    topic = create_topic(node, "Tmetrics")
    group = unique("cg_metrics")
    expected = build_messages(topic, MESSAGES)
    with closing(make_producer(node.namesrv_addr)) as producer:
        send_all(producer, topic, expected)
    sent = 'sum(rocketmq_messages_in_total{{topic="{}"}})'.format(topic)
    wait_until(lambda: query(prometheus_port, sent) == MESSAGES, SCRAPE_TIMEOUT_S,
               interval_s=0.5, message="Prometheus to count {} messages in".format(MESSAGES))

    collector = Collector()
    with closing(make_consumer(node.namesrv_addr, topic, collector, group=group)):
        wait_for_keys([collector], [item.key for item in expected], 60, label="messages")
        out = 'sum(rocketmq_messages_out_total{{topic="{}",consumer_group="{}"}})'.format(
            topic, group)
        wait_until(lambda: (query(prometheus_port, out) or 0) >= MESSAGES, SCRAPE_TIMEOUT_S,
                   interval_s=0.5, message="Prometheus to count the messages out")
        lag = 'sum(rocketmq_consumer_lag_messages{{topic="{}",consumer_group="{}"}})'.format(
            topic, group)
        # The C++ client commits every 5 s; the lag series appears with its first commit.
        wait_until(lambda: query(prometheus_port, lag) == 0, SCRAPE_TIMEOUT_S,
                   interval_s=0.5, message="the group's lag to fall to 0 in Prometheus")
    print("Prometheus: in {}, out {}, lag {}".format(
        query(prometheus_port, sent), query(prometheus_port, out), query(prometheus_port, lag)))
    assert query(prometheus_port, "sum(rocketmq_topic_number)") >= 1
    assert query(prometheus_port, 'up{job="shardmq"}') == 1


UPDATE_CONSUMER_OFFSET = 15
LAGGED_MESSAGES = 5


def scrape(metrics_port):
    url = "http://127.0.0.1:{}/metrics".format(metrics_port)
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def sample_value(text, name, *label_parts):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(part in line for part in label_parts):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_lag_latency_and_timing_messages(shardmq_factory):
    """rocketmq_consumer_lag_latency: ms since the oldest unconsumed message was stored, for
    a group that committed behind the end; rocketmq_timing_messages: a delayed message
    waiting for its level."""
    import remoting
    metrics_port = free_port()
    node = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    topic = create_topic(node, "Tlagged")
    group = unique("cg_lagged")
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for _ in range(LAGGED_MESSAGES):
            sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                               remoting.send_message_ext(topic), body=b"late")
            assert sent.code == remoting.SUCCESS, sent
        delayed = remoting.send_message_ext(topic, properties="DELAY\u00014\u0002")
        sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE, delayed, body=b"d")
        assert sent.code == remoting.SUCCESS, sent
        committed = client.call(UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 0})
        assert committed.code == remoting.SUCCESS, committed
    sent_at = time.time()
    time.sleep(1.5)
    labels = ('topic="{}"'.format(topic), 'consumer_group="{}"'.format(group))
    # The snapshot is up to a second old: the latency grows with it, past the 1.5 s slept.
    wait_until(lambda: (sample_value(scrape(metrics_port), "rocketmq_consumer_lag_latency",
                                     *labels) or 0) >= 1500,
               SCRAPE_TIMEOUT_S, interval_s=0.5, message="the lag latency to pass 1.5 s")
    text = scrape(metrics_port)
    latency_ms = sample_value(text, "rocketmq_consumer_lag_latency", *labels)
    waited_ms = (time.time() - sent_at) * 1000
    assert latency_ms <= waited_ms + 1000, (latency_ms, waited_ms)
    assert sample_value(text, "rocketmq_consumer_lag_messages", *labels) == LAGGED_MESSAGES
    assert sample_value(text, "rocketmq_timing_messages", 'node_id="broker-0"') == 1, (
        [line for line in text.splitlines() if "timing" in line])


PULLED = 3
STORED = 8


def test_inflight_refusals_latency_labels_and_shard_figures(shardmq_factory):
    """rocketmq_consumer_inflight_messages / _ready_messages from a pull that took 3 of 8
    messages with the committed offset at 0; a send to a forbidden topic counted as a refused
    send (reason no_permission) and in rocketmq_rpc_latency under its response code; a
    long-polled pull under is_long_polling="true"; the durable-write histogram, io_uring
    submissions, output waiting, memory by holder and the process's RSS."""
    import remoting
    metrics_port = free_port()
    node = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    topic = create_topic(node, "Tinflight")
    group = unique("cg_inflight")
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for index in range(STORED):
            sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                               remoting.send_message_ext(topic),
                                               body=b"m%d" % index)
            assert sent.code == remoting.SUCCESS, sent
        committed = client.call(UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 0})
        assert committed.code == remoting.SUCCESS, committed
        pulled = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(
            group, topic, 0, queue_offset=0, max_msg_nums=PULLED))
        assert pulled.code == remoting.SUCCESS, pulled
        assert pulled.ext["nextBeginOffset"] == str(PULLED), pulled.ext
        refused = remoting.call_retrying_busy(
            client, remoting.SEND_MESSAGE, remoting.send_message_ext("SCHEDULE_TOPIC_XXXX"),
            body=b"x")
        assert refused.code == 16, refused  # NO_PERMISSION
        # A pull at the end that may wait: parked ~1 s, then answered PULL_NOT_FOUND.
        parked = remoting.pull_message_ext(group, topic, 1, queue_offset=0,
                                           suspend_timeout_ms=1000)
        parked["sysFlag"] = 6  # SUBSCRIPTION | SUSPEND
        started = time.monotonic()
        answer = client.call(remoting.PULL_MESSAGE, parked, timeout_s=10)
        assert answer.code == remoting.PULL_NOT_FOUND, answer
        assert time.monotonic() - started >= 0.9
        labels = ('topic="{}"'.format(topic), 'consumer_group="{}"'.format(group))
        node0 = 'node_id="broker-0"'

        def figures():
            text = scrape(metrics_port)
            inflight = sample_value(text, "rocketmq_consumer_inflight_messages", *labels)
            polled = sample_value(text, "rocketmq_rpc_latency_count", node0,
                                  'request_code="pull_message"',
                                  'response_code="pull_not_found"', 'is_long_polling="true"')
            return text if inflight == PULLED and polled else None
        wait_until(figures, SCRAPE_TIMEOUT_S, interval_s=0.5,
                   message="the shard's snapshot to show the pull and the parked pull")
        text = figures()
        interesting = [line for line in text.splitlines() if not line.startswith("#") and (
            "shardmq_" in line or "inflight" in line or "ready" in line
            or "no_permission" in line or 'is_long_polling="true"' in line)]
        print("\n".join(interesting))
        assert sample_value(text, "rocketmq_consumer_ready_messages", *labels) == STORED - PULLED
        assert sample_value(text, "rocketmq_consumer_lag_messages", *labels) == STORED
        assert sample_value(text, "shardmq_refused_sends_total", node0,
                            'reason="no_permission"') == 1
        assert sample_value(text, "shardmq_refused_sends_total", node0,
                            'reason="time_in_queue"') == 0
        assert sample_value(text, "rocketmq_rpc_latency_count", node0,
                            'request_code="send_message"', 'response_code="no_permission"',
                            'is_long_polling="false"') == 1
        assert sample_value(text, "rocketmq_rpc_latency_count", node0,
                            'request_code="send_message"', 'response_code="success"',
                            'is_long_polling="false"') >= STORED
        parked_ms = sample_value(text, "rocketmq_rpc_latency_sum", node0,
                                 'request_code="pull_message"',
                                 'response_code="pull_not_found"', 'is_long_polling="true"')
        assert 900 <= parked_ms <= 5000, parked_ms
        commits = sample_value(text, "shardmq_durable_write_seconds_count", node0)
        assert commits >= 1
        assert sample_value(text, "shardmq_durable_write_seconds_bucket", node0,
                            'le="+Inf"') == commits
        assert sample_value(text, "shardmq_durable_write_seconds_sum", node0) > 0
        assert sample_value(text, "shardmq_io_uring_submissions_total", node0,
                            'ring="commitlog"') >= commits
        assert sample_value(text, "shardmq_io_uring_enters_total", node0,
                            'ring="commitlog"') >= 1
        assert sample_value(text, "shardmq_io_uring_submissions_total", node0,
                            'ring="executor"') is not None
        assert sample_value(text, "shardmq_memory_bytes", node0,
                            'holder="commitlog_tail"') > 0
        # This client's connection holds a read buffer.
        assert sample_value(text, "shardmq_memory_bytes", node0,
                            'holder="connection_buffers"') >= 4096
        assert sample_value(text, "shardmq_memory_bytes", node0,
                            'holder="consume_queue_maps"') > 0
        assert sample_value(text, "shardmq_output_waiting_bytes", node0) == 0
        assert sample_value(text, "shardmq_process_resident_bytes") > 1 << 20


COLD_MESSAGES = 2500
COLD_BODY = b"c" * 1024


def test_read_cache_counters_of_pulls_from_disk(shardmq_factory):
    """shardmq_read_cache_*_total: after a restart, what was stored before is on disk only;
    pulls walking it read windows of the log into the read cache (a miss) and find the next
    records there (hits), which the shard's counters show."""
    import remoting
    metrics_port = free_port()
    node = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    topic = create_topic(node, "Tcold")
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for _ in range(COLD_MESSAGES):
            sent = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                               remoting.send_message_ext(topic), body=COLD_BODY)
            assert sent.code == remoting.SUCCESS, sent
    node.restart(allow_port_change=False)
    group = unique("cg_cold")
    offset = 0
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        while offset < COLD_MESSAGES // 2:
            pulled = client.call(remoting.PULL_MESSAGE, remoting.pull_message_ext(
                group, topic, 0, queue_offset=offset, max_msg_nums=32))
            assert pulled.code == remoting.SUCCESS, pulled
            records = list(remoting.stored_records(pulled.body))
            assert [q for q, _ in records] == list(range(offset, offset + len(records)))
            assert all(body == COLD_BODY for _, body in records)
            offset += len(records)
    node0 = 'node_id="broker-0"'

    def figures():
        text = scrape(metrics_port)
        hits = sample_value(text, "shardmq_read_cache_hits_total", node0)
        return text if hits else None
    wait_until(figures, SCRAPE_TIMEOUT_S, interval_s=0.5,
               message="the shard's snapshot to show the pulls from disk")
    text = figures()
    print("\n".join(line for line in text.splitlines() if "read_cache" in line))
    misses = sample_value(text, "shardmq_read_cache_misses_total", node0)
    assert misses >= 1
    # ~1.3 MB pulled 32 KiB at a time: most pulls find their window read already.
    assert sample_value(text, "shardmq_read_cache_hits_total", node0) > 2 * misses
    for name in ("refetches", "bypasses", "span_shares"):
        assert sample_value(text, "shardmq_read_cache_{}_total".format(name), node0) == 0


def test_a_second_node_cannot_share_the_metrics_port(shardmq_factory):
    """Two nodes on one host given the same --metrics-port: the second serves its brokers
    without an endpoint and says why; the port stays the first's alone (it was bound with
    SO_REUSEPORT, and the kernel split the scrapes between the two nodes)."""
    metrics_port = free_port()
    first = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    second = shardmq_factory(extra_args=["--metrics-port", str(metrics_port)])
    assert "no Prometheus endpoint" in second.log_tail(), second.log_tail()
    assert "Address already in use" in second.log_tail(), second.log_tail()
    shown = subprocess.run(["ss", "-ltnpH", "sport = :{}".format(metrics_port)],
                           capture_output=True, text=True, check=True).stdout
    owners = [line for line in shown.splitlines() if line.strip()]
    assert len(owners) == 1 and "pid={},".format(first.process.pid) in owners[0], shown
    for _ in range(8):
        assert "rocketmq_" in scrape(metrics_port)

"""A tiny raw RocketMQ remoting client for byte-level tests.

Frame layout (REMOTING.md §1.2), all integers big-endian:

| offset | size | field                                                        |
|--------|------|--------------------------------------------------------------|
| 0      | 4    | L = 4 + H + B (length of everything after this word)         |
| 4      | 4    | byte 4: serialize type (0 = JSON); bytes 5..7: H             |
| 8      | H    | JSON header: code, language, version, opaque, flag, remark,  |
|        |      | extFields (object of strings)                                |
| 8 + H  | B    | body                                                         |

Responses have flag bit 0 set and echo the request's opaque. The server may also send
requests of its own on a connection; `call` skips anything that is not the matching response.
"""

import base64
import hashlib
import hmac
import itertools
import json
import socket
import struct
import time

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

SERIALIZE_JSON = 0
RESPONSE_READ_TIMEOUT_S = 10.0
FRAME_READ_MAX_BYTES = 64 * 1024 * 1024  # refuse to buffer anything larger from a server

# Request codes (REMOTING.md §2.1).
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
GET_ALL_TOPIC_CONFIG = 21
GET_BROKER_RUNTIME_INFO = 28
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
GET_CONSUMER_LIST_BY_GROUP = 38
PUT_KV_CONFIG = 100
GET_KV_CONFIG = 101
GET_ROUTEINFO_BY_TOPIC = 105
REGISTER_BROKER = 103
UNREGISTER_BROKER = 104

# Response codes (REMOTING.md §2.2).
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
SERVICE_NOT_AVAILABLE = 14
REQUEST_CODE_NOT_SUPPORTED = 3
MESSAGE_ILLEGAL = 13
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
QUERY_NOT_FOUND = 22
INVALID_PARAMETER = 29


class ConnectionClosed(Exception):
    """The server closed (or reset) the connection."""


class Response:
    def __init__(self, header, body):
        self.header = header
        self.body = body

    @property
    def code(self):
        return self.header.get("code")

    @property
    def remark(self):
        return self.header.get("remark")

    @property
    def opaque(self):
        return self.header.get("opaque")

    @property
    def flag(self):
        return self.header.get("flag", 0)

    @property
    def ext(self):
        return self.header.get("extFields") or {}

    def __repr__(self):
        body = self.body[:200]
        return "Response(header={!r}, body[:200]={!r}, body_len={})".format(
            self.header, body, len(self.body))


def encode_header_word(header_len, serialize_type=SERIALIZE_JSON):
    assert 0 <= header_len < (1 << 24), header_len
    return struct.pack(">I", (serialize_type << 24) | header_len)


def encode_frame(header_bytes, body=b"", serialize_type=SERIALIZE_JSON):
    """Frame raw header bytes (already serialized) and a body."""
    total = 4 + len(header_bytes) + len(body)
    return (struct.pack(">i", total) + encode_header_word(len(header_bytes), serialize_type)
            + header_bytes + body)


def encode_request(code, opaque, ext=None, body=b"", flag=0, remark=None,
                   language="PYTHON", version=479):
    header = {
        "code": code,
        "flag": flag,
        "language": language,
        "opaque": opaque,
        "version": version,
    }
    if remark is not None:
        header["remark"] = remark
    if ext:
        header["extFields"] = {k: str(v) for k, v in ext.items()}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return encode_frame(header_bytes, body)


def signed(ext, body, access_key, secret_key):
    """ext with AccessKey and the Signature RocketMQ's ACL checks (CAPABILITIES.md §4.2): the
    values of every field, in sorted key order, then the body, HmacSHA1 with the secret key,
    in Base64. Values are signed as encode_request sends them (str())."""
    fields = {k: str(v) for k, v in (ext or {}).items()}
    fields["AccessKey"] = access_key
    content = "".join(fields[k] for k in sorted(fields)).encode("utf-8") + body
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    fields["Signature"] = base64.b64encode(digest).decode("ascii")
    return fields


def decode_frame(frame):
    """Decode one whole frame (including its 4-byte length prefix) into (header dict, body)."""
    (total,) = struct.unpack(">i", frame[:4])
    assert total == len(frame) - 4, "length prefix {} != {} bytes following".format(
        total, len(frame) - 4)
    (word,) = struct.unpack(">I", frame[4:8])
    serialize_type = word >> 24
    header_len = word & 0xFFFFFF
    assert serialize_type == SERIALIZE_JSON, (
        "server answered with serialize type {} (want 0 = JSON)".format(serialize_type))
    assert 4 + header_len <= total, "header length {} exceeds frame length {}".format(
        header_len, total)
    header = json.loads(frame[8:8 + header_len].decode("utf-8"))
    body = frame[8 + header_len:]
    return header, body


class RemotingClient:
    """One TCP connection to a namesrv or broker endpoint."""

    def __init__(self, host, port, timeout_s=RESPONSE_READ_TIMEOUT_S, source_ip=None,
                 tls=None):
        """tls: an ssl.SSLContext to speak TLS with (None: plaintext)."""
        self.address = (host, port)
        source = (source_ip, 0) if source_ip else None
        self.sock = socket.create_connection(self.address, timeout=timeout_s,
                                             source_address=source)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)
        self.timeout_s = timeout_s
        self._opaques = itertools.count(1)
        self._buffer = b""

    @classmethod
    def connect(cls, address, timeout_s=RESPONSE_READ_TIMEOUT_S, source_ip=None, tls=None):
        """source_ip: the local address to connect from (any 127.x.y.z is loopback)."""
        host, port = address.rsplit(":", 1)
        return cls(host, int(port), timeout_s, source_ip, tls)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data):
        self.sock.sendall(data)

    def _recv_some(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("no complete frame before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except (ConnectionResetError, BrokenPipeError) as error:
            raise ConnectionClosed(str(error)) from error
        if not chunk:
            raise ConnectionClosed("EOF")
        self._buffer += chunk

    def read_frame(self, timeout_s=None):
        """Read one frame; returns Response. Raises ConnectionClosed or socket.timeout."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while len(self._buffer) < 4:
            self._recv_some(deadline)
        (total,) = struct.unpack(">i", self._buffer[:4])
        assert 4 <= total <= FRAME_READ_MAX_BYTES, "server sent length prefix {}".format(total)
        while len(self._buffer) < 4 + total:
            self._recv_some(deadline)
        frame, self._buffer = self._buffer[:4 + total], self._buffer[4 + total:]
        header, body = decode_frame(frame)
        return Response(header, body)

    def call(self, code, ext=None, body=b"", timeout_s=None, **kwargs):
        """Send a request and wait for the response with the same opaque."""
        opaque = next(self._opaques)
        self.send_raw(encode_request(code, opaque, ext, body, **kwargs))
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            response = self.read_frame(max(0.001, deadline - time.monotonic()))
            if response.flag & FLAG_RESPONSE and response.opaque == opaque:
                return response

    def wait_closed(self, timeout_s=10.0):
        """True when the server closes the connection within timeout_s (frames are discarded)."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                self._recv_some(deadline)
                self._buffer = b""
        except ConnectionClosed:
            return True
        except (socket.timeout, TimeoutError):
            return False


# ---- request helpers -------------------------------------------------------------------------

BUSY_RETRIES_MAX = 10
BUSY_BACKOFF_S = 0.05
# SYSTEM_BUSY answers retried by call_retrying_busy, for the test's own report.
busy_retries = []


def call_retrying_busy(client, code, ext, body=b"", **kwargs):
    """client.call, with SYSTEM_BUSY answers retried (backing off) as RocketMQ's clients
    retry them: a shard that stalled a few hundred ms on this shared 2-core machine answers
    busy; the tests that use this check something else than latency."""
    for attempt in range(BUSY_RETRIES_MAX + 1):
        response = client.call(code, ext, body=body, **kwargs)
        if response.code != SYSTEM_BUSY or attempt == BUSY_RETRIES_MAX:
            return response
        busy_retries.append(response.remark)
        time.sleep(BUSY_BACKOFF_S * (attempt + 1))

def create_topic(broker_address, topic, queue_nums=4, perm=6):
    """UPDATE_AND_CREATE_TOPIC (17) on one broker endpoint (shardmq fans it out to every shard)."""
    with RemotingClient.connect(broker_address) as client:
        return call_retrying_busy(client, UPDATE_AND_CREATE_TOPIC, {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": queue_nums,
            "writeQueueNums": queue_nums,
            "perm": perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": "false",
        })


def send_message_ext(topic, queue_id=0, properties="", group="raw_producer"):
    """Long-name SEND_MESSAGE (10) ext fields, the way the C++ client sends them (§3.2)."""
    return {
        "producerGroup": group,
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties,
        "reconsumeTimes": 0,
        "unitMode": "false",
        "batch": "false",
    }


def stored_records(data):
    """(queue offset, body) of each stored record in a pull answer's body (RocketMQ's layout,
    IPv4 hosts)."""
    at = 0
    while at + 88 <= len(data):
        total = struct.unpack_from(">i", data, at)[0]
        queue_offset = struct.unpack_from(">q", data, at + 20)[0]
        body_len = struct.unpack_from(">i", data, at + 84)[0]
        yield queue_offset, bytes(data[at + 88:at + 88 + body_len])
        at += total


def pull_message_ext(group, topic, queue_id, queue_offset=0, max_msg_nums=32,
                     suspend_timeout_ms=0):
    """PULL_MESSAGE (11) ext fields; sysFlag 4 = SUBSCRIPTION only (no long-poll)."""
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": queue_offset,
        "maxMsgNums": max_msg_nums,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": suspend_timeout_ms,
        "subscription": "*",
        "subVersion": 0,
    }


def query_consumer_offset(broker_address, group, topic, queue_id):
    """Committed offset of (group, topic, queue) on one broker endpoint, or None if not stored."""
    with RemotingClient.connect(broker_address) as client:
        response = client.call(QUERY_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": queue_id})
    if response.code == SUCCESS:
        return int(response.ext["offset"])
    assert response.code == QUERY_NOT_FOUND, "QUERY_CONSUMER_OFFSET answered {!r}".format(
        response)
    return None


def max_offset(broker_address, topic, queue_id):
    """GET_MAX_OFFSET (30): the offset past the last unit of (topic, queue) on one endpoint."""
    with RemotingClient.connect(broker_address) as client:
        response = client.call(GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    assert response.code == SUCCESS, "GET_MAX_OFFSET answered {!r}".format(response)
    return int(response.ext["offset"])


def consumer_ids(broker_address, group):
    """Client ids the broker knows for a consumer group ([] when none)."""
    with RemotingClient.connect(broker_address) as client:
        response = client.call(GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if response.code != SUCCESS:
        return []
    return json.loads(response.body.decode("utf-8")).get("consumerIdList", [])


def runtime_info(broker_address):
    """GET_BROKER_RUNTIME_INFO's table (brokerStatus), values as strings."""
    with RemotingClient.connect(broker_address) as client:
        return runtime_table(client)


def runtime_table(client):
    """`runtime_info` over a connection the caller holds."""
    answer = client.call(GET_BROKER_RUNTIME_INFO)
    assert answer.code == SUCCESS, answer
    return json.loads(answer.body)["table"]


def route_info(namesrv_address, topic):
    with RemotingClient.connect(namesrv_address) as client:
        return client.call(GET_ROUTEINFO_BY_TOPIC, {"topic": topic})

"""Damage in the middle of the log (real binary, real files, the real C++ client): one byte of
a record's body is changed inside a sealed segment of a stopped store. `shardmq verify`
reports the record's position and exits 1 (0 before the damage); a consumer receives every
other message and never the damaged one, which the broker logs with its position; with the
checkpoint removed (a full recovery scan), recovery steps over the damage instead of cutting
the log there, and every message after it is still served.
"""

import os
import subprocess

import remoting
from mq import Collector, make_consumer, unique, wait_for_keys, wait_until

SEGMENT_MIB = 1
BODY_BYTES = 16 * 1024
MESSAGES = 3000  # ~47 MiB: the damage lies far more than a torn flush can reach before the end
DAMAGED = 100  # index of the message whose body gets a flipped byte
BODY_BYTE_AT = 150  # bytes into its record: past the fixed fields, inside the body
CONSUME_TIMEOUT_S = 120


def body_of(key):
    return (key.encode() + b" ") * (BODY_BYTES // (len(key) + 1))


def properties(key):
    return "KEYS\x01{k}\x02TAGS\x01TagA\x02test_key\x01{k}\x02".format(k=key)


def verify(binary, data_dir):
    result = subprocess.run([binary, "verify", "--data-dir", data_dir],
                            capture_output=True, text=True, timeout=120)
    print(result.stdout[-3000:])
    return result


def consume_all(node, topic, label):
    seen = Collector(label)
    consumer = make_consumer(node.namesrv_addr, topic, seen, group=unique("cg_dmg"))
    return seen, consumer


def test_damage_in_the_middle_is_found_and_never_served(shardmq_factory, tmp_path):
    data_dir = str(tmp_path / "data")
    node = shardmq_factory(data_dir=data_dir, shards=1, segment_size_mib=SEGMENT_MIB)
    consumers = []
    try:
        topic = unique("Tdmg")
        assert remoting.create_topic(node.broker_addr(0), topic, 1).code == 0
        run = unique("d")
        keys, physical = [], {}
        with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
            for i in range(MESSAGES):
                key = "dmg-{}-{:05d}".format(run, i)
                response = remoting.call_retrying_busy(
                    client, remoting.SEND_MESSAGE,
                    remoting.send_message_ext(topic, 0, properties(key)),
                    body=body_of(key), timeout_s=30)
                assert response.code == remoting.SUCCESS, response
                keys.append(key)
                # An offset msgId: store host (16 hex digits), then the commitlog offset.
                physical[key] = int(response.ext["msgId"][16:32], 16)
        node.stop()
        binary = node.binary

        clean = verify(binary, data_dir)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "no damage found" in clean.stdout

        damaged_key = keys[DAMAGED]
        at = physical[damaged_key]
        segment_bytes = SEGMENT_MIB << 20
        segment = at - at % segment_bytes
        path = os.path.join(data_dir, "shard-0", "commitlog", "{:020d}".format(segment))
        with open(path, "r+b") as f:
            f.seek(at - segment + BODY_BYTE_AT)
            byte = f.read(1)
            f.seek(at - segment + BODY_BYTE_AT)
            f.write(bytes([byte[0] ^ 0xFF]))

        found = verify(binary, data_dir)
        assert found.returncode == 1, found.stdout + found.stderr
        assert "DAMAGE: {}:".format(at) in found.stdout, found.stdout
        print("verify reported the damaged record at {}".format(at))

        # Served from the stopped store's files: every message but the damaged one.
        node.start()
        expected = [k for k in keys if k != damaged_key]
        seen, consumer = consume_all(node, topic, "after damage")
        consumers.append(consumer)
        wait_for_keys([seen], expected, CONSUME_TIMEOUT_S, label="messages around the damage")
        wait_until(lambda: "damaged record not served" in open(node.log_path).read(), 10,
                   interval_s=0.2, message="the broker to log the damaged record")
        got = seen.snapshot()
        assert damaged_key not in got, "the damaged record was served"
        with open(node.log_path) as log:
            lines = [l for l in log if "damaged record not served" in l]
        assert any("commitlog offset {}".format(at) in l for l in lines), lines
        consumer.shutdown()
        consumers.remove(consumer)

        # A full recovery scan (checkpoint removed) steps over the damage: the log is not cut.
        node.stop()
        os.remove(os.path.join(data_dir, "shard-0", "checkpoint"))
        node.start()
        with open(node.log_path) as log:
            text = log.read()
        assert "damaged commitlog at offsets {}..".format(at) in text, text[-3000:]
        with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
            response = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
        assert int(response.ext["offset"]) == MESSAGES, response
        seen, consumer = consume_all(node, topic, "after a full scan")
        consumers.append(consumer)
        wait_for_keys([seen], expected, CONSUME_TIMEOUT_S, label="messages after a full scan")
        assert damaged_key not in seen.snapshot(), "the damaged record was served"
        print("a full scan kept the {} messages after the damage".format(MESSAGES - DAMAGED - 1))
    finally:
        for consumer in consumers:
            consumer.shutdown()

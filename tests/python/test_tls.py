"""TLS on the real binary (rustls; RocketMQ's tls.server.mode): in the default permissive
mode one port serves TLS and plaintext (the first byte tells them apart) with a self-signed
test certificate that `openssl s_client` shows and that verifies for 127.0.0.1; enforcing
refuses plaintext (the node's own brokers then reach its namesrv over TLS); with
tls.server.need.client.auth require, a TLS client without a certificate from the trusted CA
is refused, one with it is served. The client side here is Python's ssl module and openssl.
"""

import os
import shutil
import socket
import ssl
import subprocess

import pytest

import remoting
from mq import unique

CERT_DAYS = "2"


def any_certificate():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def trusting(cafile, cert=None, key=None):
    context = ssl.create_default_context(cafile=cafile)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def create_topic(address, topic, tls=None):
    ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": 2, "writeQueueNums": 2,
           "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}
    with remoting.RemotingClient.connect(address, tls=tls) as client:
        return client.call(remoting.UPDATE_AND_CREATE_TOPIC, ext)


def send_and_count(address, topic, count, tls=None):
    with remoting.RemotingClient.connect(address, tls=tls) as client:
        for index in range(count):
            response = remoting.call_retrying_busy(client, remoting.SEND_MESSAGE,
                                                   remoting.send_message_ext(topic, 0),
                                                   body="tls {}".format(index).encode())
            assert response.code == remoting.SUCCESS, response
        response = client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
        return int(response.ext["offset"])


def openssl():
    path = shutil.which("openssl")
    if path is None:
        pytest.skip("could not run: no openssl binary on this machine (Debian: openssl)")
    return path


def test_permissive_serves_tls_and_plaintext_on_one_port(shardmq):
    cert = os.path.join(shardmq.data_dir, "tls", "test-cert.pem")
    assert os.path.exists(cert), "test mode wrote no certificate"
    address = shardmq.broker_addr(0)
    topic = unique("Ttls")
    assert create_topic(address, topic, tls=any_certificate()).code == remoting.SUCCESS
    assert send_and_count(address, topic, 5, tls=trusting(cert)) == 5
    assert send_and_count(address, topic, 5) == 10
    # The namesrv port too.
    with remoting.RemotingClient.connect(shardmq.namesrv_addr, tls=trusting(cert)) as client:
        assert client.call(remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).code == 0

    host, port = address.rsplit(":", 1)
    shown = subprocess.run(
        [openssl(), "s_client", "-connect", "{}:{}".format(host, port), "-showcerts"],
        input=b"", capture_output=True, timeout=30)
    text = shown.stdout.decode(errors="replace")
    print("\n".join(line for line in text.splitlines()
                    if line.startswith(("subject=", "issuer=", "Protocol", "    Protocol",
                                        "New,", "Verify return code"))))
    assert "-----BEGIN CERTIFICATE-----" in text, text + shown.stderr.decode()


def test_enforcing_refuses_plaintext(shardmq_factory):
    node = shardmq_factory(extra_args=["--tls-server-mode", "enforcing"])
    address = node.broker_addr(0)
    topic = unique("Tenf")
    assert create_topic(address, topic, tls=any_certificate()).code == remoting.SUCCESS
    assert send_and_count(address, topic, 3, tls=any_certificate()) == 3
    for plain in (address, node.namesrv_addr):
        with remoting.RemotingClient.connect(plain) as client:
            with pytest.raises((remoting.ConnectionClosed, ConnectionResetError,
                                BrokenPipeError)):
                client.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0},
                            timeout_s=5)
    assert "TLS is enforced" in node.log_tail()


def make_ca_and_client(tmp_path, ssl_tool):
    """A CA, a client certificate it signs, and one it does not (self-signed)."""
    run = lambda *args: subprocess.run([ssl_tool] + list(args), check=True,
                                       capture_output=True, timeout=60)
    ca_key, ca_cert = str(tmp_path / "ca.key"), str(tmp_path / "ca.pem")
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca_cert, "-days", CERT_DAYS, "-subj", "/CN=test CA")
    key, csr, cert = (str(tmp_path / n) for n in ("client.key", "client.csr", "client.pem"))
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=client")
    ext = tmp_path / "client.ext"
    ext.write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    run("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", CERT_DAYS, "-extfile", str(ext))
    stranger_key, stranger = str(tmp_path / "stranger.key"), str(tmp_path / "stranger.pem")
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", stranger_key, "-out", stranger, "-days", CERT_DAYS, "-subj", "/CN=stranger")
    return ca_cert, (cert, key), (stranger, stranger_key)


def test_a_required_client_certificate_missing_is_refused(shardmq_factory, tmp_path):
    ca, client, stranger = make_ca_and_client(tmp_path, openssl())
    node = shardmq_factory(extra_args=[
        "--tls-server-need-client-auth", "require", "--tls-server-trust-cert-path", ca])
    server_cert = os.path.join(node.data_dir, "tls", "test-cert.pem")
    address = node.broker_addr(0)
    topic = unique("Tmtls")
    with_cert = trusting(server_cert, *client)
    assert create_topic(address, topic, tls=with_cert).code == remoting.SUCCESS
    assert send_and_count(address, topic, 2, tls=with_cert) == 2
    for label, context in (("no certificate", trusting(server_cert)),
                           ("a certificate from another CA", trusting(server_cert, *stranger))):
        refused = False
        try:
            with remoting.RemotingClient.connect(address, tls=context, timeout_s=5) as c:
                c.call(remoting.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}, timeout_s=5)
        except (ssl.SSLError, remoting.ConnectionClosed, ConnectionResetError,
                BrokenPipeError, socket.timeout) as error:
            refused = True
            print("{}: refused ({})".format(label, error))
        assert refused, label


def test_the_metrics_port_serves_https_and_http(shardmq_factory):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = shardmq_factory(extra_args=["--metrics-port", str(port)])
    cert = os.path.join(node.data_dir, "tls", "test-cert.pem")
    import urllib.request
    for url, context in (("https://127.0.0.1:{}/metrics".format(port), trusting(cert)),
                         ("http://127.0.0.1:{}/metrics".format(port), None)):
        with urllib.request.urlopen(url, timeout=10, context=context) as answer:
            page = answer.read().decode()
        assert answer.status == 200 and "# TYPE rocketmq_messages_in_total counter" in page, url

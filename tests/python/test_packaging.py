"""The systemd unit (packaging/systemd/shardmq.service): systemd accepts it, and the commands
it runs work as written (the -c broker.conf ExecStart resolves its settings; the tune
ExecStartPre inspects the host), with the limits shardmq needs.
"""

import os
import shlex
import shutil
import subprocess

import pytest

from conftest import _binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(ROOT, "packaging", "systemd", "shardmq.service")
FIXTURE_CONF = os.path.join(ROOT, "tests", "python", "fixtures", "rocketmq-conf",
                            "2m-2s-async", "broker-a.properties")


def unit_values(key):
    with open(UNIT) as unit:
        return [line.split("=", 1)[1].strip() for line in unit
                if line.startswith(key + "=")]


def localized(command, tmp_path):
    """A unit command line with the install paths moved into tmp_path."""
    command = command.lstrip("-+")
    words = shlex.split(command)
    assert words[0] == "/usr/local/bin/shardmq", words
    conf = tmp_path / "broker.conf"
    shutil.copy(FIXTURE_CONF, conf)
    replace = {"/usr/local/bin/shardmq": _binary(), "/etc/shardmq/broker.conf": str(conf),
               "/var/lib/shardmq": str(tmp_path / "data"),
               "/var/log/shardmq": str(tmp_path / "log")}
    return [replace.get(word, word) for word in words]


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here, so the unit cannot be verified")
    text = open(UNIT).read().replace("/usr/local/bin/shardmq", _binary())
    unit = tmp_path / "shardmq.service"
    unit.write_text(text)
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "shardmq.service" not in done.stderr, done.stderr


def test_unit_limits_and_commands(tmp_path):
    assert unit_values("LimitNOFILE") == ["1048576"]
    assert unit_values("LimitMEMLOCK") == ["infinity"]
    assert unit_values("KillSignal") == ["SIGTERM"]
    [start] = unit_values("ExecStart")
    command = localized(start, tmp_path) + ["--print-config"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "DefaultCluster" in done.stdout and "(brokerClusterName)" in done.stdout
    assert "0.0.0.0" in done.stdout
    [pre] = unit_values("ExecStartPre")
    assert pre.startswith("-+"), "tune runs as root and a failed change does not stop the start"
    tune = [word for word in localized(pre, tmp_path) if word != "--apply"]
    done = subprocess.run(tune, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "shardmq tune: this host" in done.stdout

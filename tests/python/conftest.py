"""Fixtures that run the real shardmq binary on loopback.

`shardmq` is a started node (2 shards, async flush); `shardmq_factory(**options)` starts more
(e.g. `flush="sync"`). Each node lives in its own temporary data dir, on free ports, with its
output captured to a file that is attached to the report of a failing test. Teardown always
stops the process; a node that died on its own during a test fails that test.

Environment:
  SHARDMQ_BIN           binary to run (default: <repo>/target/release/shardmq)
  SHARDMQ_SHARDS        shard count (default 2)
  SHARDMQ_TEST_TIMEOUT  per-test watchdog in seconds (default 300); on expiry every thread's
                        stack is dumped and the run aborts (the broker dies with it)
"""

import faulthandler
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_BIN = os.path.join(REPO_ROOT, "target", "release", "shardmq")

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
START_ATTEMPTS_MAX = 5
PORT_STRIDE = 10
PORT_RANGE = (12000, 30000)  # below the Linux ephemeral range, so clients never collide
LOG_TAIL_LINES = 300
TEST_TIMEOUT_S = float(os.environ.get("SHARDMQ_TEST_TIMEOUT", "300"))


# Runs first in the child and execs the binary: the binary gets SIGKILL when pytest dies
# (watchdog abort, Ctrl-C, crash), so no broker outlives the run. (prctl in a launcher rather
# than a preexec_fn: the C++ client's threads make preexec_fn unsafe.)
_LAUNCHER = """
import ctypes, os, sys
PR_SET_PDEATHSIG, SIGKILL = 1, 9
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit("test harness already gone")
if os.environ.get("SHARDMQ_TEST_NOFILE"):
    import resource
    soft, hard = (int(n) for n in os.environ.pop("SHARDMQ_TEST_NOFILE").split(":"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
os.execv(sys.argv[2], sys.argv[2:])
"""


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ports_needed(namesrv_port, broker_port, shards):
    ports = [namesrv_port]
    for shard in range(shards):
        base = broker_port + PORT_STRIDE * shard
        ports += [base - 2, base, base + 1]
    return ports


def pick_ports(shards):
    """A (namesrv_port, broker_port) pair whose every needed port is free right now."""
    for _ in range(200):
        namesrv_port = random.randrange(*PORT_RANGE)
        broker_port = namesrv_port + 20
        if all(port_is_free(p) for p in ports_needed(namesrv_port, broker_port, shards)):
            return namesrv_port, broker_port
    raise RuntimeError("no free port range found after 200 tries")


class ShardMQ:
    """One shardmq process (namesrv + brokers) and the data dir it owns."""

    def __init__(self, binary, data_dir, log_path, shards=2, flush="async",
                 segment_size_mib=64, extra_args=(), nofile=None):
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.shards = shards
        self.flush = flush
        self.segment_size_mib = segment_size_mib
        self.extra_args = list(extra_args)
        # (soft, hard) RLIMIT_NOFILE the process starts with (None: the harness's own).
        self.nofile = nofile
        self.namesrv_port = None
        self.broker_port = None
        self.process = None
        self.starts = 0
        self._log_file = None

    # ---- addresses ----------------------------------------------------------------------

    @property
    def namesrv_addr(self):
        """What the C++ client needs: "127.0.0.1:PORT"."""
        return "127.0.0.1:{}".format(self.namesrv_port)

    def broker_addr(self, shard=0):
        return "127.0.0.1:{}".format(self.broker_port + PORT_STRIDE * shard)

    @property
    def broker_addrs(self):
        return [self.broker_addr(i) for i in range(self.shards)]

    # ---- lifecycle ----------------------------------------------------------------------

    def _command(self):
        return [
            self.binary, "serve",
            "--data-dir", self.data_dir,
            "--namesrv-port", str(self.namesrv_port),
            "--broker-port", str(self.broker_port),
            "--shards", str(self.shards),
            "--flush", self.flush,
            "--segment-size-mib", str(self.segment_size_mib),
            "--listen-ip", "127.0.0.1",
        ] + self.extra_args

    def _log(self, line):
        with open(self.log_path, "a") as log:
            log.write("==== [test harness {:.3f}] {}\n".format(time.time(), line))

    def start(self, keep_ports=False, allow_port_change=True):
        """Start the process and wait for its ready line. Retries on bind failures; with
        keep_ports, moves to fresh ports (with a warning) after a few failed tries unless
        allow_port_change is False."""
        assert self.process is None, "already running"
        if not (keep_ports and self.namesrv_port):
            self.namesrv_port, self.broker_port = pick_ports(self.shards)
        last_error = None
        for attempt in range(START_ATTEMPTS_MAX):
            error = self._start_once()
            if error is None:
                return self
            last_error = error
            if not self._bind_failed():
                break  # a crash or a hang is the binary's problem, not a port clash
            time.sleep(0.5 + attempt * 0.5)
            if keep_ports and allow_port_change and attempt == START_ATTEMPTS_MAX - 2:
                warnings.warn("shardmq could not start again on its old ports ({}); "
                              "moving to fresh ports".format(error))
                keep_ports = False
            if not keep_ports:
                self.namesrv_port, self.broker_port = pick_ports(self.shards)
        raise RuntimeError("shardmq did not start ({} attempts): {} (output: {}, attached "
                           "below)".format(attempt + 1, last_error, self.log_path))

    def _start_once(self):
        """None when ready; otherwise an error text (the process is gone again)."""
        self.starts += 1
        command = self._command()
        self._log("start #{}: {}".format(self.starts, " ".join(command)))
        offset = self._start_offset = os.path.getsize(self.log_path)
        self._log_file = open(self.log_path, "ab")
        env = dict(os.environ, RUST_BACKTRACE="1")
        if self.nofile is not None:
            env["SHARDMQ_TEST_NOFILE"] = "{}:{}".format(*self.nofile)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(os.getpid())] + command,
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.data_dir, start_new_session=True, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            output = self._output_since(offset)
            if "shardmq: ready" in output:
                return None
            if self.process.poll() is not None:
                code = self.process.returncode
                self._reap()
                return "exited with code {} before its ready line".format(code)
            time.sleep(0.05)
        self._log("no ready line within {:.0f} s; thread states follow".format(READY_TIMEOUT_S))
        self._dump_threads()
        self._kill()
        return "no ready line within {:.0f} s".format(READY_TIMEOUT_S)

    def _dump_threads(self):
        """Evidence for a hang: each thread's kernel wait channel, and gdb backtraces if gdb
        is installed."""
        pid = self.process.pid
        lines = []
        for task in sorted(glob.glob("/proc/{}/task/*".format(pid))):
            try:
                with open(task + "/comm") as comm, open(task + "/wchan") as wchan:
                    lines.append("{} {} wchan={}".format(
                        os.path.basename(task), comm.read().strip(), wchan.read().strip()))
            except OSError:
                pass
        self._log("threads:\n" + "\n".join(lines))
        if shutil.which("gdb"):
            try:
                result = subprocess.run(
                    ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                    capture_output=True, text=True, timeout=30)
                self._log("gdb backtraces:\n" + result.stdout[-20000:])
            except (OSError, subprocess.SubprocessError) as error:
                self._log("gdb failed: {}".format(error))

    def _bind_failed(self):
        output = self._output_since(self._start_offset)
        return "Address already in use" in output or "os error 98" in output

    def _output_since(self, offset):
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", "replace")

    def _reap(self):
        self.process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _kill(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reap()

    def is_running(self):
        return self.process is not None and self.process.poll() is None

    def stop(self):
        """SIGTERM and wait for a clean exit (final flush). Returns the exit code."""
        assert self.process is not None, "not running"
        self._log("SIGTERM")
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._log("still running {:.0f} s after SIGTERM: SIGKILL".format(STOP_TIMEOUT_S))
            self._kill()
            raise AssertionError("shardmq did not exit within {:.0f} s of SIGTERM\n{}".format(
                STOP_TIMEOUT_S, self.log_tail()))
        self._log("exited with code {}".format(code))
        self._reap()
        return code

    def kill9(self):
        assert self.process is not None, "not running"
        self._log("SIGKILL (kill -9)")
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._reap()

    def restart(self, allow_port_change=True):
        """Stop (SIGTERM) if running, then start again on the same data dir and ports."""
        if self.process is not None:
            code = self.stop()
            assert code == 0, "shardmq exited with code {} on SIGTERM\n{}".format(
                code, self.log_tail())
        return self.start(keep_ports=True, allow_port_change=allow_port_change)

    def log_tail(self, lines=LOG_TAIL_LINES):
        try:
            with open(self.log_path, "rb") as log:
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return "(no output captured)"
        tail = text.splitlines()[-lines:]
        return "---- shardmq output ({}), last {} lines ----\n{}".format(
            self.log_path, len(tail), "\n".join(tail))


def _binary():
    binary = os.environ.get("SHARDMQ_BIN", DEFAULT_BIN)
    if not os.access(binary, os.X_OK):
        pytest.fail("shardmq binary not found at {} (build it with `cargo build --release "
                    "-p shardmq` or set SHARDMQ_BIN)".format(binary), pytrace=False)
    return binary


@pytest.fixture
def shardmq_factory(request, tmp_path):
    """Start shardmq nodes; all of them are stopped at teardown."""
    nodes = []
    request.node._shardmq_nodes = nodes

    def start(data_dir=None, **options):
        """options: ShardMQ's; data_dir: where the data lives (default: a fresh tmp dir)."""
        index = len(nodes)
        if data_dir is None:
            data_dir = tmp_path / "data{}".format(index)
        os.makedirs(str(data_dir), exist_ok=True)
        options.setdefault("shards", int(os.environ.get("SHARDMQ_SHARDS", "2")))
        node = ShardMQ(_binary(), str(data_dir), str(tmp_path / "shardmq{}.log".format(index)),
                       **options)
        open(node.log_path, "w").close()
        nodes.append(node)
        return node.start()

    yield start

    problems = []
    for node in nodes:
        if node.process is None:
            continue
        if node.process.poll() is not None:
            problems.append("shardmq exited on its own with code {} during the test\n{}".format(
                node.process.returncode, node.log_tail()))
            node._reap()
            continue
        try:
            code = node.stop()
        except AssertionError as error:
            problems.append(str(error))
            continue
        if code != 0:
            problems.append("shardmq exited with code {} on SIGTERM at teardown\n{}".format(
                code, node.log_tail()))
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
    # A passed test's data dirs go (preallocated segments add up to gigabytes per run); a
    # failed test keeps them, with its logs, for a look.
    call_report = getattr(request.node, "_report_call", None)
    if call_report is not None and call_report.passed:
        for node in nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)


@pytest.fixture
def shardmq(shardmq_factory):
    """A running node: 2 shards, async flush, 64 MiB segments."""
    return shardmq_factory()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "long: takes 15 s or more here; collected first, so that the workers of a "
        "parallel run (pytest-xdist, scripts/test.sh) are not left waiting on one late")


def pytest_collection_modifyitems(items):
    """The long tests first, each file's order kept otherwise (a stable sort)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


# How many of mq.send_retries and remoting.busy_retries earlier reports already carried.
_retries_reported = {"send": 0, "busy": 0}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "_report_" + report.when, report)
    # The retries of this phase travel on its report: under pytest-xdist the summary is
    # written by the controlling process, which sees the workers' reports, not their modules.
    import mq
    import remoting
    for name, retries in (("send", mq.send_retries), ("busy", remoting.busy_retries)):
        new = retries[_retries_reported[name]:]
        _retries_reported[name] = len(retries)
        if new:
            report.user_properties.append((name + "_retries", list(new)))
    if report.failed and call.when != "teardown":  # teardown failures carry the log already
        for node in getattr(item, "_shardmq_nodes", []):
            report.sections.append(("shardmq output " + node.log_path, node.log_tail()))


@pytest.fixture(autouse=True)
def _watchdog(request, pytestconfig):
    """A hung client call must not hang the suite: after the limit, dump every thread's stack
    and abort the run (the nodes die with it: parent-death signal). A thread, not a signal:
    the main thread may be stuck inside the C++ client, where no Python handler runs."""
    def expire():
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)
        sys.stderr.write("\n\n==== {} still running after {:.0f} s (SHARDMQ_TEST_TIMEOUT): "
                         "aborting the run; thread stacks follow ====\n".format(
                             request.node.nodeid, TEST_TIMEOUT_S))
        for node in getattr(request.node, "_shardmq_nodes", []):
            sys.stderr.write(node.log_tail(60) + "\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(TEST_TIMEOUT_S, expire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def pytest_terminal_summary(terminalreporter):
    """Say how often the C++ client's lock race forced a send retry (see mq.SEND_ATTEMPTS_MAX)
    and how many SYSTEM_BUSY answers raw sends retried, from every report (every worker's)."""
    retries = {"send_retries": [], "busy_retries": []}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, values in getattr(report, "user_properties", ()):
                if name in retries:
                    retries[name].extend(values)
    if retries["send_retries"]:
        terminalreporter.write_line("C++ client send retries (client-side lock race): {}; first: "
                                    "{}".format(len(retries["send_retries"]),
                                                retries["send_retries"][0]))
    if retries["busy_retries"]:
        terminalreporter.write_line("SYSTEM_BUSY answers retried by raw sends: {}; first: "
                                    "{}".format(len(retries["busy_retries"]),
                                                retries["busy_retries"][0]))

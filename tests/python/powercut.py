"""A disk that can lose power: a FUSE file served from here, loop-mounted as ext4.

The FUSE daemon (this file run as a program) serves one file, `disk.img`, kept in a plain
file beside it. It knows which 4 KiB blocks were written since the last flush: the kernel's
loop driver turns every flush (REQ_PREFLUSH, and FUA, which loop does not offer) into an
fsync of the file it is backed by, and that fsync reaches here. A power cut is a copy of the
file in which each block written since the last flush holds its new content or, at random,
what it held at that flush, as a disk with a volatile write cache may leave it. What was
flushed stays; nothing else is promised. (A block written twice since the flush comes back
with its last or its flushed content, never the one between.)

`power_cut_disk(size_mib)` (a context manager for tests) starts the daemon, puts ext4 on a
loop device over the served file and mounts it; its `cut(path, seed)` writes such a copy to
`path`, taken right after one of the next few writes, while the disk goes on. A copy is
mounted with `mounted_image(path)`, where ext4 replays its journal as it would after the
power came back; `forget_light_checkpoints(data_dir)` then makes the node see the restart of
the machine a real power loss brings (the boot id here stays the same).

Needs root, loop devices, /dev/fuse, libfuse2 and the `fusepy` package: where one is
missing the test says which and is skipped, never passed.
"""

import contextlib
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

from smallfs import run_command

BLOCK = 4096
IMAGE = "disk.img"


# ---- the daemon -------------------------------------------------------------------------


def serve(backing, mount_point, control_path):
    import errno

    from fuse import FUSE, FuseOSError, Operations

    class Disk(Operations):
        def __init__(self):
            self.fd = os.open(backing, os.O_RDWR)
            self.size = os.fstat(self.fd).st_size
            self.lock = threading.Lock()
            self.flushed = {}  # block -> its content at the last flush, for blocks written since
            self.flushes = 0
            self.writes = 0
            self.armed = None  # a cut waiting for its write: path, rng, writes to go, done

        def getattr(self, path, fh=None):
            now = time.time()
            if path == "/":
                return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2, st_size=0,
                            st_atime=now, st_mtime=now, st_ctime=now)
            if path == "/" + IMAGE:
                return dict(st_mode=stat.S_IFREG | 0o600, st_nlink=1, st_size=self.size,
                            st_atime=now, st_mtime=now, st_ctime=now)
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path, fh):
            return [".", "..", IMAGE]

        def open(self, path, flags):
            if path != "/" + IMAGE:
                raise FuseOSError(errno.ENOENT)
            return 0

        def read(self, path, size, offset, fh):
            with self.lock:
                return os.pread(self.fd, size, offset)

        def write(self, path, data, offset, fh):
            if offset + len(data) > self.size:
                raise FuseOSError(errno.ENOSPC)
            with self.lock:
                first = offset // BLOCK
                last = (offset + len(data) - 1) // BLOCK
                if any(block not in self.flushed for block in range(first, last + 1)):
                    before = os.pread(self.fd, (last + 1 - first) * BLOCK, first * BLOCK)
                    for block in range(first, last + 1):
                        if block not in self.flushed:
                            at = (block - first) * BLOCK
                            self.flushed[block] = before[at:at + BLOCK]
                os.pwrite(self.fd, data, offset)
                self.writes += 1
                if self.armed is not None:
                    self.armed["writes"] -= 1
                    if self.armed["writes"] == 0:
                        self._cut_now()
            return len(data)

        def fsync(self, path, datasync, fh):
            with self.lock:
                self.flushed.clear()
                self.flushes += 1
            return 0

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            return 0

        def truncate(self, path, length, fh=None):
            raise FuseOSError(errno.EPERM)

        def cut(self, path, seed):
            """A copy of the disk as a power cut could leave it right after one of the next
            few writes (1 to 8, at random): the cut lands between a write and its flush."""
            rng = random.Random(seed)
            armed = dict(path=path, rng=rng, writes=rng.randint(1, 8),
                         done=threading.Event(), reply=None)
            with self.lock:
                self.armed = armed
            if not armed["done"].wait(60):
                with self.lock:
                    if self.armed is armed:  # no write came: the disk was idle
                        self._cut_now()
            return armed["reply"]

        def _cut_now(self):
            """Under the lock: copies the disk, each block written since the flush old or new."""
            armed, self.armed = self.armed, None
            copied = run_command("cp", "--sparse=always", backing, armed["path"])
            if copied.returncode != 0:
                armed["reply"] = "error cp: " + copied.stdout.strip()
            else:
                lost = 0
                out = os.open(armed["path"], os.O_WRONLY)
                try:
                    for block in sorted(self.flushed):
                        if armed["rng"].random() < 0.5:
                            os.pwrite(out, self.flushed[block], block * BLOCK)
                            lost += 1
                finally:
                    os.close(out)
                armed["reply"] = "ok unflushed={} lost={} flushes={} writes={}".format(
                    len(self.flushed), lost, self.flushes, self.writes)
            armed["done"].set()

    disk = Disk()
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(control_path)
    control.listen(4)

    def answer():
        while True:
            connection, _ = control.accept()
            with connection:
                request = connection.makefile().readline().split()
                if request[:1] == ["cut"] and len(request) == 3:
                    reply = disk.cut(request[1], int(request[2]))
                else:
                    reply = "error unknown request {!r}".format(request)
                connection.sendall((reply + "\n").encode())

    threading.Thread(target=answer, daemon=True).start()
    # direct_io: the loop driver's writes reach here as it makes them (no page cache of the
    # served file in between); big_writes: up to 128 KiB a request.
    FUSE(disk, mount_point, foreground=True, nothreads=False, big_writes=True,
         max_write=131072, direct_io=True)


# ---- the test side ----------------------------------------------------------------------


def _skip(message):
    import pytest

    print(message)
    pytest.skip(message)


def _missing():
    """Why this machine cannot run a power cut, or None."""
    if os.geteuid() != 0:
        return "cannot run: a loop device over a FUSE file needs root (euid {})".format(
            os.geteuid())
    if not os.path.exists("/dev/fuse"):
        return "cannot run: no /dev/fuse"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
        if shutil.which(tool) is None:
            return "cannot run: {} is not installed".format(tool)
    probe = run_command(sys.executable, "-c", "import fuse")
    if probe.returncode != 0:
        last = (probe.stdout.strip().splitlines() or ["?"])[-1]
        return "cannot run: fusepy or libfuse2 is missing: {}".format(last)
    return None


class PowerCutDisk:
    def __init__(self, workdir, control_path, mount_point):
        self.workdir = workdir
        self.control_path = control_path
        self.mount_point = mount_point

    def cut(self, path, seed):
        """Writes to `path` the disk as a power cut now could leave it; returns the daemon's
        counts ("ok unflushed=N lost=M flushes=F writes=W")."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(120)
            connection.connect(self.control_path)
            connection.sendall("cut {} {}\n".format(path, seed).encode())
            reply = connection.makefile().readline().strip()
        assert reply.startswith("ok "), "the power cut failed: {}".format(reply)
        return reply


def _unmount(path):
    for _ in range(50):
        if run_command("umount", path).returncode == 0:
            return True
        run_command("sync")
        time.sleep(0.1)
    return run_command("umount", "-l", path).returncode == 0


@contextlib.contextmanager
def power_cut_disk(size_mib, workdir_parent="/var/tmp", image=None):
    """Yields a PowerCutDisk whose `mount_point` is a fresh ext4 of `size_mib` MiB, or the
    ext4 in a copy of `image` (one a cut left: mounting it replays its journal)."""
    why = _missing()
    if why:
        _skip(why)
    workdir = tempfile.mkdtemp(prefix="shardmq-powercut-", dir=workdir_parent)
    backing = os.path.join(workdir, "live.img")
    served = os.path.join(workdir, "served")
    mount_point = os.path.join(workdir, "mnt")
    control_path = os.path.join(workdir, "control.sock")
    os.mkdir(served)
    os.mkdir(mount_point)
    if image is None:
        with open(backing, "wb") as handle:
            handle.truncate(size_mib << 20)
    else:
        copied = run_command("cp", "--sparse=always", image, backing)
        assert copied.returncode == 0, "copying {} failed: {}".format(image, copied.stdout)
    daemon_log = open(os.path.join(workdir, "daemon.log"), "w")
    daemon = subprocess.Popen([sys.executable, os.path.abspath(__file__), backing, served,
                               control_path], stdout=daemon_log, stderr=subprocess.STDOUT)
    loop = None
    mounted = False
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(os.path.join(served, IMAGE))
                   and os.path.exists(control_path)):
            if daemon.poll() is not None or time.monotonic() > deadline:
                daemon_log.flush()
                with open(daemon_log.name) as log:
                    _skip("cannot run: the FUSE daemon did not serve its file: {}".format(
                        log.read().strip()[-400:]))
            time.sleep(0.05)
        attached = run_command("losetup", "--find", "--show", os.path.join(served, IMAGE))
        if attached.returncode != 0:
            _skip("cannot run: no loop device over a FUSE file here: {}".format(
                attached.stdout.strip()))
        loop = attached.stdout.strip()
        if image is None:
            # Inode tables and journal written now: no lazy init writing behind the test.
            made = run_command("mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                        "lazy_itable_init=0,lazy_journal_init=0", loop)
            assert made.returncode == 0, "mkfs.ext4 failed: {}".format(made.stdout)
        mounted_now = run_command("mount", loop, mount_point)
        if mounted_now.returncode != 0:
            _skip("cannot run: this machine refuses the mount: {}".format(
                mounted_now.stdout.strip()))
        mounted = True
        yield PowerCutDisk(workdir, control_path, mount_point)
    finally:
        if mounted:
            _unmount(mount_point)
        if loop:
            run_command("losetup", "-d", loop)
        run_command("umount", served)
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        daemon_log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def forget_light_checkpoints(data_dir):
    """A restart of the machine: each shard's light checkpoint (trusted only in the boot it
    names, and this test's power cuts do not restart the machine) names an earlier boot.
    One torn past parsing is left: the node ignores it anyway. Returns how many it changed."""
    changed = 0
    for shard in sorted(os.listdir(data_dir)):
        light_path = os.path.join(data_dir, shard, "checkpoint.light")
        if not shard.startswith("shard-") or not os.path.exists(light_path):
            continue
        try:
            with open(light_path) as light_file:
                light = json.load(light_file)
        except ValueError:
            continue
        light["boot"] = "a boot before the power loss"
        with open(light_path, "w") as out:
            json.dump(light, out)
        changed += 1
    return changed


@contextlib.contextmanager
def mounted_image(image):
    """Mounts an image a power cut left (ext4 replays its journal); yields the mount point."""
    mount_point = image + ".mnt"
    os.makedirs(mount_point, exist_ok=True)
    done = run_command("mount", "-o", "loop", image, mount_point)
    assert done.returncode == 0, "mounting {} failed: {}".format(image, done.stdout)
    try:
        yield mount_point
    finally:
        _unmount(mount_point)
        os.rmdir(mount_point)


if __name__ == "__main__":
    serve(*sys.argv[1:4])

"""Small filesystems made by a test: an ext4 image, loop-mounted, removed afterwards.

Needs root and loop devices. Where the machine forbids them, `small_filesystem` says why in
the test output and skips the test (never a silent pass).
"""

import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest


def run_command(*command):
    """Runs `command`; its exit status and output (stdout and stderr together)."""
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)


@contextlib.contextmanager
def small_filesystem(size_mib):
    """Yields the mount point of a fresh ext4 filesystem of `size_mib` MiB."""
    if os.geteuid() != 0:
        message = "cannot run: a loop-mounted filesystem needs root (euid {})".format(
            os.geteuid())
        print(message)
        pytest.skip(message)
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            message = "cannot run: {} is not installed".format(tool)
            print(message)
            pytest.skip(message)
    workdir = tempfile.mkdtemp(prefix="shardmq-smallfs-")
    image = os.path.join(workdir, "fs.img")
    mount_point = os.path.join(workdir, "mnt")
    os.mkdir(mount_point)
    mounted = False
    try:
        with open(image, "wb") as handle:
            handle.truncate(size_mib << 20)
        made = run_command("mkfs.ext4", "-q", "-F", "-m", "0", image)
        assert made.returncode == 0, "mkfs.ext4 failed: {}".format(made.stdout)
        mounted_now = run_command("mount", "-o", "loop", image, mount_point)
        if mounted_now.returncode != 0:
            message = "cannot run: this machine refuses a loop mount: {}".format(
                mounted_now.stdout.strip())
            print(message)
            pytest.skip(message)
        mounted = True
        yield mount_point
    finally:
        if mounted:
            for _ in range(20):
                if run_command("umount", mount_point).returncode == 0:
                    break
                run_command("sync")
        shutil.rmtree(workdir, ignore_errors=True)


# A node on a small filesystem that deletes (below diskMaxUsedSpaceRatio: recycles) each
# segment 0.72 s after its last write, looking every second; then the same node keeping all.
EVERY_HOUR = ";".join(str(hour) for hour in range(24))
RETENTION_ARGS = [
    "--allocation-window-mib", "64",
    "--fileReservedTime", "0.0002",  # 0.72 s
    "--deleteWhen", EVERY_HOUR,
    "--cleanResourceInterval", "1000",
]
KEEP_ALL_ARGS = ["--allocation-window-mib", "64", "--cleanFileForciblyEnable", "false"]


def free_bytes(path):
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(path, leave_bytes, name="filler"):
    """Writes a file under `path` that leaves about `leave_bytes` free; returns its path."""
    filler = os.path.join(path, name)
    size = max(0, free_bytes(path) - leave_bytes)
    with open(filler, "wb") as handle:
        chunk = b"\0" * (1 << 20)
        written = 0
        try:
            while written + len(chunk) <= size:
                handle.write(chunk)
                written += len(chunk)
            handle.flush()
            os.fsync(handle.fileno())
            if leave_bytes == 0:
                # Every last block: what is left after the MiB chunks, 4 KiB at a time.
                block = b"\0" * 4096
                while True:
                    handle.write(block)
                    handle.flush()
                    os.fsync(handle.fileno())
        except OSError:
            pass  # full already: that is what was asked
    return filler

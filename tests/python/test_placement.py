"""Placement: the kernel's io_uring workers of a shard run on the cores no shard runs on.

Under SYNC_FLUSH the kernel hands the fdatasync of each group commit (and on tmpfs every
write) to an io_uring worker of the shard's thread. A worker started on the shard's own core
took it from the shard in turns: a quarter of it, and a p99 of 55-80 ms on tmpfs instead of
13 ms (docs/performance.md). Checked on the real binary through /proc, pinned (the default
profile) and floating over one core (small-vm, as `scripts/bench-sync-limit.sh` runs it)."""

import os

import pytest

import remoting
from mq import create_topic

SENDS = 200


def tasks(pid):
    """(name, CPUs it may run on) of every thread of `pid`."""
    found = []
    for tid in os.listdir("/proc/{}/task".format(pid)):
        try:
            with open("/proc/{}/task/{}/comm".format(pid, tid)) as comm:
                name = comm.read().strip()
            found.append((name, os.sched_getaffinity(int(tid))))
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker that ended meanwhile
    return found


@pytest.mark.parametrize("profile", ["default", "small-vm"])
def test_io_uring_workers_run_off_the_core_of_the_shard(shardmq_factory, profile):
    online = sorted(os.sched_getaffinity(0))
    if len(online) < 2:
        print("could not run: this machine gives the test one CPU ({}), so no core is left "
              "for the io_uring workers".format(online))
        pytest.skip("one CPU only")
    shard_cpu, others = online[0], set(online[1:])
    node = shardmq_factory(shards=1, flush="sync",
                           extra_args=["--profile", profile, "--cpus", str(shard_cpu)])
    topic = create_topic(node, "Tplace", queue_nums=2)
    with remoting.RemotingClient.connect(node.broker_addr(0)) as client:
        for index in range(SENDS):
            response = remoting.call_retrying_busy(
                client, remoting.SEND_MESSAGE, remoting.send_message_ext(topic, index % 2),
                body="placed {}".format(index).encode())
            assert response.code == remoting.SUCCESS, "send #{} answered {!r}".format(
                index, response)
    refused = [line for line in node.log_tail().splitlines() if "cannot bind them" in line]
    if refused:
        print("could not run: this kernel refuses to bind io_uring workers "
              "(IORING_REGISTER_IOWQ_AFF): {}".format(refused[0]))
        pytest.skip("io_uring workers cannot be bound here")
    threads = tasks(node.process.pid)
    shard = [cpus for name, cpus in threads if name == "shard-0"]
    workers = [cpus for name, cpus in threads if name.startswith("iou-wrk")]
    print("profile {}: shard-0 on {}, {} io_uring workers on {}".format(
        profile, shard, len(workers), sorted({tuple(sorted(c)) for c in workers})))
    assert shard and all(cpus == {shard_cpu} for cpus in shard), threads
    # Each group commit's fdatasync went to a worker: at least one must be there.
    assert workers, "no io_uring worker after {} SYNC_FLUSH sends: {}".format(SENDS, threads)
    assert all(cpus == others for cpus in workers), threads

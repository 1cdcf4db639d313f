# SPDX-License-Identifier: Apache-2.0
# What a process group leaves behind: after init, a round of collectives and
# point to point (and Echo on loom), destroy_process_group() and gc.collect(),
# the threads (threading and /proc/self/task), the open descriptors and loom's
# /dev/shm files must be what they were before. One Gloo group's life first
# warms torch's own lazily started threads, so what remains is the backend's.
import gc
import glob
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ranks


def snapshot():
    return {"python threads": threading.active_count(),
            "tasks": len(os.listdir("/proc/self/task")),
            "fds": sorted(os.listdir("/proc/self/fd"))}


def fd_names(fds):
    out = []
    for fd in fds:
        try:
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            out.append(fd)
    return out


def life(rank, world, port, backend):
    ranks.init_env(rank, world, port, backend)
    t = torch.ones(1 << 16)
    for _ in range(3):
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.zeros(world * t.numel()), t) \
            if backend == "loom" else dist.all_gather([torch.zeros_like(t)] * world, t)
        w = dist.isend(t, dst=(rank + 1) % world)
        dist.recv(torch.zeros_like(t), src=(rank - 1) % world)
        w.wait()
    if backend == "loom":
        import loom_torch
        loom_torch.echo_all_reduce(torch.randn(4096), state=loom_torch.EchoState(4096, torch.float32))
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def settle(before, limit=5.0):
    """Threads may take a moment to be joined; wait up to `limit` for them."""
    deadline = time.monotonic() + limit
    while True:
        now = snapshot()
        if now == before or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def cycles(rank, world, port, port2):
    life(rank, world, port, "gloo")
    time.sleep(0.2)
    before = snapshot()
    life(rank, world, port2, ranks.BACKEND)
    after = settle(before)
    report = {}
    for key in ["python threads", "tasks"]:
        if after[key] != before[key]:
            report[key] = f"{before[key]} before, {after[key]} after"
    if after["fds"] != before["fds"]:
        report["fds"] = (f"opened: {fd_names(set(after['fds']) - set(before['fds']))}, "
                         f"closed: {sorted(set(before['fds']) - set(after['fds']))}")
    return os.getpid(), report


@pytest.mark.parametrize("world,net", [(2, "shm"), (3, "tcp")])
def test_nothing_left_behind(world, net):
    res = ranks.run(cycles, world, ranks.free_port(), timeout=60, env={"LOOM_NET": net})
    leaks = [f"rank {r}: {k}: {v}" for r, (_, rep) in enumerate(res) for k, v in rep.items()]
    # Segments are unlinked at destroy; none of these ranks' may remain.
    for rank, (pid, _) in enumerate(res):
        leaks += [f"rank {rank}: {f} left in /dev/shm" for f in glob.glob(f"/dev/shm/loom-{pid}-*")]
    assert not leaks, "\n".join(leaks)

# SPDX-License-Identifier: Apache-2.0
# Forks N ranks once per test case, runs one function in each, and brings every
# rank's result or traceback back to the parent, which asserts on them. Forking
# after torch is imported keeps a case's start cheap; a deadline kills stuck
# ranks so that a hang fails the case instead of the suite.
import multiprocessing
import os
import pickle
import socket
import signal
import time
import traceback

import torch  # noqa: F401  (imported before fork on purpose)
import torch.distributed as dist

# The backend under test. "gloo" checks the harness itself with Gloo standing in
# for loom (LOOM_TORCH_TEST_BACKEND=gloo); everything loom-only is skipped then.
BACKEND = os.environ.get("LOOM_TORCH_TEST_BACKEND", "loom")
IS_LOOM = BACKEND == "loom"
if IS_LOOM:
    import loom_torch  # noqa: F401  (registers the backend)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(rank, world, port):
    """The variables torchrun sets for one worker on one host."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def init_env(rank, world, port, backend=None):
    """init_process_group as under torchrun: env:// and nothing else."""
    os.environ.update(torchrun_env(rank, world, port))
    dist.init_process_group(backend or BACKEND)


def _child(fn, rank, world, port, env, conn, args):
    # Plain pickle: Connection.send would share tensors through file
    # descriptors that die with this process.
    try:
        os.environ.update(env)
        reply = pickle.dumps(("ok", fn(rank, world, port, *args)))
    except BaseException:  # noqa: B902  (everything goes back to the parent)
        reply = pickle.dumps(("error", traceback.format_exc()))
    try:
        conn.send_bytes(reply)
    finally:
        conn.close()
        # Skip atexit and torch's teardown: the parent's handlers are not ours.
        os._exit(0)


class RankFailure(AssertionError):
    pass


def run(fn, world, *args, timeout=60.0, env=None, allow_dead=()):
    """Runs fn(rank, world, port, *args) on `world` forked ranks.

    Returns each rank's return value (None for ranks in allow_dead that died
    without reporting). Raises RankFailure naming every rank that raised, died
    or missed the deadline, with its traceback.
    """
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs, conns = [], []
    for rank in range(world):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world, port, dict(env or {}),
                                             child_end, args), daemon=True)
        p.start()
        child_end.close()
        procs.append(p)
        conns.append(parent_end)
    deadline = time.monotonic() + timeout
    results, failures = [None] * world, []
    for rank, (p, c) in enumerate(zip(procs, conns)):
        left = max(0.0, deadline - time.monotonic())
        if c.poll(left):
            try:
                status, value = pickle.loads(c.recv_bytes())
            except EOFError:
                status, value = "dead", "exited without a result"
        else:
            status, value = "timeout", f"no result within {timeout:.0f} s"
        if status == "ok":
            results[rank] = value
        elif not (rank in allow_dead and status == "dead"):
            failures.append(f"--- rank {rank} of {world}: {status}\n{value}")
    for p in procs:
        p.join(max(0.0, min(5.0, deadline - time.monotonic())))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    if failures:
        raise RankFailure("\n".join(failures))
    return results

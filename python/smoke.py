#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# smoke.py - a short check of the torch.distributed backend "loom" on two
# forked ranks over env://: all_reduce (sync and async), all_gather,
# reduce_scatter, all_to_all_single with splits, isend/irecv both ways,
# Echo, a new_group and teardown. Exits 77 (skipped) without torch.
import os
import socket
import sys
import traceback

# This folder holds the package's sources, without _C: use the one on PYTHONPATH.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

try:
    import torch
    import torch.distributed as dist
    import multiprocessing as mp
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

WORLD = 2


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def body(rank):
    n = WORLD
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((5,), 3.0)), f"all_reduce sum: {t}")

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    w.wait()
    check(w.is_completed() and torch.equal(t, torch.arange(6.0).reshape(2, 3).t()),
          f"async all_reduce max: {t}")
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    check(torch.equal(fut.wait()[0], torch.full((3,), 2.0)), "all_reduce future")

    outs = [torch.zeros(4, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.full((4,), rank * 10, dtype=torch.int64))
    check(all(torch.equal(outs[r], torch.full((4,), r * 10)) for r in range(n)),
          f"all_gather: {outs}")

    out = torch.zeros(3)
    dist.reduce_scatter(out, [torch.full((3,), float(r + rank)) for r in range(n)])
    check(torch.equal(out, torch.full((3,), float(2 * rank + 1))), f"reduce_scatter: {out}")

    # rank r sends r+1 rows to rank 0 and r+2 rows to rank 1 (rows of 2)
    in_splits = [rank + 1 + j for j in range(n)]
    out_splits = [r + 1 + rank for r in range(n)]
    inp = torch.cat([torch.full((s, 2), float(10 * rank + j)) for j, s in enumerate(in_splits)])
    outp = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(outp, inp, out_splits, in_splits)
    want = torch.cat([torch.full((s, 2), float(10 * r + rank)) for r, s in enumerate(out_splits)])
    check(torch.equal(outp, want), f"all_to_all_single: {outp}")

    peer = 1 - rank
    send = torch.full((1000,), float(rank))
    recv = torch.zeros(1000)
    ws = dist.isend(send, peer)
    wr = dist.irecv(recv, peer)
    ws.wait()
    wr.wait()
    check(torch.equal(recv, torch.full((1000,), float(peer))), "isend/irecv")

    import loom_torch
    x = torch.full((256,), float(rank + 1))
    state = loom_torch.EchoState(x.numel(), torch.float32)
    loom_torch.echo_all_reduce(x, state=state)
    check(torch.allclose(x, torch.full((256,), 3.0), rtol=0.1), f"echo: {x[:4]}")

    g = dist.new_group([0, 1])
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    check(torch.equal(t, torch.full((2,), 2.0)), "new_group all_reduce")
    dist.barrier(g)
    dist.destroy_process_group(g)


def run(rank, port, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(WORLD))
        import loom_torch  # noqa: F401  registers the backend
        dist.init_process_group("loom", init_method="env://")
        check(dist.get_backend() == "loom", "backend name")
        body(rank)
        dist.destroy_process_group()
        q.put((rank, None))
    except BaseException:
        q.put((rank, traceback.format_exc()))


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, port, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    failed = False
    for _ in procs:
        try:
            rank, err = q.get(timeout=120)
        except Exception:
            print("a rank did not finish in 120 s")
            failed = True
            break
        if err:
            print(f"rank {rank} failed:\n{err}")
            failed = True
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            failed = True
        elif p.exitcode != 0:
            failed = True
    print("torch smoke: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

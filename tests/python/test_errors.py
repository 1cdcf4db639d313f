# SPDX-License-Identifier: Apache-2.0
# Bad input on every rank alike: an unsupported dtype, reduce ops loom does not
# have, tags, and sizes that do not fit together. Each must raise a RuntimeError
# with a message that says what is wrong, never crash or hang, and leave the
# group usable: an all_reduce after all of them still gives the right sum.
# Ranks that disagree (an all_reduce of a different count on each) must all
# get a RuntimeError that names the counts, then one for every later call on
# the broken group, and destroy_process_group() must still return. A monitored
# barrier that some ranks miss names them, and leaves the group usable.
import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import ranks


def cases(world):
    """(name, call, a pattern the message must match) for every rank."""
    t = torch.ones(8)
    out = [
        ("all_gather output of the wrong size",
         lambda: dist.all_gather([torch.zeros(7) for _ in range(world)], t), r"size|shape|numel|element"),
        ("all_to_all_single splits that miss the input",
         lambda: dist.all_to_all_single(torch.zeros(8), t, [1] * world, [1] * world), r"split|size|element"),
    ]
    if not ranks.IS_LOOM:
        return out
    return out + [
        ("int16 all_reduce", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)),
         r"int16|short"),
        ("int16 broadcast", lambda: dist.broadcast(torch.ones(4, dtype=torch.int16), 0),
         r"int16|short"),
        ("int16 all_gather", lambda: dist.all_gather(
            [torch.zeros(2, dtype=torch.int16) for _ in range(world)],
            torch.ones(2, dtype=torch.int16)), r"int16|short"),
        ("all_gather of float64 into float32 outputs", lambda: dist.all_gather(
            [torch.zeros(2) for _ in range(world)], torch.ones(2, dtype=torch.float64)),
         r"dtype|type|float"),
        ("PREMUL_SUM", lambda: dist.all_reduce(torch.ones(4), op=dist._make_nccl_premul_sum(2.0)),
         r"premul"),
        ("BAND", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND),
         r"band"),
        ("BXOR", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BXOR),
         r"bxor"),
        ("all_gather_into_tensor output not world x input",
         lambda: dist.all_gather_into_tensor(torch.zeros(8 * world + 1), t), r"size|numel|element"),
        ("reduce_scatter_tensor input not world x output",
         lambda: dist.reduce_scatter_tensor(torch.zeros(8), torch.ones(8 * world - 1)), r"size|numel|element"),
        ("reduce_scatter list of the wrong length",
         lambda: dist.reduce_scatter(torch.zeros(8), [t] * (world + 1)), r"size|list|number|length|element"),
        ("a tag other than 0", lambda: dist.send(t, dst=1, tag=1) if dist.get_rank() == 0
         else dist.recv(torch.zeros(8), src=0, tag=1) if dist.get_rank() == 1
         else dist.send(t, dst=0, tag=2), r"tag"),
        ("reduce_scatter of mismatched sizes",
         lambda: dist.reduce_scatter(torch.zeros(8), [torch.ones(9)] * world), r"size|shape|numel|element"),
    ]


def bad_input(rank, world, port):
    ranks.init_env(rank, world, port)
    failures = []
    for name, call, pattern in cases(world):
        try:
            call()
            failures.append(f"rank {rank}: {name}: no error")
        except RuntimeError as e:
            if not re.search(pattern, str(e), re.IGNORECASE):
                failures.append(f"rank {rank}: {name}: message does not match /{pattern}/: {e}")
        except Exception as e:  # noqa: B902  (the wrong kind of error is a failure too)
            failures.append(f"rank {rank}: {name}: {type(e).__name__} instead of RuntimeError: {e}")
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    if t.tolist() != [world * (world - 1) / 2] * 3:
        failures.append(f"rank {rank}: all_reduce after the errors gave {t.tolist()}")
    dist.destroy_process_group()
    return failures


@pytest.mark.parametrize("world", [2, 3])
def test_bad_input(world):
    failures = sum(ranks.run(bad_input, world, timeout=30, env={"LOOM_NET": "shm"}), [])
    assert not failures, "\n".join(failures)


def mismatch(rank, world, port):
    ranks.init_env(rank, world, port)
    out = []
    for what, call in [("all_reduce of 10 + 2 x rank elements",
                        lambda: dist.all_reduce(torch.ones(10 + 2 * rank))),
                       ("the next all_reduce", lambda: dist.all_reduce(torch.ones(4)))]:
        start = time.monotonic()
        try:
            call()
            out.append((what, None, 0.0))
        except RuntimeError as e:
            out.append((what, str(e), time.monotonic() - start))
    dist.destroy_process_group()
    return out


@pytest.mark.skipif(not ranks.IS_LOOM, reason="Gloo does not check that ranks agree")
def test_ranks_that_disagree():
    for rank, res in enumerate(ranks.run(mismatch, 3, timeout=30, env={"LOOM_NET": "shm"})):
        (first, msg, took), (second, msg2, _) = res
        assert msg, f"rank {rank}: {first}: no error"
        assert re.search(r"mismatch|differ", msg) and "count" in msg, f"rank {rank}: {first}: {msg}"
        assert took < 5, f"rank {rank}: {first}: the error took {took:.1f} s"
        assert msg2, f"rank {rank}: {second} on the broken group: no error"


def monitored(rank, world, port):
    ranks.init_env(rank, world, port)
    # torch 1.13's dist.monitored_barrier refuses every backend but Gloo; the process group's
    # own method is what it calls.
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(timedelta(seconds=60))  # every rank arrives: passes
    out = {"err": None, "secs": 0.0}
    if rank >= 2:
        time.sleep(3)  # misses the next monitored barrier
    else:
        start = time.monotonic()
        try:
            pg.monitored_barrier(timedelta(seconds=1), wait_all_ranks=True)
        except RuntimeError as e:
            out["err"] = str(e)
        out["secs"] = time.monotonic() - start
    dist.barrier()  # together again: the group still works
    t = torch.ones(4)
    dist.all_reduce(t)
    out["sum"] = t[0].item()
    dist.destroy_process_group()
    return out


# monitored_barrier as Gloo's: rank 0 names every rank that did not arrive within the timeout
# (wait_all_ranks), the others time out waiting for rank 0, and the group still works after.
@pytest.mark.skipif(not ranks.IS_LOOM, reason="a failed Gloo monitoredBarrier closes the group's "
                    "connections, so the group does not work after it")
def test_monitored_barrier_names_the_missing_ranks():
    res = ranks.run(monitored, 4, timeout=60, env={"LOOM_NET": "shm"})
    zero, one = res[0], res[1]
    assert zero["err"] and re.search(r"Ranks 2, 3 failed to pass monitoredBarrier", zero["err"]), \
        f"rank 0: {zero['err']}"
    assert one["err"] and re.search(r"monitoredBarrier|timed out|timeout", one["err"], re.I), \
        f"rank 1: {one['err']}"
    for rank in (0, 1):
        assert res[rank]["secs"] < 10, f"rank {rank}: monitored_barrier took {res[rank]['secs']:.1f} s"
    for rank, r in enumerate(res):
        assert r["sum"] == 4.0, f"rank {rank}: all_reduce afterwards gave {r['sum']}"

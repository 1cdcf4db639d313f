# SPDX-License-Identifier: Apache-2.0
# What the grids compare against: deterministic per-rank inputs that every rank
# can rebuild for any other rank, the local references for what Gloo lacks, the
# four ways of waiting for a Work, non-contiguous views, and a checker that
# collects every mismatch of a grid instead of stopping at the first.
import time

import torch
import torch.distributed as dist

FLOATS = [torch.float32, torch.float64]
HALVES = [torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int32, torch.int64, torch.uint8]
ALL_DTYPES = FLOATS + HALVES + INTS + [torch.bool]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
MODES = ["sync", "wait", "poll", "future"]


def values(rank, salt, numel, dtype, op="sum"):
    """Rank `rank`'s input. Floats are multiples of 1/8 with few bits, so that
    sums and products over 4 ranks are exact in any order (Gloo's order need
    not be loom's); half types are Gaussian, so that rounding once differs from
    rounding at every step; integers stay small enough that products of 4
    ranks do not wrap."""
    g = torch.Generator().manual_seed(1000003 * (rank + 1) + 7919 * salt + numel)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype in HALVES:
        return torch.randn(numel, generator=g).to(dtype)
    if dtype.is_floating_point:
        lim = 12 if op == "product" else 64
        return (torch.randint(-lim, lim + 1, (numel,), generator=g).to(torch.float64) / 8).to(dtype)
    lo, hi = {"product": (-3, 4)}.get(op, (-20, 21))
    if dtype == torch.uint8:
        lo = 0
    return torch.randint(lo, hi, (numel,), generator=g).to(dtype)


def reduce_ref(inputs, op, dtype):
    """The reduction of all ranks' inputs as loom defines it: bool SUM/MAX is
    or, PRODUCT/MIN is and; half types accumulate in float32 in rank order
    and round once."""
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in ("sum", "max") else stack.all(0)
    acc_t = torch.float32 if dtype in HALVES else dtype
    acc = inputs[0].to(acc_t).clone()
    for x in inputs[1:]:
        x = x.to(acc_t)
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "product":
            acc = acc * x
        elif op == "min":
            acc = torch.minimum(acc, x)
        else:
            acc = torch.maximum(acc, x)
    if op == "avg":
        acc = (acc.to(torch.float64) / len(inputs)).to(acc_t)
    return acc.to(dtype)


def start(op_fn, mode):
    """Calls op_fn(async_op) and finishes it in `mode`."""
    work = op_fn(mode != "sync")
    if mode == "sync":
        return
    # all_reduce_coalesced and all_gather_coalesced hand back the Future itself.
    is_future = isinstance(work, torch._C.Future)
    if mode == "wait":
        work.wait()
    elif mode == "poll":
        deadline = time.monotonic() + 30
        while not (work.done() if is_future else work.is_completed()):
            if time.monotonic() > deadline:
                raise RuntimeError("is_completed() stayed False for 30 s")
            time.sleep(0.0002)
    else:
        (work if is_future else work.get_future()).wait()


def view(x, layout):
    """x's values in `layout`: 'contig' as is; 't' the transpose of a
    contiguous matrix (strided for a prime size); 'strided' every other element of a bigger buffer whose
    other elements must stay untouched (the buffer is returned to check)."""
    n = x.numel()
    if layout == "contig":
        return x.clone(), None
    rows = next((d for d in range(2, n) if n % d == 0), None)
    if layout == "t" and rows:
        base = torch.empty((rows, n // rows), dtype=x.dtype)
        v = base.t()
        v.copy_(x.reshape(n // rows, rows))
        return v, base
    base = torch.zeros(2 * n, dtype=x.dtype)
    base[1::2] = _sentinel(x.dtype)
    v = base[0::2]
    v.copy_(x)
    return v, base


def _sentinel(dtype):
    return True if dtype == torch.bool else 7


def untouched(base):
    """The elements a strided view leaves out are still the sentinel."""
    if base is None or base.dim() != 1:
        return True
    return bool((base[1::2] == _sentinel(base.dtype)).all())


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.count = 0

    def eq(self, what, got, want):
        self.count += 1
        got = got.reshape(want.shape) if got.numel() == want.numel() else got
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()[:4].flatten().tolist() if got.shape == want.shape else "shape"
            self.failures.append(f"rank {self.rank}: {what}: got {got.dtype}{tuple(got.shape)} "
                                 f"{got.flatten()[:6].tolist()} want {want.dtype}{tuple(want.shape)} "
                                 f"{want.flatten()[:6].tolist()} (first differing at {bad})")

    def close(self, what, got, want):
        """For AVG, where dividing by the rank count may round either way."""
        self.count += 1
        try:
            torch.testing.assert_close(got.reshape(want.shape), want)
        except AssertionError as e:
            self.failures.append(f"rank {self.rank}: {what}: {e}")

    def true(self, what, cond):
        self.count += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {what}")

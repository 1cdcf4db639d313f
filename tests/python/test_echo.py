# SPDX-License-Identifier: Apache-2.0
# Echo through loom_torch: the same bytes on every rank, a bounded relative
# error on Gaussian data for each dtype it takes, error feedback (with one
# EchoState over 10 calls of the same input the sum of the outputs stays
# within about one call's error of the exact sum, where without feedback the
# errors add up), async Work, and clear errors for a state that does not fit.
import pytest
import torch
import torch.distributed as dist

import ranks

pytestmark = pytest.mark.skipif(not ranks.IS_LOOM, reason="Echo is loom's alone")

N = 1 << 15
CALLS = 10


def gaussian(rank, n, dtype, salt=0):
    g = torch.Generator().manual_seed(97 * rank + salt)
    return torch.randn(n, generator=g).to(dtype)


def rel(err, ref):
    return float(err.double().norm() / ref.double().norm())


def echo(rank, world, port):
    import loom_torch

    ranks.init_env(rank, world, port)
    out = {}
    for dtype in [torch.float32, torch.float16, torch.bfloat16]:
        exact = sum(gaussian(r, N, dtype).double() for r in range(world))
        t = gaussian(rank, N, dtype)
        loom_torch.echo_all_reduce(t)
        out[f"{dtype} result"] = t.clone()
        out[f"{dtype} relative error"] = rel(t.double() - exact, exact)

    # Error feedback: one state, the same input 10 times.
    exact = sum(gaussian(r, N, torch.float32, 1).double() for r in range(world))
    once = gaussian(rank, N, torch.float32, 1)
    loom_torch.echo_all_reduce(once)
    state = loom_torch.EchoState(N, torch.float32)
    total = torch.zeros(N, dtype=torch.float64)
    for k in range(CALLS):
        t = gaussian(rank, N, torch.float32, 1)
        work = loom_torch.echo_all_reduce(t, state=state, async_op=k % 2 == 1)
        if work is not None:
            work.wait()
        total += t.double()
    out["one call's error"] = float((once.double() - exact).norm())
    out["sum's error"] = float((total - CALLS * exact).norm())
    out["fed back"] = total.clone()

    errors = {}
    for name, call in [
        ("state of another numel", lambda: loom_torch.echo_all_reduce(
            torch.ones(N // 2), state=state)),
        ("state of another dtype", lambda: loom_torch.echo_all_reduce(
            torch.ones(N, dtype=torch.bfloat16), state=state)),
        ("int32 tensor", lambda: loom_torch.echo_all_reduce(torch.ones(8, dtype=torch.int32))),
    ]:
        try:
            call()
            errors[name] = None
        except RuntimeError as e:
            errors[name] = str(e)
    out["errors"] = errors
    t = torch.full((4,), 1.0)
    dist.all_reduce(t)
    out["after errors"] = t.tolist()
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("world,net", [(2, "shm"), (3, "tcp")])
def test_echo(world, net):
    res = ranks.run(echo, world, timeout=90, env={"LOOM_NET": net})
    for key in [k for k in res[0] if k.endswith("result")] + ["fed back"]:
        for r in range(1, world):
            assert torch.equal(res[r][key], res[0][key]), f"{key}: rank {r} differs from rank 0"
    for key in [k for k in res[0] if k.endswith("relative error")]:
        assert 0 < res[0][key] < 0.2, f"{key}: relative L2 error {res[0][key]:.4f}"
    one, fed = res[0]["one call's error"], res[0]["sum's error"]
    assert fed < 1.5 * one, (f"{CALLS} calls with feedback: |sum - exact| = {fed:.3f}, one call's "
                             f"error {one:.3f}: feedback does not cancel")
    for name, msg in res[0]["errors"].items():
        assert msg, f"{name}: no error"
        assert "echo" in msg.lower() or "state" in msg.lower(), f"{name}: unclear message: {msg}"
    assert res[0]["after errors"] == [float(world)] * 4

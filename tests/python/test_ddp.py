# SPDX-License-Identifier: Apache-2.0
# DistributedDataParallel on the backend against the same run on Gloo: a small
# MLP, 20 steps of SGD with momentum, gradients in several small buckets, and
# one step that accumulates a micro-batch under no_sync(). On 2 ranks a sum of
# two numbers has one rounding whatever the order, so the parameters must be
# equal bit for bit after every step; on 3 ranks the order may differ, so
# within 1e-6. With PowerSGD's communication hook, whose future callbacks issue
# and wait for further all-reduces of the same group, the same holds.
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import ranks

STEPS = 20
NO_SYNC_STEP = 7


def mlp():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4))


def batch(rank, step, micro=0):
    g = torch.Generator().manual_seed(10007 * rank + 31 * step + micro)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(pg, rank, hook):
    torch.manual_seed(99 + rank)  # DDP must broadcast rank 0's parameters
    model = mlp()
    if rank:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    if hook == "powersgd":
        # One bucket: the hook's callbacks issue collectives when the bucket's all-reduce
        # completes, and with several buckets in flight they would race with the next bucket's
        # all-reduce on the autograd thread, in another order on each rank (docs/torch.md).
        ddp = DDP(model, process_group=pg)
        state = powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=2,
                                            start_powerSGD_iter=3)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        # The first bucket has its own cap (1 MiB), larger than this whole model.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4096
        ddp = DDP(model, process_group=pg, bucket_cap_mb=0.002)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    params = []
    for step in range(STEPS):
        opt.zero_grad()
        if step == NO_SYNC_STEP:
            with ddp.no_sync():
                x, y = batch(rank, step, 1)
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        params.append([p.detach().clone() for p in ddp.parameters()])
    return params, len(ddp.reducer._get_zeros_like_grad_buckets())


def ddp_run(rank, world, port, hook):
    ranks.init_env(rank, world, port)
    gloo = dist.new_group(backend="gloo")
    got, buckets = train(None, rank, hook)
    want, _ = train(gloo, rank, hook)
    dist.destroy_process_group()
    return got, want, buckets


@pytest.mark.parametrize("world,net,hook", [(2, "shm", None), (3, "tcp", None),
                                            (2, "shm", "powersgd")])
def test_ddp_matches_gloo(world, net, hook):
    res = ranks.run(ddp_run, world, hook, timeout=120, env={"LOOM_NET": net})
    for rank, (got, want, buckets) in enumerate(res):
        if hook is None:
            assert buckets > 2, f"rank {rank}: {buckets} gradient bucket(s), want several"
        for step, (g, w) in enumerate(zip(got, want)):
            for k, (a, b) in enumerate(zip(g, w)):
                if world == 2:
                    assert torch.equal(a, b), (f"rank {rank} step {step} parameter {k}: max "
                                               f"difference {(a - b).abs().max().item():.3g}")
                else:
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-6,
                                               msg=lambda m: f"rank {rank} step {step} param {k}: {m}")
        # Every rank holds the same model.
        for step in range(len(got)):
            for a, b in zip(got[step], res[0][0][step]):
                assert torch.equal(a, b), f"rank {rank} step {step}: parameters differ from rank 0's"

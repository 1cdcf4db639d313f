#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# tp_echo.py - one tensor-parallel MLP block (Megatron's split: the first
# weight by columns, the second by rows) whose partial outputs are summed by an
# all-reduce, and the same block with Echo, loom's 4-bit all-reduce, switched
# on by one line (the --echo branch below). Each rank checks its output against
# the whole block computed in one process, prints the largest error and fails
# when a sum is wrong (an exact all-reduce off by more than float rounding, or
# Echo's error feedback not closing in). It starts as ddp_train.py does:
# loomrun, torchrun's variables or --spawn N.
import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ddp_train


def block_weights(dim, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(dim, hidden, generator=g) / dim ** 0.5,
            torch.randn(hidden, dim, generator=g) / hidden ** 0.5)


def run_rank(args):
    rank, world = ddp_train.init_rank(args)
    w1, w2 = block_weights(args.dim, args.hidden, args.seed)
    cols = slice(rank * args.hidden // world, (rank + 1) * args.hidden // world)
    w1_mine, w2_mine = w1[:, cols], w2[cols, :]  # this rank's shard of the block
    x = torch.randn(args.tokens, args.dim, generator=torch.Generator().manual_seed(args.seed + 1))
    want = F.gelu(x @ w1) @ w2

    all_reduce = dist.all_reduce
    if args.echo:
        import loom_torch
        echo = loom_torch.EchoState(args.tokens * args.dim, torch.float32, None)
        all_reduce = lambda t: loom_torch.echo_all_reduce(t, state=echo)  # noqa: E731

    total, first = torch.zeros_like(want), None
    for step in range(args.steps):
        out = F.gelu(x @ w1_mine) @ w2_mine  # this rank's partial sum of the output
        all_reduce(out)
        total += out
        # Echo carries each call's rounding error into the next, so the mean over steps
        # comes closer to the exact sum than any one step does
        err, err_mean = (float((y - want).abs().max() / want.abs().max())
                         for y in (out, total / (step + 1)))
        if rank == 0:
            print(f"step {step}: {'echo' if args.echo else 'all_reduce'} over {world} ranks, "
                  f"largest error / largest output {err:.2e}, of the mean over steps "
                  f"{err_mean:.2e}", flush=True)
        first = err if first is None else first
    dist.destroy_process_group()
    # exact sums differ from one process's only by the order of float additions; Echo's
    # feedback must at least halve the error of the mean within 4 steps
    if (not args.echo and err > 1e-5) or (args.echo and args.steps >= 4 and err_mean > first / 2):
        sys.exit(f"tp_echo.py: rank {rank}: error {err:.2e}, of the mean {err_mean:.2e}, "
                 f"first step {first:.2e}: the sum is wrong")


def main():
    ap = argparse.ArgumentParser(description="a tensor-parallel MLP block, with or without Echo")
    ap.add_argument("--backend", choices=["loom", "gloo"], default="loom")
    ap.add_argument("--echo", action="store_true", help="sum the partials with Echo (loom only)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--spawn", type=int, metavar="N", help="start N local ranks")
    args = ap.parse_args()
    if args.echo and args.backend != "loom":
        ap.error("--echo is loom's: use it with --backend loom")
    return ddp_train.launch(run_rank, args, args.spawn, "tp_echo.py")


if __name__ == "__main__":
    sys.exit(main())

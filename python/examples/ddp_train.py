#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# ddp_train.py - a small MLP trained with torch's DistributedDataParallel on
# synthetic data (float32, fixed seed), over the loom or the gloo backend of
# torch.distributed: the same program either way, the backend is one flag.
# Rank 0 prints the loss of every step and, at the end, one JSON line with the
# median step time; every rank fails if the replicas' parameters then differ. It starts under loomrun (LOOM_* variables), under
# torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT), or forks its own ranks with --spawn N. bench/compare's
# torch_bench.py imports make_model, make_batch and train from here to time
# the same step. It is not a training recipe: the data is noise whose targets
# come from a fixed random teacher, so that the loss has something to fall to.
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

WARMUP_STEPS = 2  # left out of the median: the first steps build DDP's buckets


def make_model(dim, hidden, layers, outputs, seed):
    """The same weights on every rank (DDP would broadcast rank 0's anyway)."""
    torch.manual_seed(seed)
    mods = [nn.Linear(dim, hidden), nn.GELU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(hidden, hidden), nn.GELU()]
    mods.append(nn.Linear(hidden, outputs))
    return nn.Sequential(*mods)


def make_batch(step, rank, batch, dim, outputs, seed):
    """Rank r's shard of step s: inputs from a generator seeded by (seed, s, r),
    targets tanh(x T) from a teacher T that only the seed decides."""
    teacher = torch.randn(dim, outputs, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 4099 + rank)
    x = torch.randn(batch, dim, generator=g)
    return x, torch.tanh(x @ teacher / dim ** 0.5)


def train(model, args, rank, log=print):
    """args.steps Adam steps of model (already wrapped in DDP); returns (losses,
    step seconds). Each step: forward, loss, backward (DDP's all-reduces), update."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    losses, secs = [], []
    for step in range(args.steps):
        x, y = make_batch(step, rank, args.batch, args.dim, args.outputs, args.seed)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        secs.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if log:
            log(f"step {step} loss {losses[-1]:.4f} time {secs[-1] * 1e3:.2f} ms")
    return losses, secs


def median_ms(secs):
    timed = secs[WARMUP_STEPS:] if len(secs) > WARMUP_STEPS else secs
    return statistics.median(timed) * 1e3


def env_from_loomrun(env):
    """loomrun sets LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE and
    LOOM_COMM_ID=host:port; torch's env:// wants RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT. Fills in what is missing; torchrun's own variables win."""
    pairs = {"RANK": "LOOM_RANK", "WORLD_SIZE": "LOOM_WORLD_SIZE",
             "LOCAL_RANK": "LOOM_LOCAL_RANK", "LOCAL_WORLD_SIZE": "LOOM_LOCAL_SIZE"}
    for torch_var, loom_var in pairs.items():
        if torch_var not in env and loom_var in env:
            env[torch_var] = env[loom_var]
    comm_id = env.get("LOOM_COMM_ID", "")
    if "MASTER_ADDR" not in env and comm_id.rpartition(":")[2].isdigit():
        host, _, port = comm_id.rpartition(":")
        # torch's store takes the port loomrun found free; the backend meets through
        # that store, so nothing else binds it
        env["MASTER_ADDR"], env["MASTER_PORT"] = host.strip("[]"), port


def import_backend(backend):
    if backend == "loom":
        try:
            import loom_torch  # noqa: F401 - registers the "loom" backend
        except ImportError as e:
            sys.exit(f"backend loom needs loom_torch ({e})\n"
                     "HINT: build loom (ninja -C build) and set PYTHONPATH=build/python")


def init_rank(args):
    """Joins the process group of args.backend from RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT; one intra-op thread per CPU this rank may use. Returns (rank, world)."""
    import_backend(args.backend)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local))
    dist.init_process_group(args.backend, init_method="env://", rank=rank, world_size=world)
    return rank, world


def replicas_equal(model):
    """Whether every rank holds rank 0's parameters bit for bit, as DDP promises."""
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    theirs = mine.clone()
    dist.broadcast(theirs, 0)
    differ = torch.tensor([int(not torch.equal(mine, theirs))])
    dist.all_reduce(differ)
    return int(differ.item()) == 0


def run_rank(args):
    rank, world = init_rank(args)
    model = DistributedDataParallel(
        make_model(args.dim, args.hidden, args.layers, args.outputs, args.seed))
    losses, secs = train(model, args, rank, log=print if rank == 0 else None)
    equal = replicas_equal(model)
    if rank == 0:
        nparams = sum(p.numel() for p in model.parameters())
        print(json.dumps({"backend": args.backend, "world_size": world, "steps": args.steps,
                          "batch": args.batch, "params": nparams,
                          "median_step_ms": round(median_ms(secs), 3),
                          "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
                          "replicas_equal": equal}), flush=True)
    # torch 1.13: a gloo group whose last reference is DDP's reducer is destroyed at
    # interpreter exit, joining its threads while one of them waits for the GIL to free a
    # tensor; so the reducer goes first and the barrier lets those threads finish
    del model
    dist.barrier()
    dist.destroy_process_group()
    if not equal:
        sys.exit(f"ddp_train.py: rank {rank}: the ranks' parameters differ after "
                 f"{args.steps} steps")


def spawned(rank, rank_fn, args):
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    rank_fn(args)


def launch(rank_fn, args, nspawn, prog):
    """rank_fn(args) on nspawn ranks forked by torch.multiprocessing, or on this
    process as one rank of loomrun's or torchrun's job."""
    import_backend(args.backend)  # a missing extension is said once, before any rank starts
    if nspawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          WORLD_SIZE=str(nspawn), LOCAL_WORLD_SIZE=str(nspawn))
        torch.multiprocessing.spawn(spawned, args=(rank_fn, args), nprocs=nspawn)
        return 0
    env_from_loomrun(os.environ)
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        sys.exit(f"{prog}: {', '.join(missing)} not set\nHINT: start it with loomrun -n N, "
                 "with torchrun's variables, or with --spawn N")
    rank_fn(args)
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="DDP training of a small MLP over loom or gloo")
    ap.add_argument("--backend", choices=["loom", "gloo"], default="loom")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    ap.add_argument("--dim", type=int, default=256, help="input features")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4, help="hidden layers")
    ap.add_argument("--outputs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--spawn", type=int, metavar="N",
                    help="start N local ranks with torch.multiprocessing")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.layers < 1 or (args.spawn or 1) < 1:
        ap.error("--steps, --batch, --layers and --spawn want at least 1")
    return args


def main():
    args = parse_args()
    return launch(run_rank, args, args.spawn, "ddp_train.py")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torch_forward.py - one rank of torch.distributed's "nccl" backend on cuda:0, for
tools/device_check.sh (stage S5_torch_forward, docs/nccl-plugins.md "GPU check").

  torch_forward.py run OUT.json
      init_process_group("nccl") with a FileStore (no network), then all_reduce (fp32, bf16,
      max), broadcast, all_gather, reduce_scatter, barrier, new_group with an all_reduce on it,
      destroy_process_group; writes every result tensor's values, and the NCCL libraries mapped
      in the process, to OUT.json.
  torch_forward.py compare BASE.json OTHER.json [--mapped NAME]
      exit 0 when OTHER's values equal BASE's bit for bit (and, with --mapped, when a library
      whose path contains NAME was mapped in OTHER's process and not in BASE's); else prints
      the differences and exits 1.
The device check runs `run` without and with loom's drop-in library preloaded and compares.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile


def mapped_nccl_libraries():
    """Paths of the mapped files whose name contains "nccl" (which libnccl.so.2 ran)."""
    paths = set()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and "nccl" in os.path.basename(parts[5].strip()):
                paths.add(parts[5].strip())
    return sorted(paths)


def run(out_path):
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 77
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    results = {}
    with tempfile.TemporaryDirectory(prefix="loom-torch-forward-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        kwargs = dict(backend="nccl", store=store, rank=0, world_size=1,
                      timeout=datetime.timedelta(seconds=60))
        try:
            # a bound device makes the communicator eager, and new_group then splits it
            dist.init_process_group(device_id=dev, **kwargs)
        except TypeError:
            dist.init_process_group(**kwargs)

        x = torch.arange(4099, dtype=torch.float32, device=dev) * 0.5 - 1000
        dist.all_reduce(x)
        results["all_reduce_fp32_sum"] = x.tolist()

        h = (torch.arange(1031, dtype=torch.float32, device=dev) / 7).to(torch.bfloat16)
        dist.all_reduce(h)
        results["all_reduce_bf16_sum"] = h.float().tolist()

        m = torch.arange(513, dtype=torch.int32, device=dev) * 3 - 700
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        results["all_reduce_int32_max"] = m.tolist()

        b = torch.arange(777, dtype=torch.int64, device=dev) * 11
        dist.broadcast(b, src=0)
        results["broadcast_int64"] = b.tolist()

        g_in = torch.arange(1000, dtype=torch.float32, device=dev) + 0.25
        g_out = [torch.full_like(g_in, float("nan"))]
        dist.all_gather(g_out, g_in)
        results["all_gather_fp32"] = g_out[0].tolist()

        rs_in = torch.arange(2048, dtype=torch.float32, device=dev) - 5.5
        rs_out = torch.full((2048,), float("nan"), device=dev)
        dist.reduce_scatter(rs_out, [rs_in])
        results["reduce_scatter_fp32"] = rs_out.tolist()

        dist.barrier()
        results["barrier"] = True

        group = dist.new_group([0])
        y = torch.arange(300, dtype=torch.float32, device=dev) * -2
        dist.all_reduce(y, group=group)
        results["new_group_all_reduce"] = y.tolist()
        dist.destroy_process_group(group)

        torch.cuda.synchronize()
        dist.destroy_process_group()
    try:
        header = list(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError, TypeError):
        header = None
    doc = {"results": results, "mapped": mapped_nccl_libraries(), "torch": torch.__version__,
           "nccl_header": header}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    print(f"{len(results)} results; NCCL libraries mapped: {', '.join(doc['mapped']) or 'none'}")
    return 0


def compare(base_path, other_path, mapped_name):
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    with open(other_path, encoding="utf-8") as f:
        other = json.load(f)
    problems = []
    for key in sorted(set(base["results"]) | set(other["results"])):
        if key not in other["results"]:
            problems.append(f"{key}: missing in {other_path}")
        elif key not in base["results"]:
            problems.append(f"{key}: missing in {base_path}")
        elif base["results"][key] != other["results"][key]:
            a, b = base["results"][key], other["results"][key]
            where = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
            problems.append(f"{key}: differs at element {where}")
    if mapped_name:
        if not any(mapped_name in p for p in other["mapped"]):
            problems.append(f"no library named *{mapped_name}* mapped in {other_path}'s process")
        if any(mapped_name in p for p in base["mapped"]):
            problems.append(f"*{mapped_name}* was mapped in {base_path}'s process too")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{len(base['results'])} results equal")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("out")
    p_cmp = sub.add_parser("compare")
    p_cmp.add_argument("base")
    p_cmp.add_argument("other")
    p_cmp.add_argument("--mapped", default="")
    args = parser.parse_args()
    if args.cmd == "run":
        return run(args.out)
    return compare(args.base, args.other, args.mapped)


if __name__ == "__main__":
    sys.exit(main())

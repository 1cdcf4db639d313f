#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# gen_env_doc.py - writes docs/env.md from src/core/params.def, the one list
# of loom's tunables, plus the launcher variables read by
# loomCommInitFromEnv. `--check FILE` exits 1 if FILE is out of date (a test
# runs it, so the document cannot drift from the code).
import re
import sys

LAUNCHER = [
    ("LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK", "rank, size and local rank (set by loomrun)"),
    ("RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT", "torchrun's convention"),
    ("SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID", "Slurm's convention (address from LOOM_COMM_ID or MASTER_ADDR/MASTER_PORT)"),
    ("OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI's convention (address as for Slurm)"),
]

# Read by libloom-nccl.so, the drop-in NCCL library (docs/nccl-plugins.md), not by libloom
# (LOOM_NCCL_LIBRARY, read by both, is a row of params.def).
NCCL_SHIM = [
    ("LOOM_NCCL_MODE", "route",
     "forward: every call goes to the real libnccl.so.2; route: loom or NCCL per call; loom: "
     "loom only, no real library is opened; another value: a WARN, and route"),
    ("LOOM_NCCL_ROUTE", "(empty)",
     "route mode: the rules that send each call to loom, to Echo or to the real NCCL, e.g. "
     "`coll=allreduce dtype=bf16 bytes>=1M -> echo; * -> nccl` (docs/nccl-plugins.md, Routing "
     "rules); the first rule that matches decides, a call no rule matches goes to NCCL (in loom "
     "mode: to loom); device buffers, captured streams, Send/Recv and calls inside a group always "
     "go to NCCL. Empty: the default rules, which send a bf16 or fp16 sum AllReduce of at least "
     "1 MiB on a one-host communicator of 2 to 8 ranks to loom (to Echo with LOOM_NCCL_ECHO=1). A "
     "malformed list makes every collective and Send/Recv fail with ncclInvalidArgument, "
     "ncclGetLastError naming the rule and the offending text. Must be the same on every rank"),
    ("LOOM_NCCL_ECHO", "0",
     "1: the default rules (LOOM_NCCL_ROUTE empty) send the calls they take to Echo, loom's 4-bit "
     "AllReduce, without error feedback (docs/echo.md: within its error bounds, not bit for bit); "
     "another value: to loom's exact AllReduce. Ignored when LOOM_NCCL_ROUTE is set, whose rules "
     "name echo themselves. Must be the same on every rank"),
]


def parse(path):
    rows = []
    pat = re.compile(r'^X\((\w+),\s*(\w+),\s*("(?:[^"\\]|\\.)*"|[^,]+),\s*"((?:[^"\\]|\\.)*)",\s*(\w+)\)')
    with open(path) as f:
        for line in f:
            m = pat.match(line.strip())
            if m:
                name, typ, default, doc, sub = m.groups()
                rows.append((name, typ, default.strip().strip('"'), doc, sub))
    return rows


def render(rows):
    out = ["# loom environment variables", "",
           "Generated from `src/core/params.def` by `tools/gen_env_doc.py`; do not edit by hand.",
           "Each value is read once, when first needed; a value set in the environment is logged",
           "at INFO under the ENV subsystem, and an invalid one falls back to the default with a WARN.",
           "Sizes accept K, M and G suffixes (binary).", "",
           "| variable | type | default | meaning | subsystem |",
           "|---|---|---|---|---|"]
    for name, typ, default, doc, sub in rows:
        d = default if default != "" else "(empty)"
        out.append(f"| `LOOM_{name}` | {typ} | `{d}` | {doc.replace('|', '/')} | {sub} |")
    out += ["", "## Launcher variables (read by `loomCommInitFromEnv`, first match wins)", "",
            "| variables | meaning |", "|---|---|"]
    for v, m in LAUNCHER:
        out.append(f"| {v} | {m} |")
    out += ["", "The rendezvous address is `LOOM_COMM_ID` (host:port) when set, else",
            "`MASTER_ADDR:MASTER_PORT`; rank 0 serves it. The job secret is `LOOM_SECRET`",
            "(32 hex digits; loomrun sets a fresh one), else the content of `LOOM_SECRET_FILE`;",
            "without either a secret is derived from the address and the size, which keeps",
            "unrelated jobs apart but not anyone who can reach the port (rank 0 WARNs it).", ""]
    out += ["## Variables of the drop-in NCCL library (libloom-nccl.so)", "",
            "Read by libloom-nccl.so, not by libloom. LOOM_DEBUG, LOOM_DEBUG_SUBSYS (SHIM) and",
            "LOOM_DEBUG_FILE set its log as loom's; LOOM_NCCL_LIBRARY (above, shared with the nccl",
            "device transport) names the real library it forwards to.", "",
            "| variable | default | meaning |", "|---|---|---|"]
    for v, d, m in NCCL_SHIM:
        out.append(f"| `{v}` | `{d}` | {m} |")
    out.append("")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    check = False
    if args and args[0] == "--check":
        check = True
        args = args[1:]
    params, target = args[0], args[1]
    text = render(parse(params))
    if check:
        with open(target) as f:
            if f.read() != text:
                print(f"{target} is out of date: run tools/gen_env_doc.py {params} {target}")
                return 1
        return 0
    with open(target, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_includes.py - enforces who may include whom (docs/ARCHITECTURE.md):
# core sees only core; transport sees core and transport; collectives see
# core, collectives and the transport layer's p2p.h/transport.h/arena.h (never a
# transport's own files); quant (the 4-bit codec) sees core and the
# collectives' kernels; echo sees those, quant and the transport layer; moe
# (statistics, placement; dispatch through the public collectives) sees core; shard
# (owner-shaped sharding; the public collectives and BLAS) sees core;
# topology sees core; plugin (the NCCL tuner, and the drop-in NCCL library, which reads
# loom's id layout and narrow-float conversions from core's headers at compile time) sees
# core and topology; api sees everything; bench, examples, trainer, tests/coll and tests/echo see only
# the public headers and their own folder's headers (tests/trainer: and the
# trainer's kernels, ops.h). Run by the lint suite;
# prints each violation and exits 1 if there is any.
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# module -> modules whose headers it may include
ALLOWED = {
    "core": {"core"},
    "transport": {"core", "transport", "transport-api"},
    "collectives": {"core", "collectives", "transport-api"},
    "quant": {"core", "collectives", "quant"},
    "echo": {"core", "transport-api", "collectives", "quant", "echo"},
    "moe": {"core", "moe"},
    "shard": {"core", "shard"},
    "topology": {"core", "topology"},
    "plugin": {"core", "topology", "plugin"},
    "api": {"core", "transport", "transport-api", "collectives", "quant", "echo", "topology", "api"},
}
PUBLIC = ("loom.h", "loom_echo.h", "loom_moe.h", "loom_shard.h")


def header_index():
    """Maps a header's base name to the module that owns it."""
    idx = {}
    for mod in ALLOWED:
        for dirpath, _, files in os.walk(os.path.join(ROOT, "src", mod)):
            for f in files:
                if f.endswith(".h") or f.endswith(".def"):
                    owner = mod
                    if mod == "transport" and dirpath == os.path.join(ROOT, "src", "transport") \
                            and f in ("p2p.h", "transport.h", "arena.h"):
                        owner = "transport-api"
                    idx[f] = owner
    return idx


def check_src(idx):
    bad = []
    for mod, allowed in ALLOWED.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, "src", mod)):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                for n, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if not m or m.group(1) in PUBLIC:
                        continue
                    name = os.path.basename(m.group(1))
                    owner = idx.get(name)
                    if owner is None:
                        continue  # a header next to the file inside its own folder
                    if owner not in allowed:
                        bad.append(f"{os.path.relpath(path, ROOT)}:{n}: {mod} may not include "
                                   f"{m.group(1)} ({owner})")
    return bad


# Files outside src/ that measure library internals and may include these headers.
INTERNAL_OK = {"bench/kernels_perf.c": ("kernels.h", "dtype.h"),
               "bench/q4_perf.c": ("q4.h", "kernels.h", "dtype.h"),
               "bench/gpu_kernels_perf.c": ("dev_kernels.h", "dev_elem.h", "dtype.h"),
               "bench/moe_perf_routing.c": ("moe_gen.h", "moe_trace.h", "rng.h"),
               "bench/moe_perf_report.c": ("moe_gen.h",),
               "bench/moe_exchange.c": ("comm.h", "cost_model.h"),
               "trainer/trace.c": ("moe_trace.h",)}


def check_public_only(folder, extra_ok=()):
    bad = []
    base = os.path.join(ROOT, folder)
    for dirpath, _, files in os.walk(base):
        local = {f for f in files if f.endswith(".h")}
        for f in files:
            if not f.endswith((".c", ".cc", ".h")):
                continue
            path = os.path.join(dirpath, f)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if inc in PUBLIC or inc in local or os.path.basename(inc) in extra_ok:
                    continue
                if inc in INTERNAL_OK.get(os.path.relpath(path, ROOT), ()):
                    continue
                bad.append(f"{os.path.relpath(path, ROOT)}:{n}: {folder} may include only the "
                           f"public headers, not {inc}")
    return bad


def main():
    bad = check_src(header_index())
    bad += check_public_only("bench")
    bad += check_public_only("examples")
    bad += check_public_only("tests/coll", extra_ok=("mp_fixture.h", "verify.h", "coll_kind.h"))
    bad += check_public_only("tests/echo", extra_ok=("mp_fixture.h", "verify.h"))
    bad += check_public_only("trainer")
    bad += check_public_only("tests/trainer", extra_ok=("ops.h",))
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

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
# core and topology; api sees everything below it and of the device path only its entry,
# dev_comm.h, and devrt.h (which runtime the process has); bench, examples, trainer, tests/coll and tests/echo see only
# the public headers and their own folder's headers (tests/trainer: and the
# trainer's kernels, ops.h).
# The device path (src/device/, docs/gpu.md) is checked part by part: dev_elem.h, the element
# math, includes nothing of loom's and is shared by core, collectives and quant; the kernels
# (dev_kernels.h, kernels/) see only it; the runtime (devrt.h, runtime/) sees core and the
# kernels; the transports and the entry (devtp.h, transport/) see core, the collectives'
# coll.h, api's comm.h (a device call carries a task), shm/shm_seg.h (the ipc transport's
# flags segment is a shared-memory file like the shm transport's) and the other parts.
# Run by the lint suite; prints each violation and exits 1 if there is any.
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# module -> modules whose headers it may include
ALLOWED = {
    "core": {"core", "device-elem"},
    "transport": {"core", "transport", "transport-api"},
    "collectives": {"core", "collectives", "transport-api", "device-elem"},
    "quant": {"core", "collectives", "quant", "device-elem"},
    "echo": {"core", "transport-api", "collectives", "quant", "echo"},
    "moe": {"core", "moe"},
    "shard": {"core", "shard"},
    "topology": {"core", "topology"},
    "plugin": {"core", "topology", "plugin"},
    "api": {"core", "transport", "transport-api", "collectives", "quant", "echo", "topology", "api"},
    "device-elem": set(),
    "device-kernels": {"device-elem", "device-kernels"},
    "device-runtime": {"core", "device-elem", "device-kernels", "device-runtime"},
    "device-transport": {"core", "collectives", "api", "device-elem", "device-kernels",
                         "device-runtime", "device-transport"},
}
# Single headers a module may include beyond its modules' (base name -> modules).
ALLOWED_HEADERS = {
    "dev_comm.h": {"api"},  # the device path's entry, as src/api sees it
    "devrt.h": {"api"},  # which device runtime the process has (loom_devrt)
    "shm_seg.h": {"device-transport"},  # the segment files the ipc flags live in
}
# The device path's parts: its top-level interface headers and folders (src/device/).
DEVICE_PARTS = {
    "dev_elem.h": "device-elem",
    "dev_kernels.h": "device-kernels",
    "kernels": "device-kernels",
    "devrt.h": "device-runtime",
    "runtime": "device-runtime",
    "devtp.h": "device-transport",
    "transport": "device-transport",
}
SOURCES = (".c", ".h", ".cu", ".cuh")
PUBLIC = ("loom.h", "loom_echo.h", "loom_moe.h", "loom_shard.h")


def module_files():
    """(module, path) of every source and header under src/ that a module owns."""
    for mod in ALLOWED:
        if mod.startswith("device-"):
            continue
        for dirpath, _, files in os.walk(os.path.join(ROOT, "src", mod)):
            for f in files:
                yield mod, os.path.join(dirpath, f)
    device = os.path.join(ROOT, "src", "device")
    for dirpath, _, files in os.walk(device):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), device).split(os.sep)
            part = DEVICE_PARTS.get(rel[0])
            if part is not None:
                yield part, os.path.join(dirpath, f)


def header_index():
    """Maps a header's base name to the module that owns it."""
    idx = {}
    for mod, path in module_files():
        f = os.path.basename(path)
        if f.endswith((".h", ".cuh", ".def")):
            owner = mod
            if mod == "transport" and os.path.dirname(path) == os.path.join(ROOT, "src",
                                                                            "transport") \
                    and f in ("p2p.h", "transport.h", "arena.h"):
                owner = "transport-api"
            idx[f] = owner
    return idx


def check_src(idx):
    bad = []
    for mod, path in module_files():
        if not path.endswith(SOURCES):
            continue
        allowed = ALLOWED[mod]
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) in PUBLIC:
                continue
            name = os.path.basename(m.group(1))
            owner = idx.get(name)
            if owner is None:
                continue  # a header next to the file inside its own folder
            if owner not in allowed and mod not in ALLOWED_HEADERS.get(name, ()):
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

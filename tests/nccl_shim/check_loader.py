#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_loader.py - libloom-nccl.so takes NCCL's place in a process the way
# frameworks load NCCL:
#  - a program linked against the real libnccl.so.2 (NEEDED libnccl.so.2, rpath
#    to the toolkit), run with LD_PRELOAD of the shim: the loader satisfies the
#    NEEDED entry with the shim (LD_DEBUG=libs,files shows no search for
#    libnccl.so.2, and the real file is loaded only by the shim), ncclGetVersion
#    is the shim's (dladdr) and answers the real version (forward mode);
#  - Python's ctypes.CDLL("libnccl.so.2") under LD_PRELOAD returns the shim (the
#    handle of CDLL(shim)), and every name vLLM's and SGLang's bindings look up
#    when they open the library resolves, as they resolve them, with getattr.
# Usage: check_loader.py SHIM PROGRAM REAL. Exit 77 if REAL is absent.
import os
import subprocess
import sys

# vLLM's and SGLang's pynccl_wrapper.py lists, plus what their forks add.
BINDINGS = ["ncclGetErrorString", "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank",
            "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclReduce", "ncclSend",
            "ncclRecv", "ncclBroadcast", "ncclCommDestroy", "ncclGroupStart", "ncclGroupEnd",
            "ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclCommAbort",
            "ncclCommGetAsyncError", "ncclCommInitRankConfig"]

CTYPES = r"""
import ctypes, sys
shim, names = sys.argv[1], sys.argv[2].split(",")
by_soname = ctypes.CDLL("libnccl.so.2")
by_path = ctypes.CDLL(shim)
print("same_handle=%d" % (by_soname._handle == by_path._handle))
missing = [n for n in names if not hasattr(by_soname, n)]
print("missing=" + ",".join(missing))
version = ctypes.c_int()
result = by_soname.ncclGetVersion(ctypes.byref(version))
print("version=%d result=%d" % (version.value, result))
by_soname.ncclGetErrorString.restype = ctypes.c_char_p
print("text4=" + by_soname.ncclGetErrorString(4).decode())
"""


def preload_env(shim, real):
    """The environment of a preloaded run. A sanitized shim needs its runtime
    loaded first, ahead of everything the preload brings."""
    env = dict(os.environ)
    for v in list(env):
        if v.startswith(("LOOM_NCCL_", "LOOM_DEBUG", "LD_DEBUG", "LD_LIBRARY_PATH")):
            del env[v]
    first = []
    ldd = subprocess.run(["ldd", shim], capture_output=True, text=True).stdout
    for line in ldd.splitlines():
        f = line.split()
        if len(f) >= 3 and f[1] == "=>" and f[0].startswith(("libasan", "libubsan", "libtsan")):
            first.append(f[2])
    if first:
        env["ASAN_OPTIONS"] = "detect_leaks=0"  # the interpreter's own leaks are not ours
    env["LD_PRELOAD"] = ":".join(first + [shim])
    env["LOOM_NCCL_MODE"] = "forward"
    env["LOOM_NCCL_LIBRARY"] = real
    return env


def main():
    shim, program, real = (os.path.abspath(a) for a in sys.argv[1:4])
    if not os.path.isfile(real):
        print(f"SKIP: no real libnccl.so.2 at {real}")
        return 77
    bad = []
    same = lambda a, b: os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)

    # No LD_LIBRARY_PATH (meson's points at the shim's directory, whose libnccl.so.2 link would
    # win over the program's runpath): the program must find the real library by itself.
    clean = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    plain = subprocess.run([program], capture_output=True, text=True, env=clean)
    kv = dict(l.split("=", 1) for l in plain.stdout.splitlines() if "=" in l)
    if not same(kv.get("provider", ""), real):
        bad.append(f"without the preload ncclGetVersion comes from {kv.get('provider')}, "
                   f"not {real}: the program is not linked against the real library")
    expected_version = kv.get("version")

    env = preload_env(shim, real)
    env["LD_DEBUG"] = "libs,files"
    run = subprocess.run([program], capture_output=True, text=True, env=env)
    kv = dict(l.split("=", 1) for l in run.stdout.splitlines() if "=" in l)
    if run.returncode != 0 or kv.get("result") != "0":
        bad.append(f"the preloaded run failed (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    if not same(kv.get("provider", ""), shim):
        bad.append(f"under LD_PRELOAD ncclGetVersion comes from {kv.get('provider')}, not the shim")
    if kv.get("version") != expected_version:
        bad.append(f"the forwarded ncclGetVersion gave {kv.get('version')}, the real one "
                   f"{expected_version}")
    searched = [l for l in run.stderr.splitlines() if "file=libnccl.so.2 [0];  needed by" in l]
    if searched:
        bad.append("the loader searched for libnccl.so.2 instead of taking the shim:\n"
                   + "\n".join(searched))
    # A sanitizer's runtime intercepts dlopen, so the loader names it as the caller.
    loaders = [shim] + env["LD_PRELOAD"].split(":")[:-1]
    loads = [l.split("\t", 1)[-1] for l in run.stderr.splitlines()
             if f"file={real} [0];" in l and ("needed by" in l or "dynamically loaded by" in l)]
    if not loads or any(not any(f"dynamically loaded by {x} " in l for x in loaders)
                        for l in loads):
        bad.append(f"{real} was not loaded by the shim alone: {loads}")
    print(f"preloaded {program}: ncclGetVersion from the shim, version {kv.get('version')}; "
          f"{real} loaded by: {loads}")

    env = preload_env(shim, real)
    run = subprocess.run([sys.executable, "-c", CTYPES, shim, ",".join(BINDINGS)],
                         capture_output=True, text=True, env=env)
    kv = dict(l.split("=", 1) for l in run.stdout.splitlines() if "=" in l)
    if run.returncode != 0:
        bad.append(f"the ctypes run failed (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    if kv.get("same_handle") != "1":
        bad.append('ctypes.CDLL("libnccl.so.2") is not the preloaded shim')
    if kv.get("missing"):
        bad.append(f"names of vLLM's and SGLang's bindings missing: {kv['missing']}")
    if kv.get("version") != f"{expected_version} result=0":
        bad.append(f"ctypes ncclGetVersion gave {kv.get('version')}")
    if kv.get("text4") != "invalid argument (run with NCCL_DEBUG=WARN for details)":
        bad.append(f"ncclGetErrorString(4) gave {kv.get('text4')}")
    print(f"ctypes: CDLL('libnccl.so.2') is the shim, {len(BINDINGS)} binding names resolve")
    for b in bad:
        print("FAIL", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_exports.py - the dynamic symbols of libloom-nccl.so: exactly NCCL
# 2.28.9's functions as shim_api.def lists them (pncclX strong, ncclX weak, as
# NCCL exports them; ncclResetDebugInitInternal strong and alone) plus the NCCL
# 2.29 names the shim refuses, all functions, all unversioned, no version
# definitions, SONAME libnccl.so.2; and, when the real libnccl.so.2 is there,
# every nccl*/pnccl* it exports is exported by the shim with the same binding.
# Usage: check_exports.py SHIM SHIM_API_DEF [REAL]. Exit 77 without readelf.
import re
import shutil
import subprocess
import sys

NEWER = ["CommGetUniqueId", "CommGrow", "CommMemStats", "CommResume", "CommSuspend", "PutSignal",
         "Signal", "WaitSignal", "WinGetUserPtr"]  # NCCL 2.29's additions


def expected(def_path):
    """name -> binding the shim must export it with."""
    text = open(def_path).read()
    names = re.findall(r"^SHIM_FN\(\s*[^,]+,\s*(\w+),", text, re.M)
    names += re.findall(r"^SHIM_FN_VOID\(\s*(\w+),", text, re.M)
    out = {}
    for n in names + NEWER:
        if n == "ResetDebugInitInternal":
            out["ncclResetDebugInitInternal"] = "GLOBAL"
        else:
            out["pnccl" + n] = "GLOBAL"
            out["nccl" + n] = "WEAK"
    return out


def dyn_symbols(path):
    """Defined dynamic symbols: name (with any @version) -> (type, binding)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0][:-1].isdigit() and f[6] != "UND" and f[4] != "LOCAL":
            syms[f[7]] = (f[3], f[4])
    return syms


def main():
    if shutil.which("readelf") is None:
        print("SKIP: readelf (binutils) is not installed")
        return 77
    shim, def_path = sys.argv[1], sys.argv[2]
    real = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    bad = []
    want = expected(def_path)
    have = dyn_symbols(shim)
    for name in sorted(have):
        if "@" in name:
            bad.append(f"{name}: exported with a version (NCCL's names are unversioned)")
    have = {n.split("@")[0]: v for n, v in have.items()}
    for name in sorted(set(want) - set(have)):
        bad.append(f"{name}: not exported")
    for name in sorted(set(have) - set(want)):
        bad.append(f"{name}: exported but not NCCL's (shim_api.def or the 2.29 list)")
    for name in sorted(set(want) & set(have)):
        typ, bind = have[name]
        if typ != "FUNC" or bind != want[name]:
            bad.append(f"{name}: {typ} {bind}, want FUNC {want[name]}")
    dyn = subprocess.run(["readelf", "-d", shim], capture_output=True, text=True,
                         check=True).stdout
    if "Library soname: [libnccl.so.2]" not in dyn:
        bad.append("SONAME is not libnccl.so.2")
    vers = subprocess.run(["readelf", "-V", "-W", shim], capture_output=True, text=True,
                          check=True).stdout
    if ".gnu.version_d" in vers:
        bad.append("the library defines symbol versions (the version script must be anonymous)")
    print(f"{shim}: {len(have)} functions exported, SONAME libnccl.so.2 checked")

    if real:
        theirs = {n: v for n, v in dyn_symbols(real).items()
                  if n.split("@")[0].startswith(("nccl", "pnccl"))}
        for name, (typ, bind) in sorted(theirs.items()):
            base = name.split("@")[0]
            if base not in have:
                bad.append(f"{base}: exported by {real} but not by the shim")
            elif have[base] != (typ, bind):
                bad.append(f"{base}: {have[base]} in the shim, {(typ, bind)} in {real}")
        extra = sorted(set(have) - {n.split("@")[0] for n in theirs})
        allowed = {p + n for n in NEWER for p in ("nccl", "pnccl")}
        for name in extra:
            if name not in allowed:
                bad.append(f"{name}: exported by the shim, not by {real}, not in the 2.29 list")
        print(f"{real}: {len(theirs)} nccl/pnccl symbols, all exported by the shim; "
              f"the shim adds {len(extra)} (NCCL 2.29's)")
    else:
        print("no real libnccl.so.2: the comparison with it was not made")
    for b in bad:
        print("FAIL", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

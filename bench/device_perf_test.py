#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The *_perf programs' device buffers (-G 1) on 2 ranks under the host emulation
(LOOM_DEVICE=emulated), with the check on: all_reduce_perf over every op in float and in
bfloat16 on a stream (loomStreamCreateFromCuda) and blocking, all_gather_perf with misaligned
buffers (its in-place form writes inside the receive buffer), echo_perf (Echo on device
buffers). Every row checked must have no wrong element, the header and JSON must name the
emulated device memory. Without a device runtime (LOOM_DEVICE=none) -G 1 must fail with
loomMemAlloc's message, and -G 2 is refused. Arguments: loomrun, then the programs'
folder."""
import json
import os
import subprocess
import sys
import tempfile

ROW_SIZES = ("8", "2M")


def run(loomrun, exe, args, env_extra, want_ok=True, nranks=2):
    cmd = [loomrun, "-n", str(nranks), exe] + args
    env = dict(os.environ, **env_extra)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    if (p.returncode == 0) != want_ok:
        sys.exit(f"{' '.join(cmd)} ({env_extra}) exited {p.returncode}:\n{out}")
    return p.stdout, out


def rows(stdout):
    """The table's rows: lists of words, the size first."""
    return [line.split() for line in stdout.splitlines()
            if line.strip() and not line.startswith("#") and line.split()[0].isdigit()]


def check_table(name, stdout, want_rows, lossy=False):
    if "# Device buffers: loomMemAlloc (emulated runtime)" not in stdout:
        sys.exit(f"{name}: the header does not name the emulated device memory:\n{stdout}")
    devices = [line for line in stdout.splitlines() if line.startswith("#  Rank ")]
    if len(devices) != 2 or not all("[emulated]" in line for line in devices):
        sys.exit(f"{name}: the ranks' device lines do not show the emulation:\n{stdout}")
    got = rows(stdout)
    if len(got) != want_rows:
        sys.exit(f"{name}: {len(got)} rows, expected {want_rows}:\n{stdout}")
    for r in got:
        # size count type redop root, then time algbw busbw #wrong twice
        wrong = [r[8], r[12]]
        for w in wrong:
            if w == "N/A":
                continue
            if (float(w) > 0.2) if lossy else (w != "0"):
                sys.exit(f"{name}: row {' '.join(r)} has wrong results:\n{stdout}")
    if "# Out of bounds values : 0 OK" not in stdout:
        sys.exit(f"{name}: not every check passed:\n{stdout}")


def main():
    loomrun, bench = sys.argv[1], sys.argv[2]
    emulated = {"LOOM_DEVICE": "emulated"}
    sizes = ["-b", ROW_SIZES[0], "-e", ROW_SIZES[1], "-f", "64"]  # 8 B, 512 B, 32 KiB, 2 MiB
    base = ["-n", "3", "-w", "1", "-c", "1"]
    with tempfile.TemporaryDirectory(prefix="loom-device-perf-") as tmp:
        ar = os.path.join(bench, "all_reduce_perf")
        js = os.path.join(tmp, "ar.json")
        out, _ = run(loomrun, ar, ["-G", "1", "-d", "float", "-o", "all", "-J", js] + sizes + base,
                     emulated)
        check_table("all_reduce_perf float, stream", out, 4 * 5)
        with open(js, encoding="utf-8") as f:
            doc = json.load(f)
        devs = doc["config"]["devices"]
        if [d["device_hex"] for d in devs] != ["emulated", "emulated"]:
            sys.exit(f"all_reduce_perf JSON: devices {devs}")
        if not doc["out_of_bounds"]["okay"]:
            sys.exit(f"all_reduce_perf JSON: out_of_bounds {doc['out_of_bounds']}")
        out, _ = run(loomrun, ar, ["-G", "1", "-d", "bfloat16", "-o", "sum", "-z", "1"] + sizes
                     + base, emulated)
        check_table("all_reduce_perf bfloat16, blocking", out, 4)

        ag = os.path.join(bench, "all_gather_perf")
        out, _ = run(loomrun, ag, ["-G", "1", "-d", "int32", "-u", "1"] + sizes + base, emulated)
        check_table("all_gather_perf int32, misaligned", out, 4)

        echo = os.path.join(bench, "echo_perf")
        out, _ = run(loomrun, echo, ["-G", "1", "-d", "float", "-o", "sum", "-b", "64K", "-e",
                                     "64K"] + base, emulated)
        check_table("echo_perf float", out, 1, lossy=True)

        # No device runtime: loomMemAlloc says why; one rank is enough.
        _, text = run(loomrun, ar, ["-G", "1", "-b", "8", "-e", "8"] + base,
                      {"LOOM_DEVICE": "none"}, want_ok=False, nranks=1)
        if "loomMemAlloc of the -G 1 buffers failed" not in text or "invalid usage" not in text:
            sys.exit(f"-G 1 without a device runtime did not fail with loomMemAlloc's error:\n{text}")
        _, text = run(loomrun, ar, ["-G", "2"], emulated, want_ok=False, nranks=1)
        if "-G 2 is not supported" not in text:
            sys.exit(f"-G 2 was not refused:\n{text}")
    print("device buffers: all_reduce_perf (float every op, bfloat16 blocking), all_gather_perf "
          "(misaligned), echo_perf checked on 2 emulated ranks; -G 1 without a runtime and -G 2 "
          "refused")


if __name__ == "__main__":
    main()

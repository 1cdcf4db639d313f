#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`*_perf -M 1` on 2 ranks of shared memory and of tcp: every row of the six collectives
that loomCommPlan describes names an algorithm and a positive predicted time, in the table
and in the JSON (`algorithm`, `model_us`). On shared memory that is the arena's variant and
the arena probe's prediction; over tcp the cost model's choice. Arguments: loomrun, then the
programs' folder."""
import json
import os
import subprocess
import sys
import tempfile

PROGRAMS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall")


def check(loomrun, bench, name, net):
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "rows.json")
        cmd = [loomrun, "-n", "2", os.path.join(bench, f"{name}_perf"), "-b", "64K", "-e", "1M",
               "-f", "16", "-n", "2", "-w", "1", "-M", "1", "-J", js]
        env = dict(os.environ, LOOM_NET=net)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} (LOOM_NET={net}) exited {p.returncode}:\n"
                     f"{p.stdout}{p.stderr}")
        with open(js) as f:
            rows = json.load(f)["results"]
    if len(rows) != 2:
        sys.exit(f"{name} over {net}: {len(rows)} rows, expected 2:\n{p.stdout}")
    for r in rows:
        algo, us = r.get("algorithm"), r.get("model_us")
        if not algo or algo in ("-", "?") or not isinstance(us, (int, float)) or us <= 0:
            sys.exit(f"{name} over {net}, {r['size']} bytes: algorithm {algo!r}, "
                     f"model_us {us!r}:\n{p.stdout}")
        if net == "shm" and not algo.startswith("shm"):
            sys.exit(f"{name} over shm, {r['size']} bytes: algorithm {algo!r}, not the arena's")


def main():
    loomrun, bench = sys.argv[1], sys.argv[2]
    for net in ("shm", "tcp"):
        for name in PROGRAMS:
            check(loomrun, bench, name, net)
    print(f"model column: {len(PROGRAMS)} collectives x shm, tcp: every row predicted")


if __name__ == "__main__":
    main()

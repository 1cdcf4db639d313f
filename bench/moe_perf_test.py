#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""moe_perf on 2 ranks, briefly, over shared memory and over TCP: every mode on planted and
uniform routing with the check on. Checks counts, never times: no wrong element, dedup sends no
more rows than naive, and on planted routing (rho 0.8) the learned placement saves more rows
than dedup alone, while the metrics agree with each other (rows saved, hit rate, bytes)."""
import json
import os
import subprocess
import sys
import tempfile


def run(loomrun, moe_perf, net, gen, tmp):
    out = os.path.join(tmp, f"{net}-{gen}.json")
    cmd = [loomrun, "-n", "2", moe_perf, "-E", "16", "-k", "4", "-d", "40", "-t", "96",
           "-y", "bfloat16", "-w", "1", "-n", "2", "--batches", "4", "-c", "1",
           "--gen", gen, "--rho", "0.8", "-J", out]
    env = dict(os.environ, LOOM_NET=net)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} (LOOM_NET={net}) exited {p.returncode}:\n{p.stdout}{p.stderr}")
    with open(out, encoding="utf-8") as f:
        return json.load(f), p.stdout


def check(doc, text, where):
    rows = {r["mode"]: r for r in doc["results"]}
    bad = []
    if sorted(rows) != ["dedup", "dedup+place", "naive"]:
        bad.append(f"modes {sorted(rows)}")
    for mode, r in rows.items():
        if r["wrong"] != 0:
            bad.append(f"{mode}: {r['wrong']} wrong elements")
        if r["rows"] <= 0 or r["bytes"] <= 0:
            bad.append(f"{mode}: no rows or bytes")
    if rows["dedup"]["rows"] > rows["naive"]["rows"]:
        bad.append(f"dedup rows {rows['dedup']['rows']} > naive {rows['naive']['rows']}")
    if rows["naive"]["rows_saved_pct"] != 0:
        bad.append("naive saves rows against itself")
    if rows["dedup"]["hit_pct"] != rows["naive"]["hit_pct"]:
        bad.append("dedup and naive share a placement but not a hit rate")
    if rows["dedup"]["bytes"] >= rows["naive"]["bytes"] and rows["dedup"]["rows"] < rows["naive"]["rows"]:
        bad.append("fewer rows but not fewer bytes")
    if "# geomean vs_naive:" not in text:
        bad.append("no geomean line")
    return [f"{where}: {b}" for b in bad], rows


def main():
    loomrun, moe_perf = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for net in ("shm", "tcp"):
            for gen in ("planted", "uniform"):
                doc, text = run(loomrun, moe_perf, net, gen, tmp)
                bad, rows = check(doc, text, f"{net} {gen}")
                failures += bad
                if gen == "planted" and rows["dedup+place"]["rows"] >= rows["dedup"]["rows"]:
                    failures.append(f"{net} planted: placement saves no rows "
                                    f"({rows['dedup+place']['rows']} >= {rows['dedup']['rows']})")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""moe_perf on 2 ranks, briefly, over shared memory and over TCP: every mode on planted and
uniform routing with the check on, then on an LMTR v1 trace of two layers written here. Checks
counts, never times: no wrong element, dedup sends no more rows than naive, on planted routing
(rho 0.8) the learned placement saves more rows than dedup alone and re-ordering serves more
pairs locally than the placement alone, the metrics agree with each other, and the trace's rows
equal an independent count. Re-ordering reports its own time, and a trace of one layer leaves it
out (refuses it when --modes names it). The cost model's columns: the bytes the wire format
gives the row counts equal those the plans sent, naive's --exchange file holds them too and
they were timed through loomAllToAllv, every mode has a prediction, and the projection
(generated routing only) finds no dedup saving where each rank holds one expert."""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

TRACE_E, TRACE_K, TRACE_T, TRACE_BATCHES = 16, 4, 150, 4


def run(loomrun, moe_perf, net, gen, tmp, extra=(), want_rc=0):
    out = os.path.join(tmp, f"{net}-{os.path.basename(gen)}.json")
    xf = out[:-len(".json")] + ".x"
    routing = ["--trace", gen] if gen.endswith(".lmtr") else ["--gen", gen, "--rho", "0.8"]
    cmd = [loomrun, "-n", "2", moe_perf, "-E", "16", "-k", "4", "-d", "40", "-t", "96",
           "-y", "bfloat16", "-w", "1", "-n", "2", "--batches", "4", "-c", "1", "-J", out,
           "--exchange", xf]
    cmd += routing + list(extra)
    env = dict(os.environ, LOOM_NET=net)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if (p.returncode != 0) != (want_rc != 0):
        sys.exit(f"{' '.join(cmd)} (LOOM_NET={net}) exited {p.returncode}:\n{p.stdout}{p.stderr}")
    if want_rc:
        return None, p.stdout + p.stderr
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    with open(xf, encoding="utf-8") as f:
        doc["exchange"] = f.read()
    return doc, p.stdout


def exchange_bytes(text):
    """Wire bytes to other ranks per step of the --exchange file's one case, dispatch and
    combine: what naive mode's plan counts as bytes_sent."""
    lines = text.splitlines()
    g = int(lines[0].split()[3])
    steps = int(lines[1].split()[-1])
    total, i = 0, 2
    while i < len(lines):
        assert lines[i].startswith("step "), lines[i]
        for s in range(g):
            row = [int(x) for x in lines[i + 1 + s].split()]
            total += sum(v for d, v in enumerate(row) if d != s)
        i += 1 + g
    return total / steps


def write_trace(path, layers):
    """An LMTR v1 trace (docs/moe-trace.md) of random rows with some -1, each step's layers one
    after the other; returns the batches of its last layer (those moe_perf measures)."""
    rng = random.Random(7)
    batches = []
    with open(path, "wb") as f:
        f.write(b"LMTR" + struct.pack("<IIIHHII", 1, 64, TRACE_E, TRACE_K, 0, 1, 0)
                + b"moe-perf-test".ljust(32, b"\0") + bytes(4))
        for b in range(TRACE_BATCHES):
            for layer in range(layers):
                rows = []
                for _ in range(TRACE_T):
                    row = rng.sample(range(TRACE_E), TRACE_K)
                    if rng.random() < 0.2:
                        row[rng.randrange(TRACE_K)] = -1
                    rows.append(row)
                body = struct.pack("<4sIIII", b"LMRC", b, layer, TRACE_T, 2 * TRACE_T * TRACE_K)
                body += struct.pack(f"<{TRACE_T * TRACE_K}h", *[e for r in rows for e in r])
                f.write(body + struct.pack("<I", zlib.crc32(body)))
            batches.append(rows)
    return batches


def trace_rows(batches, nranks=2):
    """Naive and dedup remote rows per step on the second half, contiguous experts, each batch
    split evenly over the ranks: what moe_perf must report, counted independently."""
    naive = dedup = 0
    evaluated = batches[len(batches) // 2:]
    for rows in evaluated:
        n = len(rows)
        for t, row in enumerate(rows):
            home = next(r for r in range(nranks) if n * r // nranks <= t < n * (r + 1) // nranks)
            ranks = [e * nranks // TRACE_E for e in row if e >= 0]
            naive += sum(1 for r in ranks if r != home)
            dedup += len(set(ranks) - {home})
    return naive / len(evaluated), dedup / len(evaluated)


def check(doc, text, where):
    rows = {r["mode"]: r for r in doc["results"]}
    bad = []
    if sorted(rows) != ["dedup", "dedup+place", "dedup+place+reorder", "naive"]:
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
    fewer = rows["dedup"]["rows"] < rows["naive"]["rows"]
    if fewer and rows["dedup"]["bytes"] >= rows["naive"]["bytes"]:
        bad.append("fewer rows but not fewer bytes")
    if "# geomean vs_naive:" not in text:
        bad.append("no geomean line")
    for mode, r in rows.items():
        # The bytes the wire format gives the row counts are those the plan sent.
        if r["model_bytes"] != r["bytes"]:
            bad.append(f"{mode}: {r['model_bytes']} bytes from the rows, {r['bytes']} sent")
        if not (r["predicted_dispatch_us"] > 0 and r["predicted_combine_us"] > 0):
            bad.append(f"{mode}: no cost model prediction")
        if not 0 < r["dispatch_combine_us"] <= r["total_us"]:
            bad.append(f"{mode}: dispatch+combine {r['dispatch_combine_us']} outside (0, total]")
        # Re-ordering's own phase (prediction, its AllGather, the permutation): its mode alone.
        if (r.get("reorder_us", 0) > 0) != (mode == "dedup+place+reorder"):
            bad.append(f"{mode}: re-ordering time {r['reorder_us']}")
    if rows["dedup+place+reorder"]["rows_saved_pct"] <= 0:
        bad.append("dedup+place+reorder saves no rows")
    if not rows["naive"].get("alltoallv_dispatch_combine_us", 0) > 0:
        bad.append("naive: no time of its bytes through loomAllToAllv")
    if abs(exchange_bytes(doc["exchange"]) - rows["naive"]["bytes"]) > 0.5:
        bad.append(f"--exchange holds {exchange_bytes(doc['exchange'])} bytes a step, naive "
                   f"sent {rows['naive']['bytes']}")
    proj = {m: {p["ranks"]: p for p in r["projection"]} for m, r in rows.items()}
    if doc["trace"].endswith(".lmtr"):
        if any(proj.values()) or "# projection: none" not in text:
            bad.append("a projection of a trace")
    elif sorted(proj["naive"]) != [16] or "not measured" not in text:
        bad.append(f"projection to {sorted(proj['naive'])} ranks, want [16] (E = 16)")
    elif proj["naive"][16]["maxrank_rows"] != proj["dedup"][16]["maxrank_rows"]:
        # One expert per rank: every token's experts are on distinct ranks, so dedup saves none.
        bad.append(f"projected naive and dedup rows differ at G = E = 16: {proj}")
    elif not proj["dedup+place+reorder"][16]["maxrank_rows"] > 0:
        bad.append("no projection of re-ordering")
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
                hits = (rows["dedup+place"]["hit_pct"], rows["dedup+place+reorder"]["hit_pct"])
                if gen == "planted" and hits[1] <= hits[0]:
                    failures.append(f"{net} planted: re-ordering serves no more pairs locally "
                                    f"(hit% {hits[1]} <= placement's {hits[0]})")
        trace = os.path.join(tmp, "routing.lmtr")
        want = trace_rows(write_trace(trace, 2))
        doc, text = run(loomrun, moe_perf, "shm", trace, tmp)
        bad, rows = check(doc, text, "trace")
        failures += bad
        got = (rows["naive"]["rows"], rows["dedup"]["rows"])
        if got != want:
            failures.append(f"trace: naive and dedup rows {got}, counted {want}")
        # One layer: nothing to predict from, so re-ordering is refused when named.
        write_trace(trace, 1)
        _, text = run(loomrun, moe_perf, "shm", trace, tmp, ["--modes", "dedup+place+reorder"], 1)
        if "consecutive layers" not in text:
            failures.append(f"one-layer trace: re-ordering not refused with a reason: {text}")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

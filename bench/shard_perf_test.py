#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""shard_perf on 2 ranks, briefly (gpt-tiny, one warm-up and two timed steps, every layout),
then its --predict-only projection to 8 ranks. Checks what does not depend on the clock: the
JSON parses and holds one record per layout, the bytes the counters saw equal the closed forms
restated here from gpt-tiny's shapes (owner and replicated 2(P-1)N x 4, rows (P-1)(2 N_pad +
N_M,pad) x 4, over all ranks), every record has a prediction, owner's step issues no collective
while rows issues one per matrix and rows-bucketed one per bucket, and the projection is
labelled as one and gives owner less Newton-Schulz work than rows."""
import json
import os
import subprocess
import sys
import tempfile

P = 2
L, C, V, T = 4, 128, 256, 128


def params():
    """gpt-tiny's list as shard_perf builds it: (rows, cols, is_matrix)."""
    out = []
    for _ in range(L):
        out += [(C, 1, 0), (C, 1, 0), (C, 3 * C, 1), (3 * C, 1, 0), (C, C, 1), (C, 1, 0),
                (C, 1, 0), (C, 1, 0), (C, 4 * C, 1), (4 * C, 1, 0), (4 * C, C, 1), (C, 1, 0)]
    return out + [(V, C, 0), (T, C, 0), (C, 1, 0), (C, 1, 0)]


def closed_forms(p):
    """Mean bytes one rank sends per step: (owner and replicated, rows)."""
    n = sum(r * c for r, c, _ in params())
    chunk = [-(-r // p) * c * p for r, c, _ in params()]
    n_pad = sum(chunk)
    nm_pad = sum(x for x, (_, _, m) in zip(chunk, params()) if m)
    return 2 * (p - 1) * n * 4 / p, (p - 1) * (2 * n_pad + nm_pad) * 4 / p


def run(cmd, want_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if (p.returncode == 0) != want_ok:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def check_measured(loomrun, shard_perf, tmp):
    out = os.path.join(tmp, "tiny.json")
    text = run([loomrun, "-n", str(P), shard_perf, "--model", "gpt-tiny", "-w", "1", "-n", "2",
                "-J", out])
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["program"] == "shard_perf" and doc["nranks"] == P and not doc["projection"], doc
    assert doc["ns_gmacs"] > 0 and doc["adamw_ns_per_elem"] > 0, doc
    recs = {r["layout"]: r for r in doc["results"]}
    assert sorted(recs) == ["owner", "replicated", "rows", "rows-bucketed"], recs.keys()
    owner_bytes, rows_bytes = closed_forms(P)
    for name, r in recs.items():
        want = rows_bytes if name.startswith("rows") else owner_bytes
        assert r["bytes_ok"] and abs(r["bytes_rank"] - want) < 0.5, (name, r["bytes_rank"], want)
        assert abs(r["bytes_closed_form"] - want) < 0.5, (name, r["bytes_closed_form"], want)
        assert r["pred_step_ms"] > 0 and r["step_ms"] > 0 and r["total_ms"] >= r["step_ms"], r
        assert r["cpu_s"] > 0 and r["ns_gmac_max"] > 0 and r["pred_cpu_s"] > 0, r
    assert recs["owner"]["step_collectives"] == 0, recs["owner"]
    assert recs["replicated"]["step_collectives"] == 0, recs["replicated"]
    assert recs["rows"]["step_collectives"] >= 4 * L, recs["rows"]
    assert recs["rows-bucketed"]["step_collectives"] >= L, recs["rows-bucketed"]
    assert recs["rows"]["pred_gather_ms"] > 0, recs["rows"]
    assert recs["owner"]["ns_gmac_max"] < recs["rows"]["ns_gmac_max"], recs
    assert "step_x" in text and "pred_step_ms" in text, text


def check_projection(shard_perf, tmp):
    out = os.path.join(tmp, "proj.json")
    text = run([shard_perf, "--model", "gpt-tiny", "--predict-only", "--ranks", "8", "-J", out])
    assert "PROJECTION" in text and "projection" in text, text
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["projection"] and doc["nranks"] == 8, doc
    recs = {r["layout"]: r for r in doc["results"]}
    assert all(r["pred_step_ms"] > 0 for r in recs.values()), recs
    assert recs["owner"]["ns_gmac_max"] * 4 < recs["rows"]["ns_gmac_max"], recs
    assert recs["owner"]["step_x"] > 1, recs["owner"]
    run([shard_perf, "--ranks", "8"], want_ok=False)


def main():
    loomrun, shard_perf = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        check_measured(loomrun, shard_perf, tmp)
        check_projection(shard_perf, tmp)
    print("shard_perf: ok")


if __name__ == "__main__":
    main()

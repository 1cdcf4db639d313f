#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws torch_bench.py's torch_results.json as a PNG: per rank count, the time per call of each
collective against size (log-log) through torch over loom and over Gloo (and loom's own
all_reduce_perf beside AllReduce), then the DDP step per backend and without DDP. torch_bench.py calls it after
a run; alone it redraws a kept result. Needs matplotlib (the benchmark itself does not).

    bench/compare/torch_plot.py -o docs/perf/torch_perf.png build/compare/torch/torch_results.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

STYLE = {"loom": ("loom (torch)", "C0", "o-"), "gloo": ("Gloo (torch)", "C1", "s-"),
         "loom-c": ("loom all_reduce_perf", "C2", "^--"), "none": ("no DDP", "C7", None)}


def plot(doc, path):
    """Returns None or why it could not draw."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not importable ({e}); install python3-matplotlib"
    rows = doc["summary"]
    ranks = sorted({r["nranks"] for r in rows} | {d["nranks"] for d in doc["ddp_summary"]})
    colls = [c for c in report.NAMES if any(r["coll"] == c for r in rows)]
    if not ranks:
        return "no measurement to draw"
    fig, axes = plt.subplots(len(ranks), len(colls) + 1, squeeze=False,
                             figsize=(3.3 * (len(colls) + 1), 2.9 * len(ranks)))
    for i, n in enumerate(ranks):
        for j, coll in enumerate(colls):
            ax = axes[i][j]
            for key, (label, color, fmt) in STYLE.items():
                if fmt is None:
                    continue  # a bar of the DDP panel only
                pts = sorted((r["size"], r["impls"][key]["time_us"]) for r in rows
                             if r["coll"] == coll and r["nranks"] == n and key in r["impls"])
                if pts:
                    ax.plot(*zip(*pts), fmt, color=color, markersize=3, label=label)
            ax.set_yscale("log")
            report.size_axis(ax, f"{report.NAMES[coll]}, {n} ranks",
                             "time per call (us)" if j == 0 else None, i == len(ranks) - 1)
        ax = axes[i][len(colls)]
        step = next((d["step_ms"] for d in doc["ddp_summary"] if d["nranks"] == n), {})
        keys = [k for k in ("loom", "gloo", "none") if k in step]
        ax.bar([STYLE[k][0] for k in keys], [step[k] for k in keys],
               color=[STYLE[k][1] for k in keys])
        ax.set_title(f"DDP step (ddp_train.py), {n} ranks", fontsize=9)
        ax.set_ylabel("median step (ms)", fontsize=8)
        ax.tick_params(labelsize=7)
    report.one_legend(fig, axes)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("-o", "--output", default="torch_perf.png")
    args = ap.parse_args()
    with open(args.json, encoding="utf-8") as f:
        why_not = plot(json.load(f), args.output)
    if why_not:
        sys.exit(f"torch_plot.py: {why_not}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

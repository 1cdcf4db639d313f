#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws shard_perf -J files (one per rank count) as a PNG: the optimizer step per layout and
rank count and all ranks' CPU seconds of it, measured bars with the cost model's prediction as
a mark, and the step's speed-up over the better rows variant. Needs matplotlib (the benchmark itself does not).

    bench/shard_perf_plot.py -o shard.png p2.json p4.json p8.json
"""
import argparse
import json
import sys

LAYOUTS = ["owner", "rows", "rows-bucketed", "replicated"]


def load(paths):
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        for r in doc["results"]:
            if r["layout"] == "owner" and r["balance"] != "nscost":
                continue
            rows.append(dict(r, cores=doc["cores"], model=doc["model"],
                             projection=doc["projection"]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("-o", "--output", default="shard_perf.png")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("shard_perf_plot.py needs matplotlib: pip install matplotlib")
    rows = load(args.json)
    ranks = sorted({r["ranks"] for r in rows})
    fig, (ax, cx, bx) = plt.subplots(1, 3, figsize=(16, 4.4))
    width = 0.8 / len(LAYOUTS)
    for i, lay in enumerate(LAYOUTS):
        hits = [(j, r) for j, p in enumerate(ranks) for r in rows
                if r["ranks"] == p and r["layout"] == lay]
        if not hits:
            continue
        xs = [j + (i - 1.5) * width for j, _ in hits]
        bars = ax.bar(xs, [0 if r["projection"] else r["step_ms"] for _, r in hits], width,
                      label=lay)
        ax.plot(xs, [r["pred_step_ms"] for _, r in hits], "k_", markersize=14,
                markeredgewidth=2, label="predicted" if i == 0 else None)
        cx.bar(xs, [r.get("cpu_s", 0) for _, r in hits], width, label=lay)
        cx.plot(xs, [r.get("pred_cpu_s", 0) for _, r in hits], "k_", markersize=14,
                markeredgewidth=2, label="predicted" if i == 0 else None)
        bx.plot([ranks[j] for j, _ in hits], [r["step_x"] for _, r in hits], "o-",
                color=bars.patches[0].get_facecolor(), label=lay)
    labels = []
    for p in ranks:
        cores = next(r["cores"] for r in rows if r["ranks"] == p)
        labels.append(f"P={p}" + (f"\n({p / cores:.0f}x over {cores} cores)" if p > cores else ""))
    ax.set_xticks(range(len(ranks)), labels)
    ax.set_ylabel("optimizer step, ms (slowest rank, median)")
    ax.set_yscale("log")
    ax.set_title(f"{rows[0]['model']}: step per layout")
    ax.legend(fontsize=8)
    cx.set_xticks(range(len(ranks)), labels)
    cx.set_ylabel("CPU seconds per step, all ranks")
    cx.set_title("work (other load on the machine left out)")
    cx.legend(fontsize=8)
    bx.plot(ranks, ranks, ":", color="grey", label="P")
    bx.set_xlabel("ranks")
    bx.set_ylabel("step speed-up over the better rows variant")
    bx.set_xticks(ranks)
    bx.set_title("step_x")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

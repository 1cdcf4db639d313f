# SPDX-License-Identifier: Apache-2.0
#
# report.py - turns bench/compare's raw measurements into its outputs: medians
# over the interleaved repetitions, the loom/best-peer ratio per collective x
# size x rank count, the plain-text table, and busbw.png (matplotlib, one panel
# per collective and rank count). Time ratio = best peer time / loom time and
# busbw ratio = loom busbw / best peer busbw are the same number, since every
# implementation uses the same bytes and bus factor: > 1 means loom is faster.
# Beside loom's time: the algorithm its traced launch chose and the model's
# prediction (the timed launches' own where they printed it). It runs nothing;
# compare.py calls it.
import math
import statistics

import coll_trace

NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
         "all_gatherv": "AllGatherV", "reduce_scatterv": "ReduceScatterV",
         "alltoall": "AlltoAll", "broadcast": "Broadcast", "reduce": "Reduce"}


def model_of(traces, coll, nranks, size, loom_us, timed_models=()):
    """The traced call that stands for loom's compared column (in place for
    Broadcast, as compare.record measures it) with measured/predicted. Where the
    timed launches printed their own predictions (-M 1), their median replaces
    the traced launch's: each launch measures its constants at creation, and the
    prediction should come from the launch whose time it is set against."""
    for t in traces:
        if (t["coll"], t["nranks"], t["size"]) == (coll, nranks, size):
            call = t["in_place"] if coll == "broadcast" else t["out_of_place"]
            if call is not None and timed_models:
                call = dict(call, model_us=statistics.median(timed_models))
            return coll_trace.with_ratio(call, loom_us)
    return None


def best_peer(times, peers):
    """The peer with the least time (None without peers) and best time / loom's."""
    if not peers:
        return None, None
    best = min(peers, key=lambda k: times[k])
    loom = times.get("loom")
    return best, (times[best] / loom if loom else None)


def summarize(measurements, impl_keys, traces=()):
    """One record per (collective, ranks, size) with each implementation's
    median time and the busbw at that time, the best of all peers and the
    ratio to it, the ratio to each peer, and the model's choice."""
    groups = {}
    for m in measurements:
        if m["size"] == 0:
            continue  # nccl-tests' 16-byte rounding left nothing to move
        key = (m["coll"], m["nranks"], m["size"])
        groups.setdefault(key, {}).setdefault(m["impl"], []).append(m)
    rows = []
    for (coll, nranks, size), by_impl in groups.items():
        rec = {"coll": coll, "nranks": nranks, "size": size, "impls": {}}
        for impl, ms in by_impl.items():
            t = statistics.median(x["time_us"] for x in ms)
            # busbw is bytes x factor / time: scale any repetition's to the median time
            busbw = ms[0]["busbw"] * ms[0]["time_us"] / t if t > 0 else 0.0
            rec["impls"][impl] = {"time_us": t, "busbw": busbw, "reps": len(ms)}
        times = {k: v["time_us"] for k, v in rec["impls"].items() if v["time_us"] > 0}
        others = [k for k in impl_keys if k != "loom" and k in times]
        rec["best_peer"], rec["ratio"] = best_peer(times, [k for k in others if k != "base"])
        rec["loom_over_peer"] = {k: times[k] / times["loom"] for k in others if "loom" in times}
        timed = [m["model_us"] for m in by_impl.get("loom", []) if m.get("model_us")]
        rec["model"] = model_of(traces, coll, nranks, size, times.get("loom"), timed)
        rows.append(rec)
    order = {c: i for i, c in enumerate(NAMES)}
    rows.sort(key=lambda r: (order.get(r["coll"], 99), r["nranks"], r["size"]))
    return rows


def fmt_size(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def short_size(n):
    """Axis labels: 8, 512, 32K, 2M, 128M."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n / div:g}{unit}"
    return str(n)


def fmt_time(us):
    return f"{us:9.1f}" if us < 1e6 else f"{us:9.3g}"


def table(rows, impls, labels):
    """The plain-text table, one line per collective x ranks x size."""
    head = f"{'collective':<14} {'ranks':>5} {'size':>9} |"
    for k in impls:
        head += f" {labels[k][:18]:^18} |"
    peers = [k for k in impls if k != "loom"]
    head += f" {'best peer':<9} {'loom/best':>9} |"
    head += "".join(f" {'loom/' + k:>10}" for k in peers)
    head += f" | {'algo':<14} {'model us':>9} {'meas/model':>10}"
    sub = f"{'':<14} {'':>5} {'':>9} |" + "".join(
        f" {'time us':>9} {'GB/s':>7}  |" for _ in impls)
    out = [head, sub, "-" * len(head)]
    for r in rows:
        line = f"{NAMES.get(r['coll'], r['coll']):<14} {r['nranks']:>5} {fmt_size(r['size']):>9} |"
        for k in impls:
            v = r["impls"].get(k)
            line += (f" {fmt_time(v['time_us'])} {v['busbw']:7.2f}  |" if v
                     else f" {'-':>9} {'-':>7}  |")
        best = labels[r["best_peer"]] if r["best_peer"] else "-"
        line += f" {best:<9} {fmt_ratio(r['ratio'], 9)} |"
        line += "".join(f" {fmt_ratio(r['loom_over_peer'].get(k), 10)}" for k in peers)
        out.append(line + " | " + model_cells(r.get("model")))
    return out


def fmt_ratio(v, width):
    return f"{v:{width}.2f}" if v is not None else f"{'-':>{width}}"


def model_cells(m):
    """algo, predicted us and measured/predicted, or dashes."""
    if not m:
        return f"{'-':<14} {'-':>9} {'-':>10}"
    ratio = fmt_ratio(m["measured_over_model"], 10)
    return f"{m['algo'][:14]:<14} {fmt_time(m['model_us'])} {ratio}"


def ratio_matrix(rows, labels):
    """Markdown: loom/best peer per collective x ranks (lines) and size
    (columns), each with the best peer's key; bold below 1."""
    sizes = sorted({r["size"] for r in rows})
    out = ["| collective | ranks | " + " | ".join(fmt_size(s) for s in sizes) + " |",
           "|---|---:|" + "---:|" * len(sizes)]
    cells = {}
    for r in rows:
        if r["ratio"] is None:
            continue
        v = f"{r['ratio']:.2f}"
        cells[(r["coll"], r["nranks"], r["size"])] = \
            f"{'**' + v + '**' if r['ratio'] < 1 else v} {r['best_peer']}"
    seen = []
    for r in rows:
        if (r["coll"], r["nranks"]) not in seen:
            seen.append((r["coll"], r["nranks"]))
    for coll, n in seen:
        out.append(f"| {NAMES.get(coll, coll)} | {n} | " + " | ".join(
            cells.get((coll, n, s), "–") for s in sizes) + " |")
    used = sorted({r["best_peer"] for r in rows if r["best_peer"]})
    out.append("best peer: " + ", ".join(f"{k} = {labels.get(k, k)}" for k in used))
    return out


def geomean_lines(rows):
    """Geometric mean of loom/best per collective and rank count."""
    acc = {}
    for r in rows:
        if r["ratio"]:
            acc.setdefault((r["coll"], r["nranks"]), []).append(r["ratio"])
    lines = []
    for (coll, n), vals in sorted(acc.items(), key=lambda kv: (list(NAMES).index(kv[0][0])
                                                                if kv[0][0] in NAMES else 99,
                                                                kv[0][1])):
        g = math.exp(sum(math.log(v) for v in vals) / len(vals))
        faster = sum(v > 1 for v in vals)
        lines.append(f"{NAMES.get(coll, coll):<14} {n:>2} ranks: geomean loom/best {g:5.2f}, "
                     f"loom faster at {faster} of {len(vals)} sizes")
    return lines


BASE_DROP = 0.05  # a collective whose geomean loom/base falls below 1 - this is named


def base_lines(rows, label):
    """With an earlier loom run beside this one (--base): the geometric mean of
    loom/base (base time / loom time, > 1: this loom is faster) per collective and
    rank count, and a last line naming every one below 1 - BASE_DROP, or saying
    that none is."""
    acc = {}
    for r in rows:
        v = r["loom_over_peer"].get("base")
        if v:
            acc.setdefault((r["coll"], r["nranks"]), []).append(v)
    if not acc:
        return []
    lines, fell = [], []
    for (coll, n), vals in sorted(acc.items(), key=lambda kv: (list(NAMES).index(kv[0][0])
                                                                if kv[0][0] in NAMES else 99,
                                                                kv[0][1])):
        g = math.exp(sum(math.log(v) for v in vals) / len(vals))
        lines.append(f"{NAMES.get(coll, coll):<14} {n:>2} ranks: geomean loom/base {g:5.2f} "
                     f"over {len(vals)} sizes")
        if g < 1 - BASE_DROP:
            fell.append(f"{NAMES.get(coll, coll)} {n} ranks ({g:.2f})")
    against = f"against {label}" if label else "against the base"
    lines.append(f"loom {against}: " + (
        f"geomean fell by more than {BASE_DROP:.0%} for " + ", ".join(fell) if fell else
        f"no collective's geomean fell by more than {BASE_DROP:.0%}"))
    return lines


def row_name(r):
    return f"{NAMES.get(r['coll'], r['coll'])} {r['nranks']} ranks {fmt_size(r['size'])}"


MODEL_FROM_BYTES = 64 << 10  # the prediction's bound holds from here on
MODEL_BOUND = 1.25  # within 25 % either way


def model_lines(rows):
    """How many of loom's predicted rows from 64 KiB on the cost model got within 25 %
    (measured/predicted in [1/1.25, 1.25]), and the worst on each side. Rows without a
    prediction (the shm family, which plans its variant itself) are counted apart."""
    big = [r for r in rows if r["size"] >= MODEL_FROM_BYTES and "loom" in r["impls"]]
    ratios = [(r["model"]["measured_over_model"], r) for r in big
              if r.get("model") and r["model"].get("measured_over_model")]
    if not big:
        return []
    inside = sum(1 / MODEL_BOUND <= v <= MODEL_BOUND for v, _ in ratios)
    line = (f"cost model from {fmt_size(MODEL_FROM_BYTES)}: {inside} of {len(ratios)} predicted "
            f"rows within 25 %")
    if ratios:
        lo, hi = min(ratios, key=lambda x: x[0]), max(ratios, key=lambda x: x[0])
        line += (f" (measured/predicted {lo[0]:.2f} {row_name(lo[1])} to {hi[0]:.2f} "
                 f"{row_name(hi[1])})")
    if len(big) > len(ratios):
        line += f"; {len(big) - len(ratios)} row(s) without a prediction"
    return [line]


def limit_lines(rows, limits, net):
    """2-rank AllReduce from 16 MiB against the machine's limits of the same
    run. Shared memory: busbw against the memory bound, half the 2-thread
    memcpy rate (each rank reads and writes every byte once). TCP: each rank
    sends and receives S bytes, so the bytes crossing the loopback per second,
    both directions together, are 2 x busbw, set against one socket pair's
    throughput with traffic both ways at once (the sum of the directions)."""
    lines = []
    for r in rows:
        if r["coll"] != "all_reduce" or r["nranks"] != 2 or r["size"] < (16 << 20):
            continue
        loom = r["impls"].get("loom")
        if not loom:
            continue
        parts = []
        for when in ("start", "end"):
            lim = limits.get(when, {})
            try:
                if net == "tcp":
                    bound = lim["tcp"]["both_ways"]["median_gbps"]
                    rate = 2 * loom["busbw"]
                else:
                    two = [x for x in lim["memcpy"]["results"] if x["threads"] == 2][0]
                    bound = two["median_gbps"] / 2
                    rate = loom["busbw"]
            except (KeyError, IndexError, TypeError):
                continue
            if bound > 0:
                parts.append(f"{100 * rate / bound:.0f} % of {bound:.2f} GB/s at {when}")
        if not parts:
            continue
        if net == "tcp":
            what = (f"{2 * loom['busbw']:.2f} GB/s over the loopback both ways (2 x busbw) = "
                    + ", ".join(parts) + " (tcp both ways, in sum)")
        else:
            what = (f"busbw {loom['busbw']:.2f} GB/s = " + ", ".join(parts)
                    + " (memory bound: 2-thread memcpy / 2)")
        lines.append(f"AllReduce 2 ranks {fmt_size(r['size'])} against the limit: {what}")
    return lines


def overall_geomean(rows):
    vals = [r["ratio"] for r in rows if r["ratio"]]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def plot(rows, impls, labels, ranks, colls, limits, net, path):
    """busbw against size, one panel per collective (columns) and rank count
    (rows), one line per implementation. Returns None or why it could not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not importable ({e}); install python3-matplotlib"
    fig, axes = plt.subplots(len(ranks), len(colls), squeeze=False,
                             figsize=(3.6 * len(colls), 3.0 * len(ranks)))
    ref = reference_line(limits, net)
    for i, n in enumerate(ranks):
        for j, coll in enumerate(colls):
            ax = axes[i][j]
            for k in impls:
                pts = sorted((r["size"], r["impls"][k]["busbw"]) for r in rows
                             if r["coll"] == coll and r["nranks"] == n and k in r["impls"])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                            label=labels[k])
            top = max((line.get_ydata().max() for line in ax.get_lines()), default=0)
            if ref and ref[1] <= 2 * top:
                ax.axhline(ref[1], color="grey", linestyle="--", linewidth=0.8, label=ref[0])
            elif ref:  # drawn, it would squash the data: say it instead
                ax.text(0.02, 0.97, f"{ref[0]}: {ref[1]:.2f} GB/s", transform=ax.transAxes,
                        fontsize=6, va="top", color="grey")
            size_axis(ax, f"{NAMES.get(coll, coll)}, {n} ranks",
                      "busbw (GB/s)" if j == 0 else None, i == len(ranks) - 1)
    one_legend(fig, axes)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def size_axis(ax, title, ylabel, xlabel):
    """A panel with size (log 2, labelled 8, 32K, 2M) across: also torch_plot.py's."""
    import matplotlib.ticker
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda x, _: short_size(int(round(x)))))
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    if xlabel:
        ax.set_xlabel("size (bytes)", fontsize=8)


def one_legend(fig, axes):
    """One legend above the figure with every label of every panel once."""
    seen = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="upper center", ncol=len(seen),
                   fontsize=8)


def reference_line(limits, net):
    """The limit drawn in every panel: TCP one way for --net tcp, memcpy of one
    thread otherwise."""
    try:
        if net == "tcp":
            return ("tcp loopback, one way", limits["tcp"]["one_way"]["median_gbps"])
        one = [r for r in limits["memcpy"]["results"] if r["threads"] == 1][0]
        return ("memcpy, 1 thread", one["median_gbps"])
    except (KeyError, IndexError, TypeError):
        return None

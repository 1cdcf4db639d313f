# SPDX-License-Identifier: Apache-2.0
#
# summary.py - turns bench/hosts' raw measurements into its report: the median
# time per rate x layout x size of loom's bf16 AllReduce and of Echo, busbw at
# that median, Echo's relative error, the ratio AllReduce time / Echo time
# (> 1: Echo is faster), the wire floor of an uncompressed all-reduce on the
# measured link, and beside each time the algorithm loom's traced launch chose
# with the cost model's prediction. It runs nothing; bench/hosts/run calls it.
import math
import statistics

import coll_trace  # bench/compare's, on the path bench/hosts/run sets
from sysinfo import machine_text as sysinfo_text  # bench/compare's too

def fmt_size(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def fmt_num(v, digits=1):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if abs(v) < 1e7 else f"{v:.3g}"


def link_bytes_per_s(link):
    """The per-direction rate an all-reduce can count on: the slower direction
    of the both-ways probe (an all-reduce sends both ways at once)."""
    try:
        return min(link["both_ways"]["h1_to_h0"]["gbps"], link["both_ways"]["h0_to_h1"]["gbps"]) \
            * 1e9 / 8
    except (KeyError, TypeError):
        return None


def wire_floor_us(size, hosts, link_bps):
    """Least time an uncompressed all-reduce needs on the inter-host links:
    each host sends (and receives) 2(H-1)/H x size bytes however the ranks
    inside it cooperate (reduce-scatter then all-gather across hosts).
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009."""
    if not link_bps or hosts < 2:
        return None
    return 2 * (hosts - 1) / hosts * size / link_bps * 1e6


def traced_call(traces, rate, layout, prog, size):
    """The out-of-place call the traced launch made at this size, or None."""
    for t in traces:
        if (t["rate"], t["layout"], t["prog"], t["size"]) == (rate, layout, prog, size):
            return t["out_of_place"]
    return None


def summarize(measurements, links, traces=()):
    """One row per (rate, layout, size) with each program's median and the
    model's choice and prediction beside it."""
    groups = {}
    for m in measurements:
        key = (m["rate"], m["layout"], m["size"])
        groups.setdefault(key, {}).setdefault(m["prog"], []).append(m)
    rows = []
    for (rate, layout, size), by_prog in groups.items():
        hosts = int(layout.split("x")[0])
        rec = {"rate": rate, "layout": layout, "size": size, "progs": {}}
        for prog, ms in by_prog.items():
            t = statistics.median(x["time_us"] for x in ms)
            # busbw is bytes x factor / time: scale a repetition's to the median time
            busbw = ms[0]["busbw"] * ms[0]["time_us"] / t if t > 0 else 0.0
            errs = [x["relerr"] for x in ms if x.get("relerr") is not None]
            rec["progs"][prog] = {"time_us": t, "busbw": busbw, "reps": len(ms),
                                  "times_us": [x["time_us"] for x in ms],
                                  "relerr": max(errs) if errs else None,
                                  "model": coll_trace.with_ratio(
                                      traced_call(traces, rate, layout, prog, size), t)}
        lo, ec = rec["progs"].get("loom"), rec["progs"].get("echo")
        rec["speedup"] = lo["time_us"] / ec["time_us"] if lo and ec and ec["time_us"] > 0 else None
        rec["wire_floor_us"] = wire_floor_us(size, hosts, link_bytes_per_s(links.get(rate)))
        rows.append(rec)
    rows.sort(key=lambda r: (rate_order(r["rate"]), layout_order(r["layout"]), r["size"]))
    return rows


def layout_order(layout):
    return tuple(int(x) for x in layout.split("x"))


def rate_order(rate):
    if rate == "none":
        return float("inf")
    num = "".join(c for c in rate if c.isdigit() or c == ".")
    unit = rate.lower().rstrip("bit")[len(num):]
    try:
        return float(num) * {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(unit, 1)
    except ValueError:
        return 0.0


def layout_title(rate, layout):
    h, per = layout.split("x")
    link = "unshaped links" if rate == "none" else f"{rate}/s links"
    return (f"{rate}: {h} hosts x {per} rank{'s' if per != '1' else ''} "
            f"({int(h) * int(per)} ranks), {link}")


def link_lines(links):
    """Markdown table of the probes."""
    out = ["| rate | one way, Gbit/s | both ways at once, Gbit/s each | per direction, GB/s |",
           "|---|---:|---:|---:|"]
    for rate in sorted(links, key=rate_order):
        lk = links[rate]
        if "error" in lk:
            out.append(f"| {rate} | probe failed: {lk['error'][:120]} | | |")
            continue
        bw = lk["both_ways"]
        bps = link_bytes_per_s(lk)
        out.append(f"| {rate} | {lk['one_way']['gbps']:.2f} | "
                   f"{bw['h1_to_h0']['gbps']:.2f} / {bw['h0_to_h1']['gbps']:.2f} | "
                   f"{bps / 1e9:.3f} |")
    return out


def table_lines(rows, rate, layout):
    """Markdown table of one rate x layout."""
    out = ["| size | wire floor us | AllReduce us | AllReduce busbw | algo, model us "
           "(measured/model) | Echo us | Echo busbw | Echo rel. error | AllReduce/Echo |",
           "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["rate"] != rate or r["layout"] != layout:
            continue
        lo, ec = r["progs"].get("loom"), r["progs"].get("echo")
        line = f"| {fmt_size(r['size'])} | {fmt_num(r['wire_floor_us'])} |"
        line += (f" {fmt_num(lo['time_us'])} | {lo['busbw']:.3f} | {model_cell(lo['model'])} |"
                 if lo else " - | - | - |")
        line += f" {fmt_num(ec['time_us'])} | {ec['busbw']:.3f} |" if ec else " - | - |"
        err = ec.get("relerr") if ec else None
        line += f" {err:.4f} |" if err is not None else " - |"
        line += f" {r['speedup']:.2f} |" if r["speedup"] else " - |"
        out.append(line)
    return out


def model_cell(m):
    """'ring, 632.0 (1.05)': the algorithm, the predicted time and measured/predicted."""
    if not m:
        return "-"
    ratio = f"{m['measured_over_model']:.2f}" if m["measured_over_model"] else "-"
    return f"{m['algo']}, {fmt_num(m['model_us'])} ({ratio})"


def fmt_load(avg):
    return " ".join(f"{x:.2f}" for x in avg)


def geomean(vals):
    vals = [v for v in vals if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def speedup_lines(rows):
    """Geometric mean of AllReduce/Echo per rate x layout."""
    out = []
    seen = []
    for r in rows:
        if (r["rate"], r["layout"]) not in seen:
            seen.append((r["rate"], r["layout"]))
    for rate, layout in seen:
        vals = [r["speedup"] for r in rows if r["rate"] == rate and r["layout"] == layout]
        g = geomean(vals)
        if g:
            faster = sum(1 for v in vals if v and v > 1)
            out.append(f"- {rate}, {layout}: AllReduce/Echo geomean {g:.2f}, Echo faster at "
                       f"{faster} of {len([v for v in vals if v])} sizes")
    return out


def markdown(doc, rows):
    """The whole results.md."""
    p = doc["policy"]
    lines = ["# loom bf16 AllReduce vs Echo 4-bit AllReduce across modelled hosts", "",
             f"Started {doc['started']} on {doc['machine'].get('cpu_model')} "
             f"({doc['machine'].get('cpus_usable')} usable CPUs), loom commit "
             f"{(doc['loom'].get('commit') or '?')[:12]}"
             f"{' (modified)' if doc['loom'].get('modified') else ''}, build {doc['build']}.",
             f"Each cell: median over {p['reps']} repetition(s) of the out-of-place time per "
             f"call, the programs interleaved ({p['interleave']}); `{p['flags']}`.",
             "busbw in GB/s with AllReduce's factor 2(n-1)/n on the bf16 bytes for both "
             "programs; AllReduce/Echo > 1 means Echo is faster. The wire floor is the least "
             "time an uncompressed all-reduce needs on the measured link: "
             "2(H-1)/H x size / (per-direction TCP rate). Beside each time: the algorithm "
             "loom's traced launch (LOOM_COLL_TRACE=1, one untimed call per size) chose, the "
             "cost model's predicted time and measured/predicted (AllReduce only: an Echo call is "
             "several collectives).", "",
             f"Machine: {sysinfo_text(doc['machine'])}."]
    lines += [f"loom probe: `{p['line']}`" for p in doc.get("probe", [])]
    lines += ["", "## Links: raw TCP between two host namespaces (one socket, 4 MiB buffers)", ""]
    lines += link_lines(doc["links"])
    for rate in doc["policy"]["rates"]:
        for layout in doc["policy"]["layouts"]:
            lines += ["", f"## {layout_title(rate, layout)}", ""]
            lines += table_lines(rows, rate, layout)
    sp = speedup_lines(rows)
    if sp:
        lines += ["", "## Speedup", ""] + sp
    load = [doc.get("load_start"), doc.get("load_end")]
    if all(load):
        # Every rank shares this machine's CPUs: anything else running skews the CPU-bound rows.
        lines += ["", f"Load average (1, 5, 15 min) at start {fmt_load(load[0])}, "
                      f"at end {fmt_load(load[1])}; run took {doc.get('duration_s', 0):.0f} s."]
    if doc["failures"]:
        lines += ["", "## Failures", ""]
        for f in doc["failures"]:
            where = " ".join(str(f[k]) for k in ("rate", "layout", "prog", "rep") if k in f)
            lines.append(f"- {where + ': ' if where else ''}{f['error'][:400]}")
    return "\n".join(lines) + "\n"

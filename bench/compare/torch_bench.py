#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# torch_bench.py - loom inside PyTorch: torch.distributed's collectives over
# backend loom (loom_torch) against backend gloo, in the same process layout
# (ranks forked after importing torch once, rank r bound to the (r mod C)-th
# usable CPU, one intra-op thread), interleaved per size (loom and gloo take
# turns, the first of them alternating by repetition), median of the
# repetitions; the DDP step of python/examples/ddp_train.py's model over both;
# and loom's own bench/all_reduce_perf (through loomrun, on a stream as
# loom_torch's calls are, -z 0, in place) from 1 MiB, so that the cost of the
# torch layer shows. Writes torch_results.json, torch_table.md (ratios gloo
# time / loom time: > 1 means loom is faster, and the targets) and
# torch_perf.png. Timing and checks are bench/peers/gloo_bench.py's; sizes,
# iterations and medians bench/compare's; the plot torch_plot.py's.
# Run it under flock /tmp/loom-bench.lock on a shared machine.
#   /usr/bin/python3 bench/compare/torch_bench.py [--quick] [--build DIR] [--out DIR]
#   PYTHONPATH=build/python must reach loom_torch (or give --backends gloo)
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "bench", "peers"),
                os.path.join(ROOT, "python", "examples")]
import compare  # noqa: E402
import gloo_bench  # noqa: E402
import impls  # noqa: E402
import report  # noqa: E402
import sysinfo  # noqa: E402
import torch_plot  # noqa: E402

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"]
BACKENDS = ["loom", "gloo"]
C_KEY = "loom-c"  # loom's own all_reduce_perf
NO_COMM = "none"  # the DDP example's step without DDP: what no backend can beat
LABELS = {k: style[0] for k, style in torch_plot.STYLE.items()}
C_MIN_BYTES = 1 << 20
WARMUP = 5  # bench/compare's warm-up calls per size
FULL = {"ranks": "2,4", "sizes": "8,64,512,4K,32K,64K,256K,1M,2M,16M,128M", "reps": 3,
        "ddp_steps": 30, "timeout": 900}
QUICK = {"ranks": "2", "sizes": "8,64K,4M", "reps": 1, "ddp_steps": 8, "timeout": 120}
# (name, collective, smallest size, largest size, statistic, bound): every row in range must pass
TARGETS = [
    ("AllReduce 8 B-64 KiB: Gloo/loom >= 5", "all_reduce", 8, 64 << 10, "gloo_over_loom", 5.0),
    ("AllReduce >= 1 MiB: Gloo/loom >= 2", "all_reduce", 1 << 20, 1 << 62, "gloo_over_loom", 2.0),
    ("DDP step: Gloo/loom >= 1.3", "ddp", 0, 0, "gloo_over_loom", 1.3),
    ("AllReduce >= 1 MiB: torch loom / loom all_reduce_perf <= 1.3", "all_reduce", 1 << 20,
     1 << 62, "torch_over_c", 1.3),
]
# Torch's one-tensor forms first; a backend without one (gloo in torch 1.13) gets
# the list form with the same bytes and layout, else the row says unsupported.
FORMS = {
    "all_gather": ["all_gather_into_tensor", "all_gather (list)"],
    "reduce_scatter": ["reduce_scatter_tensor", "reduce_scatter (list)"],
}
CALLS = {"all_reduce": "all_reduce", "alltoall": "all_to_all_single", "broadcast": "broadcast"}


def say(msg):
    print(msg, flush=True)


# ---- Rank side -------------------------------------------------------------------


class TorchRank(gloo_bench.Rank):
    """gloo_bench's rank, calling torch's one-tensor forms where the backend has
    them, and timing DDP steps of ddp_train.py's model."""

    def __init__(self, torch, dist, rank, nranks):
        super().__init__(torch, dist, rank, nranks)
        self.forms = {}  # flag -> index in FORMS[flag] of the form this backend takes

    def form(self, flag):
        return FORMS[flag][self.forms.get(flag, 0)] if flag in FORMS else CALLS[flag]

    def run(self, flag, send, recv, param):
        if flag not in FORMS:
            return super().run(flag, send, recv, param)
        if param == 0:
            return None
        dist, n = self.dist, self.nranks
        while True:
            name = self.form(flag)
            try:
                if name == "all_gather_into_tensor":
                    return dist.all_gather_into_tensor(recv, send)
                if name == "all_gather (list)":
                    return dist.all_gather(list(recv.view(n, param).unbind(0)), send)
                if name == "reduce_scatter_tensor":
                    return dist.reduce_scatter_tensor(recv, send)
                return dist.reduce_scatter(recv, list(send.view(n, param).unbind(0)))
            except RuntimeError as e:
                if "support" not in str(e):  # a failure, not a missing form
                    raise
                if self.forms.get(flag, 0) + 1 >= len(FORMS[flag]):
                    raise gloo_bench.Unsupported(f"{dist.get_backend()}: {e}") from e
                self.forms[flag] = self.forms.get(flag, 0) + 1

    def command(self, cmd):
        if "ddp" in cmd:
            return self.ddp(cmd["ddp"])
        rows = super().command(cmd)
        for r in rows:
            r["call"] = self.form(cmd["coll"])
        return rows

    def ddp(self, opts):
        """opts["steps"] steps of ddp_train.py's model under DDP, or with opts["comm"]
        false the same model alone on every rank at once (the step without its
        all-reduces); the median step time (warm-up steps left out) averaged over ranks."""
        import ddp_train
        from torch.nn.parallel import DistributedDataParallel
        args = ddp_train.parse_args([f"--steps={opts['steps']}", f"--batch={opts['batch']}"])
        model = ddp_train.make_model(args.dim, args.hidden, args.layers, args.outputs, args.seed)
        if opts.get("comm", True):
            model = DistributedDataParallel(model)
        losses, secs = ddp_train.train(model, args, self.rank, log=None)
        ms = self.torch.tensor([ddp_train.median_ms(secs)], dtype=self.torch.float64)
        self.dist.all_reduce(ms)
        return [{"step_ms": float(ms.item()) / self.nranks, "steps": args.steps,
                 "batch": args.batch, "last_loss": losses[-1],
                 "params": sum(p.numel() for p in model.parameters())}]


# ---- Driver side -----------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description="torch.distributed over loom against gloo")
    ap.add_argument("--quick", action="store_true",
                    help="2 ranks, 8 B, 64 KiB, 4 MiB, 1 repetition, 8 DDP steps (< 60 s)")
    ap.add_argument("--build", help="loom build directory (default: build)")
    ap.add_argument("--out", help="output directory (default BUILD_DIR/compare/torch)")
    ap.add_argument("--ranks", help="rank counts (default 2,4; quick 2)")
    ap.add_argument("--sizes", type=compare.parse_sizes, help="MIN:MAX:FACTOR or A,B,C")
    ap.add_argument("--colls", default=",".join(COLLS), help=",".join(COLLS))
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 3; quick 1)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="loom,gloo or one of them")
    ap.add_argument("--ddp-steps", type=int, help="DDP steps per repetition (0: no DDP)")
    ap.add_argument("--ddp-batch", type=int, default=16, help="DDP samples per rank and step")
    ap.add_argument("--no-c", action="store_true", help="leave out loom's all_reduce_perf")
    ap.add_argument("--timeout", type=int, help="seconds one collective or launch may take")
    a = ap.parse_args(argv)
    mode = QUICK if a.quick else FULL
    a.ranks = [int(x) for x in (a.ranks or mode["ranks"]).split(",") if x.strip()]
    a.sizes = a.sizes or compare.parse_sizes(mode["sizes"])
    a.reps = a.reps or mode["reps"]
    a.ddp_steps = mode["ddp_steps"] if a.ddp_steps is None else a.ddp_steps
    a.timeout = a.timeout or mode["timeout"]
    a.colls = [c.strip() for c in a.colls.split(",") if c.strip()]
    a.backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [c for c in a.colls if c not in COLLS] + [b for b in a.backends if b not in BACKENDS]
    if bad or not a.ranks or min(a.ranks) < 1 or a.reps < 1 or not a.backends:
        ap.error(f"bad --colls/--backends/--ranks/--reps ({', '.join(bad) or 'empty or < 1'})")
    if a.ddp_steps and a.ddp_steps <= 2:
        ap.error("--ddp-steps: more than the 2 warm-up steps, or 0")
    return a


class StreamLoom(impls.Loom):
    """loom's all_reduce_perf on a stream (-z 0), the path loom_torch's calls take
    (bench/compare's -z 2 blocks on the calling thread instead); its in-place
    column is compared, since torch's all_reduce is in place."""

    def command(self, coll, nranks, sweep, iters, warmup, check, json_path):
        cmd = super().command(coll, nranks, sweep, iters, warmup, check, json_path)
        cmd[cmd.index("-z") + 1] = "0"
        return cmd


class Config:
    """What impls.Loom needs to run all_reduce_perf."""

    def __init__(self, a):
        self.root = ROOT
        self.build = os.path.abspath(a.build or os.path.join(ROOT, "build"))
        self.out = os.path.abspath(a.out or os.path.join(self.build, "compare", "torch"))
        self.logs = os.path.join(self.out, "logs")
        self.net, self.timeout, self.warmup, self.tmp = "shm", a.timeout, WARMUP, None


def record(doc, key, coll, n, rep, rows):
    for r in rows:
        o = r["in_place" if key == C_KEY else "out_of_place"]
        doc["measurements"].append({
            "impl": key, "coll": coll, "nranks": n, "rep": rep, "size": r["size"],
            "count": r["count"], "iters": r.get("actual_iterations"), "time_us": o["time"],
            "algbw": o["alg_bw"], "busbw": o["bus_bw"], "nwrong": o["nwrong"],
            "call": r.get("call", "all_reduce_perf -z 0, in place")})
        if o["nwrong"]:
            doc["failures"].append({"impl": key, "coll": coll, "nranks": n, "rep": rep,
                                    "error": f"{o['nwrong']} wrong elements at {r['size']} bytes"})


def ask(doc, groups, b, n, what, cmd):
    """One command to backend b's ranks; the answer, or None (recorded why)."""
    try:
        ans = groups[b].run(cmd)
    except RuntimeError as e:
        doc["failures"].append({"impl": b, "nranks": n, "what": what, "error": str(e)})
        say(f"# {b} {n} ranks {what}: FAILED: {e}")
        groups.pop(b).close()
        return None
    if "unsupported" in ans:
        u = {"impl": b, "coll": cmd.get("coll"), "nranks": n, "why": ans["unsupported"]}
        if u not in doc["unsupported"]:
            doc["unsupported"].append(u)
        return None
    return ans["results"]


def run_ranks(a, cfg, n, doc, cloom):
    """Every collective, size and repetition on n ranks, then the DDP steps."""
    groups = {}
    for b in a.backends:
        try:
            groups[b] = gloo_bench.Group(n, a.timeout, backend=b, rank_cls=TorchRank)
        except RuntimeError as e:
            doc["failures"].append({"impl": b, "nranks": n, "error": f"start: {e}"})
            say(f"# {b} on {n} ranks did not start: {e}")
    for coll in a.colls:
        for rep in range(1, a.reps + 1):
            t0 = time.monotonic()
            order = a.backends if rep % 2 else a.backends[::-1]
            for size in a.sizes:
                band = [size, size, 2, compare.iters_for(size)]
                for b in [b for b in order if b in groups]:
                    cmd = {"coll": coll, "bands": [band], "warmup": WARMUP,
                           "check": 1 if rep == 1 else 0}
                    rows = ask(doc, groups, b, n, coll, cmd)
                    record(doc, b, coll, n, rep, [r for r in rows or [] if r["size"]])
                if coll == "all_reduce" and cloom and size >= C_MIN_BYTES:
                    o = cloom.run("all_reduce", n, [band], rep, 1 if rep == 1 else 0)
                    if o.error:
                        doc["failures"].append({"impl": C_KEY, "coll": coll, "nranks": n,
                                                "rep": rep, "error": o.error})
                    else:
                        record(doc, C_KEY, coll, n, rep, o.rows)
            say(f"[{n} ranks {report.NAMES[coll]:<14} rep {rep}/{a.reps}] "
                f"{time.monotonic() - t0:.1f}s")
    for rep in range(1, a.reps + 1 if a.ddp_steps else 1):
        order = a.backends if rep % 2 else a.backends[::-1]
        # NO_COMM: the same ranks training alone, in the first backend's group
        for b, key in [(b, b) for b in order if b in groups] + [(order[0], NO_COMM)]:
            if b not in groups:
                continue
            got = ask(doc, groups, b, n, "ddp", {"ddp": {"steps": a.ddp_steps,
                                                         "batch": a.ddp_batch,
                                                         "comm": key != NO_COMM}})
            for r in got or []:
                doc["ddp"].append(dict(r, impl=key, nranks=n, rep=rep))
        say(f"[{n} ranks DDP step rep {rep}/{a.reps}] done")
    for g in groups.values():
        g.close()


def summarize(doc, keys):
    """report.summarize's rows (median per implementation, loom_over_peer[X] =
    X's time / loom's) with torch_over_c; the DDP medians and ratios."""
    rows = report.summarize(doc["measurements"], keys)
    for r in rows:
        c = r["impls"].get(C_KEY, {}).get("time_us")
        t = r["impls"].get("loom", {}).get("time_us")
        r["gloo_over_loom"] = r["loom_over_peer"].get("gloo")
        r["torch_over_c"] = t / c if c and t else None
    ddp = []
    for n in sorted({d["nranks"] for d in doc["ddp"]}):
        med = {b: statistics.median(d["step_ms"] for d in doc["ddp"]
                                    if d["nranks"] == n and d["impl"] == b)
               for b in BACKENDS + [NO_COMM]
               if any(d["nranks"] == n and d["impl"] == b for d in doc["ddp"])}
        some = next(d for d in doc["ddp"] if d["nranks"] == n)
        ratio = med["gloo"] / med["loom"] if "gloo" in med and "loom" in med else None
        bound = med["gloo"] / med[NO_COMM] if "gloo" in med and NO_COMM in med else None
        ddp.append({"nranks": n, "step_ms": med, "gloo_over_loom": ratio,
                    "gloo_over_no_comm": bound, "params": some["params"],
                    "batch": some["batch"], "steps": some["steps"]})
    return rows, ddp


def targets(rows, ddp):
    """Each target: the worst value over the rows it covers and whether it holds."""
    out = []
    for name, coll, lo, hi, stat, bound in TARGETS:
        if coll == "ddp":
            vals = [d["gloo_over_loom"] for d in ddp]
        else:
            vals = [r[stat] for r in rows if r["coll"] == coll and lo <= r["size"] <= hi]
        vals = [v for v in vals if v is not None]
        upper = stat == "torch_over_c"
        worst = (max(vals) if upper else min(vals)) if vals else None
        met = None if worst is None else (worst <= bound if upper else worst >= bound)
        out.append({"target": name, "worst": worst, "met": met, "rows": len(vals)})
    return out


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(doc, rows, ddp, tgts):
    """The table of torch_table.md (and docs/PERFORMANCE.md)."""
    m = doc["machine"]
    lines = [f"CPU: {sysinfo.machine_text(m)}; torch {doc['torch']}; "
             f"loom {doc['loom']['commit']}; median of {doc['reps']} interleaved repetition(s); time per call in µs; "
             "Gloo/loom = Gloo's time / loom's (> 1: loom faster); torch/C = loom through torch "
             "/ loom's all_reduce_perf on a stream (-z 0, in place)", "",
             "| collective | ranks | size | loom µs | Gloo µs | Gloo/loom | C loom µs | torch/C |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = {k: v["time_us"] for k, v in r["impls"].items()}
        lines.append(f"| {report.NAMES[r['coll']]} | {r['nranks']} | {report.fmt_size(r['size'])} "
                     f"| {fmt(t.get('loom'), '.1f')} | {fmt(t.get('gloo'), '.1f')} "
                     f"| {fmt(r['gloo_over_loom'], '.2f')} | {fmt(t.get(C_KEY), '.1f')} "
                     f"| {fmt(r['torch_over_c'], '.2f')} |")
    calls = sorted({(x["impl"], x["coll"], x["call"]) for x in doc["measurements"]
                    if x["impl"] in BACKENDS and x["call"] != CALLS.get(x["coll"])})
    lines.append("")
    lines += [f"- {LABELS[i]} {report.NAMES[c]}: `{f}`" for i, c, f in calls]
    lines += [f"- {LABELS[u['impl']]} {report.NAMES.get(u['coll'], u['coll'])} ({u['nranks']} "
              f"ranks): n/a ({u['why'][:120]})" for u in doc["unsupported"]]
    if ddp:
        lines += ["", "| DDP step (ddp_train.py) | ranks | params | batch per rank | loom ms "
                  "| Gloo ms | Gloo/loom | no DDP ms | Gloo/no DDP |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for d in ddp:
            ms = d["step_ms"]
            lines.append(f"| MLP, {d['steps']} steps | {d['nranks']} | {d['params']} | "
                         f"{d['batch']} | {fmt(ms.get('loom'), '.2f')} | "
                         f"{fmt(ms.get('gloo'), '.2f')} | {fmt(d['gloo_over_loom'], '.2f')} | "
                         f"{fmt(ms.get(NO_COMM), '.2f')} | {fmt(d['gloo_over_no_comm'], '.2f')} |")
        lines.append("- no DDP: every rank trains the same model alone at the same time, "
                     "no all-reduce; Gloo/no DDP bounds the Gloo/loom any backend can reach")
    lines += ["", "| target | worst row | met |", "|---|---:|---|"]
    for t in tgts:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {fmt(t['worst'], '.2f')} | {met} |")
    return lines


def loom_torch_error():
    try:
        import loom_torch  # noqa: F401
    except ImportError as e:
        return f"{e}; HINT: ninja -C build, then PYTHONPATH=build/python"
    return None


def main(argv):
    a = parse_args(argv)
    cfg = Config(a)
    os.makedirs(cfg.logs, exist_ok=True)
    t_start = time.time()
    import torch
    doc = {"tool": "bench/compare/torch_bench.py", "mode": "quick" if a.quick else "full",
           "args": argv, "torch": torch.__version__, "reps": a.reps,
           "policy": {"warmup_iters": WARMUP, "iters": "bench/compare's", "sizes": a.sizes,
                      "interleave": "per size: loom and gloo in turn, the first alternating "
                                    "by repetition; all_reduce_perf after each repetition",
                      "binding": "rank r on the (r mod C)-th usable CPU, one intra-op thread",
                      "statistic": "median of the repetitions' times (each the mean over ranks)"},
           "machine": sysinfo.machine(), "load_start": sysinfo.load(),
           "loom": sysinfo.loom_source(ROOT), "measurements": [], "ddp": [], "failures": [],
           "unsupported": [], "complete": False}
    say(f"# torch_bench: {doc['mode']} run, backends {a.backends}, ranks {a.ranks}, "
        f"{len(a.sizes)} sizes, {a.reps} repetition(s), output in {cfg.out}")
    say(f"# machine: {sysinfo.machine_text(doc['machine'])}")
    if "loom" in a.backends and loom_torch_error():
        say(f"# backend loom: loom_torch not importable: {loom_torch_error()}")
        say("torch_bench: FAILED (give --backends gloo to measure Gloo alone)")
        return 1
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cloom = None
    if "loom" in a.backends and not a.no_c and "all_reduce" in a.colls:
        cloom = StreamLoom(cfg)
        if not os.access(os.path.join(cfg.build, "bench", "all_reduce_perf"), os.X_OK):
            cloom.reason = f"{cfg.build}/bench/all_reduce_perf is missing: ninja -C {cfg.build}"
        if not cloom.available():
            doc["failures"].append({"impl": C_KEY, "error": cloom.reason})
            cloom = None
    with tempfile.TemporaryDirectory(prefix="loom-torch-bench-") as tmp:
        cfg.tmp = tmp
        for n in a.ranks:
            run_ranks(a, cfg, n, doc, cloom)
    keys = [k for k in BACKENDS + [C_KEY] if any(m["impl"] == k for m in doc["measurements"])]
    rows, ddp = summarize(doc, keys)
    tgts = targets(rows, ddp)
    doc.update(summary=rows, ddp_summary=ddp, targets=tgts, load_end=sysinfo.load(),
               duration_s=round(time.time() - t_start, 1), complete=True)
    lines = markdown(doc, rows, ddp, tgts)
    with open(os.path.join(cfg.out, "torch_table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    with open(os.path.join(cfg.out, "torch_results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    why_not = torch_plot.plot(doc, os.path.join(cfg.out, "torch_perf.png"))
    if why_not:
        say(f"# no plot: {why_not}")
    for fl in doc["failures"]:
        say(f"# FAILED {fl['impl']}: {fl['error'][:300]}")
    status = "FAILED" if doc["failures"] else "OK"
    say(f"torch_bench: {status}: {len(rows)} rows, {len(doc['failures'])} failure(s), "
        f"{doc['duration_s']:.0f} s; results in {cfg.out}/torch_results.json, torch_table.md, "
        "torch_perf.png")
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

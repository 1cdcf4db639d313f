#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# compare.py - bench/compare's driver, started by bench/compare/run: builds
# what is missing (loom's benchmarks, bench/peers' programs with each MPI's
# mpicc), measures the memcpy and TCP limits, runs loom once traced (the
# algorithm and the model's prediction per size, the library's probe lines),
# then loom, Open MPI, MPICH, Intel MPI and Gloo interleaved (for each rank
# count, collective and repetition: loom, then each peer) on the same size
# bands with the same iteration policy and binding, and writes results.json,
# busbw.png and the ratio table. It exits non-zero
# only when something failed to build or run (or gave wrong results), never
# because of a ratio. The last line it prints says which.
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import impls  # noqa: E402
import report  # noqa: E402
import sysinfo  # noqa: E402

# Iteration policy, one for every implementation: MAX_ITERS timed calls (5
# warm-up calls per size) below ITER_BYTES / MAX_ITERS, then as many calls as
# move ITER_BYTES, at least MIN_ITERS, so big sizes do not dominate. nccl-tests'
# 20 calls and 1 warm-up are too few for sub-microsecond calls: one descheduled
# rank in 20 calls moved a median by 100x. Results are checked once per size,
# in the first repetition.
MAX_ITERS, MIN_ITERS, ITER_BYTES = 200, 2, 128 << 20
FULL = {"ranks": "2,4,8", "sizes": "8:128M:4", "reps": 3, "timeout": 900}
QUICK = {"ranks": "2", "sizes": "8,64K,4M", "reps": 1, "timeout": 300}


def parse_size(text):
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        value = float(text[:-1] if mult > 1 else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (bytes, K, M or G)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size '{text}' is below 1 byte")
    return int(value * mult)


def parse_sizes(text):
    """'MIN:MAX:FACTOR' (a geometric range) or 'A,B,C' (a list)."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError("--sizes MIN:MAX:FACTOR, e.g. 8:128M:4")
        lo, hi, f = parse_size(parts[0]), parse_size(parts[1]), int(parts[2])
        if f < 2 or lo > hi:
            raise argparse.ArgumentTypeError("--sizes MIN:MAX:FACTOR wants MIN <= MAX, FACTOR >= 2")
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= f
        return out
    return sorted({parse_size(x) for x in text.split(",") if x.strip()})


def iters_for(size):
    return max(MIN_ITERS, min(MAX_ITERS, ITER_BYTES // max(size, 1)))


def make_bands(sizes):
    """Consecutive sizes with the same iteration count and a whole ratio form
    one band [MIN, MAX, FACTOR, ITERS]: one *_perf run with -b -e -f -n."""
    bands = []
    for s in sizes:
        it = iters_for(s)
        if bands:
            b = bands[-1]
            single = b[0] == b[1]
            if b[3] == it and single and s % b[1] == 0 and s // b[1] >= 2:
                b[1], b[2] = s, s // b[1]
                continue
            if b[3] == it and not single and s == b[1] * b[2]:
                b[1] = s
                continue
        bands.append([s, s, 2, it])
    return bands


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/compare/run",
        description="loom side by side with Open MPI, MPICH, Intel MPI and Gloo "
                    "(torch.distributed)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 2 ranks, 8 B, 64 KiB, 4 MiB, 1 repetition")
    ap.add_argument("--out", help="output directory (default BUILD_DIR/compare)")
    ap.add_argument("--build", help="loom build directory (default: build in the source tree)")
    ap.add_argument("--ranks", help="rank counts, e.g. 2,4,8")
    ap.add_argument("--colls", default=",".join(impls.COLLS),
                    help="collectives (default: all): " + ",".join(impls.COLLS))
    ap.add_argument("--sizes", type=parse_sizes,
                    help="MIN:MAX:FACTOR or a list A,B,C (bytes; K, M, G suffixes)")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (median is reported)")
    ap.add_argument("--net", choices=["shm", "tcp"], default="shm",
                    help="shm: every implementation's default local path; tcp: loom with "
                         "LOOM_NET=tcp, MPIs forced onto TCP")
    ap.add_argument("--impls", default=",".join(impls.KEYS),
                    help=f"implementations to run (default {','.join(impls.KEYS)})")
    ap.add_argument("--timeout", type=int, help="seconds one launch may take")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install the peers (apt-get, pip)")
    ap.add_argument("--base", metavar="REV_OR_DIR",
                    help="an earlier loom to run interleaved with this one, as implementation "
                         "'base': a git revision of this source tree (exported and built under "
                         "OUT/base) or a loom build directory; the report gives loom/base per "
                         "collective and names any collective whose geomean fell by more than "
                         f"{report.BASE_DROP * 100:.0f} %%")
    ap.add_argument("--root", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    mode = QUICK if a.quick else FULL
    a.ranks = [int(x) for x in (a.ranks or mode["ranks"]).split(",") if x.strip()]
    a.sizes = a.sizes or parse_sizes(mode["sizes"])
    a.reps = a.reps or mode["reps"]
    a.timeout = a.timeout or mode["timeout"]
    a.colls = [c.strip() for c in a.colls.split(",") if c.strip()]
    a.impls = [c.strip() for c in a.impls.split(",") if c.strip()]
    bad = [c for c in a.colls if c not in impls.COLLS]
    bad += [i for i in a.impls if i not in impls.KEYS]
    if bad or not a.colls or not a.ranks or min(a.ranks) < 1 or a.reps < 1:
        ap.error(f"bad --colls/--impls/--ranks/--reps ({', '.join(bad) or 'empty or < 1'})")
    return a


class Config:
    """What the implementations need to know (see impls.Impl)."""

    def __init__(self, a, root):
        self.root = root
        self.build = os.path.abspath(a.build or os.path.join(root, "build"))
        self.out = os.path.abspath(a.out or os.path.join(self.build, "compare"))
        self.logs = os.path.join(self.out, "logs")
        self.peers_bin = os.path.join(self.out, "bin")
        # bench/compare/run sets it; the same default as install_peers.sh's otherwise
        self.impi_prefix = os.environ.get("LOOM_IMPI_PREFIX") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loom", "impi")
        self.net, self.timeout = a.net, a.timeout
        self.warmup = 5
        self.python = sys.executable
        self.tmp = None
        self.base_build = self.base_name = None  # set by prepare_base
        self.limits = {}  # the limits measured at the start, for loom's memory rate


def prepare_base(a, cfg):
    """--base: a build directory as it is, or a git revision of cfg.root exported (git
    archive) into OUT/base/src and built in OUT/base/build. Sets cfg.base_build and
    cfg.base_name; returns None or what went wrong."""
    if os.path.isfile(os.path.join(a.base, "tools", "loomrun")):
        cfg.base_build = os.path.abspath(a.base)
        cfg.base_name = os.path.basename(os.path.dirname(cfg.base_build)) or "base"
        return build_loom(cfg.base_build, None, a.colls, cfg.logs)
    r = subprocess.run(["git", "-C", cfg.root, "rev-parse", "--short", "--verify",
                        a.base + "^{commit}"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"--base {a.base}: neither a loom build directory nor a revision of {cfg.root}"
    cfg.base_name = r.stdout.strip()
    src = os.path.join(cfg.out, "base", f"src-{cfg.base_name}")
    cfg.base_build = os.path.join(cfg.out, "base", f"build-{cfg.base_name}")
    if not os.path.isfile(os.path.join(src, "meson.build")):
        os.makedirs(src, exist_ok=True)
        archive = subprocess.Popen(["git", "-C", cfg.root, "archive", cfg.base_name],
                                   stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout)
        archive.stdout.close()
        if archive.wait() != 0 or untar.returncode != 0:
            return f"--base {a.base}: git archive of {cfg.base_name} into {src} failed"
    say(f"# base: loom {cfg.base_name} from {src}")
    return build_loom(cfg.base_build, src, a.colls, cfg.logs)


def say(msg):
    print(msg, flush=True)


def build_loom(build, root, colls, logs):
    """meson setup of root in build (if there is no build yet) and ninja for just
    the programs we run, when one of them is missing. Returns None or what went
    wrong."""
    targets = ["tools/loomrun"] + [f"bench/{c}_perf" for c in colls]
    targets += [f"bench/peers/{p}" for p in ("bind_rank", "memcpy_bw", "tcp_bw")]
    if all(os.access(os.path.join(build, t), os.X_OK) for t in targets):
        say(f"# loom: using the programs in {build}")
        return None
    log = os.path.join(logs, "build.log")
    steps = []
    if not os.path.exists(os.path.join(build, "build.ninja")):
        if root is None:
            return f"{build} has no build.ninja to build the missing programs with"
        setup = ["meson", "setup", build, root]
        if not shutil.which("pkg-config") or \
                subprocess.run(["pkg-config", "--exists", "gtest"]).returncode != 0:
            setup.append("-Dtests=false")  # GoogleTest is not installed: benchmarks only
        steps.append(setup)
    steps.append(["ninja", "-C", build] + targets)
    say(f"# loom: building in {build} (log {log})")
    for cmd in steps:
        if not shutil.which(cmd[0]):
            return f"{cmd[0]} not found; run tools/install_deps.sh (or bench/compare/run without " \
                   f"--no-install)"
        rc, _ = impls.run_bounded(cmd, None, log, 3600)
        if rc != 0:
            return f"'{' '.join(cmd)}' failed: {impls.tail(log)}"
    missing = [t for t in targets if not os.access(os.path.join(build, t), os.X_OK)]
    return f"still missing after the build: {', '.join(missing)}" if missing else None


def build_peers(cfg, impl_list):
    """mpi_coll_bench with each MPI's own mpicc; an MPI whose build fails is
    skipped with the compiler's message as its reason."""
    src = os.path.join(cfg.root, "bench", "peers", "mpi_coll_bench.c")
    for impl in impl_list:
        if isinstance(impl, impls.Mpi):
            impl.build(src)


def trace_all(a, cfg, loom, doc):
    """One traced loom launch per rank count and collective: doc's "trace"
    rows (algorithm and prediction per size) and "probe" lines."""
    for n in a.ranks:
        for coll in a.colls:
            t = loom.trace(coll, n, a.sizes)
            if t["error"]:
                doc["failures"].append({"impl": "loom", "coll": coll, "nranks": n,
                                        "error": f"traced launch: {t['error']}"})
            for size, r in sorted(t["rows"].items()):
                doc["trace"].append(dict(r, coll=coll, nranks=n, size=size))
            for p in t["probe"]:
                if p["line"] not in {x["line"] for x in doc["probe"]}:
                    doc["probe"].append(dict(p, nranks=n))
            say(f"[{n} ranks {report.NAMES[coll]:<14} traced] {len(t['rows'])} sizes, "
                f"{t['seconds']:.1f}s" + (" FAILED" if t["error"] else ""))


def run_all(a, cfg, impl_list, doc):
    """The interleaved loop; fills doc's measurements, failures, unsupported."""
    bands = make_bands(a.sizes)
    for n in a.ranks:
        down = set()  # could not start for this rank count
        for impl in impl_list:
            err = impl.start(n)
            if err:
                doc["failures"].append({"impl": impl.key, "nranks": n, "error": err})
                say(f"# {impl.label}: {err}")
                down.add(impl.key)
        for coll in a.colls:
            for rep in range(1, a.reps + 1):
                parts = []
                for impl in impls.rep_order(impl_list, rep):
                    if impl.key in down:
                        parts.append(f"{impl.key} -")
                        continue
                    o = impl.run(coll, n, bands, rep, 1 if rep == 1 else 0)
                    parts.append(f"{impl.key} {o.seconds:.1f}s")
                    if o.unsupported:
                        if rep == 1:
                            doc["unsupported"].append({"impl": impl.key, "coll": coll,
                                                       "nranks": n, "why": o.unsupported})
                        parts[-1] = f"{impl.key} unsupported"
                        continue
                    if o.error:
                        doc["failures"].append({"impl": impl.key, "coll": coll, "nranks": n,
                                                "rep": rep, "error": o.error})
                        parts[-1] = f"{impl.key} FAILED"
                        continue
                    record(doc, impl.key, coll, n, rep, o.rows)
                say(f"[{n} ranks {report.NAMES[coll]:<14} rep {rep}/{a.reps}] " +
                    " | ".join(parts))
        for impl in impl_list:
            impl.stop()
        save(cfg, doc)  # a run stopped later still leaves what it measured


def save(cfg, doc):
    path = os.path.join(cfg.out, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def record(doc, key, coll, n, rep, rows):
    for r in rows:
        o = r.get("out_of_place") or {}
        if key in ("loom", "base") and coll == "broadcast" and r.get("in_place"):
            # MPI_Bcast has one buffer (the root sends from it): its match is loom's
            # in-place broadcast, not one whose root also copies sendbuff into recvbuff.
            o = r["in_place"]
        m = {"impl": key, "coll": coll, "nranks": n, "rep": rep, "size": r["size"],
             "count": r["count"], "iters": r.get("actual_iterations"), "time_us": o.get("time"),
             "algbw": o.get("alg_bw"), "busbw": o.get("bus_bw"), "nwrong": o.get("nwrong")}
        if r.get("model_us") is not None:
            m["model_us"] = r["model_us"]  # loom's prediction in the same launch (-M 1)
        doc["measurements"].append(m)
        if m["nwrong"]:
            doc["failures"].append({"impl": key, "coll": coll, "nranks": n, "rep": rep,
                                    "error": f"{m['nwrong']} wrong elements at {r['size']} bytes"})


def main(argv):
    a = parse_args(argv)
    root = os.path.abspath(a.root or os.path.join(os.path.dirname(__file__), "..", ".."))
    cfg = Config(a, root)
    os.makedirs(cfg.logs, exist_ok=True)
    t_start = time.time()
    say(f"# bench/compare: {'quick' if a.quick else 'full'} run, net {a.net}, ranks {a.ranks}, "
        f"{len(a.sizes)} sizes, {a.reps} repetition(s), output in {cfg.out}")

    err = build_loom(cfg.build, cfg.root, a.colls, cfg.logs)
    if err:
        say(f"# loom build failed: {err}")
        say("compare: FAILED (loom could not be built)")
        return 1
    if a.base:
        err = prepare_base(a, cfg)
        if err:
            say(f"# base: {err}")
            say("compare: FAILED (the base loom could not be built)")
            return 1
    impl_list = impls.make_all(cfg, a.impls)
    build_peers(cfg, impl_list)
    doc = {
        "tool": "bench/compare", "mode": "quick" if a.quick else "full", "net": a.net,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "args": argv,
        "policy": {"warmup_iters": cfg.warmup, "check": "every size, in the first repetition",
                   "reps": a.reps,
                   "iters": f"max({MIN_ITERS}, min({MAX_ITERS}, {ITER_BYTES} / size))",
                   "bands": make_bands(a.sizes), "ranks": a.ranks, "colls": a.colls,
                   "interleave": "for each rank count, collective and repetition: "
                                 + ", ".join(i.key for i in impl_list)
                                 + ("; loom and base trade places in even repetitions"
                                    if a.base else ""),
                   "binding": "rank r on the (r mod C)-th usable CPU, every implementation",
                   "statistic": "median of the repetitions' times (each the mean over ranks)"},
        "machine": sysinfo.machine(), "load_start": sysinfo.load(),
        "packages": sysinfo.packages(cfg.impi_prefix), "loom": sysinfo.loom_source(root),
        "implementations": {}, "limits": {}, "trace": [], "probe": [], "measurements": [],
        "failures": [], "unsupported": [], "complete": False,
    }
    doc["loom"]["build_dir"] = cfg.build
    say(f"# machine: {sysinfo.machine_text(doc['machine'])}")
    for impl in impl_list:
        doc["implementations"][impl.key] = impl.info()
        state = "ready" if impl.available() else f"skipped: {impl.reason}"
        say(f"# {impl.label:<8} {state}; {impl.info().get('path', '')}")
    active = [i for i in impl_list if i.available()]
    if not any(i.key == "loom" for i in active):
        say("compare: FAILED (loom's programs are not available)")
        return 1

    doc["limits"]["start"] = sysinfo.limits(cfg.build, 300, a.quick)
    cfg.limits = doc["limits"]["start"]
    for line in sysinfo.limits_text(doc["limits"]["start"]):
        say(f"# limit: {line}")
    trace_all(a, cfg, next(i for i in active if i.key == "loom"), doc)
    for p in doc["probe"]:
        say(f"# loom probe (rank {p['rank']} of {p['nranks']}): {p['line']}")
    doc["properties"] = sysinfo.properties(doc["machine"], doc["limits"]["start"], doc["probe"])
    with tempfile.TemporaryDirectory(prefix="loom-compare-") as tmp:
        cfg.tmp = tmp
        try:
            run_all(a, cfg, active, doc)
        finally:
            for impl in active:
                impl.stop()
    doc["limits"]["end"] = sysinfo.limits(cfg.build, 300, a.quick)
    doc["load_end"] = sysinfo.load()
    return finish(a, cfg, doc, active, t_start)


def finish(a, cfg, doc, active, t_start):
    keys = [i.key for i in active]
    labels = {i.key: i.label for i in active}
    rows = report.summarize(doc["measurements"], keys, doc["trace"])
    doc["summary"] = rows
    doc["duration_s"] = round(time.time() - t_start, 1)
    lines = [f"# loom vs peers, net {a.net}: median of {a.reps} interleaved repetition(s); "
             "time in us per call, busbw in GB/s (nccl-tests factors)",
             "# loom/best = best peer time / loom time = loom busbw / best peer busbw; "
             "> 1: loom is faster; loom/X: the same against peer X alone",
             "# algo: what loom's traced launch chose; model us: the cost model's prediction in the "
             "timed launches (median); "
             "meas/model = loom's measured time / the prediction",
             f"# machine: {sysinfo.machine_text(doc['machine'])}"]
    lines += [f"# loom probe: {p['line']}" for p in doc["probe"]]
    for k in keys:
        lines.append(f"# {labels[k]}: {doc['implementations'][k].get('path', '')}")
    lines += report.table(rows, keys, labels)
    lines.append("")
    lines += report.ratio_matrix(rows, labels)
    lines.append("")
    lines += report.geomean_lines(rows)
    lines += report.base_lines(rows, labels.get("base"))
    lines += report.model_lines(rows)
    lines += report.limit_lines(rows, doc["limits"], a.net)
    for u in doc["unsupported"]:
        lines.append(f"# {labels.get(u['impl'], u['impl'])} {report.NAMES[u['coll']]} "
                     f"({u['nranks']} ranks): unsupported: {u['why']}")
    for when in ("start", "end"):
        for line in sysinfo.limits_text(doc["limits"].get(when, {})):
            lines.append(f"# limit at {when}: {line}")
    lines.append(f"# load average at start {doc['load_start']}, at end {doc['load_end']}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(cfg.out, "table.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    why_not = report.plot(rows, keys, labels, a.ranks, a.colls, doc["limits"].get("start", {}),
                          a.net, os.path.join(cfg.out, "busbw.png"))
    doc["plot"] = "busbw.png" if why_not is None else None
    if why_not:
        say(f"# no plot: {why_not}")
    doc["complete"] = True
    save(cfg, doc)
    for fl in doc["failures"]:
        where = " ".join(str(fl[k]) for k in ("coll", "nranks", "rep") if k in fl)
        say(f"# FAILED {fl['impl']} {where}: {fl['error'][:300]}")
    g = report.overall_geomean(rows)
    gtxt = f", geomean loom/best {g:.2f}" if g else ""
    status = "FAILED" if doc["failures"] else "OK"
    ran = ",".join(keys)
    say(f"compare: {status}: {len(rows)} rows ({ran}){gtxt}, "
        f"{len(doc['failures'])} failure(s), {doc['duration_s']:.0f} s; "
        f"results in {cfg.out}/results.json, table.txt, busbw.png")
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

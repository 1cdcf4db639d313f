# SPDX-License-Identifier: Apache-2.0
#
# impls.py - how bench/compare runs each implementation: loom's *_perf through
# loomrun (and once more traced, for the model's choice), bench/peers/
# mpi_coll_bench built and launched by Open MPI, MPICH and Intel MPI with
# bench/peers/bind_rank, and bench/peers/gloo_bench.py as a long-lived server
# per rank count. Every one gets the same bands (MIN:MAX:FACTOR:ITERS sweeps),
# warm-up and check policy, binds rank r to the (r mod C)-th usable CPU, and
# answers with nccl-tests-shaped rows (out_of_place: time, alg_bw, bus_bw,
# nwrong). Every launch is bounded by a timeout and killed as a process group.
# It does not decide what to run or aggregate results (compare.py, report.py).
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

import coll_trace
import sysinfo

# The *_perf program names are the collectives' flags everywhere.
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce",
         "all_gatherv", "reduce_scatterv"]


class Outcome:
    """What one launch gave: rows, or unsupported (a reason), or an error."""

    def __init__(self, rows=None, unsupported=None, error=None, seconds=0.0):
        self.rows, self.unsupported, self.error, self.seconds = rows, unsupported, error, seconds


def run_bounded(cmd, env, log_path, timeout_s):
    """Runs cmd with output appended to log_path; returns (exit code or None on
    timeout, seconds). A timed-out command's whole process group is killed."""
    t0 = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(p)
            log.write(f"# killed after {timeout_s} s\n")
            rc = None
    return rc, time.monotonic() - t0


def kill_group(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


# Lines of a log that say what went wrong, rather than a launcher's boilerplate.
TELLING = ("mpi_coll_bench:", "loomrun:", "bind_rank:", "HINT:", "Test loom failure", "rror",
           "FAILED", "Traceback", "timeout", "killed")


def tail(path, lines=4):
    """The last telling lines of a log (or its last lines), joined by ' | '."""
    try:
        with open(path, errors="replace") as f:
            text = [x.strip() for x in f if x.strip() and not x.startswith("$ ")]
    except OSError:
        return ""
    telling = [x for x in text if any(t in x for t in TELLING)]
    return " | ".join((telling or text)[-lines:])


def read_rows(path):
    with open(path) as f:
        doc = json.load(f)
    return doc.get("results", [])


class Impl:
    """One implementation. Subclasses set key and label and fill in the rest."""

    key = label = ""

    def __init__(self, cfg):
        self.cfg = cfg  # compare.py's settings: build, peers dir, net, logs, timeout, warmup
        self.reason = None  # why it is not available, or None

    def available(self):
        return self.reason is None

    def info(self):
        return {"label": self.label, "available": self.available(), "reason": self.reason}

    def start(self, nranks):
        """Called before the first run on nranks ranks."""

    def stop(self):
        """Called after the last run on the current rank count."""

    def log_path(self, coll, nranks, rep):
        return os.path.join(self.cfg.logs, f"{self.key}_{coll}_n{nranks}_r{rep}.log")


class Loom(Impl):
    key, label = "loom", "loom"

    predict = True  # -M 1: the cost model's prediction beside each row

    def __init__(self, cfg, build_dir=None):
        super().__init__(cfg)
        self.build_dir = build_dir or cfg.build
        self.loomrun = os.path.join(self.build_dir, "tools", "loomrun")
        if not os.access(self.loomrun, os.X_OK):
            self.reason = f"{self.loomrun} is missing"

    def info(self):
        d = super().info()
        d["path"] = ("LOOM_NET=tcp: TCP between every pair of ranks" if self.cfg.net == "tcp"
                     else "default transports: shared memory between local ranks")
        d["launch"] = ("loomrun -n N (binds rank r to the (r mod C)-th usable CPU); blocking "
                       "calls back to back (-z 2)")
        return d

    def env(self, nranks=0):
        env = dict(os.environ)
        if self.cfg.net == "tcp":
            env["LOOM_NET"] = "tcp"
        # The memory's copy rate, which loom cannot measure at creation, for the prediction of
        # the shm calls that outgrow the L3; a value set by the caller stands.
        mbps = sysinfo.memory_mbps(getattr(self.cfg, "limits", {}), nranks) if nranks else None
        if mbps and "LOOM_SHM_MEMORY_MBPS" not in env:
            env["LOOM_SHM_MEMORY_MBPS"] = str(mbps)
        return env

    def command(self, coll, nranks, sweep, iters, warmup, check, json_path):
        """loomrun and the *_perf program over one sweep (MIN, MAX, FACTOR)."""
        prog = os.path.join(self.build_dir, "bench", f"{coll}_perf")
        # -z 2: blocking calls back to back, the shape of the MPI benchmark's loop (a
        # stream would add its worker thread's hand-off, which MPI does not have).
        # -M 1: each row's prediction from the constants this launch measured at creation, so
        # that measured/predicted compares one launch with itself.
        cmd = [self.loomrun, "-v", "-n", str(nranks), prog, "-b", str(sweep[0]), "-e",
               str(sweep[1]), "-f", str(sweep[2]), "-n", str(iters), "-w", str(warmup), "-c",
               str(check), "-z", "2", "-T", str(self.cfg.timeout)]
        cmd += ["-M", "1"] if self.predict else []
        return cmd + (["-J", json_path] if json_path else [])

    def run(self, coll, nranks, bands, rep, check):
        log = self.log_path(coll, nranks, rep)
        rows, total = [], 0.0
        for lo, hi, factor, iters in bands:
            fd, js = tempfile.mkstemp(suffix=".json", dir=self.cfg.tmp)
            os.close(fd)
            cmd = self.command(coll, nranks, (lo, hi, factor), iters, self.cfg.warmup, check, js)
            rc, secs = run_bounded(cmd, self.env(nranks), log, self.cfg.timeout)
            total += secs
            try:
                got = read_rows(js) if rc is not None else []
            except (OSError, ValueError):
                got = []
            finally:
                os.unlink(js)
            if rc != 0 or not got:
                why = "timed out" if rc is None else f"exit status {rc}"
                return Outcome(error=f"{why}: {tail(log)}", seconds=total)
            rows += got
        return Outcome(rows=rows, seconds=total)

    def trace(self, coll, nranks, sizes):
        """One untimed launch with LOOM_COLL_TRACE=1: per size, the algorithm and
        the model's prediction for the out-of-place and in-place calls, and the
        library's probe lines. Returns {"rows", "probe", "error", "seconds"}."""
        log = os.path.join(self.cfg.logs, f"loom_{coll}_n{nranks}_trace.log")
        if os.path.exists(log):
            os.unlink(log)
        env = dict(self.env(nranks), LOOM_COLL_TRACE="1", LOOM_DEBUG="INFO",
                   LOOM_DEBUG_SUBSYS="ALL")
        total, error = 0.0, None
        for sweep in trace_sweeps(sizes):
            # -a 0: rank 0's time, so that no rank waits on a reduction of the times
            cmd = self.command(coll, nranks, sweep, 1, 0, 0, None) + ["-a", "0"]
            rc, secs = run_bounded(cmd, env, log, self.cfg.timeout)
            total += secs
            if rc != 0:
                error = ("timed out" if rc is None else f"exit status {rc}") + f": {tail(log)}"
                break
        with open(log, errors="replace") as f:
            lines = f.readlines()
        rows = {}
        traced = coll_trace.calls_by_row(lines)
        for size in sizes:
            row = row_of(size, traced)
            if row is not None:
                calls = traced[row]
                rows[row] = {"out_of_place": coll_trace.row_choice(calls),
                             "in_place": coll_trace.row_choice(calls, in_place=True),
                             "calls": len(calls)}
        return {"rows": rows, "probe": coll_trace.probe_lines(lines), "error": error,
                "seconds": total}


class LoomBase(Loom):
    """An earlier loom (compare.py --base): the same programs and launch from another
    build, run right after loom so that the two are interleaved. Its rows are set against
    loom's (loom/base), never counted as a peer. It runs without -M, which a revision
    older than the prediction column lacks; its choices are not traced."""

    key = "base"
    predict = False

    def __init__(self, cfg):
        super().__init__(cfg, cfg.base_build)
        self.label = f"loom {cfg.base_name}"


def row_of(size, rows):
    """The row that a requested size printed: its own, or the one its rounding made (the
    largest below it, above half of it: the uneven collectives round to n(n+1)/2 units of 16
    bytes), None if the sweep printed none."""
    below = [r for r in rows if r <= size and 2 * r > size]
    return max(below) if below else (size if size in rows else None)


def trace_sweeps(sizes):
    """The traced launches' sweeps: one doubling sweep when every size is the
    smallest times a power of 2 (the defaults are), else one per size."""
    lo = min(sizes)
    if all(s % lo == 0 and (s // lo) & (s // lo - 1) == 0 for s in sizes):
        return [(lo, max(sizes), 2)]
    return [(s, s, 2) for s in sizes]


class Mpi(Impl):
    """An MPI with the bench/peers program built by its own mpicc and started by
    its own launcher with bench/peers/bind_rank. Subclasses name the tools and
    the environment; build() and run() are the same for every MPI."""

    mpicc = launcher = None  # paths, set by the subclass
    paths = {}  # --net value: the path its ranks take to each other
    launch = ""  # how its ranks are started and pinned

    def __init__(self, cfg):
        super().__init__(cfg)
        self.binary = os.path.join(cfg.peers_bin, f"mpi_coll_bench.{self.key}")
        self.bind = os.path.join(cfg.build, "bench", "peers", "bind_rank")

    def info(self):
        d = super().info()
        d["path"], d["launch"] = self.paths[self.cfg.net], self.launch
        return d

    def env(self):
        """The environment of mpicc and of the launch."""
        return dict(os.environ)

    def command(self, nranks):
        """The launcher's command line up to the program."""
        raise NotImplementedError

    def find_debian_tools(self, flavor):
        """mpirun.FLAVOR and mpicc.FLAVOR, Debian's names, from PATH."""
        self.launcher = shutil.which(f"mpirun.{flavor}")
        self.mpicc = shutil.which(f"mpicc.{flavor}")
        if not self.launcher or not self.mpicc:
            self.reason = f"mpirun.{flavor} or mpicc.{flavor} not found"

    def build(self, src):
        """mpi_coll_bench from src with this MPI's mpicc; sets reason on failure."""
        if self.reason:
            return
        os.makedirs(self.cfg.peers_bin, exist_ok=True)
        try:
            r = subprocess.run([self.mpicc, "-O2", "-std=c11", "-Wall", "-Wextra", "-o",
                                self.binary, src], capture_output=True, text=True, timeout=300,
                               env=self.env())
            err = (r.stderr or r.stdout).strip()[-800:] if r.returncode != 0 else None
        except (OSError, subprocess.TimeoutExpired) as e:
            err = str(e)
        if err or not os.access(self.binary, os.X_OK):
            self.reason = f"{os.path.basename(self.mpicc)} failed: {err}"

    def run(self, coll, nranks, bands, rep, check):
        log = self.log_path(coll, nranks, rep)
        fd, js = tempfile.mkstemp(suffix=".json", dir=self.cfg.tmp)
        os.close(fd)
        cmd = self.command(nranks) + [self.bind, self.binary, "-C", coll, "-w",
                                      str(self.cfg.warmup), "-c", str(check), "-J", js]
        cmd += [f"{lo}:{hi}:{f}:{it}" for lo, hi, f, it in bands]
        rc, secs = run_bounded(cmd, self.env(), log, self.cfg.timeout)
        try:
            rows = read_rows(js) if rc is not None else []
        except (OSError, ValueError):
            rows = []
        finally:
            os.unlink(js)
        if rc != 0 or not rows:
            why = "timed out" if rc is None else f"exit status {rc}"
            return Outcome(error=f"{why}: {tail(log)}", seconds=secs)
        return Outcome(rows=rows, seconds=secs)


class OpenMpi(Mpi):
    key, label = "ompi", "Open MPI"
    paths = {"tcp": "pml ob1, btl tcp,self: TCP between every pair of ranks",
             "shm": "defaults: pml ob1, btl vader (shared memory)"}
    launch = ("mpirun.openmpi --bind-to none --oversubscribe --allow-run-as-root, bind_rank "
              "pins rank r to the (r mod C)-th usable CPU")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.find_debian_tools("openmpi")


    def env(self):
        return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def command(self, nranks):
        cmd = [self.launcher, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-n", str(nranks)]
        if self.cfg.net == "tcp":
            cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        return cmd


class Mpich(Mpi):
    key, label = "mpich", "MPICH"
    paths = {"tcp": "MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self: ch4:ucx over TCP between every pair "
                    "of ranks",
             "shm": "defaults: ch4:ucx (UCX shared-memory transports)"}
    launch = "mpirun.mpich -bind-to none, bind_rank pins rank r to the (r mod C)-th usable CPU"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.find_debian_tools("mpich")


    def env(self):
        if self.cfg.net == "tcp":
            return dict(os.environ, MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp,self")
        return dict(os.environ)

    def command(self, nranks):
        return [self.launcher, "-bind-to", "none", "-n", str(nranks)]


class IntelMpi(Mpi):
    """Intel MPI as install_peers.sh pip-installs it into cfg.impi_prefix."""

    key, label = "impi", "Intel MPI"
    paths = {"tcp": "I_MPI_FABRICS=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo "
                    "I_MPI_COLL_INTRANODE=pt2pt: libfabric's tcp provider between every pair "
                    "of ranks, collectives included",
             "shm": "I_MPI_FABRICS=shm: its shared-memory fabric"}
    launch = ("mpiexec (Hydra) with I_MPI_PIN=0, bind_rank pins rank r to the (r mod C)-th "
              "usable CPU")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.prefix = cfg.impi_prefix
        self.launcher = os.path.join(self.prefix, "bin", "mpiexec")
        self.mpicc = os.path.join(self.prefix, "bin", "mpicc")
        if not (os.access(self.launcher, os.X_OK) and os.access(self.mpicc, os.X_OK)):
            self.reason = (f"Intel MPI is not installed in {self.prefix} (install_peers.sh "
                           "pip-installs impi-rt and impi-devel there)")

    def info(self):
        return dict(super().info(), prefix=self.prefix)

    def env(self):
        lib = os.path.join(self.prefix, "lib")
        old_ld = os.environ.get("LD_LIBRARY_PATH")
        env = dict(os.environ, I_MPI_ROOT=self.prefix, FI_PROVIDER_PATH=lib,
                   PATH=os.path.join(self.prefix, "bin") + os.pathsep + os.environ.get("PATH", ""),
                   LD_LIBRARY_PATH=lib + (os.pathsep + old_ld if old_ld else ""),
                   I_MPI_PIN="0")  # its own pinning would undo bind_rank's
        if self.cfg.net == "tcp":
            # Its collectives within a node use shared memory whatever the fabric (an 8-byte
            # all-reduce took 0.4 us): pt2pt keeps them on the tcp provider.
            env.update(I_MPI_FABRICS="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="lo",
                       I_MPI_COLL_INTRANODE="pt2pt")
        else:
            env["I_MPI_FABRICS"] = "shm"
        return env

    def command(self, nranks):
        return [self.launcher, "-n", str(nranks)]


class Gloo(Impl):
    """torch.distributed's gloo backend through bench/peers/gloo_bench.py --serve."""

    key, label = "gloo", "Gloo"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.script = os.path.join(cfg.root, "bench", "peers", "gloo_bench.py")
        self.proc = None
        self.pending = b""
        self.nranks = 0
        self.log = None
        probe = subprocess.run([cfg.python, "-c", "import torch.distributed as d; "
                                "print(d.is_gloo_available())"],
                               capture_output=True, text=True, timeout=300)
        if probe.stdout.strip() != "True":
            self.reason = f"torch with gloo not importable by {cfg.python}"

    def info(self):
        d = super().info()
        d["path"] = "TCP on 127.0.0.1 always (GLOO_SOCKET_IFNAME=lo); gloo has no shared memory"
        d["launch"] = ("gloo_bench.py forks N ranks after importing torch once, binds rank r to "
                       "the (r mod C)-th usable CPU; calls go through Python")
        return d

    def start(self, nranks):
        self.stop()
        self.nranks = nranks
        self.log = open(os.path.join(self.cfg.logs, f"gloo_server_n{nranks}.log"), "a")
        self.proc = subprocess.Popen(
            [self.cfg.python, self.script, "-n", str(nranks), "-T", str(self.cfg.timeout),
             "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            start_new_session=True, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
        self.pending = b""
        hello = self.read_answer(self.cfg.timeout)
        if not hello or not hello.get("ok"):
            err = (hello or {}).get("error", "no answer")
            self.stop()
            return f"gloo server for {nranks} ranks did not start: {err}"
        return None

    def read_answer(self, timeout_s):
        """The server's next JSON line, or None after timeout_s or its exit. Reads
        the pipe itself, so that no line waits in a buffer that select cannot see."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                try:
                    return json.loads(line)
                except ValueError:
                    continue  # not ours: a library may print to stdout
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.pending += chunk

    def stop(self):
        if self.proc:
            try:
                self.proc.stdin.write(b"\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                kill_group(self.proc)
            self.proc = None
        if self.log:
            self.log.close()
            self.log = None

    def run(self, coll, nranks, bands, rep, check):
        t0 = time.monotonic()
        if not self.proc or self.proc.poll() is not None:
            err = self.start(nranks)  # died on an earlier command: one fresh start
            if err:
                return Outcome(error=err, seconds=time.monotonic() - t0)
        cmd = {"coll": coll, "bands": bands, "warmup": self.cfg.warmup, "check": check}
        self.log.write(f"# n={nranks} rep={rep} {json.dumps(cmd)}\n")
        self.log.flush()
        try:
            self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as e:
            return Outcome(error=f"gloo server: {e}", seconds=time.monotonic() - t0)
        answer = self.read_answer(self.cfg.timeout)
        secs = time.monotonic() - t0
        if answer is None:
            self.stop()
            return Outcome(error=f"gloo server gave no answer within {self.cfg.timeout} s",
                           seconds=secs)
        if not answer.get("ok"):
            self.stop()
            return Outcome(error=answer.get("error", "unknown error"), seconds=secs)
        if "unsupported" in answer:
            return Outcome(unsupported=answer["unsupported"], seconds=secs)
        return Outcome(rows=answer["results"], seconds=secs)


# Every implementation, in interleaving order (loom first).
KEYS = ["loom", "ompi", "mpich", "impi", "gloo"]


def make_all(cfg, wanted):
    """The implementations to run, in interleaving order; an earlier loom (cfg.base_build)
    right after loom."""
    makers = {"loom": Loom, "ompi": OpenMpi, "mpich": Mpich, "impi": IntelMpi, "gloo": Gloo}
    out = [makers[k](cfg) for k in KEYS if k in wanted]
    if getattr(cfg, "base_build", None):
        out.insert(1 if out and out[0].key == "loom" else 0, LoomBase(cfg))
    return out


def rep_order(impl_list, rep):
    """The launch order of repetition rep (from 1): make_all's, with loom and the earlier loom
    trading places in every even repetition, so that neither always runs in the other's wake
    (the launch right after another implementation's ran measurably slower: with loom always
    first, the same 4-rank AlltoAll code took 268 us as loom and 161 as base)."""
    out = list(impl_list)
    keys = [i.key for i in out]
    if rep % 2 == 0 and "loom" in keys and "base" in keys:
        a, b = keys.index("loom"), keys.index("base")
        out[a], out[b] = out[b], out[a]
    return out

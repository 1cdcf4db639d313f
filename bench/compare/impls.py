# SPDX-License-Identifier: Apache-2.0
#
# impls.py - how bench/compare runs each implementation: loom's *_perf through
# loomrun, bench/peers/mpi_coll_bench under Open MPI's and MPICH's mpirun with
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

# The *_perf program names are the collectives' flags everywhere.
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce"]


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

    def __init__(self, cfg):
        super().__init__(cfg)
        self.loomrun = os.path.join(cfg.build, "tools", "loomrun")
        if not os.access(self.loomrun, os.X_OK):
            self.reason = f"{self.loomrun} is missing"

    def info(self):
        d = super().info()
        d["path"] = ("LOOM_NET=tcp: TCP between every pair of ranks" if self.cfg.net == "tcp"
                     else "default transports: shared memory between local ranks")
        d["launch"] = ("loomrun -n N (binds rank r to the (r mod C)-th usable CPU); blocking "
                       "calls back to back (-z 2)")
        return d

    def run(self, coll, nranks, bands, rep, check):
        env = dict(os.environ)
        if self.cfg.net == "tcp":
            env["LOOM_NET"] = "tcp"
        log = self.log_path(coll, nranks, rep)
        prog = os.path.join(self.cfg.build, "bench", f"{coll}_perf")
        rows, total = [], 0.0
        for lo, hi, factor, iters in bands:
            fd, js = tempfile.mkstemp(suffix=".json", dir=self.cfg.tmp)
            os.close(fd)
            # -z 2: blocking calls back to back, the shape of the MPI benchmark's loop (a
            # stream would add its worker thread's hand-off, which MPI does not have).
            cmd = [self.loomrun, "-v", "-n", str(nranks), prog, "-b", str(lo), "-e", str(hi), "-f",
                   str(factor), "-n", str(iters), "-w", str(self.cfg.warmup), "-c",
                   str(check), "-z", "2", "-T", str(self.cfg.timeout), "-J", js]
            rc, secs = run_bounded(cmd, env, log, self.cfg.timeout)
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


class Mpi(Impl):
    """Open MPI or MPICH, with the bench/peers program built by that MPI's mpicc."""

    def __init__(self, cfg, flavor):
        super().__init__(cfg)
        self.flavor = flavor
        self.key = "ompi" if flavor == "openmpi" else "mpich"
        self.label = "Open MPI" if flavor == "openmpi" else "MPICH"
        self.mpirun = shutil.which(f"mpirun.{flavor}")
        self.binary = os.path.join(cfg.peers_bin, f"mpi_coll_bench.{flavor}")
        self.bind = os.path.join(cfg.build, "bench", "peers", "bind_rank")
        if not self.mpirun:
            self.reason = f"mpirun.{flavor} not found"
        elif not os.access(self.binary, os.X_OK):
            self.reason = f"{self.binary} was not built (mpicc.{flavor} failed or is missing)"

    def info(self):
        d = super().info()
        if self.flavor == "openmpi":
            d["path"] = ("pml ob1, btl tcp,self: TCP between every pair of ranks"
                         if self.cfg.net == "tcp" else "defaults: pml ob1, btl vader (shared memory)")
            d["launch"] = ("mpirun.openmpi --bind-to none --oversubscribe --allow-run-as-root, "
                           "bind_rank pins rank r to the (r mod C)-th usable CPU")
        else:
            d["path"] = ("MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self: ch4:ucx over TCP between every "
                         "pair of ranks" if self.cfg.net == "tcp"
                         else "defaults: ch4:ucx (UCX shared-memory transports)")
            d["launch"] = ("mpirun.mpich -bind-to none, bind_rank pins rank r to the (r mod C)-th "
                           "usable CPU")
        return d

    def command(self, nranks):
        if self.flavor == "openmpi":
            cmd = [self.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                   "-n", str(nranks)]
            if self.cfg.net == "tcp":
                cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
            return cmd
        return [self.mpirun, "-bind-to", "none", "-n", str(nranks)]

    def run(self, coll, nranks, bands, rep, check):
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if self.flavor == "mpich" and self.cfg.net == "tcp":
            env.update(MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp,self")
        log = self.log_path(coll, nranks, rep)
        fd, js = tempfile.mkstemp(suffix=".json", dir=self.cfg.tmp)
        os.close(fd)
        cmd = self.command(nranks) + [self.bind, self.binary, "-C", coll, "-w",
                                      str(self.cfg.warmup), "-c", str(check), "-J", js]
        cmd += [f"{lo}:{hi}:{f}:{it}" for lo, hi, f, it in bands]
        rc, secs = run_bounded(cmd, env, log, self.cfg.timeout)
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


def make_all(cfg, wanted):
    """The implementations to run, in interleaving order (loom first)."""
    makers = {"loom": lambda: Loom(cfg), "ompi": lambda: Mpi(cfg, "openmpi"),
              "mpich": lambda: Mpi(cfg, "mpich"), "gloo": lambda: Gloo(cfg)}
    return [makers[k]() for k in ["loom", "ompi", "mpich", "gloo"] if k in wanted]

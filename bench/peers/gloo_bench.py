#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# gloo_bench.py - the Gloo side of bench/compare: torch.distributed with the
# gloo backend, timed the way loom's *_perf driver (bench/common.c) and
# bench/peers/mpi_coll_bench.c time their out-of-place column (warm-up walking
# the sizes by doubling, one untimed call and a barrier before each timed loop,
# calls walking through the buffers, times averaged over ranks, nccl-tests'
# algbw bytes and busbw factors, one exact check per size). It starts its own
# ranks (fork after importing torch once), binds rank r to the (r mod C)-th
# usable CPU as loomrun does, and meets on 127.0.0.1.
# One-shot:  gloo_bench.py -n N -C COLL [-w W] [-c 0|1] [-J FILE] BAND...
# Serving:   gloo_bench.py -n N --serve   reads one JSON command per line on
#            stdin ({"coll", "bands", "warmup", "check"}) and answers each
#            with one JSON line on stdout, so that bench/compare pays torch's
#            start-up once per rank count. EOF or an empty line ends it.
# Gloo's own collectives are in place (all_reduce, broadcast, reduce); torch
# 1.13's gloo backend has no reduce_scatter and no all_gather into one tensor,
# so reduce_scatter answers "unsupported" and all_gather fills a list of views. The uneven
# all_gatherv and reduce_scatterv have no gloo form of one call: they answer "unsupported".
import argparse
import importlib
import json
import multiprocessing
import os
import socket
import sys
import time
from datetime import timedelta

COLLS = {
    # flag: (experiment name, reduces, rooted, counts kind, algbw x nranks, busbw factor kind)
    "all_reduce": ("AllReduce", True, False, "same", False, 2),
    "all_gather": ("AllGather", False, False, "gather", True, 1),
    "reduce_scatter": ("ReduceScatter", True, False, "scatter", True, 1),
    "alltoall": ("AlltoAll", False, False, "alltoall", True, 1),
    "broadcast": ("Broadcast", False, True, "same", False, 0),
    "reduce": ("Reduce", True, True, "same", False, 0),
    "all_gatherv": ("AllGatherV", False, False, "uneven", True, 1),
    "reduce_scatterv": ("ReduceScatterV", True, False, "uneven", True, 1),
}
ELT = 4  # float32
CHUNK = 1 << 20  # elements per step when writing inputs or checking results


class Unsupported(Exception):
    """The backend has no such collective."""


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    value = float(text[:-1] if mult > 1 else text)
    if value < 0:
        raise ValueError(text)
    return int(value * mult)


def parse_band(text):
    parts = text.split(":")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"a band is MIN:MAX:FACTOR:ITERS, not '{text}'")
    lo, hi, factor, iters = parse_size(parts[0]), parse_size(parts[1]), int(parts[2]), int(parts[3])
    if lo > hi or factor < 2 or iters < 1:
        raise argparse.ArgumentTypeError(f"band '{text}': want MIN <= MAX, FACTOR >= 2, ITERS >= 1")
    return [lo, hi, factor, iters]


def counts(kind, count, nranks):
    """(send, recv, param) elements, with nccl-tests' rounding to 16 bytes."""
    if kind == "same":
        return count, count, count
    base = (count // nranks) & ~3
    if kind == "gather":
        return base, base * nranks, base
    if kind == "scatter":
        return base * nranks, base, base
    return base * nranks, base * nranks, base


# ---- Rank side ---------------------------------------------------------------


class Rank:
    """One rank's process group, buffers and measurements."""

    def __init__(self, torch, dist, rank, nranks):
        self.torch, self.dist, self.rank, self.nranks = torch, dist, rank, nranks
        self.send = self.recv = None

    def inputs(self, seed, rank, start, n):
        """bench/peers/mpi_coll_bench.c's input(): small integers, exact sums."""
        idx = self.torch.arange(start, start + n, dtype=self.torch.int64)
        return ((idx * 2654435761 + rank * 40503 + seed * 97) % 17 - 8).float()

    def fill(self, dst, seed, rank, start):
        """dst[i] = inputs(seed, rank, start + i), a chunk at a time (bounded memory)."""
        for off in range(0, dst.numel(), CHUNK):
            n = min(CHUNK, dst.numel() - off)
            dst[off:off + n] = self.inputs(seed, rank, start + off, n)

    def call(self, flag, c, it, band_max):
        send_n, recv_n, param = c
        total = max(send_n, recv_n) * ELT
        steps = band_max // total if total else 1
        shift = (total * (it % (steps or 1))) // ELT
        send = self.send[shift:shift + send_n]
        recv = self.recv[shift:shift + recv_n]
        self.run(flag, send, recv, param)

    def run(self, flag, send, recv, param):
        dist = self.dist
        if param == 0:
            return  # torch 1.13's gloo all_gather dies of SIGFPE on empty tensors
        if flag == "all_reduce":
            dist.all_reduce(send)
        elif flag == "all_gather":
            dist.all_gather(list(recv.view(self.nranks, param).unbind(0)), send)
        elif flag == "reduce_scatter":
            try:
                dist.reduce_scatter_tensor(recv, send)
            except (RuntimeError, AttributeError) as e:
                raise Unsupported(f"torch {self.torch.__version__}: {e}") from e
        elif flag == "alltoall":
            dist.all_to_all_single(recv, send)
        elif flag == "broadcast":
            dist.broadcast(send if self.rank == 0 else recv, 0)
        elif flag == "reduce":
            dist.reduce(send, 0)

    def segments(self, flag, c):
        """Where this rank's result lies and what it must hold: a list of
        (buffer, offset, length, [(rank, input start), ...]) whose inputs sum up."""
        n, rank = self.nranks, self.rank
        send_n, recv_n, param = c
        if flag == "all_reduce" or (flag == "reduce" and rank == 0):
            return [("send", 0, send_n, [(r, 0) for r in range(n)])]  # gloo reduces in place
        if flag == "all_gather":
            return [("recv", r * param, param, [(r, 0)]) for r in range(n)]
        if flag == "reduce_scatter":
            return [("recv", 0, param, [(r, rank * param) for r in range(n)])]
        if flag == "alltoall":
            return [("recv", p * param, param, [(p, rank * param)]) for p in range(n)]
        if flag == "broadcast" and rank != 0:
            return [("recv", 0, recv_n, [(0, 0)])]
        return []  # the root's broadcast data and a non-root's reduce input: nothing to check

    def check(self, flag, c, seed):
        """One checked call; returns wrong elements summed over ranks."""
        torch = self.torch
        send_n, recv_n, param = c
        self.fill(self.send[:send_n], seed, self.rank, 0)
        self.recv.view(torch.int32)[:recv_n] = -0x5A5A5A5B  # bytes 0xA5: no sum of inputs
        self.run(flag, self.send[:send_n], self.recv[:recv_n], param)
        wrong = 0
        for buf, off, length, srcs in self.segments(flag, c):
            got = (self.send if buf == "send" else self.recv)[off:off + length]
            for o in range(0, length, CHUNK):
                k = min(CHUNK, length - o)
                want = sum(self.inputs(seed, r, start + o, k) for r, start in srcs)
                wrong += int((got[o:o + k] != want).sum())
        t = torch.tensor([wrong], dtype=torch.int64)
        self.dist.all_reduce(t)
        return int(t.item())

    def row(self, flag, size, iters, rep, check, band_max):
        torch, dist, n = self.torch, self.dist, self.nranks
        name, _, rooted, kind, mult, fkind = COLLS[flag]
        c = counts(kind, size // ELT, n)
        if check:
            self.fill(self.send[:c[0]], 99, self.rank, 0)
        self.call(flag, c, 0, band_max)
        dist.barrier()
        t0 = time.perf_counter()
        for it in range(iters):
            self.call(flag, c, it, band_max)
        sec = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(sec)
        sec = float(sec.item()) / n
        wrong = self.check(flag, c, rep << 16) if check else None
        factor = (1.0, (n - 1) / n, 2.0 * (n - 1) / n)[fkind]
        algbw = c[2] * ELT * (n if mult else 1) / 1e9 / sec
        return {"size": max(c[0], c[1]) * ELT, "count": c[2], "type": "float",
                "redop": "sum" if COLLS[flag][1] else "none", "root": 0 if rooted else -1,
                "nranks": n, "out_of_place": {"time": sec * 1e6, "alg_bw": algbw,
                                              "bus_bw": algbw * factor, "nwrong": wrong},
                "actual_iterations": iters, "experiment_name": name}

    def command(self, cmd):
        """Runs one command (all its bands); returns the rows."""
        flag, warmup, check = cmd["coll"], cmd.get("warmup", 1), cmd.get("check", 1)
        kind = COLLS[flag][3]
        if kind == "uneven":
            raise Unsupported("torch.distributed's gloo backend has no uneven all-gather or "
                              "reduce-scatter in one call")
        biggest = max(b[1] for b in cmd["bands"])
        self.send = self.torch.zeros(biggest // ELT + 1024)
        self.recv = self.torch.zeros(biggest // ELT + 1024)
        rows, rep = [], 0
        try:
            for lo, hi, factor, iters in cmd["bands"]:
                size = lo
                while size <= hi:  # warm-up: every doubling size of the band
                    c = counts(kind, size // ELT, self.nranks)
                    for it in range(warmup):
                        self.call(flag, c, it, hi)
                    size = size * 2 if size else 1
                size = lo
                while size <= hi:
                    rep += 1
                    rows.append(self.row(flag, size, iters, rep, check, hi))
                    if size * factor <= size:
                        break
                    size *= factor
        finally:
            self.send = self.recv = None
        return rows


def rank_main(rank, nranks, cpus, port, timeout_s, conn, backend, rank_cls):
    """A rank: bind, join the group, then run the commands that arrive on conn."""
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        if backend != "gloo":
            importlib.import_module(f"{backend}_torch")  # registers the backend
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=nranks, timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which decides
        conn.send({"ok": False, "error": f"rank {rank}: init: {e}"})
        return
    conn.send({"ok": True, "cpu": os.sched_getaffinity(0).pop()})
    me = rank_cls(torch, dist, rank, nranks)
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        try:
            conn.send({"ok": True, "results": me.command(cmd)})
        except Unsupported as e:
            conn.send({"ok": True, "unsupported": str(e)})
        except Exception as e:  # noqa: BLE001 - reported; the group may be broken now
            conn.send({"ok": False, "error": f"rank {rank}: {type(e).__name__}: {e}"})
            break
    dist.destroy_process_group()


# ---- Launcher side ---------------------------------------------------------------


class Group:
    """The ranks of one process group, started by fork and driven by pipes.
    bench/compare/torch_bench.py also starts one of backend loom (whose module,
    loom_torch, registers it) with its own Rank class."""

    def __init__(self, nranks, timeout_s, backend="gloo", rank_cls=Rank):
        importlib.import_module("torch")  # once here, so that the forked ranks share it

        self.timeout_s = timeout_s
        cpus = sorted(os.sched_getaffinity(0))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for r in range(nranks):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=rank_main, daemon=True,
                            args=(r, nranks, cpus, port, timeout_s, theirs, backend, rank_cls))
            p.start()
            self.conns.append(mine)
            self.procs.append(p)
        hello = self.gather()
        self.cpus = [h.get("cpu") for h in hello]

    def gather(self):
        """Every rank's answer, or RuntimeError naming the first failure."""
        answers = []
        for r, conn in enumerate(self.conns):
            if not conn.poll(self.timeout_s + 30):
                raise RuntimeError(f"rank {r} did not answer within {self.timeout_s + 30} s")
            try:
                a = conn.recv()
            except EOFError:
                raise RuntimeError(f"rank {r} exited (code {self.procs[r].exitcode})") from None
            answers.append(a)
        bad = [a for a in answers if not a.get("ok")]
        if bad:
            raise RuntimeError(bad[0]["error"])
        return answers

    def run(self, cmd):
        for conn in self.conns:
            conn.send(cmd)
        return self.gather()[0]

    def close(self):
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def print_table(rows):
    print(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
          f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}")
    for r in rows:
        o = r["out_of_place"]
        wrong = "N/A" if o["nwrong"] is None else o["nwrong"]
        print(f"{r['size']:12d}  {r['count']:12d}  {r['type']:>8}  {r['redop']:>6}  "
              f"{r['root']:6d}  {o['time']:7.2f}  {o['alg_bw']:6.2f}  {o['bus_bw']:6.2f}  "
              f"{wrong:>6}")


def serve(group):
    for line in sys.stdin:
        line = line.strip()
        if not line:
            break
        try:
            answer = group.run(json.loads(line))
        except (RuntimeError, ValueError, KeyError) as e:
            print(json.dumps({"ok": False, "error": str(e)}), flush=True)
            return 1
        print(json.dumps(answer), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description="torch.distributed gloo collectives, nccl-tests style")
    ap.add_argument("-n", type=int, required=True, help="ranks")
    ap.add_argument("-C", choices=sorted(COLLS), help="collective (one-shot mode)")
    ap.add_argument("-w", type=int, default=1, help="warm-up calls per size")
    ap.add_argument("-c", type=int, default=1, help="check each size once (1) or not (0)")
    ap.add_argument("-J", help="write the results as JSON here")
    ap.add_argument("-T", type=int, default=300, help="seconds any one collective may take")
    ap.add_argument("--serve", action="store_true", help="read JSON commands on stdin")
    ap.add_argument("bands", nargs="*", type=parse_band, help="MIN:MAX:FACTOR:ITERS")
    args = ap.parse_args()
    if args.n < 1 or (not args.serve and (not args.C or not args.bands)):
        ap.error("give -n N and either --serve or -C COLL with at least one band")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        group = Group(args.n, args.T)
    except RuntimeError as e:
        print(json.dumps({"ok": False, "error": str(e)}) if args.serve else f"gloo_bench: {e}",
              flush=True)
        return 1
    try:
        if args.serve:
            print(json.dumps({"ok": True, "ready": True, "cpus": group.cpus}), flush=True)
            return serve(group)
        answer = group.run({"coll": args.C, "bands": args.bands, "warmup": args.w,
                            "check": args.c})
        import torch
        print(f"# gloo_bench {COLLS[args.C][0]} on {args.n} ranks; torch {torch.__version__}, "
              f"cpus {group.cpus}")
        if "unsupported" in answer:
            print(f"# unsupported: {answer['unsupported']}")
            return 0
        rows = answer["results"]
        print_table(rows)
        if args.J:
            with open(args.J, "w") as f:
                json.dump({"implementation": f"torch {torch.__version__} gloo", "nranks": args.n,
                           "cpus": group.cpus, "results": rows}, f)
        wrong = sum(1 for r in rows if r["out_of_place"]["nwrong"])
        print(f"# Out of bounds values : {wrong} {'FAILED' if wrong else 'OK'}")
        return 1 if wrong else 0
    except RuntimeError as e:
        print(f"gloo_bench: {e}", file=sys.stderr)
        return 1
    finally:
        group.close()


if __name__ == "__main__":
    sys.exit(main())

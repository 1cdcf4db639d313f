# SPDX-License-Identifier: Apache-2.0
# Every collective of the backend against Gloo on the same inputs, bit for bit,
# in one process group per case: dtypes x reduce ops x the four ways of waiting
# x contiguous, transposed and strided tensors x in and out of place, on the
# whole world and on a sub-group that leaves rank 0 out. Where Gloo lacks the op
# or dtype (AVG, reduce_scatter, all_gather_into_tensor, the list all_to_all,
# bfloat16, bool) the local reference in oracle.py is the oracle; where Gloo
# has it, the reference is checked too.
import pytest
import torch
import torch.distributed as dist

import oracle
import ranks
from oracle import ALL_DTYPES, HALVES, MODES, OPS

GLOO_DTYPES = oracle.FLOATS + [torch.float16] + oracle.INTS
GLOO_LACKS = {"avg", "reduce_scatter", "all_gather_into_tensor", "all_to_all"}
# Gloo 1.13 reduces a strided (not dense) view as if it were contiguous, so the
# harness checked on Gloo leaves those out; loom gets them, and Gloo sees
# contiguous copies of the same values. Its gather and scatter copy transposed
# views in storage order, so those stay contiguous there too.
LAYOUTS = ["contig", "t", "strided"] if ranks.IS_LOOM else ["contig", "t"]


def covered(opname, dtype, reduces=False):
    """Everything on loom; what Gloo has when Gloo stands in for it, less its
    half-type reductions (Gloo rounds at every step, loom once)."""
    if ranks.IS_LOOM:
        return True
    return gloo_has(opname, dtype) and not (reduces and dtype in HALVES)


def gloo_has(opname, dtype):
    return dtype in GLOO_DTYPES and opname not in GLOO_LACKS


def reduce_ops(dtype):
    if dtype == torch.bool:
        return ["sum", "product", "min", "max"]
    if dtype.is_floating_point:
        return list(OPS)
    return ["sum", "product", "min", "max"]


class Grid:
    def __init__(self, rank, pg, og, members, chk):
        self.me, self.pg, self.og, self.members, self.chk = rank, pg, og, members, chk
        self.idx = members.index(rank)
        self.gs = len(members)
        self.i = 0

    def next_style(self, contig_on_gloo=False):
        """Cycles the waiting mode and layout so every op meets each of them."""
        self.i += 1
        layout = LAYOUTS[(self.i // len(MODES)) % len(LAYOUTS)]
        if contig_on_gloo and not ranks.IS_LOOM:
            layout = "contig"
        return MODES[self.i % len(MODES)], layout

    def name(self, *parts):
        return f"{self.scope}/{'/'.join(str(p) for p in parts)}"

    def all_reduce(self):
        for dtype in ALL_DTYPES:
            for opname in reduce_ops(dtype):
                if not covered(opname, dtype, reduces=True):
                    continue
                mode, layout = self.next_style()
                numel = [38, 39, 4098][self.i % 3]
                ins = [oracle.values(r, 1, numel, dtype, opname) for r in self.members]
                v, base = oracle.view(ins[self.idx], layout)
                op = OPS[opname]
                oracle.start(lambda a: dist.all_reduce(v, op, group=self.pg, async_op=a), mode)
                what = self.name("all_reduce", dtype, opname, mode, layout, numel)
                want = oracle.reduce_ref(ins, opname, dtype)
                if opname == "avg":
                    self.chk.close(what, v, want)
                else:
                    self.chk.eq(what, v, want)
                self.chk.true(what + ": strided view's neighbours touched", oracle.untouched(base))
                if gloo_has(opname, dtype) and dtype not in HALVES:
                    g = ins[self.idx].clone()
                    dist.all_reduce(g, op, group=self.og)
                    self.chk.eq(what + " vs gloo", v, g)

    def all_reduce_coalesced(self):
        for dtype in [torch.float32, torch.int64]:
            mode, _ = self.next_style()
            sizes = [5, 1, 300]
            ins = [[oracle.values(r, 2 + k, n, dtype) for k, n in enumerate(sizes)] for r in self.members]
            mine = [x.clone() for x in ins[self.idx]]
            oracle.start(lambda a: dist.all_reduce_coalesced(mine, group=self.pg, async_op=a), mode)
            g = [x.clone() for x in ins[self.idx]]
            dist.all_reduce_coalesced(g, group=self.og)
            for k in range(len(sizes)):
                what = self.name("all_reduce_coalesced", dtype, mode, k)
                self.chk.eq(what, mine[k], oracle.reduce_ref([x[k] for x in ins], "sum", dtype))
                self.chk.eq(what + " vs gloo", mine[k], g[k])

    def broadcast(self):
        for dtype in ALL_DTYPES:
            if not covered("broadcast", dtype):
                continue
            mode, layout = self.next_style()
            src = self.members[-1]
            x = oracle.values(self.me, 3, 38, dtype)
            v, base = oracle.view(x, layout)
            oracle.start(lambda a: dist.broadcast(v, src, group=self.pg, async_op=a), mode)
            what = self.name("broadcast", dtype, mode, layout, f"src{src}")
            self.chk.eq(what, v, oracle.values(src, 3, 38, dtype))
            self.chk.true(what + ": strided view's neighbours touched", oracle.untouched(base))
            if gloo_has("broadcast", dtype):
                g = x.clone()
                dist.broadcast(g, src, group=self.og)
                self.chk.eq(what + " vs gloo", v, g)

    def reduce(self):
        for k, dtype in enumerate(ALL_DTYPES):
            for opname in ["sum", "max"]:
                if not covered(opname, dtype, reduces=True):
                    continue
                mode, layout = self.next_style()
                dst = self.members[k % self.gs]
                ins = [oracle.values(r, 4, 21, dtype, opname) for r in self.members]
                v, _ = oracle.view(ins[self.idx], layout)
                op = OPS[opname]
                oracle.start(lambda a: dist.reduce(v, dst, op, group=self.pg, async_op=a), mode)
                what = self.name("reduce", dtype, opname, mode, layout, f"dst{dst}")
                if self.me == dst:
                    self.chk.eq(what, v, oracle.reduce_ref(ins, opname, dtype))
                if gloo_has(opname, dtype) and dtype not in HALVES:
                    g = ins[self.idx].clone()
                    dist.reduce(g, dst, op, group=self.og)
                    if self.me == dst:
                        self.chk.eq(what + " vs gloo", v, g)

    def all_gather(self):
        for dtype in ALL_DTYPES:
            if not covered("all_gather", dtype):
                continue
            mode, layout = self.next_style()
            x = oracle.values(self.me, 5, 26, dtype)
            outs = [oracle.view(torch.zeros(26, dtype=dtype), layout)[0] for _ in self.members]
            v, _ = oracle.view(x, layout)
            oracle.start(lambda a: dist.all_gather(outs, v, group=self.pg, async_op=a), mode)
            what = self.name("all_gather", dtype, mode, layout)
            for j, r in enumerate(self.members):
                self.chk.eq(f"{what} [{j}]", outs[j], oracle.values(r, 5, 26, dtype))
            if gloo_has("all_gather", dtype):
                g = [torch.empty(26, dtype=dtype) for _ in self.members]
                dist.all_gather(g, x, group=self.og)
                for j in range(self.gs):
                    self.chk.eq(f"{what} [{j}] vs gloo", outs[j], g[j])

    def all_gather_into_tensor(self):
        for dtype in ALL_DTYPES:
            if not covered("all_gather_into_tensor", dtype):
                continue
            for inplace in [False, True]:
                mode, layout = self.next_style()
                n = 13
                x = oracle.values(self.me, 6, n, dtype)
                out = torch.zeros(self.gs * n, dtype=dtype)
                if inplace:
                    v = out[self.idx * n:(self.idx + 1) * n]
                    v.copy_(x)
                else:
                    v, _ = oracle.view(x, layout)
                oracle.start(lambda a: dist.all_gather_into_tensor(out, v, group=self.pg, async_op=a), mode)
                want = torch.cat([oracle.values(r, 6, n, dtype) for r in self.members])
                self.chk.eq(self.name("all_gather_into_tensor", dtype, mode,
                                      "inplace" if inplace else layout), out, want)

    def all_gather_coalesced(self):
        for dtype in [torch.float64, torch.int32]:
            mode, _ = self.next_style()
            sizes = [3, 8]
            mine = [oracle.values(self.me, 7 + k, n, dtype) for k, n in enumerate(sizes)]
            outs = [[torch.zeros(n, dtype=dtype) for n in sizes] for _ in self.members]
            oracle.start(lambda a: dist.all_gather_coalesced(outs, mine, group=self.pg, async_op=a), mode)
            g = [[torch.zeros(n, dtype=dtype) for n in sizes] for _ in self.members]
            dist.all_gather_coalesced(g, mine, group=self.og)
            for j, r in enumerate(self.members):
                for k, n in enumerate(sizes):
                    what = self.name("all_gather_coalesced", dtype, mode, j, k)
                    self.chk.eq(what, outs[j][k], oracle.values(r, 7 + k, n, dtype))
                    self.chk.eq(what + " vs gloo", outs[j][k], g[j][k])

    def gather_scatter(self):
        for k, dtype in enumerate(ALL_DTYPES):
            if not covered("gather", dtype):
                continue
            root = self.members[(k + 1) % self.gs]
            mode, layout = self.next_style(contig_on_gloo=True)
            x = oracle.values(self.me, 8, 10, dtype)
            v, _ = oracle.view(x, layout)
            lst = [oracle.view(torch.zeros(10, dtype=dtype), layout)[0] for _ in self.members] \
                if self.me == root else None
            oracle.start(lambda a: dist.gather(v, lst, dst=root, group=self.pg, async_op=a), mode)
            what = self.name("gather", dtype, mode, layout, f"dst{root}")
            if self.me == root:
                for j, r in enumerate(self.members):
                    self.chk.eq(f"{what} [{j}]", lst[j], oracle.values(r, 8, 10, dtype))
            mode, layout = self.next_style(contig_on_gloo=True)
            out, _ = oracle.view(torch.zeros(10, dtype=dtype), layout)
            src_list = [oracle.values(root, 9 + j, 10, dtype).reshape(out.shape) for j in range(self.gs)] \
                if self.me == root else None
            oracle.start(lambda a: dist.scatter(out, src_list, src=root, group=self.pg, async_op=a), mode)
            what = self.name("scatter", dtype, mode, layout, f"src{root}")
            self.chk.eq(what, out, oracle.values(root, 9 + self.idx, 10, dtype))
            if gloo_has("scatter", dtype):
                g = torch.zeros(out.shape, dtype=dtype)
                dist.scatter(g, src_list, src=root, group=self.og)
                self.chk.eq(what + " vs gloo", out, g)
                gl = [torch.zeros(10, dtype=dtype) for _ in self.members] if self.me == root else None
                dist.gather(x, gl, dst=root, group=self.og)
                if self.me == root:
                    for j in range(self.gs):
                        self.chk.eq(f"gather {dtype} [{j}] vs gloo", lst[j], gl[j])

    def reduce_scatter(self):
        for dtype in ALL_DTYPES:
            for opname in reduce_ops(dtype):
                if not covered("reduce_scatter", dtype):
                    continue
                n = 11
                ins = [[oracle.values(r, 20 + j, n, dtype, opname) for j in range(self.gs)]
                       for r in self.members]
                want = oracle.reduce_ref([x[self.idx] for x in ins], opname, dtype)
                op = OPS[opname]
                mode, layout = self.next_style()
                out, _ = oracle.view(torch.zeros(n, dtype=dtype), layout)
                lst = [oracle.view(x, layout)[0] for x in ins[self.idx]]
                oracle.start(lambda a: dist.reduce_scatter(out, lst, op, group=self.pg, async_op=a), mode)
                what = self.name("reduce_scatter", dtype, opname, mode, layout)
                (self.chk.close if opname == "avg" else self.chk.eq)(what, out, want)
                for inplace in [False, True]:
                    mode, layout = self.next_style()
                    full = torch.cat(ins[self.idx])
                    if inplace:
                        out = full[self.idx * n:(self.idx + 1) * n]
                    else:
                        out, _ = oracle.view(torch.zeros(n, dtype=dtype), layout)
                    oracle.start(lambda a: dist.reduce_scatter_tensor(out, full, op, group=self.pg,
                                                                      async_op=a), mode)
                    what = self.name("reduce_scatter_tensor", dtype, opname, mode,
                                     "inplace" if inplace else layout)
                    (self.chk.close if opname == "avg" else self.chk.eq)(what, out, want)

    def split(self, src, dst):
        """Uneven all_to_all sizes, zeros among them."""
        return (3 * src + 2 * dst + 1) % 4

    def all_to_all(self):
        for k, dtype in enumerate(ALL_DTYPES):
            mode, layout = self.next_style()
            ins = [oracle.values(self.me, 30 + j, self.split(self.idx, j), dtype) for j in range(self.gs)]
            if covered("all_to_all", dtype):
                outs = [oracle.view(torch.zeros(self.split(j, self.idx), dtype=dtype), layout)[0]
                        for j in range(self.gs)]
                oracle.start(lambda a: dist.all_to_all(outs, [x.clone() for x in ins], group=self.pg,
                                                       async_op=a), mode)
                for j, r in enumerate(self.members):
                    self.chk.eq(self.name("all_to_all", dtype, mode, layout, j), outs[j],
                                oracle.values(r, 30 + self.idx, self.split(j, self.idx), dtype))
            if not covered("all_to_all_single", dtype):
                continue
            for uneven in [True, False]:
                mode, layout = self.next_style()
                if uneven:
                    in_splits = [self.split(self.idx, j) for j in range(self.gs)]
                    out_splits = [self.split(j, self.idx) for j in range(self.gs)]
                else:
                    in_splits = out_splits = [5] * self.gs
                x = torch.cat([oracle.values(self.me, 30 + j, s, dtype) for j, s in enumerate(in_splits)])
                v, _ = oracle.view(x, "contig" if layout == "t" else layout)
                out, _ = oracle.view(torch.zeros(sum(out_splits), dtype=dtype),
                                     "contig" if layout == "t" else layout)
                oracle.start(lambda a: dist.all_to_all_single(
                    out, v, out_splits if uneven else None, in_splits if uneven else None,
                    group=self.pg, async_op=a), mode)
                what = self.name("all_to_all_single", dtype, mode, layout, "uneven" if uneven else "even")
                want = torch.cat([oracle.values(r, 30 + self.idx, s, dtype)
                                  for r, s in zip(self.members, out_splits)])
                self.chk.eq(what, out, want)
                if gloo_has("all_to_all_single", dtype):
                    g = torch.zeros(sum(out_splits), dtype=dtype)
                    dist.all_to_all_single(g, x, out_splits if uneven else None,
                                           in_splits if uneven else None, group=self.og)
                    self.chk.eq(what + " vs gloo", out, g)

    def large(self):
        """Messages of megabytes, past any eager size and over many chunks."""
        n = (1 << 20) + 3
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            mode, layout = self.next_style()
            if covered("sum", dtype, reduces=True):
                ins = [oracle.values(r, 70, n, dtype) for r in self.members]
                v = ins[self.idx].clone()
                oracle.start(lambda a: dist.all_reduce(v, group=self.pg, async_op=a), mode)
                self.chk.eq(self.name("large all_reduce", dtype, mode), v, oracle.reduce_ref(ins, "sum", dtype))
            if covered("reduce_scatter", dtype):
                full = torch.cat([oracle.values(self.me, 71 + j, n, dtype) for j in range(self.gs)])
                out = torch.zeros(n, dtype=dtype)
                oracle.start(lambda a: dist.reduce_scatter_tensor(out, full, group=self.pg, async_op=a), mode)
                want = oracle.reduce_ref([oracle.values(r, 71 + self.idx, n, dtype) for r in self.members],
                                         "sum", dtype)
                self.chk.eq(self.name("large reduce_scatter_tensor", dtype, mode), out, want)
            if covered("broadcast", dtype):
                src = self.members[0]
                b = oracle.values(self.me, 72, n, dtype)
                oracle.start(lambda a: dist.broadcast(b, src, group=self.pg, async_op=a), mode)
                self.chk.eq(self.name("large broadcast", dtype, mode), b, oracle.values(src, 72, n, dtype))
            if covered("all_to_all_single", dtype):
                ins_ = [self.split(self.idx, j) * 100003 for j in range(self.gs)]
                outs_ = [self.split(j, self.idx) * 100003 for j in range(self.gs)]
                x = torch.cat([oracle.values(self.me, 73 + j, c, dtype) for j, c in enumerate(ins_)])
                out = torch.zeros(sum(outs_), dtype=dtype)
                oracle.start(lambda a: dist.all_to_all_single(out, x, outs_, ins_, group=self.pg,
                                                              async_op=a), mode)
                want = torch.cat([oracle.values(r, 73 + self.idx, c, dtype)
                                  for r, c in zip(self.members, outs_)])
                self.chk.eq(self.name("large all_to_all_single", dtype, mode), out, want)

    def barrier(self):
        for mode in MODES:
            oracle.start(lambda a: dist.barrier(group=self.pg, async_op=a), mode)

    def run(self, scope):
        self.scope = scope
        for step in [self.all_reduce, self.all_reduce_coalesced, self.broadcast, self.reduce,
                     self.all_gather, self.all_gather_into_tensor, self.all_gather_coalesced,
                     self.gather_scatter, self.reduce_scatter, self.all_to_all, self.large,
                     self.barrier]:
            step()


def grid(rank, world, port):
    ranks.init_env(rank, world, port)
    chk = oracle.Checker(rank)
    gloo = dist.new_group(backend="gloo")
    Grid(rank, None, gloo, list(range(world)), chk).run("world")
    # A sub-group without rank 0 (ranks 1.. of 3 or 4); rank 0 only checks
    # that it is not a member.
    members = list(range(1, world))
    sub = dist.new_group(members)
    sub_gloo = dist.new_group(members, backend="gloo")
    if rank in members:
        Grid(rank, sub, sub_gloo, members, chk).run("sub")
    else:
        chk.true("non-member's group rank is -1", dist.get_rank(sub) == -1)
    dist.barrier()
    dist.destroy_process_group()
    return chk.count, chk.failures


@pytest.mark.parametrize("world,net", [(2, "shm"), (3, "shm"), (3, "tcp"), (4, "tcp")])
def test_grid(world, net):
    results = ranks.run(grid, world, timeout=120, env={"LOOM_NET": net})
    failures = [f for _, fs in results for f in fs]
    assert sum(c for c, _ in results) > 100 * world
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:40])


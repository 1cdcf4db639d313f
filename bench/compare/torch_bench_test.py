#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# torch_bench_test.py - unit tests of torch_bench.py's pure parts on crafted
# input: medians and the Gloo/loom and torch/C ratios, which rows each target
# covers and in which direction it holds, and the choice between torch's
# one-tensor and list forms of all_gather and reduce_scatter (with a stand-in
# for torch.distributed). Runs no collective and needs no torch. Run by meson's
# 'tools' suite.
import os
import sys
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_bench  # noqa: E402


def meas(impl, size, time_us, rep=1, coll="all_reduce", nranks=2):
    return {"impl": impl, "coll": coll, "nranks": nranks, "rep": rep, "size": size,
            "count": size // 4, "time_us": time_us, "busbw": size / time_us / 1e3,
            "nwrong": 0, "call": "all_reduce"}


def ddp(impl, ms, rep=1):
    return {"impl": impl, "nranks": 2, "rep": rep, "step_ms": ms, "steps": 10, "batch": 16,
            "params": 100, "last_loss": 0.1}


class SummaryTest(unittest.TestCase):
    def test_medians_and_ratios(self):
        doc = {"measurements": [meas("loom", 1 << 20, t, r) for r, t in ((1, 100), (2, 300),
                                                                         (3, 200))]
               + [meas("gloo", 1 << 20, t, r) for r, t in ((1, 900), (2, 500), (3, 600))]
               + [meas("loom-c", 1 << 20, t, r) for r, t in ((1, 160), (2, 150), (3, 170))],
               "ddp": [ddp("loom", 10, 1), ddp("gloo", 30, 1), ddp("loom", 20, 2),
                       ddp("gloo", 20, 2), ddp("loom", 12, 3), ddp("gloo", 24, 3),
                       ddp("none", 10, 1), ddp("none", 16, 2), ddp("none", 12, 3)]}
        rows, dd = torch_bench.summarize(doc, ["loom", "gloo", "loom-c"])
        self.assertEqual(len(rows), 1)
        self.assertAlmostEqual(rows[0]["gloo_over_loom"], 600 / 200)
        self.assertAlmostEqual(rows[0]["torch_over_c"], 200 / 160)
        self.assertEqual(dd[0]["step_ms"], {"loom": 12, "gloo": 24, "none": 12})
        self.assertAlmostEqual(dd[0]["gloo_over_loom"], 2.0)
        self.assertAlmostEqual(dd[0]["gloo_over_no_comm"], 2.0)

    def test_one_backend_leaves_ratios_empty(self):
        doc = {"measurements": [meas("gloo", 8, 50)], "ddp": [ddp("gloo", 30)]}
        rows, dd = torch_bench.summarize(doc, ["gloo"])
        self.assertIsNone(rows[0]["gloo_over_loom"])
        self.assertIsNone(rows[0]["torch_over_c"])
        self.assertIsNone(dd[0]["gloo_over_loom"])
        self.assertIsNone(dd[0]["gloo_over_no_comm"])
        self.assertTrue(all(t["met"] is None for t in torch_bench.targets(rows, dd)))


class TargetTest(unittest.TestCase):
    def row(self, size, ratio, torch_over_c=None, coll="all_reduce"):
        # report.summarize's "ratio" is against the best of Gloo and all_reduce_perf: not
        # what the targets hold
        return {"coll": coll, "nranks": 2, "size": size, "gloo_over_loom": ratio,
                "ratio": 0.1, "torch_over_c": torch_over_c}

    def test_each_target_covers_its_rows(self):
        rows = [self.row(8, 6.0), self.row(64 << 10, 4.9), self.row(128 << 10, 1.0),
                self.row(1 << 20, 2.5, 1.2), self.row(128 << 20, 3.0, 1.4),
                self.row(8, 0.5, coll="all_gather")]
        got = {t["target"]: t for t in torch_bench.targets(rows, [{"gloo_over_loom": 1.35}])}
        small, big, step, c = (got[t[0]] for t in torch_bench.TARGETS)
        self.assertEqual((small["worst"], small["met"], small["rows"]), (4.9, False, 2))
        self.assertEqual((big["worst"], big["met"], big["rows"]), (2.5, True, 2))
        self.assertEqual((step["worst"], step["met"]), (1.35, True))
        self.assertEqual((c["worst"], c["met"]), (1.4, False))  # an upper bound: the largest


class FakeTensor:
    def __init__(self, n):
        self.n = n

    def view(self, rows, cols):
        assert rows * cols == self.n
        return self

    def unbind(self, dim):
        return ["part"]


class FakeDist:
    """A backend with the list forms only, as gloo in torch 1.13; or with a
    one-tensor form that fails for another reason."""

    def __init__(self, why="no support for _allgather_base in Gloo process group"):
        self.why, self.calls = why, []

    def get_backend(self):
        return "fake"

    def all_gather_into_tensor(self, recv, send):
        raise RuntimeError(self.why)

    def all_gather(self, outs, send):
        self.calls.append("all_gather")

    def reduce_scatter_tensor(self, recv, send):
        raise RuntimeError("ProcessGroup fake does not support _reduce_scatter_base")

    def reduce_scatter(self, recv, ins):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")


class FormTest(unittest.TestCase):
    def test_list_form_when_the_tensor_form_is_missing(self):
        dist = FakeDist()
        r = torch_bench.TorchRank(None, dist, 0, 2)
        self.assertEqual(r.form("all_gather"), "all_gather_into_tensor")
        r.run("all_gather", FakeTensor(4), FakeTensor(8), 4)
        r.run("all_gather", FakeTensor(4), FakeTensor(8), 4)
        self.assertEqual(dist.calls, ["all_gather", "all_gather"])
        self.assertEqual(r.form("all_gather"), "all_gather (list)")

    def test_unsupported_when_no_form_exists(self):
        r = torch_bench.TorchRank(None, FakeDist(), 0, 2)
        with self.assertRaises(torch_bench.gloo_bench.Unsupported):
            r.run("reduce_scatter", FakeTensor(8), FakeTensor(4), 4)

    def test_other_failures_are_not_taken_for_a_missing_form(self):
        r = torch_bench.TorchRank(None, FakeDist("connection reset by rank 1"), 0, 2)
        with self.assertRaises(RuntimeError):
            r.run("all_gather", FakeTensor(4), FakeTensor(8), 4)
        self.assertEqual(r.form("all_gather"), "all_gather_into_tensor")


if __name__ == "__main__":
    unittest.main()

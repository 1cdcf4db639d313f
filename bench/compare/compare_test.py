#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# compare_test.py - unit tests of bench/compare's pure parts on crafted input:
# the reader of loom's traced launches (coll_trace.py: per row the algorithm
# and the model's prediction, the probe lines), the best-of-all-peers ratio and
# the ratio table and the prediction each row is set against, an earlier loom's geomeans
# (report.py), the traced sweeps, the earlier loom's launch and order and Intel MPI's
# environment and loom's memory rate (impls.py), the command line's help, and that every collective it compares (the
# uneven ones too) has a name in the table and a form in each peer program. Runs nothing. Run
# by meson's 'tools' suite.
import os
import sys
import types
import unittest
from unittest import mock

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coll_trace  # noqa: E402
import compare  # noqa: E402
import impls  # noqa: E402
import report  # noqa: E402

P0 = "vm:10:10 [0] LOOM INFO "
P1 = "vm:11:11 [1] LOOM INFO "


def call(coll, nbytes, algo, model, extra=""):
    """A trace message; extra stands for words a later format may add."""
    return (f"{coll} seq 3: {nbytes} bytes float sum algo {algo}{extra} order rank transport "
            f"shm 12.0 us (model {model} us) -> no error\n")


def column(coll, nbytes, algo, model, extra=""):
    """What bench/common.c's driver does for one column with -n 1 -a 0."""
    return [P0 + call(coll, nbytes, algo, model, extra), P0 + call("barrier", 0, "shm", "0.0"),
            P1 + call(coll, nbytes, "other", "9.9"), P0 + call(coll, nbytes, algo, model, extra),
            P0 + call("broadcast", 8, "tiny", "1.5")]


class TraceTest(unittest.TestCase):
    def log(self):
        lines = [P0 + "rank 0: link class shm, alpha 1.0 us, beta 0.1 ns/B\n",
                 P1 + "rank 1: link class shm, alpha 1.0 us, beta 0.1 ns/B\n",
                 P0 + "shm machine: l2 2048 KiB, l3 300 MiB, copy 11.9 GB/s\n",
                 P1 + "shm machine: l2 2048 KiB, l3 300 MiB, copy 11.9 GB/s\n",
                 P0 + call("allgather", 128, "shm", "0.0"),
                 "#       size         count      type\n",
                 P0 + call("barrier", 0, "shm", "0.0")]
        lines += column("allreduce", 65536, "ring", "40.0") + column("allreduce", 65536, "rd",
                                                                     "30.0", " copy cma")
        lines += ["       65536         16384     float     sum      -1     8.1 ...\n"]
        lines += column("allreduce", 1 << 20, "ring", "300.5") + column(
            "allreduce", 1 << 20, "ring", "310.0")
        lines += ["     1048576        262144     float     sum      -1   250.0 ...\n",
                  "# Out of bounds values : 0 OK\n"]
        return lines

    def test_calls_go_to_the_next_row_without_barriers_or_other_ranks(self):
        rows = coll_trace.calls_by_row(self.log())
        self.assertEqual(sorted(rows), [65536, 1 << 20])
        self.assertEqual(len(rows[65536]), 6)
        self.assertEqual(coll_trace.row_choice(rows[65536]), {"algo": "ring", "model_us": 40.0})
        self.assertEqual(coll_trace.row_choice(rows[65536], in_place=True),
                         {"algo": "rd", "model_us": 30.0})
        self.assertEqual(coll_trace.row_choice(rows[1 << 20], in_place=True)["model_us"], 310.0)

    def test_a_message_without_algo_or_model_is_no_call(self):
        self.assertIsNone(coll_trace.call_of("allreduce seq 1: 8 bytes algo ring 3 us"))
        self.assertIsNone(coll_trace.call_of("rank 0: collective scratch is now 8 bytes"))
        self.assertEqual(coll_trace.call_of("x algo hier reason l3 (model 1.5e3 us)"),
                         {"algo": "hier", "model_us": 1500.0})

    def test_probe_lines_once_each(self):
        got = coll_trace.probe_lines(self.log())
        self.assertEqual([p["line"][:12] for p in got],
                         ["rank 0: link", "rank 1: link", "shm machine:"])
        self.assertEqual(got[2]["rank"], 0)

    def test_ratio_to_a_prediction_of_zero_is_none(self):
        self.assertIsNone(coll_trace.with_ratio({"algo": "shm", "model_us": 0.0}, 5.0)
                          ["measured_over_model"])
        self.assertAlmostEqual(coll_trace.with_ratio({"algo": "ring", "model_us": 4.0}, 5.0)
                               ["measured_over_model"], 1.25)


def meas(impl, coll, size, t, rep=1):
    return {"impl": impl, "coll": coll, "nranks": 2, "rep": rep, "size": size, "count": 1,
            "time_us": t, "busbw": 1000.0 / t, "nwrong": 0}


class ReportTest(unittest.TestCase):
    def rows(self):
        ms = [meas("loom", "all_reduce", 64, 10.0), meas("ompi", "all_reduce", 64, 12.0),
              meas("impi", "all_reduce", 64, 8.0), meas("gloo", "all_reduce", 64, 50.0),
              meas("loom", "broadcast", 64, 4.0), meas("loom", "broadcast", 64, 6.0, rep=2),
              meas("loom", "broadcast", 64, 5.0, rep=3), meas("mpich", "broadcast", 64, 10.0)]
        traces = [{"coll": "broadcast", "nranks": 2, "size": 64,
                   "out_of_place": {"algo": "flat", "model_us": 1.0},
                   "in_place": {"algo": "tree", "model_us": 4.0}}]
        return report.summarize(ms, ["loom", "ompi", "mpich", "impi", "gloo"], traces)

    def test_best_of_all_peers_and_each_peer(self):
        ar, bc = self.rows()
        self.assertEqual(ar["best_peer"], "impi")
        self.assertAlmostEqual(ar["ratio"], 0.8)
        self.assertEqual(sorted(ar["loom_over_peer"]), ["gloo", "impi", "ompi"])
        self.assertAlmostEqual(ar["loom_over_peer"]["ompi"], 1.2)
        self.assertIsNone(ar["model"])
        self.assertEqual(bc["best_peer"], "mpich")
        self.assertAlmostEqual(bc["ratio"], 2.0)  # median of loom's 4, 6, 5

    def test_broadcast_is_set_against_the_in_place_prediction(self):
        m = self.rows()[1]["model"]
        self.assertEqual(m["algo"], "tree")
        self.assertAlmostEqual(m["measured_over_model"], 1.25)

    def test_the_timed_launches_predictions_replace_the_traced_one(self):
        ms = [dict(meas("loom", "broadcast", 64, t, rep=k + 1), model_us=p)
              for k, (t, p) in enumerate(((4.0, 2.0), (6.0, 3.0), (5.0, 10.0)))]
        traces = [{"coll": "broadcast", "nranks": 2, "size": 64, "out_of_place": None,
                   "in_place": {"algo": "shm", "model_us": 40.0}}]
        m = report.summarize(ms, ["loom"], traces)[0]["model"]
        self.assertEqual(m["algo"], "shm")  # the traced launch names the algorithm
        self.assertAlmostEqual(m["model_us"], 3.0)  # the median of the timed launches' own
        self.assertAlmostEqual(m["measured_over_model"], 5.0 / 3.0)

    def test_model_lines_count_rows_within_the_bound_from_64k(self):
        def row(size, ratio):
            return {"coll": "all_reduce", "nranks": 2, "size": size, "impls": {"loom": {}},
                    "model": None if ratio is None else
                    {"algo": "ring", "model_us": 1.0, "measured_over_model": ratio}}
        rows = [row(8, 3.0), row(64 << 10, 1.25), row(1 << 20, 0.79), row(16 << 20, 1.1),
                row(128 << 20, None)]
        self.assertEqual(report.model_lines(rows), [
            "cost model from 64 KiB: 2 of 3 predicted rows within 25 % (measured/predicted "
            "0.79 AllReduce 2 ranks 1 MiB to 1.25 AllReduce 2 ranks 64 KiB); 1 row(s) without a "
            "prediction"])
        self.assertEqual(report.model_lines([row(8, 1.0)]), [])

    def test_an_earlier_loom_is_set_against_loom_and_is_no_peer(self):
        ms = [meas("loom", "all_reduce", 64, 10.0), meas("base", "all_reduce", 64, 5.0),
              meas("ompi", "all_reduce", 64, 12.0), meas("loom", "all_reduce", 128, 10.0),
              meas("base", "all_reduce", 128, 12.0), meas("loom", "reduce", 64, 10.0),
              meas("base", "reduce", 64, 10.2)]
        rows = report.summarize(ms, ["loom", "base", "ompi"])
        self.assertEqual(rows[0]["best_peer"], "ompi")  # the faster base is not a peer
        self.assertAlmostEqual(rows[0]["loom_over_peer"]["base"], 0.5)
        self.assertEqual(report.base_lines(rows, "loom abc1234"), [
            "AllReduce       2 ranks: geomean loom/base  0.77 over 2 sizes",
            "Reduce          2 ranks: geomean loom/base  1.02 over 1 sizes",
            "loom against loom abc1234: geomean fell by more than 5% for AllReduce 2 ranks "
            "(0.77)"])
        self.assertEqual(report.base_lines(rows[2:], None)[-1],
                         "loom against the base: no collective's geomean fell by more than 5%")
        self.assertEqual(report.base_lines(report.summarize(ms[:1], ["loom"]), None), [])

    def test_ratio_matrix_names_the_best_peer_and_marks_losses(self):
        out = report.ratio_matrix(self.rows(), {"impi": "Intel MPI", "mpich": "MPICH"})
        self.assertEqual(out[2], "| AllReduce | 2 | **0.80** impi |")
        self.assertEqual(out[3], "| Broadcast | 2 | 2.00 mpich |")
        self.assertEqual(out[4], "best peer: impi = Intel MPI, mpich = MPICH")


class ImplsTest(unittest.TestCase):
    def test_one_doubling_sweep_when_it_covers_every_size(self):
        self.assertEqual(impls.trace_sweeps([8, 65536, 1 << 20, 128 << 20]), [(8, 128 << 20, 2)])
        self.assertEqual(impls.trace_sweeps([8, 24]), [(8, 8, 2), (24, 24, 2)])

    def cfg(self, net):
        return types.SimpleNamespace(impi_prefix="/opt/impi", peers_bin="/tmp/bin",
                                     build="/tmp/build", net=net)

    def test_a_size_finds_the_row_its_rounding_printed(self):
        rows = {0: [], 65520: [], 131040: [], 1048560: [], 1048576: []}
        self.assertEqual(impls.row_of(65536, rows), 65520)
        self.assertEqual(impls.row_of(1048576, rows), 1048576)
        self.assertEqual(impls.row_of(0, rows), 0)
        self.assertIsNone(impls.row_of(4096, rows))

    def test_an_earlier_loom_runs_right_after_loom_from_its_own_build(self):
        cfg = types.SimpleNamespace(build="/tmp/new", base_build="/tmp/old", base_name="abc1234",
                                    net="shm", timeout=60, peers_bin="/tmp/bin",
                                    impi_prefix="/opt/impi")
        made = impls.make_all(cfg, ["loom", "ompi"])
        self.assertEqual([i.key for i in made], ["loom", "base", "ompi"])
        base = made[1]
        self.assertEqual(base.label, "loom abc1234")
        cmd = base.command("all_reduce", 2, (8, 8, 2), 5, 1, 0, None)
        self.assertEqual(cmd[:5], ["/tmp/old/tools/loomrun", "-v", "-n", "2",
                                   "/tmp/old/bench/all_reduce_perf"])
        self.assertNotIn("-M", cmd)  # an earlier revision may lack the prediction column
        self.assertIn("-M", made[0].command("all_reduce", 2, (8, 8, 2), 5, 1, 0, None))

    def test_loom_and_the_earlier_loom_trade_places_every_other_repetition(self):
        cfg = types.SimpleNamespace(build="/tmp/new", base_build="/tmp/old", base_name="abc1234",
                                    net="shm", timeout=60, peers_bin="/tmp/bin",
                                    impi_prefix="/opt/impi")
        made = impls.make_all(cfg, ["loom", "ompi", "impi"])
        order = [[i.key for i in impls.rep_order(made, rep)] for rep in (1, 2, 3)]
        self.assertEqual(order, [["loom", "base", "ompi", "impi"], ["base", "loom", "ompi", "impi"],
                                 ["loom", "base", "ompi", "impi"]])
        cfg.base_build = None
        alone = impls.make_all(cfg, ["loom", "ompi"])
        self.assertEqual([i.key for i in impls.rep_order(alone, 2)], ["loom", "ompi"])

    def test_loom_gets_the_memory_rate_of_as_many_threads_as_its_ranks_keep_busy(self):
        lim = {"memcpy": {"results": [{"threads": 1, "median_gbps": 11.4},
                                      {"threads": 2, "median_gbps": 15.0}]}}
        cfg = types.SimpleNamespace(build="/tmp/new", base_build=None, net="shm", timeout=60,
                                    peers_bin="/tmp/bin", impi_prefix="/opt/impi", limits=lim)
        loom = impls.make_all(cfg, ["loom"])[0]
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("LOOM_SHM_MEMORY_MBPS", None)
            self.assertEqual(loom.env(1)["LOOM_SHM_MEMORY_MBPS"], "11400")
            two = "15000" if len(os.sched_getaffinity(0)) >= 2 else "11400"
            self.assertEqual(loom.env(8)["LOOM_SHM_MEMORY_MBPS"], two)
            self.assertNotIn("LOOM_SHM_MEMORY_MBPS", loom.env())  # no ranks, no rate
            os.environ["LOOM_SHM_MEMORY_MBPS"] = "123"
            self.assertEqual(loom.env(2)["LOOM_SHM_MEMORY_MBPS"], "123")  # the caller's stands
        cfg.limits = {"memcpy": {"error": "failed"}}
        self.assertNotIn("LOOM_SHM_MEMORY_MBPS", loom.env(2))

    def test_intel_mpi_fabrics(self):
        shm = impls.IntelMpi(self.cfg("shm"))
        self.assertIn("not installed in /opt/impi", shm.reason)
        env = shm.env()
        self.assertEqual((env["I_MPI_FABRICS"], env["I_MPI_PIN"]), ("shm", "0"))
        self.assertEqual(env["FI_PROVIDER_PATH"], "/opt/impi/lib")
        self.assertTrue(env["LD_LIBRARY_PATH"].startswith("/opt/impi/lib"))
        self.assertTrue(env["PATH"].startswith("/opt/impi/bin"))
        tcp = impls.IntelMpi(self.cfg("tcp")).env()
        self.assertEqual((tcp["I_MPI_FABRICS"], tcp["FI_PROVIDER"]), ("ofi", "tcp"))
        self.assertEqual(tcp["I_MPI_COLL_INTRANODE"], "pt2pt")
        self.assertNotIn("I_MPI_COLL_INTRANODE", env)
        self.assertEqual(impls.IntelMpi(self.cfg("tcp")).command(4), ["/opt/impi/bin/mpiexec",
                                                                      "-n", "4"])

    def test_every_collective_has_a_name_and_its_peers(self):
        here = os.path.dirname(os.path.abspath(__file__))
        peers = os.path.join(here, "..", "peers")
        with open(os.path.join(peers, "mpi_coll_bench.c")) as f:
            mpi = f.read()
        with open(os.path.join(peers, "gloo_bench.py")) as f:
            gloo = f.read()
        self.assertTrue({"all_gatherv", "reduce_scatterv"} <= set(impls.COLLS))
        for c in impls.COLLS:
            self.assertIn(c, report.NAMES)
            self.assertIn('{"%s", "%s",' % (c, report.NAMES[c]), mpi)
            self.assertIn('"%s": ("%s",' % (c, report.NAMES[c]), gloo)


class CommandLineTest(unittest.TestCase):
    def test_help_prints_every_option(self):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as e:
            compare.parse_args(["--help"])
        self.assertEqual(e.exception.code, 0)
        self.assertIn("--base REV_OR_DIR", out.getvalue())
        self.assertIn("more than 5 %", out.getvalue())


if __name__ == "__main__":
    unittest.main()

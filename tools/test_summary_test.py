#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# test_summary_test.py - unit tests of test_summary.py on crafted logs: meson JUnit logs with
# GoogleTest's own XML inside (passed, failed, GTEST_SKIP, DISABLED_ cases), meson's JSON logs
# beside them (a crash with no failing case), and --extra files. What never ran must count as
# skipped with its reason printed, never as passed. Run by meson's 'tools' suite.
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_summary  # noqa: E402

# The shape of what gtest 1.12 writes and meson copies into its JUnit log: gtest's suites renamed
# "<project>.<test>.<suite>" (the test as `meson test` names it), their cases without the
# "result" attribute (meson drops it), plain tests as cases of a suite named after the project.
JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="loom.loom:transport / transport.All/TransportTest" tests="5">
    <testcase name="SizesBothWays/shm" status="run" classname="All/TransportTest"/>
    <testcase name="SizesBothWays/ucx" status="run" classname="All/TransportTest">
      <skipped message="../tests/transport/test_transport.cc:417&#x0A;transport ucx is not in this build"><![CDATA[../tests/transport/test_transport.cc:417
transport ucx is not in this build]]></skipped>
    </testcase>
    <testcase name="DISABLED_MessageOver4GiB/shm" status="notrun" classname="All/TransportTest"/>
    <testcase name="DISABLED_MessageOver4GiB/tcp" status="notrun" classname="All/TransportTest"/>
    <testcase name="Tags/tcp" status="run" classname="All/TransportTest">
      <failure message="rank 1 failed"/>
    </testcase>
  </testsuite>
  <testsuite name="loom.loom:transport / transport.DISABLED_Whole" tests="1">
    <testcase name="Case" classname="DISABLED_Whole"/>
  </testsuite>
  <testsuite name="loom" tests="2">
    <testcase name="loom:hygiene / smoke" classname="loom"/>
    <testcase name="loom:hosts / hosts-grid" classname="loom"><skipped/></testcase>
  </testsuite>
</testsuites>
"""


def write_build(root, junit, results, logbase="testlog"):
    logs = os.path.join(root, "meson-logs")
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(logs, logbase + ".junit.xml"), "w") as f:
        f.write(junit)
    with open(os.path.join(logs, logbase + ".json"), "w") as f:
        for name, result in results:
            f.write(json.dumps({"name": name, "result": result}) + "\n")


def run_main(argv):
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ["test_summary.py"] + argv
    try:
        with contextlib.redirect_stdout(out):
            rc = test_summary.main()
    finally:
        sys.argv = saved
    return rc, out.getvalue()


class InTempDir(unittest.TestCase):
    """Each test gets a fresh directory to play a build dir."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name

    def tearDown(self):
        self.dir.cleanup()


class CountLog(InTempDir):
    def test_cases_that_never_ran_are_skipped(self):
        write_build(self.root, JUNIT, [("loom:transport / transport", "FAIL"),
                                       ("loom:hygiene / smoke", "OK"),
                                       ("loom:hosts / hosts-grid", "SKIP")])
        reasons = {}
        got = test_summary.count_log(os.path.join(self.root, "meson-logs", "testlog.junit.xml"),
                                     reasons)
        # passed: SizesBothWays/shm, smoke; failed: Tags/tcp (the program's FAIL is that case);
        # skipped: the GTEST_SKIP, two DISABLED_ cases, a case of a DISABLED_ suite, hosts-grid.
        self.assertEqual(got, (2, 1, 5))
        self.assertEqual(reasons, {"transport ucx is not in this build": 1,
                                   "disabled (DISABLED_ prefix): never run": 3,
                                   "skipped, no reason given": 1})

    def test_crash_without_failing_case_is_one_failure(self):
        junit = JUNIT.replace('<failure message="rank 1 failed"/>', "")
        write_build(self.root, junit, [("loom:transport / transport", "TIMEOUT")])
        got = test_summary.count_log(os.path.join(self.root, "meson-logs", "testlog.junit.xml"))
        self.assertEqual(got, (3, 1, 5))

    def test_missing_json_log_is_a_failure(self):
        write_build(self.root, JUNIT, [])
        os.unlink(os.path.join(self.root, "meson-logs", "testlog.json"))
        with contextlib.redirect_stdout(io.StringIO()):
            got = test_summary.count_log(
                os.path.join(self.root, "meson-logs", "testlog.junit.xml"))
        self.assertEqual(got, (2, 2, 5))

    def test_reason_without_file_line(self):
        junit = """<testsuites><testsuite name="p.t.S">
<testcase name="a" status="run"><skipped message="no IPv6 loopback"/></testcase>
</testsuite></testsuites>"""
        write_build(self.root, junit, [("p:s / t", "OK")])
        reasons = {}
        got = test_summary.count_log(os.path.join(self.root, "meson-logs", "testlog.junit.xml"),
                                     reasons)
        self.assertEqual(got, (0, 0, 1))
        self.assertEqual(reasons, {"no IPv6 loopback": 1})


class Main(InTempDir):
    def test_summary_line_and_reasons(self):
        passing = JUNIT.replace('<failure message="rank 1 failed"/>', "")
        write_build(self.root, passing, [("loom:transport / transport", "OK")])
        extra = os.path.join(self.root, "extra.txt")
        with open(extra, "w") as f:
            f.write("PASS fuzz q4\nSKIP tests/hosts/run (network namespaces refused)\n")
        rc, out = run_main([self.root, "--extra", extra])
        self.assertEqual(rc, 0)
        lines = out.splitlines()
        self.assertEqual(lines[-1], "4 passed, 0 failed, 6 skipped")
        self.assertIn("    3 x disabled (DISABLED_ prefix): never run", lines)
        self.assertIn("    1 x tests/hosts/run (network namespaces refused)", lines)
        self.assertIn("    1 x transport ucx is not in this build", lines)

    def test_failure_sets_the_exit_status(self):
        write_build(self.root, JUNIT, [("loom:transport / transport", "FAIL")])
        rc, out = run_main([self.root])
        self.assertEqual(rc, 1)
        self.assertEqual(out.splitlines()[-1], "2 passed, 1 failed, 5 skipped")

    def test_no_log_is_a_failure(self):
        rc, out = run_main([self.root])
        self.assertEqual(rc, 1)
        self.assertEqual(out.splitlines()[-1], "0 passed, 1 failed")


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# test_summary.py - counts test cases over one or more meson build dirs and
# prints a line per test log, then the closing line "N passed, N failed[, N
# skipped]". GoogleTest cases are counted one by one (from meson's JUnit log);
# a test program that failed without reporting a failing case (crash, timeout)
# counts as one failure. A case that never ran counts as skipped, never as
# passed: GTEST_SKIP (a <skipped> child), a DISABLED_ case (gtest lists it with
# status "notrun" and no child), a meson test that exited 77; the reasons are
# printed, one line per distinct reason with its count. A build dir may hold several logs, one per `meson
# test --logbase NAME` run. Checks that are not meson tests (valgrind runs,
# fuzzers) come in through --extra files of "PASS|FAIL|SKIP name" lines.
# Exits 1 if anything failed or a log is missing. Run by .ci/run.
import argparse
import glob
import json
import os
import re
import xml.etree.ElementTree as ET


def skip_reason(case):
    """Why a JUnit case did not run, or None if it ran. gtest's own XML (which meson copies
    into its JUnit log) marks GTEST_SKIP with a <skipped message="file:line\nreason"> child and
    a DISABLED_ case with status="notrun" (result "suppressed") and no child at all."""
    skipped = case.find("skipped")
    if skipped is not None:
        msg = (skipped.attrib.get("message") or skipped.text or "").strip()
        first, _, rest = msg.partition("\n")
        if rest and re.match(r"^\S+:\d+$", first.strip()):
            msg = rest.strip()  # gtest puts "file:line" first
        return msg.splitlines()[0] if msg else "skipped, no reason given"
    name = case.attrib.get("name", "")
    if (case.attrib.get("status") == "notrun" or case.attrib.get("result") in ("suppressed", "skipped")
            or name.startswith("DISABLED_") or "/DISABLED_" in name
            or case.attrib.get("classname", "").split("/")[-1].startswith("DISABLED_")):
        return "disabled (DISABLED_ prefix): never run"
    return None


def count_log(junit_path, reasons=None):
    """Counts one `meson test` run: its JUnit log and the JSON log beside it. The reason of
    every case that did not run is counted into `reasons` (a dict reason -> count)."""
    passed = failed = skipped = 0
    if reasons is None:
        reasons = {}
    failing_suites = set()  # JUnit suite names holding a failing case
    try:
        root = ET.parse(junit_path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{junit_path}: unreadable JUnit log ({e})")
        return 0, 1, 0
    for suite in root:
        name = suite.attrib.get("name", "")
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                # A gtest case sits in "<project>.<test>.<Suite>"; a plain test is a case
                # named "<test>" in "<project>".
                failing_suites.add(name + "." + case.attrib.get("name", "") + ".")
                failing_suites.add(name + ".")
            elif (why := skip_reason(case)) is not None:
                skipped += 1
                reasons[why] = reasons.get(why, 0) + 1
            else:
                passed += 1
    json_path = junit_path[: -len(".junit.xml")] + ".json"
    try:
        with open(json_path) as f:
            for line in f:
                t = json.loads(line)
                if t["result"] in ("OK", "SKIP", "EXPECTEDFAIL"):
                    continue
                project = t["name"].split(":", 1)[0]
                prefix = f"{project}.{t['name']}."
                if not any(k.startswith(prefix) for k in failing_suites):
                    failed += 1
                    print(f"{junit_path}: {t['name']}: {t['result']} (no failing case reported)")
    except (OSError, ValueError, KeyError) as e:
        print(f"{json_path}: unreadable test log ({e})")
        failed += 1
    return passed, failed, skipped


def count_build(build, reasons=None):
    logs = sorted(glob.glob(os.path.join(build, "meson-logs", "*.junit.xml")))
    if not logs:
        print(f"{build}: no test log")
        return [(f"{build}", (0, 1, 0))]
    return [(log, count_log(log, reasons)) for log in logs]


def count_extra(path, reasons=None):
    passed = failed = skipped = 0
    if reasons is None:
        reasons = {}
    try:
        with open(path) as f:
            for line in f:
                word = line.split(None, 1)[0] if line.strip() else ""
                if word == "PASS":
                    passed += 1
                elif word == "SKIP":
                    skipped += 1
                    why = line.split(None, 1)[1].strip() if len(line.split(None, 1)) > 1 else ""
                    why = why or "skipped, no reason given"
                    reasons[why] = reasons.get(why, 0) + 1
                elif word:
                    failed += 1
                    if word != "FAIL":
                        print(f"{path}: unrecognised line counted as a failure: {line.rstrip()}")
    except OSError as e:
        print(f"{path}: unreadable ({e})")
        failed += 1
    return passed, failed, skipped


def line_of(p, f, s):
    line = f"{p} passed, {f} failed"
    if s:
        line += f", {s} skipped"
    return line


def main():
    ap = argparse.ArgumentParser(description="Counts test cases over meson build dirs.")
    ap.add_argument("builds", nargs="*", help="meson build directories")
    ap.add_argument("--extra", action="append", default=[],
                    help='file of "PASS|FAIL|SKIP name" lines (repeatable)')
    args = ap.parse_args()
    results = []
    reasons = {}
    for build in args.builds:
        results += count_build(build, reasons)
    for path in args.extra:
        results.append((path, count_extra(path, reasons)))
    total = [0, 0, 0]
    for name, counts in results:
        print(f"  {name}: {line_of(*counts)}")
        total = [a + b for a, b in zip(total, counts)]
    if reasons:
        print("  not run:")
        for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"    {n} x {why}")
    print(line_of(*total))
    return 1 if total[1] or not results else 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# test_summary.py - counts test cases over one or more meson build dirs and
# prints the closing line "N passed, N failed[, N skipped]". GoogleTest cases
# are counted one by one (from meson's JUnit log); a test program that failed
# without reporting a failing case (crash, timeout) counts as one failure.
# Exits 1 if anything failed.
import json
import sys
import xml.etree.ElementTree as ET


def count(build):
    passed = failed = skipped = 0
    failing_cases = {}
    try:
        root = ET.parse(f"{build}/meson-logs/testlog.junit.xml").getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{build}: no JUnit log ({e})")
        return 0, 1, 0
    for suite in root:
        name = suite.attrib.get("name", "")
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failing_cases[name] = failing_cases.get(name, 0) + 1
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    try:
        with open(f"{build}/meson-logs/testlog.json") as f:
            for line in f:
                t = json.loads(line)
                if t["result"] in ("OK", "SKIP", "EXPECTEDFAIL"):
                    continue
                prefix = "loom." + t["name"]
                if not any(k.startswith(prefix) for k in failing_cases):
                    failed += 1
                    print(f"{build}: {t['name']}: {t['result']}")
    except OSError as e:
        print(f"{build}: no test log ({e})")
        failed += 1
    return passed, failed, skipped


def main():
    p = f = s = 0
    for build in sys.argv[1:]:
        a, b, c = count(build)
        p, f, s = p + a, f + b, s + c
    line = f"{p} passed, {f} failed"
    if s:
        line += f", {s} skipped"
    print(line)
    return 1 if f else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_format.py - runs clang-format (the path given) in dry-run mode over
# every tracked C, C++ and header file with the repository's .clang-format,
# and exits 1 listing the files that would change. Run by the lint suite.
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    clang_format = sys.argv[1] if len(sys.argv) > 1 else "clang-format"
    files = []
    for top in ("include", "src", "tools", "bench", "tests", "examples", "python"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".c", ".h", ".cc"))]
    bad = []
    for f in sorted(files):
        r = subprocess.run([clang_format, "--style=file", "--dry-run", "--Werror", f],
                           cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            bad.append(os.path.relpath(f, ROOT))
    for b in bad:
        print(f"{b}: not formatted (run clang-format -i {b})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

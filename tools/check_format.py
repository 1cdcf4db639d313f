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
    # One clang-format process per batch of files: starting one per file made the check take
    # most of its time in process start-up. A violation names its file on stderr.
    bad = set()
    files.sort()
    for i in range(0, len(files), 64):
        batch = files[i:i + 64]
        r = subprocess.run([clang_format, "--style=file", "--dry-run", "--Werror"] + batch,
                           cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            continue
        named = {f for f in batch if f + ":" in r.stderr}
        if not named:  # failed without naming a file (a crash, a bad style): say so per file
            named = {f for f in batch
                     if subprocess.run([clang_format, "--style=file", "--dry-run", "--Werror", f],
                                       cwd=ROOT, capture_output=True).returncode != 0}
        bad |= named
    bad = sorted(os.path.relpath(f, ROOT) for f in bad)
    for b in bad:
        print(f"{b}: not formatted (run clang-format -i {b})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# check_links.py - every relative link in loom's Markdown files resolves: a link's file (or
# folder) exists, and its #anchor names a heading of that file (GitHub's slugs). Paths to .md
# files written out in the text (docs/echo.md, bench/compare/README.md) must exist too, so that
# a doc that moves or goes cannot leave a stale mention behind. External links (http, mailto)
# are not fetched. Run by the lint suite; prints each broken link and exits 1 if there is any.
#
#   tools/check_links.py [ROOT]
import os
import re
import sys

SKIP_DIRS = {".git", "subprojects", "node_modules"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path to a Markdown file in the text, from one of the tree's top-level folders.
MD_PATH = re.compile(r"(?<![\w./-])((?:docs|bench|trainer|tests|src|tools|fuzz|examples)"
                     r"/[\w./-]*\.md)\b")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files(root):
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(dirpath, f)


def strip_code(text):
    """The text without fenced code blocks (their lines become empty, keeping line numbers)."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            out.append("")
            continue
        out.append("" if fence else line)
    return out


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            for line in strip_code(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


def check_file(root, path):
    bad = []
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        lines = strip_code(f.read())
    for n, line in enumerate(lines, 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                bad.append(f"{rel}:{n}: link to {target}: {file_part} does not exist")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel}:{n}: link to {target}: no heading #{anchor} in "
                           f"{os.path.relpath(dest, root)}")
        for mention in MD_PATH.findall(re.sub(r"\]\([^)]*\)", "]", line)):
            if not os.path.exists(os.path.join(root, mention)):
                bad.append(f"{rel}:{n}: mentions {mention}, which does not exist")
    return bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bad = []
    for path in sorted(markdown_files(root)):
        bad += check_file(root, path)
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

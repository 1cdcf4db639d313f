# SPDX-License-Identifier: Apache-2.0
#
# coll_trace.py - reads what a traced loom benchmark printed (LOOM_COLL_TRACE=1 with
# LOOM_DEBUG=INFO): per table row, the algorithm loom chose and the cost
# model's predicted time, and the library's own probe lines ("shm machine:
# ..." and the link class with its constants). Of a call's trace line it reads
# only "algo NAME", "(model X us)" and whether the message starts with
# "barrier", so that other words may come and go. bench/compare and
# bench/hosts use it; it runs nothing.
import re

# The log prefix "host:pid:tid [rank] LOOM INFO " and the message after it.
INFO = re.compile(r"\[(-?\d+)\] LOOM INFO (.*)$")
ALGO = re.compile(r"\balgo (\S+)")
MODEL = re.compile(r"\(model ([0-9.]+(?:[eE][-+]?[0-9]+)?) us\)")
# A row of a *_perf table: size and count first; '#' lines are not rows.
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s")
# The driver's barriers between the timed calls are no row's column.
BARRIER = re.compile(r"^barrier\b")
# What the probe lines of communicator creation start with or contain.
PROBE_START, PROBE_WORDS = "shm machine:", "link class"


def info_message(line):
    """(rank, message) of a loom INFO line, or None."""
    m = INFO.search(line)
    return (int(m.group(1)), m.group(2).strip()) if m else None


def call_of(message):
    """{"algo", "model_us"} of a per-call trace message, or None (also for a
    barrier's)."""
    a, m = ALGO.search(message), MODEL.search(message)
    if not a or not m or BARRIER.match(message):
        return None
    return {"algo": a.group(1), "model_us": float(m.group(1))}


def is_probe(message):
    return message.startswith(PROBE_START) or PROBE_WORDS in message


def probe_lines(lines):
    """Every distinct probe message, in order, with the rank that printed it
    first: [{"rank", "line"}]."""
    out, seen = [], set()
    for line in lines:
        got = info_message(line)
        if got and is_probe(got[1]) and got[1] not in seen:
            seen.add(got[1])
            out.append({"rank": got[0], "line": got[1]})
    return out


def calls_by_row(lines, rank=0):
    """{size: [call, ...]}: rank's traced calls, each given to the table row
    that rank 0 printed next; a '#' line (the table's head) drops the calls
    before it. A row's line is printed whole after its calls (stdout is
    line-buffered, and the driver ends the row after the in-place column),
    so this needs rank 0's stdout and stderr in one file."""
    rows, pending = {}, []
    for line in lines:
        got = info_message(line)
        if got:
            call = call_of(got[1]) if got[0] == rank else None
            if call:
                pending.append(call)
            continue
        if line.lstrip().startswith("#"):
            pending = []
            continue
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = pending
            pending = []
    return rows


def row_choice(calls, in_place=False):
    """The call that stands for a row's out-of-place (or in-place) column:
    bench/common.c times one column the same way as the other (an untimed
    call, a barrier, the timed calls, the collective that combines the times),
    out of place first, so without the barriers the first call of each half
    is the column's own."""
    if not calls:
        return None
    return calls[len(calls) // 2] if in_place and len(calls) >= 2 else calls[0]


def with_ratio(call, measured_us):
    """call plus the measured time and measured/predicted (None when the
    model predicts nothing or 0)."""
    if call is None:
        return None
    pred = call["model_us"]
    ratio = measured_us / pred if measured_us and pred > 0 else None
    return dict(call, measured_us=measured_us, measured_over_model=ratio)

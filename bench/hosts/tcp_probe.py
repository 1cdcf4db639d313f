#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
#
# tcp_probe.py - the raw TCP capacity of a modelled link, measured in the same
# run as the collectives so that their busbw can be read against it: one
# socket, socket buffers left to the kernel's autotuning as loom leaves them
# by default (LOOM_TCP_SOCKBUF=0), as much data as fits in a few seconds.
# bench/hosts/run starts a receiver in one host namespace and a sender in
# another (two of each for "both directions at once"). It knows nothing of
# namespaces or loom.
#   tcp_probe.py recv ADDR PORT   listens, takes one connection, reads to EOF
#   tcp_probe.py send ADDR PORT SECONDS
# Each prints one JSON line: bytes, seconds and gbps (10^9 bit/s) as it saw them.
import json
import socket
import sys
import time

CHUNK = 1 << 20
# A receiver that never hears from its sender must not hang the run.
ACCEPT_TIMEOUT_S = 30


def recv(addr, port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(1)
    print(json.dumps({"listening": port}), flush=True)
    ls.settimeout(ACCEPT_TIMEOUT_S)
    conn, _ = ls.accept()
    conn.settimeout(ACCEPT_TIMEOUT_S)
    buf = bytearray(CHUNK)
    total, t0, t1 = 0, None, None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.monotonic()
        # Timed from the first byte: the connection set-up is not the link's rate.
        if t0 is None:
            t0 = now
        total, t1 = total + n, now
    secs = (t1 - t0) if t0 is not None and t1 > t0 else 0.0
    print(json.dumps({"bytes": total, "seconds": secs,
                      "gbps": total * 8 / secs / 1e9 if secs else 0.0}), flush=True)


def send(addr, port, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(ACCEPT_TIMEOUT_S)
    s.connect((addr, port))
    data = memoryview(bytes(CHUNK))
    total, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        s.sendall(data)
        total += CHUNK
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the receiver's close: every byte has arrived
    secs = time.monotonic() - t0
    print(json.dumps({"bytes": total, "seconds": secs, "gbps": total * 8 / secs / 1e9}),
          flush=True)


def main(argv):
    if len(argv) == 3 and argv[0] == "recv":
        recv(argv[1], int(argv[2]))
    elif len(argv) == 4 and argv[0] == "send":
        send(argv[1], int(argv[2]), float(argv[3]))
    else:
        sys.exit("usage: tcp_probe.py recv ADDR PORT | send ADDR PORT SECONDS")


if __name__ == "__main__":
    main(sys.argv[1:])

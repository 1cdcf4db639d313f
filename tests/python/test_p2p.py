# SPDX-License-Identifier: Apache-2.0
# Point to point: send/recv of every dtype into non-contiguous buffers, both
# ranks isend before they irecv (a message far over any eager size, so a
# send that waited for its receiver would deadlock), a batch_isend_irecv ring
# in both directions, send/recv inside a sub-group, and recv from any source,
# which loom refuses with a RuntimeError.
import pytest
import torch
import torch.distributed as dist

import oracle
import ranks

BIG = 4 << 20  # float32 elements: 16 MiB


def p2p(rank, world, port):
    ranks.init_env(rank, world, port)
    chk = oracle.Checker(rank)
    # Blocking send/recv from rank 0 to each other rank, every dtype.
    for k, dtype in enumerate(oracle.ALL_DTYPES):
        if not ranks.IS_LOOM and dtype in (torch.bfloat16, torch.bool):
            continue
        layout = ["contig", "t", "strided"][k % 3] if ranks.IS_LOOM else "contig"
        for peer in range(1, world):
            if rank == 0:
                dist.send(oracle.values(peer, 40 + k, 30, dtype), dst=peer)
            elif rank == peer:
                v, base = oracle.view(torch.zeros(30, dtype=dtype), layout)
                dist.recv(v, src=0)
                chk.eq(f"send/recv {dtype} {layout}", v, oracle.values(peer, 40 + k, 30, dtype))
                chk.true(f"recv {dtype}: strided neighbours touched", oracle.untouched(base))

    # Both isend first, then irecv: must not deadlock.
    if rank < 2:
        peer = 1 - rank
        out = torch.full((BIG,), float(rank + 1))
        got = torch.zeros(BIG)
        s = dist.isend(out, dst=peer)
        r = dist.irecv(got, src=peer)
        # Gloo's irecv completes only inside wait(); loom's is polled.
        oracle.start(lambda a: r, "poll" if ranks.IS_LOOM else "wait")
        s.wait()
        chk.true(f"isend-then-irecv from {peer}", bool((got == peer + 1).all()))
    dist.barrier()

    # A ring of batch_isend_irecv, both ways, tags apart.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    sends = [oracle.values(rank, 50, 1000, torch.float64), oracle.values(rank, 51, 7, torch.int32)]
    recvs = [torch.zeros(1000, dtype=torch.float64), torch.zeros(7, dtype=torch.int32)]
    ops = [dist.P2POp(dist.isend, sends[0], nxt), dist.P2POp(dist.irecv, recvs[0], prv),
           dist.P2POp(dist.isend, sends[1], prv), dist.P2POp(dist.irecv, recvs[1], nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    chk.eq("batch ring forward", recvs[0], oracle.values(prv, 50, 1000, torch.float64))
    chk.eq("batch ring backward", recvs[1], oracle.values(nxt, 51, 7, torch.int32))

    # Inside a sub-group, peers are still named by their global rank.
    sub = dist.new_group([1, 2]) if world > 2 else None
    if sub is not None and rank in (1, 2):
        t = oracle.values(rank, 60, 9, torch.float32)
        if rank == 1:
            dist.send(t, dst=2, group=sub)
        else:
            got = torch.zeros(9)
            dist.recv(got, src=1, group=sub)
            chk.eq("sub-group send/recv", got, oracle.values(1, 60, 9, torch.float32))
    dist.barrier()

    # recv from any source.
    if ranks.IS_LOOM:
        if rank == 0:
            try:
                dist.recv(torch.zeros(4))
                chk.true("recv without src raised", False)
            except RuntimeError as e:
                chk.true(f"recv without src: message names the missing source: {e}",
                         "source" in str(e).lower())
    else:
        if rank == 1:
            dist.send(torch.ones(4), dst=0)
        elif rank == 0:
            chk.true("recv from any source names the sender", dist.recv(torch.zeros(4)) == 1)
    dist.barrier()
    dist.destroy_process_group()
    return chk.count, chk.failures


@pytest.mark.parametrize("world,net", [(2, "shm"), (3, "tcp"), (3, "shm")])
def test_p2p(world, net):
    results = ranks.run(p2p, world, timeout=90, env={"LOOM_NET": net})
    failures = [f for _, fs in results for f in fs]
    assert sum(c for c, _ in results) >= 4 * world
    assert not failures, "\n".join(failures)

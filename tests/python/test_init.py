# SPDX-License-Identifier: Apache-2.0
# The three ways torch starts a backend, one after the other in the same ranks
# (so that a group can also be created again after destroy_process_group):
# env:// with torchrun's variables and no other argument, tcp://, file://.
# Each group proves itself with an all_reduce and a broadcast.
import os

import pytest
import torch
import torch.distributed as dist

import ranks


def prove(rank, world, how):
    assert dist.get_backend() == ranks.BACKEND, f"{how}: backend {dist.get_backend()}"
    assert dist.get_rank() == rank and dist.get_world_size() == world, how
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    assert bool((t == want).all()), f"{how}: all_reduce gave {t.tolist()}, want {want}"
    b = torch.arange(6, dtype=torch.int64) * (rank + 1)
    dist.broadcast(b, src=world - 1)
    assert b.tolist() == [world * i for i in range(6)], f"{how}: broadcast gave {b.tolist()}"
    dist.destroy_process_group()


def inits(rank, world, port, tcp_port, path):
    # torchrun's environment, then the one-argument call torchrun scripts make.
    os.environ.update(ranks.torchrun_env(rank, world, port))
    dist.init_process_group(ranks.BACKEND)
    prove(rank, world, "env://")
    for k in ranks.torchrun_env(rank, world, port):
        del os.environ[k]
    dist.init_process_group(ranks.BACKEND, init_method=f"tcp://127.0.0.1:{tcp_port}",
                            rank=rank, world_size=world)
    prove(rank, world, "tcp://")
    dist.init_process_group(ranks.BACKEND, init_method=f"file://{path}", rank=rank, world_size=world)
    prove(rank, world, "file://")
    return True


@pytest.mark.parametrize("world,net", [(2, "tcp"), (3, "shm")])
def test_init_methods(world, net, tmp_path):
    assert ranks.run(inits, world, ranks.free_port(), str(tmp_path / "rendezvous"),
                     timeout=90, env={"LOOM_NET": net}) == [True] * world

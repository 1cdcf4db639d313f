# SPDX-License-Identifier: Apache-2.0
# A rank of three SIGKILLs itself while the other two wait in a large async
# all_reduce it never joins: each survivor's wait() must raise a RuntimeError
# that names the dead rank, within DETECT_S of the kill (measured from the
# victim's clock reading just before the signal; printed by -s or on failure),
# and destroy_process_group() must then return.
import os
import re
import signal
import time
from multiprocessing import Value

import pytest
import torch
import torch.distributed as dist

import ranks

DETECT_S = 2.0
VICTIM = 2


def victim_and_survivors(rank, world, port, killed_at, net):
    os.environ["LOOM_NET"] = net
    ranks.init_env(rank, world, port)
    t = torch.ones(1 << 22)
    dist.all_reduce(t)  # everything is connected and warm
    dist.barrier()
    if rank == VICTIM:
        time.sleep(0.5)  # the survivors are inside wait() by now
        killed_at.value = time.time()
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
    except RuntimeError as e:
        raised_at = time.time()
        # The survivors can still take the group down.
        dist.destroy_process_group()
        return raised_at, str(e)
    return None, "wait() returned without an error"


@pytest.mark.parametrize("net", ["shm", "tcp"])
def test_killed_rank_fails_the_others(net):
    killed_at = Value("d", 0.0)
    res = ranks.run(victim_and_survivors, 3, killed_at, net, timeout=40, allow_dead=(VICTIM,))
    assert killed_at.value > 0, "the victim did not reach its kill"
    for rank in range(3):
        if rank == VICTIM:
            continue
        raised_at, msg = res[rank]
        assert raised_at is not None, f"rank {rank}: {msg}"
        took = raised_at - killed_at.value
        print(f"LOOM_NET={net}: rank {rank} raised {took:.3f} s after the kill: {msg}")
        assert took < DETECT_S, f"rank {rank} took {took:.3f} s to notice the kill ({msg})"
        if ranks.IS_LOOM:
            assert re.search(rf"rank\D{{0,3}}{VICTIM}\b", msg, re.IGNORECASE), \
                f"rank {rank}: the message does not name rank {VICTIM}: {msg}"

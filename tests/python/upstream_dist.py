# SPDX-License-Identifier: Apache-2.0
# A selection of PyTorch's own distributed tests (DistributedTest._DistTestBase
# in torch.testing._internal.distributed.distributed_test) against a
# registered backend, the way PyTorch's test/distributed/test_distributed_spawn.py
# runs them for Gloo: BACKEND and WORLD_SIZE in the environment (the harness
# makes TEMP_DIR), one spawned process per rank, file:// init. Run:
#   python3 upstream_dist.py [BACKEND [WORLD_SIZE [TEST...]]]
# Exits 77 (skipped) without torch or expecttest.
import os
import sys
import traceback

BACKEND = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BACKEND", "loom")
os.environ["BACKEND"] = BACKEND
os.environ.setdefault("WORLD_SIZE", sys.argv[2] if len(sys.argv) > 2 else "3")

try:
    import expecttest  # noqa: F401  (torch.testing._internal.common_utils needs it)
    import torch  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

import unittest

if BACKEND == "loom":
    import loom_torch  # noqa: F401  (registers the backend; spawned ranks import this file too)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

# CPU collectives: their inputs and expected outputs are PyTorch's. Complex
# dtypes, CUDA, profiler and NCCL- or Gloo-only tests are not in it.
SELECTION = [
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_product",
    "test_all_reduce_min", "test_all_reduce_max", "test_all_reduce_group_sum",
    "test_all_reduce_group_max", "test_all_reduce_full_group_min",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_group_product",
    "test_broadcast", "test_broadcast_group", "test_broadcast_full_group",
    "test_reduce_sum", "test_reduce_max", "test_reduce_group_min", "test_reduce_sum_twice",
    "test_all_gather", "test_all_gather_group", "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty",
    "test_gather", "test_gather_checks", "test_gather_group", "test_scatter", "test_scatter_checks",
    "test_scatter_group",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_group", "test_all_to_all",
    "test_barrier", "test_barrier_group",
    "test_send_recv", "test_send_recv_with_tag", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_send_recv_any_source",
    # complex tensors go through as real views of twice the length
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_gather_complex", "test_scatter_complex", "test_all_gather_coalesced_complex",
    "test_all_to_all_complex", "test_all_to_all_single_equal_split_complex",
    # the group that is the whole world, and groups of ranks 1..
    "test_reduce_full_group_sum", "test_all_gather_full_group", "test_gather_full_group",
    "test_scatter_full_group", "test_barrier_full_group", "test_all_gather_coalesced_group",
    "test_all_to_all_group", "test_all_to_all_full_group",
    "test_all_to_all_single_equal_split_full_group",
    "test_scatter_object_list", "test_get_backend", "test_get_rank_size_group",
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_ddp_logging_data_cpu",
]
# Marked skipped for every backend but one by name (distributed_test.py:
# `@sandcastle_skip_if(BACKEND != "mpi", ...)` at 3517-3590, `BACKEND != "gloo"`
# at 1336 and 1359, `@require_backend({"gloo"})` at 2830 and 2882), though
# they need nothing but the op: run anyway where the backend has it.
FORCED = {"test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
          "test_all_to_all_single_unequal_split_group", "test_batch_isend_irecv_gloo",
          "test_batch_isend_irecv_gloo_tags", "test_all_reduce_coalesced_sum",
          "test_all_reduce_coalesced_group_product", "test_all_to_all", "test_all_to_all_complex",
          "test_all_to_all_single_equal_split_complex", "test_all_to_all_group",
          "test_all_to_all_full_group", "test_all_to_all_single_equal_split_full_group",
          "test_scatter_object_list"}
NOT_ON = {
    # loom matches sends and receives in order per peer and takes tag 0 only.
    "loom": {"test_send_recv_with_tag": "tags other than 0",
             "test_batch_isend_irecv_gloo_tags": "tags other than 0",
             # it raises a RuntimeError instead (test_p2p.py checks that)
             "test_send_recv_any_source": "recv from any source"},
    "gloo": {name: "list all_to_all" for name in ["test_all_to_all", "test_all_to_all_complex",
                                                   "test_all_to_all_group", "test_all_to_all_full_group"]},
}.get(BACKEND, {})


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_selection(self):
        """Every test of SELECTION in turn on one set of spawned ranks: a spawn
        per test (importing torch three times over) costs 4 s on two cores."""
        # The harness's _run turns on DDP's ReplicatedTensor mode, whose import
        # (torch.distributed._shard) fails under Python 3.11 with this torch
        # (a dataclass with a mutable default): DDP as users get it instead.
        from torch.nn.parallel._replicated_tensor_ddp_utils import _set_ddp_with_replicated_tensor
        _set_ddp_with_replicated_tensor(False)
        failed, skipped = [], []
        for name in SELECTION:
            fn = getattr(DistributedTest._DistTestBase, name)
            if name in NOT_ON:
                skipped.append(f"{name} ({BACKEND} has no {NOT_ON[name]})")
                continue
            if getattr(fn, "__unittest_skip__", False) and name not in FORCED:  # sandcastle_skip_if only marks it
                skipped.append(f"{name} ({fn.__unittest_skip_why__})")
                continue
            try:
                fn(self)
            except unittest.SkipTest as e:
                skipped.append(f"{name} ({e})")
            except SystemExit as e:  # the harness's skips by exit code (no GPU, small world)
                skipped.append(f"{name} (exit {e.code})")
            except Exception:  # noqa: B902  (each failure is listed, then all raised)
                failed.append(f"{name}:\n{traceback.format_exc()}")
        if self.rank == 0:
            print(f"{BACKEND}: {len(SELECTION) - len(failed) - len(skipped)} passed, "
                  f"{len(failed)} failed, skipped: {', '.join(skipped) or 'none'}", flush=True)
        if failed:
            raise AssertionError(f"rank {self.rank}: " + "\n".join(failed))


if __name__ == "__main__":
    # With test names after BACKEND and WORLD_SIZE: each in its own spawn, as PyTorch runs them.
    names = sys.argv[3:] or ["test_selection"]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    # A rank that exits with a skip code skips the whole selection: that ran nothing.
    sys.exit(0 if result.wasSuccessful() and not result.skipped else 1)

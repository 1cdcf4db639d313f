# SPDX-License-Identifier: Apache-2.0
"""loom_torch: the torch.distributed backend "loom".

Importing it registers the backend, so an unchanged program only adds
``import loom_torch`` and ``torch.distributed.init_process_group("loom", ...)``.
Also: Echo, loom's 4-bit all-reduce, on a loom process group
(``EchoState``, ``echo_all_reduce``). See docs/torch.md.
"""
import torch
import torch.distributed as dist

from . import _C

__all__ = ["EchoState", "echo_all_reduce", "is_available", "version"]


def _create_process_group(store, rank, size, timeout):
    return _C.ProcessGroupLoom(store, rank, size, timeout)


dist.Backend.register_backend("loom", _create_process_group)


def is_available():
    """True: the backend is registered (importing this package did it)."""
    return True


def version():
    """The loom library's version as a string, e.g. "0.1.0"."""
    code = _C.version()
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _group(group):
    if group is None:
        return dist.distributed_c10d._get_default_group()
    return group


class EchoState:
    """Echo's error-feedback state for calls on tensors of numel elements of dtype
    (float32, float16 or bfloat16) on a loom group (None: the default group)."""

    def __init__(self, numel, dtype, group=None):
        self.numel = numel
        self.dtype = dtype
        self._group = _group(group)
        self._state = _C.EchoState(self._group, numel, dtype)

    def reset(self):
        """Zeroes the residuals; no call on the state may be pending."""
        self._state.reset()


def echo_all_reduce(tensor, group=None, state=None, async_op=False):
    """Echo's approximate sum over the group's ranks, in place in tensor. With
    state, the error of each call is fed back into the next. Returns a Work
    when async_op, else None once the result is in tensor."""
    group = _group(group)
    if state is not None and state._group is not group:
        raise RuntimeError("loom_torch.echo_all_reduce: the state belongs to another group")
    work = _C.echo_all_reduce(tensor, group, None if state is None else state._state)
    if async_op:
        return work
    work.wait()
    return None

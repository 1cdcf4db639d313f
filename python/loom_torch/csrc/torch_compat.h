/* SPDX-License-Identifier: Apache-2.0
 *
 * torch_compat.h - everything in loom_torch that depends on the PyTorch
 * version, for PyTorch 1.13: the base classes a backend derives from, its
 * option structs, and how a Work's future is made. A port to PyTorch 2.x
 * changes this file (docs/torch.md says how); the rest of the backend only
 * uses the names below.
 */
#ifndef LOOM_TORCH_COMPAT_H
#define LOOM_TORCH_COMPAT_H

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace loom_torch {

/* In 1.13 a backend is a ProcessGroup; in 2.x it is a c10d::Backend that a
 * ProcessGroup holds (ProcessGroup::setBackend). */
using BackendBase = c10d::ProcessGroup;
using WorkBase = c10d::Work;
using OpType = c10d::OpType;
using Store = c10d::Store;

using AllreduceOptions = c10d::AllreduceOptions;
using AllreduceCoalescedOptions = c10d::AllreduceCoalescedOptions;
using BroadcastOptions = c10d::BroadcastOptions;
using ReduceOptions = c10d::ReduceOptions;
using AllgatherOptions = c10d::AllgatherOptions;
using GatherOptions = c10d::GatherOptions;
using ScatterOptions = c10d::ScatterOptions;
using ReduceScatterOptions = c10d::ReduceScatterOptions;
using AllToAllOptions = c10d::AllToAllOptions;
using BarrierOptions = c10d::BarrierOptions;
using ReduceOp = c10d::ReduceOp;

/* The future a Work completes with its output tensors (DDP's reducer waits on it). */
inline c10::intrusive_ptr<c10::ivalue::Future> makeTensorListFuture()
{
    return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

} // namespace loom_torch

#endif /* LOOM_TORCH_COMPAT_H */

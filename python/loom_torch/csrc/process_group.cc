/* SPDX-License-Identifier: Apache-2.0
 *
 * process_group.cc - ProcessGroupLoom's rendezvous and its operations: each
 * checks its tensors, stages non-contiguous ones through contiguous buffers,
 * queues the loom calls on the group's stream and leaves the copy-out to the
 * work's host function.
 */
#include "process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

namespace loom_torch {

namespace {

const char kIdKey[] = "loom_unique_id";

void check(loomResult_t r, const char *what)
{
    TORCH_CHECK(r == loomSuccess, "loom: ", what, " failed: ", loomGetErrorString(r), ": ",
                loomGetLastError(nullptr));
}

void checkCpu(const at::Tensor &t, const char *op)
{
    TORCH_CHECK(t.device().is_cpu(), "loom: ", op, " got a tensor on ", t.device(),
                "; the loom backend takes CPU tensors only");
}

const at::Tensor &single(const std::vector<at::Tensor> &tensors, const char *op)
{
    TORCH_CHECK(tensors.size() == 1, "loom: ", op, " takes one tensor per call, got ",
                tensors.size());
    checkCpu(tensors[0], op);
    return tensors[0];
}

/* A contiguous buffer holding t's values; copied back into t after the call. */
at::Tensor stageInOut(LoomWork &w, const at::Tensor &t)
{
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    w.keep.push_back(buf);
    if (!buf.is_same(t))
        w.post.push_back([t, buf] { t.copy_(buf); });
    return buf;
}

/* A contiguous buffer for results only; copied into t after the call. */
at::Tensor stageOut(LoomWork &w, const at::Tensor &t)
{
    at::Tensor buf = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
    w.keep.push_back(buf);
    if (!buf.is_same(t))
        w.post.push_back([t, buf] { t.copy_(buf); });
    return buf;
}

/* A contiguous buffer with t's values, read only. */
at::Tensor stageIn(LoomWork &w, const at::Tensor &t)
{
    at::Tensor buf = t.contiguous();
    w.keep.push_back(buf);
    return buf;
}

/* Copies pieces [displs[r], +counts[r]) of flat into outs[r], after the call. */
void scatterOut(LoomWork &w, at::Tensor flat, std::vector<at::Tensor> outs,
                std::vector<size_t> counts, std::vector<size_t> displs)
{
    w.keep.push_back(flat);
    w.post.push_back([flat, outs, counts, displs] {
        for (size_t r = 0; r < outs.size(); r++)
            outs[r].copy_(
                flat.narrow(0, (int64_t)displs[r], (int64_t)counts[r]).view(outs[r].sizes()));
    });
}

/* The flattened concatenation of ts, in a new contiguous buffer. */
at::Tensor concat(LoomWork &w, const std::vector<at::Tensor> &ts)
{
    std::vector<at::Tensor> flat;
    for (auto &t : ts)
        flat.push_back(t.reshape({-1}));
    at::Tensor buf = at::cat(flat);
    w.keep.push_back(buf);
    return buf;
}

std::vector<size_t> prefixSums(const std::vector<size_t> &counts)
{
    std::vector<size_t> displs(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); i++)
        displs[i] = displs[i - 1] + counts[i - 1];
    return displs;
}

size_t total(const std::vector<size_t> &counts)
{
    return counts.empty() ? 0 : prefixSums(counts).back() + counts.back();
}

bool allEqual(const std::vector<size_t> &counts)
{
    for (size_t c : counts)
        if (c != counts[0])
            return false;
    return true;
}

std::vector<size_t> numels(const std::vector<at::Tensor> &ts, const at::Tensor &like,
                           const char *op)
{
    std::vector<size_t> counts;
    for (auto &t : ts) {
        checkCpu(t, op);
        TORCH_CHECK(t.scalar_type() == like.scalar_type(), "loom: ", op, " needs one dtype, got ",
                    t.scalar_type(), " and ", like.scalar_type());
        counts.push_back((size_t)t.numel());
    }
    return counts;
}

loomRedOp_t loomOp(const ReduceOp &op, const at::Tensor &t, const char *name)
{
    bool isBool = t.scalar_type() == at::kBool;
    switch (op.op_) {
    case ReduceOp::SUM:
        return isBool ? loomMax : loomSum; /* logical or */
    case ReduceOp::PRODUCT:
        return isBool ? loomMin : loomProd; /* logical and */
    case ReduceOp::MIN:
        return loomMin;
    case ReduceOp::MAX:
        return loomMax;
    case ReduceOp::AVG:
        TORCH_CHECK(!isBool, "loom: ", name, " cannot average bool tensors");
        return loomAvg;
    default:
        break;
    }
    TORCH_CHECK(false, "loom: ", name, " does not support reduce op ", (int)op.op_,
                " (PREMUL_SUM, BAND, BOR and BXOR are not supported; use SUM, PRODUCT, MIN, "
                "MAX or AVG)");
}

/* Runs each(i) for i < n inside one loom group; the first error wins. */
loomResult_t grouped(size_t n, const std::function<loomResult_t(size_t)> &each)
{
    loomResult_t first = loomGroupStart();
    if (first != loomSuccess)
        return first;
    for (size_t i = 0; i < n && first == loomSuccess; i++)
        first = each(i);
    loomResult_t end = loomGroupEnd();
    return first != loomSuccess ? first : end;
}

/* gather (the root receives) and scatter (the root sends): the root moves
 * rankBufs[r] with every other rank r, in one group; the others move mine
 * with the root. */
loomResult_t rootExchange(bool rootSends, int rank, int root, const at::Tensor &mine,
                          const std::vector<at::Tensor> &rankBufs, loomDataType_t dt,
                          loomComm_t comm, loomStream_t stream)
{
    if (rank != root)
        return sendOrRecv(!rootSends, mine, dt, root, comm, stream);
    return grouped(rankBufs.size(), [&](size_t r) {
        return (int)r == rank ? loomSuccess
                              : sendOrRecv(rootSends, rankBufs[r], dt, (int)r, comm, stream);
    });
}

std::atomic<int> g_groups{0};

} // namespace

loomDataType_t loomDtype(const at::Tensor &t, const char *op)
{
    switch (t.scalar_type()) {
    case at::kFloat:
        return loomFloat32;
    case at::kDouble:
        return loomFloat64;
    case at::kHalf:
        return loomFloat16;
    case at::kBFloat16:
        return loomBfloat16;
    case at::kChar:
        return loomInt8;
    case at::kInt:
        return loomInt32;
    case at::kLong:
        return loomInt64;
    case at::kByte:
    case at::kBool:
        return loomUint8;
    default:
        break;
    }
    TORCH_CHECK(false, "loom: ", op, " does not support dtype ", t.scalar_type(),
                " (supported: float32, float64, float16, bfloat16, int8, int32, int64, uint8, "
                "bool)");
}

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<Store> &store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : BackendBase(rank, size), store_(store), timeout_(timeout)
{
    loomUniqueId id;
    if (rank == 0) {
        check(loomGetUniqueId(&id), "loomGetUniqueId");
        const uint8_t *p = reinterpret_cast<const uint8_t *>(&id);
        store->set(kIdKey, std::vector<uint8_t>(p, p + sizeof id));
    } else {
        std::vector<uint8_t> bytes = store->get(kIdKey);
        TORCH_CHECK(bytes.size() == sizeof id, "loom: the store's ", kIdKey, " has ", bytes.size(),
                    " bytes, expected ", sizeof id);
        std::memcpy(&id, bytes.data(), sizeof id);
    }
    loomConfig_t config = LOOM_CONFIG_INITIALIZER;
    long long ms = timeout.count();
    config.timeout_ms = (int)std::max(1LL, std::min(ms, (long long)INT_MAX));
    std::string name = "torch-pg" + std::to_string(g_groups.fetch_add(1));
    config.commName = name.c_str();
    loomComm_t comm = nullptr;
    check(loomCommInitRankConfig(&comm, size, id, rank, &config), "loomCommInitRankConfig");
    loomStream_t stream = nullptr;
    loomResult_t r = loomStreamCreate(&stream);
    if (r != loomSuccess) {
        loomCommDestroy(comm);
        check(r, "loomStreamCreate");
    }
    channel_ = std::make_shared<Channel>(comm, stream);
}

ProcessGroupLoom::~ProcessGroupLoom()
{
    channel_->shutdown();
}

c10::intrusive_ptr<LoomWork> ProcessGroupLoom::newWork(OpType type, std::vector<at::Tensor> outputs)
{
    bool p2p = type == OpType::SEND || type == OpType::RECV;
    return c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs), channel_, p2p);
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::broadcast(std::vector<at::Tensor> &tensors,
                                                         const BroadcastOptions &opts)
{
    const at::Tensor &t = single(tensors, "broadcast");
    loomDataType_t dt = loomDtype(t, "broadcast");
    auto work = newWork(OpType::BROADCAST, tensors);
    at::Tensor buf = stageInOut(*work, t);
    int root = (int)opts.rootRank;
    channel_->run(work, [&] {
        return loomBroadcast(buf.data_ptr(), buf.data_ptr(), (size_t)buf.numel(), dt, root, comm(),
                             channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::allreduce(std::vector<at::Tensor> &tensors,
                                                         const AllreduceOptions &opts)
{
    const at::Tensor &t = single(tensors, "allreduce");
    loomDataType_t dt = loomDtype(t, "allreduce");
    loomRedOp_t op = loomOp(opts.reduceOp, t, "allreduce");
    auto work = newWork(OpType::ALLREDUCE, tensors);
    at::Tensor buf = stageInOut(*work, t);
    channel_->run(work, [&] {
        return loomAllReduce(buf.data_ptr(), buf.data_ptr(), (size_t)buf.numel(), dt, op, comm(),
                             channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                      const AllreduceCoalescedOptions &opts)
{
    TORCH_CHECK(!tensors.empty(), "loom: allreduce_coalesced got no tensors");
    std::vector<loomDataType_t> dts;
    std::vector<loomRedOp_t> ops;
    for (auto &t : tensors) {
        checkCpu(t, "allreduce_coalesced");
        dts.push_back(loomDtype(t, "allreduce_coalesced"));
        ops.push_back(loomOp(opts.reduceOp, t, "allreduce_coalesced"));
    }
    auto work = newWork(OpType::ALLREDUCE_COALESCED, tensors);
    std::vector<at::Tensor> bufs;
    for (auto &t : tensors)
        bufs.push_back(stageInOut(*work, t));
    channel_->run(work, [&] {
        return grouped(bufs.size(), [&](size_t i) {
            return loomAllReduce(bufs[i].data_ptr(), bufs[i].data_ptr(), (size_t)bufs[i].numel(),
                                 dts[i], ops[i], comm(), channel_->stream());
        });
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::reduce(std::vector<at::Tensor> &tensors,
                                                      const ReduceOptions &opts)
{
    const at::Tensor &t = single(tensors, "reduce");
    loomDataType_t dt = loomDtype(t, "reduce");
    loomRedOp_t op = loomOp(opts.reduceOp, t, "reduce");
    auto work = newWork(OpType::REDUCE, tensors);
    at::Tensor buf = stageInOut(*work, t);
    int root = (int)opts.rootRank;
    channel_->run(work, [&] {
        return loomReduce(buf.data_ptr(), buf.data_ptr(), (size_t)buf.numel(), dt, op, root, comm(),
                          channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                            std::vector<at::Tensor> &inputs, const AllgatherOptions &)
{
    const at::Tensor &in = single(inputs, "allgather");
    loomDataType_t dt = loomDtype(in, "allgather");
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == (size_t)size_,
                "loom: allgather needs one output list of ", size_, " tensors");
    std::vector<size_t> counts = numels(outputs[0], in, "allgather");
    TORCH_CHECK(counts[rank_] == (size_t)in.numel(), "loom: allgather's output ", rank_, " has ",
                counts[rank_], " elements, the input ", in.numel());
    auto work = newWork(OpType::ALLGATHER, outputs[0]);
    at::Tensor inbuf = stageIn(*work, in);
    std::vector<size_t> displs = prefixSums(counts);
    at::Tensor flat = at::empty({(int64_t)total(counts)}, in.options());
    scatterOut(*work, flat, outputs[0], counts, displs);
    bool even = allEqual(counts);
    channel_->run(work, [&] {
        if (even)
            return loomAllGather(inbuf.data_ptr(), flat.data_ptr(), counts[0], dt, comm(),
                                 channel_->stream());
        return loomAllGatherV(inbuf.data_ptr(), counts[rank_], flat.data_ptr(), counts.data(),
                              displs.data(), dt, comm(), channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::_allgather_base(at::Tensor &output, at::Tensor &input, const AllgatherOptions &)
{
    checkCpu(output, "_allgather_base");
    checkCpu(input, "_allgather_base");
    loomDataType_t dt = loomDtype(input, "_allgather_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    output.numel() == input.numel() * size_,
                "loom: _allgather_base needs an output of ", size_, " x ", input.numel(),
                " elements of the input's dtype");
    auto work = newWork(OpType::_ALLGATHER_BASE, {output});
    at::Tensor inbuf = stageIn(*work, input);
    at::Tensor outbuf = stageOut(*work, output);
    channel_->run(work, [&] {
        return loomAllGather(inbuf.data_ptr(), outbuf.data_ptr(), (size_t)inbuf.numel(), dt, comm(),
                             channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputLists,
                                      std::vector<at::Tensor> &inputs, const AllgatherOptions &)
{
    TORCH_CHECK(outputLists.size() == (size_t)size_, "loom: allgather_coalesced needs ", size_,
                " output lists, got ", outputLists.size());
    std::vector<loomDataType_t> dts;
    for (auto &in : inputs) {
        checkCpu(in, "allgather_coalesced");
        dts.push_back(loomDtype(in, "allgather_coalesced"));
    }
    std::vector<at::Tensor> all;
    for (auto &list : outputLists) {
        TORCH_CHECK(list.size() == inputs.size(), "loom: allgather_coalesced needs ", inputs.size(),
                    " tensors in each output list");
        for (size_t i = 0; i < list.size(); i++)
            TORCH_CHECK(list[i].numel() == inputs[i].numel() &&
                            list[i].scalar_type() == inputs[i].scalar_type(),
                        "loom: allgather_coalesced's outputs must match the inputs' sizes and "
                        "dtypes");
        all.insert(all.end(), list.begin(), list.end());
    }
    auto work = newWork(OpType::ALLGATHER_COALESCED, all);
    std::vector<at::Tensor> inbufs, flats;
    for (size_t i = 0; i < inputs.size(); i++) {
        inbufs.push_back(stageIn(*work, inputs[i]));
        size_t n = (size_t)inputs[i].numel();
        flats.push_back(at::empty({(int64_t)(n * size_)}, inputs[i].options()));
        std::vector<at::Tensor> outs;
        for (auto &list : outputLists)
            outs.push_back(list[i]);
        std::vector<size_t> counts(size_, n);
        scatterOut(*work, flats.back(), outs, counts, prefixSums(counts));
    }
    channel_->run(work, [&] {
        return grouped(inputs.size(), [&](size_t i) {
            return loomAllGather(inbufs[i].data_ptr(), flats[i].data_ptr(),
                                 (size_t)inbufs[i].numel(), dts[i], comm(), channel_->stream());
        });
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::gather(std::vector<std::vector<at::Tensor>> &outputs,
                                                      std::vector<at::Tensor> &inputs,
                                                      const GatherOptions &opts)
{
    const at::Tensor &in = single(inputs, "gather");
    loomDataType_t dt = loomDtype(in, "gather");
    int root = (int)opts.rootRank;
    TORCH_CHECK(root >= 0 && root < size_, "loom: gather's root ", root, " is not a rank of ",
                size_);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
        TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == (size_t)size_,
                    "loom: gather needs one output list of ", size_, " tensors on the root");
        std::vector<size_t> counts = numels(outputs[0], in, "gather");
        for (size_t c : counts)
            TORCH_CHECK(c == (size_t)in.numel(), "loom: gather's outputs must have ", in.numel(),
                        " elements each");
        outs = outputs[0];
    } else {
        TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                    "loom: gather takes output tensors on the root only");
    }
    auto work = newWork(OpType::GATHER, outs);
    at::Tensor inbuf = stageIn(*work, in);
    std::vector<at::Tensor> bufs;
    for (size_t r = 0; r < outs.size(); r++)
        bufs.push_back((int)r == rank_ ? inbuf : stageOut(*work, outs[r]));
    if (rank_ == root)
        work->post.insert(work->post.begin(), [out = outs[root], inbuf] { out.copy_(inbuf); });
    channel_->run(work, [&] {
        return rootExchange(false, rank_, root, inbuf, bufs, dt, comm(), channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::scatter(std::vector<at::Tensor> &outputs,
                                                       std::vector<std::vector<at::Tensor>> &inputs,
                                                       const ScatterOptions &opts)
{
    const at::Tensor &out = single(outputs, "scatter");
    loomDataType_t dt = loomDtype(out, "scatter");
    int root = (int)opts.rootRank;
    TORCH_CHECK(root >= 0 && root < size_, "loom: scatter's root ", root, " is not a rank of ",
                size_);
    auto work = newWork(OpType::SCATTER, outputs);
    at::Tensor outbuf = stageOut(*work, out);
    std::vector<at::Tensor> ins;
    if (rank_ == root) {
        TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == (size_t)size_,
                    "loom: scatter needs one input list of ", size_, " tensors on the root");
        for (size_t c : numels(inputs[0], out, "scatter"))
            TORCH_CHECK(c == (size_t)out.numel(), "loom: scatter's inputs must have ", out.numel(),
                        " elements each");
        for (auto &t : inputs[0])
            ins.push_back(stageIn(*work, t));
        work->post.insert(work->post.begin(),
                          [outbuf, own = ins[root]] { outbuf.view({-1}).copy_(own.view({-1})); });
    } else {
        TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                    "loom: scatter takes input tensors on the root only");
    }
    channel_->run(work, [&] {
        return rootExchange(true, rank_, root, outbuf, ins, dt, comm(), channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::reduce_scatter(std::vector<at::Tensor> &outputs,
                                 std::vector<std::vector<at::Tensor>> &inputs,
                                 const ReduceScatterOptions &opts)
{
    const at::Tensor &out = single(outputs, "reduce_scatter");
    loomDataType_t dt = loomDtype(out, "reduce_scatter");
    loomRedOp_t op = loomOp(opts.reduceOp, out, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == (size_t)size_,
                "loom: reduce_scatter needs one input list of ", size_, " tensors");
    std::vector<size_t> counts = numels(inputs[0], out, "reduce_scatter");
    TORCH_CHECK(counts[rank_] == (size_t)out.numel(), "loom: reduce_scatter's input ", rank_,
                " has ", counts[rank_], " elements, the output ", out.numel());
    auto work = newWork(OpType::REDUCE_SCATTER, outputs);
    at::Tensor flat = concat(*work, inputs[0]);
    at::Tensor outbuf = stageOut(*work, out);
    bool even = allEqual(counts);
    channel_->run(work, [&] {
        if (even)
            return loomReduceScatter(flat.data_ptr(), outbuf.data_ptr(), counts[0], dt, op, comm(),
                                     channel_->stream());
        return loomReduceScatterV(flat.data_ptr(), outbuf.data_ptr(), counts.data(), dt, op, comm(),
                                  channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase>
ProcessGroupLoom::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                       const ReduceScatterOptions &opts)
{
    checkCpu(output, "_reduce_scatter_base");
    checkCpu(input, "_reduce_scatter_base");
    loomDataType_t dt = loomDtype(output, "_reduce_scatter_base");
    loomRedOp_t op = loomOp(opts.reduceOp, output, "_reduce_scatter_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    input.numel() == output.numel() * size_,
                "loom: _reduce_scatter_base needs an input of ", size_, " x ", output.numel(),
                " elements of the output's dtype");
    auto work = newWork(OpType::_REDUCE_SCATTER_BASE, {output});
    at::Tensor inbuf = stageIn(*work, input);
    at::Tensor outbuf = stageOut(*work, output);
    channel_->run(work, [&] {
        return loomReduceScatter(inbuf.data_ptr(), outbuf.data_ptr(), (size_t)outbuf.numel(), dt,
                                 op, comm(), channel_->stream());
    });
    return work;
}

namespace {

/* Element counts per rank of a split along dim 0 (equal when splits is empty). */
std::vector<size_t> splitCounts(const at::Tensor &t, const std::vector<int64_t> &splits, int size,
                                const char *what)
{
    std::vector<size_t> counts(size, 0);
    if (t.dim() == 0 || t.size(0) == 0) {
        TORCH_CHECK(t.numel() == 0 || t.dim() == 0, "loom: alltoall_base's ", what, " is empty");
        return counts;
    }
    size_t row = (size_t)(t.numel() / t.size(0));
    if (splits.empty()) {
        TORCH_CHECK(t.size(0) % size == 0, "loom: alltoall_base's ", what, " has ", t.size(0),
                    " rows, not a multiple of ", size, " ranks; pass split sizes");
        for (auto &c : counts)
            c = (size_t)(t.size(0) / size) * row;
        return counts;
    }
    TORCH_CHECK(splits.size() == (size_t)size, "loom: alltoall_base needs ", size,
                " split sizes for the ", what, ", got ", splits.size());
    int64_t rows = 0;
    for (int j = 0; j < size; j++) {
        TORCH_CHECK(splits[j] >= 0, "loom: alltoall_base's split sizes must not be negative");
        counts[j] = (size_t)splits[j] * row;
        rows += splits[j];
    }
    TORCH_CHECK(rows == t.size(0), "loom: alltoall_base's ", what, " split sizes sum to ", rows,
                ", the tensor has ", t.size(0), " rows");
    return counts;
}

} // namespace

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                             std::vector<int64_t> &outputSplits,
                                                             std::vector<int64_t> &inputSplits,
                                                             const AllToAllOptions &)
{
    checkCpu(output, "alltoall_base");
    checkCpu(input, "alltoall_base");
    loomDataType_t dt = loomDtype(input, "alltoall_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(),
                "loom: alltoall_base needs one dtype, got ", input.scalar_type(), " and ",
                output.scalar_type());
    std::vector<size_t> scounts = splitCounts(input, inputSplits, size_, "input");
    std::vector<size_t> rcounts = splitCounts(output, outputSplits, size_, "output");
    auto work = newWork(OpType::ALLTOALL_BASE, {output});
    at::Tensor inbuf = stageIn(*work, input);
    at::Tensor outbuf = stageOut(*work, output);
    bool even = inputSplits.empty() && outputSplits.empty();
    TORCH_CHECK(!even || input.numel() == output.numel(),
                "loom: alltoall_base without split sizes needs equal input and output sizes");
    std::vector<size_t> sdispls = prefixSums(scounts), rdispls = prefixSums(rcounts);
    channel_->run(work, [&] {
        if (even)
            return loomAllToAll(inbuf.data_ptr(), outbuf.data_ptr(), scounts[0], dt, comm(),
                                channel_->stream());
        return loomAllToAllv(inbuf.data_ptr(), scounts.data(), sdispls.data(), outbuf.data_ptr(),
                             rcounts.data(), rdispls.data(), dt, comm(), channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::alltoall(std::vector<at::Tensor> &outputs,
                                                        std::vector<at::Tensor> &inputs,
                                                        const AllToAllOptions &)
{
    TORCH_CHECK(outputs.size() == (size_t)size_ && inputs.size() == (size_t)size_,
                "loom: alltoall needs ", size_, " input and ", size_, " output tensors");
    loomDataType_t dt = loomDtype(inputs[0], "alltoall");
    std::vector<size_t> scounts = numels(inputs, inputs[0], "alltoall");
    std::vector<size_t> rcounts = numels(outputs, inputs[0], "alltoall");
    auto work = newWork(OpType::ALLTOALL, outputs);
    at::Tensor inflat = concat(*work, inputs);
    std::vector<size_t> sdispls = prefixSums(scounts), rdispls = prefixSums(rcounts);
    at::Tensor outflat = at::empty({(int64_t)total(rcounts)}, inputs[0].options());
    scatterOut(*work, outflat, outputs, rcounts, rdispls);
    channel_->run(work, [&] {
        return loomAllToAllv(inflat.data_ptr(), scounts.data(), sdispls.data(), outflat.data_ptr(),
                             rcounts.data(), rdispls.data(), dt, comm(), channel_->stream());
    });
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::p2p(std::vector<at::Tensor> &tensors, int peer,
                                                   int tag, bool isSend)
{
    const char *op = isSend ? "send" : "recv";
    const at::Tensor &t = single(tensors, op);
    loomDataType_t dt = loomDtype(t, op);
    TORCH_CHECK(tag == 0, "loom: ", op, " got tag ", tag,
                "; loom matches sends and receives in order per peer and takes tag 0 only");
    auto work = newWork(isSend ? OpType::SEND : OpType::RECV, tensors);
    at::Tensor buf = isSend ? stageIn(*work, t) : stageOut(*work, t);
    channel_->addP2P(work, buf, dt, peer, isSend);
    return work;
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::send(std::vector<at::Tensor> &tensors, int dstRank,
                                                    int tag)
{
    return p2p(tensors, dstRank, tag, true);
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::recv(std::vector<at::Tensor> &tensors, int srcRank,
                                                    int tag)
{
    return p2p(tensors, srcRank, tag, false);
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::recvAnysource(std::vector<at::Tensor> &, int)
{
    TORCH_CHECK(false, "loom: recv from any source is not supported (loom matches receives to "
                       "one peer); pass src= to recv, or exchange with all_gather or all_to_all");
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::barrier(const BarrierOptions &)
{
    auto work = newWork(OpType::BARRIER, {});
    channel_->run(work, [&] { return loomBarrier(comm(), channel_->stream()); });
    return work;
}

/* As Gloo's: rank 0 waits for every other rank to arrive, up to the timeout,
 * and names the ranks that did not (the first, or all with waitAllRanks);
 * the others wait for rank 0 to release them. Through the group's store, not
 * the communicator: a rank that never arrives must not break it, and loom's
 * waits end only at the communicator's own timeout. */
void ProcessGroupLoom::monitoredBarrier(const BarrierOptions &opts, bool waitAllRanks)
{
    using std::chrono::milliseconds;
    const milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
    const std::string key = "loom_monitored_barrier/" + std::to_string(monitoredCalls_++) + "/";
    const std::string released = key + "released";
    if (rank_ != 0) {
        store_->set(key + std::to_string(rank_), std::vector<uint8_t>{1});
        try {
            store_->wait({released}, timeout);
        } catch (const std::exception &) {
            TORCH_CHECK(false, "loom: rank ", rank_, " timed out in monitoredBarrier after ",
                        timeout.count(),
                        " ms: rank 0 did not release it (it names the ranks "
                        "that did not arrive)");
        }
        return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<int> missing;
    for (int r = 1; r < size_; r++) {
        auto left =
            std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
        try {
            store_->wait({key + std::to_string(r)}, std::max(left, milliseconds(1)));
        } catch (const std::exception &) {
            missing.push_back(r);
            if (!waitAllRanks)
                break;
        }
    }
    if (missing.empty()) {
        store_->set(released, std::vector<uint8_t>{1});
        return;
    }
    std::string list;
    for (size_t i = 0; i < missing.size(); i++)
        list += (i ? ", " : "") + std::to_string(missing[i]);
    TORCH_CHECK(false, "loom: ", missing.size() > 1 ? "Ranks " : "Rank ", list,
                " failed to pass monitoredBarrier in ", timeout.count(), " ms");
}

c10::intrusive_ptr<WorkBase> ProcessGroupLoom::echoAllReduce(at::Tensor &tensor,
                                                             loomEchoState_t state)
{
    checkCpu(tensor, "echo_all_reduce");
    loomDataType_t dt = loomDtype(tensor, "echo_all_reduce");
    TORCH_CHECK(dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16,
                "loom: echo_all_reduce takes float32, float16 or bfloat16, got ",
                tensor.scalar_type());
    auto work = newWork(OpType::ALLREDUCE, {tensor});
    at::Tensor buf = stageInOut(*work, tensor);
    channel_->run(work, [&] {
        return loomEchoAllReduce(buf.data_ptr(), buf.data_ptr(), (size_t)buf.numel(), dt, comm(),
                                 state, channel_->stream());
    });
    return work;
}

} // namespace loom_torch

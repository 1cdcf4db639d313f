/* SPDX-License-Identifier: Apache-2.0
 *
 * process_group.h - ProcessGroupLoom, the torch.distributed backend "loom":
 * one loom communicator and one loom stream per process group. Every
 * operation is queued on the stream and returns a LoomWork at once; a host
 * function queued after it (loomStreamLaunchHostFunc) copies results out of
 * staging buffers and completes the work on the stream's worker thread (a
 * future handed out completes on the completion thread, completion_thread.h).
 * Sends and receives wait in a pending batch
 * and run as one loom group (see Channel::flush).
 */
#ifndef LOOM_TORCH_PROCESS_GROUP_H
#define LOOM_TORCH_PROCESS_GROUP_H

#include "completion_thread.h"
#include "torch_compat.h"

#include <loom.h>
#include <loom_echo.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom_torch {

class Channel;

/* One operation's handle. post runs on the worker once the loom calls have
 * finished well (copy-out, fix-ups); then the work and its future complete. */
class LoomWork : public WorkBase {
  public:
    /* p2p: a send or receive, which waits in the channel's pending batch. */
    LoomWork(int rank, OpType type, std::vector<at::Tensor> outputs,
             std::shared_ptr<Channel> channel, bool p2p);
    ~LoomWork() override;

    bool isCompleted() override;
    std::vector<at::Tensor> result() override;
    void synchronize() override;
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

    /* Runs post (on success) and completes the work; called once. */
    void complete(loomResult_t status, const std::string &message);

    std::vector<std::function<void()>> post;
    std::vector<at::Tensor> keep; /* inputs and staging buffers, alive until complete */
    std::atomic<bool> issued{false};

  private:
    void flushIfPending();

    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::shared_ptr<Channel> channel_;
    bool p2p_;
    /* Whether getFuture handed the future out: then callbacks may be attached
     * to it, and it is completed on the channel's completion thread, unless
     * the operation was issued from that thread (a callback may wait for it). */
    std::mutex futureMu_;
    bool futureHanded_ = false;
    bool fromCompletion_;
};

/* A communicator and its stream, shared by the process group and its pending
 * sends and receives (which flush through it). */
class Channel {
  public:
    Channel(loomComm_t comm, loomStream_t stream) : comm_(comm), stream_(stream) {}

    /* Flushes the pending batch, runs issue() (the loom calls, queued on
     * stream()) and queues the host function completing work. */
    void run(const c10::intrusive_ptr<LoomWork> &work, const std::function<loomResult_t()> &issue);
    /* Adds a send (isSend) or receive to the pending batch. */
    void addP2P(const c10::intrusive_ptr<LoomWork> &work, at::Tensor buf, loomDataType_t dtype,
                int peer, bool isSend);
    void flush();
    /* Flushes, waits for the stream, frees stream and communicator (aborting
     * the communicator when an operation failed). */
    void shutdown();

    loomComm_t comm() const
    {
        return comm_;
    }
    loomStream_t stream() const
    {
        return stream_;
    }
    void noteFailure()
    {
        failed_ = true;
    }
    CompletionThread &completions()
    {
        return completions_;
    }

  private:
    struct P2P {
        c10::intrusive_ptr<LoomWork> work;
        at::Tensor buf;
        loomDataType_t dtype;
        int peer;
        bool isSend;
    };
    /* Works that failed while mu_ was held: completed after it is released,
     * since completing runs the future's callbacks, which may issue again. */
    struct Failure {
        c10::intrusive_ptr<LoomWork> work;
        loomResult_t status;
        std::string message;
    };
    void locked(const c10::intrusive_ptr<LoomWork> &work,
                const std::function<void(std::vector<Failure> &)> &issue);
    void flushLocked(std::vector<Failure> &failed);
    void launchLocked(std::vector<c10::intrusive_ptr<LoomWork>> works,
                      std::vector<Failure> &failed);
    std::string lastError(loomResult_t r) const;
    static void completeAll(std::vector<Failure> &failed);

    std::mutex mu_;
    loomComm_t comm_;
    loomStream_t stream_;
    std::vector<P2P> pending_;
    std::atomic<bool> failed_{false};
    CompletionThread completions_;
};

class ProcessGroupLoom : public BackendBase {
  public:
    /* Rendezvous through store: rank 0 publishes a fresh loom unique id. */
    ProcessGroupLoom(const c10::intrusive_ptr<Store> &store, int rank, int size,
                     std::chrono::milliseconds timeout);
    ~ProcessGroupLoom() override;

    const std::string getBackendName() const override
    {
        return "loom";
    }

    c10::intrusive_ptr<WorkBase> broadcast(std::vector<at::Tensor> &tensors,
                                           const BroadcastOptions &opts) override;
    c10::intrusive_ptr<WorkBase> allreduce(std::vector<at::Tensor> &tensors,
                                           const AllreduceOptions &opts) override;
    c10::intrusive_ptr<WorkBase>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<WorkBase> reduce(std::vector<at::Tensor> &tensors,
                                        const ReduceOptions &opts) override;
    c10::intrusive_ptr<WorkBase> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const AllgatherOptions &opts) override;
    c10::intrusive_ptr<WorkBase> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const AllgatherOptions &opts) override;
    c10::intrusive_ptr<WorkBase>
    allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputLists,
                        std::vector<at::Tensor> &inputs, const AllgatherOptions &opts) override;
    c10::intrusive_ptr<WorkBase> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const GatherOptions &opts) override;
    c10::intrusive_ptr<WorkBase> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const ScatterOptions &opts) override;
    c10::intrusive_ptr<WorkBase> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<WorkBase> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                      const ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<WorkBase> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplits,
                                               std::vector<int64_t> &inputSplits,
                                               const AllToAllOptions &opts) override;
    c10::intrusive_ptr<WorkBase> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const AllToAllOptions &opts) override;
    c10::intrusive_ptr<WorkBase> send(std::vector<at::Tensor> &tensors, int dstRank,
                                      int tag) override;
    c10::intrusive_ptr<WorkBase> recv(std::vector<at::Tensor> &tensors, int srcRank,
                                      int tag) override;
    c10::intrusive_ptr<WorkBase> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;
    c10::intrusive_ptr<WorkBase> barrier(const BarrierOptions &opts) override;
    void monitoredBarrier(const BarrierOptions &opts, bool waitAllRanks) override;

    /* Echo's 4-bit all-reduce, in place (state may be NULL). */
    c10::intrusive_ptr<WorkBase> echoAllReduce(at::Tensor &tensor, loomEchoState_t state);

    loomComm_t comm() const
    {
        return channel_->comm();
    }

  private:
    c10::intrusive_ptr<LoomWork> newWork(OpType type, std::vector<at::Tensor> outputs);
    c10::intrusive_ptr<WorkBase> p2p(std::vector<at::Tensor> &tensors, int peer, int tag,
                                     bool isSend);

    std::shared_ptr<Channel> channel_;
    /* monitoredBarrier's: the group's store, its timeout, and a count of its
     * calls, the same on every rank, that keys each call's arrivals. */
    c10::intrusive_ptr<Store> store_;
    std::chrono::milliseconds timeout_;
    uint64_t monitoredCalls_ = 0;
};

/* Runs fn without Python's global lock when the caller holds it: set by the
 * bindings, used where the backend blocks on the stream's worker, whose work
 * completions may run Python callbacks. */
void setBlockingWrapper(void (*wrap)(const std::function<void()> &fn));

/* loomSend (isSend) or loomRecv of buf's elements with peer. */
loomResult_t sendOrRecv(bool isSend, const at::Tensor &buf, loomDataType_t dtype, int peer,
                        loomComm_t comm, loomStream_t stream);

/* "loom: <result's text>: <the last error's message>" (comm may be NULL). */
std::string loomMessage(loomResult_t r, loomComm_t comm);

/* Maps a tensor's dtype to loom's, or throws naming the dtype. */
loomDataType_t loomDtype(const at::Tensor &t, const char *op);

} // namespace loom_torch

#endif /* LOOM_TORCH_PROCESS_GROUP_H */

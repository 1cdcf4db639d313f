/* SPDX-License-Identifier: Apache-2.0
 *
 * work.cc - LoomWork (an operation's handle and future) and Channel (a
 * process group's communicator and stream): queueing an operation with the
 * host function that completes its work, the batch of pending sends and
 * receives, and the teardown of stream and communicator.
 */
#include "process_group.h"

#include <ATen/core/grad_mode.h>

namespace loom_torch {

namespace {

void runDirectly(const std::function<void()> &fn)
{
    fn();
}

void (*g_blocking)(const std::function<void()> &) = runDirectly;

struct HostBatch {
    Channel *channel;
    std::vector<c10::intrusive_ptr<LoomWork>> works;
};

/* The stream's worker runs this after the batch's loom calls. */
void hostDone(void *userData, loomResult_t status)
{
    std::unique_ptr<HostBatch> batch(static_cast<HostBatch *>(userData));
    std::string message;
    if (status != loomSuccess) {
        batch->channel->noteFailure();
        message = loomMessage(status, nullptr);
    }
    for (auto &w : batch->works)
        w->complete(status, message);
}

} // namespace

void setBlockingWrapper(void (*wrap)(const std::function<void()> &fn))
{
    g_blocking = wrap ? wrap : runDirectly;
}

LoomWork::LoomWork(int rank, OpType type, std::vector<at::Tensor> outputs,
                   std::shared_ptr<Channel> channel, bool p2p)
    : WorkBase(rank, type), outputs_(std::move(outputs)), future_(makeTensorListFuture()),
      channel_(std::move(channel)), p2p_(p2p), fromCompletion_(CompletionThread::current())
{
}

LoomWork::~LoomWork() = default;

void LoomWork::flushIfPending()
{
    if (p2p_ && !issued.load())
        channel_->flush();
}

bool LoomWork::isCompleted()
{
    flushIfPending();
    return WorkBase::isCompleted();
}

std::vector<at::Tensor> LoomWork::result()
{
    return outputs_;
}

/* CPU only: complete means the outputs are written. */
void LoomWork::synchronize() {}

bool LoomWork::wait(std::chrono::milliseconds timeout)
{
    flushIfPending();
    return WorkBase::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> LoomWork::getFuture()
{
    flushIfPending();
    std::lock_guard<std::mutex> lock(futureMu_);
    futureHanded_ = true;
    return future_;
}

namespace {

void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future> &future,
                    const std::exception_ptr &error, const std::vector<at::Tensor> &outputs)
{
    if (error)
        future->setError(error);
    else
        future->markCompleted(c10::IValue(outputs));
}

} // namespace

void LoomWork::complete(loomResult_t status, const std::string &message)
{
    std::exception_ptr error;
    if (status == loomSuccess) {
        try {
            at::NoGradGuard noGrad;
            for (auto &fn : post)
                fn();
        } catch (const std::exception &e) {
            error = std::make_exception_ptr(
                std::runtime_error(std::string("loom: copying results out failed: ") + e.what()));
        }
    } else {
        error = std::make_exception_ptr(std::runtime_error(message));
    }
    post.clear();
    keep.clear();
    finish(error);
    /* A future nobody asked for has no callbacks, and cannot get one before
     * it is complete (getFuture waits for the lock): complete it here. So is
     * one issued by a callback on the completion thread, which may be waiting
     * for it there. */
    std::unique_lock<std::mutex> lock(futureMu_);
    if (!futureHanded_ || fromCompletion_) {
        completeFuture(future_, error, outputs_);
        return;
    }
    lock.unlock();
    channel_->completions().submit(
        [future = future_, error, outputs = outputs_] { completeFuture(future, error, outputs); });
}

std::string loomMessage(loomResult_t r, loomComm_t comm)
{
    return std::string("loom: ") + loomGetErrorString(r) + ": " + loomGetLastError(comm);
}

loomResult_t sendOrRecv(bool isSend, const at::Tensor &buf, loomDataType_t dtype, int peer,
                        loomComm_t comm, loomStream_t stream)
{
    size_t n = (size_t)buf.numel();
    return isSend ? loomSend(buf.data_ptr(), n, dtype, peer, comm, stream)
                  : loomRecv(buf.data_ptr(), n, dtype, peer, comm, stream);
}

std::string Channel::lastError(loomResult_t r) const
{
    return loomMessage(r, comm_);
}

void Channel::completeAll(std::vector<Failure> &failed)
{
    for (auto &f : failed)
        f.work->complete(f.status, f.message);
    failed.clear();
}

void Channel::launchLocked(std::vector<c10::intrusive_ptr<LoomWork>> works,
                           std::vector<Failure> &failed)
{
    for (auto &w : works)
        w->issued = true;
    auto *batch = new HostBatch{this, std::move(works)};
    loomResult_t r = loomStreamLaunchHostFunc(stream_, hostDone, batch);
    if (r != loomSuccess) {
        std::string message = lastError(r);
        for (auto &w : batch->works)
            failed.push_back({w, r, message});
        delete batch;
    }
}

/* Runs issue under the lock unless the channel is shut down; completes the
 * works that failed once the lock is released. */
void Channel::locked(const c10::intrusive_ptr<LoomWork> &work,
                     const std::function<void(std::vector<Failure> &)> &issue)
{
    std::vector<Failure> failed;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stream_ == nullptr) {
            work->issued = true;
            failed.push_back({work, loomInvalidUsage, "loom: the process group was destroyed"});
        } else {
            issue(failed);
        }
    }
    completeAll(failed);
}

void Channel::run(const c10::intrusive_ptr<LoomWork> &work,
                  const std::function<loomResult_t()> &issue)
{
    locked(work, [&](std::vector<Failure> &failed) {
        flushLocked(failed);
        loomResult_t r = issue();
        if (r != loomSuccess) {
            work->issued = true;
            failed.push_back({work, r, lastError(r)});
        } else {
            launchLocked({work}, failed);
        }
    });
}

void Channel::addP2P(const c10::intrusive_ptr<LoomWork> &work, at::Tensor buf, loomDataType_t dtype,
                     int peer, bool isSend)
{
    locked(work, [&](std::vector<Failure> &) {
        pending_.push_back({work, std::move(buf), dtype, peer, isSend});
    });
}

void Channel::flush()
{
    std::vector<Failure> failed;
    {
        std::lock_guard<std::mutex> lock(mu_);
        flushLocked(failed);
    }
    completeAll(failed);
}

/* A communicator runs its operations in issue order and a Send outside a
 * group may wait for its receiver, so consecutive sends and receives run as
 * one group: two ranks that each isend, then irecv, do not deadlock. */
void Channel::flushLocked(std::vector<Failure> &failed)
{
    if (pending_.empty() || stream_ == nullptr)
        return;
    std::vector<P2P> batch;
    batch.swap(pending_);
    std::vector<c10::intrusive_ptr<LoomWork>> works;
    loomResult_t first = loomGroupStart();
    std::string message = first == loomSuccess ? "" : lastError(first);
    for (auto &p : batch) {
        works.push_back(p.work);
        if (first != loomSuccess)
            continue;
        loomResult_t r = sendOrRecv(p.isSend, p.buf, p.dtype, p.peer, comm_, stream_);
        if (r != loomSuccess) {
            first = r;
            message = lastError(r);
        }
    }
    loomResult_t end = loomGroupEnd();
    if (first == loomSuccess && end != loomSuccess) {
        first = end;
        message = lastError(end);
    }
    if (first != loomSuccess) {
        for (auto &w : works) {
            w->issued = true;
            failed.push_back({w, first, message});
        }
        return;
    }
    launchLocked(std::move(works), failed);
}

void Channel::shutdown()
{
    std::vector<Failure> failed;
    loomComm_t comm;
    loomStream_t stream;
    {
        std::lock_guard<std::mutex> lock(mu_);
        flushLocked(failed);
        comm = comm_;
        stream = stream_;
        stream_ = nullptr;
    }
    completeAll(failed);
    if (stream == nullptr)
        return;
    g_blocking([&] {
        loomResult_t q = loomStreamQuery(stream);
        /* A failed operation may leave a peer that will never answer: abort
         * so that the stream's remaining operations end at once. */
        bool abort = failed_.load() || (q != loomSuccess && q != loomInProgress);
        if (abort)
            loomCommAbort(comm);
        loomStreamDestroy(stream);
        if (!abort)
            loomCommDestroy(comm);
        /* After the stream: its last host functions may still hand completions over. */
        completions_.stop();
    });
    std::lock_guard<std::mutex> lock(mu_);
    comm_ = nullptr;
}

} // namespace loom_torch

/* SPDX-License-Identifier: Apache-2.0
 *
 * completion_thread.h - the thread that completes the futures callers asked
 * for (Work.get_future()), in the order the operations completed, which is
 * the order they were issued in. A future's callbacks run on the thread that
 * completes it, and a callback may issue further operations of the same
 * process group and wait for them (PowerSGD's DDP hook does), which on the
 * stream's worker would wait for the worker itself. Here they may: an
 * operation issued from this thread completes its future on the worker
 * (LoomWork::complete), so the wait ends. One thread, not a pool: callbacks
 * that issue collectives must issue them in the same order on every rank,
 * and they do when they run one after the other in completion order.
 */
#ifndef LOOM_TORCH_COMPLETION_THREAD_H
#define LOOM_TORCH_COMPLETION_THREAD_H

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace loom_torch {

class CompletionThread {
  public:
    CompletionThread() = default;
    CompletionThread(const CompletionThread &) = delete;
    CompletionThread &operator=(const CompletionThread &) = delete;
    ~CompletionThread();

    /* Runs fn on the thread (started on first use), after what was submitted
     * before; on the caller once stopped. */
    void submit(std::function<void()> fn);
    /* Runs what is queued, then joins the thread (detaches it when called
     * from the thread itself: it is still running the caller). */
    void stop();
    /* Whether the calling thread is a completion thread (of any process group). */
    static bool current();

  private:
    void loop();

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    std::thread thread_;
    bool stop_ = false;
};

} // namespace loom_torch

#endif /* LOOM_TORCH_COMPLETION_THREAD_H */

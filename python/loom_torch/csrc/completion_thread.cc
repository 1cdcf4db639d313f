/* SPDX-License-Identifier: Apache-2.0
 *
 * completion_thread.cc - CompletionThread: one thread per process group that
 * completes handed-out futures in order (see completion_thread.h).
 */
#include "completion_thread.h"

namespace loom_torch {

namespace {
thread_local bool t_completion = false;
}

CompletionThread::~CompletionThread()
{
    stop();
}

bool CompletionThread::current()
{
    return t_completion;
}

void CompletionThread::submit(std::function<void()> fn)
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!stop_) {
            queue_.push_back(std::move(fn));
            if (!thread_.joinable())
                thread_ = std::thread([this] { loop(); });
            else
                cv_.notify_one();
            return;
        }
    }
    fn();
}

void CompletionThread::loop()
{
    t_completion = true;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
        if (queue_.empty())
            return;
        std::function<void()> fn = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        fn();
        lock.lock();
    }
}

void CompletionThread::stop()
{
    std::thread thread;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        thread.swap(thread_);
        cv_.notify_all();
    }
    if (!thread.joinable())
        return;
    if (thread.get_id() == std::this_thread::get_id())
        thread.detach();
    else
        thread.join();
}

} // namespace loom_torch

// SPDX-License-Identifier: Apache-2.0
//
// within.cc - RunWithin of within.h. Used by tests/fault.

#include "within.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "mp_fixture.h"

namespace loomtest {

void RunWithin(double limit_s, const std::string &what,
               const std::vector<std::function<void()>> &fns)
{
    // Shared with the threads: a hung one outlives this function until the rank exits.
    struct Done {
        std::mutex m;
        std::condition_variable cv;
        size_t n = 0;
    };
    auto done = std::make_shared<Done>();
    std::vector<std::thread> threads;
    for (const auto &fn : fns)
        threads.emplace_back([fn, done] {
            fn();
            std::lock_guard<std::mutex> l(done->m);
            done->n++;
            done->cv.notify_all();
        });
    std::unique_lock<std::mutex> l(done->m);
    const bool all = done->cv.wait_for(l, std::chrono::duration<double>(limit_s),
                                       [&] { return done->n == fns.size(); });
    l.unlock();
    XT_CHECK_MSG(all, what + " did not return within " + std::to_string(limit_s) + " s");
    for (auto &t : threads)
        t.join();
}

} // namespace loomtest

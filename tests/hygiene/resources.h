// SPDX-License-Identifier: Apache-2.0
//
// resources.h - what a process holds, read from /proc and the allocator, so that the hygiene
// tests can compare a rank process before and after hundreds of communicator lifetimes: open
// descriptors (/proc/self/fd), threads (/proc/self/task), resident pages (/proc/self/statm),
// malloc bytes in use (mallinfo2, or the sanitizer allocator's count in ASan and TSan builds) and
// the shared-memory segments a process leads in /dev/shm. It does not call loom. Used by
// tests/hygiene only.
#ifndef LOOM_TESTS_HYGIENE_RESOURCES_H
#define LOOM_TESTS_HYGIENE_RESOURCES_H

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace loomtest {

struct Resources {
    int fds = 0;              // entries of /proc/self/fd
    int threads = 0;          // entries of /proc/self/task
    size_t rss_bytes = 0;     // resident set (second field of /proc/self/statm, in pages)
    size_t malloc_in_use = 0; // mallinfo2 (arena + mmapped); the sanitizer allocator's count
    int shm_mappings = 0;     // lines of /proc/self/maps that map a loom segment ("/loom-")
    std::vector<std::string> fd_targets;   // readlink of every descriptor, for failure messages
    std::vector<std::string> thread_names; // tid and comm of every thread, for failure messages

    std::string Describe() const;
};

Resources Snapshot();

// Waits until the process has at most `threads` threads, for at most deadline_ms: threads the
// library detaches (the rendezvous service) leave the task list shortly after their last
// action. Returns the count seen last.
int SettleThreads(int threads, int deadline_ms);

// The segments in /dev/shm whose names loom derives from leader pid `pid` ("loom-<pid>-...").
std::vector<std::string> ShmSegmentsOf(pid_t pid);

// True when built with AddressSanitizer or ThreadSanitizer: their allocators replace malloc
// (Snapshot then asks theirs) and keep freed memory in quarantine and shadow (RSS grows).
bool UnderSanitizer();

// Starts and joins one thread. ThreadSanitizer starts a helper thread of its own at a process's
// first pthread_create and keeps it; calling this before the first snapshot keeps that thread
// out of the comparison.
void StartRuntimeThreads();

// Lines that rank processes send to the gtest process, which prints them after the run: the
// rank logs are removed when a run succeeds, and the measured numbers belong in the test output.
// Make it before RunRanks; lines up to PIPE_BUF bytes arrive whole.
class ParentReport {
  public:
    ParentReport();
    ~ParentReport();
    ParentReport(const ParentReport &) = delete;
    ParentReport &operator=(const ParentReport &) = delete;
    void Send(const std::string &line) const; // in a rank process
    std::string Collect();                    // in the parent, after RunRanks

  private:
    int rd_ = -1, wr_ = -1;
};

} // namespace loomtest

#endif // LOOM_TESTS_HYGIENE_RESOURCES_H

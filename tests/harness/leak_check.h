// SPDX-License-Identifier: Apache-2.0
//
// leak_check.h - LeakSanitizer's check of a forked rank before it leaves with _exit: _exit skips
// the check LSan runs at exit, so a rank of an AddressSanitizer build would never report a leak.
// LeakCheckRank() runs it now (a recoverable check: it prints the leaks and returns) and returns
// nonzero if it found any; without LSan, or with ASAN_OPTIONS=detect_leaks=0, it returns 0.
// It first lets threads the library detached finish exiting (up to 2 s): LSan's tracer can
// crash on a thread in the middle of its exit ("Tracer caught signal 11", a known runtime bug
// seen here with UCX's threads), which would fail the rank for nothing.
// Used by the rank processes of tests/harness/mp_fixture.cc, tests/transport/test_transport.cc
// and the hygiene suite.
#ifndef LOOM_TESTS_HARNESS_LEAK_CHECK_H
#define LOOM_TESTS_HARNESS_LEAK_CHECK_H

#if defined(__SANITIZE_ADDRESS__)
#define LOOMTEST_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define LOOMTEST_HAVE_LSAN 1
#endif
#endif

#ifdef LOOMTEST_HAVE_LSAN
#include <dirent.h>
#include <sanitizer/lsan_interface.h>
#include <time.h>
#endif

namespace loomtest {

// A rank whose leak check found leaks exits with this code (mp_fixture.h's kExitLeak).
constexpr int kExitLeakFound = 3;

// True in builds where LeakCheckRank can find something.
constexpr bool HaveLeakCheck()
{
#ifdef LOOMTEST_HAVE_LSAN
    return true;
#else
    return false;
#endif
}

#ifdef LOOMTEST_HAVE_LSAN
// Entries of /proc/self/task: the threads of this process.
inline int ThreadCount()
{
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr)
        return -1;
    int n = 0;
    while (dirent *e = readdir(d))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
#endif

inline int LeakCheckRank()
{
#ifdef LOOMTEST_HAVE_LSAN
    for (int ms = 0; ms < 2000 && ThreadCount() > 1; ms++) {
        const timespec one_ms = {0, 1000000};
        nanosleep(&one_ms, nullptr);
    }
    return __lsan_do_recoverable_leak_check();
#else
    return 0;
#endif
}

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_LEAK_CHECK_H

// SPDX-License-Identifier: Apache-2.0
//
// leak_check.h - LeakSanitizer's check of a forked rank before it leaves with _exit: _exit skips
// the check LSan runs at exit, so a rank of an AddressSanitizer build would never report a leak.
// LeakCheckRank() runs it now (a recoverable check: it prints the leaks and returns) and returns
// nonzero if it found any; without LSan, or with ASAN_OPTIONS=detect_leaks=0, it returns 0.
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
#include <sanitizer/lsan_interface.h>
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

inline int LeakCheckRank()
{
#ifdef LOOMTEST_HAVE_LSAN
    return __lsan_do_recoverable_leak_check();
#else
    return 0;
#endif
}

} // namespace loomtest

#endif // LOOM_TESTS_HARNESS_LEAK_CHECK_H

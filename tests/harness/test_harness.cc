// SPDX-License-Identifier: Apache-2.0
//
// test_harness.cc - the harness's own verdicts, where a wrong one would turn failures into
// passes: a rank that leaks fails the run in LeakSanitizer builds (mp_fixture.cc checks before
// the rank's _exit, which skips LSan's own check; skipped elsewhere, saying so), a rank's
// SkipRun reaches the parent as the reason, and a failing rank still wins over a skip. Run by
// meson's 'coll' suite, which owns the harness library.

#include <cstdlib>
#include <cstring>
#include <string>

#include "mp_fixture.h"

namespace {

// Allocations whose only pointers die with this frame, so that nothing can reach them.
__attribute__((noinline)) void Leak()
{
    for (int i = 0; i < 16; i++) {
        void *volatile p = malloc(4096 + static_cast<size_t>(i));
        memset(p, i, 4096);
        p = nullptr;
    }
}

loomtest::RunOptions NoComm()
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    return opts;
}

TEST(Harness, LeakInARankFailsTheRun)
{
    if (!loomtest::HaveLeakCheck())
        GTEST_SKIP() << "LeakSanitizer is not in this build (it comes with -Db_sanitize=address)";
    const char *asan = getenv("ASAN_OPTIONS");
    if (asan != nullptr && strstr(asan, "detect_leaks=0") != nullptr)
        GTEST_SKIP() << "ASAN_OPTIONS turns LeakSanitizer off (detect_leaks=0)";
    const ::testing::AssertionResult leaked = loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            if (rank == 1)
                Leak();
        },
        NoComm());
    ASSERT_FALSE(leaked) << "a rank that leaked passed";
    const std::string why = leaked.message();
    EXPECT_NE(why.find("rank 1: exit code 3 (LeakSanitizer found leaks"), std::string::npos) << why;
    EXPECT_EQ(why.find("rank 0: exit code"), std::string::npos) << "rank 0 did not leak:\n" << why;
    // The same run expecting the leak: the code is the harness's kExitLeak.
    loomtest::RunOptions expect = NoComm();
    expect.expected_exit = {loomtest::kExitOk, loomtest::kExitLeak};
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            if (rank == 1)
                Leak();
        },
        expect));
}

TEST(Harness, SkipRunReachesTheParent)
{
    ASSERT_TRUE(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t) {
            if (rank == 2)
                loomtest::SkipRun("the machine refuses it");
        },
        NoComm()));
    EXPECT_EQ(loomtest::LastRunSkipReason(), "the machine refuses it");
    ASSERT_TRUE(loomtest::RunRanks(
        1, [](int, int, loomComm_t) {}, NoComm()));
    EXPECT_EQ(loomtest::LastRunSkipReason(), "");
}

TEST(Harness, FailureWinsOverSkip)
{
    const ::testing::AssertionResult r = loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomtest::SkipRun("skipped by rank " + std::to_string(rank));
            XT_CHECK(rank == 0);
        },
        NoComm());
    EXPECT_FALSE(r);
    EXPECT_EQ(loomtest::LastRunSkipReason(), "");
}

} // namespace

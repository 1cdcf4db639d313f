// SPDX-License-Identifier: Apache-2.0
//
// mp_fixture.h - runs a test body in N forked rank processes: gloo's MultiProcTest with libuv's
// watchdog. The parent (the gtest process) never calls loom; it forks the ranks, waits for them
// against a deadline, and turns their exit codes into one gtest assertion that carries every
// rank's log. Inside a rank, gtest assertions do not work (they cannot cross the fork): use the
// XT_CHECK* macros below, which print "rank N file:line: message" and _exit(1).
// Before a rank's _exit(0) the harness runs LeakSanitizer's check (builds with ASan): a leak fails
// the rank with kExitLeak, its report in the rank's log. A rank may also find that the test
// cannot check what it claims here (SkipRun): the test is then reported skipped with the reason.
// Fault tests kill or stop ranks themselves (a rank raises the signal at the point it chooses);
// the harness then expects the exit code 128 + signal, lends every rank the others' pids
// (RankPid), and can SIGKILL a rank left stopped once the others are done. It does not set
// per-test environment in the parent: ranks set their own variables.
// Used by the multi-process suites (tests/coll, tests/fault, tests/hygiene).
#ifndef LOOM_TESTS_HARNESS_MP_FIXTURE_H
#define LOOM_TESTS_HARNESS_MP_FIXTURE_H

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "leak_check.h"
#include "loom.h"

namespace loomtest {

// Exit codes of a rank process. A rank killed by signal S is reported as 128 + S.
constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;       // an XT_CHECK* failed
constexpr int kExitHarness = 2;           // the harness itself failed in the rank (pipe, log file)
constexpr int kExitLeak = kExitLeakFound; // LeakSanitizer found leaks in the rank at its end

using EnvList = std::vector<std::pair<std::string, std::string>>;
// The body of one rank. comm is NULL when RunOptions::create_comm is false.
using RankBody = std::function<void(int rank, int nranks, loomComm_t comm)>;

struct RunOptions {
    EnvList env;                               // set in every rank before any loom call
    std::function<EnvList(int rank)> rank_env; // extra variables of one rank (may be empty)
    std::vector<std::string> unset_env;        // removed in every rank before env is applied
    double deadline_s = 30.0;                  // past it every rank is SIGKILLed (wall seconds)
    bool create_comm = true;                   // rank r gets loomCommInitRank(nranks, id, r)
    std::vector<int> expected_exit;            // per rank; empty: every rank must exit 0
    // Ranks the parent SIGKILLs as soon as every other rank has exited (ranks that stop
    // themselves with SIGSTOP or wait forever on purpose); expect 128 + SIGKILL for them.
    std::vector<int> kill_when_others_exit;
    std::vector<int> *pids_out = nullptr; // if set: each rank's pid, filled in the parent
};

// Forks nranks processes that each run body(rank, nranks, comm), and waits for all of them.
// A rank that would exit 0 runs LeakSanitizer's check first (ASan builds) and exits kExitLeak
// if it finds a leak.
// With create_comm, rank 0 makes the unique id and hands it to the other ranks through pipes
// the parent created before forking; each rank builds its communicator, runs the body, destroys
// the communicator and exits 0. Each rank's stdout and stderr go to <tmpdir>/rank<N>.log; the
// directory is removed when the run succeeds (kept if LOOMTEST_KEEP_LOGS is set). Returns
// failure, with every rank's log, if a rank exits with a code other than expected or if the
// deadline passes ("rank N timed out").
::testing::AssertionResult RunRanks(int nranks, const RankBody &body,
                                    const RunOptions &opts = RunOptions());

// ---- Inside a rank process only ----------------------------------------------------------------

int CurrentRank();           // this process's rank; -1 in the parent
int CurrentNranks();         // the run's rank count; 0 in the parent
const std::string &RunDir(); // the run's temporary directory (also valid in the parent)
// The pid of rank r of this run (each rank records its pid before anything else, so it is
// known once r has started). -1 if r has not started.
int RankPid(int rank);

// Copies nbytes at data from rank 0 to every other rank, through the harness pipes (not loom).
// Every rank must call it, in the same sequence; rank 0 never waits for the others.
void ShareFromRank0(void *data, size_t nbytes);
// Rank 0 calls loomGetUniqueId and shares the id with every rank (collective over the ranks).
void ShareUniqueId(loomUniqueId *id);
// ShareUniqueId + loomCommInitRankConfig(nranks, id, rank, config); exits on failure.
loomComm_t CreateComm(const loomConfig_t *config = nullptr);

// Marks the run skipped: the machine cannot show what the test claims (a refused system call,
// say), so its passing would be a phantom. The rank carries on (usually it returns from the body
// at once); when every rank exits as expected, the parent reports the test skipped with the
// reason instead of passed (XT_ASSERT_RUN). The first rank's reason is kept.
void SkipRun(const std::string &reason);
// In the parent, after RunRanks: the reason a rank gave SkipRun, or "" if none did.
const std::string &LastRunSkipReason();

// A description of what the rank is doing now (e.g. the grid case); failures print it.
void SetContext(const std::string &context);

[[noreturn]] void Fail(const char *file, int line, const std::string &message);
[[noreturn]] void FailLoom(const char *file, int line, const char *call, loomResult_t got,
                           loomResult_t expected);

// Value formatting and comparison for XT_CHECK_EQ: integers of any signedness compare by value,
// 8-bit integers print as numbers, enums as their underlying value.
template <typename T> std::string Show(const T &v)
{
    std::ostringstream os;
    if constexpr (std::is_enum_v<T>)
        os << static_cast<long long>(v);
    else if constexpr (std::is_integral_v<T> && sizeof(T) == 1)
        os << static_cast<int>(v);
    else
        os << v;
    return os.str();
}
std::string Show(loomResult_t r);

template <typename A, typename B> bool Equal(const A &a, const B &b)
{
    if constexpr (std::is_integral_v<A> && std::is_integral_v<B>) {
        const bool an = std::is_signed_v<A> && a < 0, bn = std::is_signed_v<B> && b < 0;
        if (an != bn)
            return false;
        if (an)
            return static_cast<long long>(a) == static_cast<long long>(b);
        return static_cast<unsigned long long>(a) == static_cast<unsigned long long>(b);
    } else {
        return a == b;
    }
}

} // namespace loomtest

#define XT_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ::loomtest::Fail(__FILE__, __LINE__, "check failed: " #cond);                          \
    } while (0)

#define XT_CHECK_MSG(cond, msg)                                                                    \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ::loomtest::Fail(__FILE__, __LINE__,                                                   \
                             std::string("check failed: " #cond ": ") + (msg));                    \
    } while (0)

#define XT_CHECK_EQ(a, b)                                                                          \
    do {                                                                                           \
        const auto &xt_a_ = (a);                                                                   \
        const auto &xt_b_ = (b);                                                                   \
        if (!::loomtest::Equal(xt_a_, xt_b_))                                                      \
            ::loomtest::Fail(__FILE__, __LINE__,                                                   \
                             "check failed: " #a " == " #b " (" + ::loomtest::Show(xt_a_) +        \
                                 " vs " + ::loomtest::Show(xt_b_) + ")");                          \
    } while (0)

// The call must return `expected`; otherwise prints both result strings and loomGetLastError.
#define XT_CHECK_LOOM_RES(call, expected)                                                          \
    do {                                                                                           \
        const loomResult_t xt_r_ = (call);                                                         \
        if (xt_r_ != (expected))                                                                   \
            ::loomtest::FailLoom(__FILE__, __LINE__, #call, xt_r_, (expected));                    \
    } while (0)

#define XT_CHECK_LOOM(call) XT_CHECK_LOOM_RES(call, loomSuccess)

// In the parent: ASSERT_TRUE on a RunRanks result, without echoing the (long) body in the
// failure message, which then starts with the ranks' verdicts and logs; GTEST_SKIP with the
// reason if a rank called SkipRun.
#define XT_ASSERT_RUN(...)                                                                         \
    do {                                                                                           \
        const ::testing::AssertionResult xt_ran_ = (__VA_ARGS__);                                  \
        ASSERT_TRUE(xt_ran_);                                                                      \
        if (!::loomtest::LastRunSkipReason().empty())                                              \
            GTEST_SKIP() << ::loomtest::LastRunSkipReason();                                       \
    } while (0)

#endif // LOOM_TESTS_HARNESS_MP_FIXTURE_H

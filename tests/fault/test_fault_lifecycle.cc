// SPDX-License-Identifier: Apache-2.0
//
// test_fault_lifecycle.cc - faults around a communicator's life rather than inside one call:
// a rank that never joins creation (the others get a bounded error naming it); the local leader
// or another rank killed while creation maps the shared-memory segment (bounded errors, and
// nothing left in /dev/shm); loomCommAbort from another thread, which ends a blocked call and
// reaches a destroy that waits for one; abort and destroy while a group holds an operation on the
// communicator (both return; the group's GroupEnd fails); destroy and abort called twice (the
// second gets InvalidArgument without touching freed memory), with live and with dead peers; a
// stream failure reported by loomCommGetAsyncError; a peer that destroys while others still need
// it. Run by meson's 'fault' suite.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "shm_watch.h"
#include "tripwire.h"
#include "verify.h"
#include "within.h"

namespace {

using loomtest::NowSec;

constexpr size_t kChunk = 65536;

// True if msg mentions the number n on its own (" 2", not " 25" or "pid 2...").
bool MentionsRank(const std::string &msg, int n)
{
    const std::string k = " " + std::to_string(n);
    for (size_t at = msg.find(k); at != std::string::npos; at = msg.find(k, at + 1)) {
        const size_t end = at + k.size();
        if (end == msg.size() || !isdigit(static_cast<unsigned char>(msg[end])))
            return true;
    }
    return false;
}

loomResult_t SmallAllReduce(loomComm_t comm, loomStream_t stream = nullptr)
{
    static std::vector<float> send(4096, 1.0f), recv(4096);
    return loomAllReduce(send.data(), recv.data(), send.size(), loomFloat32, loomSum, comm, stream);
}

// ---- creation -----------------------------------------------------------------------------

TEST(Creation, RankThatNeverJoinsIsNamedWithinTheTimeout)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 1500);
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id);
            if (rank == 2)
                raise(SIGKILL);
            loomComm_t comm = nullptr;
            const double t0 = NowSec();
            const loomResult_t r = loomCommInitRank(&comm, n, id, rank);
            const double s = NowSec() - t0;
            const std::string msg = loomGetLastError(nullptr);
            fprintf(stderr, "rank %d: init returned %s after %.1f ms: %s\n", rank,
                    loomtest::Show(r).c_str(), s * 1e3, msg.c_str());
            XT_CHECK_MSG(r == loomTimeout || r == loomRemoteError, loomtest::Show(r));
            XT_CHECK(comm == nullptr);
            XT_CHECK_MSG(s < 1.5 + 1.0, std::to_string(s) + " s");
            XT_CHECK_MSG(MentionsRank(msg, 2), "rank 2 is not named: '" + msg + "'");
            if (rank == 0) // the rendezvous service runs here: rank 1 must have its answer
                loomtest::WaitForRankExit(1);
        },
        opts));
}

// The victim dies at the moment the leader's segment appears in /dev/shm; every other rank gets
// a bounded error, at creation or at its first call, and no segment is left behind.
void KilledWhileMapping(int victim)
{
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 10000);
    opts.expected_exit = {0, 0, 0};
    opts.expected_exit[static_cast<size_t>(victim)] = 128 + SIGKILL;
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [victim](int rank, int n, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id); // rank 0's pid file exists from here on
            if (rank == victim)
                loomtest::KillWhenShmAppears("loom-" + std::to_string(loomtest::RankPid(0)) + "-");
            loomComm_t comm = nullptr;
            const double t0 = NowSec();
            loomResult_t r = loomCommInitRank(&comm, n, id, rank);
            if (rank == victim)
                for (;;)
                    pause();      // the watcher kills this process (the segment exists by now)
            if (r == loomSuccess) // the victim died after creation completed
                r = loomBarrier(comm, nullptr);
            const double s = NowSec() - t0;
            fprintf(stderr, "rank %d: returned %s after %.1f ms: %s\n", rank,
                    loomtest::Show(r).c_str(), s * 1e3, loomGetLastError(nullptr));
            XT_CHECK_MSG(r == loomRemoteError || r == loomTimeout, loomtest::Show(r));
            XT_CHECK_MSG(s < 2.0, std::to_string(s) + " s");
            if (comm != nullptr)
                XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

TEST(Creation, LeaderKilledWhileMappingLeavesNoSegment)
{
    KilledWhileMapping(0);
}

TEST(Creation, OtherRankKilledWhileMappingLeavesNoSegment)
{
    KilledWhileMapping(1);
}

// ---- abort --------------------------------------------------------------------------------

TEST(Abort, FromAnotherThreadEndsABlockedCall)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            unsigned char go = 0;
            if (rank == 1) { // never joins the all-reduce; then sees rank 0's abort
                loomtest::ShareFromRank0(&go, 1);
                XT_CHECK_LOOM_RES(SmallAllReduce(comm), loomRemoteError);
                const std::string msg = loomGetLastError(nullptr);
                XT_CHECK_MSG(msg.find("aborted") != std::string::npos, msg);
                XT_CHECK_NAMES_RANK(0, "allreduce");
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            std::atomic<double> t_abort{0};
            std::thread aborter([&] {
                usleep(300 * 1000); // let the all-reduce block; the abort works either way
                t_abort = NowSec();
                XT_CHECK_LOOM(loomCommAbort(comm));
            });
            const loomResult_t r = SmallAllReduce(comm);
            const double t_end = NowSec();
            aborter.join();
            fprintf(stderr, "rank 0: all-reduce returned %s %.1f ms after the abort: %s\n",
                    loomtest::Show(r).c_str(), (t_end - t_abort) * 1e3, loomGetLastError(nullptr));
            XT_CHECK_LOOM_RES(r, loomRemoteError);
            XT_CHECK(t_end >= t_abort && t_end - t_abort < 1.0);
            XT_CHECK_LOOM_RES(loomCommAbort(comm), loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommDestroy(comm), loomInvalidArgument);
            loomtest::ShareFromRank0(&go, 1);
        },
        opts));
}

TEST(Abort, ReachesADestroyWaitingForABlockedStream)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("tcp", 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            unsigned char go = 0;
            if (rank == 1) {
                loomtest::ShareFromRank0(&go, 1);
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            XT_CHECK_LOOM(SmallAllReduce(comm, s)); // queued; rank 1 never joins
            std::atomic<double> t_done{0};
            std::atomic<int> destroy_res{-1};
            std::thread destroyer([&] {
                destroy_res = loomCommDestroy(comm); // waits for the stream's all-reduce
                t_done = NowSec();
            });
            usleep(300 * 1000); // let the destroy start waiting; the abort works either way
            const double t_abort = NowSec();
            XT_CHECK_LOOM(loomCommAbort(comm));
            destroyer.join();
            XT_CHECK_EQ(destroy_res.load(), static_cast<int>(loomSuccess));
            XT_CHECK_MSG(t_done - t_abort < 1.0, std::to_string(t_done - t_abort) + " s");
            XT_CHECK_LOOM_RES(loomStreamSynchronize(s), loomRemoteError);
            XT_CHECK_LOOM(loomStreamDestroy(s));
            XT_CHECK_LOOM_RES(loomCommAbort(comm), loomInvalidArgument);
            loomtest::ShareFromRank0(&go, 1);
        },
        opts));
}

// A call on another thread holds the communicator for its whole length: an abort that lands
// between the call's validity check and its work must not free the communicator under it (run
// under ASan, a use after free here fails the test). Each round aborts after a different delay.
TEST(Abort, RacingCallsNeverTouchAFreedCommunicator)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            for (int round = 0; round < 60; round++) {
                loomComm_t comm = loomtest::CreateComm();
                std::atomic<int> calls{0};
                std::atomic<int> last{loomSuccess};
                std::thread caller([&] {
                    float x[64] = {};
                    int n = 0;
                    for (;;) {
                        loomResult_t r =
                            loomAllReduce(x, x, 64, loomFloat32, loomSum, comm, nullptr);
                        if (r == loomSuccess)
                            r = loomCommCount(comm, &n);
                        calls++;
                        if (r != loomSuccess) {
                            last = r;
                            return;
                        }
                    }
                });
                usleep(static_cast<useconds_t>(round % 20) * 50);
                XT_CHECK_LOOM(loomCommAbort(comm));
                caller.join();
                // Either the call began before the abort (RemoteError: it was aborted) or after
                // it (InvalidArgument: the handle is no longer live).
                const int r = last.load();
                XT_CHECK_MSG(r == loomRemoteError || r == loomInvalidArgument,
                             "round " + std::to_string(round) + ": " +
                                 loomtest::Show(static_cast<loomResult_t>(r)));
                XT_CHECK(calls.load() >= 1);
            }
        },
        opts));
}

// More threads than there are call slots (call_guard.h: 256) call on one communicator at once,
// so that some hold it through their slot and the rest through a reference, while this thread
// destroys it: every thread's calls end with InvalidArgument, none runs on freed memory (ASan),
// and the teardown waits for the calls in progress of both kinds.
TEST(Destroy, ManyThreadsCallingEndRefusedNeverOnFreedMemory)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            constexpr int kThreads = 300;
            for (int round = 0; round < 3; round++) {
                loomComm_t comm = loomtest::CreateComm();
                std::atomic<int> started{0}, refused{0}, other{0};
                std::vector<std::thread> callers;
                for (int t = 0; t < kThreads; t++)
                    callers.emplace_back([&] {
                        float x[16] = {};
                        int n = 0;
                        started++;
                        for (;;) {
                            loomResult_t r = loomCommCount(comm, &n);
                            if (r == loomSuccess)
                                r = loomAllReduce(x, x, 16, loomFloat32, loomSum, comm, nullptr);
                            if (r == loomInvalidArgument) {
                                refused++;
                                return;
                            }
                            if (r != loomSuccess) {
                                other++;
                                return;
                            }
                        }
                    });
                while (started.load() < kThreads)
                    usleep(100);
                usleep(static_cast<useconds_t>(round) * 500);
                XT_CHECK_LOOM(loomCommDestroy(comm));
                for (auto &c : callers)
                    c.join();
                XT_CHECK_MSG(refused.load() == kThreads && other.load() == 0,
                             "round " + std::to_string(round) + ": " +
                                 std::to_string(refused.load()) + " refused, " +
                                 std::to_string(other.load()) + " other errors");
            }
        },
        opts));
}

// A thread that alternates between communicators keeps each vouched for (call_guard.c) until
// one of them is destroyed: from then on that one is refused and the other still runs, also
// when a communicator created afterwards takes the destroyed one's address.
TEST(Destroy, AlternatingCommunicatorsRefuseOnlyTheDestroyedOne)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            float x[4] = {};
            auto call = [&](loomComm_t c) {
                return loomAllReduce(x, x, 4, loomFloat32, loomSum, c, nullptr);
            };
            loomComm_t a = loomtest::CreateComm(), b = loomtest::CreateComm();
            for (int i = 0; i < 10; i++) {
                XT_CHECK_LOOM(call(a));
                XT_CHECK_LOOM(call(b));
            }
            XT_CHECK_LOOM(loomCommDestroy(a));
            XT_CHECK_LOOM_RES(call(a), loomInvalidArgument);
            XT_CHECK_LOOM(call(b));
            XT_CHECK_LOOM_RES(call(a), loomInvalidArgument);
            loomComm_t c = loomtest::CreateComm(); // may reuse a's memory
            XT_CHECK_LOOM(call(c));
            XT_CHECK_LOOM(call(b));
            if (c != a)
                XT_CHECK_LOOM_RES(call(a), loomInvalidArgument);
            XT_CHECK_LOOM(loomCommDestroy(b));
            XT_CHECK_LOOM_RES(call(b), loomInvalidArgument);
            XT_CHECK_LOOM(call(c));
            XT_CHECK_LOOM(loomCommDestroy(c));
            XT_CHECK_LOOM_RES(call(c), loomInvalidArgument);
        },
        opts));
}

// ---- abort and destroy with an open group ---------------------------------------------------

// An operation recorded in a group that is still open holds its communicator until loomGroupEnd,
// which may never come before the teardown: the teardown must not wait for it. Rank 0 records an
// all-reduce in a group and tears the communicator down, from the group's own thread or from
// another one, optionally with the operation recorded on a stream. The teardown returns at once,
// the group's GroupEnd then fails with InvalidArgument without running anything, and rank 1,
// waiting in the all-reduce that rank 0 never issues, sees the abort or the destroy.
struct OpenGroupCase {
    const char *name;
    bool abort;        // loomCommAbort, else loomCommDestroy
    bool other_thread; // the teardown runs on another thread than the group
    bool stream;       // the operation is recorded on a stream
};

void PrintTo(const OpenGroupCase &c, std::ostream *os)
{
    *os << c.name;
}

class OpenGroup : public ::testing::TestWithParam<OpenGroupCase> {};

TEST_P(OpenGroup, TeardownReturnsAndGroupEndFails)
{
    const OpenGroupCase c = GetParam();
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [c](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            if (rank == 1) {
                XT_CHECK_LOOM_RES(SmallAllReduce(comm), loomRemoteError);
                const std::string msg = loomGetLastError(nullptr);
                const char *why = c.abort ? "aborted" : "destroyed its communicator";
                XT_CHECK_MSG(msg.find(why) != std::string::npos, msg);
                XT_CHECK_NAMES_RANK(0, "allreduce");
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            loomStream_t s = nullptr;
            if (c.stream)
                XT_CHECK_LOOM(loomStreamCreate(&s));
            std::promise<void> recorded, torn_down;
            auto teardown = [&] {
                const double t0 = NowSec();
                XT_CHECK_LOOM(c.abort ? loomCommAbort(comm) : loomCommDestroy(comm));
                XT_CHECK_MSG(NowSec() - t0 < 1.0, std::to_string(NowSec() - t0) + " s");
            };
            auto group = [&] {
                XT_CHECK_LOOM(loomGroupStart());
                XT_CHECK_LOOM(SmallAllReduce(comm, s)); // recorded, not issued
                if (c.other_thread) {
                    recorded.set_value();
                    torn_down.get_future().wait();
                } else {
                    teardown();
                }
                XT_CHECK_LOOM_RES(loomGroupEnd(), loomInvalidArgument);
                const std::string msg = loomGetLastError(nullptr);
                XT_CHECK_MSG(msg.find("not run") != std::string::npos, msg);
            };
            std::vector<std::function<void()>> threads = {group};
            if (c.other_thread)
                threads.push_back([&] {
                    recorded.get_future().wait();
                    teardown();
                    torn_down.set_value();
                });
            loomtest::RunWithin(5.0, "the teardown or loomGroupEnd", threads);
            XT_CHECK_LOOM_RES(loomCommAbort(comm), loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommDestroy(comm), loomInvalidArgument);
            if (s != nullptr) {
                XT_CHECK_LOOM(loomStreamSynchronize(s));
                XT_CHECK_LOOM(loomStreamDestroy(s));
            }
            loomtest::WaitForRankExit(1);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(
    All, OpenGroup,
    ::testing::Values(OpenGroupCase{"AbortInTheGroupsThread", true, false, false},
                      OpenGroupCase{"DestroyInTheGroupsThread", false, false, false},
                      OpenGroupCase{"AbortFromAnotherThread", true, true, false},
                      OpenGroupCase{"DestroyFromAnotherThread", false, true, false},
                      OpenGroupCase{"AbortWithTheOperationOnAStream", true, false, true}),
    [](const ::testing::TestParamInfo<OpenGroupCase> &info) { return info.param.name; });

// ---- destroy and abort, twice -----------------------------------------------------------------

TEST(Teardown, SecondDestroyOrAbortIsInvalidArgument)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int, int, loomComm_t) {
            loomComm_t a = loomtest::CreateComm();
            XT_CHECK_LOOM(SmallAllReduce(a));
            XT_CHECK_LOOM(loomCommDestroy(a));
            XT_CHECK_LOOM_RES(loomCommDestroy(a), loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommAbort(a), loomInvalidArgument);
            XT_CHECK_LOOM(loomCommDestroy(nullptr));
            XT_CHECK_LOOM(loomCommAbort(nullptr));
            loomComm_t b = loomtest::CreateComm();
            XT_CHECK_LOOM(SmallAllReduce(b));
            XT_CHECK_LOOM(loomCommAbort(b));
            XT_CHECK_LOOM_RES(loomCommAbort(b), loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommDestroy(b), loomInvalidArgument);
            XT_CHECK_LOOM_RES(SmallAllReduce(b), loomInvalidArgument);
        },
        opts));
}

class DeadPeerTeardown : public ::testing::TestWithParam<std::string> {};

TEST_P(DeadPeerTeardown, DestroyAndAbortReturnPromptly)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv(GetParam(), 20000);
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            // The victim leaves the barrier once every rank is in it (their creation is done);
            // its last barrier message may not reach the others (a killed tcp socket resets).
            const loomResult_t b = loomBarrier(comm, nullptr);
            if (rank == 2)
                raise(SIGKILL);
            XT_CHECK_MSG(b == loomSuccess || b == loomRemoteError, loomtest::Show(b));
            const double t0 = NowSec();
            if (rank == 0)
                XT_CHECK_LOOM(loomCommAbort(comm));
            else
                XT_CHECK_LOOM(loomCommDestroy(comm));
            XT_CHECK_MSG(NowSec() - t0 < 1.0, std::to_string(NowSec() - t0) + " s");
            XT_CHECK_LOOM_RES(loomCommAbort(comm), loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommDestroy(comm), loomInvalidArgument);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, DeadPeerTeardown, ::testing::Values("shm", "tcp"));

// ---- asynchronous errors and early destroys ---------------------------------------------------

TEST(AsyncError, StreamFailureIsReportedOnTheCommunicator)
{
    loomtest::RunOptions opts;
    opts.env = loomtest::FaultEnv("shm", 20000);
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t comm) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            const size_t count = 3 * 4 * (kChunk / 4);
            loomtest::TripBuffer send(count * 4);
            std::vector<float> recv(count);
            if (rank == 2)
                send.Arm(2 * kChunk, SIGKILL); // dies in the stream's worker thread
            XT_CHECK_LOOM(
                loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, s));
            if (rank == 2)
                for (;;)
                    pause();
            loomResult_t e = loomInternalError;
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &e));
            XT_CHECK(e == loomSuccess || e == loomRemoteError);
            const double t0 = NowSec();
            XT_CHECK_LOOM_RES(loomStreamSynchronize(s), loomRemoteError);
            XT_CHECK(NowSec() - t0 < 2.0);
            loomtest::SetContext("loomCommGetAsyncError");
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &e));
            XT_CHECK_EQ(e, loomRemoteError);
            XT_CHECK_NAMES_RANK(2, "allreduce");
            XT_CHECK_LOOM(loomStreamDestroy(s));
        },
        opts));
}

class EarlyDestroy : public ::testing::TestWithParam<std::string> {};

TEST_P(EarlyDestroy, PeersStillWaitingFailFastNamingIt)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv(GetParam(), 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            if (rank == 2) { // leaves without the all-reduce the others wait in
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            const double t0 = NowSec();
            XT_CHECK_LOOM_RES(SmallAllReduce(comm), loomRemoteError);
            XT_CHECK(NowSec() - t0 < 2.0);
            const std::string msg = loomGetLastError(nullptr);
            XT_CHECK_MSG(msg.find("destroyed its communicator") != std::string::npos, msg);
            XT_CHECK_NAMES_RANK(2, "allreduce");
            XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, EarlyDestroy, ::testing::Values("shm", "tcp"));

// The opposite: a rank that finished everything and exited is no failure for a peer still
// waiting on a slow third rank. Here the broadcast's root waits (single copy: until every reader
// is done with its buffer) on rank 0, which arrives 400 ms late, long after rank 1 read the data,
// destroyed its communicator and exited; the root's liveness checks run meanwhile.
class FinishedPeerExits : public ::testing::TestWithParam<std::string> {};

TEST_P(FinishedPeerExits, IsNoFailureForTheOthers)
{
    constexpr size_t kBytes = 4u << 20;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 20000);
    opts.env.push_back({"LOOM_ALGO", GetParam()});
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            std::vector<unsigned char> buf(kBytes), want(kBytes);
            loomtest::FillPattern(want.data(), kBytes, 2, 21);
            if (rank == 2)
                buf = want;
            if (rank == 0)
                usleep(400 * 1000);
            XT_CHECK_LOOM(
                loomBroadcast(buf.data(), buf.data(), kBytes, loomUint8, 2, comm, nullptr));
            XT_CHECK(buf == want);
            if (rank == 1) { // gone before rank 0 even started the broadcast
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, FinishedPeerExits,
                         ::testing::Values("broadcast:shm_cma", "broadcast:direct"),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                             return info.param.substr(info.param.find(':') + 1);
                         });

} // namespace

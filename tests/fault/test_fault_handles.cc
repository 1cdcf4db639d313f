// SPDX-License-Identifier: Apache-2.0
//
// test_fault_handles.cc - the lifetime of the handles other than communicators: streams and Echo
// states. A handle used after its destroy gets InvalidArgument without reading freed memory; a
// destroy racing with calls on another thread leaves each call either done or refused with
// InvalidArgument, never running on freed memory (ASan and TSan builds catch the difference);
// a stream destroyed while an open group holds an operation for it fails that group's GroupEnd
// and leaves the communicator usable. Run by meson's 'fault' suite, on one rank.

#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "loom_echo.h"
#include "mp_fixture.h"
#include "within.h"

namespace {

constexpr size_t kCount = 256;
constexpr int kRounds = 40;

loomResult_t AllReduceOn(loomComm_t comm, loomStream_t stream)
{
    static std::vector<float> send(kCount, 1.0f), recv(kCount);
    return loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, comm, stream);
}

// Runs `use` (given its iteration number) in a loop on a thread of its own until it fails, while
// this thread destroys the handle after a delay that depends on round. `use` can fail only
// because of the destroy, so it must end with InvalidArgument.
void RaceWithDestroy(int round, const std::function<loomResult_t(int)> &use,
                     const std::function<loomResult_t()> &destroy)
{
    std::atomic<int> last{loomSuccess};
    std::thread user([&] {
        for (int i = 0;; i++) {
            const loomResult_t r = use(i);
            if (r != loomSuccess && r != loomInProgress) {
                last = r;
                return;
            }
        }
    });
    usleep(static_cast<useconds_t>(round % 10) * 100);
    XT_CHECK_LOOM(destroy());
    user.join();
    const int r = last.load();
    XT_CHECK_MSG(r == loomInvalidArgument, "round " + std::to_string(round) + ": " +
                                               loomtest::Show(static_cast<loomResult_t>(r)));
}

// ---- streams ------------------------------------------------------------------------------

TEST(Handles, StreamUsedAfterDestroyIsInvalidArgument)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        loomStream_t s = nullptr;
        XT_CHECK_LOOM(loomStreamCreate(&s));
        XT_CHECK_LOOM(AllReduceOn(comm, s));
        XT_CHECK_LOOM(loomStreamDestroy(s));
        XT_CHECK_LOOM_RES(loomStreamSynchronize(s), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomStreamQuery(s), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomStreamDestroy(s), loomInvalidArgument);
        XT_CHECK_LOOM_RES(AllReduceOn(comm, s), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomBarrier(comm, s), loomInvalidArgument);
        XT_CHECK_LOOM(AllReduceOn(comm, nullptr));
    }));
}

// One thread queues calls and synchronizes while the main thread destroys the stream, after a
// different delay each round. Every call queued before the destroy runs (the destroy waits for
// it); every later one gets InvalidArgument; the communicator's order is intact afterwards.
TEST(Handles, StreamDestroyedWhileAnotherThreadUsesIt)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        for (int round = 0; round < kRounds; round++) {
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&s));
            RaceWithDestroy(
                round,
                [&](int i) {
                    const loomResult_t r = AllReduceOn(comm, s);
                    if (r != loomSuccess)
                        return r;
                    return i % 2 ? loomStreamSynchronize(s) : loomStreamQuery(s);
                },
                [&] { return loomStreamDestroy(s); });
        }
        XT_CHECK_LOOM(AllReduceOn(comm, nullptr));
    }));
}

TEST(Handles, StreamDestroyedBeforeGroupEndFailsTheGroup)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        loomtest::RunWithin(5.0, "the group on a destroyed stream", {[comm] {
                                XT_CHECK_LOOM(loomGroupStart());
                                loomStream_t s = nullptr;
                                XT_CHECK_LOOM(loomStreamCreate(&s));
                                XT_CHECK_LOOM(AllReduceOn(comm, s)); // recorded for the stream
                                XT_CHECK_LOOM(loomStreamDestroy(s));
                                XT_CHECK_LOOM_RES(loomGroupEnd(), loomInvalidArgument);
                                const std::string msg = loomGetLastError(nullptr);
                                XT_CHECK_MSG(msg.find("not run") != std::string::npos, msg);
                            }});
        XT_CHECK_LOOM(AllReduceOn(comm, nullptr)); // no ticket was left behind
    }));
}

// ---- Echo states --------------------------------------------------------------------------

TEST(Handles, EchoStateUsedAfterDestroyIsInvalidArgument)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        std::vector<float> x(kCount, 1.0f), y(kCount), res(kCount);
        loomEchoState_t st = nullptr;
        XT_CHECK_LOOM(loomEchoCreate(comm, kCount, loomFloat32, &st));
        XT_CHECK_LOOM(
            loomEchoAllReduce(x.data(), y.data(), kCount, loomFloat32, comm, st, nullptr));
        XT_CHECK_LOOM(loomEchoDestroy(st));
        XT_CHECK_LOOM_RES(loomEchoReset(st), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoResidual(st, res.data()), loomInvalidArgument);
        XT_CHECK_LOOM_RES(
            loomEchoAllReduce(x.data(), y.data(), kCount, loomFloat32, comm, st, nullptr),
            loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomEchoDestroy(st), loomInvalidArgument);
        XT_CHECK_LOOM(
            loomEchoAllReduce(x.data(), y.data(), kCount, loomFloat32, comm, nullptr, nullptr));
    }));
}

// One thread calls Echo on the state (and reads its residual) while the main thread destroys the
// state: each call either holds the state for its whole length or is refused.
TEST(Handles, EchoStateDestroyedWhileAnotherThreadUsesIt)
{
    XT_ASSERT_RUN(loomtest::RunRanks(1, [](int, int, loomComm_t comm) {
        for (int round = 0; round < kRounds; round++) {
            loomEchoState_t st = nullptr;
            XT_CHECK_LOOM(loomEchoCreate(comm, kCount, loomFloat32, &st));
            std::vector<float> x(kCount, 1.0f), y(kCount), res(kCount);
            RaceWithDestroy(
                round,
                [&](int) {
                    const loomResult_t r = loomEchoAllReduce(x.data(), y.data(), kCount,
                                                             loomFloat32, comm, st, nullptr);
                    return r != loomSuccess ? r : loomEchoResidual(st, res.data());
                },
                [&] { return loomEchoDestroy(st); });
        }
    }));
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_fault_shm.cc - failures inside the shared-memory collectives (docs/shm-collectives.md),
// whose ranks wait on each other's flags in the arena rather than on messages. For each family
// (flat, cico, cma, tiny) on 4 ranks: a rank SIGKILLed in the middle of an all-reduce (a tripwire
// in the part it reads itself) or before it joins a call of every kind must make every survivor
// return loomRemoteError within 2 s, naming it with host and pid and the operation with its
// sequence number (a tiny or flat reduce's non-roots, which need nobody: in their next call), with
// nothing left in /dev/shm; a rank stopped by SIGSTOP must make them
// return loomTimeout no earlier than LOOM_TIMEOUT_MS and within a second after it; a rank killed
// in its own single-copy read of a peer's block must fail them the same way; a buffer that
// single copy cannot read must fail its peers with loomRemoteError naming its owner, and the owner
// with loomInvalidUsage saying why; loomCommAbort
// from another thread must end a call blocked in the arena; a rank killed while the arena is
// being created must leave no segment, and a rank that cannot create it must fail every rank at
// once. Run by meson's 'fault' suite.

#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "shm_watch.h"
#include "tripwire.h"
#include "verify.h"

namespace {

using loomtest::NowSec;
using loomtest::TripBuffer;

constexpr int kRanks = 4;
constexpr int kVictim = 3;
constexpr double kDetectS = 2.0;
constexpr int kTimeoutMs = 1500;
constexpr size_t kBigCount = 300000; // floats per rank or block of the cico and cma calls

enum class Family { kFlat, kCico, kCma, kTiny };

const char *FamilyName(Family f)
{
    return f == Family::kFlat   ? "flat"
           : f == Family::kCico ? "cico"
           : f == Family::kCma  ? "cma"
                                : "tiny";
}

// Shared-memory transport, 64 KiB slots, the family forced for every collective that has it.
loomtest::EnvList ShmEnv(Family f, int timeout_ms)
{
    loomtest::EnvList env = {{"LOOM_NET", "shm"},
                             {"LOOM_SHM_COLL", "1"},
                             {"LOOM_TIMEOUT_MS", std::to_string(timeout_ms)},
                             {"LOOM_SHM_COLL_BYTES", "65536"}};
    if (f != Family::kTiny) // tiny: the default for calls that fit a cell
        env.push_back({"LOOM_ALGO", f == Family::kFlat   ? "allreduce:shm_flat,reduce:shm_flat"
                                    : f == Family::kCico ? "shm_cico"
                                                         : "shm_cma"});
    return env;
}

// Elements of the all-reduce: flat needs it to fit a 32 KiB half, tiny a 48-byte cell, the
// others get 16 rounds.
size_t ReduceCount(Family f)
{
    return f == Family::kTiny ? 8 : f == Family::kFlat ? 4096 : kRanks * 65536;
}

// Where the victim's own reads of its send buffer hit the tripwire: the copy-in (flat, cico)
// reads all of it (cico: round 8 of 2048 floats per owner); single copy reads only its own
// slice (floats [3/4 count, count)) itself, the others read theirs from it; tiny copies it all
// into its cell.
size_t TripOffset(Family f)
{
    return f == Family::kTiny   ? 0
           : f == Family::kFlat ? 8192
           : f == Family::kCico ? 4 * (65536 + 8 * 2048)
                                : 4 * (3 * 65536 + 40000);
}

void CheckFailure(loomResult_t r, double s, const char *op)
{
    fprintf(stderr, "rank %d: %s returned %s after %.1f ms: %s\n", loomtest::CurrentRank(), op,
            loomtest::Show(r).c_str(), s * 1e3, loomGetLastError(nullptr));
    XT_CHECK_LOOM_RES(r, loomRemoteError);
    XT_CHECK_MSG(s < kDetectS, "detection took " + std::to_string(s) + " s");
    XT_CHECK_NAMES_RANK(kVictim, op);
}

// Runs body on kRanks ranks under env, the victim dying by SIGKILL; nothing of the ranks' may be
// left in /dev/shm afterwards.
template <typename Body> void RunVictimDies(const loomtest::EnvList &env, Body body)
{
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.env = env;
    opts.expected_exit = {0, 0, 0, 128 + SIGKILL};
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, body, opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

// ---- SIGKILL in the middle of an all-reduce
// ------------------------------------------------------

void KillMidAllReduce(Family f, int rank, loomComm_t comm)
{
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    const size_t count = ReduceCount(f);
    TripBuffer send(count * 4);
    loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, rank, 7, 0, count);
    const std::vector<unsigned char> before(send.data(), send.data() + count * 4);
    std::vector<unsigned char> recv(count * 4);
    if (rank == kVictim)
        send.Arm(TripOffset(f), SIGKILL);
    const double t0 = NowSec();
    const loomResult_t r =
        loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    if (rank == kVictim)
        loomtest::Fail(__FILE__, __LINE__, "the victim's call returned instead of dying");
    CheckFailure(r, NowSec() - t0, "allreduce");
    XT_CHECK_MSG(memcmp(before.data(), send.data(), before.size()) == 0, "send buffer written");
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage);
}

class ShmKillMid : public ::testing::TestWithParam<Family> {};

TEST_P(ShmKillMid, SurvivorsFailFastNamingTheDeadRank)
{
    const Family f = GetParam();
    RunVictimDies(ShmEnv(f, 20000),
                  [f](int rank, int, loomComm_t comm) { KillMidAllReduce(f, rank, comm); });
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmKillMid,
                         ::testing::Values(Family::kFlat, Family::kCico, Family::kCma,
                                           Family::kTiny),
                         [](const ::testing::TestParamInfo<Family> &info) {
                             return std::string(FamilyName(info.param));
                         });

// ---- SIGKILL of a rank that never joins ------------------------------------------------------

enum class Op { AllReduce, ReduceScatter, Reduce, AllGather, Broadcast, AllToAll, Barrier };

const char *OpName(Op op)
{
    static const char *const names[] = {"allreduce", "reducescatter", "reduce", "allgather",
                                        "broadcast", "alltoall",      "barrier"};
    return names[static_cast<int>(op)];
}

loomResult_t CallOp(Op op, Family f, loomComm_t comm)
{
    // per rank where it applies; tiny: 32 bytes at most per rank
    const size_t count = f == Family::kTiny ? 2 : f == Family::kFlat ? 1024 : kBigCount;
    static std::vector<float> send, recv;
    send.assign(count * kRanks, 1.0f);
    recv.assign(count * kRanks, 0.0f);
    switch (op) {
    case Op::AllReduce:
        return loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    case Op::ReduceScatter:
        return loomReduceScatter(send.data(), recv.data(), count, loomFloat32, loomSum, comm,
                                 nullptr);
    case Op::Reduce:
        return loomReduce(send.data(), recv.data(), count, loomFloat32, loomSum, 0, comm, nullptr);
    case Op::AllGather:
        return loomAllGather(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
    case Op::Broadcast: // the victim is the root
        return loomBroadcast(send.data(), recv.data(), count, loomFloat32, kVictim, comm, nullptr);
    case Op::AllToAll:
        return loomAllToAll(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
    case Op::Barrier:
        return loomBarrier(comm, nullptr);
    }
    return loomInternalError;
}

class ShmKillAbsent : public ::testing::TestWithParam<std::tuple<Family, Op>> {};

TEST_P(ShmKillAbsent, SurvivorsFailFastNamingTheDeadRank)
{
    const Family f = std::get<0>(GetParam());
    const Op op = std::get<1>(GetParam());
    RunVictimDies(ShmEnv(f, 20000), [f, op](int rank, int, loomComm_t comm) {
        XT_CHECK_LOOM(loomBarrier(comm, nullptr));
        if (rank == kVictim) {
            usleep(200 * 1000); // the others are blocked in the arena by now
            raise(SIGKILL);
        }
        const double t0 = NowSec();
        const loomResult_t r = CallOp(op, f, comm);
        if ((f == Family::kTiny || f == Family::kFlat) && op == Op::Reduce && rank != 0 &&
            r == loomSuccess) {
            // A tiny or flat reduce's non-root returns once its data is in the arena, as
            // an MPI eager send does: its call needs nobody. Its next call must fail.
            const double t1 = NowSec();
            CheckFailure(loomBarrier(comm, nullptr), NowSec() - t1, "barrier");
            return;
        }
        CheckFailure(r, NowSec() - t0, OpName(op));
    });
}

INSTANTIATE_TEST_SUITE_P(
    Shm, ShmKillAbsent,
    ::testing::Combine(::testing::Values(Family::kFlat, Family::kCico, Family::kCma, Family::kTiny),
                       ::testing::Values(Op::AllReduce, Op::ReduceScatter, Op::Reduce,
                                         Op::AllGather, Op::Broadcast, Op::AllToAll, Op::Barrier)),
    [](const ::testing::TestParamInfo<std::tuple<Family, Op>> &info) {
        return std::string(FamilyName(std::get<0>(info.param))) + "_" +
               OpName(std::get<1>(info.param));
    });

// ---- SIGKILL in the middle of a single-copy pull ---------------------------------------------

// Single copy (forced): the victim posts its buffers and dies in its own process_vm_readv of
// a peer's block, at half of it (tripwire.h). Every survivor has the victim among the readers of
// its buffer, so none can leave; those still reading the victim's blocks find it gone.
void KillMidPull(Op op, int rank, loomComm_t comm)
{
    constexpr size_t kCount = kBigCount; // floats per block
    constexpr size_t kBlock = kCount * 4;
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    std::vector<float> send(kCount * kRanks, static_cast<float>(rank));
    TripBuffer recv(kBlock * kRanks);
    if (rank == kVictim)
        for (int j = 0; j < kRanks; j++)
            if (j != rank)
                recv.Arm(static_cast<size_t>(j) * kBlock + kBlock / 2, SIGKILL);
    float *r = reinterpret_cast<float *>(recv.data());
    const double t0 = NowSec();
    const loomResult_t res = op == Op::AllGather
                                 ? loomAllGather(r + static_cast<size_t>(rank) * kCount, r, kCount,
                                                 loomFloat32, comm, nullptr)
                                 : loomAllToAll(send.data(), r, kCount, loomFloat32, comm, nullptr);
    if (rank == kVictim)
        loomtest::Fail(__FILE__, __LINE__, "the victim's call returned instead of dying");
    CheckFailure(res, NowSec() - t0, OpName(op));
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage);
}

class ShmKillMidPull : public ::testing::TestWithParam<Op> {};

TEST_P(ShmKillMidPull, SurvivorsFailFastNamingTheDeadRank)
{
    const Op op = GetParam();
    RunVictimDies(ShmEnv(Family::kCma, 20000),
                  [op](int rank, int, loomComm_t comm) { KillMidPull(op, rank, comm); });
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmKillMidPull, ::testing::Values(Op::AllGather, Op::AllToAll),
                         [](const ::testing::TestParamInfo<Op> &info) {
                             return std::string(OpName(info.param));
                         });

// ---- a buffer that its peers cannot read (single copy) -------------------------------------

// The victim passes a buffer with a page that cannot be read where only its peers read it (its
// own reads: its all-reduce slice, its all-to-all block; all-gather and broadcast in place, so
// that it copies nothing itself). A reader finds the page with process_vm_readv: the victim is
// at fault, alive, and must hear so.
loomResult_t CallWithUnreadablePage(Op op, int rank, loomComm_t comm)
{
    constexpr size_t kCount = kBigCount; // floats per rank
    TripBuffer buf(kCount * kRanks * 4);
    std::vector<float> recv(kCount * kRanks);
    // The byte of buf whose page is unreadable on the victim. AllReduce: rank 0 reduces floats
    // [0, kCount) and reads them from the victim; ReduceScatter: rank 0's span; AllToAll: block 0.
    size_t hole = 4 * 1000;
    if (op == Op::AllGather) // in place: the victim's block of buf is what the others read
        hole = (static_cast<size_t>(rank) * kCount + kCount / 2) * 4;
    else if (op == Op::Broadcast) // from the victim, in place
        hole = kCount * 2;
    if (rank == kVictim &&
        mprotect(buf.data() + hole / loomtest::PageBytes() * loomtest::PageBytes(),
                 loomtest::PageBytes(), PROT_NONE) != 0)
        loomtest::Fail(__FILE__, __LINE__, std::string("mprotect: ") + strerror(errno));
    float *f = reinterpret_cast<float *>(buf.data());
    switch (op) {
    case Op::AllReduce:
        return loomAllReduce(f, recv.data(), kCount * kRanks, loomFloat32, loomSum, comm, nullptr);
    case Op::ReduceScatter:
        return loomReduceScatter(f, recv.data(), kCount, loomFloat32, loomSum, comm, nullptr);
    case Op::AllToAll:
        return loomAllToAll(f, recv.data(), kCount, loomFloat32, comm, nullptr);
    case Op::AllGather:
        return loomAllGather(f + static_cast<size_t>(rank) * kCount, f, kCount, loomFloat32, comm,
                             nullptr);
    default:
        return loomBroadcast(f, f, kCount, loomFloat32, kVictim, comm, nullptr);
    }
}

class ShmUnreadableBuffer : public ::testing::TestWithParam<Op> {};

TEST_P(ShmUnreadableBuffer, BlamesItsOwnerWhoHearsOfIt)
{
    const Op op = GetParam();
    loomtest::RunOptions opts;
    opts.env = ShmEnv(Family::kCma, 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [op](int rank, int, loomComm_t comm) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            const double t0 = NowSec();
            const loomResult_t r = CallWithUnreadablePage(op, rank, comm);
            const std::string msg = loomGetLastError(nullptr);
            if (rank == kVictim) {
                fprintf(stderr, "rank %d: %s returned %s: %s\n", rank, OpName(op),
                        loomtest::Show(r).c_str(), msg.c_str());
                XT_CHECK_LOOM_RES(r, loomInvalidUsage);
                XT_CHECK_MSG(msg.find("could not read this rank's buffer") != std::string::npos,
                             "the victim is not told why: '" + msg + "'");
            } else {
                CheckFailure(r, NowSec() - t0, OpName(op));
                XT_CHECK_MSG(msg.find("buffer is not readable") != std::string::npos ||
                                 msg.find("failed with 'invalid usage") != std::string::npos,
                             "the cause is not named: '" + msg + "'");
            }
            XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage); // broken for good
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmUnreadableBuffer,
                         ::testing::Values(Op::AllReduce, Op::ReduceScatter, Op::AllGather,
                                           Op::Broadcast, Op::AllToAll),
                         [](const ::testing::TestParamInfo<Op> &info) {
                             return std::string(OpName(info.param));
                         });

// ---- SIGSTOP ---------------------------------------------------------------------------------

class ShmStoppedPeer : public ::testing::TestWithParam<Family> {};

TEST_P(ShmStoppedPeer, TimesOutAfterTheTimeoutNotBefore)
{
    const Family f = GetParam();
    loomtest::RunOptions opts;
    opts.env = ShmEnv(f, kTimeoutMs);
    opts.expected_exit = {0, 0, 0, 128 + SIGKILL};
    opts.kill_when_others_exit = {kVictim};
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [f](int rank, int, loomComm_t comm) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            const size_t count = ReduceCount(f);
            TripBuffer send(count * 4);
            loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, rank, 3, 0, count);
            std::vector<unsigned char> recv(count * 4);
            if (rank == kVictim)
                send.Arm(TripOffset(f), SIGSTOP);
            const double t0 = NowSec();
            const loomResult_t r =
                loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
            const double s = NowSec() - t0;
            fprintf(stderr, "rank %d: returned %s after %.1f ms: %s\n", rank,
                    loomtest::Show(r).c_str(), s * 1e3, loomGetLastError(nullptr));
            XT_CHECK(rank != kVictim);
            XT_CHECK_LOOM_RES(r, loomTimeout);
            XT_CHECK_MSG(s >= kTimeoutMs / 1e3, "timed out early: " + std::to_string(s) + " s");
            XT_CHECK_MSG(s < kTimeoutMs / 1e3 + 1.0, "timed out late: " + std::to_string(s));
            XT_CHECK_NAMES_RANK(kVictim, "allreduce");
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmStoppedPeer,
                         ::testing::Values(Family::kFlat, Family::kCico, Family::kCma,
                                           Family::kTiny),
                         [](const ::testing::TestParamInfo<Family> &info) {
                             return std::string(FamilyName(info.param));
                         });

// ---- loomCommAbort from another thread -------------------------------------------------------

class ShmAbort : public ::testing::TestWithParam<Family> {};

TEST_P(ShmAbort, FromAnotherThreadEndsABlockedCall)
{
    const Family f = GetParam();
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = ShmEnv(f, 20000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [f](int rank, int, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            const size_t count = f == Family::kTiny ? 2 : f == Family::kFlat ? 1024 : 1 << 20;
            std::vector<float> send(count, 1.0f), recv(count);
            unsigned char go = 0;
            if (rank == 1) { // joins only after rank 0 aborted
                loomtest::ShareFromRank0(&go, 1);
                const loomResult_t r = loomAllReduce(send.data(), recv.data(), count, loomFloat32,
                                                     loomSum, comm, nullptr);
                XT_CHECK_LOOM_RES(r, loomRemoteError);
                const std::string msg = loomGetLastError(nullptr);
                XT_CHECK_MSG(msg.find("aborted") != std::string::npos, msg);
                XT_CHECK_NAMES_RANK(0, "allreduce");
                XT_CHECK_LOOM(loomCommDestroy(comm));
                return;
            }
            std::atomic<double> t_abort{0};
            std::thread aborter([&] {
                usleep(300 * 1000);
                t_abort = NowSec();
                XT_CHECK_LOOM(loomCommAbort(comm));
            });
            const loomResult_t r =
                loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
            const double t_end = NowSec();
            aborter.join();
            fprintf(stderr, "rank 0: returned %s %.1f ms after the abort: %s\n",
                    loomtest::Show(r).c_str(), (t_end - t_abort) * 1e3, loomGetLastError(nullptr));
            XT_CHECK_LOOM_RES(r, loomRemoteError);
            XT_CHECK(t_end >= t_abort && t_end - t_abort < 1.0);
            loomtest::ShareFromRank0(&go, 1);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmAbort,
                         ::testing::Values(Family::kFlat, Family::kCico, Family::kCma,
                                           Family::kTiny),
                         [](const ::testing::TestParamInfo<Family> &info) {
                             return std::string(FamilyName(info.param));
                         });

// ---- SIGKILL while the arena is created ------------------------------------------------------

class ShmCreationKill : public ::testing::TestWithParam<int> {};

TEST_P(ShmCreationKill, LeavesNoSegment)
{
    const int victim = GetParam();
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_TIMEOUT_MS", "10000"}};
    opts.expected_exit = {0, 0, 0};
    opts.expected_exit[static_cast<size_t>(victim)] = 128 + SIGKILL;
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [victim](int rank, int n, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id);
            if (rank == victim)
                loomtest::KillWhenShmAppears("loom-" + std::to_string(loomtest::RankPid(0)) +
                                             "-arena-");
            loomComm_t comm = nullptr;
            const double t0 = NowSec();
            loomResult_t r = loomCommInitRank(&comm, n, id, rank);
            if (rank == victim)
                for (;;)
                    pause(); // the watcher kills this process
            if (r == loomSuccess)
                r = loomBarrier(comm, nullptr);
            const double s = NowSec() - t0;
            fprintf(stderr, "rank %d: returned %s after %.1f ms: %s\n", rank,
                    loomtest::Show(r).c_str(), s * 1e3, loomGetLastError(nullptr));
            XT_CHECK_MSG(r == loomRemoteError || r == loomTimeout, loomtest::Show(r));
            XT_CHECK_MSG(s < kDetectS, std::to_string(s) + " s");
            if (comm != nullptr)
                XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmCreationKill, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int> &info) {
                             return info.param == 0 ? std::string("leader") : std::string("other");
                         });

// ---- the arena cannot be created on one rank ---------------------------------------------------

// The leader's segment cannot grow (RLIMIT_FSIZE below the arena, SIGXFSZ ignored), after the
// point-to-point layer is up: it fails with loomSystemError saying why, and the others, waiting
// for the segment, hear of it from its notice at once instead of waiting out their timeout.
TEST(ShmCreationFails, EveryRankFailsNamingTheLeader)
{
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.env = loomtest::FaultEnv("shm", 20000);
    opts.env.push_back({"LOOM_SHM_COLL", "1"});
    opts.env.push_back({"LOOM_SHM_COLL_BYTES", std::to_string(64 << 20)});
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            loomUniqueId id;
            loomtest::ShareUniqueId(&id);
            if (rank == 0) {
                const rlimit lim = {8 << 20, 8 << 20}; // the rings fit, 3 x 64 MiB slots do not
                XT_CHECK(signal(SIGXFSZ, SIG_IGN) != SIG_ERR);
                XT_CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
            }
            loomComm_t comm = nullptr;
            const double t0 = NowSec();
            const loomResult_t r = loomCommInitRank(&comm, n, id, rank);
            const double s = NowSec() - t0;
            const std::string msg = loomGetLastError(nullptr);
            fprintf(stderr, "rank %d: returned %s after %.1f ms: %s\n", rank,
                    loomtest::Show(r).c_str(), s * 1e3, msg.c_str());
            XT_CHECK_MSG(comm == nullptr, "creation succeeded");
            if (rank == 0) {
                XT_CHECK_LOOM_RES(r, loomSystemError);
                XT_CHECK_MSG(msg.find("shm arena") != std::string::npos, msg);
                return;
            }
            XT_CHECK_LOOM_RES(r, loomRemoteError);
            XT_CHECK_MSG(s < kDetectS, std::to_string(s) + " s");
            XT_CHECK_NAMES_RANK(0, "communicator creation");
        },
        opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

} // namespace

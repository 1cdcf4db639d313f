// SPDX-License-Identifier: Apache-2.0
//
// test_fault_kill.cc - SIGKILL of one rank in the middle of every collective and of a send/recv
// chain, over shm and over tcp, on 4 ranks. The victim (rank 3) enters the call with a send
// buffer whose tripwire page lies past what a ring or a socket can buffer, so it dies after its
// peers started reading its data and before they can finish. Every survivor must return
// loomRemoteError within 2 s (the bound for a death that is visible: connection closed, pid
// gone), name rank 3 with its host and pid and the operation with its sequence number, leave
// its send buffer untouched and refuse later calls; no segment may stay in /dev/shm. In the
// chain 3 -> 2 -> 1 -> 0 only rank 2 waits on the victim: ranks 1 and 0 wait on live peers and
// must learn of the death, and who died, through the failure notices. Timeouts are 20 s, so
// only the detection of the death can pass. Run by meson's 'fault' suite.
//
// KillMidCall pins the two-shot pattern (LOOM_ALGO=direct), where every survivor waits on the
// victim. KillMidChained forces each chained algorithm instead (ring, recursive doubling and
// halving, trees, Bruck): there a survivor waits on neighbours, and one that already holds all
// the victim contributes to its result may finish. Each survivor must then either fail as above
// or return success with exactly the right result and fail its next call.

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "tripwire.h"
#include "verify.h"

namespace {

using loomtest::TripBuffer;
using Bytes = std::vector<unsigned char>;

constexpr int kRanks = 4;
constexpr int kVictim = 3;
constexpr size_t kChunk = 65536;   // LOOM_CHUNK_BYTES of FaultEnv
constexpr size_t kMsg = 1u << 20;  // bytes of one rank's part in the one-message collectives
constexpr size_t kTrip = kMsg / 2; // where the victim's part stops: beyond a 64 KiB ring/socket
constexpr double kDetectS = 2.0;

enum class Op { AllReduce, AllGather, ReduceScatter, AllToAll, AllToAllv, Broadcast, SendRecv };

const char *OpName(Op op)
{
    switch (op) {
    case Op::AllReduce:
        return "allreduce";
    case Op::AllGather:
        return "allgather";
    case Op::ReduceScatter:
        return "reducescatter";
    case Op::AllToAll:
        return "alltoall";
    case Op::AllToAllv:
        return "alltoallv";
    case Op::Broadcast:
        return "broadcast";
    case Op::SendRecv:
        return "send/recv";
    }
    return "?";
}

struct Outcome {
    loomResult_t res;
    double seconds;
    bool send_intact; // the bytes the call may only read are unchanged
    bool result_ok;   // on success: the output is exactly the expected one
};

// The bytes of part `to` of rank `from`'s all-to-all send buffer.
void AllToAllPart(void *buf, int from, int to)
{
    loomtest::FillPattern(buf, kMsg, from, 5, static_cast<size_t>(to) * kMsg);
}

// Runs one call; the victim's tripwire is armed just before it. Chunked collectives (all-reduce,
// reduce-scatter) trip in round 2 of 4 on the part for rank 0, the others on half of a 1 MiB part.
Outcome CallOnce(Op op, int rank, loomComm_t comm)
{
    const bool victim = rank == kVictim;
    const size_t per_owner = 4 * (kChunk / 4); // floats: four rounds per owner
    loomResult_t r = loomInternalError;
    double t0 = 0;
    switch (op) {
    case Op::AllReduce:
    case Op::ReduceScatter: {
        const size_t count = kRanks * per_owner;
        TripBuffer send(count * 4);
        loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, rank, 7, 0, count);
        const Bytes before(send.data(), send.data() + count * 4);
        Bytes recv(count * 4);
        if (victim)
            send.Arm(2 * kChunk, SIGKILL);
        t0 = loomtest::NowSec();
        if (op == Op::AllReduce)
            r = loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
        else
            r = loomReduceScatter(send.data(), recv.data(), per_owner, loomFloat32, loomSum, comm,
                                  nullptr);
        const double secs = loomtest::NowSec() - t0;
        const size_t first = op == Op::AllReduce ? 0 : static_cast<size_t>(rank) * per_owner;
        const size_t n = op == Op::AllReduce ? count : per_owner;
        Bytes want(n * 4);
        loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, kRanks, 7, first, n);
        return {r, secs, memcmp(before.data(), send.data(), before.size()) == 0,
                loomtest::CompareElements(recv.data(), want.data(), n, loomFloat32).empty()};
    }
    case Op::AllGather: { // in place: this rank's part of recv is its send buffer
        TripBuffer recv(kRanks * kMsg);
        unsigned char *mine = recv.data() + static_cast<size_t>(rank) * kMsg;
        loomtest::FillPattern(mine, kMsg, rank, 3);
        const Bytes before(mine, mine + kMsg);
        if (victim)
            recv.Arm(static_cast<size_t>(rank) * kMsg + kTrip, SIGKILL);
        t0 = loomtest::NowSec();
        r = loomAllGather(mine, recv.data(), kMsg / 4, loomFloat32, comm, nullptr);
        const double secs = loomtest::NowSec() - t0;
        Bytes want(kRanks * kMsg);
        for (int j = 0; j < kRanks; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * kMsg, kMsg, j, 3);
        return {r, secs, memcmp(before.data(), mine, kMsg) == 0,
                memcmp(want.data(), recv.data(), want.size()) == 0};
    }
    case Op::AllToAll:
    case Op::AllToAllv: {
        // alltoallv: part (i -> j) has 1 MiB + ((i + j) % 4) * 64 KiB, page aligned.
        auto part = [op](int from, int to) {
            return op == Op::AllToAll ? kMsg : kMsg + static_cast<size_t>((from + to) % 4) * kChunk;
        };
        if (op == Op::AllToAll) { // built from AllToAllPart, so that a result can be checked
            TripBuffer send(kRanks * kMsg);
            for (int j = 0; j < kRanks; j++)
                AllToAllPart(send.data() + static_cast<size_t>(j) * kMsg, rank, j);
            const Bytes before(send.data(), send.data() + send.size());
            Bytes recv(kRanks * kMsg), want(kRanks * kMsg);
            if (victim)
                for (int j = 0; j < kRanks; j++)
                    if (j != rank)
                        send.Arm(static_cast<size_t>(j) * kMsg + kTrip, SIGKILL);
            t0 = loomtest::NowSec();
            r = loomAllToAll(send.data(), recv.data(), kMsg / 4, loomFloat32, comm, nullptr);
            const double secs = loomtest::NowSec() - t0;
            for (int j = 0; j < kRanks; j++)
                AllToAllPart(want.data() + static_cast<size_t>(j) * kMsg, j, rank);
            return {r, secs, memcmp(before.data(), send.data(), send.size()) == 0,
                    memcmp(want.data(), recv.data(), want.size()) == 0};
        }
        std::vector<size_t> sc(kRanks), sd(kRanks), rc(kRanks), rd(kRanks);
        size_t sbytes = 0, rbytes = 0;
        for (int j = 0; j < kRanks; j++) {
            sd[j] = sbytes / 4;
            sc[j] = part(rank, j) / 4;
            sbytes += part(rank, j);
            rd[j] = rbytes / 4;
            rc[j] = part(j, rank) / 4;
            rbytes += part(j, rank);
        }
        TripBuffer send(sbytes);
        loomtest::FillPattern(send.data(), sbytes, rank, 5);
        const Bytes before(send.data(), send.data() + sbytes);
        Bytes recv(rbytes);
        if (victim)
            for (int j = 0; j < kRanks; j++)
                if (j != rank)
                    send.Arm(sd[j] * 4 + kTrip, SIGKILL);
        t0 = loomtest::NowSec();
        r = loomAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                          loomFloat32, comm, nullptr);
        return {r, loomtest::NowSec() - t0, memcmp(before.data(), send.data(), sbytes) == 0, false};
    }
    case Op::Broadcast: { // the victim is the root, in place
        TripBuffer buf(kMsg);
        if (victim) {
            loomtest::FillPattern(buf.data(), kMsg, rank, 9);
            buf.Arm(kTrip, SIGKILL);
        }
        t0 = loomtest::NowSec();
        r = loomBroadcast(buf.data(), buf.data(), kMsg / 4, loomFloat32, kVictim, comm, nullptr);
        const double secs = loomtest::NowSec() - t0;
        Bytes want(kMsg);
        loomtest::FillPattern(want.data(), kMsg, kVictim, 9);
        return {r, secs, true, memcmp(want.data(), buf.data(), kMsg) == 0};
    }
    case Op::SendRecv: { // the chain 3 -> 2 -> 1 -> 0; each forwards what it received
        TripBuffer buf(kMsg);
        if (victim) {
            loomtest::FillPattern(buf.data(), kMsg, rank, 11);
            buf.Arm(kTrip, SIGKILL);
            t0 = loomtest::NowSec();
            r = loomSend(buf.data(), kMsg, loomUint8, rank - 1, comm, nullptr);
            return {r, loomtest::NowSec() - t0, true, false};
        }
        t0 = loomtest::NowSec();
        r = loomRecv(buf.data(), kMsg, loomUint8, rank + 1, comm, nullptr);
        if (r == loomSuccess && rank > 0)
            r = loomSend(buf.data(), kMsg, loomUint8, rank - 1, comm, nullptr);
        return {r, loomtest::NowSec() - t0, true, false};
    }
    }
    return {r, 0, true, false};
}

// may_finish: a survivor may also return success, with the exact result (chained algorithms).
void KillBody(Op op, int rank, loomComm_t comm, bool may_finish)
{
    XT_CHECK_LOOM(loomBarrier(comm, nullptr)); // every connection carried a call before the fault
    // A rank leaves the barrier once it heard from the others, which may be before they did:
    // the victim lets them leave it before it starts the call it dies in.
    if (rank == kVictim)
        usleep(20 * 1000);
    const Outcome o = CallOnce(op, rank, comm);
    if (rank == kVictim)
        loomtest::Fail(__FILE__, __LINE__,
                       std::string("the victim's call returned ") + loomtest::Show(o.res) +
                           " instead of dying at its tripwire");
    fprintf(stderr, "rank %d: %s returned %s after %.1f ms: %s\n", rank, OpName(op),
            loomtest::Show(o.res).c_str(), o.seconds * 1e3, loomGetLastError(nullptr));
    if (may_finish && o.res == loomSuccess) {
        XT_CHECK_MSG(o.result_ok, "the call succeeded with a wrong result");
        XT_CHECK_MSG(o.send_intact, "the send buffer was written");
        const loomResult_t next = loomBarrier(comm, nullptr);
        XT_CHECK_MSG(next == loomRemoteError || next == loomInvalidUsage,
                     "the call after the death returned " + loomtest::Show(next));
        return;
    }
    XT_CHECK_LOOM_RES(o.res, loomRemoteError);
    XT_CHECK_MSG(o.seconds < kDetectS, "detection took " + std::to_string(o.seconds) + " s");
    XT_CHECK_NAMES_RANK(kVictim, OpName(op));
    XT_CHECK_MSG(o.send_intact, "the send buffer was written");
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage); // broken for good
}

// Runs KillBody on kRanks ranks over net with LOOM_ALGO=algo; nothing may be left in /dev/shm.
void RunKill(Op op, const std::string &net, const std::string &algo, bool may_finish)
{
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.env = loomtest::FaultEnv(net, 20000);
    opts.env.push_back({"LOOM_ALGO", algo});
    // The tripwires model the victim's own copies into the arena. With single copy its peers
    // read its buffer themselves and find the armed page unreadable, which blames the victim
    // alive (ShmUnreadableBuffer in test_fault_shm.cc); deaths mid single copy: ShmKillMid/cma
    // and ShmKillMidPull.
    if (net == "shm")
        opts.env.push_back({"LOOM_SHM_COLL_CMA", "0"});
    opts.expected_exit = {0, 0, 0, 128 + SIGKILL};
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [op, may_finish](int rank, int, loomComm_t comm) { KillBody(op, rank, comm, may_finish); },
        opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

class KillMidCall : public ::testing::TestWithParam<std::tuple<Op, std::string>> {};

TEST_P(KillMidCall, SurvivorsFailFastNamingTheDeadRank)
{
    // The tripwires sit where the two-shot pattern reads the victim's buffer, and every survivor
    // there waits on the victim itself. In a chained algorithm (ring, recursive halving) a
    // survivor that already holds the victim's contribution finishes correctly instead
    // (docs/reliability.md, "Not covered").
    RunKill(std::get<0>(GetParam()), std::get<1>(GetParam()), "direct", false);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<Op, std::string>> &info)
{
    std::string name = OpName(std::get<0>(info.param));
    if (name == "send/recv")
        name = "sendrecv";
    return name + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(
    All, KillMidCall,
    ::testing::Combine(::testing::Values(Op::AllReduce, Op::AllGather, Op::ReduceScatter,
                                         Op::AllToAll, Op::AllToAllv, Op::Broadcast, Op::SendRecv),
                       ::testing::Values("shm", "tcp")),
    CaseName);

// (collective, a chained algorithm of it, net)
using Chained = std::tuple<Op, std::string, std::string>;

class KillMidChained : public ::testing::TestWithParam<Chained> {};

TEST_P(KillMidChained, SurvivorsFailFastOrFinishExactly)
{
    const Op op = std::get<0>(GetParam());
    RunKill(op, std::get<2>(GetParam()), std::string(OpName(op)) + ":" + std::get<1>(GetParam()),
            true);
}

std::vector<Chained> ChainedCases()
{
    const std::pair<Op, const char *> algos[] = {
        {Op::AllReduce, "ring"},    {Op::AllReduce, "rhd"},
        {Op::AllReduce, "rd"},      {Op::ReduceScatter, "ring"},
        {Op::ReduceScatter, "rhd"}, {Op::AllGather, "ring"},
        {Op::AllGather, "rd"},      {Op::Broadcast, "binomial"},
        {Op::AllToAll, "bruck"},    {Op::Broadcast, "scatter_allgather"}};
    std::vector<Chained> v;
    for (const auto &a : algos)
        for (const char *net : {"shm", "tcp"})
            v.emplace_back(a.first, a.second, net);
    return v;
}

INSTANTIATE_TEST_SUITE_P(All, KillMidChained, ::testing::ValuesIn(ChainedCases()),
                         [](const ::testing::TestParamInfo<Chained> &info) {
                             return std::string(OpName(std::get<0>(info.param))) + "_" +
                                    std::get<1>(info.param) + "_" + std::get<2>(info.param);
                         });

} // namespace

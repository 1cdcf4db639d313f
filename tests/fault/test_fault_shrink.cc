// SPDX-License-Identifier: Apache-2.0
//
// test_fault_shrink.cc - loomCommShrink and loomCommRevoke. A rank killed in the middle of an
// all-reduce (shm, tcp, two modelled hosts; 5 or 4 ranks): the survivors see RemoteError, shrink
// (finding the dead rank themselves, or told it), and run the whole collective grid exactly on
// the smaller communicator, renumbered in order; afterwards no descriptor, thread or /dev/shm
// segment is left. Also: a shrink of a split child, repeated deaths and shrinks down to one rank,
// a planned removal, survivors that disagree on the set (they fail within the timeout, never
// build different communicators), revoke waking a blocked call here and on a peer, and every
// argument error. Run by meson's 'fault' suite.

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "tripwire.h"
#include "verify.h"

namespace {

using loomtest::EnvList;
using loomtest::RunOptions;
using Bytes = std::vector<unsigned char>;

int CountDir(const char *path)
{
    int n = 0;
    if (DIR *d = opendir(path)) {
        while (dirent *e = readdir(d))
            n += e->d_name[0] != '.';
        closedir(d);
    }
    return n;
}

// Descriptors and threads of this process, for the leak checks (the opendir's own descriptor
// is counted alike every time).
struct Resources {
    int fds, threads;
};
Resources Now()
{
    return {CountDir("/proc/self/fd"), CountDir("/proc/self/task")};
}

// Waits up to 3 s for the counts to come back to `base`: the rendezvous thread of a shrink's
// leader ends once every survivor left it, which may be just after this rank did.
void CheckNoLeak(const Resources &base)
{
    Resources now = Now();
    for (int i = 0; i < 300 && (now.fds != base.fds || now.threads != base.threads); i++) {
        usleep(10 * 1000);
        now = Now();
    }
    XT_CHECK_EQ(now.fds, base.fds);
    XT_CHECK_EQ(now.threads, base.threads);
}

// The uneven collectives, float32: rank j's part has count + 7j elements (AllGatherV,
// ReduceScatterV), the part from rank i to rank j count + 5((i + j) % 3) (AllToAllv).
void RunGridV(loomComm_t comm, int n, int me)
{
    for (size_t count : {size_t(1), size_t(30000)}) {
        loomtest::SetContext("v collectives count " + std::to_string(count));
        std::vector<size_t> cnt(n), disp(n);
        size_t total = 0;
        for (int j = 0; j < n; j++) {
            cnt[j] = count + 7 * static_cast<size_t>(j);
            disp[j] = total;
            total += cnt[j];
        }
        std::vector<float> mine(cnt[me]), got(total), want(total);
        loomtest::FillPattern(mine.data(), cnt[me] * 4, me, 21);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + disp[j], cnt[j] * 4, j, 21);
        XT_CHECK_LOOM(loomAllGatherV(mine.data(), cnt[me], got.data(), cnt.data(), disp.data(),
                                     loomFloat32, comm, nullptr));
        XT_CHECK(memcmp(got.data(), want.data(), total * 4) == 0);
        Bytes send(total * 4), red(cnt[me] * 4), ref(total * 4);
        loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, me, 23, 0, total);
        loomtest::FillReduceExpected(ref.data(), loomFloat32, loomSum, n, 23, 0, total);
        XT_CHECK_LOOM(loomReduceScatterV(send.data(), red.data(), cnt.data(), loomFloat32, loomSum,
                                         comm, nullptr));
        XT_CHECK_EQ(
            loomtest::CompareElements(red.data(), ref.data() + disp[me] * 4, cnt[me], loomFloat32),
            "");
        auto part = [count](int from, int to) {
            return count + 5 * static_cast<size_t>((from + to) % 3);
        };
        std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
        size_t sn = 0, rn = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = part(me, j), sd[j] = sn, sn += sc[j];
            rc[j] = part(j, me), rd[j] = rn, rn += rc[j];
        }
        std::vector<float> a2s(sn), a2r(rn), a2w(rn);
        for (int j = 0; j < n; j++) {
            loomtest::FillPattern(a2s.data() + sd[j], sc[j] * 4, me * 64 + j, 25);
            loomtest::FillPattern(a2w.data() + rd[j], rc[j] * 4, j * 64 + me, 25);
        }
        XT_CHECK_LOOM(loomAllToAllv(a2s.data(), sc.data(), sd.data(), a2r.data(), rc.data(),
                                    rd.data(), loomFloat32, comm, nullptr));
        XT_CHECK(memcmp(a2r.data(), a2w.data(), rn * 4) == 0);
    }
}

// The collective grid on comm, every result compared exactly with its reference: each
// collective at 1, 1000 and 70000 elements (past the fault environment's 64 KiB chunks);
// reductions of float32 sum, bfloat16 max and int32 sum; every root; a send/recv ring; and the
// uneven collectives (RunGridV).
void RunGrid(loomComm_t comm)
{
    int n = 0, me = 0;
    XT_CHECK_LOOM(loomCommCount(comm, &n));
    XT_CHECK_LOOM(loomCommUserRank(comm, &me));
    const size_t counts[] = {1, 1000, 70000};
    struct {
        loomDataType_t dt;
        loomRedOp_t op;
    } const reds[] = {{loomFloat32, loomSum}, {loomBfloat16, loomMax}, {loomInt32, loomSum}};
    uint64_t seed = 1;
    for (size_t count : counts) {
        for (const auto &rd : reds) {
            const size_t es = loomtest::TypeSize(rd.dt), total = count * static_cast<size_t>(n);
            loomtest::SetContext("allreduce/reduce/reducescatter " +
                                 std::string(loomtest::TypeName(rd.dt)) + " count " +
                                 std::to_string(count));
            Bytes send(total * es), recv(total * es), want(total * es);
            loomtest::FillReduceInput(send.data(), rd.dt, rd.op, me, seed, 0, total);
            loomtest::FillReduceExpected(want.data(), rd.dt, rd.op, n, seed, 0, total);
            XT_CHECK_LOOM(
                loomAllReduce(send.data(), recv.data(), total, rd.dt, rd.op, comm, nullptr));
            XT_CHECK_EQ(loomtest::CompareElements(recv.data(), want.data(), total, rd.dt), "");
            XT_CHECK_LOOM(
                loomReduceScatter(send.data(), recv.data(), count, rd.dt, rd.op, comm, nullptr));
            XT_CHECK_EQ(
                loomtest::CompareElements(recv.data(), want.data() + me * count * es, count, rd.dt),
                "");
            for (int root = 0; root < n; root++) {
                std::fill(recv.begin(), recv.end(), 0);
                XT_CHECK_LOOM(
                    loomReduce(send.data(), recv.data(), total, rd.dt, rd.op, root, comm, nullptr));
                if (me == root)
                    XT_CHECK_EQ(loomtest::CompareElements(recv.data(), want.data(), total, rd.dt),
                                "");
            }
            seed++;
        }
        loomtest::SetContext("allgather/alltoall/broadcast/sendrecv count " +
                             std::to_string(count));
        const size_t bytes = count * 4, all = bytes * static_cast<size_t>(n);
        Bytes mine(bytes), got(all), want(all), parts(all);
        loomtest::FillPattern(mine.data(), bytes, me, seed);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + j * bytes, bytes, j, seed);
        XT_CHECK_LOOM(loomAllGather(mine.data(), got.data(), count, loomFloat32, comm, nullptr));
        XT_CHECK(got == want);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(parts.data() + j * bytes, bytes, me * 64 + j, seed);
        XT_CHECK_LOOM(loomAllToAll(parts.data(), got.data(), count, loomFloat32, comm, nullptr));
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + j * bytes, bytes, j * 64 + me, seed);
        XT_CHECK(got == want);
        for (int root = 0; root < n; root++) {
            Bytes buf(bytes), ref(bytes);
            loomtest::FillPattern(ref.data(), bytes, root, seed + 7);
            if (me == root)
                buf = ref;
            XT_CHECK_LOOM(
                loomBroadcast(buf.data(), buf.data(), count, loomFloat32, root, comm, nullptr));
            XT_CHECK(buf == ref);
        }
        Bytes ring(bytes), ref(bytes);
        const int to = (me + 1) % n, from = (me + n - 1) % n;
        loomtest::FillPattern(ref.data(), bytes, from, seed + 9);
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(mine.data(), 0, loomFloat32, to, comm, nullptr)); // zero bytes
        XT_CHECK_LOOM(loomRecv(ring.data(), 0, loomFloat32, from, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        Bytes out(bytes);
        loomtest::FillPattern(out.data(), bytes, me, seed + 9);
        XT_CHECK_LOOM(loomGroupStart());
        XT_CHECK_LOOM(loomSend(out.data(), count, loomFloat32, to, comm, nullptr));
        XT_CHECK_LOOM(loomRecv(ring.data(), count, loomFloat32, from, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK(ring == ref);
        seed++;
    }
    RunGridV(comm, n, me);
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    loomtest::SetContext("");
}

// Rank r of the parent after the ranks of `gone` are removed.
int Renumbered(int r, const std::vector<int> &gone)
{
    int k = r;
    for (int g : gone)
        k -= g < r;
    return k;
}

// Shrinks comm without `gone` (found dead when find is set, else told), checks the new
// communicator's size and this rank's number in it, and returns it.
loomComm_t ShrinkChecked(loomComm_t comm, int rank, int nranks, const std::vector<int> &gone,
                         bool find, int flags = LOOM_SHRINK_DEFAULT)
{
    loomComm_t child = nullptr;
    const double t0 = loomtest::NowSec();
    XT_CHECK_LOOM(loomCommShrink(comm, find ? nullptr : gone.data(),
                                 find ? 0 : static_cast<int>(gone.size()), &child, nullptr, flags));
    fprintf(stderr, "rank %d: shrink of %d ranks without %zu took %.1f ms\n", rank, nranks,
            gone.size(), (loomtest::NowSec() - t0) * 1e3);
    XT_CHECK(child != nullptr);
    int n = 0, me = -1;
    XT_CHECK_LOOM(loomCommCount(child, &n));
    XT_CHECK_LOOM(loomCommUserRank(child, &me));
    XT_CHECK_EQ(n, nranks - static_cast<int>(gone.size()));
    XT_CHECK_EQ(me, Renumbered(rank, gone));
    return child;
}

// Dies (SIGKILL) in the middle of an all-reduce of 4 MiB whose second half is past a tripwire;
// on a survivor, the same all-reduce returns RemoteError naming the victim.
void AllReduceWithVictim(loomComm_t comm, int rank, int victim)
{
    const size_t count = 1u << 20;
    loomtest::TripBuffer send(count * 4);
    Bytes recv(count * 4);
    if (rank == victim)
        send.Arm(count * 2, SIGKILL);
    XT_CHECK_SURVIVOR_OF(rank, victim, "all-reduce", "allreduce", [&] {
        return loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    });
}

RunOptions FaultOptions(const std::string &layout, int nranks, const std::vector<int> &victims,
                        std::vector<int> *pids)
{
    RunOptions opts;
    opts.env = loomtest::FaultEnv(layout == "tcp" ? "tcp" : "", 20000);
    opts.env.push_back({"LOOM_ALGO", "direct"}); // every survivor waits on the victim
    if (layout == "hosts") {
        const int per_host = (nranks + 1) / 2;
        opts.rank_env = [per_host](int rank) {
            return EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / per_host)}};
        };
    }
    opts.create_comm = false;
    opts.deadline_s = 90;
    opts.expected_exit.assign(static_cast<size_t>(nranks), 0);
    for (int v : victims)
        opts.expected_exit[static_cast<size_t>(v)] = 128 + SIGKILL;
    opts.pids_out = pids;
    return opts;
}

::testing::AssertionResult NoShmLeft(const std::vector<int> &pids)
{
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    if (!left.empty())
        return ::testing::AssertionFailure() << "left in /dev/shm: " << left.front();
    return ::testing::AssertionSuccess();
}

// A warm-up communicator first, so that what a process opens once (logs, topology) is in the
// baseline of the leak check.
void WarmUp()
{
    loomComm_t w = loomtest::CreateComm();
    XT_CHECK_LOOM(loomCommDestroy(w));
}

struct KillCase {
    const char *layout;
    int nranks, victim;
    bool find; // survivors find the dead rank themselves
};

class ShrinkAfterKill : public ::testing::TestWithParam<KillCase> {};

TEST_P(ShrinkAfterKill, SurvivorsRunTheGrid)
{
    const KillCase kc = GetParam();
    std::vector<int> pids;
    auto body = [kc](int rank, int nranks, loomComm_t) {
        WarmUp();
        const Resources base = Now();
        loomComm_t comm = loomtest::CreateComm();
        XT_CHECK_LOOM(loomBarrier(comm, nullptr)); // every connection carried a call
        if (rank == kc.victim)
            usleep(20 * 1000);
        AllReduceWithVictim(comm, rank, kc.victim);
        // The failed call broke this rank's connections; the parent is revoked by the shrink.
        loomComm_t child = ShrinkChecked(comm, rank, nranks, {kc.victim}, kc.find);
        RunGrid(child);
        XT_CHECK_LOOM(loomCommDestroy(child));
        XT_CHECK_LOOM(loomCommDestroy(comm));
        CheckNoLeak(base);
    };
    ASSERT_TRUE(loomtest::RunRanks(kc.nranks, body,
                                   FaultOptions(kc.layout, kc.nranks, {kc.victim}, &pids)));
    EXPECT_TRUE(NoShmLeft(pids));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShrinkAfterKill,
    ::testing::Values(KillCase{"shm", 5, 2, true}, KillCase{"shm", 4, 0, false},
                      KillCase{"tcp", 5, 4, true}, KillCase{"hosts", 4, 1, true},
                      KillCase{"hosts", 5, 3, false}),
    [](const ::testing::TestParamInfo<KillCase> &i) {
        return std::string(i.param.layout) + "_" + std::to_string(i.param.nranks) + "ranks_kill" +
               std::to_string(i.param.victim) + (i.param.find ? "_found" : "_told");
    });

// A split child loses a member: its survivors shrink it (the parent is left alone: destroyed
// after, its own connections to the dead rank simply closed).
TEST(Shrink, SplitChild)
{
    std::vector<int> pids;
    auto body = [](int rank, int nranks, loomComm_t) {
        loomComm_t world = loomtest::CreateComm();
        loomComm_t half = nullptr;
        XT_CHECK_LOOM(
            loomCommSplit(world, rank < 4 ? 0 : LOOM_SPLIT_NOCOLOR, rank, &half, nullptr));
        if (rank < 4) {
            XT_CHECK_LOOM(loomBarrier(half, nullptr));
            if (rank == 2)
                usleep(20 * 1000);
            AllReduceWithVictim(half, rank, 2);
            loomComm_t child = ShrinkChecked(half, rank, 4, {2}, true);
            RunGrid(child);
            XT_CHECK_LOOM(loomCommDestroy(child));
            XT_CHECK_LOOM(loomCommDestroy(half));
        }
        (void)nranks;
        // Rank 4 destroys (its notice comes after the data its peers still read); the others
        // abort, since rank 2 is gone from the world too.
        XT_CHECK_LOOM(rank == 4 ? loomCommDestroy(world) : loomCommAbort(world));
    };
    ASSERT_TRUE(loomtest::RunRanks(5, body, FaultOptions("shm", 5, {2}, &pids)));
    EXPECT_TRUE(NoShmLeft(pids));
}

// Each round the highest rank dies outside any call; the others learn of it from a failed
// barrier, shrink, and go on until one rank is left. A one-rank communicator still runs the
// grid.
TEST(Shrink, RepeatedDownToOneRank)
{
    std::vector<int> pids;
    auto body = [](int rank, int nranks, loomComm_t) {
        WarmUp();
        const Resources base = Now();
        loomComm_t comm = loomtest::CreateComm();
        std::vector<loomComm_t> old;
        for (int size = nranks; size > 1; size--) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            if (rank == size - 1)
                raise(SIGKILL);
            const loomResult_t r = loomBarrier(comm, nullptr);
            XT_CHECK_EQ(r, loomRemoteError);
            old.push_back(comm);
            comm = ShrinkChecked(comm, rank, size, {size - 1}, size % 2 == 0);
            RunGrid(comm);
        }
        XT_CHECK_LOOM(loomCommDestroy(comm));
        for (loomComm_t c : old)
            XT_CHECK_LOOM(loomCommDestroy(c));
        CheckNoLeak(base);
    };
    ASSERT_TRUE(loomtest::RunRanks(4, body, FaultOptions("shm", 4, {1, 2, 3}, &pids)));
    EXPECT_TRUE(NoShmLeft(pids));
}

// A planned removal: rank 1 leaves; the others shrink without revoking the parent, which
// still carries their messages.
TEST(Shrink, PlannedRemovalKeepsTheParent)
{
    auto body = [](int rank, int nranks, loomComm_t comm) {
        XT_CHECK_LOOM(loomBarrier(comm, nullptr));
        if (rank == 1)
            return; // leaves; the harness destroys its handle
        const int gone[] = {1};
        loomComm_t child = nullptr;
        XT_CHECK_LOOM(loomCommShrink(comm, gone, 1, &child, nullptr, LOOM_SHRINK_PLANNED));
        int n = 0, me = -1;
        XT_CHECK_LOOM(loomCommCount(child, &n));
        XT_CHECK_LOOM(loomCommUserRank(child, &me));
        XT_CHECK_EQ(n, nranks - 1);
        XT_CHECK_EQ(me, rank == 0 ? 0 : 1);
        RunGrid(child);
        float v = static_cast<float>(rank), got = -1;
        XT_CHECK_LOOM(loomGroupStart()); // 0 <-> 2 over the parent
        XT_CHECK_LOOM(loomSend(&v, 1, loomFloat32, 2 - rank, comm, nullptr));
        XT_CHECK_LOOM(loomRecv(&got, 1, loomFloat32, 2 - rank, comm, nullptr));
        XT_CHECK_LOOM(loomGroupEnd());
        XT_CHECK_EQ(got, static_cast<float>(2 - rank));
        XT_CHECK_LOOM(loomCommDestroy(child));
    };
    RunOptions opts;
    opts.env = loomtest::FaultEnv("", 20000);
    ASSERT_TRUE(loomtest::RunRanks(3, body, opts));
}

// Survivors that disagree on the set fail, each within its timeout (3 s here), and none gets a
// communicator.
TEST(Shrink, DisagreeingSurvivorsFail)
{
    auto body = [](int rank, int, loomComm_t comm) {
        if (rank == 3)
            return; // alive, never shrinks: the others' lists differ on whether it is gone
        const int mine[] = {rank == 2 ? 1 : 3};
        loomComm_t child = reinterpret_cast<loomComm_t>(&child);
        const double t0 = loomtest::NowSec();
        const loomResult_t r = loomCommShrink(comm, mine, 1, &child, nullptr, LOOM_SHRINK_PLANNED);
        const double secs = loomtest::NowSec() - t0;
        fprintf(stderr, "rank %d: shrink returned %s after %.2f s: %s\n", rank,
                loomtest::Show(r).c_str(), secs, loomGetLastError(nullptr));
        XT_CHECK(r != loomSuccess);
        XT_CHECK(child == nullptr);
        XT_CHECK(secs < 10);
    };
    RunOptions opts;
    opts.env = loomtest::FaultEnv("", 3000);
    ASSERT_TRUE(loomtest::RunRanks(4, body, opts));
}

// Revoke: a receive blocked on this rank (another thread) and on a peer both fail at once; the
// revoked communicator refuses later calls with RemoteError saying so, and can still be shrunk
// and destroyed.
TEST(Revoke, WakesBlockedCallsHereAndOnPeers)
{
    auto body = [](int rank, int, loomComm_t comm) {
        XT_CHECK_LOOM(loomBarrier(comm, nullptr));
        float x = 0;
        const double t0 = loomtest::NowSec();
        if (rank == 0) {
            loomResult_t blocked = loomSuccess;
            std::thread t([&] { blocked = loomRecv(&x, 1, loomFloat32, 1, comm, nullptr); });
            usleep(200 * 1000);
            XT_CHECK_LOOM(loomCommRevoke(comm, LOOM_REVOKE_DEFAULT));
            t.join();
            XT_CHECK_EQ(blocked, loomRemoteError);
            XT_CHECK_LOOM(loomCommRevoke(comm, LOOM_REVOKE_DEFAULT)); // again: a no-op
            XT_CHECK_EQ(loomAllReduce(&x, &x, 1, loomFloat32, loomSum, comm, nullptr),
                        loomRemoteError);
            XT_CHECK_MSG(strstr(loomGetLastError(nullptr), "revoked") != nullptr,
                         loomGetLastError(nullptr));
        } else {
            XT_CHECK_EQ(loomRecv(&x, 1, loomFloat32, 0, comm, nullptr), loomRemoteError);
        }
        XT_CHECK(loomtest::NowSec() - t0 < 3.0); // the timeout is 20 s
        loomComm_t child = ShrinkChecked(comm, rank, 2, {}, false, LOOM_SHRINK_DEFAULT);
        RunGrid(child);
        XT_CHECK_LOOM(loomCommDestroy(child));
    };
    RunOptions opts;
    opts.env = loomtest::FaultEnv("", 20000);
    ASSERT_TRUE(loomtest::RunRanks(2, body, opts));
}

TEST(Shrink, ArgumentErrors)
{
    auto body = [](int rank, int, loomComm_t comm) {
        loomComm_t child = nullptr;
        const int self[] = {rank}, out[] = {7}, twice[] = {1 - rank, 1 - rank};
        XT_CHECK_LOOM_RES(loomCommShrink(comm, self, 1, &child, nullptr, 0), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, out, 1, &child, nullptr, 0), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, twice, 2, &child, nullptr, 0), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, nullptr, 1, &child, nullptr, 0),
                          loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, out, -1, &child, nullptr, 0), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, nullptr, 0, nullptr, nullptr, 0),
                          loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, nullptr, 0, &child, nullptr, LOOM_SHRINK_PLANNED),
                          loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(comm, nullptr, 0, &child, nullptr, 5),
                          loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommRevoke(comm, 1), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommRevoke(nullptr, 0), loomInvalidArgument);
        XT_CHECK_LOOM_RES(loomCommShrink(nullptr, nullptr, 0, &child, nullptr, 0),
                          loomInvalidArgument);
        XT_CHECK(child == nullptr);
        XT_CHECK_LOOM(loomBarrier(comm, nullptr)); // none of them touched the communicator
    };
    ASSERT_TRUE(loomtest::RunRanks(2, body));
}

} // namespace

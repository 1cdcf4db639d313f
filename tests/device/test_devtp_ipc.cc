// SPDX-License-Identifier: Apache-2.0
//
// test_devtp_ipc.cc - the ipc device transport (src/device/transport/devtp_ipc*.c) driven
// through its table on the runtime LOOM_DEVICE names (the suite runs the emulation): 2 and 4
// ranks as processes (IPC mappings) and as threads of one process (plain pointers); every
// collective, fp32/fp16/bf16/int32, every op, counts 0, 1, odd and past the scratch (chunks),
// in place, host and device buffers, bit for bit against loom's host collectives; many calls
// queued back to back on one stream; release() freeing a stream whose peer never comes; the
// same queued sequence run twice with the flags back at rest after each (what a CUDA graph's
// replay relies on); and the agreement of open (every rank fails alike, with the failing
// rank's reason). Run by meson's 'device' suite.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <string>
#include <thread>
#include <vector>

#include "devrt_emu.h"
#include "devtp_case.h"
#include "devtp_ipc.h"
#include "mp_fixture.h"
extern "C" {
#include "param.h"
}

namespace {

using devtest::Rank;
using loomtest::RunOptions;
using loomtest::RunRanks;

constexpr double kDeadline = 240.0;

// Skips the run (every rank) without a device runtime.
bool NeedRuntime()
{
    if (devtest::Runtime() != nullptr)
        return true;
    loomtest::SkipRun(std::string("no device runtime: ") + loom_devrt_why_none());
    return false;
}

// Opens the ipc transport for this rank and makes its stream.
void Open(Rank &r, loomComm_t comm, int rank, int nranks)
{
    devtest::FillComm(r, comm, rank, nranks);
    char why[160] = "";
    loomResult_t res = loom_devtp_ipc.open(&r.dc, &r.state, why, sizeof(why));
    XT_CHECK_MSG(res == loomSuccess, why);
    XT_CHECK_LOOM(r.dc.rt->stream_create(&r.s));
}

// After a barrier: every rank's streams are done with the pool.
void Close(Rank &r)
{
    XT_CHECK_LOOM(loomBarrier(r.dc.comm, nullptr));
    r.pool.Free();
    loom_devtp_ipc.close(&r.dc, r.state);
    r.state = nullptr;
    XT_CHECK_LOOM(r.dc.rt->stream_destroy(r.s));
}

// The flags of this rank's block are at rest: ready 0, done 1 (what open stores), once every
// rank's stream has finished (the caller waited for its own; the barrier for the others').
void CheckFlagsAtRest(const Rank &r)
{
    XT_CHECK_LOOM(loomBarrier(r.dc.comm, nullptr));
    const auto *st = static_cast<const ipc_state_t *>(r.state);
    for (int p = 0; p < st->nranks; p++) {
        if (p == st->rank)
            continue;
        XT_CHECK_EQ(__atomic_load_n(ipc_flag_host(st, st->rank, IPC_READY, p), __ATOMIC_ACQUIRE),
                    0u);
        XT_CHECK_EQ(__atomic_load_n(ipc_flag_host(st, st->rank, IPC_DONE, p), __ATOMIC_ACQUIRE),
                    1u);
    }
}

void GridBody(int rank, int nranks, loomComm_t comm)
{
    if (!NeedRuntime())
        return;
    Rank r;
    Open(r, comm, rank, nranks);
    for (const devtest::Case &c : devtest::Grid(nranks, {0, 1, 1001, 4099}))
        devtest::CheckCase(&loom_devtp_ipc, r, comm, c);
    CheckFlagsAtRest(r);
    Close(r);
}

RunOptions SmallScratch()
{
    RunOptions o;
    o.env = {{"LOOM_DEVICE", "emulated"}, {"LOOM_DEVICE_IPC_BYTES", "4096"}};
    o.deadline_s = kDeadline;
    return o;
}

// Ranks as threads: one process runs them all.
void InThreads(int nranks, const std::function<void(int, int, loomComm_t)> &body)
{
    RunOptions o = SmallScratch();
    o.create_comm = false;
    XT_ASSERT_RUN(RunRanks(
        1, [&](int, int, loomComm_t) { devtest::RunThreads(nranks, body); }, o));
}

TEST(DevtpIpc, GridTwoProcesses)
{
    XT_ASSERT_RUN(RunRanks(2, GridBody, SmallScratch()));
}

TEST(DevtpIpc, GridFourProcesses)
{
    XT_ASSERT_RUN(RunRanks(4, GridBody, SmallScratch()));
}

TEST(DevtpIpc, GridTwoThreads)
{
    InThreads(2, GridBody);
}

TEST(DevtpIpc, GridFourThreads)
{
    InThreads(4, GridBody);
}

// One call as large as a few MiB in a single chunk of the default scratch, and the same past it.
TEST(DevtpIpc, LargeCalls)
{
    RunOptions o;
    o.env = {{"LOOM_DEVICE", "emulated"}};
    o.deadline_s = kDeadline;
    XT_ASSERT_RUN(RunRanks(
        3,
        [](int rank, int nranks, loomComm_t comm) {
            if (!NeedRuntime())
                return;
            Rank r;
            Open(r, comm, rank, nranks);
            const size_t big = (size_t{1} << 20) + 3;
            devtest::Case cases[] = {
                {loomCollAllReduce, loomBfloat16, loomSum, big, false, 0, false, false, 1},
                {loomCollAllGather, loomFloat32, loomSum, big, true, 0, false, false, 2},
                {loomCollReduceScatter, loomFloat32, loomAvg, big, false, 0, false, true, 3},
                {loomCollAllReduce, loomFloat32, loomSum, (size_t{9} << 20) + 5, true, 0, false,
                 false, 4}, // 36 MiB: two chunks of the default 32 MiB scratch
            };
            for (const auto &c : cases)
                devtest::CheckCase(&loom_devtp_ipc, r, comm, c);
            CheckFlagsAtRest(r);
            Close(r);
        },
        o));
}

// Many calls on one stream without a wait between them: the flags are reused call after call,
// each call's buffers are its own, and every result is checked once the stream drained.
void BackToBackBody(int rank, int nranks, loomComm_t comm)
{
    if (!NeedRuntime())
        return;
    Rank r;
    Open(r, comm, rank, nranks);
    const loom_devrt_t *rt = r.dc.rt;
    const int calls = 40;
    const size_t count = 3001; // three chunks of a 4 KiB scratch in fp32
    std::vector<devtest::Case> cases;
    std::vector<devtest::Buffers> bufs(calls);
    std::vector<std::vector<uint8_t>> want(calls);
    for (int i = 0; i < calls; i++) {
        devtest::Case c{i % 2 ? loomCollAllReduce : loomCollReduceScatter,
                        i % 3 ? loomFloat32 : loomBfloat16,
                        static_cast<loomRedOp_t>(i % loomNumOps),
                        count,
                        false,
                        0,
                        false,
                        false,
                        static_cast<uint64_t>(1000 + i)};
        size_t es = c.dt == loomFloat32 ? 4 : 2;
        size_t se = devtest::SendElems(c.coll, count, nranks);
        std::vector<uint8_t> in = devtest::Input(c, rank, se);
        bufs[i].rt = rt;
        bufs[i].send = bufs[i].Alloc(se * es, false);
        bufs[i].recv = bufs[i].Alloc(count * es, false);
        devtest::ToBuffer(rt, r.s, bufs[i].send, in.data(), in.size());
        want[i].resize(count * es);
        if (c.coll == loomCollAllReduce)
            XT_CHECK_LOOM(
                loomAllReduce(in.data(), want[i].data(), count, c.dt, c.op, comm, nullptr));
        else
            XT_CHECK_LOOM(
                loomReduceScatter(in.data(), want[i].data(), count, c.dt, c.op, comm, nullptr));
        cases.push_back(c);
    }
    for (int i = 0; i < calls; i++) {
        loom_coll_args_t a{};
        a.kind = devtest::Kind(cases[i].coll);
        a.sendbuff = bufs[i].send;
        a.recvbuff = bufs[i].recv;
        a.count = count;
        a.dt = cases[i].dt;
        a.op = cases[i].op;
        XT_CHECK_LOOM(loom_devtp_ipc.run(&r.dc, r.state, &a, r.s));
    }
    XT_CHECK(devtest::StreamWait(rt, r.s, 120));
    for (int i = 0; i < calls; i++) {
        std::vector<uint8_t> got(want[i].size());
        devtest::FromBuffer(rt, r.s, got.data(), bufs[i].recv, got.size());
        loomtest::SetContext("call " + std::to_string(i) + ": " + cases[i].Name());
        XT_CHECK(got == want[i]);
    }
    CheckFlagsAtRest(r);
    Close(r);
}

TEST(DevtpIpc, BackToBackProcesses)
{
    XT_ASSERT_RUN(RunRanks(3, BackToBackBody, SmallScratch()));
}

TEST(DevtpIpc, BackToBackThreads)
{
    InThreads(4, BackToBackBody);
}

// Rank 1 never calls: rank 0's stream waits in the protocol until release() stores the abort
// value, which must free it (every chunk of the call: each waits on the same words again)
// within a second. Afterwards run() refuses, and both ranks close without hanging.
void ReleaseBody(int rank, int nranks, loomComm_t comm)
{
    if (!NeedRuntime())
        return;
    Rank r;
    Open(r, comm, rank, nranks);
    const loom_devrt_t *rt = r.dc.rt;
    if (rank == 0) {
        const size_t count = 5000; // five chunks of a 4 KiB scratch
        devtest::Buffers b;
        b.rt = rt;
        void *buf = b.Alloc(count * 4, false);
        loom_coll_args_t a{};
        a.kind = LOOM_COLL_ALLREDUCE;
        a.sendbuff = a.recvbuff = buf;
        a.count = count;
        a.dt = loomFloat32;
        a.op = loomSum;
        XT_CHECK_LOOM(loom_devtp_ipc.run(&r.dc, r.state, &a, r.s));
        XT_CHECK_LOOM(loom_devtp_ipc.run(&r.dc, r.state, &a, r.s));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        XT_CHECK_EQ(rt->stream_query(r.s), loomInProgress);
        auto t0 = std::chrono::steady_clock::now();
        std::thread releaser([&] { loom_devtp_ipc.release(&r.dc, r.state); });
        releaser.join();
        XT_CHECK_MSG(devtest::StreamWait(rt, r.s, 1.0), "release did not free the stream in 1 s");
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("stream released after %.3f s\n", took);
        XT_CHECK_EQ(loom_devtp_ipc.run(&r.dc, r.state, &a, r.s), loomInvalidUsage);
    }
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    Close(r);
}

TEST(DevtpIpc, ReleaseFreesWaitingStreamProcesses)
{
    XT_ASSERT_RUN(RunRanks(2, ReleaseBody, SmallScratch()));
}

TEST(DevtpIpc, ReleaseFreesWaitingStreamThreads)
{
    InThreads(3, ReleaseBody);
}

// A graph replay runs the very operations queued at capture again: the same run() calls on
// the same buffers, twice, must give the same correct results, and leave the flags at rest
// each time. The second time the stream says it is capturing (the emulation's marker), so the
// transport queues exactly what a capture would record.
void ReplayBody(int rank, int nranks, loomComm_t comm)
{
    if (!NeedRuntime())
        return;
    Rank r;
    Open(r, comm, rank, nranks);
    const loom_devrt_t *rt = r.dc.rt;
    const bool emulated = std::strcmp(rt->name, "emulated") == 0;
    const size_t count = 2500;
    devtest::Case seq[] = {
        {loomCollAllReduce, loomBfloat16, loomSum, count, true, 0, false, false, 11},
        {loomCollReduceScatter, loomFloat32, loomMax, count, false, 0, false, false, 12},
        {loomCollAllGather, loomFloat16, loomSum, count, false, 0, false, false, 13},
        {loomCollAllToAll, loomInt32, loomSum, count, false, 0, false, false, 14},
    };
    const int n = sizeof(seq) / sizeof(seq[0]);
    std::vector<devtest::Buffers> bufs(n);
    std::vector<std::vector<uint8_t>> in(n), want(n);
    std::vector<loom_coll_args_t> args(n);
    for (int i = 0; i < n; i++) {
        const devtest::Case &c = seq[i];
        size_t es = c.dt == loomFloat32 || c.dt == loomInt32 ? 4 : 2;
        size_t se = devtest::SendElems(c.coll, count, nranks);
        size_t re = devtest::RecvElems(c.coll, count, nranks);
        in[i] = devtest::Input(c, rank, se);
        want[i].resize(re * es);
        bufs[i].rt = rt;
        void *send = bufs[i].Alloc(se * es, false);
        void *recv = c.inplace ? send : bufs[i].Alloc(re * es, false);
        loom_coll_args_t a{};
        a.kind = devtest::Kind(c.coll);
        a.sendbuff = send;
        a.recvbuff = recv;
        a.count = count;
        a.dt = c.dt;
        a.op = c.op;
        args[i] = a;
        switch (c.coll) {
        case loomCollAllReduce:
            XT_CHECK_LOOM(
                loomAllReduce(in[i].data(), want[i].data(), count, c.dt, c.op, comm, nullptr));
            break;
        case loomCollReduceScatter:
            XT_CHECK_LOOM(
                loomReduceScatter(in[i].data(), want[i].data(), count, c.dt, c.op, comm, nullptr));
            break;
        case loomCollAllGather:
            XT_CHECK_LOOM(loomAllGather(in[i].data(), want[i].data(), count, c.dt, comm, nullptr));
            break;
        default:
            XT_CHECK_LOOM(loomAllToAll(in[i].data(), want[i].data(), count, c.dt, comm, nullptr));
            break;
        }
    }
    for (int replay = 0; replay < 2; replay++) {
        loomtest::SetContext("replay " + std::to_string(replay));
        for (int i = 0; i < n; i++) // the inputs the "graph" starts from (in place overwrites)
            devtest::ToBuffer(rt, r.s, const_cast<void *>(args[i].sendbuff), in[i].data(),
                              in[i].size());
        if (replay == 1 && emulated)
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(r.s, 1));
        for (int i = 0; i < n; i++)
            XT_CHECK_LOOM(loom_devtp_ipc.run(&r.dc, r.state, &args[i], r.s));
        XT_CHECK(devtest::StreamWait(rt, r.s, 60));
        if (replay == 1 && emulated)
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(r.s, 0));
        for (int i = 0; i < n; i++) {
            std::vector<uint8_t> got(want[i].size());
            devtest::FromBuffer(rt, r.s, got.data(), args[i].recvbuff, got.size());
            loomtest::SetContext("replay " + std::to_string(replay) + ": " + seq[i].Name());
            XT_CHECK(got == want[i]);
        }
        CheckFlagsAtRest(r);
        XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    }
    Close(r);
}

TEST(DevtpIpc, ReplayProcesses)
{
    XT_ASSERT_RUN(RunRanks(2, ReplayBody, SmallScratch()));
}

TEST(DevtpIpc, ReplayThreads)
{
    InThreads(4, ReplayBody);
}

// open's agreement: one rank's failure is every rank's, with that rank's reason.
void ExpectOpenFails(int rank, int nranks, loomComm_t comm, loomResult_t want, const char *text)
{
    Rank r;
    devtest::FillComm(r, comm, rank, nranks);
    char why[160] = "";
    loomResult_t res = loom_devtp_ipc.open(&r.dc, &r.state, why, sizeof(why));
    std::printf("rank %d: open: %d, %s\n", rank, (int)res, why);
    XT_CHECK_EQ(res, want);
    XT_CHECK(r.state == nullptr);
    XT_CHECK_MSG(std::strstr(why, text) != nullptr, why);
}

TEST(DevtpIpc, OpenFailsAlikeWhenRankZeroCannotMakeTheSegment)
{
    XT_ASSERT_RUN(RunRanks(
        3,
        [](int rank, int nranks, loomComm_t comm) {
            if (!NeedRuntime())
                return;
            if (rank == 0) { // after the communicator, whose shm transport needs the directory
                setenv("LOOM_SHM_DIR", "/nonexistent-loom-dir", 1);
                loom_param_reset_cache();
            }
            ExpectOpenFails(rank, nranks, comm, loomSystemError,
                            "rank 0: cannot create the flags segment /nonexistent-loom-dir/");
        },
        SmallScratch()));
}

TEST(DevtpIpc, OpenFailsAlikeWhenOneRankCannotAllocate)
{
    RunOptions o = SmallScratch();
    o.rank_env = [](int rank) {
        loomtest::EnvList e;
        if (rank == 2)
            e.push_back({"LOOM_DEVICE_IPC_BYTES", "204800G"}); // 200 TiB: no mapping that large
        return e;
    };
    XT_ASSERT_RUN(RunRanks(
        3,
        [](int rank, int nranks, loomComm_t comm) {
            if (!NeedRuntime())
                return;
            ExpectOpenFails(rank, nranks, comm, loomSystemError,
                            "rank 2: cannot allocate 219902325555200 bytes of device scratch");
        },
        o));
}

TEST(DevtpIpc, OpenRefusesThreadsOnTwoDevices)
{
    InThreads(2, [](int rank, int nranks, loomComm_t comm) {
        if (!NeedRuntime())
            return;
        Rank r;
        devtest::FillComm(r, comm, rank, nranks);
        r.dc.device = rank; // as if each thread had its own GPU
        char why[160] = "";
        XT_CHECK_EQ(loom_devtp_ipc.open(&r.dc, &r.state, why, sizeof(why)), loomInvalidUsage);
        XT_CHECK_MSG(std::strstr(why, "threads of one process on devices 0 and 1") != nullptr, why);
    });
}

TEST(DevtpIpc, OpenRefusesSeveralHosts)
{
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int nranks, loomComm_t comm) {
            if (!NeedRuntime())
                return;
            Rank r;
            devtest::FillComm(r, comm, rank, nranks);
            r.dc.all_local = 0;
            char why[160] = "";
            XT_CHECK_EQ(loom_devtp_ipc.open(&r.dc, &r.state, why, sizeof(why)), loomInvalidUsage);
            XT_CHECK_MSG(std::strstr(why, "span several hosts") != nullptr, why);
        },
        SmallScratch()));
}

// Open and close leave no device memory, mapping or segment name behind.
TEST(DevtpIpc, CloseLeavesNothing)
{
    RunOptions o = SmallScratch();
    o.create_comm = false;
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int nranks, loomComm_t) {
            // The segment's directory is the run's own, so that a name left behind shows.
            setenv("LOOM_SHM_DIR", loomtest::RunDir().c_str(), 1);
            loomComm_t comm = loomtest::CreateComm();
            if (!NeedRuntime()) {
                loomCommDestroy(comm);
                return;
            }
            if (std::strcmp(devtest::Runtime()->name, "emulated") != 0) {
                loomtest::SkipRun("counts memory through the emulation");
                return;
            }
            loom_devrt_emu_counts_t before, after;
            loom_devrt_emu_counts(&before);
            for (int round = 0; round < 3; round++) {
                Rank r;
                Open(r, comm, rank, nranks);
                devtest::CheckCase(
                    &loom_devtp_ipc, r, comm,
                    {loomCollAllReduce, loomFloat32, loomSum, 777, false, 0, false, true, 5});
                Close(r);
            }
            loom_devrt_emu_counts(&after);
            XT_CHECK_EQ(after.dev, before.dev);
            XT_CHECK_EQ(after.ipc, before.ipc);
            XT_CHECK_EQ(after.mapped, before.mapped);
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            DIR *d = opendir(loomtest::RunDir().c_str());
            XT_CHECK(d != nullptr);
            while (struct dirent *e = readdir(d))
                XT_CHECK_MSG(std::strstr(e->d_name, "devipc") == nullptr, e->d_name);
            closedir(d);
            XT_CHECK_LOOM(loomCommDestroy(comm));
        },
        o));
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_devtp_nccl.cc - the nccl device transport (src/device/transport/devtp_nccl*.c) without a
// GPU: paired with libfake-nccl-dev.so (fake_nccl_dev.c: NCCL's calls over a private loom on
// host memory, ordered with the emulated stream through a synchronizer this test gives it),
// under the emulated runtime, admitted by the transport's test seam (any runtime, a GPU id per
// rank). Checked: every collective, fp32/fp16/bf16/int32, every op, counts 0, 1, even and odd
// block splits and past the scratch (chunks), in place, host buffers staged, bit for bit
// against loom's host collectives, on 2, 3 and 4 ranks as processes and as threads; calls back
// to back on one stream; release (ncclCommAbort) and the refusals open gives, each naming its
// cause on every rank: no CUDA runtime, two ranks on one GPU, a relative or unusable
// LOOM_NCCL_LIBRARY, loom's own drop-in library. Run by meson's 'device' suite.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <string>
#include <thread>

#include "devtp_case.h"
#include "devtp_nccl.h"
#include "mp_fixture.h"

namespace {

using devtest::Rank;
using loomtest::RunOptions;
using loomtest::RunRanks;

constexpr double kDeadline = 240.0;

const char *FakePath()
{
    const char *p = std::getenv("LOOM_FAKE_NCCL_DEV");
    return p != nullptr ? p : "";
}

int DistinctGpu(const loom_dev_comm_t *dc, char *id, size_t len, char *, size_t)
{
    std::snprintf(id, len, "fake-gpu-%d", dc->rank);
    return 0;
}

int SharedGpu(const loom_dev_comm_t *, char *id, size_t len, char *, size_t)
{
    std::snprintf(id, len, "0000:19:00.0");
    return 0;
}

int SyncStream(void *s)
{
    return devtest::StreamWait(devtest::Runtime(), static_cast<loom_dev_stream_t>(s), 60) ? 0 : -1;
}

// Points the transport at the fake and the fake at this process's runtime.
bool Prepare(bool seam = true,
             int (*gpu)(const loom_dev_comm_t *, char *, size_t, char *, size_t) = DistinctGpu)
{
    if (devtest::Runtime() == nullptr) {
        loomtest::SkipRun(std::string("no device runtime: ") + loom_devrt_why_none());
        return false;
    }
    void *h = dlopen(FakePath(), RTLD_NOW | RTLD_LOCAL);
    XT_CHECK_MSG(h != nullptr, dlerror());
    auto set = reinterpret_cast<void (*)(int (*)(void *))>(dlsym(h, "fakeNcclDevSetStreamSync"));
    XT_CHECK(set != nullptr);
    set(SyncStream);
    loom_devtp_nccl_seam_t sm{};
    sm.any_runtime = seam ? 1 : 0;
    sm.gpu_id = seam ? gpu : nullptr;
    loom_devtp_nccl_set_seam(&sm);
    return true;
}

long FakeCount(const char *name)
{
    void *h = dlopen(FakePath(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    XT_CHECK(h != nullptr);
    auto count = reinterpret_cast<long (*)(const char *)>(dlsym(h, "fakeNcclDevCount"));
    XT_CHECK(count != nullptr);
    return count(name);
}

void Open(Rank &r, loomComm_t comm, int rank, int nranks)
{
    devtest::FillComm(r, comm, rank, nranks);
    char why[160] = "";
    loomResult_t res = loom_devtp_nccl.open(&r.dc, &r.state, why, sizeof(why));
    XT_CHECK_MSG(res == loomSuccess, why);
    XT_CHECK_LOOM(r.dc.rt->stream_create(&r.s));
}

// After a barrier: every rank's streams are done with the pool.
void Close(Rank &r)
{
    XT_CHECK_LOOM(loomBarrier(r.dc.comm, nullptr));
    r.pool.Free();
    loom_devtp_nccl.close(&r.dc, r.state);
    r.state = nullptr;
    XT_CHECK_LOOM(r.dc.rt->stream_destroy(r.s));
}

RunOptions Options(const char *scratch = "4096")
{
    RunOptions o;
    o.env = {{"LOOM_DEVICE", "emulated"},
             {"LOOM_DEVICE_NCCL_BYTES", scratch},
             {"LOOM_NCCL_LIBRARY", FakePath()}};
    o.deadline_s = kDeadline;
    return o;
}

void GridBody(int rank, int nranks, loomComm_t comm)
{
    if (!Prepare())
        return;
    Rank r;
    Open(r, comm, rank, nranks);
    for (const devtest::Case &c : devtest::Grid(nranks, {0, 1, 1000, 1001, 4099}))
        devtest::CheckCase(&loom_devtp_nccl, r, comm, c);
    XT_CHECK_EQ(FakeCount("CommAbort"), 0);
    Close(r);
    XT_CHECK_EQ(FakeCount("CommDestroy"), 1);
}

void InThreads(int nranks, const std::function<void(int, int, loomComm_t)> &body,
               RunOptions o = Options())
{
    o.create_comm = false;
    XT_ASSERT_RUN(RunRanks(
        1, [&](int, int, loomComm_t) { devtest::RunThreads(nranks, body); }, o));
}

TEST(DevtpNccl, GridTwoProcesses)
{
    XT_ASSERT_RUN(RunRanks(2, GridBody, Options()));
}

TEST(DevtpNccl, GridThreeProcesses)
{
    XT_ASSERT_RUN(RunRanks(3, GridBody, Options()));
}

TEST(DevtpNccl, GridFourThreads)
{
    InThreads(4, [](int rank, int nranks, loomComm_t comm) {
        if (!Prepare())
            return;
        Rank r;
        Open(r, comm, rank, nranks);
        for (const devtest::Case &c : devtest::Grid(nranks, {0, 1, 1000, 4099}))
            devtest::CheckCase(&loom_devtp_nccl, r, comm, c);
        Close(r);
    });
}

// The default scratch: AllGather in one ncclAllGather, the others in one chunk each.
TEST(DevtpNccl, OneChunk)
{
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int nranks, loomComm_t comm) {
            if (!Prepare())
                return;
            Rank r;
            Open(r, comm, rank, nranks);
            long before = FakeCount("AllGather");
            for (const devtest::Case &c : devtest::Grid(nranks, {100003}))
                if (c.dt == loomBfloat16 || c.dt == loomInt32)
                    devtest::CheckCase(&loom_devtp_nccl, r, comm, c);
            XT_CHECK(FakeCount("AllGather") > before);
            Close(r);
        },
        Options("33554432")));
}

// Calls queued one after another before any wait.
TEST(DevtpNccl, BackToBack)
{
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int nranks, loomComm_t comm) {
            if (!Prepare())
                return;
            Rank r;
            Open(r, comm, rank, nranks);
            const loom_devrt_t *rt = r.dc.rt;
            const int calls = 12;
            const size_t count = 1537;
            std::vector<devtest::Buffers> bufs(calls);
            std::vector<std::vector<uint8_t>> want(calls);
            for (int i = 0; i < calls; i++) {
                devtest::Case c{loomCollAllReduce,
                                loomBfloat16,
                                static_cast<loomRedOp_t>(i % loomNumOps),
                                count,
                                false,
                                0,
                                false,
                                false,
                                static_cast<uint64_t>(77 + i)};
                std::vector<uint8_t> in = devtest::Input(c, rank, count);
                bufs[i].rt = rt;
                bufs[i].send = bufs[i].Alloc(in.size(), false);
                bufs[i].recv = bufs[i].Alloc(in.size(), false);
                devtest::ToBuffer(rt, r.s, bufs[i].send, in.data(), in.size());
                want[i].resize(in.size());
                XT_CHECK_LOOM(
                    loomAllReduce(in.data(), want[i].data(), count, c.dt, c.op, comm, nullptr));
                loom_coll_args_t a{};
                a.kind = LOOM_COLL_ALLREDUCE;
                a.sendbuff = bufs[i].send;
                a.recvbuff = bufs[i].recv;
                a.count = count;
                a.dt = c.dt;
                a.op = c.op;
                XT_CHECK_LOOM(loom_devtp_nccl.run(&r.dc, r.state, &a, r.s));
            }
            XT_CHECK(devtest::StreamWait(rt, r.s, 60));
            for (int i = 0; i < calls; i++) {
                std::vector<uint8_t> got(want[i].size());
                devtest::FromBuffer(rt, r.s, got.data(), bufs[i].recv, got.size());
                XT_CHECK(got == want[i]);
            }
            Close(r);
        },
        Options()));
}

// release aborts the NCCL communicator; later calls are refused, close still works.
TEST(DevtpNccl, ReleaseAborts)
{
    XT_ASSERT_RUN(RunRanks(
        2,
        [](int rank, int nranks, loomComm_t comm) {
            if (!Prepare())
                return;
            Rank r;
            Open(r, comm, rank, nranks);
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            loom_devtp_nccl.release(&r.dc, r.state);
            loom_devtp_nccl.release(&r.dc, r.state); // idempotent
            XT_CHECK_EQ(FakeCount("CommAbort"), 1);
            devtest::Buffers b;
            b.rt = r.dc.rt;
            loom_coll_args_t a{};
            a.kind = LOOM_COLL_ALLGATHER;
            a.sendbuff = b.Alloc(64, false);
            a.recvbuff = b.Alloc(64 * nranks, false);
            a.count = 16;
            a.dt = loomFloat32;
            XT_CHECK_EQ(loom_devtp_nccl.run(&r.dc, r.state, &a, r.s), loomInvalidUsage);
            Close(r);
            XT_CHECK_EQ(FakeCount("CommDestroy"), 0);
        },
        Options()));
}

// Every rank refuses alike, with the reason.
void ExpectRefusal(int nranks, const RunOptions &o, bool seam,
                   int (*gpu)(const loom_dev_comm_t *, char *, size_t, char *, size_t),
                   const char *text)
{
    XT_ASSERT_RUN(RunRanks(
        nranks,
        [&](int rank, int n, loomComm_t comm) {
            if (!Prepare(seam, gpu))
                return;
            Rank r;
            devtest::FillComm(r, comm, rank, n);
            char why[160] = "";
            loomResult_t res = loom_devtp_nccl.open(&r.dc, &r.state, why, sizeof(why));
            std::printf("rank %d: %d: %s\n", rank, (int)res, why);
            XT_CHECK(res != loomSuccess);
            XT_CHECK(r.state == nullptr);
            XT_CHECK_MSG(std::strstr(why, text) != nullptr, why);
            XT_CHECK_EQ(FakeCount("CommInitRank"), 0);
        },
        o));
}

TEST(DevtpNccl, RefusesWithoutCudaRuntime)
{
    ExpectRefusal(2, Options(), false, nullptr, "needs the CUDA runtime");
}

TEST(DevtpNccl, RefusesTwoRanksOnOneGpu)
{
    ExpectRefusal(3, Options(), true, SharedGpu, "ranks 0 and 1 share the GPU 0000:19:00.0");
}

TEST(DevtpNccl, RefusesRelativeLibrary)
{
    RunOptions o = Options();
    o.env.back().second = "libnccl.so.2";
    ExpectRefusal(2, o, true, DistinctGpu, "is not an absolute path");
}

TEST(DevtpNccl, RefusesMissingLibrary)
{
    RunOptions o = Options();
    o.env.back().second = "/nonexistent/libnccl.so.2";
    ExpectRefusal(2, o, true, DistinctGpu, "dlopen(/nonexistent/libnccl.so.2) failed");
}

TEST(DevtpNccl, RefusesLoomsOwnDropIn)
{
    const char *shim = std::getenv("LOOM_NCCL_SHIM");
    if (shim == nullptr || *shim == '\0')
        GTEST_SKIP() << "this build has no drop-in NCCL library (libloom-nccl.so)";
    RunOptions o = Options();
    o.env.back().second = shim;
    ExpectRefusal(2, o, true, DistinctGpu, "is loom's drop-in NCCL library");
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_device_protocol.cc - the device path's protocol run on the host emulation: many calls of
// one communicator queued on two streams and on the NULL stream run in one order on every rank;
// a dead peer and a peer that never comes surface through loomCommGetAsyncError with the stream
// released; a call its stream never reaches is timed out by the watchdog, which releases the
// stream; loomCommAbort releases a stream blocked in a wait within 1 s; two communicators issued
// in opposite orders on two ranks do not deadlock; host staging refuses a capturing stream with a
// clear error while a capturable transport runs the call; without a device runtime the device
// calls say why; loomCommDeviceRuntime and loomCommDevicePlan answer what the calls do. Run by
// meson's 'device' suite.

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dev_cases.h"
#include "devrt_emu.h"
#include "loom_echo.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using devtest::StreamKind;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

loomComm_t CommWithTimeout(int timeout_ms)
{
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.timeout_ms = timeout_ms;
    return loomtest::CreateComm(&cfg);
}

// 240 calls of different sizes on two wrapped streams, every 16th a blocking host call: a rank
// that ran them in another order than its peers would pair calls of different sizes.
void ManyCalls(const std::string &transports)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            const int calls = 240;
            devtest::Stream s0(StreamKind::WrapDefault), s1(StreamKind::WrapCreated);
            std::vector<std::unique_ptr<devtest::DevBuf>> in, out;
            std::vector<int64_t> host(calls / 16, -1);
            for (int i = 0; i < calls; i++) {
                const size_t count = 1 + static_cast<size_t>(i) * 37 % 3001;
                in.push_back(std::make_unique<devtest::DevBuf>(count * 8));
                out.push_back(std::make_unique<devtest::DevBuf>(count * 8 * n));
                int64_t *x = reinterpret_cast<int64_t *>(in.back()->data());
                for (size_t j = 0; j < count; j++)
                    x[j] = rank * 1000003 + i * 1009 + static_cast<int64_t>(j);
                loomStream_t s = (i % 2 ? s1 : s0).get();
                if (i % 3 == 0)
                    XT_CHECK_LOOM(loomAllGather(x, out.back()->data(), count, loomInt64, comm, s));
                else
                    XT_CHECK_LOOM(loomAllReduce(x, out.back()->data(), count, loomInt64,
                                                i % 3 == 1 ? loomSum : loomMax, comm, s));
                if (i % 16 == 15) {
                    int64_t v = rank + i;
                    XT_CHECK_LOOM(loomAllReduce(&v, &host[static_cast<size_t>(i / 16)], 1,
                                                loomInt64, loomSum, comm, nullptr));
                }
            }
            s0.Sync();
            s1.Sync();
            int wrong = 0;
            for (int i = 0; i < calls; i++) {
                const size_t count = 1 + static_cast<size_t>(i) * 37 % 3001;
                const int64_t *y =
                    reinterpret_cast<const int64_t *>(out[static_cast<size_t>(i)]->data());
                for (size_t j = 0; j < count; j++) {
                    const int64_t base = i * 1009 + static_cast<int64_t>(j);
                    if (i % 3 == 0) {
                        for (int r = 0; r < n; r++)
                            wrong += y[static_cast<size_t>(r) * count + j] != r * 1000003 + base;
                    } else if (i % 3 == 1) {
                        wrong += y[j] != n * base + 1000003 * n * (n - 1) / 2;
                    } else {
                        wrong += y[j] != (n - 1) * 1000003 + base;
                    }
                }
            }
            for (int k = 0; k < calls / 16; k++)
                wrong += host[static_cast<size_t>(k)] != n * (16 * k + 15) + n * (n - 1) / 2;
            XT_CHECK_EQ(wrong, 0);
        },
        devtest::Options(transports)));
}

TEST(DeviceProtocol, ManyCallsOnTwoStreamsRunInOneOrder)
{
    ManyCalls("staged");
}

TEST(DeviceProtocol, ManyCallsRunInOneOrderDefaultTransports)
{
    ManyCalls("");
}

// Rank 1 dies without taking part; rank 0's call fails with the peer named, through the stream
// and the communicator, and its stream is released.
TEST(DeviceProtocol, DeadPeerSurfacesThroughAsyncError)
{
    loomtest::RunOptions o = devtest::Options("staged");
    o.create_comm = false;
    o.expected_exit = {0, 128 + SIGKILL};
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = CommWithTimeout(30000);
            devtest::DevBuf x(1 << 20);
            memset(x.data(), 1, x.size());
            if (rank == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                raise(SIGKILL);
            }
            loomStream_t s = nullptr;
            XT_CHECK_LOOM(loomStreamCreateFromCuda(&s, nullptr));
            const auto t0 = Clock::now();
            XT_CHECK_LOOM(
                loomAllReduce(x.data(), x.data(), (1 << 20) / 4, loomFloat32, loomSum, comm, s));
            const loomResult_t r = loomStreamSynchronize(s);
            XT_CHECK_MSG(r == loomRemoteError, loomGetErrorString(r));
            XT_CHECK_MSG(Since(t0) < 10, "the stream was held");
            loomResult_t async = loomSuccess;
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, loomRemoteError);
            XT_CHECK_MSG(devtest::LastErrorHas("rank 1"), loomGetLastError(nullptr));
            XT_CHECK_LOOM(loomStreamDestroy(s));
            XT_CHECK_LOOM(loomCommAbort(comm));
        },
        o));
}

// Rank 1 never takes part: rank 0's host collective times out after the communicator's timeout,
// and the timeout surfaces through the stream and loomCommGetAsyncError.
TEST(DeviceProtocol, PeerTimeoutSurfacesThroughAsyncError)
{
    loomtest::RunOptions o = devtest::Options("staged");
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = CommWithTimeout(800);
            if (rank == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(2500));
                XT_CHECK_LOOM(loomCommAbort(comm));
                return;
            }
            devtest::Stream s(StreamKind::WrapCreated);
            devtest::DevBuf x(4096);
            memset(x.data(), 0, x.size());
            const auto t0 = Clock::now();
            XT_CHECK_LOOM(
                loomAllReduce(x.data(), x.data(), 1024, loomFloat32, loomSum, comm, s.get()));
            const loomResult_t r = loomStreamSynchronize(s.get());
            XT_CHECK_MSG(r == loomTimeout, loomGetErrorString(r));
            XT_CHECK_MSG(Since(t0) < 2.4, "released after " + std::to_string(Since(t0)) + " s");
            loomResult_t async = loomSuccess;
            XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
            XT_CHECK_EQ(async, loomTimeout);
            XT_CHECK_LOOM(loomCommAbort(comm));
        },
        o));
}

// The stream is held by earlier work of its own (a wait on a word only the test sets) past the
// communicator's timeout: the watchdog fails the call, naming it, and once the earlier work is
// done the stream passes the call at once.
TEST(DeviceProtocol, WatchdogTimesOutACallItsStreamNeverReaches)
{
    loomtest::RunOptions o = devtest::Options("staged");
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int, int, loomComm_t) {
            loomComm_t comm = CommWithTimeout(600);
            const loom_devrt_t *rt = devtest::Rt();
            void *page =
                mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            XT_CHECK(page != MAP_FAILED);
            void *dev = nullptr;
            XT_CHECK_LOOM(rt->host_map(page, 4096, &dev));
            uint32_t *word = static_cast<uint32_t *>(page);
            *word = 0;
            {
                devtest::Stream s(StreamKind::WrapCreated);
                XT_CHECK_LOOM(rt->wait_u32(s.device(), static_cast<uint32_t *>(dev), 1));
                devtest::DevBuf x(4096);
                memset(x.data(), 0, x.size());
                XT_CHECK_LOOM(
                    loomAllReduce(x.data(), x.data(), 1024, loomFloat32, loomSum, comm, s.get()));
                loomResult_t async = loomSuccess;
                const auto t0 = Clock::now();
                while (async == loomSuccess && Since(t0) < 10) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    XT_CHECK_LOOM(loomCommGetAsyncError(comm, &async));
                }
                XT_CHECK_EQ(async, loomTimeout);
                XT_CHECK_MSG(devtest::LastErrorHas("allreduce #1") &&
                                 devtest::LastErrorHas("made no progress"),
                             loomGetLastError(nullptr));
                __atomic_store_n(word, 1u, __ATOMIC_RELEASE); // the earlier work ends
                const auto t1 = Clock::now();
                XT_CHECK_EQ(loomStreamSynchronize(s.get()), loomTimeout);
                XT_CHECK_MSG(Since(t1) < 1, "the stream was held after the timeout");
            }
            XT_CHECK_LOOM(loomCommAbort(comm));
            XT_CHECK_LOOM(rt->host_unmap(page));
            munmap(page, 4096);
        },
        o));
}

// Rank 1 never takes part; rank 0's stream is blocked in the call's wait until rank 0 aborts.
void AbortReleases(const std::string &transports, StreamKind kind)
{
    loomtest::RunOptions o = devtest::Options(transports);
    o.create_comm = false;
    o.rank_env = [kind](int) {
        return loomtest::EnvList{{"DEVTEST_KIND", std::to_string(static_cast<int>(kind))}};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int, loomComm_t) {
            loomComm_t comm = CommWithTimeout(60000);
            if (rank == 1) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                XT_CHECK_LOOM(loomCommAbort(comm));
                return;
            }
            devtest::Stream s(static_cast<StreamKind>(atoi(getenv("DEVTEST_KIND"))));
            devtest::DevBuf x(64 << 10);
            memset(x.data(), 0, x.size());
            XT_CHECK_LOOM(
                loomAllReduce(x.data(), x.data(), 16 << 10, loomFloat32, loomSum, comm, s.get()));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            XT_CHECK_EQ(loomStreamQuery(s.get()), loomInProgress); // blocked in its wait
            const auto t0 = Clock::now();
            XT_CHECK_LOOM(loomCommAbort(comm));
            (void)loomStreamSynchronize(s.get()); // an error or not: released
            XT_CHECK_MSG(Since(t0) < 1.0,
                         "the stream was released " + std::to_string(Since(t0)) + " s after abort");
        },
        o));
}

TEST(DeviceProtocol, AbortReleasesABlockedStreamWithinOneSecond)
{
    AbortReleases("staged", StreamKind::WrapCreated);
}

TEST(DeviceProtocol, AbortReleasesABlockedStreamDefaultTransports)
{
    AbortReleases("", StreamKind::WrapCreated);
}

// A worker stream's call waits on the communicator's own device stream: the abort ends that
// wait too, and the worker's.
TEST(DeviceProtocol, AbortReleasesAWorkerStreamWithinOneSecond)
{
    AbortReleases("staged", StreamKind::Worker);
}

// Rank 0 issues on A then B, rank 1 on B then A, each communicator on its own stream.
void OppositeOrders(const std::string &transports)
{
    loomtest::RunOptions o = devtest::Options(transports);
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            loomComm_t a = loomtest::CreateComm(), b = loomtest::CreateComm();
            const size_t count = 100000;
            {
                devtest::Stream sa(StreamKind::WrapCreated), sb(StreamKind::WrapCreated);
                devtest::DevBuf xa(count * 4), xb(count * 4);
                float *fa = reinterpret_cast<float *>(xa.data());
                float *fb = reinterpret_cast<float *>(xb.data());
                for (size_t i = 0; i < count; i++) {
                    fa[i] = static_cast<float>(rank + 1);
                    fb[i] = static_cast<float>(10 * (rank + 1));
                }
                for (int k = 0; k < 2; k++) {
                    const bool on_a = (k == 0) == (rank == 0);
                    XT_CHECK_LOOM(loomAllReduce(on_a ? fa : fb, on_a ? fa : fb, count, loomFloat32,
                                                loomSum, on_a ? a : b, on_a ? sa.get() : sb.get()));
                }
                sa.Sync();
                sb.Sync();
                const float sum = static_cast<float>(n * (n + 1) / 2);
                XT_CHECK_EQ(fa[0], sum);
                XT_CHECK_EQ(fa[count - 1], sum);
                XT_CHECK_EQ(fb[count - 1], 10 * sum);
            }
            XT_CHECK_LOOM(loomCommDestroy(a));
            XT_CHECK_LOOM(loomCommDestroy(b));
        },
        o));
}

TEST(DeviceProtocol, TwoCommunicatorsInOppositeOrdersDoNotDeadlock)
{
    OppositeOrders("staged");
}

TEST(DeviceProtocol, TwoCommunicatorsInOppositeOrdersDefaultTransports)
{
    OppositeOrders("");
}

// Communicators made, used on device buffers and streams, and destroyed, twenty times: no
// thread, staging buffer or device allocation is left behind.
TEST(DeviceProtocol, TeardownLeavesNothingBehind)
{
    loomtest::RunOptions o = devtest::Options();
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            auto threads = [] {
                // A destroyed stream of the emulation ends its thread once its work is done:
                // count when only the default stream's runs.
                for (int i = 0; i < 200 && loom_devrt_emu_live_streams() > 1; i++)
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                XT_CHECK_EQ(loom_devrt_emu_live_streams(), 1);
                int k = 0;
                for (const auto &e : std::filesystem::directory_iterator("/proc/self/task"))
                    k += e.is_directory() ? 1 : 0;
                return k;
            };
            loom_devrt_emu_counts_t c0, c1;
            int t0 = -1;
            for (int round = 0; round < 20; round++) {
                loomComm_t comm = loomtest::CreateComm();
                {
                    devtest::Stream w(StreamKind::Worker), s(StreamKind::WrapCreated);
                    devtest::CheckCase(devtest::Case{devtest::Coll::AllReduce}, comm, rank, n,
                                       StreamKind::Null);
                    devtest::CheckCase(devtest::Case{devtest::Coll::Echo}, comm, rank, n,
                                       StreamKind::WrapDefault);
                    devtest::DevBuf x(1 << 16);
                    XT_CHECK_LOOM(loomAllGather(x.data() + rank * 400, x.data(), 100, loomFloat32,
                                                comm, w.get()));
                    XT_CHECK_LOOM(loomAllReduce(x.data(), x.data(), 1 << 14, loomFloat32, loomMax,
                                                comm, s.get()));
                }
                XT_CHECK_LOOM(loomCommDestroy(comm));
                if (round == 0) { /* after the first round: what stays for the process */
                    loom_devrt_emu_counts(&c0);
                    t0 = threads();
                    for (int i = 0; i < 30; i++) { /* threads that are ending do not count */
                        std::this_thread::sleep_for(std::chrono::milliseconds(10));
                        t0 = std::min(t0, threads());
                    }
                }
            }
            loom_devrt_emu_counts(&c1);
            XT_CHECK_EQ(c1.dev, c0.dev);
            XT_CHECK_EQ(c1.host, c0.host);
            XT_CHECK_EQ(c1.mapped, c0.mapped);
            XT_CHECK_EQ(c1.ipc, c0.ipc);
            for (int i = 0; i < 300 && threads() > t0; i++) /* leaks would stay: 20 rounds */
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            XT_CHECK_EQ(threads(), t0);
        },
        o));
}

// A communicator made by loomCommSplit has a device state of its own (its creation opens the
// transports over the child's ranks).
TEST(DeviceProtocol, SplitChildrenRunDeviceCalls)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        4,
        [](int rank, int, loomComm_t comm) {
            loomComm_t child = nullptr;
            XT_CHECK_LOOM(loomCommSplit(comm, rank % 2, rank, &child, nullptr));
            int cr = -1, cn = 0;
            XT_CHECK_LOOM(loomCommUserRank(child, &cr));
            XT_CHECK_LOOM(loomCommCount(child, &cn));
            for (const devtest::Case &c :
                 {devtest::Case{devtest::Coll::AllReduce, loomBfloat16, loomSum},
                  devtest::Case{devtest::Coll::AllToAllv, loomFloat32},
                  devtest::Case{devtest::Coll::Echo, loomFloat32}})
                devtest::CheckCase(c, child, cr, cn, StreamKind::WrapCreated);
            XT_CHECK_LOOM(loomCommDestroy(child));
        },
        devtest::Options()));
}

// A group without a stream spanning two communicators, one with device buffers (waited for once
// the other's host task ran) and one with host buffers.
TEST(DeviceProtocol, GroupOverTwoCommunicatorsWithoutAStream)
{
    loomtest::RunOptions o = devtest::Options();
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            loomComm_t a = loomtest::CreateComm(), b = loomtest::CreateComm();
            {
                devtest::DevBuf x(4096 * 4);
                float *f = reinterpret_cast<float *>(x.data());
                for (int i = 0; i < 4096; i++)
                    f[i] = static_cast<float>(rank + i);
                std::vector<int32_t> h(4096, rank), g(4096 * static_cast<size_t>(n));
                XT_CHECK_LOOM(loomGroupStart());
                XT_CHECK_LOOM(loomAllReduce(f, f, 4096, loomFloat32, loomSum, a, nullptr));
                XT_CHECK_LOOM(loomAllGather(h.data(), g.data(), 4096, loomInt32, b, nullptr));
                XT_CHECK_LOOM(loomGroupEnd());
                for (int i = 0; i < 4096; i += 101)
                    XT_CHECK_EQ(f[i], static_cast<float>(n * i + n * (n - 1) / 2));
                for (int r = 0; r < n; r++)
                    XT_CHECK_EQ(g[static_cast<size_t>(r) * 4096 + 7], r);
            }
            XT_CHECK_LOOM(loomCommDestroy(a));
            XT_CHECK_LOOM(loomCommDestroy(b));
        },
        o));
}

// A capturing stream: host staging refuses the call with a clear InvalidUsage (on every rank,
// before any ticket, so nothing waits for it).
TEST(DeviceProtocol, CaptureIsRefusedForHostStaging)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int, int, loomComm_t comm) {
            devtest::Stream s(StreamKind::WrapCreated);
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(s.device(), 1));
            devtest::DevBuf x(4096);
            XT_CHECK_LOOM_RES(
                loomAllReduce(x.data(), x.data(), 1024, loomFloat32, loomSum, comm, s.get()),
                loomInvalidUsage);
            XT_CHECK_MSG(devtest::LastErrorHas("host-staged device calls cannot be captured into "
                                               "a CUDA graph"),
                         loomGetLastError(nullptr));
            XT_CHECK_LOOM_RES(
                loomEchoAllReduce(x.data(), x.data(), 1024, loomFloat32, comm, nullptr, s.get()),
                loomInvalidUsage);
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(s.device(), 0));
            XT_CHECK_LOOM(
                loomAllReduce(x.data(), x.data(), 1024, loomFloat32, loomSum, comm, s.get()));
            s.Sync();
        },
        devtest::Options("staged")));
}

// With the default transports an AllReduce on a capturing stream runs on ipc, which captures,
// while Echo (host-staged) is refused.
TEST(DeviceProtocol, CaptureRunsOnACapturableTransport)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t comm) {
            devtest::Stream s(StreamKind::WrapCreated);
            devtest::DevBuf x(4096);
            float *f = reinterpret_cast<float *>(x.data());
            for (int i = 0; i < 1024; i++)
                f[i] = static_cast<float>(rank + i);
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(s.device(), 1));
            XT_CHECK_LOOM(loomAllReduce(f, f, 1024, loomFloat32, loomSum, comm, s.get()));
            XT_CHECK_LOOM_RES(loomEchoAllReduce(f, f, 1024, loomFloat32, comm, nullptr, s.get()),
                              loomInvalidUsage);
            XT_CHECK_LOOM(loom_devrt_emu_set_capturing(s.device(), 0));
            XT_CHECK_LOOM(loomBarrier(comm, s.get())); // after the captured call on the stream
            s.Sync();
            for (int i = 0; i < 1024; i += 97)
                XT_CHECK_EQ(f[i], static_cast<float>(n * i + n * (n - 1) / 2));
        },
        devtest::Options()));
}

// A communicator of ranks of which one has no device runtime has no device state on any rank
// (the ranks learn it from one another's identities at creation), so its creation does not wait
// for a set-up that rank never joins, and host calls run as ever.
TEST(DeviceProtocol, RankWithoutRuntimeMeansNoDeviceStateAnywhere)
{
    loomtest::RunOptions o = devtest::Options();
    o.rank_env = [](int rank) {
        return rank == 1 ? loomtest::EnvList{{"LOOM_DEVICE", "none"}} : loomtest::EnvList{};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int nranks, loomComm_t comm) {
            float in = (float)(rank + 1), out = 0;
            XT_CHECK_LOOM(loomAllReduce(&in, &out, 1, loomFloat32, loomSum, comm, nullptr));
            XT_CHECK(out == (float)(nranks * (nranks + 1) / 2));
            // The ranks with a runtime still have device memory, but no device path here: the
            // wrapped stream, which only the device path can serve, and device memory, which
            // the host path would misread, are refused on the rank alone, before any exchange.
            if (rank != 1) {
                loomStream_t s = nullptr;
                XT_CHECK_LOOM(loomStreamCreateFromCuda(&s, nullptr));
                XT_CHECK_LOOM_RES(loomAllReduce(&in, &out, 1, loomFloat32, loomSum, comm, s),
                                  loomInvalidUsage);
                XT_CHECK_LOOM(loomStreamDestroy(s));
                devtest::DevBuf d(sizeof(float));
                XT_CHECK_LOOM_RES(
                    loomAllReduce(&in, d.data(), 1, loomFloat32, loomSum, comm, nullptr),
                    loomInvalidUsage);
                XT_CHECK_MSG(devtest::LastErrorHas("rank 1 had no device runtime"),
                             loomGetLastError(nullptr));
            }
            XT_CHECK_LOOM(loomAllReduce(&in, &out, 1, loomFloat32, loomSum, comm, nullptr));
            XT_CHECK(out == (float)(nranks * (nranks + 1) / 2));
        },
        o));
}

// Without a device runtime: loomMemAlloc and loomStreamCreateFromCuda say why; loomMemFree
// refuses host memory.
TEST(DeviceProtocol, NoRuntimeGivesInvalidUsage)
{
    loomtest::RunOptions o;
    o.create_comm = false;
    o.env.push_back({"LOOM_DEVICE", "none"});
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            void *p = reinterpret_cast<void *>(1);
            XT_CHECK_LOOM_RES(loomMemAlloc(&p, 64), loomInvalidUsage);
            XT_CHECK(p == nullptr);
            XT_CHECK_MSG(devtest::LastErrorHas("no device runtime"), loomGetLastError(nullptr));
            XT_CHECK_MSG(devtest::LastErrorHas(loom_devrt_why_none()), loomGetLastError(nullptr));
            loomStream_t s = nullptr;
            XT_CHECK_LOOM_RES(loomStreamCreateFromCuda(&s, nullptr), loomInvalidUsage);
            XT_CHECK_MSG(devtest::LastErrorHas("no device runtime"), loomGetLastError(nullptr));
            int host = 0;
            XT_CHECK_LOOM_RES(loomMemFree(&host), loomInvalidArgument);
            XT_CHECK_LOOM(loomMemFree(nullptr));
        },
        o));
}

// The queries: a communicator made without a runtime has no device path and says why, without
// a log line; one made with the emulation names it, and its plan names the transport that the
// calls use and whether a graph may capture them.
TEST(DeviceProtocol, RuntimeAndPlanQueries)
{
    loomtest::RunOptions none;
    none.env.push_back({"LOOM_DEVICE", "none"});
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t comm) {
            const char *rt = "x";
            char why[256] = "";
            XT_CHECK_LOOM(loomCommDeviceRuntime(nullptr, &rt, why, sizeof(why)));
            XT_CHECK(rt == nullptr);
            XT_CHECK_EQ(std::string(why), "LOOM_DEVICE=none");
            rt = "x";
            XT_CHECK_LOOM(loomCommDeviceRuntime(comm, &rt, why, sizeof(why)));
            XT_CHECK(rt == nullptr);
            XT_CHECK_EQ(std::string(why), "LOOM_DEVICE=none");
            const char *tp = "x";
            int cap = 1;
            XT_CHECK_LOOM(loomCommDevicePlan(comm, loomCollAllReduce, loomFloat32, loomSum, &tp,
                                             &cap, why, sizeof(why)));
            XT_CHECK(tp == nullptr && cap == 0);
            XT_CHECK_MSG(std::string(why).find("has no device path: LOOM_DEVICE=none") !=
                             std::string::npos,
                         why);
            XT_CHECK_LOOM_RES(loomCommDeviceRuntime(comm, nullptr, nullptr, 0),
                              loomInvalidArgument);
        },
        none));
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int, int, loomComm_t comm) {
            const char *rt = nullptr;
            char why[512] = "x";
            XT_CHECK_LOOM(loomCommDeviceRuntime(comm, &rt, why, sizeof(why)));
            XT_CHECK(rt != nullptr && std::string(rt) == "emulated");
            XT_CHECK_EQ(std::string(why), "");
            XT_CHECK_LOOM(loomCommDeviceRuntime(nullptr, &rt, nullptr, 0));
            XT_CHECK(rt != nullptr && std::string(rt) == "emulated");
            const char *tp = nullptr;
            int cap = -1;
            XT_CHECK_LOOM(loomCommDevicePlan(comm, loomCollAllReduce, loomBfloat16, loomSum, &tp,
                                             &cap, why, sizeof(why)));
            XT_CHECK_MSG(tp != nullptr && std::string(tp) == "ipc" && cap == 1, why);
            XT_CHECK_LOOM(loomCommDevicePlan(comm, loomCollAllGather, loomUint8, loomSum, &tp, &cap,
                                             nullptr, 0));
            XT_CHECK(tp != nullptr && std::string(tp) == "ipc" && cap == 1);
            XT_CHECK_LOOM_RES(loomCommDevicePlan(comm, loomNumCollectives, loomFloat32, loomSum,
                                                 &tp, &cap, nullptr, 0),
                              loomInvalidArgument);
            XT_CHECK_LOOM_RES(loomCommDevicePlan(comm, loomCollAllReduce, loomFloat32,
                                                 static_cast<loomRedOp_t>(99), &tp, &cap, nullptr,
                                                 0),
                              loomInvalidArgument);
            // The op of a collective without a reduction is not looked at.
            XT_CHECK_LOOM(loomCommDevicePlan(comm, loomCollBroadcast, loomFloat32,
                                             static_cast<loomRedOp_t>(99), &tp, &cap, nullptr, 0));
        },
        devtest::Options()));
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int, int, loomComm_t comm) {
            const char *tp = nullptr;
            int cap = -1;
            char why[512] = "";
            XT_CHECK_LOOM(loomCommDevicePlan(comm, loomCollReduceScatter, loomFloat16, loomMax, &tp,
                                             &cap, why, sizeof(why)));
            XT_CHECK_MSG(tp != nullptr && std::string(tp) == "staged" && cap == 0, why);
            XT_CHECK_MSG(std::string(why).find("ipc not available") != std::string::npos, why);
        },
        devtest::Options("staged")));
}

// loomMemFree refuses what loomMemAlloc did not give: host memory and interior pointers.
TEST(DeviceProtocol, MemFreeRefusesForeignPointers)
{
    loomtest::RunOptions o = devtest::Options();
    o.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            void *p = nullptr;
            XT_CHECK_LOOM(loomMemAlloc(&p, 4096));
            XT_CHECK_LOOM_RES(loomMemFree(static_cast<char *>(p) + 64), loomInvalidArgument);
            int host = 0;
            XT_CHECK_LOOM_RES(loomMemFree(&host), loomInvalidArgument);
            XT_CHECK_LOOM(loomMemFree(p));
            XT_CHECK_LOOM(loomMemAlloc(&p, 0));
            XT_CHECK(p == nullptr);
        },
        o));
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_shim_loom_api.cc - the drop-in NCCL library in loom mode, call by call, on forked ranks
// (the gtest process itself never calls it): ncclCommAbort from a second thread unblocks a rank
// stuck in a collective whose peer never arrives, within 2 s (the time is printed); 200
// init/destroy cycles (blocking, non-blocking, and non-blocking aborted while pending) leave the
// threads, descriptors and /dev/shm of before, and no leak under LeakSanitizer; loom streams
// passed as cudaStream_t queue the call (PreMulSum and Gather's own copy in stream order too);
// with a CUDA driver loaded (tests/nccl_shim/fake_cuda.c) but no device runtime in loom, device
// buffers are refused with the reason, and so is ncclMemAlloc, a captured stream with host
// buffers is refused, a CUDA stream is synchronized first, and ncclCommCuDevice is the current
// device (device buffers on loom's device path: test_shim_device.cc);
// an init and a collective on it in one group; grouped calls on two communicators;
// ncclCommInitAll (every rank in one process) and ncclCommInitRankScalable (one or two ids); a
// non-blocking split; Echo through the default rules equals loomEchoAllReduce bit for bit;
// ncclGroupSimulateEnd estimates without running; route mode without a real library behaves
// as loom mode; and everything loom mode refuses, with the text ncclGetLastError gives.
// Run by meson's 'nccl_shim' suite.

#include <dlfcn.h>
#include <nccl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loom.h"
#include "loom_echo.h"
#include "mp_fixture.h"
#include "resources.h"

namespace {

std::string Text(ncclResult_t r)
{
    return std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) +
           "), last error: " + ncclGetLastError(nullptr);
}

#define XT_NCCL_RES(call, want)                                                                    \
    do {                                                                                           \
        const ncclResult_t xt_n_ = (call);                                                         \
        XT_CHECK_MSG(xt_n_ == (want), std::string(#call " returned ") + Text(xt_n_));              \
    } while (0)
#define XT_NCCL(call) XT_NCCL_RES(call, ncclSuccess)
// The call fails with `want` and the last error mentions `words`.
#define XT_NCCL_REFUSED(call, want, words)                                                         \
    do {                                                                                           \
        XT_NCCL_RES(call, want);                                                                   \
        XT_CHECK_MSG(std::string(ncclGetLastError(nullptr)).find(words) != std::string::npos,      \
                     std::string("last error of " #call ": ") + ncclGetLastError(nullptr));        \
    } while (0)

loomtest::RunOptions LoomMode(loomtest::EnvList extra = {})
{
    loomtest::RunOptions o;
    o.create_comm = false;
    o.env = {{"LOOM_NCCL_MODE", "loom"}};
    o.env.insert(o.env.end(), extra.begin(), extra.end());
    return o;
}

ncclUniqueId SharedId()
{
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (loomtest::CurrentRank() == 0)
        XT_NCCL(ncclGetUniqueId(&id));
    loomtest::ShareFromRank0(&id, sizeof(id));
    return id;
}

ncclComm_t NcclComm(int rank, int n)
{
    const ncclUniqueId id = SharedId();
    ncclComm_t comm = nullptr;
    XT_NCCL(ncclCommInitRank(&comm, n, id, rank));
    XT_CHECK(comm != nullptr);
    return comm;
}

// A float32 sum of (rank + 1) * (i + 1): exact.
void CheckSum(ncclComm_t comm, int n, int rank, size_t count = 64, cudaStream_t stream = nullptr)
{
    std::vector<float> in(count), out(count, -1);
    for (size_t i = 0; i < count; i++)
        in[i] = static_cast<float>((rank + 1) * (i + 1));
    XT_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, stream));
    int live = 0;
    XT_CHECK_LOOM(loomStreamIsLive(stream, &live));
    if (live)
        XT_CHECK_LOOM(loomStreamSynchronize(reinterpret_cast<loomStream_t>(stream)));
    for (size_t i = 0; i < count; i++)
        XT_CHECK_EQ(out[i], static_cast<float>(n * (n + 1) / 2 * (i + 1)));
}

double Now()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// ---- abort ---------------------------------------------------------------------------------

TEST(ShimLoom, AbortFromAnotherThreadUnblocksACollective)
{
    loomtest::ParentReport report;
    // Nothing but the abort may end the wait: loom's own timeout is far away.
    loomtest::RunOptions opts = LoomMode({{"LOOM_TIMEOUT_MS", "120000"}});
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            CheckSum(comm, n, rank);
            int done = 0;
            if (rank == 1) {
                // Never joins the next collective; waits until rank 0 is through, then leaves.
                loomtest::ShareFromRank0(&done, sizeof(done));
                XT_CHECK_EQ(done, 1);
                (void)ncclCommDestroy(comm);
                return;
            }
            std::atomic<double> aborted_at{0};
            std::thread aborter([&] {
                usleep(300000);
                aborted_at = Now();
                XT_NCCL(ncclCommAbort(comm));
            });
            std::vector<float> buf(1 << 16, 1.0f);
            const ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32,
                                                 ncclSum, comm, nullptr);
            const double returned_at = Now();
            aborter.join();
            XT_CHECK_MSG(r != ncclSuccess, "the collective succeeded without its peer");
            const double waited = returned_at - aborted_at.load();
            report.Send("abort to return: " + std::to_string(waited * 1000) + " ms (result " +
                        Text(r) + ")");
            XT_CHECK_MSG(waited >= 0 && waited < 2.0, std::to_string(waited) + " s");
            // The handle is gone: loom mode refuses it by value, never touching it.
            XT_NCCL_REFUSED(
                ncclAllReduce(buf.data(), buf.data(), 1, ncclFloat32, ncclSum, comm, nullptr),
                ncclInvalidArgument, "not a communicator of this library");
            done = 1;
            loomtest::ShareFromRank0(&done, sizeof(done));
        },
        opts));
    std::printf("%s", report.Collect().c_str());
}

// ---- hygiene -------------------------------------------------------------------------------

constexpr int kCycles = 200;

// Every blocking or polled init calibrates and runs the arena probe, whose calls copy a few
// MiB: fast alone, but under TSan about a tenth of a second per init, so the cycles get the
// time that many inits take there.
loomtest::RunOptions CyclesOptions()
{
    loomtest::RunOptions opts = LoomMode();
    opts.deadline_s = 120.0;
    return opts;
}

// Cycle i: blocking init, a checked call, destroy; every 4th non-blocking (polled), every
// 8th non-blocking and aborted at once by every rank while its init is pending.
void Cycle(int i, int rank, int n)
{
    loomtest::SetContext("cycle " + std::to_string(i));
    const ncclUniqueId id = SharedId();
    ncclComm_t comm = nullptr;
    if (i % 4 != 3) {
        XT_NCCL(ncclCommInitRank(&comm, n, id, rank));
        CheckSum(comm, n, rank, 16);
        XT_NCCL(ncclCommDestroy(comm));
        return;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &cfg);
    XT_CHECK_MSG(r == ncclInProgress || r == ncclSuccess, Text(r));
    if (i % 8 == 7) {
        XT_NCCL(ncclCommAbort(comm));
        return;
    }
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
        XT_NCCL(ncclCommGetAsyncError(comm, &state));
        sched_yield();
    }
    XT_CHECK_EQ(state, ncclSuccess);
    CheckSum(comm, n, rank, 16);
    XT_NCCL(ncclCommFinalize(comm));
    XT_NCCL(ncclCommDestroy(comm));
}

TEST(ShimLoom, InitDestroyCyclesLeaveNothingBehind)
{
    loomtest::ParentReport report;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            loomtest::StartRuntimeThreads();
            const loomtest::Resources before = loomtest::Snapshot();
            for (int i = 0; i < kCycles; i++)
                Cycle(i, rank, n);
            loomtest::SettleThreads(before.threads, 10000);
            const loomtest::Resources after = loomtest::Snapshot();
            report.Send("rank " + std::to_string(rank) + " after " + std::to_string(kCycles) +
                        " cycles: threads " + std::to_string(before.threads) + " -> " +
                        std::to_string(after.threads) + ", fds " + std::to_string(before.fds) +
                        " -> " + std::to_string(after.fds) + ", loom mappings " +
                        std::to_string(after.shm_mappings) + ", /dev/shm segments " +
                        std::to_string(loomtest::ShmSegmentsOf(getpid()).size()));
            XT_CHECK_EQ(after.threads, before.threads);
            XT_CHECK_EQ(after.fds, before.fds);
            XT_CHECK_EQ(after.shm_mappings, 0);
            XT_CHECK(loomtest::ShmSegmentsOf(getpid()).empty());
        },
        CyclesOptions()));
    std::printf("%s", report.Collect().c_str());
}

// ---- streams, groups, split, Echo, simulate -------------------------------------------------

TEST(ShimLoom, LoomStreamsQueueTheCalls)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            loomStream_t ls = nullptr;
            XT_CHECK_LOOM(loomStreamCreate(&ls));
            cudaStream_t s = reinterpret_cast<cudaStream_t>(ls);
            CheckSum(comm, n, rank, 100, s);

            // PreMulSum on the stream: a device-resident scalar is read when the call runs.
            float scalar = 0.5f;
            ncclRedOp_t op;
            XT_NCCL(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, comm));
            std::vector<float> in(50, static_cast<float>(rank + 1)), out(50, 0);
            XT_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat32, op, comm, s));
            XT_CHECK_LOOM(loomStreamSynchronize(ls));
            for (float v : out)
                XT_CHECK_EQ(v, 0.5f * static_cast<float>(n * (n + 1) / 2));
            XT_NCCL(ncclRedOpDestroy(op, comm));

            // Gather on the stream: the root's own block is copied in stream order.
            std::vector<int32_t> mine(7, rank * 10), all(7 * n, -1);
            XT_NCCL(ncclGather(mine.data(), all.data(), mine.size(), ncclInt32, 1, comm, s));
            XT_CHECK_LOOM(loomStreamSynchronize(ls));
            if (rank == 1)
                for (int r = 0; r < n; r++)
                    XT_CHECK_EQ(all[static_cast<size_t>(r) * 7], r * 10);

            // A ring of Send/Recv in a group, on the stream.
            std::vector<int32_t> to(9, rank), from(9, -1);
            XT_NCCL(ncclGroupStart());
            XT_NCCL(ncclSend(to.data(), to.size(), ncclInt32, (rank + 1) % n, comm, s));
            XT_NCCL(ncclRecv(from.data(), from.size(), ncclInt32, (rank + n - 1) % n, comm, s));
            XT_NCCL(ncclGroupEnd());
            XT_CHECK_LOOM(loomStreamSynchronize(ls));
            XT_CHECK_EQ(from[8], (rank + n - 1) % n);

            // CUDA's per-thread default stream without a CUDA driver: nothing can be on it.
            CheckSum(comm, n, rank, 8, reinterpret_cast<cudaStream_t>(0x2));
            // Neither loom's stream nor CUDA's: refused, untouched.
            int not_a_stream = 0;
            XT_NCCL_REFUSED(ncclAllReduce(in.data(), out.data(), 1, ncclFloat32, ncclSum, comm,
                                          reinterpret_cast<cudaStream_t>(&not_a_stream)),
                            ncclInvalidArgument, "neither a live loom stream");
            XT_CHECK_LOOM(loomStreamDestroy(ls));
            XT_NCCL(ncclCommDestroy(comm));
        },
        LoomMode()));
}

TEST(ShimLoom, GroupsDeferInitsAndRunCallsTogether)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            const ncclUniqueId id_a = SharedId(), id_b = SharedId();
            ncclComm_t a = nullptr, b = nullptr;
            // Created and used in one group: the inits run first, at the group's end.
            std::vector<float> x(10, static_cast<float>(rank + 1)), y(10, 0);
            XT_NCCL(ncclGroupStart());
            XT_NCCL(ncclCommInitRank(&a, n, id_a, rank));
            XT_NCCL(ncclCommInitRank(&b, n, id_b, n - 1 - rank));
            XT_NCCL(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat32, ncclSum, a, nullptr));
            XT_NCCL(ncclGroupEnd());
            XT_CHECK_EQ(y[9], 3.0f);
            // Calls on two communicators in one group, posted in opposite orders on the two ranks.
            std::vector<float> p(5, 1.0f), q(5, 2.0f);
            XT_NCCL(ncclGroupStart());
            XT_NCCL(ncclGroupStart()); // nested: only the outermost end runs them
            if (rank == 0) {
                XT_NCCL(
                    ncclAllReduce(p.data(), p.data(), p.size(), ncclFloat32, ncclSum, a, nullptr));
                XT_NCCL(
                    ncclAllReduce(q.data(), q.data(), q.size(), ncclFloat32, ncclMax, b, nullptr));
            } else {
                XT_NCCL(
                    ncclAllReduce(q.data(), q.data(), q.size(), ncclFloat32, ncclMax, b, nullptr));
                XT_NCCL(
                    ncclAllReduce(p.data(), p.data(), p.size(), ncclFloat32, ncclSum, a, nullptr));
            }
            XT_NCCL(ncclGroupEnd());
            XT_CHECK_EQ(p[0], 1.0f); // not run yet
            XT_NCCL(ncclGroupEnd());
            XT_CHECK_EQ(p[4], 2.0f);
            XT_CHECK_EQ(q[4], 2.0f);

            // Simulate: estimated from loom's plan, nothing runs.
            ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
            std::vector<float> z(1000, 1.0f);
            XT_NCCL(ncclGroupStart());
            XT_NCCL(ncclAllReduce(z.data(), z.data(), z.size(), ncclFloat32, ncclSum, a, nullptr));
            XT_NCCL(ncclGroupSimulateEnd(&sim));
            XT_CHECK_EQ(z[0], 1.0f);
            XT_CHECK_MSG(sim.estimatedTime > 0, std::to_string(sim.estimatedTime));
            // With a call loom's plan does not model, the estimate is left as it was.
            ncclSimInfo_t sim2 = NCCL_SIM_INFO_INITIALIZER;
            XT_NCCL(ncclGroupStart());
            XT_NCCL(ncclGather(z.data(), z.data(), 1, ncclFloat32, 0, a, nullptr));
            XT_NCCL(ncclGroupSimulateEnd(&sim2));
            XT_CHECK_EQ(sim2.estimatedTime, -1.0f);
            XT_NCCL_REFUSED(ncclGroupEnd(), ncclInvalidUsage, "no group is open");
            XT_NCCL(ncclCommDestroy(a));
            XT_NCCL(ncclCommDestroy(b));
            // Over point-to-point messages here; the shared-memory family's variants are
            // predicted as well (shm_cost.c).
        },
        LoomMode({{"LOOM_SHM_COLL", "0"}})));
}

TEST(ShimLoom, NonBlockingSplitIsPolledOnTheChild)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            ncclComm_t world = NcclComm(rank, n);
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.blocking = 0;
            ncclComm_t child = reinterpret_cast<ncclComm_t>(&cfg); // overwritten before InProgress
            const int color = rank == 2 ? NCCL_SPLIT_NOCOLOR : 0;
            const ncclResult_t r = ncclCommSplit(world, color, rank, &child, &cfg);
            XT_CHECK_MSG(r == ncclInProgress || r == ncclSuccess, Text(r));
            if (color == NCCL_SPLIT_NOCOLOR) {
                XT_CHECK(child == nullptr);
            } else {
                XT_CHECK(child != nullptr);
            }
            // The parent is InProgress until the child is made, as NCCL has it.
            ncclResult_t state = ncclInProgress;
            while (state == ncclInProgress) {
                XT_NCCL(ncclCommGetAsyncError(world, &state));
                sched_yield();
            }
            XT_CHECK_EQ(state, ncclSuccess);
            if (child != nullptr) {
                state = ncclInProgress;
                while (state == ncclInProgress) {
                    XT_NCCL(ncclCommGetAsyncError(child, &state));
                    sched_yield();
                }
                XT_CHECK_EQ(state, ncclSuccess);
                CheckSum(child, 2, rank);
                XT_NCCL(ncclCommDestroy(child));
            }
            CheckSum(world, n, rank);
            XT_NCCL(ncclCommDestroy(world));
        },
        LoomMode()));
}

TEST(ShimLoom, EchoThroughTheDefaultRulesEqualsLoomsEcho)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            const size_t count = (1 << 20) / 2; // 1 MiB of bfloat16: the default rules' Echo size
            std::vector<uint16_t> in(count), via_nccl(count), via_loom(count);
            for (size_t i = 0; i < count; i++) {
                const float f = std::sin(static_cast<float>(i) * 0.01f + static_cast<float>(rank));
                uint32_t bits;
                std::memcpy(&bits, &f, 4);
                in[i] = static_cast<uint16_t>(bits >> 16);
            }
            XT_NCCL(ncclAllReduce(in.data(), via_nccl.data(), count, ncclBfloat16, ncclSum, comm,
                                  nullptr));
            XT_NCCL(ncclCommDestroy(comm));
            loomComm_t lc = loomtest::CreateComm();
            XT_CHECK_LOOM(loomEchoAllReduce(in.data(), via_loom.data(), count, loomBfloat16, lc,
                                            nullptr, nullptr));
            XT_CHECK_LOOM(loomCommDestroy(lc));
            XT_CHECK(std::memcmp(via_nccl.data(), via_loom.data(), count * 2) == 0);
        },
        LoomMode({{"LOOM_NCCL_ECHO", "1"}})));
}

// ---- with a CUDA driver in the process ---------------------------------------------------------

TEST(ShimLoom, CudaDriverLoadedDeviceBuffersAndStreams)
{
    const char *fake = std::getenv("LOOM_FAKE_CUDA");
    ASSERT_NE(fake, nullptr) << "LOOM_FAKE_CUDA names libfake-cuda.so";
    const std::string path = fake;
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [&](int rank, int n, loomComm_t) {
            void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
            XT_CHECK_MSG(h != nullptr, dlerror());
            auto set_range = reinterpret_cast<void (*)(const void *, size_t)>(
                dlsym(h, "fakeCudaSetDeviceRange"));
            auto syncs = reinterpret_cast<int (*)()>(dlsym(h, "fakeCudaSyncCount"));
            XT_CHECK(set_range != nullptr && syncs != nullptr);
            ncclComm_t comm = NcclComm(rank, n);
            int dev = -1;
            XT_NCCL(ncclCommCuDevice(comm, &dev));
            XT_CHECK_EQ(dev, 3); // the driver's current device when the communicator was made

            std::vector<float> host(16, 1.0f), device(16, 0.0f);
            set_range(device.data(), device.size() * sizeof(float));
            // No device path: the process loaded a CUDA driver (this stand-in) that reports no
            // device, or the build has no cuda feature; the refusal says which.
            char why[256] = "";
            const char *rt = "x";
            XT_CHECK_LOOM(loomCommDeviceRuntime(nullptr, &rt, why, sizeof(why)));
            XT_CHECK(rt == nullptr && why[0] != '\0');
            XT_NCCL_REFUSED(
                ncclAllReduce(host.data(), device.data(), 16, ncclFloat32, ncclSum, comm, nullptr),
                ncclInvalidUsage, "device buffers need loom's device path, which communicator");
            XT_CHECK_MSG(std::string(ncclGetLastError(nullptr)).find(why) != std::string::npos,
                         ncclGetLastError(nullptr));
            // ncclMemAlloc: a program that uses CUDA gets no host memory in its place.
            void *mem = nullptr;
            XT_NCCL_REFUSED(ncclMemAlloc(&mem, 64), ncclInvalidUsage,
                            "loom has no device runtime to allocate device memory with");
            XT_CHECK(mem == nullptr);
            auto stream = [](uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); };
            XT_NCCL_REFUSED(ncclAllReduce(host.data(), host.data(), 16, ncclFloat32, ncclSum, comm,
                                          stream(0x1000)),
                            ncclInvalidUsage, "captured into a CUDA graph");
            XT_NCCL_REFUSED(ncclAllReduce(host.data(), host.data(), 16, ncclFloat32, ncclSum, comm,
                                          stream(0x3000)),
                            ncclInvalidArgument, "nor a stream the CUDA driver knows");
            // A CUDA stream with host buffers: synchronized, then run before returning.
            const int before = syncs();
            CheckSum(comm, n, rank, 16, stream(0x2000));
            XT_CHECK_EQ(syncs(), before + 1);
            XT_NCCL(ncclCommDestroy(comm));
        },
        LoomMode()));
}

// ---- what loom mode refuses ----------------------------------------------------------------

TEST(ShimLoom, RefusalsAndQueries)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int rank, int n, loomComm_t) {
            // One id for everything: the refused inits below fail before they would reach its
            // rendezvous, and a second id's rendezvous would wait for ranks until loom's timeout.
            const ncclUniqueId id = SharedId();
            ncclComm_t comm = nullptr;
            XT_NCCL(ncclCommInitRank(&comm, n, id, rank));
            int v = -1;
            XT_NCCL(ncclGetVersion(&v));
            XT_CHECK_EQ(v, NCCL_VERSION_CODE);
            XT_NCCL(ncclCommCount(comm, &v));
            XT_CHECK_EQ(v, 1);
            XT_NCCL(ncclCommUserRank(comm, &v));
            XT_CHECK_EQ(v, 0);
            XT_NCCL(ncclCommCuDevice(comm, &v));
            XT_CHECK_EQ(v, 0); // no CUDA driver in this process
            XT_NCCL(ncclCommDestroy(nullptr));
            XT_NCCL(ncclCommAbort(nullptr));

            // Handles, ids and configs that are not the library's.
            int junk[64] = {0};
            ncclComm_t stranger = reinterpret_cast<ncclComm_t>(junk);
            XT_NCCL_REFUSED(ncclCommCount(stranger, &v), ncclInvalidArgument,
                            "not a communicator of this library");
            XT_NCCL_REFUSED(ncclCommDestroy(stranger), ncclInvalidArgument, "not a communicator");
            ncclUniqueId zero;
            std::memset(&zero, 0, sizeof(zero));
            ncclComm_t c2 = nullptr;
            XT_NCCL_REFUSED(ncclCommInitRank(&c2, 1, zero, 0), ncclInvalidArgument, "no loom id");
            ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
            bad.magic = 0;
            XT_NCCL_REFUSED(ncclCommInitRankConfig(&c2, 1, id, 0, &bad), ncclInvalidArgument,
                            "NCCL_CONFIG_INITIALIZER");
            ncclConfig_t bad_blocking = NCCL_CONFIG_INITIALIZER;
            bad_blocking.blocking = 2;
            XT_NCCL_REFUSED(ncclCommInitRankConfig(&c2, 1, id, 0, &bad_blocking),
                            ncclInvalidArgument, "blocking");

            // Memory without a device runtime: page-aligned host memory, and only the library's
            // pointers are freed.
            void *p = nullptr;
            XT_NCCL(ncclMemAlloc(&p, 1000));
            XT_CHECK(reinterpret_cast<uintptr_t>(p) %
                         static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)) ==
                     0);
            std::memset(p, 1, 1000);
            XT_NCCL_REFUSED(ncclMemFree(junk), ncclInvalidArgument,
                            "not allocated by ncclMemAlloc");
            XT_NCCL(ncclMemFree(p));
            XT_NCCL_REFUSED(ncclMemFree(p), ncclInvalidArgument, "freed already");

            // Registrations are tokens of their communicator.
            void *reg = nullptr;
            XT_NCCL(ncclCommRegister(comm, junk, sizeof(junk), &reg));
            ncclWindow_t win = nullptr;
            XT_NCCL(
                ncclCommWindowRegister(comm, junk, sizeof(junk), &win, NCCL_WIN_COLL_SYMMETRIC));
            XT_NCCL_REFUSED(ncclCommDeregister(comm, win), ncclInvalidArgument,
                            "not a registration");
            XT_NCCL(ncclCommDeregister(comm, reg));
            XT_NCCL_REFUSED(ncclCommDeregister(comm, reg), ncclInvalidArgument,
                            "not a registration");
            XT_NCCL(ncclCommWindowDeregister(comm, win));
            void *left = nullptr; // left registered: freed with the communicator
            XT_NCCL(ncclCommRegister(comm, junk, 8, &left));

            // PreMulSum ops belong to a communicator and a datatype.
            float s = 2;
            ncclRedOp_t op;
            XT_NCCL(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat32, ncclScalarHostImmediate, comm));
            XT_CHECK_EQ(static_cast<int>(op), static_cast<int>(ncclNumOps));
            double d[2] = {1, 2};
            XT_NCCL_REFUSED(ncclAllReduce(d, d, 2, ncclFloat64, op, comm, nullptr),
                            ncclInvalidArgument, "made for datatype");
            float f[2] = {1, 2};
            XT_NCCL(ncclAllReduce(f, f, 2, ncclFloat32, op, comm, nullptr));
            XT_CHECK_EQ(f[1], 4.0f);
            XT_NCCL(ncclRedOpDestroy(op, comm));
            XT_NCCL_REFUSED(ncclAllReduce(f, f, 2, ncclFloat32, op, comm, nullptr),
                            ncclInvalidArgument, "live PreMulSum op");

            // Shrink and revoke arguments (one rank: it cannot exclude itself).
            ncclComm_t shrunk = nullptr;
            int exclude = 0;
            XT_NCCL_REFUSED(
                ncclCommShrink(comm, &exclude, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT),
                ncclInvalidArgument, "own exclude list");
            XT_NCCL_REFUSED(ncclCommShrink(comm, &exclude, 0, &shrunk, nullptr, 0),
                            ncclInvalidArgument, "must be > 0");
            XT_NCCL_REFUSED(ncclCommShrink(comm, &exclude, 1, &shrunk, nullptr, 7),
                            ncclInvalidArgument, "shrinkFlags");
            XT_NCCL_REFUSED(ncclCommRevoke(comm, 3), ncclInvalidArgument, "must be 0");
            XT_CHECK(shrunk == nullptr);
            XT_NCCL_REFUSED(ncclGroupEnd(), ncclInvalidUsage, "no group is open");
            XT_NCCL(ncclCommFinalize(comm));
            XT_NCCL(ncclCommDestroy(comm));
            XT_NCCL_REFUSED(ncclCommDestroy(comm), ncclInvalidArgument, "not a communicator");
        },
        LoomMode()));
}

// ncclCommShrink on loom's shrink: a planned removal (NCCL_SHRINK_DEFAULT) keeps the parent, a
// shrink after a failure (NCCL_SHRINK_ABORT) revokes it first; the children work, renumbered.
TEST(ShimLoom, ShrinkAndRevoke)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            CheckSum(comm, n, rank);
            if (rank == 2) { // leaves; the others shrink without it
                XT_NCCL(ncclCommDestroy(comm));
                return;
            }
            int gone = 2, count = 0, me = -1;
            ncclComm_t planned = nullptr, failed = nullptr;
            XT_NCCL(ncclCommShrink(comm, &gone, 1, &planned, nullptr, NCCL_SHRINK_DEFAULT));
            XT_NCCL(ncclCommCount(planned, &count));
            XT_NCCL(ncclCommUserRank(planned, &me));
            XT_CHECK_EQ(count, 2);
            XT_CHECK_EQ(me, rank);
            CheckSum(planned, 2, rank);
            XT_NCCL(ncclCommShrink(comm, &gone, 1, &failed, nullptr, NCCL_SHRINK_ABORT));
            CheckSum(failed, 2, rank);
            float x = 1; // the parent is revoked: its calls fail without running
            XT_NCCL_REFUSED(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr),
                            ncclRemoteError, "revoked");
            XT_NCCL(ncclCommRevoke(planned, NCCL_REVOKE_DEFAULT));
            XT_NCCL_REFUSED(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, planned, nullptr),
                            ncclRemoteError, "revoked");
            XT_NCCL(ncclCommDestroy(planned));
            XT_NCCL(ncclCommDestroy(failed));
            XT_NCCL(ncclCommDestroy(comm));
        },
        LoomMode()));
}

// The device API's host functions are declared in C++ headers; the library exports them with
// C linkage, as the real one does.
struct Team {
    int nRanks, rank, stride;
};
extern "C" Team ncclTeamWorld(ncclComm_t comm);
extern "C" int ncclTeamRankToWorld(ncclComm_t comm, Team team, int rank);
extern "C" int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *outDevComm);

TEST(ShimLoom, DeviceApiIsRefused)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            char out[256];
            XT_NCCL_REFUSED(ncclDevCommCreate(comm, out, out), ncclInvalidUsage,
                            "device API is not provided by loom");
            const Team t = ncclTeamWorld(comm);
            XT_CHECK(t.nRanks == 0 && t.rank == 0 && t.stride == 0);
            XT_CHECK_EQ(ncclTeamRankToWorld(comm, t, 0), -1);
            XT_CHECK_EQ(ncclLLA2ACalcSlots(16, 8), 0);
            XT_NCCL(ncclCommDestroy(comm));
        },
        LoomMode()));
}

// Route mode (the default) without a real library to pair with behaves as loom mode.
TEST(ShimLoom, RouteModeWithoutARealLibraryIsLoomMode)
{
    loomtest::RunOptions opts;
    opts.create_comm = false;
    opts.unset_env = {"LOOM_NCCL_MODE"};
    opts.env = {{"LOOM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        2,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            CheckSum(comm, n, rank);
            int v = 0;
            XT_NCCL(ncclGetVersion(&v));
            XT_CHECK_EQ(v, NCCL_VERSION_CODE);
            XT_NCCL(ncclCommDestroy(comm));
        },
        opts));
}

// ncclCommInitAll: one process holds every rank (as torch.cuda.nccl and nn.DataParallel use
// it); the ranks' calls are issued from one thread inside one group, as NCCL requires.
TEST(ShimLoom, InitAllMakesEveryRankInOneProcess)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int, int, loomComm_t) {
            const int ndev = 3;
            const size_t count = 33;
            ncclComm_t comms[ndev] = {};
            const int devlist[ndev] = {5, 6, 7};
            XT_NCCL(ncclCommInitAll(comms, ndev, devlist));
            std::vector<std::vector<float>> in(ndev, std::vector<float>(count)),
                out(ndev, std::vector<float>(count, -1));
            for (int r = 0; r < ndev; r++) {
                int n = 0, rank = -1, dev = -1;
                XT_NCCL(ncclCommCount(comms[r], &n));
                XT_NCCL(ncclCommUserRank(comms[r], &rank));
                XT_NCCL(ncclCommCuDevice(comms[r], &dev));
                XT_CHECK_EQ(n, ndev);
                XT_CHECK_EQ(rank, r);
                XT_CHECK_EQ(dev, devlist[r]);
                for (size_t i = 0; i < count; i++)
                    in[r][i] = static_cast<float>((r + 1) * (i + 1));
            }
            XT_NCCL(ncclGroupStart());
            for (int r = 0; r < ndev; r++)
                XT_NCCL(ncclAllReduce(in[r].data(), out[r].data(), count, ncclFloat32, ncclSum,
                                      comms[r], nullptr));
            XT_NCCL(ncclGroupEnd());
            for (int r = 0; r < ndev; r++)
                for (size_t i = 0; i < count; i++)
                    XT_CHECK_EQ(out[r][i], static_cast<float>(ndev * (ndev + 1) / 2 * (i + 1)));
            for (int r = 0; r < ndev; r++)
                XT_NCCL(ncclCommDestroy(comms[r]));
            XT_NCCL_REFUSED(ncclCommInitAll(comms, 0, nullptr), ncclInvalidArgument, "ndev");
            XT_NCCL_REFUSED(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "NULL");
        },
        LoomMode()));
}

// ncclCommInitRankScalable with one id and with two (loom's rendezvous takes the first).
TEST(ShimLoom, InitRankScalableTakesItsIds)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t) {
            for (int nids : {1, 2}) {
                ncclUniqueId ids[2];
                std::memset(ids, 0, sizeof(ids));
                if (rank == 0)
                    for (int k = 0; k < nids; k++)
                        XT_NCCL(ncclGetUniqueId(&ids[k]));
                loomtest::ShareFromRank0(ids, sizeof(ids));
                ncclComm_t comm = nullptr;
                XT_NCCL(ncclCommInitRankScalable(&comm, n, rank, nids, ids, nullptr));
                CheckSum(comm, n, rank);
                XT_NCCL(ncclCommDestroy(comm));
            }
            ncclComm_t comm = nullptr;
            ncclUniqueId id;
            XT_NCCL_REFUSED(ncclCommInitRankScalable(&comm, n, rank, 0, &id, nullptr),
                            ncclInvalidArgument, "at least one");
        },
        LoomMode()));
}

// A bad LOOM_NCCL_ROUTE fails the calls it would route, with the parser's message.
TEST(ShimLoom, BadRoutingRulesAreReported)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        1,
        [](int rank, int n, loomComm_t) {
            ncclComm_t comm = NcclComm(rank, n);
            float f = 1;
            XT_NCCL_REFUSED(ncclAllReduce(&f, &f, 1, ncclFloat32, ncclSum, comm, nullptr),
                            ncclInvalidArgument, "LOOM_NCCL_ROUTE");
            XT_NCCL(ncclCommDestroy(comm));
        },
        LoomMode({{"LOOM_NCCL_ROUTE", "allreduce->nowhere"}})));
}

} // namespace

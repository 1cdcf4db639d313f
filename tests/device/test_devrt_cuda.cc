// SPDX-License-Identifier: Apache-2.0
//
// test_devrt_cuda.cc - the CUDA device runtime (devrt_cuda.c) keeps the semantics of devrt.h
// that the emulation's tests (tests/unit/test_devrt_emu*.cc) check on a CPU: stream order,
// waits released by a host store, another stream's write and the abort value, CUDA's cyclic
// comparison, events, the legacy default stream, destroy with queued work, ptr_device and
// ptr_base, copies between every kind of memory, bad pointers, IPC with another process (a
// fresh one: CUDA does not survive fork), capture, a kernel's bits. Without a GPU these skip
// with the reason; the reasons loom_devrt_cuda gives are checked everywhere, in a fresh process
// that has not loaded the CUDA driver, then has.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dev_kernels.h"
#include "devrt.h"
#include "devtp.h"
#include "rerun_self.h"

extern "C" {
#include "debug.h"
}

namespace {

// Why this process cannot run the GPU tests ("" if it can). Starts CUDA.
std::string NoGpu()
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return std::string("no usable GPU: cudaGetDeviceCount: ") + cudaGetErrorString(e);
    }
    return n > 0 ? "" : "no GPU: cudaGetDeviceCount found none";
}

bool WaitFor(const std::function<bool()> &cond, double seconds = 10.0)
{
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
    while (!cond()) {
        if (std::chrono::steady_clock::now() > end)
            return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
}

uint32_t Load(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void Store(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

class DevrtCuda : public ::testing::Test {
  protected:
    void SetUp() override
    {
        const std::string why = NoGpu();
        if (!why.empty())
            GTEST_SKIP() << why;
        char w[256];
        rt = loom_devrt_cuda(w, sizeof(w));
        ASSERT_NE(rt, nullptr) << w;
        // Flag words in a page of host memory mapped for the device, as the transports keep them.
        page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(page, MAP_FAILED);
        ASSERT_EQ(rt->host_map(page, 4096, &page_dev), loomSuccess);
    }
    void TearDown() override
    {
        if (rt == nullptr)
            return;
        // Whatever a failed check left waiting is released, so no stream stays blocked.
        for (int i = 0; i < 64; i++)
            Store(Host(i), LOOM_DEV_FLAG_ABORT);
        cudaDeviceSynchronize();
        rt->host_unmap(page);
        munmap(page, 4096);
    }
    uint32_t *Host(int i)
    {
        return static_cast<uint32_t *>(page) + i;
    }
    uint32_t *Dev(int i)
    {
        return static_cast<uint32_t *>(page_dev) + i;
    }
    bool Drain(loom_dev_stream_t s)
    {
        return WaitFor([&] { return rt->stream_query(s) == loomSuccess; });
    }
    const loom_devrt_t *rt = nullptr;
    void *page = nullptr, *page_dev = nullptr;
};

TEST_F(DevrtCuda, DeviceAndProps)
{
    EXPECT_STREQ(rt->name, "cuda");
    int n = 0, cur = -1, dev = -2;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    EXPECT_EQ(rt->device_count(), n);
    ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
    ASSERT_EQ(rt->current_device(&dev), loomSuccess);
    EXPECT_EQ(dev, cur);
    loom_dev_props_t p;
    ASSERT_EQ(rt->device_props(dev, &p), loomSuccess);
    EXPECT_GT(strlen(p.name), 0u);
    EXPECT_EQ(strlen(p.pci_bus_id), 12u) << p.pci_bus_id; // "0000:19:00.0"
    EXPECT_GE(p.cc_major, 5);
    EXPECT_GT(p.mem_bytes, 0u);
    EXPECT_GT(p.sm_count, 0);
    EXPECT_EQ(rt->device_props(n, &p), loomUnhandledDeviceError);
    char why[192] = "x";
    EXPECT_EQ(rt->memops_ok(why, sizeof(why)), 1) << why;
    printf("device %d: %s, %s, cc %d.%d, %zu bytes, %d SMs\n", dev, p.name, p.pci_bus_id,
           p.cc_major, p.cc_minor, p.mem_bytes, p.sm_count);
}

TEST_F(DevrtCuda, StreamRunsInIssueOrder)
{
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(rt->stream_create(&s), loomSuccess);
    void *a = nullptr, *b = nullptr;
    ASSERT_EQ(rt->mem_alloc(&a, 1 << 20), loomSuccess);
    ASSERT_EQ(rt->mem_alloc(&b, 1 << 20), loomSuccess);
    std::vector<uint8_t> in(1 << 20), out(1 << 20);
    for (int round = 1; round <= 20; round++) {
        memset(in.data(), round, in.size());
        ASSERT_EQ(rt->memcpy_async(a, in.data(), in.size(), s), loomSuccess);
        ASSERT_EQ(rt->memcpy_async(b, a, in.size(), s), loomSuccess);
        ASSERT_EQ(rt->memcpy_async(out.data(), b, in.size(), s), loomSuccess);
        ASSERT_TRUE(Drain(s));
        ASSERT_EQ(out[0], round);
        ASSERT_EQ(out.back(), round);
    }
    EXPECT_EQ(rt->mem_free(a), loomSuccess);
    EXPECT_EQ(rt->mem_free(b), loomSuccess);
    EXPECT_EQ(rt->stream_destroy(s), loomSuccess);
}

TEST_F(DevrtCuda, WaitHoldsUntilHostStoreAndAbort)
{
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(rt->stream_create(&s), loomSuccess);
    ASSERT_EQ(rt->wait_u32(s, Dev(0), 3), loomSuccess);
    ASSERT_EQ(rt->write_u32(s, Dev(1), 7), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(rt->stream_query(s), loomInProgress);
    Store(Host(0), 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(Load(Host(1)), 0u);
    Store(Host(0), 3);
    ASSERT_TRUE(WaitFor([&] { return Load(Host(1)) == 7; }));
    // The abort value releases a wait for any protocol value.
    ASSERT_EQ(rt->wait_u32(s, Dev(2), LOOM_DEV_FLAG_ABORT - 1), loomSuccess);
    ASSERT_EQ(rt->write_u32(s, Dev(3), 1), loomSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    Store(Host(2), LOOM_DEV_FLAG_ABORT);
    ASSERT_TRUE(WaitFor([&] { return Load(Host(3)) == 1; }, 1.0));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    // Cyclic, as devrt.h says: 0xffffffff is not past 1.
    ASSERT_EQ(rt->wait_u32(s, Dev(4), 1), loomSuccess);
    ASSERT_EQ(rt->write_u32(s, Dev(5), 1), loomSuccess);
    Store(Host(4), 0xffffffffu);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(Load(Host(5)), 0u);
    Store(Host(4), 1);
    EXPECT_TRUE(Drain(s));
    EXPECT_EQ(rt->stream_destroy(s), loomSuccess);
}

TEST_F(DevrtCuda, WaitReleasedByAnotherStreamsWrite)
{
    loom_dev_stream_t waiter = nullptr, writer = nullptr;
    ASSERT_EQ(rt->stream_create(&waiter), loomSuccess);
    ASSERT_EQ(rt->stream_create(&writer), loomSuccess);
    void *d = nullptr;
    ASSERT_EQ(rt->mem_alloc(&d, 4096), loomSuccess);
    std::vector<uint8_t> zero(4096, 0), src(1024, 0x11), out(1024, 0);
    ASSERT_EQ(rt->memcpy_async(d, zero.data(), 4096, writer), loomSuccess);
    ASSERT_TRUE(Drain(writer));
    uint32_t *flag = static_cast<uint32_t *>(d);
    uint8_t *data = static_cast<uint8_t *>(d) + 1024;
    ASSERT_EQ(rt->wait_u32(waiter, flag, 1), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(out.data(), data, 1024, waiter), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(rt->stream_query(waiter), loomInProgress);
    ASSERT_EQ(rt->memcpy_async(data, src.data(), 1024, writer), loomSuccess);
    ASSERT_EQ(rt->write_u32(writer, flag, 1), loomSuccess);
    ASSERT_TRUE(Drain(waiter));
    EXPECT_EQ(out[0], 0x11);
    EXPECT_EQ(out[1023], 0x11);
    EXPECT_EQ(rt->mem_free(d), loomSuccess);
    EXPECT_EQ(rt->stream_destroy(waiter), loomSuccess);
    EXPECT_EQ(rt->stream_destroy(writer), loomSuccess);
}

TEST_F(DevrtCuda, EventsAndTheDefaultStream)
{
    loom_dev_stream_t s = nullptr;
    loom_dev_event_t e = nullptr, never = nullptr;
    ASSERT_EQ(rt->stream_create(&s), loomSuccess);
    ASSERT_EQ(rt->event_create(&e), loomSuccess);
    ASSERT_EQ(rt->event_create(&never), loomSuccess);
    EXPECT_EQ(rt->event_query(never), loomSuccess);
    ASSERT_EQ(rt->wait_u32(s, Dev(0), 1), loomSuccess);
    ASSERT_EQ(rt->event_record(e, s), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(rt->event_query(e), loomInProgress);
    Store(Host(0), 1);
    EXPECT_TRUE(WaitFor([&] { return rt->event_query(e) == loomSuccess; }));
    // Legacy default stream: a blocking stream's later work waits behind it, and back.
    ASSERT_EQ(rt->wait_u32(nullptr, Dev(1), 1), loomSuccess);
    ASSERT_EQ(rt->write_u32(s, Dev(2), 1), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(Load(Host(2)), 0u);
    Store(Host(1), 1);
    ASSERT_TRUE(WaitFor([&] { return Load(Host(2)) == 1; }));
    ASSERT_EQ(rt->wait_u32(s, Dev(3), 1), loomSuccess);
    ASSERT_EQ(rt->write_u32(nullptr, Dev(4), 1), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(Load(Host(4)), 0u);
    Store(Host(3), 1);
    ASSERT_TRUE(WaitFor([&] { return Load(Host(4)) == 1; }));
    EXPECT_TRUE(Drain(nullptr));
    EXPECT_EQ(rt->event_destroy(e), loomSuccess);
    EXPECT_EQ(rt->event_destroy(never), loomSuccess);
    EXPECT_EQ(rt->stream_destroy(nullptr), loomInvalidArgument);
    EXPECT_EQ(rt->stream_destroy(s), loomSuccess);
}

TEST_F(DevrtCuda, DestroyReturnsAtOnceAndTheQueueStillRuns)
{
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(rt->stream_create(&s), loomSuccess);
    ASSERT_EQ(rt->wait_u32(s, Dev(0), 1), loomSuccess);
    ASSERT_EQ(rt->write_u32(s, Dev(1), 9), loomSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(rt->stream_destroy(s), loomSuccess);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    Store(Host(0), 1);
    EXPECT_TRUE(WaitFor([&] { return Load(Host(1)) == 9; }));
}

TEST_F(DevrtCuda, PointersAndCopiesBetweenEveryKind)
{
    const size_t n = (1 << 20) + 13;
    void *d1 = nullptr, *d2 = nullptr, *pinned = nullptr;
    ASSERT_EQ(rt->mem_alloc(&d1, n), loomSuccess);
    ASSERT_EQ(rt->mem_alloc(&d2, n), loomSuccess);
    ASSERT_EQ(rt->host_alloc(&pinned, n), loomSuccess);
    int dev = -1, on_stack = 0;
    ASSERT_EQ(rt->current_device(&dev), loomSuccess);
    EXPECT_EQ(rt->ptr_device(d1), dev);
    EXPECT_EQ(rt->ptr_device(static_cast<char *>(d1) + 4097), dev);
    EXPECT_EQ(rt->ptr_device(pinned), -1);
    EXPECT_EQ(rt->ptr_device(page), -1);
    EXPECT_EQ(rt->ptr_device(&on_stack), -1);
    EXPECT_EQ(rt->ptr_device(nullptr), -1);
    void *base = nullptr;
    size_t size = 0;
    ASSERT_EQ(rt->ptr_base(static_cast<char *>(d1) + 4097, &base, &size), loomSuccess);
    EXPECT_EQ(base, d1);
    EXPECT_GE(size, n);
    EXPECT_EQ(rt->ptr_base(&on_stack, &base, &size), loomInvalidArgument);

    std::vector<uint8_t> plain(n), out(n);
    for (size_t i = 0; i < n; i++)
        plain[i] = (uint8_t)(i * 7 + 1);
    ASSERT_EQ(rt->memcpy_async(d1, plain.data(), n, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(pinned, d1, n, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(d2, pinned, n, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(page_dev, d2, 4096, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(d1, d2, n, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(out.data(), d1, n, nullptr), loomSuccess);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(memcmp(out.data(), plain.data(), n), 0);
    EXPECT_EQ(memcmp(page, plain.data(), 4096), 0);
    memset(page, 0, 4096); // the flags of TearDown

    // Bad pointers: refused with a message, never a device error or a crash.
    EXPECT_EQ(rt->mem_free(&on_stack), loomInvalidArgument);
    EXPECT_EQ(rt->mem_free(static_cast<char *>(d1) + 64), loomInvalidArgument);
    EXPECT_NE(std::string(loom_last_error()).find("inside the allocation"), std::string::npos);
    EXPECT_EQ(rt->host_free(d1), loomInvalidArgument);
    EXPECT_EQ(rt->ipc_close(&on_stack), loomInvalidArgument);
    EXPECT_EQ(rt->host_unmap(&on_stack), loomInvalidArgument);
    loom_dev_ipc_t h;
    EXPECT_EQ(rt->ipc_export(static_cast<char *>(d1) + 64, &h), loomInvalidArgument);
    EXPECT_EQ(rt->mem_free(nullptr), loomSuccess);

    EXPECT_EQ(rt->mem_free(d1), loomSuccess);
    EXPECT_EQ(rt->ptr_device(d1), -1) << "freed";
    EXPECT_EQ(rt->mem_free(d2), loomSuccess);
    EXPECT_EQ(rt->host_free(pinned), loomSuccess);
}

TEST_F(DevrtCuda, CaptureIsSeen)
{
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(rt->stream_create(&s), loomSuccess);
    int c = -1;
    ASSERT_EQ(rt->stream_capturing(s, &c), loomSuccess);
    EXPECT_EQ(c, 0);
    cudaStream_t cs = reinterpret_cast<cudaStream_t>(s);
    ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(rt->stream_capturing(s, &c), loomSuccess);
    EXPECT_EQ(c, 1);
    cudaGraph_t g = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(cs, &g), cudaSuccess);
    if (g != nullptr)
        cudaGraphDestroy(g);
    ASSERT_EQ(rt->stream_capturing(s, &c), loomSuccess);
    EXPECT_EQ(c, 0);
    EXPECT_EQ(rt->stream_destroy(s), loomSuccess);
}

TEST_F(DevrtCuda, ReduceGivesTheHostKernelsBits)
{
    const size_t n = 100003;
    std::vector<float> x(n), y(n), want(n), got(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 977) * 0.31f - 7.0f;
        y[i] = (float)(i % 313) * -1.7f + 0.5f;
    }
    void *dx = nullptr, *dy = nullptr, *dz = nullptr;
    ASSERT_EQ(rt->mem_alloc(&dx, n * 4), loomSuccess);
    ASSERT_EQ(rt->mem_alloc(&dy, n * 4), loomSuccess);
    ASSERT_EQ(rt->mem_alloc(&dz, n * 4), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(dx, x.data(), n * 4, nullptr), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(dy, y.data(), n * 4, nullptr), loomSuccess);
    const void *srcs[2] = {dx, dy}, *hsrcs[2] = {x.data(), y.data()};
    ASSERT_EQ(loom_dk_host_reduce(loomFloat32, loomAvg, want.data(), hsrcs, 2, n, 2), 0);
    ASSERT_EQ(rt->reduce(nullptr, loomFloat32, loomAvg, dz, srcs, 2, n, 2), loomSuccess);
    ASSERT_EQ(rt->memcpy_async(got.data(), dz, n * 4, nullptr), loomSuccess);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(memcmp(want.data(), got.data(), n * 4), 0);
    EXPECT_EQ(rt->reduce(nullptr, loomFloat8e4m3, loomSum, dz, srcs, 2, n, 2), loomInvalidArgument);
    rt->mem_free(dx);
    rt->mem_free(dy);
    rt->mem_free(dz);
}

// ---- IPC with another process ---------------------------------------------------------------

const char ipc_flag[] = "LOOM_TEST_DEVRT_CUDA_IPC";

std::string Hex(const loom_dev_ipc_t &h)
{
    std::string s;
    char b[3];
    for (unsigned char c : h.bytes) {
        snprintf(b, sizeof(b), "%02x", c);
        s += b;
    }
    return s;
}

// The other process: opens the handle, checks the parent's bytes, writes its own, closes.
TEST(DevrtCudaIpcChild, OpenWriteClose)
{
    const char *hex = std::getenv(ipc_flag);
    if (hex == nullptr)
        GTEST_SKIP() << "runs only as the child process of DevrtCuda.IpcWithAnotherProcess";
    ASSERT_EQ(NoGpu(), "");
    char why[256];
    const loom_devrt_t *rt = loom_devrt_cuda(why, sizeof(why));
    ASSERT_NE(rt, nullptr) << why;
    loom_dev_ipc_t h;
    ASSERT_EQ(strlen(hex), 2 * sizeof(h.bytes));
    for (size_t i = 0; i < sizeof(h.bytes); i++)
        h.bytes[i] = (unsigned char)std::stoi(std::string(hex + 2 * i, 2), nullptr, 16);
    void *p = nullptr;
    ASSERT_EQ(rt->ipc_open(&h, &p), loomSuccess);
    int dev = -1;
    ASSERT_EQ(rt->current_device(&dev), loomSuccess);
    EXPECT_EQ(rt->ptr_device(p), dev);
    std::vector<uint8_t> buf(4096);
    ASSERT_EQ(rt->memcpy_async(buf.data(), p, 4096, nullptr), loomSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(buf[0], 0xa5);
    EXPECT_EQ(buf[4095], 0xa5);
    memset(buf.data(), 0x5a, buf.size());
    ASSERT_EQ(rt->memcpy_async(p, buf.data(), 4096, nullptr), loomSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(rt->ipc_close(p), loomSuccess);
}

TEST_F(DevrtCuda, IpcWithAnotherProcess)
{
    void *d = nullptr;
    ASSERT_EQ(rt->mem_alloc(&d, 1 << 20), loomSuccess);
    std::vector<uint8_t> buf(4096, 0xa5);
    ASSERT_EQ(rt->memcpy_async(d, buf.data(), 4096, nullptr), loomSuccess);
    ASSERT_TRUE(Drain(nullptr));
    loom_dev_ipc_t h;
    ASSERT_EQ(rt->ipc_export(d, &h), loomSuccess);
    void *self = nullptr;
    EXPECT_NE(rt->ipc_open(&h, &self), loomSuccess) << "a handle of this process is refused";
    const int st = loomtest::RerunSelf("DevrtCudaIpcChild.*", {{ipc_flag, Hex(h)}}, 60.0);
    EXPECT_EQ(st, 0) << "the child process failed (its output is above)";
    ASSERT_EQ(rt->memcpy_async(buf.data(), d, 4096, nullptr), loomSuccess);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(buf[0], 0x5a);
    EXPECT_EQ(buf[4095], 0x5a);
    EXPECT_EQ(rt->mem_free(d), loomSuccess);
}

// ---- why not: a fresh process, before and after it starts CUDA -------------------------------

const char why_flag[] = "LOOM_TEST_DEVRT_CUDA_WHY";

TEST(DevrtCudaWhyChild, BeforeAndAfterCudaStarts)
{
    if (std::getenv(why_flag) == nullptr)
        GTEST_SKIP() << "runs only as the child process of DevrtCudaWhy.*";
    char why[256] = "";
    // Nothing in this process has touched CUDA: loom does not start it.
    EXPECT_EQ(loom_devrt_cuda(why, sizeof(why)), nullptr);
    EXPECT_NE(std::string(why).find("is not loaded in this process"), std::string::npos) << why;
    EXPECT_EQ(loom_devrt(), nullptr);
    EXPECT_STREQ(loom_devrt_why_none(), why);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n); // the application starts CUDA
    (void)cudaGetLastError();
    const loom_devrt_t *rt = loom_devrt_cuda(why, sizeof(why));
    printf("after cudaGetDeviceCount (%s, %d devices): %s\n", cudaGetErrorString(e), n,
           rt != nullptr ? "the CUDA runtime" : why);
    if (e == cudaSuccess && n > 0) {
        EXPECT_NE(rt, nullptr) << why;
        EXPECT_STREQ(why, "");
        EXPECT_EQ(loom_devrt(), rt) << "LOOM_DEVICE=auto takes it once CUDA runs";
        EXPECT_STREQ(loom_devrt_why_none(), "");
    } else {
        EXPECT_EQ(rt, nullptr);
        const std::string w = why;
        // No driver at all leaves it unloaded; a driver without a usable device says so.
        EXPECT_TRUE(w.find("is not loaded in this process") != std::string::npos ||
                    w.find(std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e)) !=
                        std::string::npos ||
                    w == "no CUDA device")
            << w;
        EXPECT_EQ(loom_devrt(), nullptr);
    }
}

TEST(DevrtCudaWhy, InAFreshProcess)
{
    const int st = loomtest::RerunSelf("DevrtCudaWhyChild.*",
                                       {{why_flag, "1"}, {"LOOM_DEVICE", "auto"}}, 60.0);
    EXPECT_EQ(st, 0) << "the child's checks failed (its output is above)";
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_devrt_emu.cc - the emulated device runtime's streams (devrt.h, devrt_emu.h): operations
// run in issue order; a wait_u32 holds every later operation until a host store or another
// stream's write_u32 reaches its value (the abort value too; compared cyclically, as CUDA
// does); events; the default
// stream and its order with blocking streams; destroy with work still queued; the capture mark;
// the kernels give dev_kernels_host.c's bits; bad arguments are refused with a message. Memory,
// IPC and the choice of runtime are in test_devrt_emu_mem.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "dev_kernels.h"
#include "devrt_emu_util.h"
#include "devtp.h"
#include "q4.h"

extern "C" {
#include "debug.h"
}

using loomtest::DevBuf;
using loomtest::Drain;
using loomtest::Emu;
using loomtest::FlagBuf;
using loomtest::LoadU32;
using loomtest::StoreU32;
using loomtest::WaitFor;

namespace {

struct Stream {
    loom_dev_stream_t s = nullptr;
    Stream()
    {
        EXPECT_EQ(Emu()->stream_create(&s), loomSuccess);
    }
    ~Stream()
    {
        if (s != nullptr) {
            Drain(s);
            Emu()->stream_destroy(s);
        }
    }
};

TEST(DevrtEmu, OneDevice)
{
    const loom_devrt_t *rt = Emu();
    ASSERT_NE(rt, nullptr);
    EXPECT_STREQ(rt->name, "emulated");
    EXPECT_EQ(rt->device_count(), 1);
    int dev = -1;
    EXPECT_EQ(rt->current_device(&dev), loomSuccess);
    EXPECT_EQ(dev, 0);
    loom_dev_props_t props;
    ASSERT_EQ(rt->device_props(0, &props), loomSuccess);
    EXPECT_STREQ(props.name, "emulated");
    EXPECT_STREQ(props.pci_bus_id, "");
    EXPECT_EQ(props.cc_major, 0);
    EXPECT_GT(props.mem_bytes, 0u);
    EXPECT_GE(props.sm_count, 1);
    EXPECT_EQ(rt->device_props(1, &props), loomInvalidArgument);
    char why[64] = "x";
    EXPECT_EQ(rt->memops_ok(why, sizeof(why)), 1);
    EXPECT_STREQ(why, "");
}

TEST(DevrtEmu, StreamRunsInIssueOrder)
{
    Stream st;
    DevBuf a(4096), b(4096), c(4096);
    ASSERT_TRUE(a.p && b.p && c.p);
    std::vector<uint8_t> host(4096);
    // A chain where each copy reads what the previous one wrote: out of order, c keeps zeros.
    for (int round = 1; round <= 50; round++) {
        memset(host.data(), round, host.size());
        ASSERT_EQ(Emu()->memcpy_async(a.p, host.data(), 4096, st.s), loomSuccess);
        ASSERT_EQ(Emu()->memcpy_async(b.p, a.p, 4096, st.s), loomSuccess);
        ASSERT_EQ(Emu()->memcpy_async(c.p, b.p, 4096, st.s), loomSuccess);
        std::vector<uint8_t> out(4096, 0);
        ASSERT_EQ(Emu()->memcpy_async(out.data(), c.p, 4096, st.s), loomSuccess);
        ASSERT_TRUE(Drain(st.s));
        ASSERT_EQ(out[0], round);
        ASSERT_EQ(out[4095], round);
    }
}

TEST(DevrtEmu, WaitHoldsLaterOperationsUntilAHostStore)
{
    Stream st;
    FlagBuf flag(64);
    DevBuf data(256);
    ASSERT_TRUE(flag.p && data.p);
    uint32_t *f = flag.as<uint32_t>();
    uint32_t *done = f + 1;
    std::vector<uint8_t> src(256, 0x5a);
    ASSERT_EQ(Emu()->wait_u32(st.s, f, 3), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(data.p, src.data(), 256, st.s), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(st.s, done, 7), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(Emu()->stream_query(st.s), loomInProgress);
    EXPECT_EQ(data.as<uint8_t>()[0], 0) << "the copy ran before the wait was released";
    StoreU32(f, 2); // below the value: still held
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(done), 0u);
    StoreU32(f, 3);
    ASSERT_TRUE(WaitFor([&] { return LoadU32(done) == 7; }));
    EXPECT_EQ(data.as<uint8_t>()[255], 0x5a);
    EXPECT_TRUE(Drain(st.s));
}

TEST(DevrtEmu, WaitReleasedByAnotherStreamsWrite)
{
    Stream waiter, writer;
    FlagBuf flag(64);
    DevBuf a(1024), b(1024);
    ASSERT_TRUE(flag.p && a.p && b.p);
    uint32_t *f = flag.as<uint32_t>();
    std::vector<uint8_t> src(1024, 0x11), out(1024, 0);
    // waiter copies a -> out only after writer filled a and raised the flag.
    ASSERT_EQ(Emu()->wait_u32(waiter.s, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(out.data(), a.p, 1024, waiter.s), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(Emu()->memcpy_async(a.p, src.data(), 1024, writer.s), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(writer.s, f, 1), loomSuccess);
    ASSERT_TRUE(Drain(waiter.s));
    EXPECT_EQ(out[0], 0x11);
    EXPECT_EQ(out[1023], 0x11);
}

TEST(DevrtEmu, AbortValueReleasesAWait)
{
    Stream st;
    FlagBuf flag(64);
    ASSERT_TRUE(flag.p);
    uint32_t *f = flag.as<uint32_t>();
    ASSERT_EQ(Emu()->wait_u32(st.s, f, 3), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(st.s, f + 1, 1), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(LoadU32(f + 1), 0u);
    const auto t0 = std::chrono::steady_clock::now();
    StoreU32(f, LOOM_DEV_FLAG_ABORT);
    ASSERT_TRUE(WaitFor([&] { return LoadU32(f + 1) == 1; }, 1.0));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    // The abort value releases a wait for any value a protocol may use, even the largest.
    ASSERT_EQ(Emu()->wait_u32(st.s, f + 2, LOOM_DEV_FLAG_ABORT), loomSuccess);
    StoreU32(f + 2, LOOM_DEV_FLAG_ABORT);
    EXPECT_TRUE(Drain(st.s));
}

TEST(DevrtEmu, WaitComparesCyclicallyAsCuda)
{
    // CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - v) >= 0. 0xffffffff is "below" 1, so a
    // protocol that used it as an abort value would hang on a GPU; it hangs here too.
    Stream st;
    FlagBuf flag(64);
    ASSERT_TRUE(flag.p);
    uint32_t *f = flag.as<uint32_t>();
    ASSERT_EQ(Emu()->wait_u32(st.s, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(st.s, f + 1, 1), loomSuccess);
    StoreU32(f, 0xffffffffu);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(f + 1), 0u);
    StoreU32(f, 0x80000001u); // 2^31 past 1 wraps as well
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(f + 1), 0u);
    StoreU32(f, 0x7fffffffu); // 2^31 - 2 past 1: reached
    EXPECT_TRUE(WaitFor([&] { return LoadU32(f + 1) == 1; }));
    // Counters that wrap keep working: 0x00000002 is past 0xfffffffe.
    ASSERT_EQ(Emu()->wait_u32(st.s, f + 2, 0xfffffffeu), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(st.s, f + 3, 1), loomSuccess);
    StoreU32(f + 2, 2);
    EXPECT_TRUE(WaitFor([&] { return LoadU32(f + 3) == 1; }));
}

TEST(DevrtEmu, WriteMakesEarlierWorkVisible)
{
    Stream st;
    const size_t n = 8 << 20;
    DevBuf data(n);
    FlagBuf flag(64);
    ASSERT_TRUE(data.p && flag.p);
    std::vector<uint8_t> src(n, 0xc3);
    uint32_t *f = flag.as<uint32_t>();
    for (uint32_t round = 1; round <= 3; round++) {
        src[n - 1] = (uint8_t)round;
        ASSERT_EQ(Emu()->memcpy_async(data.p, src.data(), n, st.s), loomSuccess);
        ASSERT_EQ(Emu()->write_u32(st.s, f, round), loomSuccess);
        ASSERT_TRUE(WaitFor([&] { return LoadU32(f) == round; }));
        EXPECT_EQ(data.as<uint8_t>()[n - 1], round);
        EXPECT_EQ(data.as<uint8_t>()[0], 0xc3);
        ASSERT_TRUE(Drain(st.s));
    }
}

TEST(DevrtEmu, EventsMarkAPointOfTheStream)
{
    Stream st;
    FlagBuf flag(64);
    ASSERT_TRUE(flag.p);
    uint32_t *f = flag.as<uint32_t>();
    loom_dev_event_t e = nullptr, never = nullptr;
    ASSERT_EQ(Emu()->event_create(&e), loomSuccess);
    ASSERT_EQ(Emu()->event_create(&never), loomSuccess);
    EXPECT_EQ(Emu()->event_query(never), loomSuccess) << "an event never recorded counts as passed";
    ASSERT_EQ(Emu()->event_record(e, st.s), loomSuccess);
    ASSERT_TRUE(WaitFor([&] { return Emu()->event_query(e) == loomSuccess; }));
    ASSERT_EQ(Emu()->wait_u32(st.s, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->event_record(e, st.s), loomSuccess); // a new record replaces the old one
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(Emu()->event_query(e), loomInProgress);
    StoreU32(f, 1);
    EXPECT_TRUE(WaitFor([&] { return Emu()->event_query(e) == loomSuccess; }));
    // Destroyed while a record is queued: the record still runs, nothing breaks.
    ASSERT_EQ(Emu()->wait_u32(st.s, f, 2), loomSuccess);
    ASSERT_EQ(Emu()->event_record(e, st.s), loomSuccess);
    EXPECT_EQ(Emu()->event_destroy(e), loomSuccess);
    StoreU32(f, 2);
    EXPECT_TRUE(Drain(st.s));
    EXPECT_EQ(Emu()->event_destroy(never), loomSuccess);
    EXPECT_EQ(Emu()->event_query(nullptr), loomInvalidArgument);
    EXPECT_EQ(Emu()->event_record(nullptr, st.s), loomInvalidArgument);
}

TEST(DevrtEmu, DefaultStreamIsOneStreamOfTheProcess)
{
    DevBuf a(512);
    ASSERT_TRUE(a.p);
    std::vector<uint8_t> src(512, 0x42), out(512, 0);
    std::thread t(
        [&] { EXPECT_EQ(Emu()->memcpy_async(a.p, src.data(), 512, nullptr), loomSuccess); });
    t.join();
    // Queued from another thread on the NULL stream: the same stream, so this copy follows it.
    ASSERT_EQ(Emu()->memcpy_async(out.data(), a.p, 512, nullptr), loomSuccess);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(out[511], 0x42);
    int capturing = -1;
    EXPECT_EQ(Emu()->stream_capturing(nullptr, &capturing), loomSuccess);
    EXPECT_EQ(capturing, 0);
    EXPECT_EQ(Emu()->stream_destroy(nullptr), loomInvalidArgument);
}

TEST(DevrtEmu, BlockingStreamsFollowTheDefaultStream)
{
    Stream st;
    FlagBuf flag(64);
    ASSERT_TRUE(flag.p);
    uint32_t *f = flag.as<uint32_t>();
    // The default stream waits; a later operation of a blocking stream waits behind it.
    ASSERT_EQ(Emu()->wait_u32(nullptr, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(st.s, f + 1, 1), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(f + 1), 0u);
    EXPECT_EQ(Emu()->stream_query(st.s), loomInProgress);
    StoreU32(f, 1);
    ASSERT_TRUE(Drain(st.s));
    EXPECT_EQ(LoadU32(f + 1), 1u);
    // And the other way: the default stream waits for a blocking stream's earlier work.
    ASSERT_EQ(Emu()->wait_u32(st.s, f + 2, 1), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(nullptr, f + 3, 1), loomSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(f + 3), 0u);
    StoreU32(f + 2, 1);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(LoadU32(f + 3), 1u);
    // Two blocking streams do not order each other.
    Stream other;
    ASSERT_EQ(Emu()->wait_u32(st.s, f + 4, 1), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(other.s, f + 5, 1), loomSuccess);
    EXPECT_TRUE(WaitFor([&] { return LoadU32(f + 5) == 1; }));
    // The default stream waits for every blocking stream with earlier work, not the first only.
    ASSERT_EQ(Emu()->wait_u32(other.s, f + 6, 1), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(nullptr, f + 7, 1), loomSuccess);
    StoreU32(f + 4, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(LoadU32(f + 7), 0u);
    StoreU32(f + 6, 1);
    ASSERT_TRUE(Drain(nullptr));
    EXPECT_EQ(LoadU32(f + 7), 1u);
}

TEST(DevrtEmu, DestroyReturnsAtOnceAndTheQueueStillRuns)
{
    // Earlier tests' destroyed streams end their workers soon; only the default stream stays.
    ASSERT_TRUE(WaitFor([] { return loom_devrt_emu_live_streams() <= 1; }));
    const int before = loom_devrt_emu_live_streams();
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(Emu()->stream_create(&s), loomSuccess);
    FlagBuf flag(64);
    DevBuf data(4096);
    ASSERT_TRUE(flag.p && data.p);
    uint32_t *f = flag.as<uint32_t>();
    std::vector<uint8_t> src(4096, 0x77);
    ASSERT_EQ(Emu()->wait_u32(s, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(data.p, src.data(), 4096, s), loomSuccess);
    ASSERT_EQ(Emu()->write_u32(s, f + 1, 9), loomSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(Emu()->stream_destroy(s), loomSuccess);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    EXPECT_EQ(loom_devrt_emu_live_streams(), before + 1)
        << "the worker runs until its queue is done";
    StoreU32(f, 1);
    ASSERT_TRUE(WaitFor([&] { return LoadU32(f + 1) == 9; }));
    EXPECT_EQ(data.as<uint8_t>()[4095], 0x77);
    EXPECT_TRUE(WaitFor([&] { return loom_devrt_emu_live_streams() == before; }));
}

TEST(DevrtEmu, CaptureMarkForTests)
{
    Stream st;
    int c = -1;
    ASSERT_EQ(Emu()->stream_capturing(st.s, &c), loomSuccess);
    EXPECT_EQ(c, 0);
    ASSERT_EQ(loom_devrt_emu_set_capturing(st.s, 1), loomSuccess);
    ASSERT_EQ(Emu()->stream_capturing(st.s, &c), loomSuccess);
    EXPECT_EQ(c, 1);
    ASSERT_EQ(Emu()->stream_capturing(nullptr, &c), loomSuccess);
    EXPECT_EQ(c, 0) << "the mark is per stream";
    ASSERT_EQ(loom_devrt_emu_set_capturing(st.s, 0), loomSuccess);
    ASSERT_EQ(Emu()->stream_capturing(st.s, &c), loomSuccess);
    EXPECT_EQ(c, 0);
    EXPECT_EQ(Emu()->stream_capturing(st.s, nullptr), loomInvalidArgument);
}

TEST(DevrtEmu, StreamMisuseIsRefused)
{
    uint64_t junk[16] = {};
    auto bogus = reinterpret_cast<loom_dev_stream_t>(junk);
    EXPECT_EQ(Emu()->stream_query(bogus), loomInvalidArgument);
    EXPECT_NE(std::string(loom_last_error()).find("not a stream"), std::string::npos)
        << loom_last_error();
    EXPECT_EQ(Emu()->stream_create(nullptr), loomInvalidArgument);
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(Emu()->stream_create(&s), loomSuccess);
    FlagBuf flag(64);
    ASSERT_TRUE(flag.p);
    uint32_t *f = flag.as<uint32_t>();
    ASSERT_EQ(Emu()->wait_u32(s, f, 1), loomSuccess); // keeps the stream alive after destroy
    ASSERT_EQ(Emu()->stream_destroy(s), loomSuccess);
    EXPECT_EQ(Emu()->stream_destroy(s), loomInvalidArgument);
    EXPECT_EQ(Emu()->write_u32(s, f + 1, 1), loomInvalidArgument) << "queued on a destroyed stream";
    StoreU32(f, 1);
    // Flags and kernels need memory a device reaches; copies take any memory.
    uint32_t host_word = 0;
    EXPECT_EQ(Emu()->wait_u32(nullptr, &host_word, 1), loomInvalidArgument);
    EXPECT_NE(std::string(loom_last_error()).find("ordinary host memory"), std::string::npos);
    EXPECT_EQ(Emu()->write_u32(nullptr, nullptr, 1), loomInvalidArgument);
    EXPECT_EQ(Emu()->write_u32(nullptr, (uint32_t *)(flag.as<uint8_t>() + 2), 1),
              loomInvalidArgument);
    EXPECT_EQ(Emu()->memcpy_async(nullptr, f, 4, nullptr), loomInvalidArgument);
    EXPECT_EQ(Emu()->memcpy_async(nullptr, nullptr, 0, nullptr), loomSuccess);
}

// ---- kernels: the bits of dev_kernels_host.c, queued -------------------------------------------

std::vector<float> Ramp(size_t n, float mul, float add)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((i * 2654435761u) % 1000) * mul + add;
    return v;
}

TEST(DevrtEmu, ReduceGivesTheHostKernelsBits)
{
    Stream st;
    const size_t n = 10007;
    const int nsrc = 3;
    DevBuf dst(n * 4), in[3] = {DevBuf(n * 4), DevBuf(n * 4), DevBuf(n * 4)};
    std::vector<std::vector<float>> host;
    const void *srcs[3], *hsrcs[3];
    for (int k = 0; k < nsrc; k++) {
        ASSERT_TRUE(in[k].p);
        host.push_back(Ramp(n, 0.37f + (float)k, -3.0f * (float)k));
        memcpy(in[k].p, host[k].data(), n * 4);
        srcs[k] = in[k].p;
        hsrcs[k] = host[k].data();
    }
    for (loomRedOp_t op : {loomSum, loomAvg, loomMax, loomMin, loomProd}) {
        std::vector<float> want(n), got(n);
        ASSERT_EQ(loom_dk_host_reduce(loomFloat32, op, want.data(), hsrcs, nsrc, n, nsrc), 0);
        ASSERT_EQ(Emu()->reduce(st.s, loomFloat32, op, dst.p, srcs, nsrc, n, nsrc), loomSuccess);
        ASSERT_EQ(Emu()->memcpy_async(got.data(), dst.p, n * 4, st.s), loomSuccess);
        ASSERT_TRUE(Drain(st.s));
        EXPECT_EQ(memcmp(want.data(), got.data(), n * 4), 0) << "op " << op;
    }
    // In place (dst is source 0), with the sources array gone once queued.
    {
        std::vector<const void *> tmp(srcs, srcs + nsrc);
        tmp[0] = dst.p;
        std::vector<float> want(n), got(n);
        memcpy(want.data(), dst.p, n * 4);
        const void *w[3] = {want.data(), hsrcs[1], hsrcs[2]};
        ASSERT_EQ(loom_dk_host_reduce(loomFloat32, loomSum, want.data(), w, nsrc, n, nsrc), 0);
        ASSERT_EQ(Emu()->reduce(st.s, loomFloat32, loomSum, dst.p, tmp.data(), nsrc, n, nsrc),
                  loomSuccess);
        tmp.assign(nsrc, nullptr);
        ASSERT_TRUE(Drain(st.s));
        EXPECT_EQ(memcmp(want.data(), dst.p, n * 4), 0);
    }
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat8e4m3, loomSum, dst.p, srcs, 1, n, 1),
              loomInvalidArgument);
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat32, loomNumOps, dst.p, srcs, 1, n, 1),
              loomInvalidArgument);
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat32, loomSum, dst.p, srcs, 0, n, 1), loomInvalidArgument);
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat32, loomSum, dst.p, srcs, LOOM_DK_MAX_SRCS + 1, n, 1),
              loomInvalidArgument);
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat32, loomSum, host[0].data(), srcs, 1, n, 1),
              loomInvalidArgument)
        << "a kernel cannot write ordinary host memory";
    EXPECT_EQ(Emu()->reduce(st.s, loomFloat32, loomSum, dst.p, srcs, 1, 0, 1), loomSuccess);
    EXPECT_EQ(Emu()->stream_query(st.s), loomSuccess);
}

TEST(DevrtEmu, CodecAndCastGiveTheHostKernelsBits)
{
    Stream st;
    const size_t n = 5000;
    const size_t qbytes = loom_q4_bytes(n);
    DevBuf x(n * 4), err(n * 4), err2(n * 4), q(qbytes), y(n * 2), acc(n * 4);
    ASSERT_TRUE(x.p && err.p && err2.p && q.p && y.p && acc.p);
    std::vector<float> hx = Ramp(n, 0.013f, -6.0f), herr = Ramp(n, 1e-4f, -0.05f);
    memcpy(x.p, hx.data(), n * 4);
    memcpy(err.p, herr.data(), n * 4);
    std::vector<uint8_t> wq(qbytes, 0), gq(qbytes, 0);
    std::vector<float> werr2(n), gerr2(n);
    memset(q.p, 0, qbytes);
    ASSERT_EQ(
        loom_dk_host_q4_encode(hx.data(), loomFloat32, herr.data(), werr2.data(), n, wq.data()), 0);
    ASSERT_EQ(Emu()->q4_encode(st.s, x.p, loomFloat32, err.as<float>(), err2.as<float>(), n,
                               q.as<uint8_t>()),
              loomSuccess);
    ASSERT_TRUE(Drain(st.s));
    EXPECT_EQ(memcmp(wq.data(), q.p, qbytes), 0);
    EXPECT_EQ(memcmp(werr2.data(), err2.p, n * 4), 0);

    std::vector<uint16_t> wy(n);
    ASSERT_EQ(loom_dk_host_q4_decode(wq.data(), n, wy.data(), loomBfloat16), 0);
    ASSERT_EQ(Emu()->q4_decode(st.s, q.as<uint8_t>(), n, y.p, loomBfloat16), loomSuccess);
    std::vector<float> wacc(hx), gacc(n);
    memcpy(acc.p, hx.data(), n * 4);
    ASSERT_EQ(loom_dk_host_q4_decode_acc(wq.data(), n, wacc.data()), 0);
    ASSERT_EQ(Emu()->q4_decode_acc(st.s, q.as<uint8_t>(), n, acc.as<float>()), loomSuccess);
    ASSERT_TRUE(Drain(st.s));
    EXPECT_EQ(memcmp(wy.data(), y.p, n * 2), 0);
    EXPECT_EQ(memcmp(wacc.data(), acc.p, n * 4), 0);

    std::vector<uint16_t> wc(n);
    ASSERT_EQ(loom_dk_host_cast(wc.data(), loomFloat16, hx.data(), loomFloat32, n), 0);
    ASSERT_EQ(Emu()->cast(st.s, y.p, loomFloat16, x.p, loomFloat32, n), loomSuccess);
    ASSERT_TRUE(Drain(st.s));
    EXPECT_EQ(memcmp(wc.data(), y.p, n * 2), 0);

    EXPECT_EQ(Emu()->q4_encode(st.s, x.p, loomInt32, nullptr, nullptr, n, q.as<uint8_t>()),
              loomInvalidArgument);
    EXPECT_EQ(Emu()->q4_decode(st.s, q.as<uint8_t>(), n, y.p, loomFloat64), loomInvalidArgument);
    EXPECT_EQ(Emu()->cast(st.s, y.p, loomInt32, x.p, loomFloat32, n), loomInvalidArgument);
    EXPECT_EQ(Emu()->cast(st.s, x.p, loomFloat16, x.p, loomFloat32, n), loomInvalidArgument)
        << "in place between types of different sizes";
    EXPECT_EQ(Emu()->stream_query(st.s), loomSuccess);
}

} // namespace

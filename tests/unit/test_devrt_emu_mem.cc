// SPDX-License-Identifier: Apache-2.0
//
// test_devrt_emu_mem.cc - the emulated device runtime's memory (devrt.h, devrt_emu.h):
// ptr_device and ptr_base for allocations, interior pointers, freed ranges and host memory;
// copies between every kind of memory; bad pointers refused with a message, never a crash;
// frees that wait for queued work; IPC handles opened by a forked child (which writes, and
// releases a wait of the parent's stream) and refused in the exporting process.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "devrt_emu_util.h"

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

bool LastErrorHas(const char *text)
{
    return std::string(loom_last_error()).find(text) != std::string::npos;
}

TEST(DevrtEmuMem, PtrDeviceKnowsEveryRange)
{
    const size_t n = 10000; // not a page multiple: the range ends at n, not at the page
    DevBuf d(n);
    ASSERT_NE(d.p, nullptr);
    char *c = d.as<char>();
    EXPECT_EQ(Emu()->ptr_device(c), 0);
    EXPECT_EQ(Emu()->ptr_device(c + 1), 0);
    EXPECT_EQ(Emu()->ptr_device(c + n - 1), 0);
    EXPECT_EQ(Emu()->ptr_device(c + n), -1);
    EXPECT_EQ(Emu()->ptr_device(nullptr), -1);
    int on_stack = 0;
    std::vector<int> on_heap(16);
    EXPECT_EQ(Emu()->ptr_device(&on_stack), -1);
    EXPECT_EQ(Emu()->ptr_device(on_heap.data()), -1);
    void *base = nullptr;
    size_t size = 0;
    ASSERT_EQ(Emu()->ptr_base(c + 1234, &base, &size), loomSuccess);
    EXPECT_EQ(base, d.p);
    EXPECT_EQ(size, n);
    EXPECT_EQ(Emu()->ptr_base(&on_stack, &base, &size), loomInvalidArgument);

    void *h = nullptr, *m_dev = nullptr;
    ASSERT_EQ(Emu()->host_alloc(&h, 4096), loomSuccess);
    EXPECT_EQ(Emu()->ptr_device(h), -1) << "host_alloc memory is host memory";
    void *seg = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(seg, MAP_FAILED);
    ASSERT_EQ(Emu()->host_map(seg, 8192, &m_dev), loomSuccess);
    EXPECT_EQ(m_dev, seg);
    EXPECT_EQ(Emu()->ptr_device(seg), -1) << "mapped host memory is host memory";
    EXPECT_EQ(Emu()->host_map(static_cast<char *>(seg) + 4096, 4096, &m_dev), loomInvalidArgument)
        << "a range mapped twice";
    EXPECT_EQ(Emu()->host_unmap(seg), loomSuccess);
    EXPECT_EQ(Emu()->host_free(h), loomSuccess);
    munmap(seg, 8192);

    void *freed = nullptr;
    ASSERT_EQ(Emu()->mem_alloc(&freed, 4096), loomSuccess);
    ASSERT_EQ(Emu()->mem_free(freed), loomSuccess);
    EXPECT_EQ(Emu()->ptr_device(freed), -1);
    void *zero = &on_stack;
    EXPECT_EQ(Emu()->mem_alloc(&zero, 0), loomSuccess);
    EXPECT_EQ(zero, nullptr);
}

TEST(DevrtEmuMem, CopiesBetweenEveryKind)
{
    const size_t n = 3 * 4096 + 17;
    DevBuf d1(n), d2(n);
    void *pinned = nullptr, *mapped_dev = nullptr;
    ASSERT_EQ(Emu()->host_alloc(&pinned, n), loomSuccess);
    std::vector<uint8_t> plain(n), out(n);
    void *seg = mmap(nullptr, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(seg, MAP_FAILED);
    ASSERT_EQ(Emu()->host_map(seg, 4 * 4096, &mapped_dev), loomSuccess);
    for (size_t i = 0; i < n; i++)
        plain[i] = (uint8_t)(i * 7 + 1);
    // plain -> d1 -> pinned -> d2 -> mapped -> d1 (offset) -> plain out: every kind both ways.
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(Emu()->stream_create(&s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(d1.p, plain.data(), n, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(pinned, d1.p, n, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(d2.p, pinned, n, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(mapped_dev, d2.p, n, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(d1.as<uint8_t>() + 5, mapped_dev, n - 5, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(d2.p, d1.p, n, s), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(out.data(), d2.p, n, s), loomSuccess);
    ASSERT_TRUE(Drain(s));
    EXPECT_EQ(memcmp(out.data(), plain.data(), 5), 0);
    EXPECT_EQ(memcmp(out.data() + 5, plain.data(), n - 5), 0);
    EXPECT_EQ(Emu()->stream_destroy(s), loomSuccess);
    EXPECT_EQ(Emu()->host_unmap(seg), loomSuccess);
    EXPECT_EQ(Emu()->host_free(pinned), loomSuccess);
    munmap(seg, 4 * 4096);
}

TEST(DevrtEmuMem, BadPointersAreRefusedWithAMessage)
{
    loom_devrt_emu_counts_t before, after;
    loom_devrt_emu_counts(&before);
    DevBuf d(8192);
    ASSERT_NE(d.p, nullptr);
    int on_stack = 0;
    EXPECT_EQ(Emu()->mem_free(&on_stack), loomInvalidArgument);
    EXPECT_TRUE(LastErrorHas("mem_free")) << loom_last_error();
    EXPECT_EQ(Emu()->mem_free(d.as<char>() + 64), loomInvalidArgument);
    EXPECT_TRUE(LastErrorHas("inside the allocation")) << loom_last_error();
    EXPECT_EQ(Emu()->mem_free(nullptr), loomSuccess);
    EXPECT_EQ(Emu()->host_free(d.p), loomInvalidArgument);
    EXPECT_EQ(Emu()->host_unmap(&on_stack), loomInvalidArgument);
    EXPECT_EQ(Emu()->ipc_close(d.p), loomInvalidArgument);
    EXPECT_TRUE(LastErrorHas("ipc_close")) << loom_last_error();
    EXPECT_EQ(Emu()->ipc_close(nullptr), loomInvalidArgument);
    loom_dev_ipc_t h;
    EXPECT_EQ(Emu()->ipc_export(d.as<char>() + 8, &h), loomInvalidArgument);
    EXPECT_TRUE(LastErrorHas("export its base")) << loom_last_error();
    EXPECT_EQ(Emu()->ipc_export(&on_stack, &h), loomInvalidArgument);
    memset(&h, 0x5c, sizeof(h));
    void *p = nullptr;
    EXPECT_EQ(Emu()->ipc_open(&h, &p), loomInvalidArgument);
    EXPECT_TRUE(LastErrorHas("not an IPC handle")) << loom_last_error();
    EXPECT_EQ(Emu()->host_map(nullptr, 4096, &p), loomInvalidArgument);
    EXPECT_EQ(Emu()->mem_alloc(nullptr, 16), loomInvalidArgument);
    EXPECT_EQ(Emu()->ptr_base(d.p, nullptr, nullptr), loomInvalidArgument);
    void *twice = nullptr;
    ASSERT_EQ(Emu()->mem_alloc(&twice, 100), loomSuccess);
    EXPECT_EQ(Emu()->mem_free(twice), loomSuccess);
    EXPECT_EQ(Emu()->mem_free(twice), loomInvalidArgument) << "a second free";
    loom_devrt_emu_counts(&after);
    EXPECT_EQ(after.dev, before.dev + 1);
    EXPECT_EQ(after.host, before.host);
    EXPECT_EQ(after.mapped, before.mapped);
}

TEST(DevrtEmuMem, FreeWaitsForWorkQueuedBefore)
{
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(Emu()->stream_create(&s), loomSuccess);
    FlagBuf flag(64);
    void *victim = nullptr;
    ASSERT_EQ(Emu()->mem_alloc(&victim, 1 << 20), loomSuccess);
    std::vector<uint8_t> src(1 << 20, 0x3c);
    uint32_t *f = flag.as<uint32_t>();
    ASSERT_EQ(Emu()->wait_u32(s, f, 1), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(victim, src.data(), src.size(), s), loomSuccess);
    std::atomic<bool> freed{false};
    std::thread t([&] {
        EXPECT_EQ(Emu()->mem_free(victim), loomSuccess);
        freed = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_FALSE(freed.load()) << "mem_free returned while a copy into the memory was queued";
    StoreU32(f, 1);
    t.join();
    EXPECT_TRUE(Drain(s));
    EXPECT_EQ(Emu()->stream_destroy(s), loomSuccess);
}

// ---- IPC ---------------------------------------------------------------------------------

TEST(DevrtEmuMem, IpcHandleOfThisProcessIsRefused)
{
    DevBuf d(4096);
    loom_dev_ipc_t h;
    ASSERT_EQ(Emu()->ipc_export(d.p, &h), loomSuccess);
    void *p = nullptr;
    EXPECT_EQ(Emu()->ipc_open(&h, &p), loomInvalidUsage);
    EXPECT_TRUE(LastErrorHas("exported by this process")) << loom_last_error();
    EXPECT_EQ(p, nullptr);
}

TEST(DevrtEmuMem, IpcAcrossForkWritesAndReleasesTheParentsStream)
{
    const size_t n = 3 * 4096 + 100;
    FlagBuf d(n);
    ASSERT_NE(d.p, nullptr);
    for (size_t i = 0; i < n; i++)
        d.as<uint8_t>()[i] = (uint8_t)i;
    // The first word is a flag the parent's stream waits on; the child releases it.
    uint32_t *flag = d.as<uint32_t>();
    StoreU32(flag, 0);
    loom_dev_stream_t s = nullptr;
    ASSERT_EQ(Emu()->stream_create(&s), loomSuccess);
    std::vector<uint8_t> seen(64, 0);
    ASSERT_EQ(Emu()->wait_u32(s, flag, 42), loomSuccess);
    ASSERT_EQ(Emu()->memcpy_async(seen.data(), d.as<uint8_t>() + 4096, 64, s), loomSuccess);
    loom_dev_ipc_t h;
    ASSERT_EQ(Emu()->ipc_export(d.p, &h), loomSuccess);

    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        void *p = nullptr, *again = nullptr;
        CHILD_CHECK(Emu()->ipc_open(&h, &p) == loomSuccess);
        CHILD_CHECK(p != nullptr);
        CHILD_CHECK(Emu()->ptr_device(p) == 0);
        void *base = nullptr;
        size_t size = 0;
        CHILD_CHECK(Emu()->ptr_base(static_cast<char *>(p) + 10, &base, &size) == loomSuccess);
        CHILD_CHECK(base == p && size == n);
        CHILD_CHECK(static_cast<uint8_t *>(p)[4096 + 3] == (uint8_t)(4096 + 3));
        CHILD_CHECK(Emu()->ipc_open(&h, &again) == loomSuccess);
        CHILD_CHECK(again == p); // one mapping per allocation, counted
        CHILD_CHECK(Emu()->ipc_export(p, &h) == loomInvalidArgument);
        // The parent's streams have no worker here; the child's own default stream works
        // (not under ThreadSanitizer, which cannot start threads after a multi-threaded fork).
        CHILD_CHECK(Emu()->stream_query(s) == loomInvalidUsage);
        std::vector<uint8_t> pat(64, 0xee);
#ifndef __SANITIZE_THREAD__
        CHILD_CHECK(Emu()->memcpy_async(static_cast<uint8_t *>(p) + 4096, pat.data(), 64,
                                        nullptr) == loomSuccess);
        CHILD_CHECK(Drain(nullptr));
#else
        memcpy(static_cast<uint8_t *>(p) + 4096, pat.data(), 64);
#endif
        StoreU32(static_cast<uint32_t *>(p), 42);
        CHILD_CHECK(Emu()->ipc_close(p) == loomSuccess);
        CHILD_CHECK(Emu()->ptr_device(p) == 0); // one reference left
        CHILD_CHECK(Emu()->ipc_close(p) == loomSuccess);
        CHILD_CHECK(Emu()->ptr_device(p) == -1);
        CHILD_CHECK(Emu()->ipc_close(p) == loomInvalidArgument);
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child ended by a signal";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "a check of the child failed (see its stderr)";
    ASSERT_TRUE(Drain(s)) << "the child's store did not release the parent's wait";
    EXPECT_EQ(seen[0], 0xee);
    EXPECT_EQ(seen[63], 0xee);
    EXPECT_EQ(d.as<uint8_t>()[4096 + 64], (uint8_t)(4096 + 64));
    EXPECT_EQ(Emu()->stream_destroy(s), loomSuccess);
}

TEST(DevrtEmuMem, IpcHandleOfAFreedAllocationIsRefused)
{
    void *p = nullptr;
    ASSERT_EQ(Emu()->mem_alloc(&p, 4096), loomSuccess);
    loom_dev_ipc_t h;
    ASSERT_EQ(Emu()->ipc_export(p, &h), loomSuccess);
    ASSERT_EQ(Emu()->mem_free(p), loomSuccess);
    DevBuf reuse(4096); // may take the same descriptor number: the file's identity tells them apart
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        void *q = nullptr;
        CHILD_CHECK(Emu()->ipc_open(&h, &q) == loomInvalidArgument);
        CHILD_CHECK(q == nullptr);
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

} // namespace

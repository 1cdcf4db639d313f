// SPDX-License-Identifier: Apache-2.0
//
// devrt_emu_util.h - what the emulated device runtime's tests share: the table, a poll with a
// deadline, wrappers that free the runtime's memory at the end of a scope (releasing the flag
// words in it first), and the checks of a forked child.
#ifndef LOOM_TESTS_UNIT_DEVRT_EMU_UTIL_H
#define LOOM_TESTS_UNIT_DEVRT_EMU_UTIL_H

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>

#include "devrt.h"
#include "devrt_emu.h"

extern "C" {
#include "debug.h"
}

// Checks in a forked child (gtest's cannot cross fork): a failure prints the line and the
// last error, and exits with a status that is not 0.
#define CHILD_CHECK(_cond)                                                                         \
    do {                                                                                           \
        if (!(_cond)) {                                                                            \
            fprintf(stderr, "child: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #_cond,           \
                    loom_last_error());                                                            \
            _exit(__LINE__ % 250 + 1);                                                             \
        }                                                                                          \
    } while (0)

namespace loomtest {

inline const loom_devrt_t *Emu()
{
    return loom_devrt_emulated();
}

// Polls cond every 100 us until it holds or seconds pass; returns whether it held.
inline bool WaitFor(const std::function<bool()> &cond, double seconds = 5.0)
{
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
    while (!cond()) {
        if (std::chrono::steady_clock::now() > end)
            return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

// Until every operation queued on s so far ran (stream_query says Success).
inline bool Drain(loom_dev_stream_t s, double seconds = 5.0)
{
    return WaitFor([s] { return Emu()->stream_query(s) == loomSuccess; }, seconds);
}

inline uint32_t LoadU32(const uint32_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

inline void StoreU32(uint32_t *p, uint32_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// Device memory of the emulation, freed at the end of the scope.
struct DevBuf {
    void *p = nullptr;
    size_t bytes = 0;
    explicit DevBuf(size_t n) : bytes(n)
    {
        if (Emu()->mem_alloc(&p, n) != loomSuccess)
            p = nullptr;
    }
    ~DevBuf()
    {
        if (p != nullptr)
            Emu()->mem_free(p);
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    template <typename T> T *as() const
    {
        return static_cast<T *>(p);
    }
};

// Device memory holding flag words: at the end of the scope every word is set to the abort
// value (LOOM_DEV_FLAG_ABORT) before the memory is freed, so a wait left queued by a failed
// check ends instead of holding the free (which waits for queued work) forever.
struct FlagBuf : DevBuf {
    explicit FlagBuf(size_t n) : DevBuf(n) {}
    ~FlagBuf()
    {
        for (size_t i = 0; p != nullptr && i < bytes / sizeof(uint32_t); i++)
            StoreU32(as<uint32_t>() + i, 0x7fffffffu);
    }
};

} // namespace loomtest

#endif

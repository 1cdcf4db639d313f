/* SPDX-License-Identifier: Apache-2.0
 *
 * test_shm_copy.cc - unit tests of loom_shm_copy (shm_common.c), the copy
 * out of the shm arena that large calls write with non-temporal stores: for
 * every alignment of source and destination and sizes around the 16-byte
 * head and 64-byte body of the streaming loop, both modes copy exactly the
 * bytes asked for and touch nothing around them, in either direction of the
 * plain copy (backwards where the destination trails the source closely
 * modulo a page). Single process; meson's
 * 'unit' suite.
 */
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

extern "C" {
void loom_shm_copy(void *dst, const void *src, size_t bytes, int stream);
int loom_shm_copy_backward_near(void);
void loom_shm_copy_probe_result(double *forward_ns, double *backward_ns);
void loom_shm_copy_force_backward(int mode);
}

namespace {

constexpr size_t kGuard = 80;

void CheckCopy(int stream, size_t src_off, size_t dst_off, size_t bytes)
{
    std::vector<uint8_t> src(bytes + src_off + kGuard), dst(bytes + dst_off + 2 * kGuard);
    for (size_t i = 0; i < src.size(); i++)
        src[i] = static_cast<uint8_t>(i * 131u + 7u + bytes);
    for (size_t i = 0; i < dst.size(); i++)
        dst[i] = 0xA5;
    loom_shm_copy(dst.data() + kGuard + dst_off, src.data() + src_off, bytes, stream);
    for (size_t i = 0; i < dst.size(); i++) {
        const bool inside = i >= kGuard + dst_off && i < kGuard + dst_off + bytes;
        const uint8_t want = inside ? src[src_off + i - kGuard - dst_off] : 0xA5;
        ASSERT_EQ(dst[i], want) << "stream " << stream << ", source offset " << src_off
                                << ", destination offset " << dst_off << ", " << bytes
                                << " bytes: byte " << i;
    }
}

TEST(ShmCopy, EveryAlignmentAndTail)
{
    const size_t sizes[] = {0, 1, 15, 16, 63, 64, 255, 256, 257, 319, 1000, 4109, 70001};
    for (int stream : {0, 1})
        for (size_t src_off : {0, 1, 8, 13})
            for (size_t dst_off = 0; dst_off < 17; dst_off++)
                for (size_t bytes : sizes)
                    CheckCopy(stream, src_off, dst_off, bytes);
}

// Destinations 0-1023 bytes past the source modulo 4 KiB are copied backwards by
// loom_shm_copy itself where the copy-direction probe (or LOOM_SHM_COPY_BACKWARD) says so (the
// forward copy's loads can alias its recent stores there); both directions, around the 64-byte
// body and the 4 KiB threshold, copy exactly the bytes.
TEST(ShmCopy, EveryDistanceModuloAPage)
{
    const size_t sizes[] = {4095, 4096, 4097, 4160, 8191, 65536 + 37};
    const size_t deltas[] = {0, 1, 16, 63, 64, 1000, 1023, 1024, 2048, 4032, 4095};
    for (int backward : {1, 0}) {
        loom_shm_copy_force_backward(backward);
        ASSERT_EQ(loom_shm_copy_backward_near(), backward);
        for (size_t bytes : sizes)
            for (size_t delta : deltas) {
                const size_t gap = ((bytes + 4095) / 4096 + 1) * 4096 + delta; // no overlap
                std::vector<uint8_t> buf(gap + bytes + 2 * kGuard + 4096);
                const uintptr_t base = reinterpret_cast<uintptr_t>(buf.data());
                const size_t start = (4096 - base % 4096) % 4096; // src page aligned
                uint8_t *src = buf.data() + start;
                uint8_t *dst = src + gap;
                for (size_t i = 0; i < bytes; i++)
                    src[i] = static_cast<uint8_t>(i * 29u + delta);
                for (size_t i = 0; i < bytes + kGuard && gap + i < buf.size() - start; i++)
                    dst[i] = 0xA5;
                dst[-1] = 0x5A;
                loom_shm_copy(dst, src, bytes, 0);
                ASSERT_EQ(dst[-1], 0x5A) << bytes << " bytes, distance " << delta;
                for (size_t i = 0; i < bytes; i++)
                    ASSERT_EQ(dst[i], static_cast<uint8_t>(i * 29u + delta))
                        << bytes << " bytes, distance " << delta << ": byte " << i;
                ASSERT_EQ(dst[bytes], 0xA5) << bytes << " bytes, distance " << delta;
            }
    }
    loom_shm_copy_force_backward(-1);
}

// Left to the probe, near pairs run backwards exactly when it timed the backward copy faster.
TEST(ShmCopy, TheProbeChoosesTheFasterDirection)
{
    loom_shm_copy_force_backward(-1);
    if (getenv("LOOM_SHM_COPY_BACKWARD") != nullptr)
        GTEST_SKIP() << "LOOM_SHM_COPY_BACKWARD decides";
    double forward = 0, backward = 0;
    loom_shm_copy_probe_result(&forward, &backward);
#if defined(__x86_64__)
    ASSERT_GT(forward, 0);
    ASSERT_GT(backward, 0);
#endif
    EXPECT_EQ(loom_shm_copy_backward_near(), backward > 0 && backward < forward ? 1 : 0);
}

} // namespace

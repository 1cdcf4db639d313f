/* SPDX-License-Identifier: Apache-2.0
 *
 * test_shm_copy.cc - unit tests of loom_shm_copy (shm_common.c), the copy
 * out of the shm arena that large calls write with non-temporal stores: for
 * every alignment of source and destination and sizes around the 16-byte
 * head and 64-byte body of the streaming loop, both modes copy exactly the
 * bytes asked for and touch nothing around them. Single process; meson's
 * 'unit' suite.
 */
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" void loom_shm_copy(void *dst, const void *src, size_t bytes, int stream);

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

} // namespace

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_slow_copy.cc - unit tests of loom_arena_slow_score (shm_arena_sync.c),
 * which decides from the timed copies into or out of the shm arena when the
 * arena's writers should copy in past the cache: a score that rises with
 * copies slower than LOOM_ARENA_SLOW_COPY_GBPS and falls with faster ones,
 * weighted by size up to a cap. Single process; meson's 'unit' suite.
 */
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

extern "C" int loom_arena_slow_score(int *score, size_t bytes, uint64_t ns);

namespace {

constexpr size_t kKiB = 1024;
// Nanoseconds for bytes at gbps (1 GB/s = 1 byte per ns).
uint64_t At(size_t bytes, double gbps)
{
    return static_cast<uint64_t>(static_cast<double>(bytes) / gbps);
}

// How many copies of bytes at gbps, in a row from a score of 0, mark the arena.
int CopiesToMark(size_t bytes, double gbps, int limit = 1000)
{
    int score = 0;
    for (int i = 1; i <= limit; i++)
        if (loom_arena_slow_score(&score, bytes, At(bytes, gbps)))
            return i;
    return 0;
}

TEST(SlowCopy, FastCopiesNeverMark)
{
    EXPECT_EQ(CopiesToMark(256 * kKiB, 20.0), 0);
    EXPECT_EQ(CopiesToMark(256 * kKiB, 4.5), 0);
}

TEST(SlowCopy, ShortCopiesAreNotCounted)
{
    EXPECT_EQ(CopiesToMark(64 * kKiB - 1, 0.1), 0);
    EXPECT_EQ(CopiesToMark(4 * kKiB, 0.1), 0);
}

TEST(SlowCopy, WeightGrowsWithSizeUpToACap)
{
    EXPECT_EQ(CopiesToMark(64 * kKiB, 2.4), 32);
    EXPECT_EQ(CopiesToMark(128 * kKiB, 2.4), 16);
    EXPECT_EQ(CopiesToMark(256 * kKiB, 2.4), 8);
    EXPECT_EQ(CopiesToMark(16384 * kKiB, 2.4), 8); // one preempted copy alone never marks
}

TEST(SlowCopy, FirstCopiesOfAProcessDoNotMark)
{
    // Every process's first 4-6 copies in crawl before the lines settle.
    int score = 0;
    for (int i = 0; i < 6; i++)
        EXPECT_EQ(loom_arena_slow_score(&score, 256 * kKiB, At(256 * kKiB, 2.4)), 0);
    for (int i = 0; i < 1000; i++)
        EXPECT_EQ(loom_arena_slow_score(&score, 256 * kKiB, At(256 * kKiB, 20.0)), 0);
    EXPECT_EQ(score, 0);
}

TEST(SlowCopy, MostlySlowCopiesMarkWhenFastOnesAreMixedIn)
{
    // Two of three copies crawl (4-rank ReduceScatter): the score still climbs.
    int score = 0, marked_at = 0;
    for (int i = 1; i <= 300 && marked_at == 0; i++) {
        const double gbps = i % 3 == 0 ? 25.0 : 2.4;
        if (loom_arena_slow_score(&score, 128 * kKiB, At(128 * kKiB, gbps)))
            marked_at = i;
    }
    EXPECT_GT(marked_at, 16);
    EXPECT_LE(marked_at, 48);
    EXPECT_EQ(score, 0) << "a mark starts the score over";
}

TEST(SlowCopy, HalfSlowCopiesNeverMark)
{
    int score = 0;
    for (int i = 0; i < 1000; i++)
        EXPECT_EQ(loom_arena_slow_score(&score, 256 * kKiB, At(256 * kKiB, i % 2 ? 2.4 : 25.0)), 0);
}

} // namespace

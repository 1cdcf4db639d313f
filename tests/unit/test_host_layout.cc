// SPDX-License-Identifier: Apache-2.0
//
// test_host_layout.cc - the host layout the hierarchical algorithms and host-ordered rings
// run on (host_layout.c): hosts numbered by their first rank, local indices in rank order,
// ranks per host only when equal, the host order of a ring and each rank's rail.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "coll.h"

namespace {

TEST(HostLayout, BlocksOfEqualHosts)
{
    // Hashes need not be sorted or small: hosts are numbered by their first rank.
    const std::vector<uint64_t> hash = {77, 77, 5, 5, 900, 900};
    for (int rank = 0; rank < 6; rank++) {
        loom_hosts_t h{};
        ASSERT_EQ(loom_hosts_init(&h, hash.data(), 6, rank), loomSuccess);
        EXPECT_EQ(h.nhosts, 3);
        EXPECT_EQ(h.ppn, 2);
        EXPECT_EQ(h.host, rank / 2);
        EXPECT_EQ(h.lrank, rank % 2);
        EXPECT_EQ(h.contiguous, 1);
        EXPECT_EQ(h.pos, rank);
        for (int r = 0; r < 6; r++)
            EXPECT_EQ(h.rank_of[r], r);
        for (int g = 0; g < 3; g++)
            EXPECT_EQ(h.rail[g], 2 * g + rank % 2) << rank;
        loom_hosts_free(&h);
    }
}

TEST(HostLayout, RoundRobinRanksRingInHostOrder)
{
    // Rank r on host r mod 2: a ring in rank order would cross hosts at every hop.
    const std::vector<uint64_t> hash = {1, 2, 1, 2};
    loom_hosts_t h{};
    ASSERT_EQ(loom_hosts_init(&h, hash.data(), 4, 3), loomSuccess);
    EXPECT_EQ(h.nhosts, 2);
    EXPECT_EQ(h.ppn, 2);
    EXPECT_EQ(h.contiguous, 0);
    EXPECT_EQ(std::vector<int>(h.order, h.order + 4), (std::vector<int>{0, 2, 1, 3}));
    EXPECT_EQ(h.pos, 3);
    EXPECT_EQ(h.host, 1);
    EXPECT_EQ(h.lrank, 1);
    // Host 0 holds ranks 0 and 2, host 1 ranks 1 and 3; rank 3's rail is {2, 3}.
    EXPECT_EQ(std::vector<int>(h.rank_of, h.rank_of + 4), (std::vector<int>{0, 2, 1, 3}));
    EXPECT_EQ(h.rail[0], 2);
    EXPECT_EQ(h.rail[1], 3);
    loom_hosts_free(&h);
}

TEST(HostLayout, UnequalHostsHaveNoRanksPerHost)
{
    const std::vector<uint64_t> hash = {1, 1, 1, 2, 2};
    loom_hosts_t h{};
    ASSERT_EQ(loom_hosts_init(&h, hash.data(), 5, 4), loomSuccess);
    EXPECT_EQ(h.nhosts, 2);
    EXPECT_EQ(h.ppn, 0);
    EXPECT_EQ(h.rank_of, nullptr);
    EXPECT_EQ(h.rail, nullptr);
    EXPECT_EQ(h.host, 1);
    EXPECT_EQ(h.lrank, 1);
    EXPECT_EQ(h.contiguous, 1); // the order still exists: the ring needs no reordering
    loom_hosts_free(&h);
    // One host, and one rank.
    const std::vector<uint64_t> one = {9, 9, 9};
    ASSERT_EQ(loom_hosts_init(&h, one.data(), 3, 1), loomSuccess);
    EXPECT_EQ(h.nhosts, 1);
    EXPECT_EQ(h.ppn, 3);
    loom_hosts_free(&h);
    ASSERT_EQ(loom_hosts_init(&h, one.data(), 1, 0), loomSuccess);
    EXPECT_EQ(h.nhosts, 1);
    EXPECT_EQ(h.ppn, 1);
    EXPECT_EQ(h.pos, 0);
    loom_hosts_free(&h);
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_coll_split.cc - loomCommSplit as MPI_Comm_split: ranks of a color form a communicator
// ordered by key then parent rank (checked with loomCommCount/UserRank and an all-gather of the
// parent ranks), LOOM_SPLIT_NOCOLOR and other negative colors give NULL, one color for all,
// and splitting a split. Every new communicator runs an all-reduce, and the parent keeps
// working afterwards. It does not test split configs or errors. Run by meson's 'coll' suite.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"

namespace {

// Checks that sub is the communicator of `members` (parent ranks, in their new rank order):
// size, this rank's position, the gathered parent ranks, and a sum all-reduce.
void CheckMembers(loomComm_t sub, int parent_rank, const std::vector<int> &members)
{
    XT_CHECK(sub != nullptr);
    int count = -1, rank = -1;
    XT_CHECK_LOOM(loomCommCount(sub, &count));
    XT_CHECK_LOOM(loomCommUserRank(sub, &rank));
    XT_CHECK_EQ(count, static_cast<int>(members.size()));
    const auto it = std::find(members.begin(), members.end(), parent_rank);
    XT_CHECK(it != members.end());
    XT_CHECK_EQ(rank, static_cast<int>(it - members.begin()));

    std::vector<int32_t> gathered(members.size(), -1);
    const int32_t mine = parent_rank;
    XT_CHECK_LOOM(loomAllGather(&mine, gathered.data(), 1, loomInt32, sub, nullptr));
    for (size_t i = 0; i < members.size(); i++)
        XT_CHECK_EQ(gathered[i], members[i]);

    // Each member contributes bit (1 << parent rank): the sum names exactly the members.
    uint64_t bit = uint64_t{1} << parent_rank, sum = 0, want = 0;
    for (int m : members)
        want |= uint64_t{1} << m;
    XT_CHECK_LOOM(loomAllReduce(&bit, &sum, 1, loomUint64, loomSum, sub, nullptr));
    XT_CHECK_EQ(sum, want);
}

// The parent still works after splits: a sum of ranks over it.
void CheckParent(loomComm_t comm, int rank, int n)
{
    int32_t v = rank, sum = -1;
    XT_CHECK_LOOM(loomAllReduce(&v, &sum, 1, loomInt32, loomSum, comm, nullptr));
    XT_CHECK_EQ(sum, n * (n - 1) / 2);
}

TEST(Split, ParityColorsReversedKeys)
{
    XT_ASSERT_RUN(loomtest::RunRanks(4, [](int rank, int n, loomComm_t comm) {
        loomComm_t sub = nullptr;
        XT_CHECK_LOOM(loomCommSplit(comm, rank % 2, -rank, &sub, nullptr));
        // key = -rank: the highest parent rank comes first.
        CheckMembers(sub, rank, rank % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{3, 1});
        XT_CHECK_LOOM(loomCommDestroy(sub));
        CheckParent(comm, rank, n);
    }));
}

TEST(Split, NegativeColorGivesNull)
{
    XT_ASSERT_RUN(loomtest::RunRanks(4, [](int rank, int n, loomComm_t comm) {
        // Ranks 1 and 3 opt out, one with LOOM_SPLIT_NOCOLOR and one with another negative.
        const int color = rank == 1 ? LOOM_SPLIT_NOCOLOR : rank == 3 ? -7 : 5;
        int dummy = 0;
        loomComm_t sub = reinterpret_cast<loomComm_t>(&dummy); // must be overwritten
        XT_CHECK_LOOM(loomCommSplit(comm, color, 0, &sub, nullptr));
        if (color < 0) {
            XT_CHECK(sub == nullptr);
        } else {
            CheckMembers(sub, rank, {0, 2});
            XT_CHECK_LOOM(loomCommDestroy(sub));
        }
        CheckParent(comm, rank, n);
    }));
}

TEST(Split, OneColorForAll)
{
    XT_ASSERT_RUN(loomtest::RunRanks(4, [](int rank, int n, loomComm_t comm) {
        loomComm_t sub = nullptr;
        XT_CHECK_LOOM(loomCommSplit(comm, 0, 0, &sub, nullptr)); // equal keys: parent order
        CheckMembers(sub, rank, {0, 1, 2, 3});
        loomComm_t dup = nullptr;
        XT_CHECK_LOOM(loomCommSplit(comm, 9, 0, &dup, nullptr));
        XT_CHECK(dup != sub);
        CheckMembers(dup, rank, {0, 1, 2, 3});
        XT_CHECK_LOOM(loomCommDestroy(sub));
        XT_CHECK_LOOM(loomCommDestroy(dup));
        CheckParent(comm, rank, n);
    }));
}

TEST(Split, SplitOfSplit)
{
    XT_ASSERT_RUN(loomtest::RunRanks(4, [](int rank, int n, loomComm_t comm) {
        // Level 1: {0, 1, 2} and {3}. Level 2 splits the first by its own rank parity,
        // keys reversed: {2, 0} and {1}; the second stays {3}.
        loomComm_t a = nullptr, b = nullptr;
        XT_CHECK_LOOM(loomCommSplit(comm, rank < 3 ? 0 : 1, 0, &a, nullptr));
        CheckMembers(a, rank, rank < 3 ? std::vector<int>{0, 1, 2} : std::vector<int>{3});
        int arank = -1;
        XT_CHECK_LOOM(loomCommUserRank(a, &arank));
        XT_CHECK_LOOM(loomCommSplit(a, arank % 2, -arank, &b, nullptr));
        std::vector<int> want;
        if (rank == 3)
            want = {3};
        else
            want = rank % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{1};
        CheckMembers(b, rank, want);
        // The levels are independent communicators: use them interleaved, then free the
        // parent level before its child.
        CheckMembers(a, rank, rank < 3 ? std::vector<int>{0, 1, 2} : std::vector<int>{3});
        XT_CHECK_LOOM(loomCommDestroy(a));
        CheckMembers(b, rank, want);
        XT_CHECK_LOOM(loomCommDestroy(b));
        CheckParent(comm, rank, n);
    }));
}

} // namespace

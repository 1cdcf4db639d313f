// SPDX-License-Identifier: Apache-2.0
//
// test_shard_piece.cc - loomShardParamPiece: for every layout, on seeded random lists, the odd
// shapes and gpt-tiny at 1 to 9 ranks, the runs it reports are where the packed shard holds each
// parameter's elements (checked by value through loomShardPack and the plan's own pieces), all
// ranks together hold each parameter exactly once (Owner, Rows) or each rank all of it
// (Replicated), and bad input is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom_shard.h"
#include "shard_lists.h"

extern "C" {
#include "shard_plan.h"
}

using namespace shardtest;

namespace {

// The packed shard of `rank` built from the plan's own pieces of the full buffer.
std::vector<float> Shard(loomShardPlan_t p, int rank, const std::vector<float> &full)
{
    loomShardRankInfo_t ri;
    EXPECT_EQ(loomShardRankInfo(p, rank, &ri), loomSuccess);
    std::vector<float> s(ri.shard_elems, -1.0f);
    for (int b = 0; b < p->nbuckets; b++) {
        std::vector<shard_piece_t> v((size_t)shard_pieces(p, rank, b, nullptr));
        shard_pieces(p, rank, b, v.data());
        for (const shard_piece_t &q : v)
            for (size_t i = 0; i < q.len; i++)
                s[q.shard_off + i] = full[q.full_off + i];
    }
    return s;
}

void CheckList(const std::vector<loomShardParam_t> &list, int nranks, loomShardLayout_t layout,
               const std::string &what)
{
    loomShardConfig_t cfg = LOOM_SHARD_CONFIG_INITIALIZER;
    cfg.layout = layout;
    loomShardPlan_t p = nullptr;
    ASSERT_EQ(loomShardPlanCreate(&p, list.data(), (int)list.size(), nranks, &cfg), loomSuccess)
        << what;
    // Model order: parameter i's element k is i * 1e6 + k, exact in float for these sizes.
    std::vector<float> model, full(Numel(list));
    for (size_t i = 0; i < list.size(); i++)
        for (size_t k = 0; k < list[i].rows * list[i].cols; k++)
            model.push_back((float)(i * 4096 + k % 4096));
    ASSERT_EQ(loomShardPack(p, model.data(), full.data(), loomFloat32), loomSuccess);
    std::vector<size_t> held(list.size(), 0);
    for (int r = 0; r < nranks; r++) {
        std::vector<float> shard = Shard(p, r, full);
        for (int i = 0; i < (int)list.size(); i++) {
            size_t off = 7, first = 7, count = 7;
            ASSERT_EQ(loomShardParamPiece(p, r, i, &off, &first, &count), loomSuccess);
            const size_t n = list[i].rows * list[i].cols;
            ASSERT_LE(first + count, n) << what;
            held[i] += count;
            for (size_t k = 0; k < count; k++) {
                ASSERT_EQ(shard[off + k], (float)(i * 4096 + (first + k) % 4096))
                    << what << " rank " << r << " param " << i << " element " << first + k;
            }
            if (layout == loomShardReplicated) {
                EXPECT_EQ(count, n) << what;
            }
        }
    }
    for (size_t i = 0; i < list.size(); i++) {
        EXPECT_EQ(held[i],
                  list[i].rows * list[i].cols * (layout == loomShardReplicated ? nranks : 1))
            << what << " param " << i;
    }
    loomShardPlanDestroy(p);
}

TEST(ParamPiece, RunsAreWhereTheShardHoldsEachParameterOnce)
{
    const loomShardLayout_t layouts[] = {loomShardOwner, loomShardRows, loomShardReplicated};
    Rng rng(7);
    for (int t = 0; t < 60; t++) {
        int P = 1 + (int)rng.Below(9);
        std::vector<loomShardParam_t> list = RandomList(rng, 24, 40, P, true);
        for (loomShardLayout_t l : layouts)
            CheckList(list, P, l, "random list " + std::to_string(t) + " P " + std::to_string(P));
    }
    for (int P : {3, 8})
        for (loomShardLayout_t l : layouts)
            CheckList(OddShapes(), P, l, "odd shapes P " + std::to_string(P));
    for (loomShardLayout_t l : layouts)
        CheckList(GptTiny(), 4, l, "gpt-tiny P 4");
}

TEST(ParamPiece, BadInputIsRefused)
{
    std::vector<loomShardParam_t> list = OddShapes();
    loomShardConfig_t cfg = LOOM_SHARD_CONFIG_INITIALIZER;
    loomShardPlan_t p = nullptr;
    ASSERT_EQ(loomShardPlanCreate(&p, list.data(), (int)list.size(), 3, &cfg), loomSuccess);
    size_t off = 0;
    EXPECT_EQ(loomShardParamPiece(nullptr, 0, 0, &off, nullptr, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomShardParamPiece(p, 3, 0, &off, nullptr, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomShardParamPiece(p, -1, 0, &off, nullptr, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomShardParamPiece(p, 0, (int)list.size(), &off, nullptr, nullptr),
              loomInvalidArgument);
    EXPECT_EQ(loomShardParamPiece(p, 0, -1, nullptr, nullptr, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomShardParamPiece(p, 0, 0, nullptr, nullptr, nullptr), loomSuccess);
    loomShardPlanDestroy(p);
}

} // namespace

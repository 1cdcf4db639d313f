// SPDX-License-Identifier: Apache-2.0
//
// test_moe_coselect.cc - the routing statistics of include/loom_moe.h (moe_coselect.c):
// co-selection counts and loads against a hand-computed case and a brute-force X^T X,
// cross-layer affinity counts, the affinity prediction's votes, and every bad input.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "loom_moe.h"

namespace {

using u64v = std::vector<uint64_t>;
using i32v = std::vector<int32_t>;

// T rows of k distinct ids in [0, E), each slot -1 with probability 1/8.
i32v random_topk(std::mt19937_64 &rng, size_t T, int k, int E)
{
    i32v out(T * (size_t)k);
    for (size_t t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rng() % (uint64_t)E);
                dup = false;
                for (int i = 0; i < j; i++)
                    dup = dup || out[t * k + i] == e;
            } while (dup);
            out[t * k + j] = e;
        }
        for (int j = 0; j < k; j++)
            if (rng() % 8 == 0)
                out[t * k + j] = -1;
    }
    return out;
}

// The 0/1 token-by-expert matrix X of a top-k table.
std::vector<std::vector<int>> selection_matrix(const i32v &topk, size_t T, int k, int E)
{
    std::vector<std::vector<int>> x(T, std::vector<int>(E, 0));
    for (size_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++)
            if (topk[t * k + j] >= 0)
                x[t][topk[t * k + j]] = 1;
    return x;
}

void expect_error_message(loomResult_t res, const char *word)
{
    EXPECT_EQ(res, loomInvalidArgument);
    std::string msg = loomGetLastError(nullptr);
    EXPECT_NE(msg.find(word), std::string::npos) << msg;
}

TEST(MoeCoselect, HandComputed)
{
    // E = 4, k = 3: {0,1,2}, {1,2,-1}, {3,-1,-1}, {2,0,-1}.
    const i32v topk = {0, 1, 2, 1, 2, -1, 3, -1, -1, 2, 0, -1};
    u64v w(16, 0), load(4, 0);
    ASSERT_EQ(loomMoeCoselectAccumulate(topk.data(), 4, 3, 4, w.data(), load.data()), loomSuccess);
    const u64v expect = {2, 1, 2, 0,  // expert 0: tokens 0 and 3; with 1 once, with 2 twice
                         1, 2, 2, 0,  //
                         2, 2, 3, 0,  //
                         0, 0, 0, 1}; // expert 3 alone
    EXPECT_EQ(w, expect);
    EXPECT_EQ(load, (u64v{2, 2, 3, 1}));
    // Accumulates: a second call doubles every count; load may be NULL.
    ASSERT_EQ(loomMoeCoselectAccumulate(topk.data(), 4, 3, 4, w.data(), nullptr), loomSuccess);
    for (size_t i = 0; i < 16; i++)
        EXPECT_EQ(w[i], 2 * expect[i]) << i;
    // No tokens: nothing to read, nothing added.
    ASSERT_EQ(loomMoeCoselectAccumulate(nullptr, 0, 3, 4, w.data(), load.data()), loomSuccess);
    EXPECT_EQ(load, (u64v{2, 2, 3, 1}));
}

TEST(MoeCoselect, EqualsBruteForceOnRandomRoutings)
{
    std::mt19937_64 rng(7);
    const struct {
        int E, k;
        size_t T;
    } cases[] = {{1, 1, 5}, {8, 2, 100}, {16, 16, 40}, {64, 6, 1000}, {33, 8, 257}};
    for (const auto &c : cases) {
        const i32v topk = random_topk(rng, c.T, c.k, c.E);
        u64v w((size_t)c.E * c.E, 0), load(c.E, 0);
        ASSERT_EQ(loomMoeCoselectAccumulate(topk.data(), c.T, c.k, c.E, w.data(), load.data()),
                  loomSuccess);
        const auto x = selection_matrix(topk, c.T, c.k, c.E);
        for (int a = 0; a < c.E; a++) {
            uint64_t n = 0;
            for (size_t t = 0; t < c.T; t++)
                n += (uint64_t)x[t][a];
            EXPECT_EQ(load[a], n) << "E " << c.E << " expert " << a;
            for (int b = 0; b < c.E; b++) {
                uint64_t both = 0;
                for (size_t t = 0; t < c.T; t++)
                    both += (uint64_t)(x[t][a] & x[t][b]);
                ASSERT_EQ(w[(size_t)a * c.E + b], both)
                    << "E " << c.E << " [" << a << "][" << b << "]";
            }
        }
    }
}

TEST(MoeAffinity, AccumulateEqualsBruteForce)
{
    std::mt19937_64 rng(11);
    const int prevE = 12, prevk = 3, E = 20, k = 4;
    const size_t T = 300;
    const i32v prev = random_topk(rng, T, prevk, prevE), cur = random_topk(rng, T, k, E);
    u64v a((size_t)prevE * E, 1);
    ASSERT_EQ(loomMoeAffinityAccumulate(prev.data(), prevk, prevE, cur.data(), k, E, T, a.data()),
              loomSuccess);
    const auto xp = selection_matrix(prev, T, prevk, prevE), xc = selection_matrix(cur, T, k, E);
    for (int p = 0; p < prevE; p++)
        for (int b = 0; b < E; b++) {
            uint64_t n = 1; // the matrix started at 1: accumulation adds
            for (size_t t = 0; t < T; t++)
                n += (uint64_t)(xp[t][p] & xc[t][b]);
            ASSERT_EQ(a[(size_t)p * E + b], n) << p << " " << b;
        }
}

TEST(MoeAffinity, PredictVotesWithConditionalProbabilities)
{
    // Previous expert 0 is popular and leans to 0; previous expert 1 was seen once, with 2.
    // Raw counts would predict 0 for a token that selected both; conditional votes give
    // 2 (1.0) ahead of 0 (0.9).
    const u64v aff = {90, 10, 0, //
                      0,  0,  1};
    const i32v prev = {0,  1,  //
                       0,  -1, //
                       1,  -1, //
                       -1, -1};
    i32v pred(4 * 3, 99);
    ASSERT_EQ(loomMoeAffinityPredict(aff.data(), 2, 3, prev.data(), 2, 4, 3, pred.data()),
              loomSuccess);
    EXPECT_EQ(pred, (i32v{2, 0, 1,       // 1.0, 0.9, 0.1
                          0, 1, -1,      // expert 2 has no vote: never predicted
                          2, -1, -1,     //
                          -1, -1, -1})); // no previous selection, no prediction
    // Ties go to the lower id: both experts get half of the vote.
    const u64v even = {5, 5};
    const i32v one = {0};
    i32v p2(2, 99);
    ASSERT_EQ(loomMoeAffinityPredict(even.data(), 1, 2, one.data(), 1, 1, 2, p2.data()),
              loomSuccess);
    EXPECT_EQ(p2, (i32v{0, 1}));
}

TEST(MoeAffinity, PredictFollowsAPlantedLayerMap)
{
    // Tokens in group g select from g's experts in layer 1 and from (g + 1) mod 4's in
    // layer 2; prediction from layer 1 must name layer-2 experts of the right group.
    std::mt19937_64 rng(3);
    const int E = 16, k = 2, G = 4;
    const size_t T = 2000;
    i32v l1(T * k), l2(T * k);
    for (size_t t = 0; t < T; t++) {
        int g = (int)(rng() % G);
        for (int j = 0; j < k; j++) {
            l1[t * k + j] = (int32_t)(g * 4 + (int)((t + j) % 4));
            l2[t * k + j] = (int32_t)(((g + 1) % G) * 4 + (int)((t + 2 * j) % 4));
        }
    }
    u64v aff((size_t)E * E, 0);
    ASSERT_EQ(loomMoeAffinityAccumulate(l1.data(), k, E, l2.data(), k, E, T, aff.data()),
              loomSuccess);
    i32v pred(T * k);
    ASSERT_EQ(loomMoeAffinityPredict(aff.data(), E, E, l1.data(), k, T, k, pred.data()),
              loomSuccess);
    for (size_t t = 0; t < T; t++)
        for (int j = 0; j < k; j++)
            ASSERT_EQ(pred[t * k + j] / 4, l2[t * k] / 4) << "token " << t;
}

TEST(MoeCoselect, BadInputIsRejectedWithAMessage)
{
    u64v w(16, 5), load(4, 5);
    const u64v w0 = w, load0 = load;
    const i32v ok = {0, 1, 2, 3};
    // An id out of range, a negative id other than -1, a repeat in a row (the last row:
    // nothing may have been added before the check).
    const i32v high = {0, 1, 2, 4}, neg = {0, 1, -2, 3}, dup = {0, 1, 3, 3};
    expect_error_message(loomMoeCoselectAccumulate(high.data(), 2, 2, 4, w.data(), load.data()),
                         "expert 4");
    expect_error_message(loomMoeCoselectAccumulate(neg.data(), 2, 2, 4, w.data(), load.data()),
                         "expert -2");
    expect_error_message(loomMoeCoselectAccumulate(dup.data(), 2, 2, 4, w.data(), load.data()),
                         "twice");
    EXPECT_EQ(w, w0);
    EXPECT_EQ(load, load0);
    // Shapes: k = 0, k > E, E = 0, E < 0.
    expect_error_message(loomMoeCoselectAccumulate(ok.data(), 4, 0, 4, w.data(), nullptr),
                         "top_k 0");
    expect_error_message(loomMoeCoselectAccumulate(ok.data(), 1, 5, 4, w.data(), nullptr),
                         "top_k 5");
    expect_error_message(loomMoeCoselectAccumulate(ok.data(), 4, 1, 0, w.data(), nullptr),
                         "num_experts 0");
    expect_error_message(loomMoeCoselectAccumulate(ok.data(), 4, 1, -3, w.data(), nullptr),
                         "num_experts -3");
    // NULL arrays with a nonzero size; a token count whose table size overflows.
    expect_error_message(loomMoeCoselectAccumulate(nullptr, 2, 2, 4, w.data(), nullptr), "NULL");
    expect_error_message(loomMoeCoselectAccumulate(ok.data(), 2, 2, 4, nullptr, nullptr),
                         "coselect");
    expect_error_message(
        loomMoeCoselectAccumulate(ok.data(), SIZE_MAX / 2, 4, 4, w.data(), nullptr), "overflow");
    EXPECT_EQ(w, w0);

    // Affinity: each table is checked; prediction checks pred_k and its output.
    u64v a(16, 0);
    expect_error_message(loomMoeAffinityAccumulate(high.data(), 2, 4, ok.data(), 2, 4, 2, a.data()),
                         "prev_topk");
    expect_error_message(loomMoeAffinityAccumulate(ok.data(), 2, 4, dup.data(), 2, 4, 2, a.data()),
                         "twice");
    expect_error_message(loomMoeAffinityAccumulate(ok.data(), 2, 4, ok.data(), 2, 4, 2, nullptr),
                         "affinity");
    EXPECT_EQ(a, u64v(16, 0));
    i32v pred(4, 7);
    expect_error_message(loomMoeAffinityPredict(a.data(), 4, 4, ok.data(), 2, 2, 5, pred.data()),
                         "pred_k 5");
    expect_error_message(loomMoeAffinityPredict(a.data(), 4, 4, ok.data(), 2, 2, 2, nullptr),
                         "pred_topk");
    expect_error_message(loomMoeAffinityPredict(nullptr, 4, 4, ok.data(), 2, 2, 2, pred.data()),
                         "affinity");
    expect_error_message(loomMoeAffinityPredict(a.data(), 4, 4, neg.data(), 2, 2, 2, pred.data()),
                         "expert -2");
    EXPECT_EQ(pred, i32v(4, 7));
}

} // namespace

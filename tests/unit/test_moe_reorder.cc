// SPDX-License-Identifier: Apache-2.0
//
// test_moe_reorder.cc - loomMoeReorderCompute (moe_reorder.c): equal to a brute-force reference
// of the rule (full score matrix, sorted order, scan of every rank) on random inputs, ties
// included; exact shares per rank; hand-checked cases for each step of the rule; determinism;
// the local-hit gain on planted-partition routing (moe_gen.c) with an oracle and with an
// affinity prediction, and its absence when the layers' groups are unrelated (the control);
// every bad input refused with a message and the outputs untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "loom_moe.h"

extern "C" {
#include "moe_gen.h"
}

namespace {

using i32v = std::vector<int32_t>;
using u64v = std::vector<uint64_t>;

struct Result {
    i32v perm, home;
};

Result Reorder(const i32v &er, int G, const i32v &pred, int kp, size_t T)
{
    Result r{i32v(T, -7), i32v(T, -7)};
    const int E = (int)er.size();
    EXPECT_EQ(
        loomMoeReorderCompute(er.data(), E, G, pred.data(), kp, T, r.perm.data(), r.home.data()),
        loomSuccess)
        << loomGetLastError(nullptr);
    return r;
}

// The rule as docs/moe.md states it, computed the long way.
Result Reference(const i32v &er, int G, const i32v &pred, int kp, size_t T)
{
    std::vector<std::vector<int>> score(T, std::vector<int>(G, 0));
    std::vector<int> best(T), margin(T);
    for (size_t t = 0; t < T; t++) {
        for (int j = 0; j < kp; j++)
            if (pred[t * kp + j] >= 0)
                score[t][er[pred[t * kp + j]]]++;
        std::vector<int> s = score[t];
        std::sort(s.rbegin(), s.rend());
        best[t] = s[0];
        margin[t] = s[0] - (G > 1 ? s[1] : 0);
    }
    std::vector<size_t> order(T);
    for (size_t t = 0; t < T; t++)
        order[t] = t;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (best[a] != best[b])
            return best[a] > best[b];
        if (margin[a] != margin[b])
            return margin[a] > margin[b];
        return a < b;
    });
    std::vector<size_t> quota(G);
    for (int g = 0; g < G; g++)
        quota[g] = T / G + ((size_t)g < T % G ? 1 : 0);
    Result r{i32v(), i32v(T, -1)};
    for (size_t t : order) {
        int pick = -1;
        for (int g = 0; g < G; g++)
            if (quota[g] > 0 && (pick < 0 || score[t][g] > score[t][pick]))
                pick = g;
        quota[pick]--;
        r.home[t] = pick;
    }
    for (int g = 0; g < G; g++)
        for (size_t t = 0; t < T; t++)
            if (r.home[t] == g)
                r.perm.push_back((int32_t)t);
    return r;
}

// Random top-k' rows: distinct experts, about one slot in six -1.
i32v RandomPred(std::mt19937_64 &rng, int E, int kp, size_t T)
{
    i32v pred(T * kp);
    i32v ids(E);
    for (size_t t = 0; t < T; t++) {
        for (int e = 0; e < E; e++)
            ids[e] = e;
        std::shuffle(ids.begin(), ids.end(), rng);
        for (int j = 0; j < kp; j++)
            pred[t * kp + j] = rng() % 6 == 0 ? -1 : ids[j];
    }
    return pred;
}

TEST(MoeReorder, MatchesTheBruteForceRuleOnRandomInputs)
{
    std::mt19937_64 rng(11);
    const int Es[] = {1, 3, 8, 17, 64};
    const int Gs[] = {1, 2, 3, 5, 8, 16};
    const size_t Ts[] = {0, 1, 2, 7, 16, 33, 100, 257};
    int cases = 0;
    for (int E : Es)
        for (int G : Gs)
            for (size_t T : Ts) {
                const int kp = 1 + (int)(rng() % std::min(E, 6));
                i32v er(E);
                for (int e = 0; e < E; e++) // any placement, also uneven ones and empty ranks
                    er[e] = (int32_t)(rng() % G);
                const i32v pred = RandomPred(rng, E, kp, T);
                const Result got = Reorder(er, G, pred, kp, T);
                const Result want = Reference(er, G, pred, kp, T);
                const std::string at = "E " + std::to_string(E) + " G " + std::to_string(G) +
                                       " k' " + std::to_string(kp) + " T " + std::to_string(T);
                ASSERT_EQ(got.perm, want.perm) << at;
                ASSERT_EQ(got.home, want.home) << at;
                // Exact shares: the first T mod G ranks hold one more, and positions follow them.
                size_t pos = 0;
                for (int g = 0; g < G; g++) {
                    const size_t n = T / G + ((size_t)g < T % G ? 1 : 0);
                    for (size_t j = 0; j < n; j++, pos++) {
                        ASSERT_EQ(got.home[got.perm[pos]], g) << at;
                        if (j > 0) {
                            ASSERT_LT(got.perm[pos - 1], got.perm[pos]) << at;
                        }
                    }
                }
                // Deterministic: a second call gives the same bytes.
                const Result again = Reorder(er, G, pred, kp, T);
                ASSERT_EQ(again.perm, got.perm) << at;
                cases++;
            }
    EXPECT_EQ(cases, 5 * 6 * 8);
}

TEST(MoeReorder, EachStepOfTheRuleByHand)
{
    // Experts 0 and 1 on rank 0, 2 and 3 on rank 1; two ranks.
    const i32v er = {0, 0, 1, 1};
    // Best score first: token 1 (score 2 on rank 0) is placed before token 0 (score 1) and takes
    // rank 0, the only rank token 0 wanted.
    EXPECT_EQ(Reorder(er, 2, {0, -1, 0, 1}, 2, 2).perm, (i32v{1, 0}));
    // Then the margin: token 1 (1 on rank 0, margin 1) is placed before token 0 (1 on each
    // rank, margin 0), which then goes to rank 1. By index, token 0 would take rank 0 (a tie
    // goes to the lower rank) and push token 1 away from its only expert.
    EXPECT_EQ(Reorder(er, 2, {0, 2, 1, -1}, 2, 2).perm, (i32v{1, 0}));
    // Then the index: both want rank 0 with the same key; token 0 gets it.
    const Result idx = Reorder(er, 2, {1, -1, 0, -1}, 2, 2);
    EXPECT_EQ(idx.perm, (i32v{0, 1}));
    EXPECT_EQ(idx.home, (i32v{0, 1}));
    // Quota: four tokens, two per rank. Token 1 -> 0, token 2 -> 1, token 0 -> 1 (its expert's
    // rank still has room), token 3 (a tie) -> 0, the one rank left; ranks list tokens by index.
    const Result q = Reorder(er, 2, {2, -1, 0, 1, 2, 3, 0, 2}, 2, 4);
    EXPECT_EQ(q.perm, (i32v{1, 3, 0, 2}));
    EXPECT_EQ(q.home, (i32v{1, 0, 1, 0}));
    // Tokens without a prediction fill the lowest ranks with room, in index order; 5 tokens on
    // 2 ranks: rank 0 holds 3.
    const Result empty = Reorder(er, 2, i32v(5, -1), 1, 5);
    EXPECT_EQ(empty.perm, (i32v{0, 1, 2, 3, 4}));
    EXPECT_EQ(empty.home, (i32v{0, 0, 0, 1, 1}));
}

// The row counts of a routing with token t on rank home[t] (docs/moe-trace.md, "Metrics").
loom_moe_rows_t Rows(const i32v &topk, size_t T, int k, int E, const i32v &er, int G,
                     const i32v &home)
{
    loom_moe_rows_t rows{};
    EXPECT_EQ(loom_moe_rows_count(topk.data(), T, k, E, er.data(), G, home.data(), nullptr, &rows),
              loomSuccess);
    return rows;
}

// The fraction of (token, expert) pairs whose expert sits on the token's rank.
double Hits(const loom_moe_rows_t &r)
{
    return (double)r.pairs_local / (double)r.pairs;
}

struct Hit {
    loom_moe_rows_t natural, affinity, oracle;
};

// E = 64, G = 8, k = 6, rho = 0.8, two layers that keep a token's group with probability
// rho_layer. The placement and the affinity are learned on the first T tokens, the rows
// counted on the next T: in natural order (rank g holds tokens g*T/G .. (g+1)*T/G - 1), and
// re-ordered by a prediction of layer 2 from layer 1 through affinity, or by layer 2 itself.
Hit Planted(double rho_layer)
{
    const int E = 64, G = 8, k = 6;
    const size_t T = 8192;
    loom_moe_gen_t m{};
    m.num_experts = E;
    m.top_k = k;
    m.num_groups = G;
    m.rho = 0.8;
    m.rho_layer = rho_layer;
    m.seed = 5;
    i32v topk((size_t)2 * 2 * T * k); // (layer, token, k), train tokens then test tokens
    EXPECT_EQ(loom_moe_gen_planted(&m, 2 * T, 2, topk.data(), nullptr, nullptr), loomSuccess);
    const int32_t *l1 = topk.data(), *l2 = topk.data() + 2 * T * k;
    u64v co((size_t)E * E, 0), aff((size_t)E * E, 0);
    EXPECT_EQ(loomMoeCoselectAccumulate(l2, T, k, E, co.data(), nullptr), loomSuccess);
    EXPECT_EQ(loomMoeAffinityAccumulate(l1, k, E, l2, k, E, T, aff.data()), loomSuccess);
    loomMoePlacementConfig_t cfg = LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER;
    cfg.nranks = G;
    i32v er(E);
    EXPECT_EQ(loomMoePlacementCompute(co.data(), nullptr, E, &cfg, er.data(), nullptr),
              loomSuccess);
    const i32v test1(l1 + T * k, l1 + 2 * T * k), test2(l2 + T * k, l2 + 2 * T * k);
    i32v natural(T), pred(T * k);
    for (size_t t = 0; t < T; t++)
        natural[t] = (int32_t)(t / (T / G));
    EXPECT_EQ(loomMoeAffinityPredict(aff.data(), E, E, test1.data(), k, T, k, pred.data()),
              loomSuccess);
    Hit h;
    h.natural = Rows(test2, T, k, E, er, G, natural);
    h.affinity = Rows(test2, T, k, E, er, G, Reorder(er, G, pred, k, T).home);
    h.oracle = Rows(test2, T, k, E, er, G, Reorder(er, G, test2, k, T).home);
    std::printf(
        "E %d G %d k %d rho 0.8 rho_layer %.1f, %zu tokens, learned placement: local hits "
        "natural %.1f%%, re-ordered by affinity prediction %.1f%%, by the routing itself "
        "%.1f%%; remote rows naive %llu, %llu, %llu, dedup %llu, %llu, %llu\n",
        E, G, k, rho_layer, T, 100 * Hits(h.natural), 100 * Hits(h.affinity), 100 * Hits(h.oracle),
        (unsigned long long)h.natural.rows_naive_remote,
        (unsigned long long)h.affinity.rows_naive_remote,
        (unsigned long long)h.oracle.rows_naive_remote, (unsigned long long)h.natural.rows_remote,
        (unsigned long long)h.affinity.rows_remote, (unsigned long long)h.oracle.rows_remote);
    return h;
}

TEST(MoeReorder, RaisesLocalHitsOnPlantedRouting)
{
    const Hit h = Planted(0.8);
    RecordProperty("hit_natural_permille", (int)(1000 * Hits(h.natural)));
    RecordProperty("hit_affinity_permille", (int)(1000 * Hits(h.affinity)));
    RecordProperty("hit_oracle_permille", (int)(1000 * Hits(h.oracle)));
    EXPECT_LT(Hits(h.natural), 0.16); // about 1/G: tokens are independent of their position
    EXPECT_GE(Hits(h.oracle), 0.65);
    EXPECT_GE(Hits(h.affinity), Hits(h.natural) + 0.20);
    EXPECT_LT(h.affinity.rows_remote, h.natural.rows_remote * 8 / 10);
    // The control: when layer 2's groups do not follow layer 1's, the prediction carries
    // nothing, and neither does the order it gives; the routing itself still would.
    const Hit c = Planted(0.0);
    EXPECT_LT(Hits(c.affinity), Hits(c.natural) + 0.05);
    EXPECT_GE(Hits(c.oracle), 0.65);
}

void ExpectRefused(loomResult_t r, const std::string &word)
{
    EXPECT_EQ(r, loomInvalidArgument);
    const std::string msg = loomGetLastError(nullptr);
    EXPECT_NE(msg.find(word), std::string::npos) << "'" << word << "' not in '" << msg << "'";
}

TEST(MoeReorder, BadInputIsRefusedWithAMessage)
{
    const i32v er = {0, 0, 1, 1}, ok = {0, 1, 2, 3}, high = {0, 1, 2, 4}, dup = {0, 1, 3, 3};
    const i32v far = {0, 0, 1, 2};
    i32v perm(2, -7), home(2, -7);
    int32_t *p = perm.data(), *h = home.data();
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, high.data(), 2, 2, p, h), "expert 4");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, dup.data(), 2, 2, p, h), "twice");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, nullptr, 2, 2, p, h), "is NULL");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, ok.data(), 0, 2, p, h), "top_k 0");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, ok.data(), 5, 2, p, h), "top_k 5");
    ExpectRefused(loomMoeReorderCompute(er.data(), 0, 2, ok.data(), 2, 2, p, h), "num_experts");
    ExpectRefused(loomMoeReorderCompute(nullptr, 4, 2, ok.data(), 2, 2, p, h), "expert_rank");
    ExpectRefused(loomMoeReorderCompute(far.data(), 4, 2, ok.data(), 2, 2, p, h),
                  "expert_rank[3] = 2");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 0, ok.data(), 2, 2, p, h), "nranks 0");
    ExpectRefused(loomMoeReorderCompute(er.data(), 4, 2, ok.data(), 2, 2, nullptr, h),
                  "perm is NULL");
    EXPECT_EQ(perm, i32v(2, -7));
    EXPECT_EQ(home, i32v(2, -7));
    // No tokens: nothing to read or write, NULL arrays welcome.
    EXPECT_EQ(loomMoeReorderCompute(er.data(), 4, 2, nullptr, 2, 0, nullptr, nullptr), loomSuccess);
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_shard_plan.cc - the plan on its own, no communicator (docs/shard.md, Planner and Buffer
// layout): S3 validity over 1000 seeded random lists at 1 to 64 ranks (one owner per matrix,
// the hint kept, every parameter contiguous, the pieces of all ranks covering the full buffer
// once and each shard and state once, element-wise pieces within one element, the same plan and
// fingerprint from a second create); the owners equal to a restatement of the algorithm (fixed
// owners, caps, all three balances); S4 the list-scheduling bound, LPT within 4/3 - 1/(3P) of
// the exhaustive optimum, and cost balance against numel balance on squares and wide matrices;
// S5 the memory cap and the infeasible cap naming the parameter; S14 pack and unpack; the
// plan-side misuse of S15 (each error code and its message); the stats' formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "loom_shard.h"
#include "shard_lists.h"

extern "C" {
#include "shard_plan.h"
}

using namespace shardtest;

namespace {

struct PlanGuard {
    loomShardPlan_t p = nullptr;
    ~PlanGuard()
    {
        loomShardPlanDestroy(p);
    }
};

loomShardConfig_t Cfg(loomShardLayout_t layout = loomShardOwner,
                      loomShardBalance_t balance = loomShardBalanceNsCost, size_t cap = 0)
{
    loomShardConfig_t c = LOOM_SHARD_CONFIG_INITIALIZER;
    c.layout = layout;
    c.balance = balance;
    c.max_rank_bytes = cap;
    return c;
}

std::vector<shard_piece_t> Pieces(loomShardPlan_t p, int rank, int b)
{
    std::vector<shard_piece_t> v((size_t)shard_pieces(p, rank, b, nullptr));
    shard_pieces(p, rank, b, v.data());
    return v;
}

double NsCost(const loomShardParam_t &q, int steps = 5)
{
    double s = (double)std::min(q.rows, q.cols), l = (double)std::max(q.rows, q.cols);
    return (double)steps * s * s * (2.0 * l + s);
}

// Checks one plan against the layout rules; returns the owners.
std::vector<int> CheckPlan(const std::vector<loomShardParam_t> &list, int P,
                           const loomShardConfig_t &cfg, const std::string &what)
{
    SCOPED_TRACE(what);
    PlanGuard g;
    EXPECT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &cfg), loomSuccess)
        << loomGetLastError(nullptr);
    if (g.p == nullptr)
        return {};
    const size_t N = Numel(list);
    const int n = (int)list.size();
    std::vector<int> owner((size_t)n);
    std::vector<size_t> off((size_t)n);
    for (int i = 0; i < n; i++) {
        EXPECT_EQ(loomShardParamInfo(g.p, i, &owner[(size_t)i], &off[(size_t)i]), loomSuccess);
        const auto &q = list[(size_t)i];
        if (cfg.layout == loomShardOwner && q.kind == loomShardMatrix) {
            EXPECT_TRUE(owner[(size_t)i] >= 0 && owner[(size_t)i] < P) << "param " << i;
            if (q.owner >= 0) {
                EXPECT_EQ(owner[(size_t)i], q.owner) << "param " << i << " lost its fixed owner";
            }
        } else {
            EXPECT_EQ(owner[(size_t)i], -1) << "param " << i;
        }
    }
    // Every parameter contiguous, the full buffer covered once, bucket after bucket; inside a
    // bucket the matrices (by owner under Owner, then list order), then the element-wise ones.
    std::vector<int> by_off((size_t)n);
    std::iota(by_off.begin(), by_off.end(), 0);
    std::sort(by_off.begin(), by_off.end(),
              [&](int a, int b) { return off[(size_t)a] < off[(size_t)b]; });
    size_t at = 0;
    for (size_t k = 0; k < by_off.size(); k++) {
        const int i = by_off[k];
        EXPECT_EQ(off[(size_t)i], at) << "param " << i;
        at += list[(size_t)i].rows * list[(size_t)i].cols;
        if (k == 0)
            continue;
        const int j = by_off[k - 1];
        const auto &a = list[(size_t)j], &b = list[(size_t)i];
        auto key = [&](int x, const loomShardParam_t &q) {
            return std::make_tuple(q.bucket, (int)q.kind,
                                   cfg.layout == loomShardOwner ? owner[(size_t)x] : 0, x);
        };
        EXPECT_LT(key(j, a), key(i, b)) << "params " << j << " and " << i << " out of plan order";
    }
    EXPECT_EQ(at, N);
    loomShardStats_t st;
    EXPECT_EQ(loomShardStats(g.p, &st), loomSuccess);
    EXPECT_EQ(st.total_elems, N);
    // The pieces: all ranks together cover the full buffer once (every rank all of it under
    // Replicated); each rank's pieces cover its shard once and its state once.
    std::vector<std::pair<size_t, size_t>> all;
    size_t shard_sum = 0;
    for (int r = 0; r < P; r++) {
        loomShardRankInfo_t ri;
        EXPECT_EQ(loomShardRankInfo(g.p, r, &ri), loomSuccess);
        EXPECT_EQ(loomShardStateElems(g.p, r), ri.state_elems);
        shard_sum += ri.shard_elems;
        std::vector<std::pair<size_t, size_t>> sh, state;
        for (int b = 0; b < st.nbuckets; b++) {
            size_t e_len = 0, m_len = 0;
            const auto pcs = Pieces(g.p, r, b);
            for (const auto &pc : pcs)
                (list[(size_t)pc.param].kind == loomShardMatrix ? m_len : e_len) += pc.len;
            for (const auto &pc : pcs) {
                EXPECT_GE(pc.full_off, off[(size_t)pc.param]);
                EXPECT_LE(pc.full_off + pc.len,
                          off[(size_t)pc.param] +
                              list[(size_t)pc.param].rows * list[(size_t)pc.param].cols);
                all.push_back({pc.full_off, pc.len});
                sh.push_back({pc.shard_off, pc.len});
                state.push_back({pc.state_off, pc.len});
                if (list[(size_t)pc.param].kind == loomShardElementwise)
                    state.push_back({pc.state_off + e_len, pc.len}); // Adam v
            }
        }
        for (auto *v : {&sh, &state}) {
            std::sort(v->begin(), v->end());
            size_t c = 0;
            for (const auto &x : *v) {
                EXPECT_EQ(x.first, c) << "rank " << r << ": a gap or an overlap";
                c += x.second;
            }
            EXPECT_EQ(c, v == &sh ? ri.shard_elems : ri.state_elems) << "rank " << r;
        }
    }
    EXPECT_EQ(shard_sum, cfg.layout == loomShardReplicated ? N * (size_t)P : N);
    std::sort(all.begin(), all.end());
    size_t c = 0;
    for (size_t k = 0; k < all.size(); k++) {
        if (cfg.layout == loomShardReplicated)
            continue;
        EXPECT_EQ(all[k].first, c) << "the ranks' pieces leave a gap or overlap";
        c += all[k].second;
    }
    if (cfg.layout != loomShardReplicated) {
        EXPECT_EQ(c, N);
    }
    // Owner: each bucket's element-wise pieces differ by at most one element.
    if (cfg.layout == loomShardOwner)
        for (int b = 0; b < st.nbuckets; b++) {
            size_t lo = SIZE_MAX, hi = 0;
            for (int r = 0; r < P; r++) {
                size_t e = 0;
                for (const auto &pc : Pieces(g.p, r, b))
                    if (list[(size_t)pc.param].kind == loomShardElementwise)
                        e += pc.len;
                lo = std::min(lo, e);
                hi = std::max(hi, e);
            }
            EXPECT_LE(hi - lo, 1u) << "bucket " << b;
        }
    // A second create: the same owners, offsets, stats and fingerprint.
    PlanGuard g2;
    EXPECT_EQ(loomShardPlanCreate(&g2.p, list.data(), n, P, &cfg), loomSuccess);
    loomShardStats_t st2;
    EXPECT_EQ(loomShardStats(g2.p, &st2), loomSuccess);
    EXPECT_EQ(std::memcmp(&st, &st2, sizeof(st)), 0);
    for (int i = 0; i < n; i++) {
        int o;
        size_t f;
        loomShardParamInfo(g2.p, i, &o, &f);
        EXPECT_EQ(o, owner[(size_t)i]);
        EXPECT_EQ(f, off[(size_t)i]);
    }
    return owner;
}

TEST(ShardPlan, S3ValidOnRandomListsAndRepeatable)
{
    Rng rng(3);
    for (int t = 0; t < 1000; t++) {
        const int P = 1 + t % 64;
        const auto list = RandomList(rng, 200, 40, P, true);
        const std::string what = "list " + std::to_string(t) + " P=" + std::to_string(P);
        CheckPlan(list, P, Cfg(), what);
        if (t % 10 == 0) {
            CheckPlan(list, P, Cfg(loomShardRows), what + " rows");
            CheckPlan(list, P, Cfg(loomShardReplicated), what + " replicated");
            CheckPlan(list, P, Cfg(loomShardOwner, loomShardBalanceNumel), what + " numel");
            CheckPlan(list, P, Cfg(loomShardOwner, loomShardBalanceRoundRobin), what + " rr");
        }
        if (HasFailure())
            return;
    }
}

TEST(ShardPlan, FingerprintFollowsEveryInput)
{
    const auto list = GptTiny();
    auto fp = [&](const std::vector<loomShardParam_t> &l, int P, loomShardConfig_t c) {
        PlanGuard g;
        EXPECT_EQ(loomShardPlanCreate(&g.p, l.data(), (int)l.size(), P, &c), loomSuccess);
        loomShardStats_t st;
        loomShardStats(g.p, &st);
        return st.fingerprint;
    };
    const uint64_t base = fp(list, 4, Cfg());
    EXPECT_EQ(base, fp(list, 4, Cfg()));
    EXPECT_NE(base, fp(list, 3, Cfg()));
    EXPECT_NE(base, fp(list, 4, Cfg(loomShardRows)));
    loomShardConfig_t c = Cfg();
    c.rows_bucketed = 1;
    EXPECT_NE(base, fp(list, 4, c));
    auto other = list;
    other[5].cols = 1 + other[5].cols;
    EXPECT_NE(base, fp(other, 4, Cfg()));
    other = list;
    other[4].owner = 2;
    EXPECT_NE(base, fp(other, 4, Cfg()));
}

// §2.4 restated: items sorted by (cost desc, bytes desc, index asc); the first rank in (load,
// bytes, rank) order whose bytes stay under the cap; loads global; fixed owners and the
// element-wise pieces seeded. Returns false when some matrix fits nowhere.
bool Restated(const std::vector<loomShardParam_t> &l, int P, const loomShardConfig_t &c,
              std::vector<int> &owner)
{
    std::vector<double> load((size_t)P, 0);
    std::vector<size_t> bytes((size_t)P, 0);
    std::vector<size_t> e(64, 0);
    for (const auto &q : l)
        if (q.kind == loomShardElementwise)
            e[(size_t)q.bucket] += q.rows * q.cols;
    for (size_t E : e)
        for (int r = 0; r < P; r++)
            bytes[(size_t)r] +=
                16 * ((size_t)((r + 1) * E / (size_t)P) - (size_t)(r * E / (size_t)P));
    auto cost = [&](const loomShardParam_t &q) {
        return c.balance == loomShardBalanceNsCost ? NsCost(q, c.ns_steps)
                                                   : (double)(q.rows * q.cols);
    };
    const size_t cap = c.max_rank_bytes;
    for (int r = 0; r < P; r++)
        if (cap && bytes[(size_t)r] > cap)
            return false;
    owner.assign(l.size(), -1);
    std::vector<int> items;
    for (size_t i = 0; i < l.size(); i++) {
        if (l[i].kind != loomShardMatrix)
            continue;
        if (l[i].owner >= 0) {
            owner[i] = l[i].owner;
            load[(size_t)l[i].owner] += cost(l[i]);
            bytes[(size_t)l[i].owner] += 12 * l[i].rows * l[i].cols;
            if (cap && bytes[(size_t)l[i].owner] > cap)
                return false;
        } else {
            items.push_back((int)i);
        }
    }
    std::stable_sort(items.begin(), items.end(), [&](int a, int b) {
        const auto &x = l[(size_t)a], &y = l[(size_t)b];
        if (cost(x) != cost(y))
            return cost(x) > cost(y);
        return x.rows * x.cols > y.rows * y.cols;
    });
    for (size_t k = 0; k < items.size(); k++) {
        const auto &q = l[(size_t)items[k]];
        const size_t add = 12 * q.rows * q.cols;
        int best = -1;
        if (c.balance == loomShardBalanceRoundRobin) {
            best = (int)(k % (size_t)P);
            if (cap && bytes[(size_t)best] + add > cap)
                return false;
        } else {
            std::vector<int> cand((size_t)P);
            std::iota(cand.begin(), cand.end(), 0);
            std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) {
                return std::make_pair(load[(size_t)a], bytes[(size_t)a]) <
                       std::make_pair(load[(size_t)b], bytes[(size_t)b]);
            });
            for (int r : cand)
                if (!cap || bytes[(size_t)r] + add <= cap) {
                    best = r;
                    break;
                }
            if (best < 0)
                return false;
        }
        owner[(size_t)items[k]] = best;
        load[(size_t)best] += cost(q);
        bytes[(size_t)best] += add;
    }
    return true;
}

TEST(ShardPlan, OwnersRestateThePlanner)
{
    Rng rng(44);
    for (int t = 0; t < 400; t++) {
        const int P = 1 + (int)rng.Below(9);
        const auto list = RandomList(rng, 40, 48, P, true);
        for (int bal = 0; bal < 3; bal++) {
            loomShardConfig_t c = Cfg(loomShardOwner, (loomShardBalance_t)bal);
            c.ns_steps = 1 + t % 5;
            // No cap, a cap near the mean, a tight one.
            PlanGuard g0;
            ASSERT_EQ(loomShardPlanCreate(&g0.p, list.data(), (int)list.size(), P, &c),
                      loomSuccess);
            loomShardStats_t st;
            loomShardStats(g0.p, &st);
            const size_t mean = 16 * st.total_elems / (size_t)P;
            for (size_t cap : {(size_t)0, mean * 3 / 2, mean + 1, mean / 2}) {
                c.max_rank_bytes = cap;
                std::vector<int> want;
                const bool ok = Restated(list, P, c, want);
                PlanGuard g;
                const loomResult_t r =
                    loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &c);
                const std::string what = "list " + std::to_string(t) + " P=" + std::to_string(P) +
                                         " balance " + std::to_string(bal) + " cap " +
                                         std::to_string(cap);
                ASSERT_EQ(r, ok ? loomSuccess : loomInvalidArgument) << what;
                if (!ok)
                    continue;
                for (size_t i = 0; i < list.size(); i++) {
                    int o;
                    loomShardParamInfo(g.p, (int)i, &o, nullptr);
                    ASSERT_EQ(o, want[i]) << what << " param " << i;
                }
            }
        }
    }
}

TEST(ShardPlan, S4ListSchedulingBound)
{
    Rng rng(4);
    for (int t = 0; t < 1000; t++) {
        const int P = 1 + t % 64;
        const auto list = RandomList(rng, 200, 64, P, false);
        PlanGuard g;
        const loomShardConfig_t c = Cfg();
        ASSERT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &c), loomSuccess);
        loomShardStats_t st;
        loomShardStats(g.p, &st);
        ASSERT_LE(st.cost_max, st.cost_bound * (1 + 1e-12)) << "list " << t << " P=" << P;
        double item = 0, total = 0;
        for (const auto &q : list)
            if (q.kind == loomShardMatrix) {
                item = std::max(item, NsCost(q));
                total += NsCost(q);
            }
        ASSERT_DOUBLE_EQ(st.cost_total, total);
        ASSERT_DOUBLE_EQ(st.cost_mean, total / P);
        ASSERT_DOUBLE_EQ(st.cost_bound, total / P + (1.0 - 1.0 / P) * item);
    }
}

TEST(ShardPlan, S4LptWithinFourThirdsOfOptimum)
{
    Rng rng(5);
    for (int t = 0; t < 300; t++) {
        const int P = 2 + t % 2, n = 2 + (int)rng.Below(8);
        std::vector<loomShardParam_t> list;
        for (int i = 0; i < n; i++)
            list.push_back(Matrix(1 + rng.Below(24), 1 + rng.Below(24), 0));
        std::vector<double> c;
        for (const auto &q : list)
            c.push_back(NsCost(q));
        double opt = 1e300;
        std::vector<int> a((size_t)n, 0);
        for (;;) { // every assignment
            std::vector<double> ld((size_t)P, 0);
            for (int i = 0; i < n; i++)
                ld[(size_t)a[(size_t)i]] += c[(size_t)i];
            opt = std::min(opt, *std::max_element(ld.begin(), ld.end()));
            int k = 0;
            while (k < n && ++a[(size_t)k] == P)
                a[(size_t)k++] = 0;
            if (k == n)
                break;
        }
        PlanGuard g;
        const loomShardConfig_t cfg = Cfg();
        ASSERT_EQ(loomShardPlanCreate(&g.p, list.data(), n, P, &cfg), loomSuccess);
        loomShardStats_t st;
        loomShardStats(g.p, &st);
        ASSERT_LE(st.cost_max, (4.0 / 3.0 - 1.0 / (3.0 * P)) * opt * (1 + 1e-12))
            << "instance " << t << " n=" << n << " P=" << P;
    }
}

TEST(ShardPlan, S4CostBalanceBeatsNumelOnSquaresAndWide)
{
    std::vector<loomShardParam_t> list;
    for (int i = 0; i < 6; i++)
        list.push_back(Matrix(2048, 2048, 0));
    for (int i = 0; i < 10; i++)
        list.push_back(Matrix(512, 8192, 0));
    Rng rng(6);
    for (size_t i = list.size() - 1; i > 0; i--)
        std::swap(list[i], list[rng.Below((uint32_t)i + 1)]);
    auto imbalance = [&](loomShardBalance_t b) {
        PlanGuard g;
        const loomShardConfig_t c = Cfg(loomShardOwner, b);
        EXPECT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), 4, &c), loomSuccess);
        loomShardStats_t st;
        loomShardStats(g.p, &st);
        return st.cost_max / st.cost_mean;
    };
    EXPECT_LE(imbalance(loomShardBalanceNsCost), 1.10);
    EXPECT_GE(imbalance(loomShardBalanceNumel), 1.5);
    EXPECT_GE(imbalance(loomShardBalanceRoundRobin), 1.5);
}

TEST(ShardPlan, S5MemoryCap)
{
    std::vector<loomShardParam_t> list;
    for (int i = 0; i < 6; i++)
        list.push_back(Matrix(256, 256, i / 2));
    for (int i = 0; i < 10; i++)
        list.push_back(Matrix(64, 1024, 3 + i / 5));
    list.push_back(Vector(1000, 5));
    const int P = 4;
    PlanGuard g0;
    loomShardConfig_t c = Cfg();
    ASSERT_EQ(loomShardPlanCreate(&g0.p, list.data(), (int)list.size(), P, &c), loomSuccess);
    loomShardStats_t st;
    loomShardStats(g0.p, &st);
    EXPECT_GT(st.bytes_imbalance, 1.2); // the cap below must change something
    double mean = 0;
    for (int r = 0; r < P; r++) {
        loomShardRankInfo_t ri;
        loomShardRankInfo(g0.p, r, &ri);
        mean += (double)ri.owned_bytes / P;
    }
    c.max_rank_bytes = (size_t)(1.2 * mean);
    PlanGuard g;
    ASSERT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &c), loomSuccess)
        << loomGetLastError(nullptr);
    for (int r = 0; r < P; r++) {
        loomShardRankInfo_t ri;
        loomShardRankInfo(g.p, r, &ri);
        EXPECT_LE(ri.owned_bytes, c.max_rank_bytes) << "rank " << r;
    }
    // 12 bytes per element of the 256 x 256 matrices do not fit: the first one is named.
    c.max_rank_bytes = 12 * 256 * 256 - 1;
    PlanGuard g2;
    EXPECT_EQ(loomShardPlanCreate(&g2.p, list.data(), (int)list.size(), P, &c),
              loomInvalidArgument);
    EXPECT_EQ(g2.p, nullptr);
    EXPECT_NE(std::string(loomGetLastError(nullptr)).find("param 0 (matrix 256 x 256"),
              std::string::npos)
        << loomGetLastError(nullptr);
    // A cap the matrices meet one by one but not all together: the first that fits nowhere.
    c.max_rank_bytes = 12 * 256 * 256 + 16 * 250;
    PlanGuard g3;
    EXPECT_EQ(loomShardPlanCreate(&g3.p, list.data(), (int)list.size(), P, &c),
              loomInvalidArgument);
    EXPECT_NE(std::string(loomGetLastError(nullptr)).find("param 4 (matrix 256 x 256"),
              std::string::npos)
        << loomGetLastError(nullptr);
}

TEST(ShardPlan, StatsFormulas)
{
    const auto list = OddShapes();
    for (int P : {1, 3, 8}) {
        size_t N = 0, NM = 0, pad = 0, padm = 0;
        for (const auto &q : list) {
            N += q.rows * q.cols;
            const size_t chunk = (q.rows + (size_t)P - 1) / (size_t)P;
            pad += chunk * q.cols * (size_t)P;
            if (q.kind == loomShardMatrix) {
                NM += q.rows * q.cols;
                padm += chunk * q.cols * (size_t)P;
            }
        }
        for (int lay = 0; lay < 3; lay++) {
            PlanGuard g;
            const loomShardConfig_t c = Cfg((loomShardLayout_t)lay);
            ASSERT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &c), loomSuccess);
            loomShardStats_t st;
            loomShardStats(g.p, &st);
            EXPECT_EQ(st.nranks, P);
            EXPECT_EQ(st.nbuckets, 3);
            EXPECT_EQ(st.matrix_elems, NM);
            EXPECT_EQ(st.elementwise_elems, N - NM);
            EXPECT_EQ(st.padded_elems, lay == loomShardRows ? pad : N);
            EXPECT_EQ(st.padded_matrix_elems, lay == loomShardRows ? padm : NM);
            const double base = (P - 1.0) / P * (2.0 * (double)pad + (double)padm) * 4;
            EXPECT_DOUBLE_EQ(st.baseline_step_bytes_per_rank, base);
            EXPECT_DOUBLE_EQ(st.step_bytes_per_rank,
                             lay == loomShardRows ? base : 2.0 * (P - 1.0) / P * (double)N * 4);
            double maxb = 0, sumb = 0;
            for (int r = 0; r < P; r++) {
                loomShardRankInfo_t ri;
                loomShardRankInfo(g.p, r, &ri);
                EXPECT_EQ(ri.owned_bytes, 4 * (2 * ri.shard_elems + ri.state_elems));
                if (lay != loomShardOwner) {
                    EXPECT_EQ(ri.nmatrices, 7);
                }
                maxb = std::max(maxb, (double)ri.owned_bytes);
                sumb += (double)ri.owned_bytes;
            }
            EXPECT_DOUBLE_EQ(st.bytes_imbalance, maxb / (sumb / P));
        }
    }
}

TEST(ShardPlan, S14PackUnpackRoundTrip)
{
    Rng rng(14);
    for (int t = 0; t < 50; t++) {
        const int P = 1 + (int)rng.Below(8);
        const auto list = RandomList(rng, 60, 30, P, true);
        const loomShardConfig_t c = Cfg((loomShardLayout_t)(t % 3));
        PlanGuard g;
        ASSERT_EQ(loomShardPlanCreate(&g.p, list.data(), (int)list.size(), P, &c), loomSuccess);
        const size_t N = Numel(list);
        std::vector<float> model(N), plan(N, -1.0f), back(N, -2.0f);
        for (size_t i = 0; i < N; i++)
            model[i] = (float)i;
        ASSERT_EQ(loomShardPack(g.p, model.data(), plan.data(), loomFloat32), loomSuccess);
        size_t at = 0;
        for (size_t i = 0; i < list.size(); i++) {
            size_t off;
            loomShardParamInfo(g.p, (int)i, nullptr, &off);
            const size_t n = list[i].rows * list[i].cols;
            ASSERT_EQ(std::memcmp(&plan[off], &model[at], n * 4), 0) << "param " << i;
            at += n;
        }
        ASSERT_EQ(loomShardUnpack(g.p, plan.data(), back.data(), loomFloat32), loomSuccess);
        ASSERT_EQ(std::memcmp(back.data(), model.data(), N * 4), 0);
    }
}

void ExpectError(loomResult_t got, loomResult_t want, const std::string &word)
{
    EXPECT_EQ(got, want) << word;
    const std::string msg = loomGetLastError(nullptr);
    EXPECT_NE(msg.find(word), std::string::npos) << "'" << word << "' not in '" << msg << "'";
}

TEST(ShardPlan, S15PlanMisuse)
{
    auto list = GptTiny();
    const int n = (int)list.size();
    loomShardPlan_t p = nullptr;
    loomShardConfig_t c = Cfg();
    ExpectError(loomShardPlanCreate(&p, nullptr, n, 2, &c), loomInvalidArgument, "params");
    ExpectError(loomShardPlanCreate(nullptr, list.data(), n, 2, &c), loomInvalidArgument, "plan");
    ExpectError(loomShardPlanCreate(&p, list.data(), 0, 2, &c), loomInvalidArgument, "nparams 0");
    ExpectError(loomShardPlanCreate(&p, list.data(), n, 0, &c), loomInvalidArgument, "nranks 0");
    struct ListCase {
        std::function<void(loomShardParam_t *)> spoil;
        const char *word;
    };
    const std::vector<ListCase> cases = {
        {[](loomShardParam_t *l) { l[7].bucket = 0; }, "param 7 has bucket 0 after bucket 1"},
        {[](loomShardParam_t *l) { l[4].owner = 2; }, "param 4 (matrix 384 x 128) has owner 2"},
        {[](loomShardParam_t *l) { l[2].owner = 0; }, "param 2 is element-wise but has owner 0"},
        {[](loomShardParam_t *l) { l[3].cols = 0; }, "param 3 has a zero shape"},
        {[](loomShardParam_t *l) { l[3].rows = l[3].cols = (size_t)1 << 40; },
         "param 3 (1099511627776 x 1099511627776) overflows"},
        {[](loomShardParam_t *l) { l[5].kind = (loomShardKind_t)7; }, "param 5 has kind 7"},
    };
    for (const auto &k : cases) {
        auto bad = list;
        k.spoil(bad.data());
        ExpectError(loomShardPlanCreate(&p, bad.data(), n, 2, &c), loomInvalidArgument, k.word);
    }
    struct ConfigCase {
        std::function<void(loomShardConfig_t *)> spoil;
        loomResult_t want;
        const char *word;
    };
    const std::vector<ConfigCase> configs = {
        {[](loomShardConfig_t *x) { x->size = 8; }, loomInvalidUsage, "size 8"},
        {[](loomShardConfig_t *x) { x->magic = 1; }, loomInvalidUsage, "magic 0x1"},
        {[](loomShardConfig_t *x) { x->version = 3; }, loomInvalidUsage, "version 3"},
        {[](loomShardConfig_t *x) { x->ns_steps = 0; }, loomInvalidUsage, "ns_steps 0"},
        {[](loomShardConfig_t *x) { x->layout = (loomShardLayout_t)3; }, loomInvalidArgument,
         "layout 3"},
        {[](loomShardConfig_t *x) { x->balance = (loomShardBalance_t)3; }, loomInvalidArgument,
         "balance 3"},
    };
    for (const auto &k : configs) {
        loomShardConfig_t cc = c;
        k.spoil(&cc);
        ExpectError(loomShardPlanCreate(&p, list.data(), n, 2, &cc), k.want, k.word);
    }
    EXPECT_EQ(p, nullptr);
    // NULL config: the defaults.
    ASSERT_EQ(loomShardPlanCreate(&p, list.data(), n, 2, nullptr), loomSuccess);
    std::vector<float> a(Numel(list)), b(Numel(list));
    ExpectError(loomShardPack(p, nullptr, b.data(), loomFloat32), loomInvalidArgument, "NULL");
    ExpectError(loomShardUnpack(p, a.data(), nullptr, loomFloat32), loomInvalidArgument, "NULL");
    ExpectError(loomShardPack(p, a.data(), b.data(), loomBfloat16), loomInvalidArgument,
                "datatype 9");
    ExpectError(loomShardPack(p, a.data(), a.data() + 1, loomFloat32), loomInvalidArgument,
                "overlap");
    ExpectError(loomShardParamInfo(p, n, nullptr, nullptr), loomInvalidArgument,
                "param " + std::to_string(n));
    loomShardRankInfo_t ri;
    ExpectError(loomShardRankInfo(p, 2, &ri), loomInvalidArgument, "rank 2");
    EXPECT_EQ(loomShardStateElems(p, 2), 0u);
    EXPECT_EQ(loomShardStateElems(nullptr, 0), 0u);
    ExpectError(loomShardStats(nullptr, nullptr), loomInvalidArgument, "plan is NULL");
    EXPECT_EQ(loomShardPlanDestroy(p), loomSuccess);
}

} // namespace

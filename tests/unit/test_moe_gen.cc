/* SPDX-License-Identifier: Apache-2.0
 *
 * test_moe_gen.cc - unit tests of the synthetic routing generators and the row counts
 * (src/moe/moe_gen.h): determinism for a seed (pinned for uniform routing, which uses no libm);
 * rows without a repeated expert and with weights that are a distribution; the planted model's
 * in-group count, inter-layer affinity, masking and Zipf popularity within 4 standard errors of
 * their exact expectations; text-driven groups as functions of the text; uniform routing's
 * distinct ranks per token against the closed form (the dedup table of the design, T6); and the
 * row counts and the closed form against brute force on small random cases.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "debug.h"
#include "moe_gen.h"
}

namespace {

loom_moe_gen_t Model(uint32_t e, uint32_t k, uint32_t g, double rho, uint64_t seed)
{
    loom_moe_gen_t m{};
    m.num_experts = e;
    m.top_k = k;
    m.num_groups = g;
    m.rho = rho;
    m.seed = seed;
    return m;
}

uint64_t Fnv(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ static_cast<const uint8_t *>(p)[i]) * 0x100000001b3ULL;
    return h;
}

// Checks ids, no repeats, and weights: positive, largest first, summing to 1 over kept slots.
void ExpectRows(const std::vector<int32_t> &topk, const std::vector<float> &w, uint32_t e,
                uint32_t k)
{
    for (size_t t = 0; t < topk.size() / k; t++) {
        std::set<int32_t> seen;
        double sum = 0;
        float prev = 2.0f;
        size_t kept = 0;
        for (uint32_t j = 0; j < k; j++) {
            int32_t x = topk[t * k + j];
            float wj = w[t * k + j];
            if (x < 0) {
                ASSERT_EQ(x, -1);
                ASSERT_EQ(wj, 0.0f);
                continue;
            }
            ASSERT_LT(static_cast<uint32_t>(x), e);
            ASSERT_TRUE(seen.insert(x).second) << "token " << t << " repeats expert " << x;
            ASSERT_GT(wj, 0.0f);
            ASSERT_LE(wj, prev);
            prev = wj;
            sum += wj;
            kept++;
        }
        if (kept) {
            ASSERT_NEAR(sum, 1.0, 1e-5);
        }
    }
}

TEST(MoeGen, DeterministicForASeed)
{
    loom_moe_gen_t m = Model(64, 6, 8, 0.8, 42);
    m.zipf_alpha = 0.7;
    m.rho_layer = 0.5;
    m.mask = 0.1;
    const size_t t = 500, l = 3, n = t * l * 6;
    std::vector<int32_t> a(n), b(n), c(n);
    std::vector<float> wa(n), wb(n);
    std::vector<uint32_t> ga(t * l), gb(t * l);
    ASSERT_EQ(loom_moe_gen_planted(&m, t, l, a.data(), wa.data(), ga.data()), loomSuccess);
    ASSERT_EQ(loom_moe_gen_planted(&m, t, l, b.data(), wb.data(), gb.data()), loomSuccess);
    EXPECT_EQ(a, b);
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), n * 4), 0);
    EXPECT_EQ(ga, gb);
    // Asking for no weights or groups draws the same experts.
    ASSERT_EQ(loom_moe_gen_planted(&m, t, l, c.data(), nullptr, nullptr), loomSuccess);
    EXPECT_EQ(a, c);
    m.seed = 43;
    ASSERT_EQ(loom_moe_gen_planted(&m, t, l, c.data(), nullptr, nullptr), loomSuccess);
    EXPECT_NE(a, c);

    // Uniform routing goes through no libm function: the same bits on every machine.
    std::vector<int32_t> u(1000 * 8);
    ASSERT_EQ(loom_moe_gen_uniform(256, 8, 1000, 7, u.data(), nullptr), loomSuccess);
    EXPECT_EQ(Fnv(u.data(), u.size() * 4), 0xb8d93fdd140a1f16ULL)
        << std::hex << Fnv(u.data(), u.size() * 4);
}

TEST(MoeGen, RowsAreValid)
{
    struct {
        uint32_t e, k, g;
        double rho, alpha, mask;
    } cases[] = {{64, 6, 8, 0.8, 0, 0},       {64, 10, 8, 1.0, 0, 0}, {16, 16, 4, 1.0, 1.5, 0},
                 {300, 8, 30, 0.5, 1.0, 0.3}, {1, 1, 1, 1.0, 0, 0},   {9, 4, 9, 0.9, 8.0, 0}};
    for (const auto &c : cases) {
        SCOPED_TRACE(std::to_string(c.e) + "/" + std::to_string(c.k) + "/" + std::to_string(c.g));
        loom_moe_gen_t m = Model(c.e, c.k, c.g, c.rho, 3);
        m.zipf_alpha = c.alpha;
        m.mask = c.mask;
        const size_t t = 2000;
        std::vector<int32_t> topk(t * 2 * c.k);
        std::vector<float> w(topk.size());
        ASSERT_EQ(loom_moe_gen_planted(&m, t, 2, topk.data(), w.data(), nullptr), loomSuccess);
        ExpectRows(topk, w, c.e, c.k);
    }
    std::vector<int32_t> topk(3000 * 5);
    std::vector<float> w(topk.size());
    ASSERT_EQ(loom_moe_gen_uniform(20, 5, 3000, 1, topk.data(), w.data()), loomSuccess);
    ExpectRows(topk, w, 20, 5);
}

// Exact law of a token's in-group count with uniform popularity: after j slots with m of them
// in a group of s experts, slot j is in the group with probability rho + (1 - rho)(s - m)/(E - j)
// while the group has experts left, else 0. Returns the mean and variance.
std::pair<double, double> InGroupLaw(uint32_t e, uint32_t k, uint32_t s, double rho)
{
    std::vector<double> p(k + 1, 0.0);
    p[0] = 1;
    for (uint32_t j = 0; j < k; j++) {
        std::vector<double> q(k + 1, 0.0);
        for (uint32_t m = 0; m <= j; m++) {
            double in = m < s ? rho + (1 - rho) * (s - m) / static_cast<double>(e - j) : 0.0;
            q[m + 1] += p[m] * in;
            q[m] += p[m] * (1 - in);
        }
        p = q;
    }
    double mean = 0, sq = 0;
    for (uint32_t m = 0; m <= k; m++) {
        mean += m * p[m];
        sq += double(m) * m * p[m];
    }
    return {mean, sq - mean * mean};
}

TEST(MoeGen, PlantedInGroupCountMatchesItsLaw)
{
    struct {
        uint32_t e, k, g;
        double rho;
    } cases[] = {{64, 6, 8, 0.8}, {64, 6, 8, 0.0}, {60, 10, 8, 0.5}, {64, 2, 16, 0.9}};
    for (const auto &c : cases) {
        SCOPED_TRACE(std::to_string(c.e) + "/" + std::to_string(c.k) + "/" + std::to_string(c.g) +
                     " rho " + std::to_string(c.rho));
        loom_moe_gen_t m = Model(c.e, c.k, c.g, c.rho, 11);
        const size_t t = 40000;
        std::vector<int32_t> topk(t * c.k);
        std::vector<uint32_t> group(t), expert_group(c.e);
        ASSERT_EQ(loom_moe_gen_planted(&m, t, 1, topk.data(), nullptr, group.data()), loomSuccess);
        ASSERT_EQ(loom_moe_gen_groups(&m, 0, expert_group.data()), loomSuccess);
        std::vector<uint32_t> size(c.g, 0);
        for (uint32_t x : expert_group)
            size[x]++;
        for (uint32_t s : size) // near-equal groups
            ASSERT_LE(s - c.e / c.g, 1u);
        double got = 0, mean = 0, var = 0;
        for (size_t i = 0; i < t; i++) {
            for (uint32_t j = 0; j < c.k; j++)
                got += expert_group[topk[i * c.k + j]] == group[i];
            auto law = InGroupLaw(c.e, c.k, size[group[i]], c.rho);
            mean += law.first;
            var += law.second;
        }
        EXPECT_NEAR(got, mean, 4 * std::sqrt(var)) << "expected " << mean / t << " per token";
    }
}

TEST(MoeGen, PlantedRhoOneAndSmallKStaysInTheGroup)
{
    loom_moe_gen_t m = Model(64, 8, 8, 1.0, 5);
    const size_t t = 3000;
    std::vector<int32_t> topk(t * 8 * 2);
    std::vector<uint32_t> group(t * 2), eg0(64), eg1(64);
    ASSERT_EQ(loom_moe_gen_planted(&m, t, 2, topk.data(), nullptr, group.data()), loomSuccess);
    ASSERT_EQ(loom_moe_gen_groups(&m, 0, eg0.data()), loomSuccess);
    ASSERT_EQ(loom_moe_gen_groups(&m, 1, eg1.data()), loomSuccess);
    EXPECT_NE(eg0, eg1); // each layer has its own partition
    for (size_t i = 0; i < t * 2; i++)
        for (uint32_t j = 0; j < 8; j++)
            ASSERT_EQ((i < t ? eg0 : eg1)[topk[i * 8 + j]], group[i]) << "token " << i;
}

TEST(MoeGen, LayerAffinityKeepsTheMappedGroup)
{
    for (double rl : {0.7, 1.0}) {
        SCOPED_TRACE(rl);
        const uint32_t g = 8;
        loom_moe_gen_t m = Model(64, 2, g, 0.9, 9);
        m.rho_layer = rl;
        const size_t t = 50000;
        std::vector<int32_t> topk(t * 2 * 2);
        std::vector<uint32_t> group(t * 2);
        ASSERT_EQ(loom_moe_gen_planted(&m, t, 2, topk.data(), nullptr, group.data()), loomSuccess);
        std::vector<std::vector<size_t>> pairs(g, std::vector<size_t>(g, 0));
        for (size_t i = 0; i < t; i++)
            pairs[group[i]][group[t + i]]++;
        std::set<size_t> image;
        size_t kept = 0;
        for (uint32_t a = 0; a < g; a++) {
            auto it = std::max_element(pairs[a].begin(), pairs[a].end());
            image.insert(static_cast<size_t>(it - pairs[a].begin()));
            kept += *it;
        }
        EXPECT_EQ(image.size(), g) << "the map between layers' groups is a permutation";
        const double p = rl + (1 - rl) / g; // kept, or drawn again onto the same group
        EXPECT_NEAR(double(kept) / t, p, 4 * std::sqrt(p * (1 - p) / t) + 1e-12);
    }
}

TEST(MoeGen, MaskAndZipfMatchTheirLaws)
{
    const size_t t = 60000;
    loom_moe_gen_t m = Model(32, 4, 4, 0.5, 13);
    m.mask = 0.25;
    std::vector<int32_t> topk(t * 4);
    std::vector<float> w(topk.size());
    ASSERT_EQ(loom_moe_gen_planted(&m, t, 1, topk.data(), w.data(), nullptr), loomSuccess);
    ExpectRows(topk, w, 32, 4);
    double masked = double(std::count(topk.begin(), topk.end(), -1)) / double(topk.size());
    EXPECT_NEAR(masked, 0.25, 4 * std::sqrt(0.25 * 0.75 / double(topk.size())));

    // k = 1 from one group: expert of popularity rank r has probability (r+1)^-a / H.
    const uint32_t e = 16;
    const double a = 1.0;
    m = Model(e, 1, 1, 0.0, 17);
    m.zipf_alpha = a;
    topk.assign(t, 0);
    ASSERT_EQ(loom_moe_gen_planted(&m, t, 1, topk.data(), nullptr, nullptr), loomSuccess);
    std::vector<double> count(e, 0);
    for (int32_t x : topk)
        count[x]++;
    std::sort(count.rbegin(), count.rend());
    double h = 0;
    for (uint32_t r = 0; r < e; r++)
        h += std::pow(r + 1.0, -a);
    for (uint32_t r = 0; r < 3; r++) {
        double p = std::pow(r + 1.0, -a) / h;
        EXPECT_NEAR(count[r] / t, p, 4 * std::sqrt(p * (1 - p) / t)) << "popularity rank " << r;
    }
}

// k = 1, no groups: the hot experts draw ratio x n / E of the selections; with k > 1 less, as
// no token takes one expert twice.
TEST(MoeGen, HotExpertsTakeTheirRatio)
{
    const size_t t = 60000;
    const uint32_t e = 64, n = 8;
    for (double ratio : {3.0, 1.0, 7.5}) {
        SCOPED_TRACE(ratio);
        loom_moe_gen_t m = Model(e, 1, 1, 0.0, 23);
        m.hot_experts = n;
        m.hot_ratio = ratio;
        std::vector<int32_t> topk(t);
        ASSERT_EQ(loom_moe_gen_planted(&m, t, 1, topk.data(), nullptr, nullptr), loomSuccess);
        double hot = double(std::count_if(topk.begin(), topk.end(),
                                          [&](int32_t x) { return x < int32_t(n); })) /
                     t;
        const double p = ratio * n / e;
        EXPECT_NEAR(hot, p, 4 * std::sqrt(p * (1 - p) / t));
    }
    loom_moe_gen_t m = Model(e, 2, 1, 0.0, 23);
    m.hot_experts = n;
    m.hot_ratio = 8; // 8 x 8 = E: all traffic on 8 experts cannot be asked for
    int32_t topk[2];
    EXPECT_EQ(loom_moe_gen_planted(&m, 1, 1, topk, nullptr, nullptr), loomInvalidArgument);
    m.hot_ratio = 0.5;
    EXPECT_EQ(loom_moe_gen_planted(&m, 1, 1, topk, nullptr, nullptr), loomInvalidArgument);
    m.hot_experts = e + 1;
    m.hot_ratio = 1;
    EXPECT_EQ(loom_moe_gen_planted(&m, 1, 1, topk, nullptr, nullptr), loomInvalidArgument);
}

TEST(MoeGen, TextClasses)
{
    EXPECT_EQ(loom_moe_text_class(' ', 'a'), 0);
    EXPECT_EQ(loom_moe_text_class('b', 'a'), 1);
    EXPECT_EQ(loom_moe_text_class('\n', 'A'), 2);
    EXPECT_EQ(loom_moe_text_class('x', '7'), 5);
    EXPECT_EQ(loom_moe_text_class(' ', ' '), 6);
    EXPECT_EQ(loom_moe_text_class('9', '\t'), 7);
    EXPECT_EQ(loom_moe_text_class('.', '\n'), 8);
    EXPECT_EQ(loom_moe_text_class('d', ','), 11);
    EXPECT_EQ(loom_moe_text_class(',', 0xc3), 12);
    EXPECT_EQ(loom_moe_text_class('Z', 0x01), 13);
}

TEST(MoeGen, TextGroupsFollowTheText)
{
    const std::string text =
        "This program is free software: you can redistribute it and/or modify it under the "
        "terms of the GNU General Public License as published by the Free Software "
        "Foundation, either version 3 of the License, or (at your option) any later version.\n"
        "  0. Definitions.\n  \"This License\" refers to version 3 of the GNU GPL.\n";
    const size_t t = text.size();
    const uint32_t e = 64, k = 4, l = 2;
    loom_moe_gen_t m = Model(e, k, 8, 1.0, 21);
    std::vector<int32_t> topk(t * k * l), again(topk.size());
    std::vector<uint32_t> group(t * l);
    std::vector<uint8_t> cls(t);
    const auto *bytes = reinterpret_cast<const uint8_t *>(text.data());
    ASSERT_EQ(loom_moe_gen_text(&m, bytes, t, l, topk.data(), nullptr, group.data(), cls.data()),
              loomSuccess);
    ASSERT_EQ(loom_moe_gen_text(&m, bytes, t, l, again.data(), nullptr, nullptr, nullptr),
              loomSuccess);
    EXPECT_EQ(topk, again);
    std::vector<uint8_t> cls0(t, 0xff); // the classes need no layer
    ASSERT_EQ(loom_moe_gen_text(&m, bytes, t, 0, nullptr, nullptr, nullptr, cls0.data()),
              loomSuccess);
    EXPECT_EQ(cls0, cls);
    for (uint32_t layer = 0; layer < l; layer++) {
        std::vector<uint32_t> eg(e);
        ASSERT_EQ(loom_moe_gen_groups(&m, layer, eg.data()), loomSuccess);
        std::map<std::tuple<int, int, int>, uint32_t> by_context;
        std::set<uint32_t> used;
        for (size_t i = 0; i < t; i++) {
            uint8_t prev = i ? bytes[i - 1] : '\n';
            uint8_t pprev = i > 1 ? bytes[i - 2] : '\n';
            ASSERT_EQ(cls[i], loom_moe_text_class(prev, bytes[i]));
            auto key =
                std::make_tuple(int(cls[i]), int(loom_moe_text_class(pprev, prev)), int(prev));
            const uint32_t gr = group[layer * t + i];
            auto ins = by_context.emplace(key, gr);
            ASSERT_EQ(ins.first->second, gr) << "byte " << i << ": same context, other group";
            used.insert(gr);
            for (uint32_t j = 0; j < k; j++) // rho 1, k <= E/G: every expert from the group
                ASSERT_EQ(eg[topk[(layer * t + i) * k + j]], gr);
        }
        EXPECT_GE(used.size(), 4u) << "text spreads over the groups";
    }
}

// The closed form against the design's table, and uniform routing against the closed form.
TEST(MoeGen, UniformDistinctRanksMatchTheClosedForm)
{
    struct {
        uint32_t e, g, k;
        double table;
    } cases[] = {{64, 8, 2, 1.8889},   {64, 8, 6, 4.5355},   {64, 8, 8, 5.4326},
                 {128, 16, 6, 5.2242}, {256, 32, 8, 7.2668}, {8, 8, 1, 1.0}};
    for (const auto &c : cases) {
        SCOPED_TRACE(std::to_string(c.e) + "/" + std::to_string(c.g) + "/" + std::to_string(c.k));
        std::vector<int32_t> place(c.e);
        for (uint32_t x = 0; x < c.e; x++)
            place[x] = static_cast<int32_t>(x / (c.e / c.g));
        double expect = 0;
        ASSERT_EQ(loom_moe_expected_distinct_ranks(place.data(), c.e, c.g, c.k, &expect),
                  loomSuccess);
        EXPECT_NEAR(expect, c.table, 5e-5);
        const size_t t = 100000;
        std::vector<int32_t> topk(t * c.k);
        ASSERT_EQ(loom_moe_gen_uniform(c.e, c.k, t, 1000 + c.e + c.k, topk.data(), nullptr),
                  loomSuccess);
        double sum = 0, sq = 0;
        for (size_t i = 0; i < t; i++) {
            std::set<int32_t> ranks;
            for (uint32_t j = 0; j < c.k; j++)
                ranks.insert(place[topk[i * c.k + j]]);
            sum += double(ranks.size());
            sq += double(ranks.size()) * double(ranks.size());
        }
        const double mean = sum / t, sd = std::sqrt(std::max(0.0, sq / t - mean * mean));
        EXPECT_NEAR(mean, expect, 4 * sd / std::sqrt(double(t)) + 1e-12);
        loom_moe_rows_t rows{};
        ASSERT_EQ(loom_moe_rows_count(topk.data(), t, c.k, c.e, place.data(), c.g, nullptr, nullptr,
                                      &rows),
                  loomSuccess);
        EXPECT_EQ(double(rows.rows), sum);
    }
}

// The closed form against every k-subset of a small uneven placement.
TEST(MoeGen, ClosedFormAgainstEnumeration)
{
    std::mt19937_64 rng(3);
    for (int rep = 0; rep < 40; rep++) {
        const uint32_t e = 1 + rng() % 10, nranks = 1 + rng() % 4, k = 1 + rng() % e;
        std::vector<int32_t> place(e);
        for (auto &p : place)
            p = static_cast<int32_t>(rng() % nranks);
        double sum = 0, subsets = 0;
        for (uint32_t mask = 0; mask < (1u << e); mask++) {
            if (static_cast<uint32_t>(__builtin_popcount(mask)) != k)
                continue;
            std::set<int32_t> ranks;
            for (uint32_t x = 0; x < e; x++)
                if (mask >> x & 1)
                    ranks.insert(place[x]);
            sum += double(ranks.size());
            subsets++;
        }
        double expect = 0;
        ASSERT_EQ(loom_moe_expected_distinct_ranks(place.data(), e, nranks, k, &expect),
                  loomSuccess);
        EXPECT_NEAR(expect, sum / subsets, 1e-12) << "E " << e << " ranks " << nranks << " k " << k;
    }
}

TEST(MoeGen, RowCountsAgainstBruteForce)
{
    std::mt19937_64 rng(5);
    for (int rep = 0; rep < 300; rep++) {
        const uint32_t e = 1 + rng() % 40, k = 1 + rng() % e, nranks = 1 + rng() % 9;
        const size_t t = rng() % 60;
        loom_moe_gen_t m = Model(e, k, 1 + rng() % e, 0.5, rng());
        m.mask = 0.2;
        std::vector<int32_t> topk(t * k), place(e), home(t);
        ASSERT_EQ(loom_moe_gen_planted(&m, t, 1, topk.data(), nullptr, nullptr), loomSuccess);
        for (auto &p : place)
            p = static_cast<int32_t>(rng() % nranks);
        for (auto &h : home)
            h = static_cast<int32_t>(rng() % nranks);
        for (bool with_home : {true, false}) {
            uint64_t pairs = 0, local = 0, rows = 0, remote = 0;
            std::vector<uint64_t> to(nranks, 0);
            for (size_t i = 0; i < t; i++) {
                std::set<int32_t> ranks;
                for (uint32_t j = 0; j < k; j++) {
                    int32_t x = topk[i * k + j];
                    if (x < 0)
                        continue;
                    pairs++;
                    local += with_home && place[x] == home[i];
                    ranks.insert(place[x]);
                }
                rows += ranks.size();
                for (int32_t r : ranks)
                    if (!with_home || r != home[i]) {
                        remote++;
                        to[r]++;
                    }
            }
            loom_moe_rows_t got{};
            std::vector<uint64_t> got_to(nranks, 99);
            ASSERT_EQ(loom_moe_rows_count(topk.data(), t, k, e, place.data(), nranks,
                                          with_home ? home.data() : nullptr, got_to.data(), &got),
                      loomSuccess);
            EXPECT_EQ(got.pairs, pairs);
            EXPECT_EQ(got.pairs_local, local);
            EXPECT_EQ(got.rows_naive_remote, pairs - local);
            EXPECT_EQ(got.rows, rows);
            EXPECT_EQ(got.rows_remote, remote);
            EXPECT_EQ(got_to, to);
            EXPECT_EQ(got.rows_max_to_rank, *std::max_element(to.begin(), to.end()));
        }
    }
}

TEST(MoeGen, BadArgumentsRefused)
{
    int32_t topk[8] = {0};
    loom_moe_gen_t bad[] = {Model(8, 9, 1, 0, 1),  Model(8, 2, 0, 0, 1),     Model(8, 2, 9, 0, 1),
                            Model(0, 1, 1, 0, 1),  Model(40000, 1, 1, 0, 1), Model(8, 2, 2, NAN, 1),
                            Model(8, 2, 2, 1.5, 1)};
    for (const auto &m : bad) {
        loom_clear_last_error();
        EXPECT_EQ(loom_moe_gen_planted(&m, 4, 1, topk, nullptr, nullptr), loomInvalidArgument);
        EXPECT_STRNE(loom_last_error(), "");
    }
    loom_moe_gen_t m = Model(8, 2, 2, 0, 1);
    m.zipf_alpha = 9;
    EXPECT_EQ(loom_moe_gen_planted(&m, 4, 1, topk, nullptr, nullptr), loomInvalidArgument);
    m.zipf_alpha = 0;
    m.mask = -0.1;
    EXPECT_EQ(loom_moe_gen_planted(&m, 4, 1, topk, nullptr, nullptr), loomInvalidArgument);
    EXPECT_EQ(loom_moe_gen_text(&m, nullptr, 4, 1, topk, nullptr, nullptr, nullptr),
              loomInvalidArgument);

    int32_t place[4] = {0, 1, 1, 0}, home[2] = {0, 1};
    int32_t ids[4] = {0, 3, 2, -1};
    loom_moe_rows_t rows{};
    rows.pairs = 77;
    auto count = [&] { return loom_moe_rows_count(ids, 2, 2, 4, place, 2, home, nullptr, &rows); };
    place[2] = 2;
    EXPECT_EQ(count(), loomInvalidArgument);
    place[2] = 1;
    ids[1] = 4;
    EXPECT_EQ(count(), loomInvalidArgument);
    ids[1] = -2;
    EXPECT_EQ(count(), loomInvalidArgument);
    ids[1] = 3;
    home[1] = 2;
    EXPECT_EQ(count(), loomInvalidArgument);
    EXPECT_EQ(rows.pairs, 77u) << "outputs are written only on success";
    home[1] = 1;
    EXPECT_EQ(count(), loomSuccess);
    EXPECT_EQ(rows.pairs, 3u);
    double x = 0;
    EXPECT_EQ(loom_moe_expected_distinct_ranks(place, 4, 2, 5, &x), loomInvalidArgument);
    place[0] = -1;
    EXPECT_EQ(loom_moe_expected_distinct_ranks(place, 4, 2, 2, &x), loomInvalidArgument);
}

} // namespace

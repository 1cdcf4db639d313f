/* SPDX-License-Identifier: Apache-2.0
 *
 * test_cost_model.cc - unit tests of the algorithm choice (cost_model.h and
 * loom_algo_pick in algo_select.c) with synthetic and default constants: ties
 * go to the earlier table row and inapplicable rows never win; over growing
 * sizes every algorithm is chosen on one interval (monotone thresholds);
 * thresholds move up as latency gets dearer; the crossovers match the
 * textbook formulas (Thakur, Rabenseifner and Gropp 2005); small calls get
 * log-latency algorithms and large calls bandwidth-optimal ones; a few costs
 * worked out by hand from docs/ALGORITHMS.md's T = steps a + msgs o + bytes b
 * + reduced g and its table's columns; the LOOM_COST_<CLASS> syntax; the shm
 * family's variant at sizes where docs/shm-collectives.md says which one runs.
 * Single process, no peers; meson's 'unit' suite.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "coll.h"
#include "cost_model.h"
#include "net_auto.h"
extern "C" {
#include "param.h"
#include "shm/shm_coll.h"
}

namespace {

loom_link_cost_t Link(double alpha_ns, double beta_ns, double gamma_ns, double o_ns = 0)
{
    loom_link_cost_t l{}; // every source builtin
    l.cls = LOOM_LINK_SHM;
    l.alpha_ns = alpha_ns;
    l.beta_ns = beta_ns;
    l.beta_one_ns = beta_ns; // full duplex: the textbook model's one beta
    l.gamma_ns = gamma_ns;
    l.o_ns = o_ns;
    return l;
}

loom_cost_call_t Call(int n, double bytes, double acc_ratio = 1.0)
{
    return {n,         bytes,
            acc_ratio, size_t{1} << 19,
            4,         1,
            0,         1,
            0,         loom_link_cost_builtin(LOOM_LINK_SHM),
            0.0,  // no cache known: no cold bytes
            0.0}; // even blocks
}

// A call on hosts x ppn ranks.
loom_cost_call_t HostsCall(int hosts, int ppn, double bytes)
{
    loom_cost_call_t c = Call(hosts * ppn, bytes);
    c.nhosts = hosts;
    c.ppn = ppn;
    return c;
}

// The network rows of the table: the shm rows lead it and, on the shm link class, win
// whenever the communicator has an arena; these tests are about the model's choice among the
// rest.
const loom_algo_t *NetTable(int *n_p)
{
    int n = 0;
    const loom_algo_t *t = loom_algo_table(&n);
    while (n > 0 && std::string(t->name).rfind("shm", 0) == 0) {
        t++;
        n--;
    }
    *n_p = n;
    return t;
}

const loom_algo_t *Pick(loom_coll_kind_t kind, const loom_cost_call_t &c, const loom_link_cost_t &l)
{
    int n = 0;
    const loom_algo_t *t = NetTable(&n);
    return loom_algo_pick(t, n, kind, &c, &l, nullptr);
}

std::string PickName(loom_coll_kind_t kind, const loom_cost_call_t &c, const loom_link_cost_t &l)
{
    const loom_algo_t *a = Pick(kind, c, l);
    return a ? a->name : "(none)";
}

double CostA(const loom_cost_call_t *, const loom_link_cost_t *l)
{
    return l->alpha_ns;
}
double CostB(const loom_cost_call_t *, const loom_link_cost_t *l)
{
    return l->alpha_ns;
}
double CostNa(const loom_cost_call_t *, const loom_link_cost_t *)
{
    return LOOM_COST_NA;
}
double CostCheap(const loom_cost_call_t *, const loom_link_cost_t *)
{
    return 1.0;
}

constexpr loom_coll_kind_t kChoosing[] = {LOOM_COLL_ALLREDUCE,      LOOM_COLL_ALLGATHER,
                                          LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_BCAST,
                                          LOOM_COLL_REDUCE,         LOOM_COLL_ALLTOALL};

TEST(CostModel, TiesGoToTheEarlierRow)
{
    const loom_algo_t table[] = {
        {LOOM_COLL_ALLREDUCE, "first", nullptr, CostA, LOOM_ORDER_RANK},
        {LOOM_COLL_ALLREDUCE, "second", nullptr, CostB, LOOM_ORDER_RANK},
        {LOOM_COLL_ALLGATHER, "other", nullptr, CostCheap, LOOM_ORDER_RANK},
    };
    const loom_cost_call_t c = Call(4, 1024);
    const loom_link_cost_t l = Link(5, 1, 1);
    double cost = -1;
    const loom_algo_t *a = loom_algo_pick(table, 3, LOOM_COLL_ALLREDUCE, &c, &l, &cost);
    ASSERT_NE(a, nullptr);
    EXPECT_STREQ(a->name, "first");
    EXPECT_EQ(cost, 5.0);
    const loom_algo_t swapped[] = {table[1], table[0]};
    EXPECT_STREQ(loom_algo_pick(swapped, 2, LOOM_COLL_ALLREDUCE, &c, &l, nullptr)->name, "second");
    // With every constant 0 every real algorithm costs 0: the first row of each collective wins.
    int n = 0;
    const loom_algo_t *real = NetTable(&n);
    const loom_link_cost_t zero = Link(0, 0, 0);
    for (loom_coll_kind_t kind : kChoosing) {
        const loom_algo_t *first = nullptr;
        for (int i = 0; i < n && first == nullptr; i++)
            if (real[i].kind == kind)
                first = &real[i];
        EXPECT_EQ(Pick(kind, Call(8, 1 << 20), zero), first) << loom_coll_name(kind);
    }
}

TEST(CostModel, InapplicableRowsNeverWin)
{
    const loom_algo_t table[] = {
        {LOOM_COLL_ALLREDUCE, "shm_only", nullptr, CostNa, LOOM_ORDER_RANK},
        {LOOM_COLL_ALLREDUCE, "slow", nullptr, CostA, LOOM_ORDER_RANK},
    };
    const loom_cost_call_t c = Call(4, 64);
    const loom_link_cost_t l = Link(1e12, 1, 1);
    EXPECT_STREQ(loom_algo_pick(table, 2, LOOM_COLL_ALLREDUCE, &c, &l, nullptr)->name, "slow");
    EXPECT_EQ(loom_algo_pick(table, 1, LOOM_COLL_ALLREDUCE, &c, &l, nullptr), nullptr);
    EXPECT_EQ(loom_algo_pick(table, 2, LOOM_COLL_BCAST, &c, &l, nullptr), nullptr);
}

// The sequence of choices from 8 B to 1 GiB (x2): no algorithm may come back after another
// one took over.
std::vector<std::string> Sweep(loom_coll_kind_t kind, int n, const loom_link_cost_t &l,
                               double acc_ratio)
{
    std::vector<std::string> seq;
    for (double b = 8; b <= 1073741824.0; b *= 2) {
        std::string name = PickName(kind, Call(n, b, acc_ratio), l);
        if (seq.empty() || seq.back() != name)
            seq.push_back(name);
    }
    return seq;
}

TEST(CostModel, ThresholdsAreMonotone)
{
    std::vector<loom_link_cost_t> links = {
        loom_link_cost_builtin(LOOM_LINK_SHM), loom_link_cost_builtin(LOOM_LINK_TCP),
        Link(1000, 0.1, 0.05), Link(100000, 2, 0.5, 5000), Link(0, 1, 0.2, 20000)};
    for (const loom_link_cost_t &l : links)
        for (loom_coll_kind_t kind : kChoosing)
            for (int n = 2; n <= 17; n++)
                for (double ar : {1.0, 2.0}) {
                    std::vector<std::string> seq = Sweep(kind, n, l, ar);
                    std::map<std::string, int> seen;
                    std::string text;
                    for (const std::string &s : seq)
                        text += s + " ";
                    for (const std::string &s : seq)
                        EXPECT_EQ(++seen[s], 1) << loom_coll_name(kind) << " n " << n << " alpha "
                                                << l.alpha_ns << ": " << text;
                }
}

// The size at which the choice first leaves the small-message algorithm.
double FirstSwitch(loom_coll_kind_t kind, int n, const loom_link_cost_t &l)
{
    std::string small = PickName(kind, Call(n, 8), l);
    for (double b = 8; b <= 1073741824.0; b *= 1.25)
        if (PickName(kind, Call(n, b), l) != small)
            return b;
    return INFINITY;
}

TEST(CostModel, ThresholdsRiseWithLatency)
{
    for (loom_coll_kind_t kind : kChoosing)
        for (int n : {4, 8, 16}) {
            double prev = 0;
            for (double alpha : {1e3, 1e4, 1e5}) {
                double t = FirstSwitch(kind, n, Link(alpha, 1.0, 0.2, alpha / 4));
                EXPECT_GE(t, prev) << loom_coll_name(kind) << " n " << n << " alpha " << alpha;
                prev = t;
            }
        }
}

// Only the named rows of the real table, to compare two algorithms alone.
std::string PickAmong(loom_coll_kind_t kind, const std::vector<std::string> &names,
                      const loom_cost_call_t &c, const loom_link_cost_t &l)
{
    int n = 0;
    const loom_algo_t *t = loom_algo_table(&n);
    std::vector<loom_algo_t> sub;
    for (int i = 0; i < n; i++)
        for (const std::string &name : names)
            if (t[i].kind == kind && name == t[i].name)
                sub.push_back(t[i]);
    const loom_algo_t *a =
        loom_algo_pick(sub.data(), static_cast<int>(sub.size()), kind, &c, &l, nullptr);
    return a ? a->name : "(none)";
}

double Crossover(loom_coll_kind_t kind, const std::vector<std::string> &names, int n,
                 const loom_link_cost_t &l)
{
    std::string small = PickAmong(kind, names, Call(n, 8), l);
    for (double b = 8; b <= 1e12; b *= 1.01)
        if (small != PickAmong(kind, names, Call(n, b), l))
            return b;
    return INFINITY;
}

TEST(CostModel, CrossoversMatchTheTextbook)
{
    // Thakur's model charges alpha per step whatever it sends: o = 0 here, reductions free,
    // sizes below the chunk so no algorithm needs rounds.
    const double alpha = 20000, beta = 0.5;
    const loom_link_cost_t l = Link(alpha, beta, 0, 0);
    // Recursive doubling (an AllGather of the raw contributions, then a local reduction in rank
    // order: lg p alpha + (p - 1) S beta) vs Rabenseifner (2 lg p alpha + 2 (p - 1) / p S beta),
    // p = 8: n* = lg p alpha / (beta (p - 1) (1 - 2/p)).
    const double rd_rhd = 3 * alpha / (beta * 7 * (1 - 2.0 / 8));
    const double got = Crossover(LOOM_COLL_ALLREDUCE, {"rd", "rhd"}, 8, l);
    EXPECT_NEAR(got / rd_rhd, 1.0, 0.02) << got << " vs " << rd_rhd;
    // Binomial vs scatter + all-gather broadcast, p = 16: lg p (alpha + S beta) against
    // (lg p + p - 1) alpha + 2 (p - 1) / p S beta with a binomial scatter; loom scatters in one
    // step, so its crossover is (p - lg p) / (p - 1) of the textbook's.
    const double bc = 15 * alpha / (beta * (4 - 2 * 15.0 / 16)) * (16 - 4) / 15.0;
    const double got3 = Crossover(LOOM_COLL_BCAST, {"binomial", "scatter_allgather"}, 16, l);
    EXPECT_NEAR(got3 / bc, 1.0, 0.02) << got3 << " vs " << bc;
    // Bruck vs pairwise all-to-all, p = 16: every exchange costs alpha in Thakur's model, i.e.
    // two messages of o = alpha / 2 here; the textbook's 2 p alpha / (beta (lg p - 2))
    // approximates Bruck's volume as n/2 lg p, so expect it within a factor of 2.
    const loom_link_cost_t lm = Link(0, beta, 0, alpha / 2);
    const double bruck = 2 * 16 * alpha / (beta * (4 - 2));
    const double got2 = Crossover(LOOM_COLL_ALLTOALL, {"bruck", "pairwise"}, 16, lm);
    EXPECT_GT(got2, bruck / 2);
    EXPECT_LT(got2, bruck * 2);
}

// docs/ALGORITHMS.md: T = steps a + msgs o + bytes b + reduced g, with the steps, the messages the
// busiest rank sends and receives, the bytes it puts on the wire (its table's column) and the
// accumulator bytes it combines or copies. Worked out by hand with a = 100 us, o = 5 us,
// b = 0.5 ns/B, g = 0.25 ns/B and the default 512 KiB chunk.
double CostOf(loom_algo_cost_fn_t fn, const loom_link_cost_t &l, int n, double bytes)
{
    const loom_cost_call_t c = Call(n, bytes);
    return fn(&c, &l);
}

TEST(CostModel, CostsWorkedOutByHand)
{
    const loom_link_cost_t l = Link(100000, 0.5, 0.25, 5000);
    const auto cost = [&l](loom_algo_cost_fn_t fn, int n, double bytes) {
        return CostOf(fn, l, n, bytes);
    };
    // AllGather direct, 4 ranks, 64 KiB gathered: one step; 3 blocks out and 3 in; (n-1)/n S =
    // 49152 bytes on the wire; its own 16 KiB block copied into place.
    // 100000 + 6 x 5000 + 49152 x 0.5 + 16384 x 0.25 = 158672 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_allgather_direct, 4, 65536), 158672.0);
    // Broadcast direct, 4 ranks, 1 MiB: the root sends the buffer to 3 ranks in one step:
    // 100000 + 3 x 5000 + 3 x 1048576 x 0.5 = 1687864 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_bcast_direct, 4, 1048576), 1687864.0);
    // AllReduce direct (two-shot), 4 ranks, 1 MiB float32: slices of 256 KiB fit one chunk, so
    // one round of two steps; 3 slices out, 3 in, 3 results out, 3 in; 2 (n-1)/n S = 1572864
    // bytes; the owner reduces 4 slices of 256 KiB = S.
    // 2 x 100000 + 12 x 5000 + 1572864 x 0.5 + 1048576 x 0.25 = 1308576 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_allreduce_direct, 4, 1048576), 1308576.0);
    // Broadcast binomial, 8 ranks, 2 MiB: L = 3, 4 segments of 512 KiB pipelined: L + 4 - 1 = 6
    // steps; the root sends each segment to its 3 children: 12 messages, L S = 6 MiB.
    // 6 x 100000 + 12 x 5000 + 6291456 x 0.5 = 3805728 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_bcast_binomial, 8, 2097152), 3805728.0);
    // AllToAll pairwise, 4 ranks, 4 KiB in all: one step; 3 blocks out and 3 in;
    // (n-1)/n S = 3072 bytes; its own 1 KiB block copied: 100000 + 30000 + 1536 + 256.
    EXPECT_DOUBLE_EQ(cost(loom_cost_alltoall_pairwise, 4, 4096), 131792.0);
}

// Past half the L2 a call's buffers no longer fit it: the share of bytes beyond costs cold_ns
// more per copy (two copies for a byte both ways, one for a byte one way or reduced), growing
// smoothly with the size; within it, or with no cache or cold cost known, nothing changes.
TEST(CostModel, ColdBytesCostMoreSmoothly)
{
    loom_link_cost_t l = Link(100000, 0.5, 0.25, 5000);
    l.beta_one_ns = 0.25;
    l.cold_ns = 0.125;
    loom_cost_call_t c = Call(2, 1 << 20);
    c.cache_bytes = 2 << 20; // fits while nbytes <= 1 MiB
    loom_link_cost_t at = loom_link_cost_for_call(&l, &c);
    EXPECT_EQ(at.beta_ns, 0.5);
    EXPECT_EQ(at.beta_one_ns, 0.25);
    EXPECT_EQ(at.gamma_ns, 0.25);
    c.nbytes = 4 << 20; // three quarters of the bytes beyond: 0.125 x 0.75 per copy
    at = loom_link_cost_for_call(&l, &c);
    EXPECT_DOUBLE_EQ(at.beta_ns, 0.5 + 2 * 0.09375);
    EXPECT_DOUBLE_EQ(at.beta_one_ns, 0.25 + 0.09375);
    EXPECT_DOUBLE_EQ(at.gamma_ns, 0.25 + 0.09375);
    EXPECT_EQ(at.alpha_ns, l.alpha_ns);
    EXPECT_EQ(at.o_ns, l.o_ns);
    double prev = 0;
    for (double bytes = 1 << 10; bytes <= (1u << 30); bytes *= 1.5) {
        c.nbytes = bytes;
        const double beta = loom_link_cost_for_call(&l, &c).beta_ns;
        EXPECT_GE(beta, prev) << bytes;
        EXPECT_LT(beta, 0.5 + 2 * 0.125) << bytes;
        prev = beta;
    }
    c.cache_bytes = 0; // unknown cache
    EXPECT_EQ(loom_link_cost_for_call(&l, &c).beta_ns, 0.5);
    c.cache_bytes = 2 << 20;
    l.cold_ns = 0; // memory as fast as the cache
    EXPECT_EQ(loom_link_cost_for_call(&l, &c).beta_ns, 0.5);
}

// A link whose one-way bytes cost half (a CPU that copies both ways in turn, as loopback TCP
// does): the algorithms whose busiest rank only sends (or only receives) pay beta_one, the
// exchanges beta.
TEST(CostModel, OneWayBytesPayBetaOne)
{
    loom_link_cost_t l = Link(100000, 0.5, 0.25, 5000);
    l.beta_one_ns = 0.25;
    const auto cost = [&l](loom_algo_cost_fn_t fn, int n, double bytes) {
        return CostOf(fn, l, n, bytes);
    };
    // Broadcast direct, 4 ranks, 1 MiB: 100000 + 3 x 5000 + 3 x 1048576 x 0.25 = 901432 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_bcast_direct, 4, 1048576), 901432.0);
    // Reduce direct, 2 ranks, 64 KiB (one chunk): one step, one message in; 65536 x 0.25 one
    // way; the root reduces 2 x 64 KiB: 100000 + 5000 + 16384 + 32768 = 154152 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_reduce_direct, 2, 65536), 154152.0);
    // Broadcast scatter + all-gather, 4 ranks, 64 KiB: the scatter's 48 KiB leave the root one
    // way, the ring's 48 KiB go both ways: 1 + 3 steps, 3 x (1 + 2) messages;
    // 4 x 100000 + 9 x 5000 + 49152 x 0.5 + 49152 x 0.25 = 481864 ns.
    EXPECT_DOUBLE_EQ(cost(loom_cost_bcast_scatter_allgather, 4, 65536), 481864.0);
    // The exchanges do not change: AllGather direct as worked out above.
    EXPECT_DOUBLE_EQ(cost(loom_cost_allgather_direct, 4, 65536), 158672.0);
}

TEST(CostModel, SmallCallsLatencyLargeCallsBandwidth)
{
    // When every message costs as much as a step, small calls take the fewest messages (log
    // depth); large calls always take a bandwidth-optimal algorithm.
    const loom_link_cost_t costly = Link(10000, 0.5, 0.1, 10000);
    for (int n : {8, 16}) {
        EXPECT_EQ(PickName(LOOM_COLL_ALLREDUCE, Call(n, 8), costly), "rd") << n;
        EXPECT_EQ(PickName(LOOM_COLL_ALLGATHER, Call(n, 8 * n), costly), "rd") << n;
        EXPECT_EQ(PickName(LOOM_COLL_BCAST, Call(n, 8), costly), "binomial") << n;
        EXPECT_EQ(PickName(LOOM_COLL_REDUCE, Call(n, 8), costly), "binomial") << n;
        EXPECT_EQ(PickName(LOOM_COLL_ALLTOALL, Call(n, 8 * n), costly), "bruck") << n;
    }
    for (const loom_link_cost_t &l :
         {costly, loom_link_cost_builtin(LOOM_LINK_SHM), loom_link_cost_builtin(LOOM_LINK_TCP)})
        for (int n : {4, 8, 16}) {
            const std::string big = PickName(LOOM_COLL_ALLREDUCE, Call(n, 1 << 30), l);
            EXPECT_TRUE(big == "ring" || big == "rhd" || big == "direct") << n << " " << big;
            EXPECT_NE(PickName(LOOM_COLL_BCAST, Call(n, 1 << 30), l), "direct") << n;
            EXPECT_EQ(PickName(LOOM_COLL_ALLTOALL, Call(n, static_cast<double>(n) * (1 << 20)), l),
                      "pairwise")
                << n;
        }
}

TEST(CostModel, OneRankCostsNothing)
{
    const loom_link_cost_t l = loom_link_cost_builtin(LOOM_LINK_TCP);
    int n = 0;
    const loom_algo_t *t = NetTable(&n); // the shm rows never run on a tcp link
    const loom_cost_call_t c = Call(1, 1 << 20);
    for (int i = 0; i < n; i++) {
        if (std::string(t[i].name).rfind("hier", 0) == 0) // one host: there is no hierarchy
            EXPECT_EQ(t[i].cost(&c, &l), LOOM_COST_NA);
        else
            EXPECT_EQ(t[i].cost(&c, &l), 0.0) << t[i].name;
    }
}

// AllGatherV and ReduceScatterV: with equal blocks (max_block S/n, or 0 for "even") they cost
// what AllGather and ReduceScatter cost; one rank holding everything makes direct's busiest
// rank send (n-1) S, so the ring, whose links carry (n-1)/n S whatever the imbalance, wins.
TEST(CostModel, UnevenCollectivesPriceTheLargestBlock)
{
    const loom_link_cost_t tcp = loom_link_cost_builtin(LOOM_LINK_TCP);
    for (const loom_link_cost_t &l : {tcp, loom_link_cost_builtin(LOOM_LINK_SHM)})
        for (int n = 2; n <= 8; n++)
            for (double S : {64.0 * n, 65536.0 * n, 16777216.0 * n}) {
                loom_cost_call_t c = Call(n, S, 2.0);
                for (double mb : {0.0, S / n}) {
                    c.max_block = mb;
                    EXPECT_EQ(loom_cost_allgatherv_direct(&c, &l),
                              loom_cost_allgather_direct(&c, &l));
                    EXPECT_EQ(loom_cost_allgatherv_ring(&c, &l), loom_cost_allgather_ring(&c, &l));
                    EXPECT_EQ(loom_cost_reduce_scatterv_direct(&c, &l),
                              loom_cost_reduce_scatter_direct(&c, &l));
                    EXPECT_EQ(loom_cost_reduce_scatterv_ring(&c, &l),
                              loom_cost_reduce_scatter_ring(&c, &l));
                }
            }
    for (int n : {4, 8}) {
        const double S = 64.0 * (1 << 20);
        loom_cost_call_t c = Call(n, S);
        c.max_block = S / n;
        EXPECT_EQ(PickName(LOOM_COLL_ALLGATHERV, c, tcp), "direct") << n;
        c.max_block = S;
        EXPECT_EQ(PickName(LOOM_COLL_ALLGATHERV, c, tcp), "ring") << n;
        EXPECT_EQ(PickName(LOOM_COLL_REDUCE_SCATTERV, c, tcp), "ring") << n;
        c.rank_order = 1; // the ring adds in its own order: only direct may run
        EXPECT_EQ(PickName(LOOM_COLL_REDUCE_SCATTERV, c, tcp), "direct") << n;
    }
}

TEST(CostModel, HierarchyOnlyAcrossHostsOfEqualSize)
{
    const loom_link_cost_t tcp = loom_link_cost_builtin(LOOM_LINK_TCP);
    for (loom_coll_kind_t kind :
         {LOOM_COLL_ALLREDUCE, LOOM_COLL_ALLGATHER, LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_BCAST}) {
        int n = 0;
        const loom_algo_t *t = NetTable(&n);
        const loom_algo_t *hier = nullptr;
        for (int i = 0; i < n; i++)
            if (t[i].kind == kind && std::string(t[i].name) == "hier")
                hier = &t[i];
        ASSERT_NE(hier, nullptr) << loom_coll_name(kind);
        // One host, one rank per host, or hosts of unequal sizes (ppn 0): never.
        for (const loom_cost_call_t &c :
             {HostsCall(1, 4, 1 << 26), HostsCall(4, 1, 1 << 26), HostsCall(2, 0, 1 << 26)})
            EXPECT_EQ(hier->cost(&c, &tcp), LOOM_COST_NA) << loom_coll_name(kind);
        // Large calls across hosts whose network is much slower than memory (1 and 2 Gbit/s:
        // 8 and 4 ns per byte): the flat algorithms move more bytes between hosts than the
        // hierarchy, so the model picks it.
        for (double beta : {8.0, 4.0}) {
            loom_link_cost_t net = tcp;
            net.beta_ns = net.beta_one_ns = beta;
            for (int hosts : {2, 3, 4})
                for (int ppn : {2, 4})
                    EXPECT_EQ(PickName(kind, HostsCall(hosts, ppn, 64.0 * (1 << 20)), net), "hier")
                        << loom_coll_name(kind) << " " << hosts << "x" << ppn << " beta " << beta;
        }
    }
}

TEST(CostModel, AllToAllvChoosesByTheLayout)
{
    // Its counts differ per rank, so nothing of the call may steer the choice: the same
    // algorithm whatever the size, hier only where the messages it saves between hosts outweigh
    // its second step, pairwise elsewhere.
    // With blocks of T/2 on average, hier wins where (H - 1)(P - 2) o > alpha.
    const loom_link_cost_t tcp = loom_link_cost_builtin(LOOM_LINK_TCP); // alpha 120, o 10 us
    for (double bytes : {0.0, 4096.0, 64.0 * (1 << 20)}) {
        for (auto [hosts, ppn] : {std::pair{2, 2}, {3, 2}, {4, 4}, {8, 2}, {2, 8}})
            EXPECT_EQ(PickName(LOOM_COLL_ALLTOALLV, HostsCall(hosts, ppn, bytes), tcp), "pairwise")
                << hosts << "x" << ppn;
        for (auto [hosts, ppn] : {std::pair{8, 4}, {4, 8}, {8, 8}, {2, 16}})
            EXPECT_EQ(PickName(LOOM_COLL_ALLTOALLV, HostsCall(hosts, ppn, bytes), tcp), "hier")
                << hosts << "x" << ppn;
    }
    // Messages that cost more than a step (o 100 us, T at its 64 KiB cap): the hierarchy pays
    // already on 2 x 2. Messages that cost nothing: its second step never does.
    loom_link_cost_t costly_msgs = tcp, free_msgs = tcp;
    costly_msgs.o_ns = 100000.0;
    free_msgs.o_ns = 0;
    for (auto [hosts, ppn] : {std::pair{2, 2}, {8, 2}, {2, 4}}) {
        EXPECT_EQ(PickName(LOOM_COLL_ALLTOALLV, HostsCall(hosts, ppn, 0), costly_msgs), "hier");
        EXPECT_EQ(PickName(LOOM_COLL_ALLTOALLV, HostsCall(hosts, ppn, 0), free_msgs), "pairwise");
    }
    // No hierarchy: pairwise, whatever the constants.
    loom_cost_call_t uneven = HostsCall(2, 0, 0);
    uneven.nranks = 5;
    for (const loom_link_cost_t &l : {tcp, costly_msgs})
        for (const loom_cost_call_t &c :
             {HostsCall(1, 4, 0), HostsCall(4, 1, 0), uneven, Call(4, 0)})
            EXPECT_EQ(PickName(LOOM_COLL_ALLTOALLV, c, l), "pairwise") << c.nhosts << "x" << c.ppn;
}

TEST(CostModel, HierarchySharesTheHostLink)
{
    // With free links inside a host, the hierarchical AllReduce of S bytes on 2 hosts x L
    // ranks costs what the flat algorithm's S/L costs between 2 ranks on a link L times
    // slower: the L ranks of a host share its link.
    loom_link_cost_t tcp = Link(0, 1.0, 0);
    tcp.cls = LOOM_LINK_TCP;
    for (int L : {2, 4}) {
        loom_cost_call_t c = HostsCall(2, L, 4.0 * (1 << 20));
        c.intra = Link(0, 0, 0);
        loom_link_cost_t slow = tcp;
        slow.beta_ns *= L;
        loom_cost_call_t pair = Call(2, 4.0 * (1 << 20) / L);
        pair.ring_depth = loom_ring_depth(LOOM_LINK_TCP, 2);
        const double flat = std::min(
            {loom_cost_allreduce_rd(&pair, &slow), loom_cost_allreduce_rhd(&pair, &slow),
             loom_cost_allreduce_ring(&pair, &slow), loom_cost_allreduce_direct(&pair, &slow)});
        EXPECT_DOUBLE_EQ(loom_cost_allreduce_hier(&c, &tcp), flat) << L;
    }
}

// Where every rank sends to every other alike (direct, pairwise), a host's ranks send
// (n - P) / (n - 1) of their bytes off the host, all through its one link: P (n - P) / (n - 1)
// times one rank's bytes cross it. On 2 hosts x 2, 4/3: direct AllReduce's 2 (3/4) S become 2 S.
TEST(CostModel, FlatAllToAllSharesTheHostLink)
{
    const loom_link_cost_t bytes_only = Link(0, 1, 0, 0);
    const double S = 1 << 20;
    const loom_cost_call_t c22 = HostsCall(2, 2, S);
    EXPECT_DOUBLE_EQ(loom_cost_allreduce_direct(&c22, &bytes_only), 2 * S);
    EXPECT_DOUBLE_EQ(loom_cost_allgather_direct(&c22, &bytes_only), S);
    EXPECT_DOUBLE_EQ(loom_cost_reduce_scatter_direct(&c22, &bytes_only), S);
    EXPECT_DOUBLE_EQ(loom_cost_alltoall_pairwise(&c22, &bytes_only), S);
    const loom_cost_call_t c32 = HostsCall(3, 2, S); // 2 * 4 / 5 = 1.6 times 5/6 S
    EXPECT_DOUBLE_EQ(loom_cost_allgather_direct(&c32, &bytes_only), S * 5 / 6 * 1.6);
    const loom_cost_call_t c41 = HostsCall(4, 1, S); // one rank per host: its own link
    EXPECT_DOUBLE_EQ(loom_cost_allgather_direct(&c41, &bytes_only), S * 3 / 4);
    const loom_cost_call_t one_host = Call(4, S);
    EXPECT_DOUBLE_EQ(loom_cost_allgather_direct(&one_host, &bytes_only), S * 3 / 4);
    // The ring crosses each host link once each way: no share.
    EXPECT_DOUBLE_EQ(loom_cost_allgather_ring(&c22, &bytes_only), S * 3 / 4);
}

TEST(CostModel, ParseConstants)
{
    loom_link_cost_t l = Link(1, 2, 3);
    ASSERT_EQ(loom_link_cost_parse("12.5,0.75,0.25", &l), 0);
    EXPECT_EQ(l.alpha_ns, 12500.0);
    EXPECT_EQ(l.beta_ns, 0.75);
    EXPECT_EQ(l.gamma_ns, 0.25);
    EXPECT_EQ(l.o_ns, 0.0);         // kept: o not given
    EXPECT_EQ(l.beta_one_ns, 0.75); // not given: one way as both ways
    ASSERT_EQ(loom_link_cost_parse("1,2,3,4.5", &l), 0);
    EXPECT_EQ(l.o_ns, 4500.0);
    ASSERT_EQ(loom_link_cost_parse("1,2,3,4.5,1.5", &l), 0);
    EXPECT_EQ(l.beta_one_ns, 1.5);
    ASSERT_EQ(loom_link_cost_parse("1,2,3,4.5,1.5,0.25", &l), 0);
    EXPECT_EQ(l.cold_ns, 0.25);
    for (const char *bad : {"", "1,2", "1,2,3,4,5,6,7", "a,b,c", "-1,2,3", "1,,3", "1,2,3x",
                            "inf,1,1", "1,2,3,", "1,2,3,4,"}) {
        loom_link_cost_t k = Link(1, 2, 3);
        EXPECT_EQ(loom_link_cost_parse(bad, &k), -1) << bad;
        EXPECT_EQ(k.alpha_ns, 1.0) << bad;
    }
    loom_link_class_t cls;
    EXPECT_EQ(loom_link_class_parse("TCP", &cls), 0);
    EXPECT_EQ(cls, LOOM_LINK_TCP);
    EXPECT_EQ(loom_link_class_parse("ucx", &cls), 0);
    EXPECT_EQ(cls, LOOM_LINK_UCX);
    EXPECT_EQ(loom_link_class_parse("rdma", &cls), -1);
}

// The rate of the link that carries a class: tcp's beta never drops below what the kernel's TCP
// reaches, ucx's is the RDMA port's, and LOOM_COST_<CLASS> stands whatever the rate.
TEST(CostModel, LinkRateSetsBeta)
{
    const double tcp_beta = loom_link_cost_builtin(LOOM_LINK_TCP).beta_ns;
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_TCP, 8.0).beta_ns, 8.0); // 1 Gbit/s
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_TCP, 0.08).beta_ns, tcp_beta);
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_TCP, -1).beta_ns, tcp_beta);
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_UCX, 0.08).beta_ns, 0.08); // 100 Gbit/s
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_UCX, 0).beta_ns,
              loom_link_cost_builtin(LOOM_LINK_UCX).beta_ns);
    EXPECT_EQ(loom_link_cost_at_rate(LOOM_LINK_SHM, 8.0).beta_ns,
              loom_link_cost_builtin(LOOM_LINK_SHM).beta_ns);
    setenv("LOOM_COST_UCX", "5,0.3,0.1", 1);
    loom_param_reset_cache();
    EXPECT_EQ(loom_link_cost_is_set(LOOM_LINK_UCX), 1);
    EXPECT_EQ(loom_link_cost_is_set(LOOM_LINK_TCP), 0);
    const loom_link_cost_t set = loom_link_cost_at_rate(LOOM_LINK_UCX, 0.08);
    EXPECT_EQ(set.beta_ns, 0.3);
    EXPECT_EQ(set.alpha_ns, 5000.0);
    unsetenv("LOOM_COST_UCX");
    loom_param_reset_cache();
}

// loom's own choice between ucx and tcp across hosts: ucx only for an RDMA port the model
// prices below the TCP interface.
TEST(CostModel, UcxAcrossHostsOnlyWhereTheModelSaysFaster)
{
    EXPECT_EQ(loom_net_prefer_ucx(10000, 100), 1); // 100 Gbit/s InfiniBand beside 10 GbE
    EXPECT_EQ(loom_net_prefer_ucx(-1, 100), 1);    // interface speed unknown
    EXPECT_EQ(loom_net_prefer_ucx(100000, 25), 1); // TCP cannot use a fast NIC's rate
    EXPECT_EQ(loom_net_prefer_ucx(10000, 0), 0);   // no RDMA port
    EXPECT_EQ(loom_net_prefer_ucx(10000, -1), 0);
    EXPECT_EQ(loom_net_prefer_ucx(10000, 1), 0);  // a 1 Gbit/s port loses to tcp's rate
    EXPECT_EQ(loom_net_prefer_ucx(1000, 2.5), 1); // ... unless the interface is slower still
    // The user's constants steer it: a UCX step priced at 10 ms never wins a 1 MiB message.
    setenv("LOOM_COST_UCX", "10000,0.01,0.1", 1);
    loom_param_reset_cache();
    EXPECT_EQ(loom_net_prefer_ucx(10000, 400), 0);
    unsetenv("LOOM_COST_UCX");
    loom_param_reset_cache();
}

TEST(CostModel, EnvironmentOverridesDefaults)
{
    setenv("LOOM_COST_TCP", "7,0.5,0.125", 1);
    setenv("LOOM_COST_SHM", "not numbers", 1);
    loom_param_reset_cache();
    const loom_link_cost_t tcp = loom_link_cost_default(LOOM_LINK_TCP);
    EXPECT_EQ(tcp.cls, LOOM_LINK_TCP);
    EXPECT_EQ(tcp.alpha_ns, 7000.0);
    EXPECT_EQ(tcp.beta_ns, 0.5);
    const loom_link_cost_t shm = loom_link_cost_default(LOOM_LINK_SHM);
    const loom_link_cost_t builtin = loom_link_cost_builtin(LOOM_LINK_SHM);
    EXPECT_EQ(shm.alpha_ns, builtin.alpha_ns); // invalid: WARNed, defaults kept
    unsetenv("LOOM_COST_TCP");
    unsetenv("LOOM_COST_SHM");
    loom_param_reset_cache();
}

} // namespace

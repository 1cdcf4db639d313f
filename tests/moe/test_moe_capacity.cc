// SPDX-License-Identifier: Apache-2.0
//
// test_moe_capacity.cc - the static capacity modes of loomMoeLayout on forked ranks (3 ranks,
// LOOM_NET=shm and tcp; rank 1 has no tokens). Error mode: every rank returns InvalidUsage with
// the same message and the true peak, the handle refuses every data call and leaves the buffers
// untouched, and a plan grown to the peak gives dropless's bits. Drop mode: the kept selections,
// the drop counters, the rows each rank receives and combine's y bitwise equal to a one-process
// reference of the grant rule (ties from weights in eighths included), in dedup and naive mode;
// the backward calls equal those of a dropless plan given the kept routing. A capacity at least
// the peak is dropless bit for bit. Bad capacity configs are InvalidArgument on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

using moetest::Batch;
using moetest::Shape;

namespace {

constexpr int kRanks = 3;

// ---- the one-process reference of the grant rule (docs/moe.md, "Capacity") --------------------

struct Row {
    size_t token;
    int slot; // naive: the row's one top-k slot; dedup: -1 (every slot of the token on dst)
};

std::vector<Row> RowsTo(const Shape &s, const Batch &b, const std::vector<int32_t> &place, int dst,
                        int mode)
{
    std::vector<Row> rows;
    size_t k = (size_t)s.top_k;
    for (size_t t = 0; t < b.tokens; t++) {
        bool any = false;
        for (size_t j = 0; j < k; j++) {
            int32_t e = b.topk[t * k + j];
            if (e < 0 || place[(size_t)e] != dst)
                continue;
            if (mode == loomMoeModeNaive)
                rows.push_back({t, (int)j});
            any = true;
        }
        if (any && mode == loomMoeModeDedup)
            rows.push_back({t, -1});
    }
    return rows;
}

bool Covers(const Row &r, size_t j)
{
    return r.slot < 0 || (size_t)r.slot == j;
}

struct Drops {
    std::vector<size_t> need;                // rows each rank would receive
    size_t peak = 0;                         // the largest of need
    std::vector<std::vector<uint8_t>> kept;  // [rank][T*k]
    std::vector<size_t> rows_dropped, pairs; // per source rank
};

Drops Reference(const Shape &s, const std::vector<Batch> &all, const std::vector<int32_t> &place,
                int mode, size_t cap)
{
    size_t G = all.size(), k = (size_t)s.top_k;
    Drops d;
    d.need.assign(G, 0);
    d.rows_dropped.assign(G, 0);
    d.pairs.assign(G, 0);
    for (const Batch &b : all) {
        std::vector<uint8_t> kept(b.topk.size());
        for (size_t i = 0; i < kept.size(); i++)
            kept[i] = b.topk[i] >= 0;
        d.kept.push_back(kept);
    }
    for (size_t dst = 0; dst < G; dst++) {
        std::vector<std::vector<Row>> rows;
        for (size_t src = 0; src < G; src++) {
            rows.push_back(RowsTo(s, all[src], place, (int)dst, mode));
            d.need[dst] += rows.back().size();
        }
        d.peak = std::max(d.peak, d.need[dst]);
        if (d.need[dst] <= cap)
            continue;
        // Shares in proportion to the requests, rounded down; the rest one each to the lowest
        // sources that asked.
        std::vector<size_t> grant(G);
        size_t given = 0;
        for (size_t src = 0; src < G; src++) {
            grant[src] = cap * rows[src].size() / d.need[dst];
            given += grant[src];
        }
        for (size_t src = 0; src < G && given < cap; src++)
            if (!rows[src].empty()) {
                grant[src]++;
                given++;
            }
        for (size_t src = 0; src < G; src++) {
            const Batch &b = all[src];
            std::vector<std::pair<float, size_t>> by_weight; // (weight, index in wire order)
            for (size_t i = 0; i < rows[src].size(); i++) {
                float w = 0.0f;
                for (size_t j = 0; j < k; j++) {
                    int32_t e = b.topk[rows[src][i].token * k + j];
                    if (e >= 0 && place[(size_t)e] == (int)dst && Covers(rows[src][i], j))
                        w += b.weights[rows[src][i].token * k + j];
                }
                by_weight.push_back({w, i});
            }
            // Heaviest first; a stable sort keeps equal weights in token order.
            std::stable_sort(by_weight.begin(), by_weight.end(),
                             [](const auto &a, const auto &b) { return a.first > b.first; });
            for (size_t i = grant[src]; i < by_weight.size(); i++) {
                const Row &r = rows[src][by_weight[i].second];
                d.rows_dropped[src]++;
                for (size_t j = 0; j < k; j++) {
                    int32_t e = b.topk[r.token * k + j];
                    if (e >= 0 && place[(size_t)e] == (int)dst && Covers(r, j)) {
                        d.kept[src][r.token * k + j] = 0;
                        d.pairs[src]++;
                    }
                }
            }
        }
    }
    return d;
}

// ---- helpers ------------------------------------------------------------------------------------

loomMoeConfig_t CapConfig(const Shape &s, const std::vector<int32_t> &place, int mode, int capacity,
                          int64_t max_recv_rows)
{
    loomMoeConfig_t cfg = moetest::Config(s, place, true, mode);
    cfg.capacity = capacity;
    cfg.max_recv_rows = max_recv_rows;
    return cfg;
}

std::vector<Batch> AllBatches(const Shape &s, int G)
{
    std::vector<Batch> all;
    for (int r = 0; r < G; r++)
        all.push_back(moetest::MakeBatch(s, r, G));
    return all;
}

// What one plan gives on one rank: layout info, received slots, y and the backward outputs.
struct Pass {
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    std::vector<int64_t> count, offset;
    std::vector<uint8_t> kept, recv_x, y, grad_x, grad_out;
    std::vector<float> grad_w;
    loomMoeStats_t stats = LOOM_MOE_STATS_INITIALIZER;
};

// Layout, kept, dispatch, the experts, combine, and both backward calls (grad_y = x, the
// expert outputs as grad_recv_x).
Pass RunPass(loomComm_t comm, int rank, const Shape &s, const std::vector<int32_t> &place,
             const loomMoeConfig_t &cfg, const Batch &b)
{
    Pass p;
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    p.count.assign((size_t)s.num_experts + 1, -1);
    p.offset = p.count;
    p.info.expert_count = p.count.data();
    p.info.expert_offset = p.offset.data();
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &p.info));
    p.kept.assign(b.topk.size() + 1, 0xee);
    XT_CHECK_LOOM(loomMoeHandleKept(h, p.kept.data()));
    p.kept.pop_back();
    size_t row = s.hidden * moetest::ElemBytes(s.dtype), slots = p.info.recv_slots;
    p.recv_x.assign(slots * row, 0xa5);
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), p.recv_x.data()));
    std::vector<uint8_t> out = moetest::RunExperts(s, place, rank, p.recv_x, p.offset, p.count);
    p.y.assign(b.tokens * row, 0x5a);
    XT_CHECK_LOOM(loomMoeCombine(h, out.data(), p.y.data()));
    p.grad_x.assign(b.tokens * row, 0x5a);
    XT_CHECK_LOOM(loomMoeDispatchBackward(h, out.data(), p.grad_x.data()));
    p.grad_out.assign(slots * row, 0x5a);
    p.grad_w.assign(b.topk.size(), -7.0f);
    XT_CHECK_LOOM(
        loomMoeCombineBackward(h, b.x.data(), out.data(), p.grad_out.data(), p.grad_w.data()));
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &p.stats, 0));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    return p;
}

std::string Describe(const Shape &s, int mode, size_t cap)
{
    return "E=" + std::to_string(s.num_experts) + " k=" + std::to_string(s.top_k) +
           " dtype=" + std::to_string((int)s.dtype) + (s.dyadic ? " dyadic" : " random") +
           (mode == loomMoeModeNaive ? " naive" : " dedup") + " seed=" + std::to_string(s.seed) +
           " max_recv_rows=" + std::to_string(cap);
}

const Shape kShapes[] = {{6, 3, 5, loomFloat32, false, true, 44},
                         {6, 3, 5, loomFloat32, false, false, 45},
                         {5, 2, 4, loomBfloat16, true, true, 46}};

// ---- drop mode
// ------------------------------------------------------------------------------------

void DropCase(loomComm_t comm, int rank, int G, const Shape &s, int mode, size_t cap)
{
    loomtest::SetContext(Describe(s, mode, cap));
    std::vector<Batch> all = AllBatches(s, G);
    std::vector<int32_t> place = moetest::Placement(s.num_experts, G, s.seed % 2 == 0, s.seed);
    Drops ref = Reference(s, all, place, mode, cap);
    const Batch &b = all[(size_t)rank];
    Pass drop = RunPass(comm, rank, s, place,
                        CapConfig(s, place, mode, loomMoeCapacityDrop, (int64_t)cap), b);
    XT_CHECK_MSG(drop.kept == ref.kept[(size_t)rank], "kept differs from the grant rule's");
    XT_CHECK_EQ(drop.info.required_rows_max, ref.peak);
    XT_CHECK_EQ(drop.info.overflowed, ref.peak > cap ? 1 : 0);
    XT_CHECK_EQ(drop.info.recv_rows, std::min(ref.need[(size_t)rank], cap));
    XT_CHECK_EQ(drop.info.rows_dropped, ref.rows_dropped[(size_t)rank]);
    XT_CHECK_EQ(drop.info.pairs_dropped, ref.pairs[(size_t)rank]);
    XT_CHECK_EQ(drop.stats.rows_dropped, ref.rows_dropped[(size_t)rank]);
    XT_CHECK_EQ(drop.stats.pairs_dropped, ref.pairs[(size_t)rank]);
    // The kept routing, with dropped selections as -1, is what every call must have used.
    Batch masked = b;
    for (size_t i = 0; i < masked.topk.size(); i++)
        if (!ref.kept[(size_t)rank][i])
            masked.topk[i] = -1;
    XT_CHECK_MSG(drop.y == moetest::Reference(s, masked, place, true),
                 "y differs from the canonical-order reference of the kept selections");
    Pass kept = RunPass(comm, rank, s, place, moetest::Config(s, place, true, mode), masked);
    XT_CHECK_EQ(drop.stats.pairs, kept.stats.pairs);
    XT_CHECK(drop.count == kept.count && drop.offset == kept.offset);
    XT_CHECK_MSG(drop.recv_x == kept.recv_x, "recv_x differs from dropless on the kept routing");
    XT_CHECK_MSG(drop.grad_x == kept.grad_x, "grad_x differs from dropless on the kept routing");
    XT_CHECK_MSG(drop.grad_out == kept.grad_out, "grad_expert_out differs");
    XT_CHECK_MSG(drop.grad_w == kept.grad_w, "grad_weights differ");
    for (size_t i = 0; i < b.topk.size(); i++)
        XT_CHECK_MSG(ref.kept[(size_t)rank][i] || drop.grad_w[i] == 0.0f,
                     "a dropped selection has a weight gradient");
}

void DropGrid(int rank, int nranks, loomComm_t comm)
{
    for (const Shape &s : kShapes) {
        Drops ref = Reference(s, AllBatches(s, nranks),
                              moetest::Placement(s.num_experts, nranks, s.seed % 2 == 0, s.seed),
                              loomMoeModeDedup, SIZE_MAX);
        XT_CHECK(ref.peak >= 4);
        for (int mode : {loomMoeModeDedup, loomMoeModeNaive})
            for (size_t cap : {ref.peak - 1, ref.peak / 2, (size_t)1, (size_t)0})
                DropCase(comm, rank, nranks, s, mode, cap);
    }
}

TEST(MoeCapacity, DropFollowsTheGrantRuleBitwise)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(kRanks, DropGrid, opts));
    }
}

// ---- error mode and ample capacity
// ------------------------------------------------------------------

// A capacity of at least the peak is dropless, bit for bit, in both static modes.
void AmpleCase(loomComm_t comm, int rank, int G, const Shape &s, int mode)
{
    std::vector<Batch> all = AllBatches(s, G);
    std::vector<int32_t> place = moetest::Placement(s.num_experts, G, true, s.seed);
    const Batch &b = all[(size_t)rank];
    size_t peak = Reference(s, all, place, mode, SIZE_MAX).peak;
    Pass dropless = RunPass(comm, rank, s, place, moetest::Config(s, place, true, mode), b);
    for (int capacity : {loomMoeCapacityError, loomMoeCapacityDrop}) {
        for (size_t cap : {peak, peak + 5}) {
            loomtest::SetContext(Describe(s, mode, cap) + " capacity=" + std::to_string(capacity));
            Pass p =
                RunPass(comm, rank, s, place, CapConfig(s, place, mode, capacity, (int64_t)cap), b);
            XT_CHECK(p.y == dropless.y && p.recv_x == dropless.recv_x &&
                     p.grad_x == dropless.grad_x && p.grad_w == dropless.grad_w &&
                     p.kept == dropless.kept);
            XT_CHECK_EQ(p.info.required_rows_max, peak);
            XT_CHECK_EQ(p.info.overflowed, 0);
            XT_CHECK_EQ(p.info.rows_dropped, 0u);
            XT_CHECK_EQ(p.stats.bytes_sent, dropless.stats.bytes_sent);
        }
    }
    // Dropless neither exchanges nor reports a peak.
    XT_CHECK_EQ(dropless.info.required_rows_max, 0u);
}

void ErrorCase(loomComm_t comm, int rank, int G, const Shape &s, int mode)
{
    std::vector<Batch> all = AllBatches(s, G);
    std::vector<int32_t> place = moetest::Placement(s.num_experts, G, true, s.seed);
    const Batch &b = all[(size_t)rank];
    Drops ref = Reference(s, all, place, mode, SIZE_MAX);
    size_t cap = ref.peak - 1;
    loomtest::SetContext(Describe(s, mode, cap) + " error mode");
    loomMoeConfig_t cfg = CapConfig(s, place, mode, loomMoeCapacityError, (int64_t)cap);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM_RES(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info),
                      loomInvalidUsage);
    int peak_rank = (int)(std::max_element(ref.need.begin(), ref.need.end()) - ref.need.begin());
    std::string want = "rank " + std::to_string(peak_rank) + " needs " + std::to_string(ref.peak) +
                       " rows > max_recv_rows " + std::to_string(cap);
    std::string msg = loomGetLastError(nullptr);
    XT_CHECK_MSG(msg.find(want) != std::string::npos, "'" + want + "' not in '" + msg + "'");
    XT_CHECK(h != nullptr);
    XT_CHECK_EQ(info.required_rows_max, ref.peak);
    XT_CHECK_EQ(info.overflowed, 1);
    XT_CHECK_EQ(info.recv_rows, ref.need[(size_t)rank]);
    loomMoeLayoutInfo_t again = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    XT_CHECK_LOOM(loomMoeHandleQuery(h, &again));
    XT_CHECK_EQ(again.required_rows_max, ref.peak);
    // Every data call refuses the handle, on every rank, and writes nothing.
    size_t row = s.hidden * moetest::ElemBytes(s.dtype);
    std::vector<uint8_t> slots(info.recv_slots * row + 1, 0xa5), y(b.tokens * row + 1, 0x5a);
    std::vector<uint8_t> slots0 = slots, y0 = y;
    std::vector<float> gw(b.topk.size() + 1, -7.0f), gw0 = gw;
    std::vector<uint8_t> kept(b.topk.size() + 1, 0xee), kept0 = kept;
    XT_CHECK_LOOM_RES(loomMoeDispatch(h, b.x.data(), slots.data()), loomInvalidUsage);
    XT_CHECK_MSG(std::string(loomGetLastError(nullptr)).find("refused on every rank") !=
                     std::string::npos,
                 loomGetLastError(nullptr));
    XT_CHECK_LOOM_RES(loomMoeCombine(h, slots.data(), y.data()), loomInvalidUsage);
    XT_CHECK_LOOM_RES(loomMoeDispatchBackward(h, slots.data(), y.data()), loomInvalidUsage);
    XT_CHECK_LOOM_RES(loomMoeCombineBackward(h, y.data(), slots.data(), slots.data(), gw.data()),
                      loomInvalidUsage);
    XT_CHECK_LOOM_RES(loomMoeHandleKept(h, kept.data()), loomInvalidUsage);
    XT_CHECK(slots == slots0 && y == y0 && gw == gw0 && kept == kept0);
    XT_CHECK_LOOM_RES(loomMoePlanDestroy(plan), loomInvalidUsage); // the handle is alive
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &st, 0));
    XT_CHECK_EQ(st.layouts, 0u); // the refused layout counts nothing
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    // Grown to the peak, the replay is dropless's.
    Pass grown = RunPass(comm, rank, s, place,
                         CapConfig(s, place, mode, loomMoeCapacityError, (int64_t)ref.peak), b);
    Pass dropless = RunPass(comm, rank, s, place, moetest::Config(s, place, true, mode), b);
    XT_CHECK(grown.y == dropless.y && grown.recv_x == dropless.recv_x);
}

void ErrorAndAmpleGrid(int rank, int nranks, loomComm_t comm)
{
    for (const Shape &s : kShapes) {
        for (int mode : {loomMoeModeDedup, loomMoeModeNaive}) {
            ErrorCase(comm, rank, nranks, s, mode);
            AmpleCase(comm, rank, nranks, s, mode);
        }
    }
}

TEST(MoeCapacity, ErrorVerdictIsEveryRanksAndAmpleCapacityIsDropless)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(kRanks, ErrorAndAmpleGrid, opts));
    }
}

// ---- configs ------------------------------------------------------------------------------------

void BadConfigs(int rank, int, loomComm_t comm)
{
    const Shape s = kShapes[0];
    std::vector<int32_t> place = moetest::Placement(s.num_experts, kRanks, false, 0);
    struct Case {
        int capacity;
        int64_t rows;
        const char *word;
    } cases[] = {{loomMoeCapacityError, -1, "max_recv_rows -1"},
                 {loomMoeCapacityDrop, -5, "max_recv_rows -5"},
                 {loomMoeCapacityDrop, LOOM_CONFIG_UNDEF_INT, "(unset)"},
                 {7, 10, "capacity 7"},
                 {loomMoeCapacityError, rank == 2 ? 11 : 10, "max_recv_rows differs"},
                 {rank == 0 ? loomMoeCapacityDrop : loomMoeCapacityError, 10, "capacity differs"}};
    for (const Case &c : cases) {
        loomtest::SetContext(c.word);
        loomMoeConfig_t cfg = CapConfig(s, place, loomMoeModeDedup, c.capacity, c.rows);
        loomMoePlan_t plan = nullptr;
        XT_CHECK_LOOM_RES(loomMoePlanCreate(&plan, &cfg, comm), loomInvalidArgument);
        XT_CHECK(plan == nullptr);
        std::string msg = loomGetLastError(nullptr);
        XT_CHECK_MSG(msg.find(c.word) != std::string::npos,
                     "'" + std::string(c.word) + "' not in '" + msg + "'");
    }
    // An older caller's structs end before the capacity fields: dropless, and the info written
    // up to its own end.
    loomMoeConfig_t cfg = CapConfig(s, place, loomMoeModeDedup, loomMoeCapacityError, -1);
    cfg.size = offsetof(loomMoeConfig_t, capacity);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    Batch b = moetest::MakeBatch(s, rank, kRanks);
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.size = offsetof(loomMoeLayoutInfo_t, required_rows_max);
    info.required_rows_max = 12345;
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info));
    XT_CHECK_EQ(info.required_rows_max, 12345u);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    st.size = offsetof(loomMoeStats_t, rows_dropped);
    st.rows_dropped = 777;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &st, 0));
    XT_CHECK_EQ(st.layouts, 1u);
    XT_CHECK_EQ(st.rows_dropped, 777u);
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

TEST(MoeCapacity, BadCapacityConfigsAreInvalidArgumentEverywhere)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}};
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, BadConfigs, opts));
}

} // namespace

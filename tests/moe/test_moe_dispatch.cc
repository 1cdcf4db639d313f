// SPDX-License-Identifier: Apache-2.0
//
// test_moe_dispatch.cc - MoE dispatch and combine on forked ranks (1 to 4; LOOM_NET=shm and
// tcp; 4 ranks also over ucx when built, and as two modelled hosts), against single-process
// references: combine's y bitwise equal to the canonical-order reference on random floats and to
// the all-experts-local reference on dyadic inputs, for float32, bfloat16 and float16, contiguous
// and random placements, uniform and planted routings (with -1 selections), zero-token ranks, ranks
// without experts and T different on every rank; naive and dedup y bitwise equal; every received
// slot holding the row its place in the canonical order names (local expert, source rank, source
// token), again after a second dispatch; and the plan's counters exact against loom_moe_rows_count
// and the wire format's sizes, and zero after a reset; and combine's bits whatever order the
// ranks reach each exchange in (a different random delay per rank before every call).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

extern "C" {
#include "moe_gen.h"
}

using moetest::Batch;
using moetest::MoeRanks;
using moetest::Shape;

namespace {

struct Run {
    std::vector<uint8_t> y;
    loomMoeStats_t stats = LOOM_MOE_STATS_INITIALIZER;
};

std::string Describe(const Shape &s, bool random_place, int mode)
{
    return "E=" + std::to_string(s.num_experts) + " k=" + std::to_string(s.top_k) +
           " dtype=" + std::to_string((int)s.dtype) + (s.planted ? " planted" : " uniform") +
           (s.dyadic ? " dyadic" : " random") + (random_place ? " random-placement" : "") +
           (mode == loomMoeModeNaive ? " naive" : " dedup") + " seed=" + std::to_string(s.seed);
}

// The slots of local expert e must hold, in order, the rows of (source rank, token) ascending
// that selected e, each an exact copy of the source's row.
void CheckSlots(const Shape &s, const std::vector<Batch> &all, const std::vector<int32_t> &place,
                int rank, const std::vector<uint8_t> &recv_x, const loomMoeLayoutInfo_t &info,
                const std::vector<int64_t> &count, const std::vector<int64_t> &offset)
{
    size_t k = (size_t)s.top_k, row = s.hidden * moetest::ElemBytes(s.dtype);
    int l = 0;
    int64_t next = 0;
    for (int e = 0; e < s.num_experts; e++) {
        if (place[(size_t)e] != rank)
            continue;
        XT_CHECK_EQ(offset[(size_t)l], next);
        int64_t slot = offset[(size_t)l];
        for (size_t src = 0; src < all.size(); src++) {
            for (size_t t = 0; t < all[src].tokens; t++) {
                bool sel = false;
                for (size_t j = 0; j < k; j++)
                    sel = sel || all[src].topk[t * k + j] == e;
                if (!sel)
                    continue;
                XT_CHECK(slot < offset[(size_t)l] + count[(size_t)l]);
                XT_CHECK_MSG(memcmp(recv_x.data() + (size_t)slot * row, all[src].x.data() + t * row,
                                    row) == 0,
                             "expert " + std::to_string(e) + " slot " + std::to_string(slot) +
                                 " should hold token " + std::to_string(t) + " of rank " +
                                 std::to_string(src));
                slot++;
            }
        }
        XT_CHECK_EQ(slot, offset[(size_t)l] + count[(size_t)l]);
        next = slot;
        l++;
    }
    XT_CHECK_EQ(l, info.num_local_experts);
    XT_CHECK_EQ((size_t)next, info.recv_slots);
}

void CheckStats(const Shape &s, const std::vector<Batch> &all, const std::vector<int32_t> &place,
                int rank, int mode, const loomMoeStats_t &st, int dispatches)
{
    const Batch &b = all[(size_t)rank];
    int G = (int)all.size();
    std::vector<int32_t> home(b.tokens, rank);
    std::vector<uint64_t> to_rank((size_t)G, 0);
    loom_moe_rows_t want{};
    XT_CHECK_LOOM(loom_moe_rows_count(b.topk.data(), b.tokens, (uint32_t)s.top_k,
                                      (uint32_t)s.num_experts, place.data(), (uint32_t)G,
                                      home.data(), to_rank.data(), &want));
    XT_CHECK_EQ(st.layouts, 1u);
    XT_CHECK_EQ(st.tokens, b.tokens);
    XT_CHECK_EQ(st.pairs, want.pairs);
    XT_CHECK_EQ(st.pairs_local, want.pairs_local);
    XT_CHECK_EQ(st.rows_naive_remote, want.rows_naive_remote);
    XT_CHECK_EQ(st.rows_dedup_remote, want.rows_remote);
    bool naive = mode == loomMoeModeNaive;
    XT_CHECK_EQ(st.rows_sent_remote, naive ? want.rows_naive_remote : want.rows_remote);
    XT_CHECK_EQ(st.rows_sent_self, naive ? want.pairs_local : want.rows - want.rows_remote);
    // The wire format (docs/moe.md): a 16-byte header per segment; dispatch rows of RowStride
    // bytes; combine rows of H float32.
    size_t stride = moetest::RowStride(s, mode);
    uint64_t sent = 0, recv = 0;
    for (int g = 0; g < G; g++) {
        if (g == rank)
            continue;
        size_t out_rows, out_pairs, in_rows, in_pairs;
        moetest::RowsBetween(s, b, place, g, mode, &out_rows, &out_pairs);
        moetest::RowsBetween(s, all[(size_t)g], place, rank, mode, &in_rows, &in_pairs);
        if (!naive)
            XT_CHECK_EQ(out_rows, to_rank[(size_t)g]);
        sent += dispatches * (16 + out_rows * stride) + 16 + in_rows * s.hidden * 4;
        recv += dispatches * (16 + in_rows * stride) + 16 + out_rows * s.hidden * 4;
    }
    XT_CHECK_EQ(st.bytes_sent, sent);
    XT_CHECK_EQ(st.bytes_recv, recv);
}

// Layout, dispatch, the experts, combine; checks the slots and the counters on the way.
Run RunOne(loomComm_t comm, int rank, int G, const Shape &s, bool random_place, int mode)
{
    loomtest::SetContext(Describe(s, random_place, mode));
    std::vector<Batch> all;
    for (int r = 0; r < G; r++)
        all.push_back(moetest::MakeBatch(s, r, G));
    for (const Batch &b : all)
        XT_CHECK_EQ(b.topk.size(), b.tokens * (size_t)s.top_k);
    std::vector<int32_t> place = moetest::Placement(s.num_experts, G, random_place, s.seed);
    loomMoeConfig_t cfg = moetest::Config(s, place, random_place, mode);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    const Batch &b = all[(size_t)rank];
    std::vector<int64_t> count((size_t)s.num_experts + 1, -1), offset(count);
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = count.data();
    info.expert_offset = offset.data();
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info));
    size_t E_s = moetest::ElemBytes(s.dtype), H = s.hidden;
    std::vector<uint8_t> recv_x(info.recv_slots * H * E_s + 1, 0xa5);
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), recv_x.data()));
    CheckSlots(s, all, place, rank, recv_x, info, count, offset);
    // A handle dispatches again (a new x, the same routing) to the same slots.
    std::vector<uint8_t> again_x(recv_x.size(), 0x3c);
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), again_x.data()));
    XT_CHECK(memcmp(again_x.data(), recv_x.data(), info.recv_slots * H * E_s) == 0);
    std::vector<uint8_t> out = moetest::RunExperts(s, place, rank, recv_x, offset, count);
    Run run;
    run.y.assign(b.tokens * H * E_s, 0x5a);
    XT_CHECK_LOOM(loomMoeCombine(h, out.data(), run.y.data()));
    loomMoeLayoutInfo_t again = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    std::vector<int64_t> count2(count.size(), -1), offset2(count.size(), -1);
    again.expert_count = count2.data();
    again.expert_offset = offset2.data();
    XT_CHECK_LOOM(loomMoeHandleQuery(h, &again));
    XT_CHECK(count2 == count && offset2 == offset);
    XT_CHECK_EQ(again.num_local_experts, info.num_local_experts);
    XT_CHECK_EQ(again.recv_slots, info.recv_slots);
    XT_CHECK_EQ(again.recv_rows, info.recv_rows);
    XT_CHECK_EQ(again.send_rows, info.send_rows);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &run.stats, 1));
    CheckStats(s, all, place, rank, mode, run.stats, 2);
    loomMoeStats_t zero = LOOM_MOE_STATS_INITIALIZER;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &zero, 0));
    XT_CHECK(zero.layouts == 0 && zero.pairs == 0 && zero.bytes_sent == 0 && zero.bytes_recv == 0);
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    XT_CHECK_MSG(run.y == moetest::Reference(s, b, place, true),
                 "y differs from the canonical-order reference");
    if (s.dyadic)
        XT_CHECK_MSG(run.y == moetest::Reference(s, b, place, false),
                     "y differs from the all-experts-local reference on exact inputs");
    return run;
}

void Grid(int rank, int nranks, loomComm_t comm)
{
    moetest::ForEachShape(nranks, 11, [&](const Shape &s, bool random_place) {
        Run dedup = RunOne(comm, rank, nranks, s, random_place, loomMoeModeDedup);
        Run naive = RunOne(comm, rank, nranks, s, random_place, loomMoeModeNaive);
        XT_CHECK_MSG(dedup.y == naive.y, "naive and dedup y differ");
    });
}

// Combine's bits against the order in which rows arrive (reference T8): every rank sleeps a
// different, seeded 0-3 ms before each of layout, dispatch and combine, so that peers reach
// each exchange in another order on every run; random float32 rows, planted routing with -1
// selections, dedup and naive. Every run's y must equal the first's and the canonical-order
// reference, bit for bit.
void ArrivalOrder(int rank, int nranks, loomComm_t comm)
{
    const moetest::Shape s = {16, 4, 40, loomFloat32, true, false, 77};
    const moetest::Batch b = moetest::MakeBatch(s, rank, nranks);
    const std::vector<int32_t> place = moetest::Placement(s.num_experts, nranks, true, 5);
    const std::vector<uint8_t> want = moetest::Reference(s, b, place, true);
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    auto nap = [&seed] {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        usleep((useconds_t)(seed % 3000));
    };
    for (int mode : {(int)loomMoeModeDedup, (int)loomMoeModeNaive})
        for (int run = 0; run < 6; run++) {
            const loomMoeConfig_t cfg = moetest::Config(s, place, true, mode);
            loomMoePlan_t plan = nullptr;
            XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
            const size_t L = place.size();
            std::vector<int64_t> count(L), offset(L);
            loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
            info.expert_count = count.data();
            info.expert_offset = offset.data();
            loomMoeHandle_t h = nullptr;
            nap();
            XT_CHECK_LOOM(
                loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info));
            std::vector<uint8_t> recv_x(info.recv_slots * s.hidden * 4);
            nap();
            XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), recv_x.data()));
            const std::vector<uint8_t> out =
                moetest::RunExperts(s, place, rank, recv_x, offset, count);
            std::vector<uint8_t> y(b.tokens * s.hidden * 4, 0x5a);
            nap();
            XT_CHECK_LOOM(loomMoeCombine(h, out.data(), y.data()));
            XT_CHECK_LOOM(loomMoeHandleDestroy(h));
            XT_CHECK_LOOM(loomMoePlanDestroy(plan));
            XT_CHECK_MSG(y == want, "run " + std::to_string(run) + " of mode " +
                                        std::to_string(mode) +
                                        ": y differs from the canonical-order reference");
        }
}

TEST_P(MoeRanks, CombineBitsDoNotDependOnArrivalOrder)
{
    RunGrid(ArrivalOrder);
}

TEST_P(MoeRanks, DispatchMatchesReferencesNaiveAndCounters)
{
    RunGrid(Grid);
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    std::get<1>(info.param);
                         });

// Every transport and the modelled-host layout, at 4 ranks: the grid's results do not depend
// on what carries the rows.
INSTANTIATE_TEST_SUITE_P(Transports, MoeRanks,
                         ::testing::Combine(::testing::Values(4), ::testing::Values(
#ifdef LOOM_HAVE_UCX
                                                                      "ucx",
#endif
                                                                      "hosts")),
                         [](const auto &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    std::get<1>(info.param);
                         });

} // namespace

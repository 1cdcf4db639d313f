// SPDX-License-Identifier: Apache-2.0
//
// test_moe_errors.cc - MoE calls fail together: bad input on one rank (an expert id >= E, an
// expert twice in a row, NULL routing, weights or rows with tokens) makes every rank return
// loomInvalidArgument within 2 s, with the outputs untouched and the next call working; plans
// that differ on one rank (E, top_k, mode, placement, an invalid config) fail every rank at
// creation, naming the field; the backward calls refuse a NULL gradient buffer on one rank, and
// a handle never dispatched, on every rank together; and the lifecycle rules (combine before
// dispatch, a plan destroyed under a live handle, structs not made by their initializers).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

namespace {

constexpr int kRanks = 3;
constexpr int kBadRank = 1;

double Seconds(std::chrono::steady_clock::time_point since)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Calls f (which returns a loomResult_t) and checks it returns `want` within 2 s.
template <typename F> void ExpectWithin2s(F f, loomResult_t want, const std::string &what)
{
    loomtest::SetContext(what);
    auto t0 = std::chrono::steady_clock::now();
    loomResult_t r = f();
    double s = Seconds(t0);
    XT_CHECK_MSG(r == want,
                 what + ": got " + loomtest::Show(r) + " (" + loomGetLastError(nullptr) + ")");
    XT_CHECK_MSG(s < 2.0, what + ": took " + std::to_string(s) + " s");
}

void ExpectLastError(const std::string &word)
{
    const std::string msg = loomGetLastError(nullptr);
    XT_CHECK_MSG(msg.find(word) != std::string::npos, "'" + word + "' not in '" + msg + "'");
}

loomMoeConfig_t Config(int E, int k, size_t H)
{
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = E;
    cfg.top_k = k;
    cfg.hidden = H;
    cfg.datatype = loomFloat32;
    return cfg;
}

// A plan, a layout, a dispatch and a combine with good input on every rank.
void GoodStep(loomMoePlan_t plan, const moetest::Batch &b, size_t H)
{
    loomMoeHandle_t h = nullptr;
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    XT_CHECK_LOOM(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info));
    std::vector<uint8_t> slots(info.recv_slots * H * 4 + 4), y(b.tokens * H * 4 + 4);
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), slots.data()));
    XT_CHECK_LOOM(loomMoeCombine(h, slots.data(), y.data()));
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
}

void BadLayout(int rank, int nranks, loomComm_t comm)
{
    moetest::Shape s{8, 3, 4, loomFloat32, false, false, 3};
    moetest::Batch b = moetest::MakeBatch(s, rank == kBadRank ? 0 : rank, nranks);
    XT_CHECK(b.tokens >= 3);
    loomMoeConfig_t cfg = Config(8, 3, 4);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    const char *cases[] = {"expert id >= E", "duplicate", "NULL topk_idx", "NULL topk_weights"};
    const char *words[] = {"outside 0..7", "twice", "is NULL", "topk_weights is NULL"};
    for (int c = 0; c < 4; c++) {
        std::vector<int32_t> topk = b.topk;
        const int32_t *tp = topk.data();
        const float *wp = b.weights.data();
        if (rank == kBadRank) {
            if (c == 0)
                topk[2 * 3 + 1] = 8;
            if (c == 1)
                topk[2 * 3 + 2] = topk[2 * 3 + 0];
            if (c == 2)
                tp = nullptr;
            if (c == 3)
                wp = nullptr;
        }
        loomMoeHandle_t h = nullptr;
        loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
        info.recv_slots = 12345;
        ExpectWithin2s([&] { return loomMoeLayout(plan, tp, wp, b.tokens, &h, &info); },
                       loomInvalidArgument, std::string("layout with ") + cases[c]);
        XT_CHECK(h == nullptr);
        XT_CHECK_EQ(info.recv_slots, 12345u);
        ExpectLastError(rank == kBadRank ? words[c] : "rank 1 refused");
        // The ranks are still in step: the next call works everywhere.
        GoodStep(plan, b, 4);
    }
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &st, 0));
    XT_CHECK_EQ(st.layouts, 4u); // the refused layouts count nothing
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

TEST(MoeErrors, BadRoutingOnOneRankFailsEveryRank)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(kRanks, BadLayout, opts));
    }
}

// E = 6, k = 2, H = 3 float32: a plan and a layout, not dispatched, where every rank has tokens
// and slots (the bad rank, which would have none, takes rank 0's batch).
struct Layout {
    moetest::Batch b;
    loomMoePlan_t plan = nullptr;
    loomMoeHandle_t h = nullptr;
    size_t slots = 0;
};

Layout SmallLayout(int rank, int nranks, loomComm_t comm)
{
    Layout lay;
    moetest::Shape s{6, 2, 3, loomFloat32, false, false, 4};
    lay.b = moetest::MakeBatch(s, rank == kBadRank ? 0 : rank, nranks);
    loomMoeConfig_t cfg = Config(6, 2, 3);
    XT_CHECK_LOOM(loomMoePlanCreate(&lay.plan, &cfg, comm));
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    XT_CHECK_LOOM(loomMoeLayout(lay.plan, lay.b.topk.data(), lay.b.weights.data(), lay.b.tokens,
                                &lay.h, &info));
    XT_CHECK(info.recv_slots > 0 && lay.b.tokens > 0);
    lay.slots = info.recv_slots;
    return lay;
}

void BadBuffers(int rank, int nranks, loomComm_t comm)
{
    Layout lay = SmallLayout(rank, nranks, comm);
    const moetest::Batch &b = lay.b;
    loomMoePlan_t plan = lay.plan;
    loomMoeHandle_t h = lay.h;
    std::vector<uint8_t> slots(lay.slots * 3 * 4, 0xa5), y(b.tokens * 3 * 4, 0x5a);
    const std::vector<uint8_t> slots0 = slots, y0 = y;
    bool bad = rank == kBadRank;
    ExpectWithin2s([&] { return loomMoeCombine(h, slots.data(), y.data()); }, loomInvalidUsage,
                   "combine before dispatch");
    ExpectWithin2s([&] { return loomMoeDispatch(h, bad ? nullptr : b.x.data(), slots.data()); },
                   loomInvalidArgument, "dispatch with x NULL on one rank");
    XT_CHECK(slots == slots0);
    ExpectLastError(bad ? "x is NULL" : "rank 1 refused");
    ExpectWithin2s([&] { return loomMoeDispatch(h, b.x.data(), bad ? nullptr : slots.data()); },
                   loomInvalidArgument, "dispatch with recv_x NULL on one rank");
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), slots.data()));
    ExpectWithin2s([&] { return loomMoeCombine(h, bad ? nullptr : slots.data(), y.data()); },
                   loomInvalidArgument, "combine with expert_out NULL on one rank");
    XT_CHECK(y == y0);
    ExpectWithin2s([&] { return loomMoeCombine(h, slots.data(), bad ? nullptr : y.data()); },
                   loomInvalidArgument, "combine with y NULL on one rank");
    XT_CHECK(y == y0);
    XT_CHECK_LOOM(loomMoeCombine(h, slots.data(), y.data()));
    XT_CHECK(y != y0);
    // A plan outlives its handles.
    XT_CHECK_LOOM_RES(loomMoePlanDestroy(plan), loomInvalidUsage);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    XT_CHECK_LOOM(loomMoeHandleDestroy(nullptr));
    XT_CHECK_LOOM(loomMoePlanDestroy(nullptr));
}

TEST(MoeErrors, BadBuffersOnOneRankFailEveryRank)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}};
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, BadBuffers, opts));
}

void BadBackward(int rank, int nranks, loomComm_t comm)
{
    Layout lay = SmallLayout(rank, nranks, comm);
    const moetest::Batch &b = lay.b;
    loomMoePlan_t plan = lay.plan;
    loomMoeHandle_t h = lay.h;
    std::vector<uint8_t> slots(lay.slots * 3 * 4, 0xa5), grad_out(slots);
    std::vector<uint8_t> grad_x(b.tokens * 3 * 4, 0x5a), grad_y(grad_x);
    std::vector<float> grad_w(b.tokens * 2, -3.0f);
    const std::vector<uint8_t> grad_out0 = grad_out, grad_x0 = grad_x;
    const std::vector<float> grad_w0 = grad_w;
    bool bad = rank == kBadRank;
    auto untouched = [&] {
        return grad_out == grad_out0 && grad_x == grad_x0 && grad_w == grad_w0;
    };
    ExpectWithin2s([&] { return loomMoeDispatchBackward(h, slots.data(), grad_x.data()); },
                   loomInvalidUsage, "dispatch backward before dispatch");
    ExpectLastError(rank == 0 ? "never dispatched" : "rank 0 refused");
    ExpectWithin2s(
        [&] {
            return loomMoeCombineBackward(h, grad_y.data(), slots.data(), grad_out.data(),
                                          grad_w.data());
        },
        loomInvalidUsage, "combine backward before dispatch");
    ExpectLastError(rank == 0 ? "never dispatched" : "rank 0 refused");
    XT_CHECK(untouched());
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), slots.data()));
    ExpectWithin2s(
        [&] { return loomMoeDispatchBackward(h, bad ? nullptr : slots.data(), grad_x.data()); },
        loomInvalidArgument, "dispatch backward with grad_recv_x NULL on one rank");
    ExpectLastError(bad ? "grad_recv_x is NULL" : "rank 1 refused");
    ExpectWithin2s(
        [&] { return loomMoeDispatchBackward(h, slots.data(), bad ? nullptr : grad_x.data()); },
        loomInvalidArgument, "dispatch backward with grad_x NULL on one rank");
    ExpectLastError(bad ? "grad_x is NULL" : "rank 1 refused");
    XT_CHECK(untouched());
    const char *names[] = {"grad_y", "expert_out", "grad_expert_out", "grad_weights"};
    for (int c = 0; c < 4; c++) {
        ExpectWithin2s(
            [&] {
                return loomMoeCombineBackward(h, bad && c == 0 ? nullptr : grad_y.data(),
                                              bad && c == 1 ? nullptr : slots.data(),
                                              bad && c == 2 ? nullptr : grad_out.data(),
                                              bad && c == 3 ? nullptr : grad_w.data());
            },
            loomInvalidArgument,
            std::string("combine backward with ") + names[c] + " NULL on one rank");
        ExpectLastError(bad ? std::string(names[c]) + " is NULL" : "rank 1 refused");
        XT_CHECK(untouched());
    }
    // The ranks are still in step: both backward calls work everywhere.
    XT_CHECK_LOOM(loomMoeDispatchBackward(h, slots.data(), grad_x.data()));
    XT_CHECK_LOOM(
        loomMoeCombineBackward(h, grad_y.data(), slots.data(), grad_out.data(), grad_w.data()));
    XT_CHECK(grad_x != grad_x0 && grad_out != grad_out0 && grad_w != grad_w0);
    XT_CHECK_LOOM_RES(loomMoeDispatchBackward(nullptr, slots.data(), grad_x.data()),
                      loomInvalidArgument);
    XT_CHECK_LOOM_RES(loomMoeCombineBackward(nullptr, grad_y.data(), slots.data(), grad_out.data(),
                                             grad_w.data()),
                      loomInvalidArgument);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

TEST(MoeErrors, BadBackwardOnOneRankFailsEveryRank)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(kRanks, BadBackward, opts));
    }
}

void Mismatch(int rank, int nranks, loomComm_t comm)
{
    std::vector<int32_t> place = moetest::Placement(8, nranks, false, 0);
    std::vector<int32_t> other = moetest::Placement(8, nranks, true, 5);
    struct Case {
        const char *name, *word;
        void (*edit)(loomMoeConfig_t *);
    };
    const Case cases[] = {
        {"num_experts", "num_experts differs",
         [](loomMoeConfig_t *c) {
             c->num_experts = 9;
             c->expert_rank = nullptr;
         }},
        {"top_k", "top_k differs", [](loomMoeConfig_t *c) { c->top_k = 3; }},
        {"hidden", "hidden differs", [](loomMoeConfig_t *c) { c->hidden = 5; }},
        {"mode", "mode differs", [](loomMoeConfig_t *c) { c->mode = loomMoeModeNaive; }},
        {"datatype", "datatype differs", [](loomMoeConfig_t *c) { c->datatype = loomBfloat16; }},
        {"placement", "expert placement differs", nullptr},
        {"magic", "invalid config", [](loomMoeConfig_t *c) { c->magic = LOOM_CONFIG_MAGIC; }},
        {"E=0", "invalid config", [](loomMoeConfig_t *c) { c->num_experts = 0; }},
    };
    for (const Case &c : cases) {
        loomMoeConfig_t cfg = Config(8, 2, 4);
        cfg.expert_rank = place.data();
        if (rank == 2 && c.edit != nullptr)
            c.edit(&cfg);
        if (rank == 0 && c.edit == nullptr)
            cfg.expert_rank = other.data();
        loomMoePlan_t plan = nullptr;
        ExpectWithin2s([&] { return loomMoePlanCreate(&plan, &cfg, comm); }, loomInvalidArgument,
                       std::string("plan with another ") + c.name + " on one rank");
        XT_CHECK(plan == nullptr);
        if (!(rank == 2 && std::string(c.word) == "invalid config"))
            ExpectLastError(c.word);
    }
    // The same plan everywhere, placement given or NULL for contiguous, is accepted.
    loomMoeConfig_t cfg = Config(8, 2, 4);
    cfg.expert_rank = rank == 0 ? place.data() : nullptr;
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

TEST(MoeErrors, PlansThatDifferFailEveryRankAtCreation)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(kRanks, Mismatch, opts));
    }
}

void Structs(int, int, loomComm_t comm)
{
    // A newer caller's larger struct: accepted with a zero tail, refused otherwise.
    struct Bigger {
        loomMoeConfig_t cfg;
        uint64_t extra;
    } big{};
    big.cfg = Config(4, 2, 2);
    big.cfg.size = sizeof(big);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &big.cfg, comm));
    big.extra = 1;
    loomMoePlan_t plan2 = nullptr;
    XT_CHECK_LOOM_RES(loomMoePlanCreate(&plan2, &big.cfg, comm), loomInvalidArgument);
    ExpectLastError("past the");
    // Output structs must come from their initializers.
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    st.magic = LOOM_MOE_LAYOUT_INFO_MAGIC;
    XT_CHECK_LOOM_RES(loomMoePlanGetStats(plan, &st, 0), loomInvalidArgument);
    ExpectLastError("LOOM_MOE_STATS_INITIALIZER");
    XT_CHECK_LOOM_RES(loomMoePlanGetStats(plan, nullptr, 0), loomInvalidArgument);
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.size = 8;
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM_RES(loomMoeLayout(plan, nullptr, nullptr, 0, &h, &info), loomInvalidArgument);
    XT_CHECK_LOOM(loomMoeLayout(plan, nullptr, nullptr, 0, &h, nullptr));
    XT_CHECK_LOOM_RES(loomMoeHandleQuery(h, &info), loomInvalidArgument);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

TEST(MoeErrors, StructsNotFromTheirInitializersAreRefused)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}};
    XT_ASSERT_RUN(loomtest::RunRanks(2, Structs, opts));
}

} // namespace

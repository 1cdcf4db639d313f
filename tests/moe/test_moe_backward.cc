// SPDX-License-Identifier: Apache-2.0
//
// test_moe_backward.cc - loomMoeDispatchBackward and loomMoeCombineBackward on forked ranks (1 to
// 4; LOOM_NET=shm and tcp), against single-process references built on the forward tests'
// batches and experts: grad_x bitwise equal to combine's canonical-order reference with every
// weight 1 (and to the all-experts-local one on dyadic inputs), every slot of grad_expert_out
// equal to w * grad_y of its (source rank, token), grad_weights equal to <grad_y, expert_out>
// summed in float32 (0 for -1 selections); float32, bfloat16 and float16, contiguous and random
// placements, zero-token ranks; naive and dedup gradients bitwise equal; the plan's byte
// counters against the wire format; and the adjoint identities <dispatch(x), g> =
// <x, dispatch_backward(g)>, <combine(o), gy> = <o, grad_o> and <combine(o), gy> = <w, grad_w>,
// exact on float32 integer inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

extern "C" {
#include "rng.h"
}

using moetest::Batch;
using moetest::Load;
using moetest::MoeRanks;
using moetest::Shape;
using moetest::Store;

namespace {

struct Grads {
    std::vector<uint8_t> grad_x, grad_out;
    std::vector<float> grad_w;
};

// The upstream gradient of rank `rank`'s y: integers in [-4, 4] on dyadic shapes, else uniform
// in [-2, 2), rounded to the datatype. Any rank can make any rank's.
std::vector<uint8_t> GradY(const Shape &s, size_t tokens, int rank)
{
    std::vector<uint8_t> g(tokens * s.hidden * moetest::ElemBytes(s.dtype));
    loom_rng_t r = loom_rng_seed(s.seed * 7919u + (uint64_t)rank + 17);
    for (size_t i = 0; i < tokens * s.hidden; i++)
        Store(s.dtype, g.data(), i,
              s.dyadic ? (float)((int)loom_rng_below(&r, 9) - 4)
                       : (float)(loom_rng_uniform(&r) * 4.0 - 2.0));
    return g;
}

// Every slot of grad_expert_out: for local expert e ascending, source rank, source token, the
// rounded w * grad_y of the pair.
void CheckGradOut(const Shape &s, const std::vector<Batch> &all,
                  const std::vector<std::vector<uint8_t>> &gy, const std::vector<int32_t> &place,
                  int rank, const std::vector<uint8_t> &grad_out)
{
    size_t k = (size_t)s.top_k, H = s.hidden, slot = 0;
    std::vector<uint8_t> want(H * moetest::ElemBytes(s.dtype));
    for (int e = 0; e < s.num_experts; e++) {
        if (place[(size_t)e] != rank)
            continue;
        for (size_t src = 0; src < all.size(); src++) {
            for (size_t t = 0; t < all[src].tokens; t++) {
                for (size_t j = 0; j < k; j++) {
                    if (all[src].topk[t * k + j] != e)
                        continue;
                    float w = all[src].weights[t * k + j];
                    for (size_t c = 0; c < H; c++)
                        Store(s.dtype, want.data(), c,
                              w * Load(s.dtype, gy[src].data(), t * H + c));
                    XT_CHECK_MSG(
                        memcmp(grad_out.data() + slot * want.size(), want.data(), want.size()) == 0,
                        "grad_expert_out slot " + std::to_string(slot) + " (expert " +
                            std::to_string(e) + ", token " + std::to_string(t) + " of rank " +
                            std::to_string(src) + ")");
                    slot++;
                }
            }
        }
    }
    XT_CHECK_EQ(slot * want.size(), grad_out.size());
}

// <grad_y[t], expert e on x[t]> in float32, columns in order; 0 for -1.
std::vector<float> RefGradW(const Shape &s, const Batch &b, const std::vector<uint8_t> &gy)
{
    size_t k = (size_t)s.top_k, H = s.hidden;
    std::vector<float> gw(b.tokens * k, 0.0f);
    for (size_t t = 0; t < b.tokens; t++) {
        for (size_t j = 0; j < k; j++) {
            int32_t e = b.topk[t * k + j];
            if (e < 0)
                continue;
            float acc = 0.0f;
            for (size_t c = 0; c < H; c++)
                acc += Load(s.dtype, gy.data(), t * H + c) *
                       moetest::Expert(s.dtype, e, Load(s.dtype, b.x.data(), t * H + c));
            gw[t * k + j] = acc;
        }
    }
    return gw;
}

// Bitwise equality of float vectors (memcmp, so that -0 and NaN compare as bits).
bool SameBits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() &&
           (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

double Dot(const Shape &s, const uint8_t *a, const uint8_t *b, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += (double)Load(s.dtype, a, i) * (double)Load(s.dtype, b, i);
    return sum;
}

// Sums v over the ranks; exact for the integer-valued sums of the adjoint checks.
std::vector<double> SumOverRanks(loomComm_t comm, std::vector<double> v)
{
    std::vector<double> out(v.size());
    XT_CHECK_LOOM(loomAllReduce(v.data(), out.data(), v.size(), loomFloat64, loomSum, comm, NULL));
    return out;
}

// The wire bytes of one dispatch backward and one combine backward (docs/moe.md): dispatch
// backward's float32 partial per received row, combine backward's dispatch rows, then one
// float32 weight gradient per pair slot of each row; a 16-byte header per segment of each.
void CheckBackwardBytes(const Shape &s, const std::vector<Batch> &all,
                        const std::vector<int32_t> &place, int rank, int mode, loomMoePlan_t plan)
{
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &st, 0));
    size_t stride = moetest::RowStride(s, mode), H4 = s.hidden * 4;
    size_t dw = 4 * (mode == loomMoeModeNaive ? 1 : (size_t)s.top_k);
    uint64_t sent = 0, recv = 0;
    for (int g = 0; g < (int)all.size(); g++) {
        if (g == rank)
            continue;
        size_t out_rows, in_rows, pairs;
        moetest::RowsBetween(s, all[(size_t)rank], place, g, mode, &out_rows, &pairs);
        moetest::RowsBetween(s, all[(size_t)g], place, rank, mode, &in_rows, &pairs);
        sent += 16 + in_rows * H4 + 16 + out_rows * stride + 16 + in_rows * dw;
        recv += 16 + out_rows * H4 + 16 + in_rows * stride + 16 + out_rows * dw;
    }
    XT_CHECK_EQ(st.bytes_sent, sent);
    XT_CHECK_EQ(st.bytes_recv, recv);
}

Grads RunOne(loomComm_t comm, int rank, int G, const Shape &s, bool random_place, int mode)
{
    loomtest::SetContext(
        "E=" + std::to_string(s.num_experts) + " k=" + std::to_string(s.top_k) +
        " dtype=" + std::to_string((int)s.dtype) + (s.dyadic ? " dyadic" : " random") +
        (random_place ? " random-placement" : "") +
        (mode == loomMoeModeNaive ? " naive" : " dedup") + " seed=" + std::to_string(s.seed));
    std::vector<Batch> all;
    std::vector<std::vector<uint8_t>> gy;
    for (int r = 0; r < G; r++) {
        all.push_back(moetest::MakeBatch(s, r, G));
        XT_CHECK_EQ(all.back().topk.size(), all.back().tokens * (size_t)s.top_k);
        gy.push_back(GradY(s, all.back().tokens, r));
    }
    std::vector<int32_t> place = moetest::Placement(s.num_experts, G, random_place, s.seed);
    loomMoeConfig_t cfg = moetest::Config(s, place, random_place, mode);
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    const Batch &b = all[(size_t)rank];
    size_t k = (size_t)s.top_k, H = s.hidden, E_s = moetest::ElemBytes(s.dtype);
    std::vector<int64_t> count((size_t)s.num_experts + 1), offset(count);
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = count.data();
    info.expert_offset = offset.data();
    loomMoeHandle_t h = nullptr;
    XT_CHECK_LOOM(loomMoeLayout(plan, b.topk.data(), b.weights.data(), b.tokens, &h, &info));
    size_t slots = info.recv_slots;
    std::vector<uint8_t> recv_x(slots * H * E_s + 1);
    XT_CHECK_LOOM(loomMoeDispatch(h, b.x.data(), recv_x.data()));
    std::vector<uint8_t> out = moetest::RunExperts(s, place, rank, recv_x, offset, count);
    std::vector<uint8_t> y(b.tokens * H * E_s + 1);
    XT_CHECK_LOOM(loomMoeCombine(h, out.data(), y.data()));

    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    XT_CHECK_LOOM(loomMoePlanGetStats(plan, &st, 1));
    // Dispatch backward of g = the expert outputs: combine with every weight 1.
    Grads gr;
    gr.grad_x.assign(b.tokens * H * E_s, 0x5a);
    XT_CHECK_LOOM(loomMoeDispatchBackward(h, out.data(), gr.grad_x.data()));
    Batch ones = b;
    for (size_t i = 0; i < ones.topk.size(); i++)
        ones.weights[i] = ones.topk[i] >= 0 ? 1.0f : 0.0f;
    XT_CHECK_MSG(gr.grad_x == moetest::Reference(s, ones, place, true),
                 "grad_x differs from the canonical-order reference");
    if (s.dyadic)
        XT_CHECK_MSG(gr.grad_x == moetest::Reference(s, ones, place, false),
                     "grad_x differs from the all-experts-local reference on exact inputs");

    gr.grad_out.assign(slots * H * E_s, 0xa5);
    gr.grad_w.assign(b.tokens * k, -7.0f);
    XT_CHECK_LOOM(loomMoeCombineBackward(h, gy[(size_t)rank].data(), out.data(), gr.grad_out.data(),
                                         gr.grad_w.data()));
    CheckGradOut(s, all, gy, place, rank, gr.grad_out);
    std::vector<float> want_w = RefGradW(s, b, gy[(size_t)rank]);
    XT_CHECK_MSG(SameBits(gr.grad_w, want_w), "grad_weights differ from <grad_y, expert_out>");

    CheckBackwardBytes(s, all, place, rank, mode, plan);

    if (s.dyadic && s.dtype == loomFloat32) {
        double wgw = 0.0;
        for (size_t i = 0; i < b.tokens * k; i++)
            wgw += (double)b.weights[i] * (double)gr.grad_w[i];
        std::vector<double> d =
            SumOverRanks(comm, {Dot(s, recv_x.data(), out.data(), slots * H),
                                Dot(s, b.x.data(), gr.grad_x.data(), b.tokens * H),
                                Dot(s, y.data(), gy[(size_t)rank].data(), b.tokens * H),
                                Dot(s, out.data(), gr.grad_out.data(), slots * H), wgw});
        XT_CHECK_MSG(d[0] == d[1], "<dispatch(x), g> = " + std::to_string(d[0]) +
                                       " but <x, dispatch_backward(g)> = " + std::to_string(d[1]));
        XT_CHECK_MSG(d[2] == d[3], "<combine(o), gy> = " + std::to_string(d[2]) +
                                       " but <o, grad_o> = " + std::to_string(d[3]));
        XT_CHECK_MSG(d[2] == d[4], "<combine(o), gy> = " + std::to_string(d[2]) +
                                       " but <w, grad_w> = " + std::to_string(d[4]));
    }
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    return gr;
}

void Grid(int rank, int nranks, loomComm_t comm)
{
    moetest::ForEachShape(nranks, 101, [&](const Shape &s, bool random_place) {
        Grads dedup = RunOne(comm, rank, nranks, s, random_place, loomMoeModeDedup);
        Grads naive = RunOne(comm, rank, nranks, s, random_place, loomMoeModeNaive);
        XT_CHECK_MSG(dedup.grad_x == naive.grad_x, "naive and dedup grad_x differ");
        XT_CHECK_MSG(dedup.grad_out == naive.grad_out, "naive and dedup grad_expert_out differ");
        XT_CHECK_MSG(SameBits(dedup.grad_w, naive.grad_w), "naive and dedup grad_weights differ");
    });
}

TEST_P(MoeRanks, BackwardMatchesReferencesAdjointsAndNaive)
{
    RunGrid(Grid);
}

} // namespace

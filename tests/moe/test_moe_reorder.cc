// SPDX-License-Identifier: Apache-2.0
//
// test_moe_reorder.cc - the permuted collectives of token re-ordering on forked ranks (1 to 4;
// LOOM_NET=shm and tcp): loomMoeReduceScatterPermuted bitwise equal to a gather followed by
// loomReduceScatter (padded to ceil(T/G) rows per rank where G does not divide T), on random
// floats and exact integers, float32 and bfloat16, sum and max, in place too;
// loomMoeAllGatherPermuted after it bitwise equal to loomAllReduce in natural order (the round
// trip), also in place; the adjoint identity <RSP(x), y> = <x, AGP(y)> exactly, summed over the
// ranks; a prediction gathered into natural order as int32 rows, and the same perm from
// loomMoeReorderCompute on every rank; and bad input (a perm that is not a permutation, NULL
// arrays, a bad datatype or op) refused on every rank within 2 s, outputs untouched, the next call
// working; and two layers of a sequence-parallel block with MoE (AllGatherPermuted, an attention
// stand-in, the residual folded in, ReduceScatterPermuted, dispatch, experts, combine) giving the
// same tokens bitwise with re-ordering as without, on exact values (reference T12).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

using moetest::MoeRanks;

namespace {

using bytes = std::vector<uint8_t>;
using i32v = std::vector<int32_t>;

size_t Elem(loomDataType_t dt)
{
    return dt == loomFloat32 ? 4 : 2;
}

// Rows first .. first + count - 1 of rank r under the split of T positions over G ranks.
void Share(size_t T, int G, int r, size_t *first, size_t *count)
{
    *count = T / G + ((size_t)r < T % G ? 1 : 0);
    *first = (size_t)r * (T / G) + std::min((size_t)r, T % G);
}

// n values of dt: small integers (exact in every sum here), or random floats in [-1, 1) for
// float32. bfloat16 keeps the top half of the float32 bits, exact for small integers.
bytes Values(loomDataType_t dt, size_t n, bool integers, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    bytes out(n * Elem(dt) + 1, 0xee); // one canary byte past the end
    for (size_t i = 0; i < n; i++) {
        float f = integers ? (float)((int)(rng() % 17) - 8)
                           : (float)((double)(rng() >> 11) / (double)(1ull << 53) * 2 - 1);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if (dt == loomFloat32)
            std::memcpy(&out[i * 4], &u, 4);
        else {
            uint16_t h = (uint16_t)(u >> 16);
            std::memcpy(&out[i * 2], &h, 2);
        }
    }
    return out;
}

double Get(const bytes &b, loomDataType_t dt, size_t i)
{
    uint32_t u = 0;
    if (dt == loomFloat32)
        std::memcpy(&u, &b[i * 4], 4);
    else {
        uint16_t h;
        std::memcpy(&h, &b[i * 2], 2);
        u = (uint32_t)h << 16;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

i32v Shuffled(size_t T, uint64_t seed)
{
    i32v perm(T);
    for (size_t t = 0; t < T; t++)
        perm[t] = (int32_t)t;
    std::mt19937_64 rng(seed);
    for (size_t i = T; i > 1; i--) // the same on every rank: a draw of our own, not std::shuffle
        std::swap(perm[i - 1], perm[rng() % i]);
    return perm;
}

// The definition: rows gathered into G blocks of ceil(T/G) rows (zero padding), loomReduceScatter,
// this rank's first n_r rows.
bytes GatherThenReduceScatter(const bytes &x, size_t H, loomDataType_t dt, loomRedOp_t op,
                              const i32v &perm, size_t T, int rank, int G, loomComm_t comm)
{
    const size_t row = H * Elem(dt), cap = (T + G - 1) / G;
    bytes blocks(G * cap * row + 1, 0), out(cap * row + 1, 0);
    for (int g = 0; g < G; g++) {
        size_t first, count;
        Share(T, G, g, &first, &count);
        for (size_t j = 0; j < count; j++)
            std::memcpy(&blocks[(g * cap + j) * row], &x[perm[first + j] * row], row);
    }
    XT_CHECK_LOOM(loomReduceScatter(blocks.data(), out.data(), cap * H, dt, op, comm, nullptr));
    size_t first, mine;
    Share(T, G, rank, &first, &mine);
    out.resize(mine * row);
    return out;
}

std::string Case(size_t T, size_t H, loomDataType_t dt, loomRedOp_t op, bool integers)
{
    return "T " + std::to_string(T) + " H " + std::to_string(H) + " dtype " +
           std::to_string((int)dt) + " op " + std::to_string((int)op) +
           (integers ? " integers" : " random");
}

void OneCase(int rank, int G, loomComm_t comm, size_t T, size_t H, loomDataType_t dt,
             loomRedOp_t op, bool integers, const i32v &perm)
{
    loomtest::SetContext(Case(T, H, dt, op, integers));
    const size_t row = H * Elem(dt);
    size_t first, mine;
    Share(T, G, rank, &first, &mine);
    const bytes x = Values(dt, T * H, integers, 1000 * T + 10 * H + (uint64_t)rank);
    // ReduceScatterPermuted against its definition, bitwise; the canary past the rows intact.
    bytes rs(mine * row + 1, 0xee);
    XT_CHECK_LOOM(
        loomMoeReduceScatterPermuted(x.data(), rs.data(), H, dt, op, perm.data(), T, comm));
    XT_CHECK_EQ(rs[mine * row], 0xee);
    const bytes want = GatherThenReduceScatter(x, H, dt, op, perm, T, rank, G, comm);
    XT_CHECK_MSG(std::memcmp(rs.data(), want.data(), mine * row) == 0, "differs from gather + RS");
    if (op != loomSum)
        return;
    // In place: the rows land at the start of the send buffer itself.
    bytes inplace = x;
    XT_CHECK_LOOM(loomMoeReduceScatterPermuted(inplace.data(), inplace.data(), H, dt, op,
                                               perm.data(), T, comm));
    XT_CHECK_MSG(std::memcmp(inplace.data(), want.data(), mine * row) == 0, "in place differs");
    // The round trip: AllGatherPermuted(ReduceScatterPermuted(x)) is AllReduce(x), bitwise.
    bytes back(T * row + 1, 0xee), ar(T * row + 1, 0);
    XT_CHECK_LOOM(loomMoeAllGatherPermuted(rs.data(), back.data(), H, dt, perm.data(), T, comm));
    XT_CHECK_EQ(back[T * row], 0xee);
    XT_CHECK_LOOM(loomAllReduce(x.data(), ar.data(), T * H, dt, loomSum, comm, nullptr));
    XT_CHECK_MSG(std::memcmp(back.data(), ar.data(), T * row) == 0, "round trip != AllReduce");
    // AllGatherPermuted in place: this rank's rows at their positions of the receive buffer.
    bytes agin(T * row + 1, 0xee);
    if (mine > 0)
        std::memcpy(&agin[first * row], rs.data(), mine * row);
    XT_CHECK_LOOM(loomMoeAllGatherPermuted(agin.data() + first * row, agin.data(), H, dt,
                                           perm.data(), T, comm));
    XT_CHECK_MSG(std::memcmp(agin.data(), back.data(), T * row) == 0, "in place differs");
    if (!integers)
        return;
    // The adjoint: sum over ranks of <RSP(x), y> equals that of <x, AGP(y)>, exactly (integers).
    const bytes y = Values(dt, mine * H, true, 7 + (uint64_t)rank);
    bytes agy(T * row + 1, 0);
    XT_CHECK_LOOM(loomMoeAllGatherPermuted(y.data(), agy.data(), H, dt, perm.data(), T, comm));
    double dots[2] = {0, 0};
    for (size_t i = 0; i < mine * H; i++)
        dots[0] += Get(rs, dt, i) * Get(y, dt, i);
    for (size_t i = 0; i < T * H; i++)
        dots[1] += Get(x, dt, i) * Get(agy, dt, i);
    XT_CHECK_LOOM(loomAllReduce(dots, dots, 2, loomFloat64, loomSum, comm, nullptr));
    XT_CHECK_MSG(dots[0] == dots[1],
                 std::to_string(dots[0]) + " != " + std::to_string(dots[1]) + ": not adjoint");
}

void Grid(int rank, int G, loomComm_t comm)
{
    for (size_t T : {0, 1, 5, 12, 13})
        for (size_t H : {1, 3})
            for (loomDataType_t dt : {loomFloat32, loomBfloat16}) {
                const i32v perm = Shuffled(T, 31 * T + H);
                OneCase(rank, G, comm, T, H, dt, loomSum, true, perm);
                OneCase(rank, G, comm, T, H, dt, loomMax, true, perm);
                if (dt == loomFloat32)
                    OneCase(rank, G, comm, T, H, dt, loomSum, false, perm);
            }
    // A perm the way a training step gets one (docs/moe.md, "Re-ordering"): each rank predicts
    // for the positions it holds under the previous perm, AllGatherPermuted of int32 rows puts
    // the prediction in natural order on every rank, and every rank computes the same perm.
    const int E = 8, kp = 2;
    const size_t T = 23;
    i32v er(E), pred(T * kp);
    for (int e = 0; e < E; e++)
        er[e] = e % G;
    for (size_t t = 0; t < T; t++) {
        pred[t * kp] = (int32_t)(t * 5 % E);
        pred[t * kp + 1] = (int32_t)((t * 5 + 1 + t % 3) % E);
    }
    const i32v prev = Shuffled(T, 77);
    size_t first, mine;
    Share(T, G, rank, &first, &mine);
    i32v shard(mine * kp + 1), gathered(T * kp, -9);
    for (size_t j = 0; j < mine; j++)
        for (int i = 0; i < kp; i++)
            shard[j * kp + i] = pred[prev[first + j] * kp + i];
    XT_CHECK_LOOM(loomMoeAllGatherPermuted(shard.data(), gathered.data(), kp, loomInt32,
                                           prev.data(), T, comm));
    XT_CHECK(gathered == pred);
    i32v perm(T), lo(T), hi(T);
    XT_CHECK_LOOM(
        loomMoeReorderCompute(er.data(), E, G, gathered.data(), kp, T, perm.data(), nullptr));
    XT_CHECK_LOOM(loomAllReduce(perm.data(), lo.data(), T, loomInt32, loomMin, comm, nullptr));
    XT_CHECK_LOOM(loomAllReduce(perm.data(), hi.data(), T, loomInt32, loomMax, comm, nullptr));
    XT_CHECK(lo == perm && hi == perm);
    OneCase(rank, G, comm, T, 4, loomFloat32, loomSum, true, perm);
}

TEST_P(MoeRanks, PermutedCollectivesMatchGatherAndAreAdjoint)
{
    RunGrid(Grid);
}

// ---- A sequence-parallel block with and without re-ordering (reference T12) -------------------

// One layer of the training step in docs/moe.md, "In a training step", on rank `rank`: x_sp [n_r,
// H] in layout `prev`; h = AllGatherPermuted(x_sp, prev); an attention stand-in whose partial
// sum on rank r is h * (r + 1) / 8; the residual folded in at the natural positions of x_sp's
// rows; x' = ReduceScatterPermuted(p, next); then MoE on x' (token t routed to experts t mod E
// and (3t + 1) mod E, weights 1/2 and 1/4; expert e multiplies by (e + 1) / 4) and x' + y.
// Returns the new x_sp, in layout `next`. Values stay small dyadic numbers, so every sum is
// exact and the order of additions cannot change a bit.
std::vector<float> BlockLayer(int rank, int G, loomComm_t comm, const std::vector<float> &x_sp,
                              const i32v &prev, const i32v &next, size_t T, size_t H, int E)
{
    std::vector<float> h(T * H);
    XT_CHECK_LOOM(
        loomMoeAllGatherPermuted(x_sp.data(), h.data(), H, loomFloat32, prev.data(), T, comm));
    std::vector<float> p(T * H);
    for (size_t i = 0; i < T * H; i++)
        p[i] = h[i] * (float)(rank + 1) / 8.0f;
    size_t first, n;
    Share(T, G, rank, &first, &n);
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < H; c++)
            p[(size_t)prev[first + j] * H + c] += x_sp[j * H + c];
    Share(T, G, rank, &first, &n);
    std::vector<float> x(n * H);
    XT_CHECK_LOOM(loomMoeReduceScatterPermuted(p.data(), x.data(), H, loomFloat32, loomSum,
                                               next.data(), T, comm));
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = E;
    cfg.top_k = 2;
    cfg.hidden = H;
    cfg.datatype = loomFloat32;
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    i32v topk(n * 2);
    std::vector<float> w(n * 2);
    for (size_t j = 0; j < n; j++) {
        const int t = next[first + j];
        topk[j * 2] = t % E;
        topk[j * 2 + 1] = (3 * t + 1) % E == t % E ? (t + 1) % E : (3 * t + 1) % E;
        w[j * 2] = 0.5f;
        w[j * 2 + 1] = 0.25f;
    }
    loomMoeHandle_t hd = nullptr;
    std::vector<int64_t> count((size_t)E), offset((size_t)E);
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = count.data();
    info.expert_offset = offset.data();
    XT_CHECK_LOOM(loomMoeLayout(plan, topk.data(), w.data(), n, &hd, &info));
    std::vector<float> in(info.recv_slots * H), out(info.recv_slots * H), y(n * H);
    XT_CHECK_LOOM(loomMoeDispatch(hd, x.data(), in.data()));
    // Local expert l is the l-th expert of this rank under the contiguous placement.
    const int base = rank * (E / G) + std::min(rank, E % G);
    for (size_t l = 0; l < (size_t)info.num_local_experts; l++)
        for (int64_t s = offset[l]; s < offset[l] + count[l]; s++)
            for (size_t c = 0; c < H; c++)
                out[(size_t)s * H + c] = in[(size_t)s * H + c] * (float)(base + (int)l + 1) / 4.0f;
    XT_CHECK_LOOM(loomMoeCombine(hd, out.data(), y.data()));
    XT_CHECK_LOOM(loomMoeHandleDestroy(hd));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
    for (size_t i = 0; i < n * H; i++)
        x[i] += y[i];
    return x;
}

void ReorderedBlock(int rank, int G, loomComm_t comm)
{
    const size_t T = 37, H = 8; // T not a multiple of G: padded shares
    const int E = 2 * G + 1;
    i32v natural(T);
    for (size_t t = 0; t < T; t++)
        natural[t] = (int32_t)t;
    // The re-ordered run's perms: from a prediction (the routing of the next layer, known
    // here), and for the second layer a shuffle, so that both AllGather and ReduceScatter run
    // with non-trivial perms on either side.
    i32v er((size_t)E), pred(T * 2), moved(T);
    for (int e = 0; e < E; e++)
        er[(size_t)e] = (int32_t)(e / ((E + G - 1) / G));
    for (size_t t = 0; t < T; t++) {
        pred[t * 2] = (int32_t)(t % (size_t)E);
        pred[t * 2 + 1] = (int32_t)((t * 5 + 2) % (size_t)E) == pred[t * 2]
                              ? (int32_t)((t + 1) % (size_t)E)
                              : (int32_t)((t * 5 + 2) % (size_t)E);
    }
    XT_CHECK_LOOM(loomMoeReorderCompute(er.data(), E, G, pred.data(), 2, T, moved.data(), nullptr));
    const i32v shuffled = Shuffled(T, 99);
    size_t first, n;
    Share(T, G, rank, &first, &n);
    std::vector<float> x0(n * H);
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < H; c++)
            x0[j * H + c] = (float)((int)((first + j) * 7 + c * 3) % 9 - 4);
    // Two layers each way; the inputs are the same tokens (layout `natural` at the start).
    std::vector<float> a = BlockLayer(rank, G, comm, x0, natural, natural, T, H, E);
    a = BlockLayer(rank, G, comm, a, natural, natural, T, H, E);
    std::vector<float> b = BlockLayer(rank, G, comm, x0, natural, moved, T, H, E);
    b = BlockLayer(rank, G, comm, b, moved, shuffled, T, H, E);
    std::vector<float> all_a(T * H), all_b(T * H);
    XT_CHECK_LOOM(
        loomMoeAllGatherPermuted(a.data(), all_a.data(), H, loomFloat32, natural.data(), T, comm));
    XT_CHECK_LOOM(
        loomMoeAllGatherPermuted(b.data(), all_b.data(), H, loomFloat32, shuffled.data(), T, comm));
    XT_CHECK_MSG(std::memcmp(all_a.data(), all_b.data(), all_a.size() * 4) == 0,
                 "the re-ordered block's tokens differ from the natural block's");
    bool moved_any = false;
    for (size_t t = 0; t < T; t++)
        moved_any = moved_any || moved[t] != natural[t];
    XT_CHECK_MSG(G == 1 || moved_any, "the prediction moved no token: the test shows nothing");
}

TEST_P(MoeRanks, ReorderedBlockEqualsTheNaturalOneBitwise)
{
    RunGrid(ReorderedBlock);
}

// ---- Bad input: every rank passes it, every rank refuses it, within 2 s ----------------------

void ExpectRefused(loomResult_t got, const std::string &word, const std::string &what,
                   std::chrono::steady_clock::time_point t0)
{
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string msg = loomGetLastError(nullptr);
    XT_CHECK_MSG(got == loomInvalidArgument, what + ": got " + loomtest::Show(got));
    XT_CHECK_MSG(msg.find(word) != std::string::npos, what + ": '" + word + "' not in " + msg);
    XT_CHECK_MSG(s < 2.0, what + ": took " + std::to_string(s) + " s");
}

void BadInput(int rank, int G, loomComm_t comm)
{
    const size_t T = 6, H = 2;
    size_t first, mine;
    Share(T, G, rank, &first, &mine);
    const i32v good = Shuffled(T, 3);
    i32v repeated = good, range = good;
    repeated[4] = repeated[1];
    range[2] = (int32_t)T;
    const bytes x = Values(loomFloat32, T * H, true, 5);
    const bytes canary_rs(mine * H * 4, 0xee), canary_ag(T * H * 4, 0xee);
    struct Bad {
        const char *what, *word;
        const int32_t *perm;
        const void *send;
        int dt, op; // ints: an enum object may not hold 99 (UBSan checks loads of enums)
        loomComm_t comm;
    };
    const int kDt = 99, kOp = 99;
    const Bad cases[] = {
        {"repeated perm", "repeated", repeated.data(), x.data(), loomFloat32, loomSum, comm},
        {"perm out of range", "out of range", range.data(), x.data(), loomFloat32, loomSum, comm},
        {"NULL perm", "perm is NULL", nullptr, x.data(), loomFloat32, loomSum, comm},
        {"NULL sendbuff", "sendbuff is NULL", good.data(), nullptr, loomFloat32, loomSum, comm},
        {"bad datatype", "invalid datatype", good.data(), x.data(), kDt, loomSum, comm},
        {"bad op", "invalid reduction op", good.data(), x.data(), loomFloat32, kOp, comm},
        {"NULL comm", "comm", good.data(), x.data(), loomFloat32, loomSum, nullptr},
    };
    for (const Bad &b : cases) {
        loomtest::SetContext(b.what);
        bytes rs = canary_rs, ag = canary_ag;
        auto t0 = std::chrono::steady_clock::now();
        ExpectRefused(
            loomMoeReduceScatterPermuted(b.send, rs.data(), H, static_cast<loomDataType_t>(b.dt),
                                         static_cast<loomRedOp_t>(b.op), b.perm, T, b.comm),
            b.word, std::string("ReduceScatterPermuted, ") + b.what, t0);
        XT_CHECK(rs == canary_rs);
        if (b.op == loomSum) {
            t0 = std::chrono::steady_clock::now();
            ExpectRefused(loomMoeAllGatherPermuted(b.send == nullptr ? nullptr : rs.data(),
                                                   ag.data(), H, static_cast<loomDataType_t>(b.dt),
                                                   b.perm, T, b.comm),
                          b.word, std::string("AllGatherPermuted, ") + b.what, t0);
            XT_CHECK(ag == canary_ag);
        }
        // Still in step: the good call works on every rank.
        XT_CHECK_LOOM(loomMoeReduceScatterPermuted(x.data(), rs.data(), H, loomFloat32, loomSum,
                                                   good.data(), T, comm));
        XT_CHECK_LOOM(
            loomMoeAllGatherPermuted(rs.data(), ag.data(), H, loomFloat32, good.data(), T, comm));
    }
}

TEST(MoeReorderErrors, BadInputFailsEveryRankTogether)
{
    for (const char *net : {"shm", "tcp"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", net}};
        XT_ASSERT_RUN(loomtest::RunRanks(3, BadInput, opts));
    }
}

} // namespace

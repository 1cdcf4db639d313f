// SPDX-License-Identifier: Apache-2.0
//
// moe_ref.cc - the shared batches, placements, experts and combine references of the MoE
// dispatch tests (moe_ref.h). Built with -ffp-contract=off, as the library is: the references
// must do the same separate float32 multiplies and adds.
#include "moe_ref.h"

#include <cstring>

#include "mp_fixture.h"

extern "C" {
#include "dtype.h"
#include "moe_gen.h"
#include "rng.h"
}

namespace moetest {

size_t TokensOf(const Shape &s, int rank, int nranks)
{
    if (rank == 1 || s.seed % 7 == 6)
        return 0;
    return 3 + (size_t)(5 * rank + (int)(s.seed % 5) + nranks) % 23;
}

size_t ElemBytes(loomDataType_t dt)
{
    return dt == loomFloat32 ? 4 : 2;
}

float Load(loomDataType_t dt, const uint8_t *buf, size_t i)
{
    if (dt == loomFloat32) {
        float v;
        memcpy(&v, buf + i * 4, 4);
        return v;
    }
    uint16_t b;
    memcpy(&b, buf + i * 2, 2);
    return dt == loomBfloat16 ? loom_bf16_decode(b) : loom_f16_decode(b);
}

void Store(loomDataType_t dt, uint8_t *buf, size_t i, float v)
{
    if (dt == loomFloat32) {
        memcpy(buf + i * 4, &v, 4);
        return;
    }
    uint16_t b = dt == loomBfloat16 ? loom_bf16_encode(v) : loom_f16_encode(v);
    memcpy(buf + i * 2, &b, 2);
}

float Expert(loomDataType_t dt, int e, float v)
{
    uint8_t b[4];
    Store(dt, b, 0, v * (float)(e + 1) + (float)e);
    return Load(dt, b, 0);
}

Batch MakeBatch(const Shape &s, int rank, int nranks)
{
    Batch b;
    b.tokens = TokensOf(s, rank, nranks);
    size_t T = b.tokens, k = (size_t)s.top_k, H = s.hidden;
    b.topk.assign(T * k, -1);
    b.weights.assign(T * k, 0.0f);
    uint64_t seed = s.seed * 1000003u + (uint64_t)rank;
    if (s.planted) {
        loom_moe_gen_t g{};
        g.num_experts = (uint32_t)s.num_experts;
        g.top_k = (uint32_t)s.top_k;
        g.num_groups = (uint32_t)(nranks < s.num_experts ? nranks : s.num_experts);
        g.rho = 0.8;
        g.mask = 0.1;
        g.seed = seed;
        if (T > 0 &&
            loom_moe_gen_planted(&g, T, 1, b.topk.data(), b.weights.data(), nullptr) != loomSuccess)
            b.topk.clear(); // the caller's checks fail on the size
    } else if (T > 0 && loom_moe_gen_uniform((uint32_t)s.num_experts, (uint32_t)s.top_k, T, seed,
                                             b.topk.data(), b.weights.data()) != loomSuccess) {
        b.topk.clear();
    }
    loom_rng_t r = loom_rng_seed(seed ^ 0x5eedULL);
    if (s.dyadic)
        for (size_t i = 0; i < T * k; i++)
            b.weights[i] = (float)(1 + loom_rng_below(&r, 8)) / 8.0f;
    b.x.assign(T * H * ElemBytes(s.dtype), 0);
    for (size_t t = 0; t < T; t++) {
        for (size_t c = 0; c < H; c++) {
            float v;
            if (c == 0)
                v = (float)rank;
            else if (c == 1)
                v = (float)t;
            else if (s.dyadic)
                v = (float)((int)loom_rng_below(&r, 17) - 8);
            else
                v = (float)(loom_rng_uniform(&r) * 4.0 - 2.0);
            Store(s.dtype, b.x.data(), t * H + c, v);
        }
    }
    return b;
}

std::vector<int32_t> Placement(int num_experts, int nranks, bool random, uint64_t seed)
{
    std::vector<int32_t> place;
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < num_experts / nranks + (r < num_experts % nranks ? 1 : 0); i++)
            place.push_back(r);
    if (random) {
        loom_rng_t g = loom_rng_seed(seed);
        for (size_t i = place.size(); i > 1; i--)
            std::swap(place[i - 1], place[loom_rng_below(&g, (uint32_t)i)]);
    }
    return place;
}

loomMoeConfig_t Config(const Shape &s, const std::vector<int32_t> &place, bool random_place,
                       int mode)
{
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = s.num_experts;
    cfg.top_k = s.top_k;
    cfg.hidden = s.hidden;
    cfg.datatype = s.dtype;
    cfg.mode = mode;
    cfg.expert_rank = random_place ? place.data() : nullptr;
    return cfg;
}

std::vector<uint8_t> RunExperts(const Shape &s, const std::vector<int32_t> &place, int rank,
                                const std::vector<uint8_t> &recv_x,
                                const std::vector<int64_t> &offset,
                                const std::vector<int64_t> &count)
{
    std::vector<uint8_t> out(recv_x.size(), 0);
    size_t H = s.hidden;
    for (int e = 0, l = 0; e < s.num_experts; e++) {
        if (place[(size_t)e] != rank)
            continue;
        for (int64_t i = offset[(size_t)l]; i < offset[(size_t)l] + count[(size_t)l]; i++)
            for (size_t c = 0; c < H; c++)
                Store(s.dtype, out.data(), (size_t)i * H + c,
                      Expert(s.dtype, e, Load(s.dtype, recv_x.data(), (size_t)i * H + c)));
        l++;
    }
    return out;
}

void RowsBetween(const Shape &s, const Batch &b, const std::vector<int32_t> &place, int dst,
                 int mode, size_t *rows, size_t *pairs)
{
    size_t k = (size_t)s.top_k;
    *rows = *pairs = 0;
    for (size_t t = 0; t < b.tokens; t++) {
        size_t n = 0;
        for (size_t j = 0; j < k; j++)
            if (b.topk[t * k + j] >= 0 && place[(size_t)b.topk[t * k + j]] == dst)
                n++;
        *pairs += n;
        *rows += mode == loomMoeModeNaive ? n : (n > 0);
    }
}

size_t RowStride(const Shape &s, int mode)
{
    size_t ppr = mode == loomMoeModeNaive ? 1 : (size_t)s.top_k;
    return ((s.hidden * ElemBytes(s.dtype) + 3) / 4 * 4 + 4 + 6 * ppr + 15) / 16 * 16;
}

void MoeRanks::RunGrid(void (*body)(int rank, int nranks, loomComm_t comm))
{
    loomtest::RunOptions opts;
    const std::string net = std::get<1>(GetParam());
    // "hosts": two modelled hosts as loomrun --host-groups 2 makes them (shm inside, tcp across).
    if (net == "hosts")
        opts.rank_env = [](int rank) {
            return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
        };
    else
        opts.env = {{"LOOM_NET", net}};
    opts.deadline_s = 120;
    XT_ASSERT_RUN(loomtest::RunRanks(std::get<0>(GetParam()), body, opts));
}

std::vector<uint8_t> Reference(const Shape &s, const Batch &b, const std::vector<int32_t> &place,
                               bool grouped)
{
    size_t k = (size_t)s.top_k, H = s.hidden;
    int groups = 1;
    for (int32_t r : place)
        groups = grouped && r + 1 > groups ? r + 1 : groups;
    std::vector<uint8_t> y(b.tokens * H * ElemBytes(s.dtype));
    for (size_t t = 0; t < b.tokens; t++) {
        for (size_t c = 0; c < H; c++) {
            float x = Load(s.dtype, b.x.data(), t * H + c);
            float acc = 0.0f;
            for (int g = 0; g < groups; g++) {
                float part = 0.0f;
                bool any = false;
                for (size_t j = 0; j < k; j++) {
                    int32_t e = b.topk[t * k + j];
                    if (e < 0 || (grouped && place[(size_t)e] != g))
                        continue;
                    part += b.weights[t * k + j] * Expert(s.dtype, e, x);
                    any = true;
                }
                if (any)
                    acc += part;
            }
            Store(s.dtype, y.data(), t * H + c, acc);
        }
    }
    return y;
}

void ForEachShape(int nranks, uint64_t seed0, const std::function<void(const Shape &, bool)> &fn)
{
    const int shapes[][2] = {{8, 2}, {12, 6}, {nranks > 1 ? nranks - 1 : 1, 1}, {5, 5}};
    uint64_t seed = seed0;
    for (auto ek : shapes)
        for (loomDataType_t dt : {loomFloat32, loomBfloat16, loomFloat16})
            for (bool planted : {false, true})
                for (bool dyadic : {false, true})
                    for (bool random_place : {false, true})
                        fn(Shape{ek[0], ek[1], 5, dt, planted, dyadic, seed++}, random_place);
}

} // namespace moetest

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_dev_elem_q4.cc - the 4-bit codec and the cast of the device kernels'
 * host twins (dev_kernels_host.c, built on dev_elem.h) against the CPU codec
 * (q4.h) and conversions (kernels.h) on every instruction set this CPU has,
 * bit for bit: code bytes, scales and residuals of millions of values in
 * blocks of every kind (Gaussian at scales from 2^-120 to 2^120, zeros, -0,
 * subnormals, the 2^-123 boundary, NaN, infinities, values near FLT_MAX,
 * exact ties, raw patterns) with and without a residual (also err_out ==
 * err_in); decoding of those streams and of random foreign bytes to every
 * codec datatype and into an accumulator; the block rules of dev_elem.h on
 * their own; every cast. Seeded from LOOM_TEST_SEED or a fixed seed, printed.
 */
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dev_elem.h"
#include "dev_kernels.h"
#include "dtype.h"
#include "kernels.h"
#include "q4.h"

namespace {

const loomDataType_t q4_types[] = {loomFloat32, loomBfloat16, loomFloat16};

uint64_t seed()
{
    static uint64_t s = [] {
        const char *e = std::getenv("LOOM_TEST_SEED");
        uint64_t v = e != nullptr && *e ? std::strtoull(e, nullptr, 0) : 20260126u;
        std::printf("test_dev_elem_q4 seed %llu (LOOM_TEST_SEED)\n", (unsigned long long)v);
        return v;
    }();
    return s;
}

std::vector<loom_kernels_isa_t> isas()
{
    std::vector<loom_kernels_isa_t> v;
    for (int i = 0; i < LOOM_KERNELS_NUM_ISA; i++)
        if (loom_kernels_isa_available((loom_kernels_isa_t)i))
            v.push_back((loom_kernels_isa_t)i);
    return v;
}

float f32(uint32_t b)
{
    return loom_de_f32_from_bits(b);
}

/* The 32 float32 values of one block of a random kind. */
void block(std::mt19937_64 &rng, float *u)
{
    std::normal_distribution<float> g(0.0f, 1.0f);
    const unsigned kind = (unsigned)(rng() % 24);
    const int e = (int)(rng() % 241) - 120;
    for (int j = 0; j < 32; j++)
        u[j] = std::ldexp(g(rng), e);
    switch (kind) {
    case 0: /* zeros, some negative */
        for (int j = 0; j < 32; j++)
            u[j] = (rng() & 1) ? -0.0f : 0.0f;
        break;
    case 1: /* subnormals */
        for (int j = 0; j < 32; j++)
            u[j] = f32((uint32_t)(rng() & 0x807fffffu));
        break;
    case 2: /* amax at 2^-123 and just below */
        for (int j = 0; j < 32; j++)
            u[j] = f32((uint32_t)(rng() % 0x02000000u) | ((rng() & 1) ? 0x80000000u : 0));
        u[rng() % 32] = f32((rng() & 1) ? 0x02000000u : 0x01ffffffu);
        break;
    case 3: /* a NaN or an infinity among ordinary values */
        u[rng() % 32] = f32((rng() & 1) ? 0x7fc01234u : (rng() & 1) ? 0xff800000u : 0x7f800000u);
        break;
    case 4: /* near FLT_MAX: the scale saturates at 0x7e12 */
        for (int j = 0; j < 32; j++)
            u[j] = f32(0x7f000000u + (uint32_t)(rng() % 0x7fffffu)) * ((rng() & 1) ? -1.0f : 1.0f);
        u[rng() % 32] = (rng() & 1) ? FLT_MAX : -FLT_MAX;
        break;
    case 5: /* exact ties of rint: amax 7, scale 1 */
        for (int j = 0; j < 32; j++)
            u[j] = (float)((int)(rng() % 15) - 7) + ((rng() & 1) ? 0.5f : 0.0f);
        u[0] = 7.0f;
        break;
    case 6: /* raw patterns */
        for (int j = 0; j < 32; j++)
            u[j] = f32((uint32_t)rng());
        break;
    case 7: /* one large value among tiny ones */
        u[rng() % 32] = std::ldexp(1.0f, 60);
        break;
    default:
        break;
    }
}

/* n values of dt (as raw bytes) of random blocks, and their float32 values. */
std::vector<uint8_t> values(loomDataType_t dt, size_t n, std::mt19937_64 &rng)
{
    std::vector<uint8_t> raw(n * loom_dtype_size(dt));
    float u[32];
    for (size_t i = 0; i < n; i++) {
        if (i % 32 == 0)
            block(rng, u);
        if (dt == loomFloat32) {
            std::memcpy(raw.data() + 4 * i, &u[i % 32], 4);
        } else {
            uint16_t h =
                dt == loomBfloat16 ? loom_f32_to_bf16(u[i % 32]) : loom_f32_to_f16(u[i % 32]);
            std::memcpy(raw.data() + 2 * i, &h, 2);
        }
    }
    return raw;
}

/* Residuals in: small values, with a few specials. */
std::vector<float> residuals(size_t n, std::mt19937_64 &rng)
{
    std::normal_distribution<float> g(0.0f, 0.05f);
    std::vector<float> e(n);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng();
        e[i] = r % 512 == 0   ? f32((uint32_t)(r >> 16))
               : r % 512 == 1 ? -0.0f
                              : std::ldexp(g(rng), (int)((r >> 20) % 41) - 20);
    }
    return e;
}

/* First element where a and b differ bitwise, -1 if none. Where two NaNs
 * met in the add or subtract (both_nan(i)), which payload survives is the
 * instruction's choice (kernels.h: the compiler may swap the operands), so
 * there any two NaNs are equal. */
template <typename F>
long diff32(const std::vector<float> &a, const std::vector<float> &b, size_t n, F both_nan)
{
    for (size_t i = 0; i < n; i++)
        if (loom_de_f32_bits(a[i]) != loom_de_f32_bits(b[i]) &&
            !(std::isnan(a[i]) && std::isnan(b[i]) && both_nan(i)))
            return (long)i;
    return -1;
}

long diff32(const std::vector<float> &a, const std::vector<float> &b, size_t n)
{
    return diff32(a, b, n, [](size_t) { return false; });
}

/* Value i of x (datatype dt) as float32. */
float value_at(const std::vector<uint8_t> &x, loomDataType_t dt, size_t i)
{
    uint16_t h;
    if (dt == loomFloat32) {
        float f;
        std::memcpy(&f, x.data() + 4 * i, 4);
        return f;
    }
    std::memcpy(&h, x.data() + 2 * i, 2);
    return dt == loomBfloat16 ? loom_de_bf16_decode(h) : loom_de_f16_decode(h);
}

long diff_bytes(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b)
{
    for (size_t i = 0; i < a.size() && i < b.size(); i++)
        if (a[i] != b[i])
            return (long)i;
    return a.size() == b.size() ? -1 : (long)std::min(a.size(), b.size());
}

} // namespace

/* The block rules of q4.h as dev_elem.h states them. */
TEST(DevElemQ4, BlockRules)
{
    EXPECT_EQ(loom_de_q4_scale_bits(loom_de_f32_bits(7.0f)), 0x3f80u);    /* exact 1 */
    EXPECT_EQ(loom_de_q4_scale_bits(loom_de_f32_bits(7.5f)), 0x3f8au);    /* rounded up */
    EXPECT_EQ(loom_de_q4_scale_bits(loom_de_f32_bits(FLT_MAX)), 0x7e12u); /* capped */
    EXPECT_EQ(loom_de_q4_scale_bits(0x7f800000u), 0x7fc0u);               /* infinity */
    EXPECT_EQ(loom_de_q4_scale_bits(0x7fc00001u), 0x7fc0u);               /* NaN */
    EXPECT_EQ(loom_de_q4_scale_bits(0x01ffffffu), 0u);                    /* < 2^-123 */
    EXPECT_NE(loom_de_q4_scale_bits(0x02000000u), 0u);                    /* 2^-123 */
    EXPECT_TRUE(loom_de_q4_special(0u) && loom_de_q4_special(0x7f800000u));
    EXPECT_FALSE(loom_de_q4_special(0x02000000u) || loom_de_q4_special(0x7f7fffffu));
    EXPECT_EQ(loom_de_q4_code(2.5f, 1.0f), 2); /* ties to even */
    EXPECT_EQ(loom_de_q4_code(3.5f, 1.0f), 4);
    EXPECT_EQ(loom_de_q4_code(-2.5f, 1.0f), -2);
    EXPECT_EQ(loom_de_q4_code(9.0f, 1.0f), 7); /* clamped */
    EXPECT_EQ(loom_de_q4_code(-9.0f, 1.0f), -7);
    EXPECT_EQ(loom_de_q4_pack(-1, 7), 0x7f);
    EXPECT_EQ(loom_de_q4_nibble(0x7f, 0), -1);
    EXPECT_EQ(loom_de_q4_nibble(0x7f, 1), 7);
    EXPECT_EQ(loom_de_q4_nibble(0x08, 0), -8); /* foreign */
    EXPECT_EQ(loom_de_q4_bytes(1), (size_t)LOOM_Q4_TILE_BYTES);
    EXPECT_EQ(loom_de_q4_bytes(2049), (size_t)2 * LOOM_Q4_TILE_BYTES);
    EXPECT_EQ(loom_de_q4_codes_off(65), (size_t)LOOM_Q4_TILE_BYTES + 16);
    EXPECT_EQ(loom_de_q4_scale_off(65), (size_t)LOOM_Q4_TILE_BYTES + 1024 + 2);
    EXPECT_EQ(LOOM_DE_Q4_BLOCK, LOOM_Q4_BLOCK);
    EXPECT_EQ(LOOM_DE_Q4_TILE, LOOM_Q4_TILE);
    EXPECT_EQ(LOOM_DE_Q4_TILE_BYTES, LOOM_Q4_TILE_BYTES);
}

/* Encode, decode and decode_acc of the host twins against the CPU codec of
 * every instruction set. */
TEST(DevElemQ4, CodecMatchesCpu)
{
    std::mt19937_64 rng(seed() ^ 0x94);
    const std::vector<loom_kernels_isa_t> sets = isas();
    size_t encoded = 0;
    for (loomDataType_t dt : q4_types) {
        const size_t n = ((size_t)3 << 20) + 77 + (size_t)(rng() % 2048);
        const std::vector<uint8_t> x = values(dt, n, rng);
        const std::vector<float> ein = residuals(n, rng);
        const size_t nb = loom_q4_bytes(n);
        /* mode 0: x alone, its residual; 1: err_in -> err_out; 2: in place
         * (err_out == err_in); 3: no residual at all. */
        for (int mode = 0; mode < 4; mode++) {
            std::vector<uint8_t> got(nb, 0x5a);
            std::vector<float> gerr = ein;
            const float *g_in = mode == 1 ? ein.data() : mode == 2 ? gerr.data() : nullptr;
            float *g_out = mode == 3 ? nullptr : gerr.data();
            ASSERT_EQ(loom_dk_host_q4_encode(x.data(), dt, g_in, g_out, n, got.data()), 0);
            encoded += n;
            for (loom_kernels_isa_t isa : sets) {
                std::vector<uint8_t> want(nb, 0xa5);
                std::vector<float> werr = ein;
                const float *w_in = mode == 1 ? ein.data() : mode == 2 ? werr.data() : nullptr;
                loom_q4_encode_isa(isa, x.data(), dt, w_in, mode == 3 ? nullptr : werr.data(), n,
                                   want.data());
                std::string ctx = std::string(loom_dtype_name(dt)) + " mode " +
                                  std::to_string(mode) + " n " + std::to_string(n) + " " +
                                  loom_kernels_isa_name(isa) + " seed " + std::to_string(seed());
                long b = diff_bytes(want, got);
                ASSERT_EQ(b, -1) << "encoded byte " << b << ": " << ctx;
                /* u - D(code) with u NaN: D is NaN too (the block's scale). */
                long i = diff32(werr, gerr, n, [&](size_t k) {
                    return std::isnan(value_at(x, dt, k) + (mode == 1 || mode == 2 ? ein[k] : 0));
                });
                ASSERT_EQ(i, -1) << "residual " << i << " want 0x" << std::hex
                                 << loom_de_f32_bits(werr[i]) << " got 0x"
                                 << loom_de_f32_bits(gerr[i]) << std::dec << ": " << ctx;
            }
            if (mode != 0)
                continue;
            /* Decoding the stream, and random foreign bytes (codes -8, any scale). */
            std::vector<uint8_t> foreign(nb);
            for (uint8_t &c : foreign)
                c = (uint8_t)rng();
            for (const std::vector<uint8_t> *q : {&got, &foreign}) {
                std::vector<float> acc0 = residuals(n, rng);
                for (loomDataType_t odt : q4_types) {
                    const size_t osz = loom_dtype_size(odt);
                    std::vector<uint8_t> gd(n * osz), wd(n * osz);
                    ASSERT_EQ(loom_dk_host_q4_decode(q->data(), n, gd.data(), odt), 0);
                    for (loom_kernels_isa_t isa : sets) {
                        loom_q4_decode_isa(isa, q->data(), n, wd.data(), odt);
                        long b = diff_bytes(wd, gd);
                        ASSERT_EQ(b, -1) << "decoded byte " << b << " to " << loom_dtype_name(odt)
                                         << (q == &got ? "" : " (foreign)") << " "
                                         << loom_kernels_isa_name(isa) << " seed " << seed();
                    }
                }
                std::vector<float> gacc = acc0;
                ASSERT_EQ(loom_dk_host_q4_decode_acc(q->data(), n, gacc.data()), 0);
                for (loom_kernels_isa_t isa : sets) {
                    std::vector<float> wacc = acc0;
                    loom_q4_decode_acc_isa(isa, q->data(), n, wacc.data());
                    long i = diff32(wacc, gacc, n, [&](size_t k) { return std::isnan(acc0[k]); });
                    ASSERT_EQ(i, -1)
                        << "decode_acc " << i << (q == &got ? "" : " (foreign)") << " acc 0x"
                        << std::hex << loom_de_f32_bits(acc0[i]) << " want 0x"
                        << loom_de_f32_bits(wacc[i]) << " got 0x" << loom_de_f32_bits(gacc[i])
                        << std::dec << " " << loom_kernels_isa_name(isa) << " seed " << seed();
                }
            }
        }
    }
    std::printf("codec: %zu values encoded and compared bitwise (bytes and residuals)\n", encoded);
}

/* Lengths around the block and tile edges; the padding of the last tile. */
TEST(DevElemQ4, CodecShortLengths)
{
    std::mt19937_64 rng(seed() ^ 0x5e);
    for (loomDataType_t dt : q4_types)
        for (size_t n : {(size_t)1, (size_t)7, (size_t)31, (size_t)32, (size_t)33, (size_t)2047,
                         (size_t)2048, (size_t)2049, (size_t)4095}) {
            const std::vector<uint8_t> x = values(dt, n, rng);
            std::vector<uint8_t> got(loom_q4_bytes(n) + 1, 0x5a), want(got.size(), 0x5a);
            std::vector<float> ge(n + 1, 7.0f), we(n + 1, 7.0f);
            ASSERT_EQ(loom_dk_host_q4_encode(x.data(), dt, nullptr, ge.data(), n, got.data()), 0);
            loom_q4_encode(x.data(), dt, nullptr, we.data(), n, want.data());
            ASSERT_EQ(diff_bytes(want, got), -1) << loom_dtype_name(dt) << " n " << n;
            ASSERT_EQ(diff32(we, ge, n + 1), -1) << loom_dtype_name(dt) << " n " << n;
            ASSERT_EQ(got.back(), 0x5a) << "wrote past the tiles";
            ASSERT_EQ(ge.back(), 7.0f) << "wrote a residual past n";
        }
    uint8_t q[LOOM_Q4_TILE_BYTES];
    float v;
    EXPECT_EQ(loom_dk_host_q4_encode(&v, loomFloat8e4m3, nullptr, nullptr, 1, q), -1);
    EXPECT_EQ(loom_dk_host_q4_encode(&v, loomInt32, nullptr, nullptr, 1, q), -1);
    EXPECT_EQ(loom_dk_host_q4_decode(q, 1, &v, loomFloat64), -1);
    EXPECT_EQ(loom_dk_host_q4_encode(&v, loomFloat32, nullptr, nullptr, 0, nullptr), 0);
    EXPECT_EQ(loom_dk_host_q4_decode_acc(nullptr, 1, &v), -1);
}

/* Casts between float32, float16 and bfloat16 round as the tables' finish
 * does; same-type casts copy every datatype; in place only at one size. */
TEST(DevElemQ4, CastMatchesConversions)
{
    std::mt19937_64 rng(seed() ^ 0xca);
    const size_t n = (size_t)1 << 18;
    std::vector<uint32_t> bits(n);
    for (uint32_t &b : bits)
        b = (uint32_t)rng();
    for (loom_kernels_isa_t isa : isas()) {
        loom_kernels_isa_t prev = loom_kernels_isa();
        ASSERT_EQ(loom_kernels_use(isa), loomSuccess);
        for (loomDataType_t sdt : q4_types)
            for (loomDataType_t ddt : q4_types) {
                const size_t ssz = loom_dtype_size(sdt), dsz = loom_dtype_size(ddt);
                std::vector<uint8_t> src(n * ssz);
                std::memcpy(src.data(), bits.data(), src.size());
                std::vector<float> wide(n);
                loom_reduce_init(sdt, wide.data(), src.data(), n);
                std::vector<uint8_t> want(n * dsz), got(n * dsz);
                if (sdt == ddt) /* a copy, signalling NaNs included */
                    want = src;
                else
                    loom_reduce_finish(ddt, loomSum, want.data(), wide.data(), n, 1);
                ASSERT_EQ(loom_dk_host_cast(got.data(), ddt, src.data(), sdt, n), 0);
                ASSERT_EQ(diff_bytes(want, got), -1)
                    << loom_dtype_name(sdt) << " -> " << loom_dtype_name(ddt) << " "
                    << loom_kernels_isa_name(isa);
                if (ssz == dsz) {
                    ASSERT_EQ(loom_dk_host_cast(src.data(), ddt, src.data(), sdt, n), 0);
                    ASSERT_EQ(diff_bytes(want, src), -1) << "in place";
                } else {
                    EXPECT_EQ(loom_dk_host_cast(src.data(), ddt, src.data(), sdt, n), -1);
                }
            }
        loom_kernels_use(prev);
    }
    for (loomDataType_t dt : {loomInt8, loomUint64, loomFloat64, loomInt32}) {
        std::vector<uint8_t> src(1000 * loom_dtype_size(dt)), dst(src.size());
        for (uint8_t &c : src)
            c = (uint8_t)rng();
        ASSERT_EQ(loom_dk_host_cast(dst.data(), dt, src.data(), dt, 1000), 0);
        ASSERT_EQ(diff_bytes(src, dst), -1) << loom_dtype_name(dt);
    }
    float a[2] = {1, 2};
    EXPECT_EQ(loom_dk_host_cast(a, loomFloat32, a, loomInt32, 2), -1);
    EXPECT_EQ(loom_dk_host_cast(a, loomFloat8e4m3, a, loomFloat32, 2), -1);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_dtype_kernels.cc - unit tests of dtype.h and kernels.h: the names and
 * sizes tables, the 8/16-bit float conversions (exhaustively, against a
 * reference built from ldexp and a search over all encodings, so it shares no
 * code with the bit manipulation under test) and every (datatype, op) kernel
 * against a scalar reference in double or 128-bit integer arithmetic. It does
 * not measure speed and does not exercise collectives; meson runs it in the
 * 'unit' suite.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"
#include "kernels.h"

namespace {

/* ---- Reference float formats ------------------------------------------- */

struct fp_format {
    const char *name;
    int bits;
    int ebits;
    int mbits;
    int bias;
    bool ieee;       /* has infinities and IEEE NaNs; else only S.1..1.1..1 is NaN */
    bool saturating; /* overflow gives the largest finite value, not infinity */
    float (*decode)(uint32_t);
    uint32_t (*encode)(float);
};

float dec_f16(uint32_t b)
{
    return loom_f16_to_f32((uint16_t)b);
}
uint32_t enc_f16(float f)
{
    return loom_f32_to_f16(f);
}
float dec_bf16(uint32_t b)
{
    return loom_bf16_to_f32((uint16_t)b);
}
uint32_t enc_bf16(float f)
{
    return loom_f32_to_bf16(f);
}
float dec_e4m3(uint32_t b)
{
    return loom_e4m3_to_f32((uint8_t)b);
}
uint32_t enc_e4m3(float f)
{
    return loom_f32_to_e4m3(f);
}
float dec_e5m2(uint32_t b)
{
    return loom_e5m2_to_f32((uint8_t)b);
}
uint32_t enc_e5m2(float f)
{
    return loom_f32_to_e5m2(f);
}

const fp_format fmt_f16 = {"f16", 16, 5, 10, 15, true, false, dec_f16, enc_f16};
const fp_format fmt_bf16 = {"bf16", 16, 8, 7, 127, true, false, dec_bf16, enc_bf16};
const fp_format fmt_e4m3 = {"e4m3", 8, 4, 3, 7, false, true, dec_e4m3, enc_e4m3};
const fp_format fmt_e5m2 = {"e5m2", 8, 5, 2, 15, true, true, dec_e5m2, enc_e5m2};
const fp_format *const all_formats[] = {&fmt_f16, &fmt_bf16, &fmt_e4m3, &fmt_e5m2};

uint32_t sign_bit(const fp_format &f)
{
    return 1u << (f.bits - 1);
}

uint32_t max_finite(const fp_format &f)
{
    uint32_t emax = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
    return f.ieee ? ((emax - 1) << f.mbits) | mmask : (emax << f.mbits) | (mmask - 1);
}

double ref_decode(const fp_format &f, uint32_t b)
{
    uint32_t emax = (1u << f.ebits) - 1, mmask = (1u << f.mbits) - 1;
    uint32_t e = (b >> f.mbits) & emax, m = b & mmask;
    double v;
    if (f.ieee && e == emax)
        v = m ? NAN : INFINITY;
    else if (!f.ieee && e == emax && m == mmask)
        v = NAN;
    else if (e == 0)
        v = std::ldexp((double)m, 1 - f.bias - f.mbits);
    else
        v = std::ldexp((double)(m | (1u << f.mbits)), (int)e - f.bias - f.mbits);
    return (b & sign_bit(f)) ? -v : v;
}

/* Nearest encoding by binary search over the (monotonic) positive encodings,
 * ties to the even encoding, which is the one with the even mantissa. */
uint32_t ref_encode(const fp_format &f, double x)
{
    uint32_t emax = (1u << f.ebits) - 1;
    uint32_t sign = std::signbit(x) ? sign_bit(f) : 0;
    if (std::isnan(x))
        return sign | (f.ieee ? (emax << f.mbits) | (1u << (f.mbits - 1)) : sign_bit(f) - 1);
    double a = std::fabs(x);
    uint32_t maxp = max_finite(f);
    double vmax = ref_decode(f, maxp);
    if (a > vmax) {
        if (f.saturating)
            return sign | maxp;
        double ulp = vmax - ref_decode(f, maxp - 1);
        return sign | (a >= vmax + ulp / 2 ? emax << f.mbits : maxp);
    }
    uint32_t lo = 0, hi = maxp; /* invariant: decode(lo) <= a */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (ref_decode(f, mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double vlo = ref_decode(f, lo);
    if (vlo == a)
        return sign | lo;
    double d1 = a - vlo, d2 = ref_decode(f, lo + 1) - a;
    uint32_t q = d1 < d2 ? lo : d2 < d1 ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return sign | q;
}

float f32_of_bits(uint32_t u)
{
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

uint32_t bits_of_f32(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- Names and sizes --------------------------------------------------- */

TEST(Dtype, SizesAndNames)
{
    const char *names[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                           "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
    const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    for (int t = 0; t < loomNumTypes; t++) {
        loomDataType_t dt = (loomDataType_t)t;
        EXPECT_TRUE(loom_dtype_valid(dt));
        EXPECT_EQ(loom_dtype_size(dt), sizes[t]);
        EXPECT_STREQ(loom_dtype_name(dt), names[t]);
        EXPECT_EQ(loom_dtype_parse(names[t]), t);
    }
    /* Only values inside the enum's range: others are undefined in C++. */
    const loomDataType_t bad_types[] = {loomNumTypes, (loomDataType_t)15};
    for (loomDataType_t dt : bad_types) {
        EXPECT_FALSE(loom_dtype_valid(dt));
        EXPECT_EQ(loom_dtype_size(dt), 0u);
        EXPECT_STREQ(loom_dtype_name(dt), "invalid");
        EXPECT_EQ(loom_acc_size(dt), 0u);
        EXPECT_EQ(loom_acc_is_native(dt), 0);
    }
    const char *ops[] = {"sum", "prod", "max", "min", "avg"};
    for (int o = 0; o < loomNumOps; o++) {
        EXPECT_TRUE(loom_redop_valid((loomRedOp_t)o));
        EXPECT_STREQ(loom_redop_name((loomRedOp_t)o), ops[o]);
        EXPECT_EQ(loom_redop_parse(ops[o]), o);
    }
    EXPECT_FALSE(loom_redop_valid(loomNumOps));
    EXPECT_FALSE(loom_redop_valid((loomRedOp_t)7));
    EXPECT_STREQ(loom_redop_name(loomNumOps), "invalid");
}

TEST(Dtype, ParseAliases)
{
    struct {
        const char *name;
        int dt;
    } cases[] = {
        {"float32", loomFloat32}, {"fp32", loomFloat32},      {"FLOAT", loomFloat32},
        {"float16", loomFloat16}, {"fp16", loomFloat16},      {"Half", loomFloat16},
        {"bf16", loomBfloat16},   {"BFloat16", loomBfloat16}, {"float64", loomFloat64},
        {"fp64", loomFloat64},    {"e4m3", loomFloat8e4m3},   {"e5m2", loomFloat8e5m2},
        {"char", loomInt8},       {"int", loomInt32},         {"uint", loomUint32},
        {"i64", loomInt64},       {"u64", loomUint64},        {"u8", loomUint8},
    };
    for (const auto &c : cases)
        EXPECT_EQ(loom_dtype_parse(c.name), c.dt) << c.name;
    EXPECT_EQ(loom_dtype_parse(""), -1);
    EXPECT_EQ(loom_dtype_parse("float3"), -1);
    EXPECT_EQ(loom_dtype_parse("float32 "), -1);
    EXPECT_EQ(loom_dtype_parse(nullptr), -1);
    EXPECT_EQ(loom_redop_parse("SUM"), loomSum);
    EXPECT_EQ(loom_redop_parse("product"), loomProd);
    EXPECT_EQ(loom_redop_parse("mean"), loomAvg);
    EXPECT_EQ(loom_redop_parse("all"), -1);
    EXPECT_EQ(loom_redop_parse(nullptr), -1);
}

TEST(Kernels, AccumulatorTypes)
{
    for (int t = 0; t < loomNumTypes; t++) {
        loomDataType_t dt = (loomDataType_t)t;
        bool narrow =
            dt == loomFloat16 || dt == loomBfloat16 || dt == loomFloat8e4m3 || dt == loomFloat8e5m2;
        EXPECT_EQ(loom_acc_is_native(dt), narrow ? 0 : 1) << t;
        EXPECT_EQ(loom_acc_size(dt), narrow ? 4u : loom_dtype_size(dt)) << t;
    }
}

/* ---- Conversions ------------------------------------------------------- */

class Conversion : public ::testing::TestWithParam<const fp_format *> {};

TEST_P(Conversion, ExhaustiveDecodeAndRoundTrip)
{
    const fp_format &f = *GetParam();
    for (uint32_t b = 0; b < (1u << f.bits); b++) {
        double ref = ref_decode(f, b);
        float v = f.decode(b);
        if (std::isnan(ref)) {
            ASSERT_TRUE(std::isnan(v)) << f.name << " " << b;
            uint32_t back = f.encode(v);
            ASSERT_TRUE(std::isnan(ref_decode(f, back))) << f.name << " " << b;
            ASSERT_EQ(back & sign_bit(f), b & sign_bit(f)) << f.name << " " << b;
            continue;
        }
        ASSERT_EQ((double)v, ref) << f.name << " " << b;
        ASSERT_EQ(std::signbit(v), std::signbit(ref)) << f.name << " " << b;
        /* E5M2's infinities decode exactly but, by the saturation rule, encode
         * to the largest finite value; everything else comes back unchanged. */
        uint32_t want = b;
        if (std::isinf(ref) && f.saturating)
            want = (b & sign_bit(f)) | max_finite(f);
        ASSERT_EQ(f.encode(v), want) << f.name << " " << b;
    }
}

/* Every midpoint between neighbouring encodings is a float32 (at most 12
 * significant bits); it must round to the even neighbour, and one float32 ulp
 * either side must round to the nearer one. */
TEST_P(Conversion, MidpointsRoundToEven)
{
    const fp_format &f = *GetParam();
    uint32_t maxp = max_finite(f);
    for (uint32_t p = 0; p < maxp; p++) {
        double mid = (ref_decode(f, p) + ref_decode(f, p + 1)) / 2;
        float m = (float)mid;
        ASSERT_EQ((double)m, mid);
        uint32_t even = (p & 1) ? p + 1 : p;
        for (uint32_t s : {0u, sign_bit(f)}) {
            float ms = s ? -m : m;
            ASSERT_EQ(f.encode(ms), s | even) << f.name << " " << p;
            float up = std::nextafter(m, INFINITY), down = std::nextafter(m, 0.0f);
            ASSERT_EQ(f.encode(s ? -up : up), s | (p + 1)) << f.name << " " << p;
            ASSERT_EQ(f.encode(s ? -down : down), s | p) << f.name << " " << p;
        }
    }
}

/* Random float32 bit patterns over the whole range, then over the exponent
 * range where the format's normals and subnormals live, against ref_encode. */
TEST_P(Conversion, RandomAgainstReference)
{
    const fp_format &f = *GetParam();
    std::mt19937 rng(1234 + (unsigned)f.bits * 7 + (unsigned)f.mbits);
    int emin = 127 - f.bias - f.mbits - 3, emax_ = 127 + (1 << f.ebits) - f.bias + 1;
    if (emin < 0)
        emin = 0;
    if (emax_ > 255)
        emax_ = 255;
    std::uniform_int_distribution<int> exps(emin, emax_);
    for (int i = 0; i < (1 << 20); i++) {
        uint32_t u = rng();
        if (i & 1)
            u = (u & 0x807fffffu) | ((uint32_t)exps(rng) << 23);
        float x = f32_of_bits(u);
        uint32_t got = f.encode(x);
        if (std::isnan(x)) {
            ASSERT_TRUE(std::isnan(ref_decode(f, got))) << f.name << " " << std::hex << u;
            ASSERT_EQ(got & sign_bit(f), (u >> 31) ? sign_bit(f) : 0u);
            continue;
        }
        ASSERT_EQ(got, ref_encode(f, (double)x)) << f.name << " " << std::hex << u;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, Conversion, ::testing::ValuesIn(all_formats),
                         [](const ::testing::TestParamInfo<const fp_format *> &p) {
                             return std::string(p.param->name);
                         });

TEST(Conversion, HalfwayCases)
{
    /* 1 + half an ulp goes down to 1 (even), 1 + 1.5 ulp goes up to 1 + 2 ulp. */
    EXPECT_EQ(loom_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    EXPECT_EQ(loom_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    EXPECT_EQ(loom_f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
    EXPECT_EQ(loom_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    EXPECT_EQ(loom_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    EXPECT_EQ(loom_f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
    EXPECT_EQ(loom_f32_to_e4m3(1.0625f), 0x38);
    EXPECT_EQ(loom_f32_to_e4m3(1.1875f), 0x3a);
    EXPECT_EQ(loom_f32_to_e5m2(1.125f), 0x3c);
    EXPECT_EQ(loom_f32_to_e5m2(1.375f), 0x3e);
    /* A carry out of the mantissa moves to the next binade. */
    EXPECT_EQ(loom_f32_to_f16(2.0f - 0x1p-12f), 0x4000);
    EXPECT_EQ(loom_f32_to_e4m3(1.9375f), 0x40);
}

TEST(Conversion, Subnormals)
{
    EXPECT_EQ(loom_f32_to_f16(0x1p-24f), 0x0001);
    EXPECT_EQ(loom_f32_to_f16(0x1p-25f), 0x0000); /* tie between 0 and 2^-24: even is 0 */
    EXPECT_EQ(loom_f32_to_f16(-0x1p-25f), 0x8000);
    EXPECT_EQ(loom_f32_to_f16(0x1.000002p-25f), 0x0001);
    EXPECT_EQ(loom_f32_to_f16(3 * 0x1p-25f), 0x0002);
    EXPECT_EQ(loom_f32_to_f16(1023 * 0x1p-24f), 0x03ff);
    EXPECT_EQ(loom_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up into the normals */
    EXPECT_EQ(loom_f32_to_f16(0x1p-149f), 0x0000);
    EXPECT_EQ(loom_f16_to_f32(0x0001), 0x1p-24f);
    EXPECT_EQ(loom_f16_to_f32(0x8200), -0x1p-15f);
    EXPECT_EQ(loom_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    EXPECT_EQ(loom_f32_to_bf16(0x1p-133f), 0x0001);
    EXPECT_EQ(loom_f32_to_bf16(0x1p-149f), 0x0000);
    EXPECT_EQ(loom_bf16_to_f32(0x0001), 0x1p-133f);
    EXPECT_EQ(loom_f32_to_e4m3(0x1p-9f), 0x01);
    EXPECT_EQ(loom_f32_to_e4m3(0x1p-10f), 0x00);
    EXPECT_EQ(loom_f32_to_e4m3(3 * 0x1p-10f), 0x02);
    EXPECT_EQ(loom_f32_to_e4m3(7 * 0x1p-9f), 0x07);
    EXPECT_EQ(loom_e4m3_to_f32(0x01), 0x1p-9f);
    EXPECT_EQ(loom_e4m3_to_f32(0x85), -5 * 0x1p-9f);
    EXPECT_EQ(loom_f32_to_e5m2(0x1p-16f), 0x01);
    EXPECT_EQ(loom_f32_to_e5m2(0x1p-17f), 0x00);
    EXPECT_EQ(loom_e5m2_to_f32(0x03), 3 * 0x1p-16f);
}

TEST(Conversion, Fp8Saturates)
{
    EXPECT_EQ(loom_f32_to_e4m3(448.0f), 0x7e);
    EXPECT_EQ(loom_f32_to_e4m3(449.0f), 0x7e);
    EXPECT_EQ(loom_f32_to_e4m3(480.0f), 0x7e);
    EXPECT_EQ(loom_f32_to_e4m3(1e9f), 0x7e);
    EXPECT_EQ(loom_f32_to_e4m3(INFINITY), 0x7e);
    EXPECT_EQ(loom_f32_to_e4m3(-INFINITY), 0xfe);
    EXPECT_EQ(loom_f32_to_e4m3(-500.0f), 0xfe);
    EXPECT_EQ(loom_e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(loom_e4m3_to_f32(0xf8), -256.0f);
    EXPECT_EQ(loom_f32_to_e4m3(NAN), 0x7f);
    EXPECT_EQ(loom_f32_to_e4m3(-NAN), 0xff);
    EXPECT_TRUE(std::isnan(loom_e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(loom_e4m3_to_f32(0xff)));

    EXPECT_EQ(loom_f32_to_e5m2(57344.0f), 0x7b);
    EXPECT_EQ(loom_f32_to_e5m2(61440.0f), 0x7b);
    EXPECT_EQ(loom_f32_to_e5m2(1e30f), 0x7b);
    EXPECT_EQ(loom_f32_to_e5m2(INFINITY), 0x7b);
    EXPECT_EQ(loom_f32_to_e5m2(-INFINITY), 0xfb);
    EXPECT_EQ(loom_e5m2_to_f32(0x7b), 57344.0f);
    EXPECT_EQ(loom_e5m2_to_f32(0x7c), INFINITY);
    EXPECT_TRUE(std::isnan(loom_e5m2_to_f32(loom_f32_to_e5m2(NAN))));
    EXPECT_EQ(loom_f32_to_e5m2(-NAN) & 0x80, 0x80);
}

TEST(Conversion, F16AndBf16OverflowToInfinity)
{
    EXPECT_EQ(loom_f32_to_f16(65504.0f), 0x7bff);
    EXPECT_EQ(loom_f32_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ(loom_f32_to_f16(65520.0f), 0x7c00);
    EXPECT_EQ(loom_f32_to_f16(1e10f), 0x7c00);
    EXPECT_EQ(loom_f32_to_f16(INFINITY), 0x7c00);
    EXPECT_EQ(loom_f32_to_f16(-INFINITY), 0xfc00);
    EXPECT_EQ(loom_f32_to_f16(-1e10f), 0xfc00);
    EXPECT_EQ(loom_f16_to_f32(0x7c00), INFINITY);
    EXPECT_EQ(loom_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up */
    EXPECT_EQ(loom_f32_to_bf16(f32_of_bits(0x7f7f7fffu)), 0x7f7f);
    EXPECT_EQ(loom_f32_to_bf16(-INFINITY), 0xff80);
    uint16_t h = loom_f32_to_f16(NAN);
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x03ff, 0);
    EXPECT_EQ(loom_f32_to_bf16(f32_of_bits(0xff800001u)) & 0xff80, 0xff80);
    EXPECT_NE(loom_f32_to_bf16(f32_of_bits(0xff800001u)) & 0x7f, 0);
}

/* ---- Kernels against a scalar reference --------------------------------- */

bool is_narrow(loomDataType_t dt)
{
    return dt == loomFloat16 || dt == loomBfloat16 || dt == loomFloat8e4m3 || dt == loomFloat8e5m2;
}

bool is_float(loomDataType_t dt)
{
    return is_narrow(dt) || dt == loomFloat32 || dt == loomFloat64;
}

bool is_signed_int(loomDataType_t dt)
{
    return dt == loomInt8 || dt == loomInt32 || dt == loomInt64;
}

const fp_format *format_of(loomDataType_t dt)
{
    switch (dt) {
    case loomFloat16:
        return &fmt_f16;
    case loomBfloat16:
        return &fmt_bf16;
    case loomFloat8e4m3:
        return &fmt_e4m3;
    case loomFloat8e5m2:
        return &fmt_e5m2;
    default:
        return nullptr;
    }
}

/* One element of sz bytes as an integer, through its own width so that the
 * test does not depend on byte order. */
void put_bits(uint8_t *p, size_t sz, uint64_t v)
{
    uint8_t v8 = (uint8_t)v;
    uint16_t v16 = (uint16_t)v;
    uint32_t v32 = (uint32_t)v;
    std::memcpy(p,
                sz == 1   ? (const void *)&v8
                : sz == 2 ? (const void *)&v16
                : sz == 4 ? (const void *)&v32
                          : (const void *)&v,
                sz);
}

uint64_t get_bits(const uint8_t *p, size_t sz)
{
    uint8_t v8;
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    switch (sz) {
    case 1:
        std::memcpy(&v8, p, 1);
        return v8;
    case 2:
        std::memcpy(&v16, p, 2);
        return v16;
    case 4:
        std::memcpy(&v32, p, 4);
        return v32;
    default:
        std::memcpy(&v64, p, 8);
        return v64;
    }
}

/* Exact integer references: a sum of five 64-bit values needs 67 bits. */
__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

/* Stores the exact value v (representable by construction) as one dt element. */
void store_float(loomDataType_t dt, uint8_t *p, double v)
{
    if (dt == loomFloat32) {
        float f = (float)v;
        std::memcpy(p, &f, 4);
    } else if (dt == loomFloat64) {
        std::memcpy(p, &v, 8);
    } else {
        put_bits(p, loom_dtype_size(dt), ref_encode(*format_of(dt), v));
    }
}

void store_int(loomDataType_t dt, uint8_t *p, u128 v)
{
    put_bits(p, loom_dtype_size(dt), (uint64_t)v);
}

/* Sign- or zero-extends the element at p. */
i128 load_int(loomDataType_t dt, const uint8_t *p)
{
    size_t sz = loom_dtype_size(dt);
    uint64_t w = get_bits(p, sz);
    int bits = (int)sz * 8;
    if (is_signed_int(dt) && bits < 64 && (w >> (bits - 1)) & 1)
        w |= ~0ull << bits;
    return is_signed_int(dt) ? (i128)(int64_t)w : (i128)w;
}

u128 wrap(loomDataType_t dt, u128 v)
{
    int bits = (int)loom_dtype_size(dt) * 8;
    return bits == 64 ? (uint64_t)v : v & ((((u128)1) << bits) - 1);
}

struct kernel_case {
    loomDataType_t dt;
    loomRedOp_t op;
    size_t n;
    int nranks;
    bool alias;
};

/* Integer-valued inputs within the format's exact range, small enough that
 * every float32 sum and product below is exact. */
double float_input(loomDataType_t dt, loomRedOp_t op, std::mt19937 &rng)
{
    int lim;
    if (op == loomProd)
        lim = (dt == loomFloat8e4m3 || dt == loomFloat8e5m2) ? 4 : 8;
    else if (dt == loomFloat8e5m2)
        lim = 8;
    else if (dt == loomFloat8e4m3)
        lim = 16;
    else if (dt == loomBfloat16)
        lim = 256;
    else
        lim = 2048;
    return (double)std::uniform_int_distribution<int>(-lim, lim)(rng);
}

/* Integers use the full range, so sums and products wrap; int8 and uint8 prod
 * and sum wrap on almost every element. */
u128 int_input(std::mt19937_64 &rng)
{
    return rng();
}

void run_case(const kernel_case &c)
{
    SCOPED_TRACE(std::string(loom_dtype_name(c.dt)) + " " + loom_redop_name(c.op) +
                 " n=" + std::to_string(c.n) + " nranks=" + std::to_string(c.nranks) +
                 (c.alias ? " alias" : ""));
    const size_t sz = loom_dtype_size(c.dt), asz = loom_acc_size(c.dt);
    const size_t guard = 64;
    std::mt19937 rng((unsigned)(c.dt * 1000 + c.op * 100 + c.n + (size_t)c.nranks));
    std::mt19937_64 rng64(rng());

    std::vector<std::vector<uint8_t>> in((size_t)c.nranks, std::vector<uint8_t>(c.n * sz + 1));
    std::vector<double> fref(c.n);
    std::vector<i128> iref(c.n);
    std::vector<u128> uref(c.n);
    for (int r = 0; r < c.nranks; r++) {
        for (size_t i = 0; i < c.n; i++) {
            uint8_t *p = in[(size_t)r].data() + i * sz;
            if (is_float(c.dt)) {
                double v = float_input(c.dt, c.op, rng);
                store_float(c.dt, p, v);
                double &a = fref[i];
                if (r == 0)
                    a = v;
                else if (c.op == loomSum || c.op == loomAvg)
                    a += v;
                else if (c.op == loomProd)
                    a *= v;
                else if (c.op == loomMax)
                    a = v > a ? v : a;
                else
                    a = v < a ? v : a;
            } else {
                store_int(c.dt, p, int_input(rng64));
                i128 v = load_int(c.dt, p);
                if (r == 0) {
                    iref[i] = v;
                    uref[i] = wrap(c.dt, (u128)v);
                } else if (c.op == loomSum || c.op == loomAvg) {
                    iref[i] += v; /* exact: at most 5 * 2^64 */
                } else if (c.op == loomProd) {
                    uref[i] = wrap(c.dt, uref[i] * wrap(c.dt, (u128)v));
                } else if (c.op == loomMax) {
                    iref[i] = v > iref[i] ? v : iref[i];
                } else {
                    iref[i] = v < iref[i] ? v : iref[i];
                }
            }
        }
    }

    std::vector<uint8_t> expect(c.n * sz + 1);
    for (size_t i = 0; i < c.n; i++) {
        uint8_t *p = expect.data() + i * sz;
        if (is_float(c.dt)) {
            double v = fref[i];
            if (c.op == loomAvg) {
                v = v / c.nranks;
                if (c.dt != loomFloat64)
                    v = (double)(float)v; /* the quotient is taken in float32 */
            }
            store_float(c.dt, p, v);
        } else if (c.op == loomProd) {
            store_int(c.dt, p, uref[i]);
        } else if (c.op == loomAvg) {
            /* The wrapped sum, read in the datatype's signedness, then C division. */
            u128 w = wrap(c.dt, (u128)iref[i]);
            uint8_t tmp[8];
            store_int(c.dt, tmp, w);
            store_int(c.dt, p, (u128)(load_int(c.dt, tmp) / c.nranks));
        } else {
            store_int(c.dt, p, (u128)iref[i]);
        }
    }

    /* Both buffers get trailing guard bytes that no kernel may touch. */
    std::vector<uint8_t> acc(c.n * asz + guard, 0xa5);
    std::vector<uint8_t> dst(c.n * sz + guard, 0x5a);
    if (c.alias && loom_acc_is_native(c.dt)) {
        std::memcpy(acc.data(), in[0].data(), c.n * sz);
        loom_reduce_init(c.dt, acc.data(), acc.data(), c.n);
    } else {
        loom_reduce_init(c.dt, acc.data(), in[0].data(), c.n);
    }
    for (int r = 1; r < c.nranks; r++)
        loom_reduce_acc(c.dt, c.op, acc.data(), in[(size_t)r].data(), c.n);
    const uint8_t *out;
    if (c.alias) {
        loom_reduce_finish(c.dt, c.op, acc.data(), acc.data(), c.n, c.nranks);
        out = acc.data();
        for (size_t i = c.n * asz; i < acc.size(); i++)
            ASSERT_EQ(acc[i], 0xa5) << "acc guard byte " << i;
    } else {
        loom_reduce_finish(c.dt, c.op, dst.data(), acc.data(), c.n, c.nranks);
        out = dst.data();
        for (size_t i = c.n * sz; i < dst.size(); i++)
            ASSERT_EQ(dst[i], 0x5a) << "dst guard byte " << i;
        for (size_t i = c.n * asz; i < acc.size(); i++)
            ASSERT_EQ(acc[i], 0xa5) << "acc guard byte " << i;
    }
    for (size_t i = 0; i < c.n; i++) {
        if (std::memcmp(out + i * sz, expect.data() + i * sz, sz) != 0) {
            uint64_t got = get_bits(out + i * sz, sz), want = get_bits(&expect[i * sz], sz);
            FAIL() << "element " << i << ": got 0x" << std::hex << got << " want 0x" << want;
        }
    }
}

class KernelMatrix
    : public ::testing::TestWithParam<std::tuple<loomDataType_t, loomRedOp_t, bool>> {};

TEST_P(KernelMatrix, MatchesReference)
{
    loomDataType_t dt = std::get<0>(GetParam());
    loomRedOp_t op = std::get<1>(GetParam());
    bool alias = std::get<2>(GetParam());
    for (size_t n : {0, 1, 7, 1000, 4097}) {
        for (int nranks : {1, 2, 3, 5}) {
            run_case({dt, op, n, nranks, alias});
            if (HasFatalFailure() || HasNonfatalFailure())
                return;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllOps, KernelMatrix,
                         ::testing::Combine(::testing::Range((loomDataType_t)0, loomNumTypes),
                                            ::testing::Range((loomRedOp_t)0, loomNumOps),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<KernelMatrix::ParamType> &p) {
                             return std::string(loom_dtype_name(std::get<0>(p.param))) + "_" +
                                    loom_redop_name(std::get<1>(p.param)) +
                                    (std::get<2>(p.param) ? "_alias" : "");
                         });

/* ---- Targeted kernel cases ---------------------------------------------- */

template <typename T>
std::vector<T> reduce(loomDataType_t dt, loomRedOp_t op, const std::vector<std::vector<T>> &in)
{
    size_t n = in[0].size();
    std::vector<uint8_t> acc(n * loom_acc_size(dt));
    std::vector<T> out(n);
    loom_reduce_init(dt, acc.data(), in[0].data(), n);
    for (size_t r = 1; r < in.size(); r++)
        loom_reduce_acc(dt, op, acc.data(), in[r].data(), n);
    loom_reduce_finish(dt, op, out.data(), acc.data(), n, (int)in.size());
    return out;
}

TEST(Kernels, IntegerWraparound)
{
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomSum, {{100}, {100}})[0], -56);
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomProd, {{-128}, {-1}})[0], -128);
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomProd, {{16}, {16}, {3}})[0], 0);
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomSum, {{200}, {100}})[0], 44);
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomProd, {{16}, {16}})[0], 0);
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomProd, {{255}, {255}})[0], 1);
    EXPECT_EQ(reduce<int32_t>(loomInt32, loomSum, {{INT32_MAX}, {1}})[0], INT32_MIN);
    EXPECT_EQ(reduce<int32_t>(loomInt32, loomProd, {{INT32_MIN}, {-1}})[0], INT32_MIN);
    EXPECT_EQ(reduce<int64_t>(loomInt64, loomSum, {{INT64_MAX}, {INT64_MAX}})[0], -2);
    EXPECT_EQ(reduce<int64_t>(loomInt64, loomProd, {{INT64_MIN}, {-1}})[0], INT64_MIN);
    EXPECT_EQ(reduce<uint64_t>(loomUint64, loomSum, {{UINT64_MAX}, {2}})[0], 1u);
    /* avg divides the wrapped sum, truncating toward zero. */
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomAvg, {{100}, {100}})[0], -28);
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomAvg, {{200}, {100}})[0], 22);
    EXPECT_EQ(reduce<int32_t>(loomInt32, loomAvg, {{-4}, {-3}})[0], -3);
    EXPECT_EQ(reduce<uint32_t>(loomUint32, loomAvg, {{1}, {UINT32_MAX}, {5}})[0], 1u);
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomMax, {{-128}, {127}, {0}})[0], 127);
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomMin, {{200}, {3}, {255}})[0], 3);
    EXPECT_EQ(reduce<uint32_t>(loomUint32, loomMax, {{0x80000000u}, {1}})[0], 0x80000000u);
    EXPECT_EQ(reduce<int64_t>(loomInt64, loomMin, {{INT64_MIN}, {INT64_MAX}})[0], INT64_MIN);
}

TEST(Kernels, Int8AvgWithManyRanks)
{
    /* nranks above 127 must not be narrowed to the 8-bit type before dividing. */
    std::vector<std::vector<int8_t>> in(200, std::vector<int8_t>{1});
    in[0][0] = -128; /* wrapped sum: -128 + 199 = 71 */
    EXPECT_EQ(reduce<int8_t>(loomInt8, loomAvg, in)[0], 0);
    std::vector<std::vector<uint8_t>> uin(300, std::vector<uint8_t>{255});
    /* 300 * 255 mod 256 = 76, 76 / 300 = 0 */
    EXPECT_EQ(reduce<uint8_t>(loomUint8, loomAvg, uin)[0], 0);
    std::vector<std::vector<float>> fin(3, std::vector<float>{1.0f});
    EXPECT_EQ(reduce<float>(loomFloat32, loomAvg, fin)[0], 1.0f);
}

TEST(Kernels, FloatMaxMinPropagateNan)
{
    const float qa = f32_of_bits(0x7fc00001u), qb = f32_of_bits(0xffc00002u);
    for (loomRedOp_t op : {loomMax, loomMin}) {
        std::vector<float> got =
            reduce<float>(loomFloat32, op,
                          {{qa, 1.0f, qa, 1.0f, -0.0f, 0.0f}, {2.0f, qb, qb, 1.0f, 0.0f, -0.0f}});
        EXPECT_EQ(bits_of_f32(got[0]), 0x7fc00001u);
        EXPECT_EQ(bits_of_f32(got[1]), 0xffc00002u);
        EXPECT_EQ(bits_of_f32(got[2]), 0x7fc00001u); /* the accumulator's NaN wins */
        EXPECT_EQ(got[3], 1.0f);
        /* Equal operands (+0 == -0): the incoming one is kept. */
        EXPECT_EQ(bits_of_f32(got[4]), 0x00000000u);
        EXPECT_EQ(bits_of_f32(got[5]), 0x80000000u);
    }
    std::vector<double> d = reduce<double>(loomFloat64, loomMin, {{1.0, NAN}, {NAN, -5.0}});
    EXPECT_TRUE(std::isnan(d[0]));
    EXPECT_TRUE(std::isnan(d[1]));
    const uint16_t hnan = 0x7e00, one = 0x3c00, two = 0x4000;
    std::vector<uint16_t> h =
        reduce<uint16_t>(loomFloat16, loomMax, {{hnan, one, two}, {one, hnan, one}});
    EXPECT_TRUE(std::isnan(loom_f16_to_f32(h[0])));
    EXPECT_TRUE(std::isnan(loom_f16_to_f32(h[1])));
    EXPECT_EQ(h[2], two);
    std::vector<uint8_t> e = reduce<uint8_t>(loomFloat8e4m3, loomMin, {{0x7f, 0x38}, {0x38, 0xff}});
    EXPECT_EQ(e[0] & 0x7f, 0x7f);
    EXPECT_EQ(e[1], 0xff);
}

TEST(Kernels, NarrowSumRoundsOnceAtFinish)
{
    /* 2048 + 1 + 1 is 2050 in float32; adding 1 to 2048 in f16 each time would
     * stay at 2048 (the f16 spacing there is 2). */
    uint16_t a = loom_f32_to_f16(2048.0f), b = loom_f32_to_f16(1.0f);
    EXPECT_EQ(loom_f16_to_f32(reduce<uint16_t>(loomFloat16, loomSum, {{a}, {b}, {b}})[0]), 2050.0f);
    /* e4m3: 448 + 448 saturates in finish, it does not become NaN. */
    EXPECT_EQ(reduce<uint8_t>(loomFloat8e4m3, loomSum, {{0x7e}, {0x7e}})[0], 0x7e);
    /* bf16 and f16: overflow in finish is infinity. */
    uint16_t big = loom_f32_to_f16(60000.0f);
    EXPECT_EQ(reduce<uint16_t>(loomFloat16, loomSum, {{big}, {big}})[0], 0x7c00);
    EXPECT_EQ(reduce<uint16_t>(loomFloat16, loomAvg, {{big}, {big}})[0], big);
}

/* The kernels convert whole blocks with plain (normal-range) converters when
 * they can and with the general ones otherwise, or with vector instructions;
 * all must give exactly the scalar functions' bits. Every encoding is
 * decoded, in order (mostly plain blocks) and shuffled (mostly mixed
 * blocks), and float32 values of every kind are encoded, through init, acc
 * and finish, on the kernels in use; the test below runs it on every
 * instruction set this CPU has. */
void bulk_conversions_match_scalar()
{
    SCOPED_TRACE(loom_kernels_isa_name(loom_kernels_isa()));
    for (loomDataType_t dt : {loomFloat16, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2}) {
        const fp_format &f = *format_of(dt);
        const size_t sz = loom_dtype_size(dt);
        SCOPED_TRACE(f.name);
        std::mt19937 rng(99);
        std::vector<uint32_t> codes;
        for (int pass = 0; pass < 2; pass++) {
            std::vector<uint32_t> all(1u << f.bits);
            for (uint32_t b = 0; b < all.size(); b++)
                all[b] = b;
            if (pass == 1)
                std::shuffle(all.begin(), all.end(), rng);
            codes.insert(codes.end(), all.begin(), all.end());
        }
        codes.resize(codes.size() - 5); /* leave a partial block at the end */
        const size_t n = codes.size();
        std::vector<uint8_t> src(n * sz);
        for (size_t i = 0; i < n; i++)
            put_bits(&src[i * sz], sz, codes[i]);

        std::vector<float> acc(n);
        loom_reduce_init(dt, acc.data(), src.data(), n);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(bits_of_f32(acc[i]), bits_of_f32(f.decode(codes[i]))) << i;

        std::vector<float> base(n);
        for (size_t i = 0; i < n; i++)
            base[i] = (float)(int)(i % 7) - 3.0f;
        acc = base;
        loom_reduce_acc(dt, loomSum, acc.data(), src.data(), n);
        for (size_t i = 0; i < n; i++) {
            float want = base[i] + f.decode(codes[i]);
            if (std::isnan(want))
                ASSERT_TRUE(std::isnan(acc[i])) << i;
            else
                ASSERT_EQ(bits_of_f32(acc[i]), bits_of_f32(want)) << i;
        }

        /* Encode: the decoded values, their neighbours one float32 ulp away,
         * and random bit patterns, in runs (plain blocks) and shuffled. */
        std::vector<float> vals;
        for (uint32_t b = 0; b < (1u << f.bits); b++) {
            float v = f.decode(b);
            vals.push_back(v);
            vals.push_back(std::nextafter(v, INFINITY));
            vals.push_back(std::nextafter(v, -INFINITY));
        }
        for (int i = 0; i < 100000; i++)
            vals.push_back(f32_of_bits((uint32_t)rng()));
        std::vector<float> shuffled = vals;
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        vals.insert(vals.end(), shuffled.begin(), shuffled.end());
        /* Sorted runs between every pair of neighbouring encodings and past
         * the largest one, so that whole blocks fall inside the subnormal
         * range or the overflow range and a wrong plain-block test shows. */
        std::vector<float> dense;
        const uint32_t maxp = max_finite(f);
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        const int per_gap = std::max(2, 8192 / (int)maxp);
        const double vmax = ref_decode(f, maxp), ulp = vmax - ref_decode(f, maxp - 1);
        for (uint32_t p = 0; p <= maxp + 2; p++) {
            /* Past the largest encoding: one ulp further, then up to 2x. */
            double lo = p <= maxp ? ref_decode(f, p) : p == maxp + 1 ? vmax + ulp : vmax;
            double hi = p < maxp ? ref_decode(f, p + 1) : p == maxp ? vmax + ulp : 2 * vmax;
            for (int k = 0; k < (p < maxp ? per_gap : 256); k++)
                dense.push_back((float)(lo + (hi - lo) * unit(rng)));
        }
        std::sort(dense.begin(), dense.end());
        for (float v : dense)
            vals.push_back(v);
        for (float v : dense)
            vals.push_back(-v);
        for (loomRedOp_t op : {loomSum, loomAvg}) {
            std::vector<uint8_t> out(vals.size() * sz);
            loom_reduce_finish(dt, op, out.data(), vals.data(), vals.size(), 3);
            for (size_t i = 0; i < vals.size(); i++) {
                uint64_t got = get_bits(&out[i * sz], sz);
                float x = op == loomAvg ? vals[i] / 3.0f : vals[i];
                ASSERT_EQ(got, f.encode(x)) << i << " " << std::hex << bits_of_f32(vals[i]);
            }
        }
    }
}

struct restore_kernels_isa {
    loom_kernels_isa_t isa = loom_kernels_isa();
    ~restore_kernels_isa()
    {
        loom_kernels_use(isa);
    }
};

TEST(Kernels, BulkConversionsMatchScalar)
{
    restore_kernels_isa restore;
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        if (loom_kernels_use((loom_kernels_isa_t)isa) == loomSuccess)
            bulk_conversions_match_scalar();
        if (HasFatalFailure())
            return;
    }
}

TEST(Kernels, InvalidArgumentsDoNothing)
{
    std::vector<uint8_t> acc(64, 0x11), src(64, 0x22), ref_acc = acc;
    const loomDataType_t bad_types[] = {loomNumTypes, (loomDataType_t)15};
    const loomRedOp_t bad_ops[] = {loomNumOps, (loomRedOp_t)7};
    for (loomDataType_t dt : bad_types) {
        loom_reduce_init(dt, acc.data(), src.data(), 8);
        loom_reduce_acc(dt, loomSum, acc.data(), src.data(), 8);
        loom_reduce_finish(dt, loomSum, acc.data(), src.data(), 8, 2);
    }
    for (loomRedOp_t op : bad_ops) {
        loom_reduce_acc(loomFloat32, op, acc.data(), src.data(), 8);
        loom_reduce_finish(loomFloat32, op, acc.data(), src.data(), 8, 2);
    }
    EXPECT_EQ(acc, ref_acc);
    /* n == 0 never dereferences. */
    for (int t = 0; t < loomNumTypes; t++) {
        loomDataType_t dt = (loomDataType_t)t;
        loom_reduce_init(dt, nullptr, nullptr, 0);
        for (int o = 0; o < loomNumOps; o++) {
            loom_reduce_acc(dt, (loomRedOp_t)o, nullptr, nullptr, 0);
            loom_reduce_finish(dt, (loomRedOp_t)o, nullptr, nullptr, 0, 3);
        }
    }
    /* nranks < 1 is taken as 1. */
    std::vector<float> f = {6.0f};
    loom_reduce_finish(loomFloat32, loomAvg, f.data(), f.data(), 1, 0);
    EXPECT_EQ(f[0], 6.0f);
}

} // namespace

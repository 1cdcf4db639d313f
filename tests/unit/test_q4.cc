/* SPDX-License-Identifier: Apache-2.0
 *
 * test_q4.cc - unit tests of the 4-bit block codec (src/quant/q4.h): the
 * scalar code against a reference written from the header's formula in
 * C++; accuracy on Gaussian data (error, no -8 codes, no clipping); the
 * residual identity and err_out == err_in; tail padding; every instruction
 * set this CPU has against the scalar code, bit for bit, on random data of
 * many lengths, hostile blocks (zeros, subnormals, NaN, infinities, values
 * near FLT_MAX, ties) and foreign code bytes, and on a cut-off group that
 * ends its tile encoded over a stack full of ones; and a codec-only
 * simulation of all-reduces that shows quantizing each contribution once
 * (two-shot) keeps the error flat in the number of ranks while re-quantizing
 * at every ring hop does not. Random data comes from fixed seeds, printed on
 * failure.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"
#include "kernels.h"
#include "q4.h"

namespace {

const loomDataType_t q4_types[] = {loomFloat32, loomBfloat16, loomFloat16};

float from_bits(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint32_t to_bits(float f)
{
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

/* Values in datatype dt, stored as raw bytes. */
struct Values {
    loomDataType_t dt;
    std::vector<uint8_t> raw;

    Values(loomDataType_t t, size_t n) : dt(t), raw(n * loom_dtype_size(t)) {}
    size_t size() const
    {
        return raw.size() / loom_dtype_size(dt);
    }
    void set(size_t i, float v)
    {
        if (dt == loomFloat32) {
            std::memcpy(&raw[4 * i], &v, 4);
        } else {
            uint16_t h = dt == loomBfloat16 ? loom_f32_to_bf16(v) : loom_f32_to_f16(v);
            std::memcpy(&raw[2 * i], &h, 2);
        }
    }
    void set_bits16(size_t i, uint16_t h)
    {
        std::memcpy(&raw[2 * i], &h, 2);
    }
    float get(size_t i) const
    {
        if (dt == loomFloat32) {
            float f;
            std::memcpy(&f, &raw[4 * i], 4);
            return f;
        }
        uint16_t h;
        std::memcpy(&h, &raw[2 * i], 2);
        return dt == loomBfloat16 ? loom_bf16_to_f32(h) : loom_f16_to_f32(h);
    }
    const void *data() const
    {
        return raw.data();
    }
};

std::vector<loom_kernels_isa_t> vector_isas()
{
    std::vector<loom_kernels_isa_t> v;
    for (int isa = 1; isa < LOOM_KERNELS_NUM_ISA; isa++)
        if (loom_kernels_isa_available((loom_kernels_isa_t)isa))
            v.push_back((loom_kernels_isa_t)isa);
    return v;
}

/* Index of the first differing byte, or -1. */
long first_diff(const void *a, const void *b, size_t nbytes)
{
    const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
    for (size_t i = 0; i < nbytes; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

float scale_of(const std::vector<uint8_t> &q, size_t block)
{
    size_t off = block / 64 * LOOM_Q4_TILE_BYTES + 1024 + block % 64 * 2;
    return from_bits((uint32_t)(q[off] | q[off + 1] << 8) << 16);
}

uint16_t scale_bits_of(const std::vector<uint8_t> &q, size_t block)
{
    size_t off = block / 64 * LOOM_Q4_TILE_BYTES + 1024 + block % 64 * 2;
    return (uint16_t)(q[off] | q[off + 1] << 8);
}

int code_of(const std::vector<uint8_t> &q, size_t i)
{
    size_t off = i / LOOM_Q4_TILE * LOOM_Q4_TILE_BYTES + i % LOOM_Q4_TILE / 2;
    int nib = (i & 1) ? q[off] >> 4 : q[off] & 0xf;
    return nib >= 8 ? nib - 16 : nib;
}

// ---- A reference written from q4.h's text --------------------------------------

/* One block of u (32 values) as q4.h describes it, with the libm rounding
 * function and the float classification of <cmath> instead of bit tricks. */
void ref_block(const float *u, uint8_t codes[16], uint16_t *scale_bits, float err[32])
{
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; j++) {
        if (!std::isfinite(u[j]))
            finite = false;
        else
            amax = std::max(amax, std::fabs(u[j]));
    }
    uint32_t sb;
    if (!finite) {
        sb = 0x7fc0;
    } else if (amax < 0x1p-123f) {
        sb = 0;
    } else {
        uint32_t qb = to_bits(amax / 7.0f);
        sb = (qb >> 16) + ((qb & 0xffff) != 0 ? 1 : 0);
        sb = std::min<uint32_t>(sb, 0x7e12);
    }
    *scale_bits = (uint16_t)sb;
    const float scale = from_bits(sb << 16);
    int c[32];
    for (int j = 0; j < 32; j++) {
        c[j] = 0;
        if (finite && sb != 0) {
            float inv = 1.0f / scale;
            float v = u[j] * inv;
            float r = std::nearbyint(v);
            r = std::min(7.0f, std::max(-7.0f, r));
            c[j] = (int)r;
        }
        float d = (float)c[j] * scale;
        err[j] = u[j] - d;
    }
    for (int k = 0; k < 16; k++)
        codes[k] = (uint8_t)((c[2 * k] & 0xf) | (c[2 * k + 1] & 0xf) << 4);
}

/* The whole stream and residuals of the reference. */
void ref_encode(const Values &x, const float *err_in, size_t n, std::vector<uint8_t> &q,
                std::vector<float> &err)
{
    q.assign(loom_q4_bytes(n), 0);
    err.assign(n, 0.0f);
    for (size_t i0 = 0; i0 < n; i0 += 32) {
        float u[32], e[32];
        for (size_t j = 0; j < 32; j++) {
            size_t i = i0 + j;
            u[j] = i >= n ? 0.0f : err_in != nullptr ? x.get(i) + err_in[i] : x.get(i);
        }
        size_t k = i0 / 32;
        uint16_t sb;
        ref_block(u, &q[k / 64 * LOOM_Q4_TILE_BYTES + k % 64 * 16], &sb, e);
        q[k / 64 * LOOM_Q4_TILE_BYTES + 1024 + k % 64 * 2] = (uint8_t)(sb & 0xff);
        q[k / 64 * LOOM_Q4_TILE_BYTES + 1024 + k % 64 * 2 + 1] = (uint8_t)(sb >> 8);
        for (size_t j = 0; j < 32 && i0 + j < n; j++)
            err[i0 + j] = e[j];
    }
}

/* Gaussian values whose per-block magnitude varies over 2^-lo_exp..2^hi_exp,
 * so that scales of many exponents (and the tiny-block path) are exercised. */
void fill_varied(Values &x, std::mt19937 &rng, int lo_exp, int hi_exp)
{
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_int_distribution<int> e(lo_exp, hi_exp);
    float mul = 1.0f;
    for (size_t i = 0; i < x.size(); i++) {
        if (i % 32 == 0)
            mul = std::ldexp(1.0f, e(rng));
        x.set(i, g(rng) * mul);
    }
}

std::vector<float> small_residuals(const Values &x, std::mt19937 &rng)
{
    std::normal_distribution<float> g(0.0f, 0.05f);
    std::vector<float> e(x.size());
    for (size_t i = 0; i < e.size(); i++)
        e[i] = g(rng) * std::fabs(x.get(i));
    return e;
}

// ---- Layout and the scalar code ---------------------------------------------------

TEST(Q4Codec, Bytes)
{
    EXPECT_EQ(loom_q4_bytes(0), 0u);
    EXPECT_EQ(loom_q4_bytes(1), 1152u);
    EXPECT_EQ(loom_q4_bytes(2047), 1152u);
    EXPECT_EQ(loom_q4_bytes(2048), 1152u);
    EXPECT_EQ(loom_q4_bytes(2049), 2304u);
    EXPECT_EQ(loom_q4_bytes((size_t)1 << 20), 512u * 1152u);
    EXPECT_TRUE(loom_q4_dtype_ok(loomFloat32));
    EXPECT_TRUE(loom_q4_dtype_ok(loomFloat16));
    EXPECT_TRUE(loom_q4_dtype_ok(loomBfloat16));
    EXPECT_FALSE(loom_q4_dtype_ok(loomFloat64));
    EXPECT_FALSE(loom_q4_dtype_ok(loomInt8));
}

TEST(Q4Codec, ScalarMatchesSpec)
{
    const unsigned seed = 11;
    std::mt19937 rng(seed);
    for (loomDataType_t dt : q4_types) {
        const size_t n = 3 * 2048 + 77;
        Values x(dt, n);
        fill_varied(x, rng, dt == loomFloat16 ? -20 : -135, dt == loomFloat16 ? 10 : 120);
        std::vector<float> ein = small_residuals(x, rng);
        for (int with_e = 0; with_e < 2; with_e++) {
            std::vector<uint8_t> want, got(loom_q4_bytes(n), 0xa5);
            std::vector<float> werr, gerr(n);
            ref_encode(x, with_e ? ein.data() : nullptr, n, want, werr);
            loom_q4_encode_isa(LOOM_KERNELS_SCALAR, x.data(), dt, with_e ? ein.data() : nullptr,
                               gerr.data(), n, got.data());
            long d = first_diff(want.data(), got.data(), want.size());
            EXPECT_EQ(d, -1) << "seed " << seed << " dt " << loom_dtype_name(dt) << " err_in "
                             << with_e << ": code byte " << d;
            d = first_diff(werr.data(), gerr.data(), n * 4);
            EXPECT_EQ(d, -1) << "seed " << seed << " dt " << loom_dtype_name(dt) << " err_in "
                             << with_e << ": residual " << d / 4;
        }
    }
}

/* Exact ties round to even: with amax 7 the scale is 1 and the inverse 1. */
TEST(Q4Codec, TiesToEven)
{
    const float in[16] = {7.0f,  0.5f,  1.5f,  2.5f,  3.5f,  4.5f,  5.5f,  6.5f,
                          -0.5f, -1.5f, -2.5f, -3.5f, -6.5f, 0.25f, -7.0f, 0.0f};
    const int want[16] = {7, 0, 2, 2, 4, 4, 6, 6, 0, -2, -2, -4, -6, 0, -7, 0};
    std::vector<float> x(32, 0.0f);
    std::copy(in, in + 16, x.begin());
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        if (!loom_kernels_isa_available((loom_kernels_isa_t)isa))
            continue;
        std::vector<uint8_t> q(loom_q4_bytes(32));
        loom_q4_encode_isa((loom_kernels_isa_t)isa, x.data(), loomFloat32, nullptr, nullptr, 32,
                           q.data());
        EXPECT_EQ(scale_bits_of(q, 0), 0x3f80) << loom_kernels_isa_name((loom_kernels_isa_t)isa);
        for (int i = 0; i < 16; i++)
            EXPECT_EQ(code_of(q, (size_t)i), want[i])
                << loom_kernels_isa_name((loom_kernels_isa_t)isa) << " value " << in[i];
    }
}

TEST(Q4Codec, GaussianRoundTrip)
{
    const unsigned seed = 1;
    const size_t n = (size_t)1 << 20;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(n), y(n);
    for (float &v : x)
        v = g(rng);
    std::vector<uint8_t> q(loom_q4_bytes(n));
    loom_q4_encode(x.data(), loomFloat32, nullptr, nullptr, n, q.data());
    loom_q4_decode(q.data(), n, y.data(), loomFloat32);

    double num = 0, den = 0;
    size_t minus8 = 0, clipped = 0, far = 0;
    for (size_t b = 0; b < n / 32; b++) {
        double amax = 0;
        for (size_t j = 0; j < 32; j++)
            amax = std::max(amax, std::fabs((double)x[32 * b + j]));
        const double scale = scale_of(q, b);
        for (size_t j = 0; j < 32; j++) {
            size_t i = 32 * b + j;
            double err = (double)x[i] - (double)y[i];
            num += err * err;
            den += (double)x[i] * x[i];
            minus8 += code_of(q, i) == -8;
            clipped += std::fabs((double)y[i]) > amax * (1.0 + 0x1p-7);
            far += std::fabs(err) > scale / 2;
        }
    }
    const double rel = std::sqrt(num / den);
    std::printf("q4 round trip of %zu N(0,1) values (seed %u, %s): relative L2 error %.4f\n", n,
                seed, loom_kernels_isa_name(loom_kernels_isa()), rel);
    EXPECT_LE(rel, 0.105) << "seed " << seed;
    EXPECT_GE(rel, 0.08) << "seed " << seed << ": suspiciously small";
    EXPECT_EQ(minus8, 0u) << "seed " << seed << ": codes of -8";
    EXPECT_EQ(clipped, 0u) << "seed " << seed << ": |D(Q(x))| above absmax * (1 + 2^-7)";
    EXPECT_EQ(far, 0u) << "seed " << seed << ": |x - D(Q(x))| above scale / 2";
}

/* err_out is u - D(code) exactly, and err_out == err_in gives the same. */
TEST(Q4Codec, ResidualIdentity)
{
    const unsigned seed = 5;
    std::mt19937 rng(seed);
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        if (!loom_kernels_isa_available((loom_kernels_isa_t)isa))
            continue;
        const char *iname = loom_kernels_isa_name((loom_kernels_isa_t)isa);
        for (loomDataType_t dt : q4_types) {
            const size_t n = 5000;
            Values x(dt, n);
            fill_varied(x, rng, -8, 8);
            std::vector<float> ein = small_residuals(x, rng), eout(n), d(n);
            std::vector<uint8_t> q(loom_q4_bytes(n)), q2(loom_q4_bytes(n));
            loom_q4_encode_isa((loom_kernels_isa_t)isa, x.data(), dt, ein.data(), eout.data(), n,
                               q.data());
            loom_q4_decode_isa((loom_kernels_isa_t)isa, q.data(), n, d.data(), loomFloat32);
            for (size_t i = 0; i < n; i++) {
                float u = x.get(i) + ein[i];
                float want = u - d[i];
                ASSERT_EQ(to_bits(eout[i]), to_bits(want))
                    << iname << " seed " << seed << " dt " << loom_dtype_name(dt) << " i " << i;
            }
            std::vector<float> inplace = ein;
            loom_q4_encode_isa((loom_kernels_isa_t)isa, x.data(), dt, inplace.data(),
                               inplace.data(), n, q2.data());
            EXPECT_EQ(first_diff(q.data(), q2.data(), q.size()), -1) << iname << " in place";
            EXPECT_EQ(first_diff(eout.data(), inplace.data(), n * 4), -1) << iname << " in place";
        }
    }
}

/* The tile past n: code nibbles 0, scales 0, whatever was in the buffer. */
TEST(Q4Codec, TailPadding)
{
    const unsigned seed = 9;
    std::mt19937 rng(seed);
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        if (!loom_kernels_isa_available((loom_kernels_isa_t)isa))
            continue;
        for (size_t n : {1ul, 31ul, 33ul, 100ul, 511ul, 513ul, 2047ul, 2049ul, 4000ul}) {
            Values x(loomFloat32, n);
            fill_varied(x, rng, 0, 0);
            std::vector<uint8_t> q(loom_q4_bytes(n), 0xa5);
            loom_q4_encode_isa((loom_kernels_isa_t)isa, x.data(), loomFloat32, nullptr, nullptr, n,
                               q.data());
            const size_t nvals = q.size() / LOOM_Q4_TILE_BYTES * LOOM_Q4_TILE;
            for (size_t i = n; i < nvals; i++)
                ASSERT_EQ(code_of(q, i), 0)
                    << loom_kernels_isa_name((loom_kernels_isa_t)isa) << " n " << n << " i " << i;
            for (size_t b = (n + 31) / 32; b < nvals / 32; b++)
                ASSERT_EQ(scale_bits_of(q, b), 0) << loom_kernels_isa_name((loom_kernels_isa_t)isa)
                                                  << " n " << n << " block " << b;
        }
    }
}

// ---- Every instruction set against the scalar code ----------------------------------

/* Encodes with isa and with the scalar code and compares bytes and
 * residuals, then decodes the stream both ways into every datatype and
 * into an accumulator. */
void expect_same(loom_kernels_isa_t isa, const Values &x, const std::vector<float> *ein, int eout,
                 const std::string &what)
{
    const size_t n = x.size();
    const char *iname = loom_kernels_isa_name(isa);
    std::vector<uint8_t> qs(loom_q4_bytes(n) + 1, 0x5a), qv(loom_q4_bytes(n) + 1, 0xa5);
    std::vector<float> es(n, 1.0f), ev(n, 2.0f);
    const float *ei = ein != nullptr ? ein->data() : nullptr;
    /* qv + 1: the code stream has no alignment requirement. */
    loom_q4_encode_isa(LOOM_KERNELS_SCALAR, x.data(), x.dt, ei, eout ? es.data() : nullptr, n,
                       qs.data());
    loom_q4_encode_isa(isa, x.data(), x.dt, ei, eout ? ev.data() : nullptr, n, qv.data() + 1);
    long d = first_diff(qs.data(), qv.data() + 1, loom_q4_bytes(n));
    ASSERT_EQ(d, -1) << iname << " " << what << ": encoded byte " << d;
    if (eout) {
        d = first_diff(es.data(), ev.data(), n * 4);
        ASSERT_EQ(d, -1) << iname << " " << what << ": residual " << d / 4 << " scalar "
                         << es[(size_t)d / 4] << " vector " << ev[(size_t)d / 4];
    }
    for (loomDataType_t ot : q4_types) {
        Values ys(ot, n), yv(ot, n);
        loom_q4_decode_isa(LOOM_KERNELS_SCALAR, qs.data(), n, ys.raw.data(), ot);
        loom_q4_decode_isa(isa, qv.data() + 1, n, yv.raw.data(), ot);
        d = first_diff(ys.raw.data(), yv.raw.data(), ys.raw.size());
        ASSERT_EQ(d, -1) << iname << " " << what << ": decoded " << loom_dtype_name(ot) << " byte "
                         << d;
    }
    std::vector<float> as(n), av;
    for (size_t i = 0; i < n; i++)
        as[i] = (float)(i % 7) - 3.0f;
    av = as;
    loom_q4_decode_acc_isa(LOOM_KERNELS_SCALAR, qs.data(), n, as.data());
    loom_q4_decode_acc_isa(isa, qv.data() + 1, n, av.data());
    d = first_diff(as.data(), av.data(), n * 4);
    ASSERT_EQ(d, -1) << iname << " " << what << ": decode_acc value " << d / 4;
}

TEST(Q4Isa, MatchScalarRandom)
{
    std::vector<loom_kernels_isa_t> isas = vector_isas();
    if (isas.empty())
        GTEST_SKIP() << "no vector instruction set on this machine";
    /* An instruction set out of range runs the scalar code. */
    isas.push_back(LOOM_KERNELS_NUM_ISA);
    const size_t lengths[] = {0,    1,    2,    15,   16,   17,    31,    32,        33,   63,
                              64,   255,  256,  257,  511,  512,   513,   1000,      2047, 2048,
                              2049, 4095, 4096, 4097, 6143, 10000, 12345, 65536 + 17};
    const unsigned seed = 3;
    std::mt19937 rng(seed);
    for (loomDataType_t dt : q4_types) {
        for (size_t n : lengths) {
            Values x(dt, n);
            fill_varied(x, rng, dt == loomFloat16 ? -16 : -130, dt == loomFloat16 ? 12 : 126);
            std::vector<float> ein = small_residuals(x, rng);
            for (loom_kernels_isa_t isa : isas) {
                for (int mode = 0; mode < 4; mode++) {
                    std::string what = "seed " + std::to_string(seed) + " " + loom_dtype_name(dt) +
                                       " n " + std::to_string(n) + " err_in " +
                                       std::to_string(mode & 1) + " err_out " +
                                       std::to_string(mode >> 1);
                    expect_same(isa, x, (mode & 1) ? &ein : nullptr, mode >> 1, what);
                    if (HasFatalFailure())
                        return;
                }
            }
        }
    }
}

/* Blocks of 32 that stress the scale step; each type gets the same list. */
std::vector<std::vector<float>> special_blocks(std::mt19937 &rng)
{
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.9f, 1.0f);
    std::vector<std::vector<float>> blocks;
    auto gauss = [&](float mul) {
        std::vector<float> b(32);
        for (float &v : b)
            v = g(rng) * mul;
        return b;
    };
    blocks.push_back(std::vector<float>(32, 0.0f));
    blocks.push_back(std::vector<float>(32, -0.0f));
    std::vector<float> sub(32);
    for (size_t j = 0; j < 32; j++)
        sub[j] = from_bits((uint32_t)rng() & 0x807fffffu);
    blocks.push_back(sub);
    std::vector<float> below = gauss(0x1p-126f);
    below[7] = from_bits(0x01ffffff); /* just under 2^-123: all codes 0 */
    blocks.push_back(below);
    std::vector<float> at = gauss(0x1p-126f);
    at[3] = -0x1p-123f; /* the smallest amax with a real scale */
    blocks.push_back(at);
    std::vector<float> fmin(32, 0.0f);
    fmin[0] = FLT_MIN;
    fmin[1] = -FLT_MIN / 3;
    blocks.push_back(fmin);
    std::vector<float> one_nan = gauss(1.0f);
    one_nan[5] = NAN;
    blocks.push_back(one_nan);
    std::vector<float> snan = gauss(1.0f);
    snan[30] = from_bits(0xff800001u);
    blocks.push_back(snan);
    std::vector<float> pinf = gauss(3.0f);
    pinf[31] = INFINITY;
    blocks.push_back(pinf);
    std::vector<float> ninf = gauss(3.0f);
    ninf[0] = -INFINITY;
    blocks.push_back(ninf);
    std::vector<float> huge(32);
    for (float &v : huge)
        v = (rng() & 1 ? -FLT_MAX : FLT_MAX) * unit(rng);
    blocks.push_back(huge);
    std::vector<float> fmax = gauss(1e37f);
    fmax[9] = FLT_MAX;
    fmax[10] = -FLT_MAX;
    blocks.push_back(fmax);
    std::vector<float> ties(32, 0.0f);
    const float t[] = {7.0f, 0.5f, 1.5f, 2.5f, -2.5f, 3.5f, -6.5f, 6.5f, -0.5f};
    std::copy(t, t + 9, ties.begin());
    blocks.push_back(ties);
    blocks.push_back(std::vector<float>(32, 1.0f));
    std::vector<float> wide = gauss(1e-30f);
    wide[17] = 1e30f;
    blocks.push_back(wide);
    std::vector<float> exact = gauss(1.0f);
    exact[0] = 10.5f; /* amax / 7 = 1.5 exactly: no rounding up */
    for (float &v : exact)
        v = std::max(-10.5f, std::min(10.5f, v));
    blocks.push_back(exact);
    blocks.push_back(gauss(1.0f));
    return blocks;
}

TEST(Q4Isa, MatchScalarSpecialBlocks)
{
    const unsigned seed = 21;
    std::mt19937 rng(seed);
    std::vector<std::vector<float>> blocks = special_blocks(rng);
    const size_t nb = blocks.size();
    std::vector<loom_kernels_isa_t> isas = vector_isas();
    for (loomDataType_t dt : q4_types) {
        /* Every block at every position of a 16-block group, so both the
         * vector groups and the tail see each of them. */
        const size_t n = nb * 17 * 32 + 19;
        Values x(dt, n);
        for (size_t i = 0; i < n; i++)
            x.set(i, blocks[(i / 32 + i / (32 * nb)) % nb][i % 32]);
        if (dt != loomFloat32) {
            x.set_bits16(40, dt == loomFloat16 ? 0x7c01 : 0x7f81); /* signalling NaNs */
            x.set_bits16(n - 2, dt == loomFloat16 ? 0xfd55 : 0xff85);
        }
        std::vector<float> ein = small_residuals(x, rng);
        for (float &e : ein)
            e = std::isfinite(e) ? e : 0.0f;
        for (loom_kernels_isa_t isa : isas)
            for (int mode = 0; mode < 4; mode++) {
                expect_same(isa, x, (mode & 1) ? &ein : nullptr, mode >> 1,
                            "special blocks, seed " + std::to_string(seed) + " " +
                                loom_dtype_name(dt) + " mode " + std::to_string(mode));
                if (HasFatalFailure())
                    return;
            }

        /* What the blocks must give, checked on the default set. */
        std::vector<uint8_t> q(loom_q4_bytes(n));
        std::vector<float> y(n);
        loom_q4_encode(x.data(), dt, nullptr, nullptr, n, q.data());
        loom_q4_decode(q.data(), n, y.data(), loomFloat32);
        for (size_t b = 0; b < (n + 31) / 32; b++) {
            bool finite = true;
            double amax = 0;
            for (size_t i = 32 * b; i < std::min(n, 32 * b + 32); i++) {
                finite = finite && std::isfinite(x.get(i));
                amax = std::isfinite(x.get(i)) ? std::max(amax, std::fabs((double)x.get(i))) : amax;
            }
            for (size_t i = 32 * b; i < std::min(n, 32 * b + 32); i++) {
                ASSERT_NE(code_of(q, i), -8) << loom_dtype_name(dt) << " block " << b;
                if (!finite) {
                    ASSERT_EQ(code_of(q, i), 0) << loom_dtype_name(dt) << " block " << b;
                    ASSERT_TRUE(std::isnan(y[i])) << loom_dtype_name(dt) << " block " << b;
                } else {
                    ASSERT_TRUE(std::isfinite(y[i])) << loom_dtype_name(dt) << " block " << b;
                    ASSERT_LE(std::fabs((double)y[i]), amax * (1 + 0x1p-7))
                        << loom_dtype_name(dt) << " block " << b;
                    if (amax < 0x1p-123) {
                        ASSERT_EQ(code_of(q, i), 0) << loom_dtype_name(dt) << " block " << b;
                    }
                }
            }
            if (finite && amax < 0x1p-123) {
                ASSERT_EQ(scale_bits_of(q, b), 0) << loom_dtype_name(dt) << " block " << b;
            }
            if (!finite) {
                ASSERT_EQ(scale_bits_of(q, b), 0x7fc0) << loom_dtype_name(dt) << " block " << b;
            }
        }
    }
}

/* Fills the stack below the caller with one bits, so that a byte a codec
 * frame reads without having written it holds ones, not the zeros a fresh
 * stack happens to hold. Not inlined: its frame must lie where the codec's
 * frames will. */
__attribute__((noinline)) void paint_stack()
{
    unsigned char junk[64 << 10];
    std::memset(junk, 0xff, sizeof(junk));
    __asm__ volatile("" : : "r"(junk) : "memory");
}

/* The cut-off group that ends its tile (Echo's last chunk of 100003 values
 * on 6 ranks: 7843 values), encoded over a painted stack: the scalar code's
 * bytes, and nothing written past loom_q4_bytes(n). The group's flags of
 * non-finite blocks once came back with stack bytes above their 16 bits, and
 * clearing those "blocks'" codes zeroed the tile's scales and the 128 bytes
 * after the tile. */
TEST(Q4Isa, CutOffGroupOverStackGarbage)
{
    std::vector<loom_kernels_isa_t> isas = vector_isas();
    if (isas.empty())
        GTEST_SKIP() << "no vector instruction set on this machine";
    const unsigned seed = 23;
    std::mt19937 rng(seed);
    const size_t guard = 256;
    for (size_t n : {1900ul, 3948ul, 7843ul}) {
        for (loomDataType_t dt : q4_types) {
            Values x(dt, n);
            fill_varied(x, rng, -4, 4);
            const size_t nbytes = loom_q4_bytes(n);
            std::vector<uint8_t> qs(nbytes);
            std::vector<float> es(n);
            for (int with_e : {0, 1}) {
                loom_q4_encode_isa(LOOM_KERNELS_SCALAR, x.data(), dt, nullptr,
                                   with_e ? es.data() : nullptr, n, qs.data());
                for (loom_kernels_isa_t isa : isas) {
                    std::vector<uint8_t> qv(nbytes + guard, 0xa5);
                    std::vector<float> ev(n);
                    paint_stack();
                    loom_q4_encode_isa(isa, x.data(), dt, nullptr, with_e ? ev.data() : nullptr, n,
                                       qv.data());
                    const std::string what = std::string(loom_kernels_isa_name(isa)) + " " +
                                             loom_dtype_name(dt) + " n " + std::to_string(n) +
                                             (with_e ? " with residuals" : "") + ", seed " +
                                             std::to_string(seed);
                    EXPECT_EQ(first_diff(qs.data(), qv.data(), nbytes), -1) << what;
                    const std::vector<uint8_t> untouched(guard, 0xa5);
                    EXPECT_EQ(first_diff(untouched.data(), qv.data() + nbytes, guard), -1)
                        << what << ": written past the end";
                    if (with_e) {
                        EXPECT_EQ(first_diff(es.data(), ev.data(), n * 4), -1) << what;
                    }
                }
            }
        }
    }
}

/* Streams that no encoder writes (code -8, NaN, infinite and subnormal
 * scales) still decode alike everywhere. */
TEST(Q4Isa, DecodeForeignBytes)
{
    std::vector<loom_kernels_isa_t> isas = vector_isas();
    if (isas.empty())
        GTEST_SKIP() << "no vector instruction set on this machine";
    const unsigned seed = 33;
    std::mt19937 rng(seed);
    const size_t n = 3 * 2048 + 45;
    std::vector<uint8_t> q(loom_q4_bytes(n));
    for (uint8_t &b : q)
        b = (uint8_t)rng();
    const uint16_t odd[] = {0x7f80, 0xff80, 0x7fc1, 0xffa0, 0x0001, 0x8050, 0x7f7f, 0x0000};
    for (size_t k = 0; k < 8; k++)
        std::memcpy(&q[1024 + 2 * k * 5], &odd[k], 2);
    for (loom_kernels_isa_t isa : isas) {
        for (loomDataType_t ot : q4_types) {
            Values ys(ot, n), yv(ot, n);
            loom_q4_decode_isa(LOOM_KERNELS_SCALAR, q.data(), n, ys.raw.data(), ot);
            loom_q4_decode_isa(isa, q.data(), n, yv.raw.data(), ot);
            long d = first_diff(ys.raw.data(), yv.raw.data(), ys.raw.size());
            EXPECT_EQ(d, -1) << loom_kernels_isa_name(isa) << " seed " << seed << " "
                             << loom_dtype_name(ot) << " byte " << d;
        }
        std::vector<float> as(n, 1.0f), av(n, 1.0f);
        loom_q4_decode_acc_isa(LOOM_KERNELS_SCALAR, q.data(), n, as.data());
        loom_q4_decode_acc_isa(isa, q.data(), n, av.data());
        long d = first_diff(as.data(), av.data(), n * 4);
        EXPECT_EQ(d, -1) << loom_kernels_isa_name(isa) << " seed " << seed << " acc value "
                         << d / 4;
    }
}

// ---- All-reduce simulation ----------------------------------------------------------

double rel_l2(const std::vector<float> &y, const std::vector<double> &exact)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); i++) {
        num += ((double)y[i] - exact[i]) * ((double)y[i] - exact[i]);
        den += exact[i] * exact[i];
    }
    return std::sqrt(num / den);
}

/* D(Q(v)) in place. */
void requantize(float *v, size_t n, std::vector<uint8_t> &q)
{
    loom_q4_encode(v, loomFloat32, nullptr, nullptr, n, q.data());
    loom_q4_decode(q.data(), n, v, loomFloat32);
}

/* Two-shot: owner c of chunk c adds every other rank's contribution once
 * quantized (Q1), its own unquantized, in rank order in float32, then
 * quantizes the sum once (Q2) for everyone. */
std::vector<float> two_shot(const std::vector<std::vector<float>> &x, int P, size_t N)
{
    const size_t chunk = N / (size_t)P;
    std::vector<float> out(N);
    std::vector<uint8_t> q(loom_q4_bytes(chunk));
    for (int c = 0; c < P; c++) {
        float *acc = &out[(size_t)c * chunk];
        std::fill(acc, acc + chunk, 0.0f);
        for (int r = 0; r < P; r++) {
            const float *src = &x[(size_t)r][(size_t)c * chunk];
            if (r == c) {
                for (size_t i = 0; i < chunk; i++)
                    acc[i] += src[i];
            } else {
                loom_q4_encode(src, loomFloat32, nullptr, nullptr, chunk, q.data());
                loom_q4_decode_acc(q.data(), chunk, acc);
            }
        }
        requantize(acc, chunk, q);
    }
    return out;
}

/* A ring that re-quantizes the running sum at every hop: the chunk starts
 * quantized at rank c + 1, and each of the P - 1 hops dequantizes, adds the
 * next rank's float32 values and quantizes again (the last time for the
 * all-gather). */
std::vector<float> requantizing_ring(const std::vector<std::vector<float>> &x, int P, size_t N)
{
    const size_t chunk = N / (size_t)P;
    std::vector<float> out(N);
    std::vector<uint8_t> q(loom_q4_bytes(chunk));
    for (int c = 0; c < P; c++) {
        float *part = &out[(size_t)c * chunk];
        const int start = (c + 1) % P;
        std::copy(&x[(size_t)start][(size_t)c * chunk],
                  &x[(size_t)start][(size_t)c * chunk] + chunk, part);
        requantize(part, chunk, q);
        for (int h = 1; h < P; h++) {
            const float *src = &x[(size_t)((start + h) % P)][(size_t)c * chunk];
            for (size_t i = 0; i < chunk; i++)
                part[i] += src[i];
            requantize(part, chunk, q);
        }
    }
    return out;
}

TEST(Q4Sim, TwoShotVsRequantizingRing)
{
    const unsigned seed = 77;
    const size_t N = 65536;
    const int ranks[] = {2, 4, 8, 16, 32, 64};
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<std::vector<float>> x(64, std::vector<float>(N));
    for (auto &r : x)
        for (float &v : r)
            v = g(rng);

    std::printf("q4 all-reduce simulation, N = %zu values per rank, seed %u, %s codec\n", N, seed,
                loom_kernels_isa_name(loom_kernels_isa()));
    std::printf("%6s %10s %10s\n", "P", "two-shot", "ring");
    double two[6], ring[6];
    for (int k = 0; k < 6; k++) {
        const int P = ranks[k];
        std::vector<double> exact(N, 0.0);
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < N; i++)
                exact[i] += (double)x[(size_t)r][i];
        two[k] = rel_l2(two_shot(x, P, N), exact);
        ring[k] = rel_l2(requantizing_ring(x, P, N), exact);
        std::printf("%6d %10.4f %10.4f\n", P, two[k], ring[k]);
    }
    for (int k = 0; k < 6; k++)
        EXPECT_LE(two[k], 0.16) << "two-shot, P " << ranks[k] << ", seed " << seed;
    EXPECT_LE(two[5] / two[0], 1.25) << "two-shot error grows with P, seed " << seed;
    EXPECT_GT(ring[4], 0.4) << "requantizing ring, P 32, seed " << seed;
    EXPECT_GT(ring[5], 0.55) << "requantizing ring, P 64, seed " << seed;
}

} // namespace

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_dev_elem.cc - the element functions of the device path (dev_elem.h)
 * and the kernels' host twins (dev_kernels_host.c) against the CPU code,
 * bit for bit, on every instruction set this CPU has: the float16/bfloat16
 * conversions against loom_reduce_init/finish (every 16-bit pattern, and
 * millions of float32 patterns for the rounding), the n-input reduce against
 * loom_reduce_multi and init/acc/finish for every datatype but fp8, every op
 * and 1..LOOM_DK_MAX_SRCS sources (tails, in place), the 4-bit codec against
 * loom_q4_encode/decode/decode_acc (residuals, special blocks) and the cast
 * against the conversions. Data: ordinary values, raw bit patterns (NaNs with
 * payloads, infinities, subnormals), the formats' extremes and -0; seeded
 * from LOOM_TEST_SEED or a fixed seed, printed. Where two NaNs meet in a sum
 * or product the surviving payload is the instruction's choice (kernels.h),
 * so there only NaN-ness is compared; everything else is bitwise.
 */
#include <gtest/gtest.h>

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

const loomDataType_t dk_types[] = {loomInt8,   loomUint8,   loomInt32,   loomUint32,  loomInt64,
                                   loomUint64, loomFloat16, loomFloat32, loomFloat64, loomBfloat16};
const loomRedOp_t all_ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
const loomDataType_t q4_types[] = {loomFloat32, loomBfloat16, loomFloat16};

uint64_t seed()
{
    static uint64_t s = [] {
        const char *e = std::getenv("LOOM_TEST_SEED");
        uint64_t v = e != nullptr && *e ? std::strtoull(e, nullptr, 0) : 20260126u;
        std::printf("test_dev_elem seed %llu (LOOM_TEST_SEED)\n", (unsigned long long)v);
        return v;
    }();
    return s;
}

/* Every instruction set this CPU runs; the table in use is restored after. */
std::vector<loom_kernels_isa_t> isas()
{
    std::vector<loom_kernels_isa_t> v;
    for (int i = 0; i < LOOM_KERNELS_NUM_ISA; i++)
        if (loom_kernels_isa_available((loom_kernels_isa_t)i))
            v.push_back((loom_kernels_isa_t)i);
    return v;
}

class UseIsa {
  public:
    explicit UseIsa(loom_kernels_isa_t isa) : prev_(loom_kernels_isa())
    {
        EXPECT_EQ(loom_kernels_use(isa), loomSuccess);
    }
    ~UseIsa()
    {
        loom_kernels_use(prev_);
    }

  private:
    loom_kernels_isa_t prev_;
};

bool is_float(loomDataType_t dt)
{
    return dt == loomFloat16 || dt == loomFloat32 || dt == loomFloat64 || dt == loomBfloat16;
}

uint64_t get_bits(const uint8_t *p, size_t sz)
{
    uint64_t v = 0;
    std::memcpy(&v, p, sz); /* little-endian */
    return v;
}

bool is_nan_bits(loomDataType_t dt, uint64_t b)
{
    switch (dt) {
    case loomFloat16:
        return (b & 0x7fff) > 0x7c00;
    case loomBfloat16:
        return (b & 0x7fff) > 0x7f80;
    case loomFloat32:
        return (b & 0x7fffffffu) > 0x7f800000u;
    case loomFloat64:
        return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
        return false;
    }
}

/* Signed zeros, infinities, quiet and signalling NaNs, subnormals, the
 * largest finite values, integer extremes. */
std::vector<uint64_t> specials(loomDataType_t dt)
{
    switch (dt) {
    case loomFloat16:
        return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55,
                0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7a00};
    case loomBfloat16:
        return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa5,
                0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x3f80, 0x7f00};
    case loomFloat32:
        return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                0x7f800001, 0x7fa00000, 0x7fc12345, 0x00000001, 0x807fffff, 0x00400000,
                0x7f7fffff, 0xff7fffff, 0x3f800000, 0x00800000, 0x477ff000, 0x7f7f8000};
    case loomFloat64:
        return {0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
                0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000000ull,
                0x7ff0000000000001ull, 0x7ff8000012345678ull, 0x0000000000000001ull,
                0x800fffffffffffffull, 0x7fefffffffffffffull, 0xffefffffffffffffull,
                0x3ff0000000000000ull};
    default: {
        size_t bits = loom_dtype_size(dt) * 8;
        uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t sign = 1ull << (bits - 1);
        return {0, 1, 2, mask, sign, sign - 1, sign + 1, mask - 1};
    }
    }
}

/* One element of dt as bits: mostly ordinary values (sums round, products
 * stay finite for a while), some raw patterns and specials. */
uint64_t random_elem(loomDataType_t dt, std::mt19937_64 &rng, const std::vector<uint64_t> &sp)
{
    const uint64_t r = rng();
    const unsigned kind = (unsigned)(r % 64);
    if (kind < 2)
        return sp[(r >> 8) % sp.size()];
    const size_t sz = loom_dtype_size(dt);
    const uint64_t raw = sz == 8 ? rng() : rng() & ((1ull << (8 * sz)) - 1);
    if (kind < 6 || !is_float(dt))
        return raw;
    const float v = std::ldexp((float)((int64_t)(rng() >> 40) - (1 << 23)), -21);
    switch (dt) {
    case loomFloat16:
        return loom_f32_to_f16(v);
    case loomBfloat16:
        return loom_f32_to_bf16(v);
    case loomFloat32: {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        return b;
    }
    default: {
        double d = (double)v * (1.0 + std::ldexp((double)(rng() >> 12), -60));
        uint64_t b;
        std::memcpy(&b, &d, 8);
        return b;
    }
    }
}

void fill(std::vector<uint8_t> &buf, loomDataType_t dt, size_t n, std::mt19937_64 &rng)
{
    const size_t sz = loom_dtype_size(dt);
    const std::vector<uint64_t> sp = specials(dt);
    buf.resize(n * sz);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = random_elem(dt, rng, sp);
        std::memcpy(buf.data() + i * sz, &b, sz);
    }
}

/* 1 if at element i a NaN may have met a NaN in a sum or product. */
bool two_nans_possible(loomDataType_t dt, loomRedOp_t op, const std::vector<const void *> &srcs,
                       size_t i)
{
    if (!is_float(dt) || op == loomMax || op == loomMin)
        return false;
    const size_t sz = loom_dtype_size(dt);
    int nan = 0;
    for (const void *s : srcs)
        nan += is_nan_bits(dt, get_bits((const uint8_t *)s + i * sz, sz));
    /* With three sources or more, the others may have made a NaN first
     * (Inf - Inf, 0 * Inf, an overflowing product times 0). */
    return nan >= 2 || (nan == 1 && srcs.size() > 2);
}

/* First element where got differs from want (bitwise; NaN-ness only where
 * two NaNs may have met); -1 if none. */
long first_diff(loomDataType_t dt, loomRedOp_t op, const std::vector<uint8_t> &want,
                const std::vector<uint8_t> &got, const std::vector<const void *> &srcs, size_t n)
{
    const size_t sz = loom_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t a = get_bits(want.data() + i * sz, sz), b = get_bits(got.data() + i * sz, sz);
        if (a == b)
            continue;
        if (is_nan_bits(dt, a) && is_nan_bits(dt, b) && two_nans_possible(dt, op, srcs, i))
            continue;
        return (long)i;
    }
    return -1;
}

std::string what(loomDataType_t dt, loomRedOp_t op, int nsrc, size_t n, const char *isa)
{
    return std::string(loom_dtype_name(dt)) + " " + loom_redop_name(op) + " nsrc " +
           std::to_string(nsrc) + " n " + std::to_string(n) + " " + isa + " seed " +
           std::to_string(seed());
}

} // namespace

TEST(DevElem, DtypeOk)
{
    for (int dt = -1; dt <= loomNumTypes; dt++) {
        bool want = dt >= 0 && dt < loomNumTypes && dt != loomFloat8e4m3 && dt != loomFloat8e5m2;
        EXPECT_EQ(loom_dk_dtype_ok((loomDataType_t)dt), want ? 1 : 0) << dt;
    }
}

/* Every float16 and bfloat16 pattern decodes as each table's init does. */
TEST(DevElem, DecodeEveryPattern)
{
    std::vector<uint16_t> h(65536);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = (uint16_t)i;
    std::vector<float> want(h.size());
    for (loom_kernels_isa_t isa : isas()) {
        UseIsa use(isa);
        for (loomDataType_t dt : {loomFloat16, loomBfloat16}) {
            loom_reduce_init(dt, want.data(), h.data(), h.size());
            for (size_t i = 0; i < h.size(); i++) {
                float got =
                    dt == loomFloat16 ? loom_de_f16_decode(h[i]) : loom_de_bf16_decode(h[i]);
                ASSERT_EQ(loom_de_f32_bits(got), loom_de_f32_bits(want[i]))
                    << loom_dtype_name(dt) << " 0x" << std::hex << i << " "
                    << loom_kernels_isa_name(isa);
            }
        }
    }
}

/* float32 -> float16/bfloat16 as each table's finish rounds (the vector
 * tables convert with F16C and their own bfloat16 code): random patterns
 * over the whole range, patterns near the formats' rounding and overflow
 * boundaries, subnormals, NaNs. */
TEST(DevElem, EncodeMatchesFinish)
{
    std::mt19937_64 rng(seed() ^ 0xe1);
    const size_t n = (size_t)3 << 20;
    std::vector<uint32_t> x(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = (uint32_t)rng();
        switch (i % 4) {
        case 0: /* anything */
            x[i] = r;
            break;
        case 1: /* float16's range, subnormals to overflow */
            x[i] = (r & 0x80ffffffu) | ((0x60u + (r >> 24) % 0x30u) << 23);
            break;
        case 2: /* halfway cases and their neighbours */
            x[i] = (r & 0xffffe000u) | (0x1000u + (uint32_t)((int)(r % 3) - 1));
            break;
        default: /* bfloat16 ties */
            x[i] = (r & 0xffff0000u) | (0x8000u + (uint32_t)((int)(r % 3) - 1));
            break;
        }
    }
    for (uint64_t s : specials(loomFloat32))
        x[(size_t)(s % n)] = (uint32_t)s;
    std::vector<uint16_t> want(n);
    for (loom_kernels_isa_t isa : isas()) {
        UseIsa use(isa);
        for (loomDataType_t dt : {loomFloat16, loomBfloat16}) {
            loom_reduce_finish(dt, loomSum, want.data(), x.data(), n, 1);
            for (size_t i = 0; i < n; i++) {
                float f = loom_de_f32_from_bits(x[i]);
                uint16_t got = dt == loomFloat16 ? loom_de_f16_encode(f) : loom_de_bf16_encode(f);
                ASSERT_EQ(got, want[i])
                    << loom_dtype_name(dt) << " of 0x" << std::hex << x[i] << " "
                    << loom_kernels_isa_name(isa) << std::dec << " seed " << seed();
            }
        }
    }
}

/* loom_dk_host_reduce against loom_reduce_multi on every instruction set and
 * against init/acc/finish: every datatype, op and source count, with lengths
 * that leave tails, once in place. */
TEST(DevElem, ReduceMatchesTables)
{
    std::mt19937_64 rng(seed() ^ 0x4ed);
    const std::vector<loom_kernels_isa_t> sets = isas();
    size_t values = 0, compared = 0;
    for (loomDataType_t dt : dk_types) {
        const size_t sz = loom_dtype_size(dt);
        for (loomRedOp_t op : all_ops) {
            for (int nsrc = 1; nsrc <= LOOM_DK_MAX_SRCS; nsrc++) {
                const size_t n = 1000 + (size_t)(rng() % 97);
                const int nranks = nsrc + (int)(rng() % 3); /* avg divides by this */
                std::vector<std::vector<uint8_t>> bufs(nsrc);
                std::vector<const void *> srcs(nsrc);
                for (int k = 0; k < nsrc; k++) {
                    fill(bufs[k], dt, n, rng);
                    srcs[k] = bufs[k].data();
                }
                values += n * nsrc;
                std::vector<uint8_t> got(n * sz), want(n * sz);
                ASSERT_EQ(loom_dk_host_reduce(dt, op, got.data(), srcs.data(), nsrc, n, nranks), 0);
                for (loom_kernels_isa_t isa : sets) {
                    UseIsa use(isa);
                    loom_reduce_multi(dt, op, want.data(), srcs.data(), nsrc, n, nranks);
                    long i = first_diff(dt, op, want, got, srcs, n);
                    ASSERT_LT(i, 0)
                        << what(dt, op, nsrc, n, loom_kernels_isa_name(isa)) << " element " << i
                        << ": want 0x" << std::hex << get_bits(want.data() + i * sz, sz)
                        << " got 0x" << get_bits(got.data() + i * sz, sz);
                    compared += n;
                }
                /* init/acc/finish with an accumulator array, on one set per case. */
                {
                    UseIsa use(sets[(size_t)nsrc % sets.size()]);
                    std::vector<uint8_t> acc(n * loom_acc_size(dt));
                    loom_reduce_init(dt, acc.data(), srcs[0], n);
                    for (int k = 1; k < nsrc; k++)
                        loom_reduce_acc(dt, op, acc.data(), srcs[k], n);
                    loom_reduce_finish(dt, op, want.data(), acc.data(), n, nranks);
                    long i = first_diff(dt, op, want, got, srcs, n);
                    ASSERT_LT(i, 0) << what(dt, op, nsrc, n, "init/acc/finish") << " element " << i;
                }
                /* In place: dst is source k's buffer. */
                if (nsrc % 5 == 1 || nsrc == LOOM_DK_MAX_SRCS) {
                    const int k = (int)(rng() % (uint64_t)nsrc);
                    std::vector<uint8_t> keep = bufs[k];
                    ASSERT_EQ(
                        loom_dk_host_reduce(dt, op, bufs[k].data(), srcs.data(), nsrc, n, nranks),
                        0);
                    std::vector<uint8_t> inplace = bufs[k];
                    bufs[k] = keep;
                    srcs[k] = bufs[k].data();
                    ASSERT_EQ(first_diff(dt, op, got, inplace, srcs, n), -1)
                        << what(dt, op, nsrc, n, "in place");
                }
            }
        }
    }
    std::printf("reduce: %zu random source values, %zu results compared bitwise\n", values,
                compared);
}

/* Short lengths (0..70) and every source count at a few lengths: the loops'
 * edges. */
TEST(DevElem, ReduceShortLengths)
{
    std::mt19937_64 rng(seed() ^ 0x5407);
    for (loomDataType_t dt : dk_types)
        for (loomRedOp_t op : all_ops)
            for (size_t n = 0; n <= 70; n++) {
                const int nsrc = 1 + (int)(n % LOOM_DK_MAX_SRCS);
                std::vector<std::vector<uint8_t>> bufs(nsrc);
                std::vector<const void *> srcs(nsrc);
                for (int k = 0; k < nsrc; k++) {
                    fill(bufs[k], dt, n, rng);
                    srcs[k] = bufs[k].data();
                }
                std::vector<uint8_t> got(n * loom_dtype_size(dt) + 1, 0xa5), want = got;
                ASSERT_EQ(loom_dk_host_reduce(dt, op, got.data(), srcs.data(), nsrc, n, nsrc), 0);
                loom_reduce_multi(dt, op, want.data(), srcs.data(), nsrc, n, nsrc);
                ASSERT_EQ(first_diff(dt, op, want, got, srcs, n), -1) << what(dt, op, nsrc, n, "");
                ASSERT_EQ(got.back(), 0xa5) << "wrote past n: " << what(dt, op, nsrc, n, "");
            }
}

TEST(DevElem, ReduceRefusesBadArguments)
{
    float a[4] = {1, 2, 3, 4}, d[4];
    const void *srcs[LOOM_DK_MAX_SRCS + 1];
    for (auto &s : srcs)
        s = a;
    EXPECT_EQ(loom_dk_host_reduce(loomFloat8e4m3, loomSum, d, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat8e5m2, loomSum, d, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce((loomDataType_t)99, loomSum, d, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, (loomRedOp_t)5, d, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, loomSum, d, srcs, 0, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, loomSum, d, srcs, LOOM_DK_MAX_SRCS + 1, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, loomSum, nullptr, srcs, 2, 4, 2), -1);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, loomSum, d, srcs, LOOM_DK_MAX_SRCS, 4, 0), 0);
    EXPECT_EQ(d[3], 4.0f * LOOM_DK_MAX_SRCS);
    EXPECT_EQ(loom_dk_host_reduce(loomFloat32, loomAvg, d, srcs, 2, 4, 0), 0); /* nranks 0 -> 1 */
    EXPECT_EQ(d[1], 4.0f);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_kernels_isa.cc - unit tests of the instruction-set variants of the
 * kernels: for every datatype x op x instruction set this CPU has (scalar C,
 * AVX2, AVX-512), the table gives the bits of a reference that follows
 * kernels.h's contract element by element without any kernel (accumulators
 * after every step, finished results, in place and not) on hostile data -
 * NaNs with several payloads, signalling ones, infinities, signed zeros,
 * subnormals, integer extremes, equal operands, and ordinary values whose
 * sums round - at every length 0..300 and a few large ones, from pointers
 * that are not vector-aligned; loom_reduce_multi gives the same bits for 1..9
 * sources, also in place (dst == srcs[k]); and LOOM_KERNELS picks the set.
 * Sets the CPU lacks are skipped with the reason. The reference computes in
 * double and rounds once to the accumulator type per step (exact for the
 * float32 accumulators: a double holds every float32 sum and product to
 * within the one rounding), converts with dtype.h's element functions (which
 * test_dtype_kernels.cc checks exhaustively against ldexp) and applies the
 * contract's NaN, max/min, wrap-around and integer-average rules.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <xmmintrin.h>
#endif

extern "C" {
#include "debug.h"
}
#include "dtype.h"
#include "kernels.h"
#include "rerun_self.h"

namespace {

const loomDataType_t all_types[] = {loomInt8,    loomUint8,    loomInt32,      loomUint32,
                                    loomInt64,   loomUint64,   loomFloat16,    loomFloat32,
                                    loomFloat64, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};
const loomRedOp_t all_ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};
const loom_kernels_isa_t all_isas[] = {LOOM_KERNELS_SCALAR, LOOM_KERNELS_AVX2, LOOM_KERNELS_AVX512};

/* Runs the kernels on one instruction set for a scope, then restores the
 * one that was in use. */
class UseIsa {
  public:
    explicit UseIsa(loom_kernels_isa_t isa) : prev_(loom_kernels_isa())
    {
        ok_ = loom_kernels_use(isa) == loomSuccess;
    }
    ~UseIsa()
    {
        loom_kernels_use(prev_);
    }
    bool ok() const
    {
        return ok_;
    }

  private:
    loom_kernels_isa_t prev_;
    bool ok_;
};

bool is_float(loomDataType_t dt)
{
    return dt == loomFloat16 || dt == loomFloat32 || dt == loomFloat64 || dt == loomBfloat16 ||
           dt == loomFloat8e4m3 || dt == loomFloat8e5m2;
}

/* The accumulator's datatype: float32 for the 8/16-bit floats. */
loomDataType_t acc_type(loomDataType_t dt)
{
    return loom_acc_is_native(dt) ? dt : loomFloat32;
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
    case loomFloat8e4m3:
        return (b & 0x7f) == 0x7f;
    case loomFloat8e5m2:
        return (b & 0x7f) > 0x7c;
    default:
        return false;
    }
}

/* Bit patterns that are special for each format: signed zeros, infinities,
 * quiet and signalling NaNs with different payloads and signs, subnormals,
 * the largest finite values, integer extremes. */
std::vector<uint64_t> specials(loomDataType_t dt)
{
    switch (dt) {
    case loomFloat16:
        return {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7d55, 0xfdff,
                0x7fff, 0x0001, 0x83ff, 0x0200, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7a00};
    case loomBfloat16:
        return {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fa5,
                0xffff, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x3f80, 0x7f00};
    case loomFloat32:
        return {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                0x7f800001, 0x7fa00000, 0xffbfffff, 0x7fffffff, 0x7fc12345, 0x00000001,
                0x807fffff, 0x00400000, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0x00800000,
                0x33800000, 0x477ff000, 0x477fefff, 0x38800000, 0x387fffff, 0x7f7f8000};
    case loomFloat64:
        return {0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
                0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000000ull,
                0x7ff0000000000001ull, 0x7ff4000000000000ull, 0xfff7ffffffffffffull,
                0x7ff8000012345678ull, 0x0000000000000001ull, 0x800fffffffffffffull,
                0x7fefffffffffffffull, 0xffefffffffffffffull, 0x3ff0000000000000ull};
    case loomFloat8e4m3:
        return {0x00, 0x80, 0x7f, 0xff, 0x7e, 0xfe, 0x01, 0x87, 0x08, 0x38, 0x77};
    case loomFloat8e5m2:
        return {0x00, 0x80, 0x7c, 0xfc, 0x7d, 0x7e, 0x7f, 0xfd, 0xff, 0x01, 0x83, 0x7b, 0xfb, 0x3c};
    default: {
        size_t bits = loom_dtype_size(dt) * 8;
        uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t sign = 1ull << (bits - 1);
        return {0, 1, 2, mask, sign, sign - 1, sign + 1, mask - 1};
    }
    }
}

/* A moderate value, so that sums and products of a few stay finite. */
uint64_t ordinary(loomDataType_t dt, std::mt19937_64 &rng)
{
    std::uniform_real_distribution<double> u(-8.0, 8.0);
    double v = u(rng);
    switch (dt) {
    case loomFloat16:
        return loom_f32_to_f16((float)v);
    case loomBfloat16:
        return loom_f32_to_bf16((float)v);
    case loomFloat8e4m3:
        return loom_f32_to_e4m3((float)v);
    case loomFloat8e5m2:
        return loom_f32_to_e5m2((float)v);
    case loomFloat32: {
        float f = (float)v;
        uint32_t b;
        std::memcpy(&b, &f, 4);
        return b;
    }
    case loomFloat64: {
        uint64_t b;
        std::memcpy(&b, &v, 8);
        return b;
    }
    default:
        return rng();
    }
}

/* ---- The reference: kernels.h's contract, one element at a time ------------ */

/* The same bits as another type of the same size. */
template <typename To, typename From> To bit_cast(From v)
{
    static_assert(sizeof(To) == sizeof(From), "sizes differ");
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}
float f32_of(uint64_t b)
{
    return bit_cast<float>((uint32_t)b);
}
double f64_of(uint64_t b)
{
    return bit_cast<double>(b);
}
uint64_t bits_of(float f)
{
    return bit_cast<uint32_t>(f);
}
uint64_t bits_of(double d)
{
    return bit_cast<uint64_t>(d);
}

bool is_signed_int(loomDataType_t dt)
{
    return dt == loomInt8 || dt == loomInt32 || dt == loomInt64;
}

/* The accumulator (bits of acc_type(dt)) for one element of dt. */
uint64_t ref_to_acc(loomDataType_t dt, uint64_t x)
{
    switch (dt) {
    case loomFloat16:
        return bits_of(loom_f16_to_f32((uint16_t)x));
    case loomBfloat16:
        return bits_of(loom_bf16_to_f32((uint16_t)x));
    case loomFloat8e4m3:
        return bits_of(loom_e4m3_to_f32((uint8_t)x));
    case loomFloat8e5m2:
        return bits_of(loom_e5m2_to_f32((uint8_t)x));
    default:
        return x;
    }
}

/* max/min of two floats under the contract: a NaN accumulator stays, else a
 * NaN operand comes in (bits kept); otherwise acc > x ? acc : x (max). */
template <typename F> uint64_t ref_maxmin(loomRedOp_t op, F a, F x, uint64_t abits, uint64_t xbits)
{
    if (std::isnan(a))
        return abits;
    if (std::isnan(x))
        return xbits;
    return (op == loomMax ? a > x : a < x) ? abits : xbits;
}

/* acc op x, both in the accumulator type of dt. */
uint64_t ref_combine(loomDataType_t dt, loomRedOp_t op, uint64_t a, uint64_t x)
{
    const loomDataType_t adt = acc_type(dt);
    if (adt == loomFloat32) {
        const float fa = f32_of(a), fx = f32_of(x);
        if (op == loomMax || op == loomMin)
            return ref_maxmin(op, fa, fx, a, x);
        const double d = op == loomProd ? (double)fa * (double)fx : (double)fa + (double)fx;
        return bits_of((float)d); /* the one rounding of this step */
    }
    if (adt == loomFloat64) {
        const double da = f64_of(a), dx = f64_of(x);
        if (op == loomMax || op == loomMin)
            return ref_maxmin(op, da, dx, a, x);
        return bits_of(op == loomProd ? da * dx : da + dx);
    }
    const unsigned bits = (unsigned)loom_dtype_size(dt) * 8;
    const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (op == loomSum || op == loomAvg)
        return (a + x) & mask; /* wraps modulo 2^bits */
    if (op == loomProd)
        return (a * x) & mask;
    bool greater; /* a > x in the datatype's signedness */
    if (is_signed_int(dt)) {
        const uint64_t sign = 1ull << (bits - 1);
        greater = (int64_t)((a ^ sign) - sign) > (int64_t)((x ^ sign) - sign);
    } else {
        greater = a > x;
    }
    return (op == loomMax ? greater : (!greater && a != x)) ? a : x;
}

/* The finished element of dt from an accumulator. */
uint64_t ref_finish(loomDataType_t dt, loomRedOp_t op, uint64_t a, int nranks)
{
    const int div = nranks < 1 ? 1 : nranks;
    const loomDataType_t adt = acc_type(dt);
    if (op == loomAvg) {
        if (adt == loomFloat32) {
            a = bits_of((float)((double)f32_of(a) / div)); /* the quotient in float32 */
        } else if (adt == loomFloat64) {
            a = bits_of(f64_of(a) / div);
        } else {
            const unsigned bits = (unsigned)loom_dtype_size(dt) * 8;
            const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
            if (is_signed_int(dt)) {
                const uint64_t sign = 1ull << (bits - 1);
                a = (uint64_t)((int64_t)((a ^ sign) - sign) / div) & mask; /* C truncation */
            } else {
                a = a / (uint64_t)div;
            }
        }
    }
    switch (dt) {
    case loomFloat16:
        return loom_f32_to_f16(f32_of(a));
    case loomBfloat16:
        return loom_f32_to_bf16(f32_of(a));
    case loomFloat8e4m3:
        return loom_f32_to_e4m3(f32_of(a));
    case loomFloat8e5m2:
        return loom_f32_to_e5m2(f32_of(a));
    default:
        return a;
    }
}

/* One source buffer: n elements starting `skew` elements into the storage,
 * so that vector loads are not aligned. Element j > 0 sometimes copies
 * source 0's element, so ties (max/min of equal values, -0 vs +0) occur. */
struct buffer {
    std::vector<uint8_t> store;
    uint8_t *p;
};

const size_t guard_bytes = 64;
const uint8_t guard_val = 0xa5;

void make_buffer(buffer &b, size_t bytes, size_t skew_bytes)
{
    b.store.assign(bytes + skew_bytes + 2 * guard_bytes, guard_val);
    b.p = b.store.data() + guard_bytes + skew_bytes;
}

bool guards_intact(const buffer &b, size_t bytes)
{
    for (const uint8_t *q = b.store.data(); q < b.p; q++)
        if (*q != guard_val)
            return false;
    for (const uint8_t *q = b.p + bytes; q < b.store.data() + b.store.size(); q++)
        if (*q != guard_val)
            return false;
    return true;
}

/* Bitwise equality, except that two NaNs are equal for sum/prod/avg: which
 * of two NaN operands the FPU passes on is its choice (kernels.h). */
::testing::AssertionResult same_bits(loomDataType_t dt, loomRedOp_t op, const uint8_t *want,
                                     const uint8_t *got, size_t n, const char *what)
{
    size_t sz = loom_dtype_size(dt);
    bool nan_free = op == loomMax || op == loomMin || !is_float(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t a = get_bits(want + i * sz, sz), b = get_bits(got + i * sz, sz);
        if (a == b || (!nan_free && is_nan_bits(dt, a) && is_nan_bits(dt, b)))
            continue;
        char msg[160];
        std::snprintf(msg, sizeof(msg),
                      "%s: element %zu of %zu is 0x%llx, the reference gives 0x%llx", what, i, n,
                      (unsigned long long)b, (unsigned long long)a);
        return ::testing::AssertionFailure() << msg;
    }
    return ::testing::AssertionSuccess();
}

using isa_case = std::tuple<loom_kernels_isa_t, loomDataType_t, loomRedOp_t>;

class IsaKernels : public ::testing::TestWithParam<isa_case> {
  protected:
    void SetUp() override
    {
        isa_ = std::get<0>(GetParam());
        dt_ = std::get<1>(GetParam());
        op_ = std::get<2>(GetParam());
        if (!loom_kernels_isa_available(isa_))
            GTEST_SKIP() << "this build or CPU cannot run the " << loom_kernels_isa_name(isa_)
                         << " kernels";
    }
    void check_length(size_t n, int max_src);

    loom_kernels_isa_t isa_ = LOOM_KERNELS_SCALAR;
    loomDataType_t dt_ = loomFloat32;
    loomRedOp_t op_ = loomSum;
};

void IsaKernels::check_length(size_t n, int max_src)
{
    SCOPED_TRACE("n=" + std::to_string(n) + " sources=" + std::to_string(max_src));
    const size_t sz = loom_dtype_size(dt_), asz = loom_acc_size(dt_);
    const loomDataType_t adt = acc_type(dt_);
    const int nranks = max_src + (int)(n % 3); /* the avg divisor need not be the count */
    std::mt19937_64 rng(n * 131 + (size_t)dt_ * 17 + (size_t)op_ * 5 + (size_t)max_src);
    const std::vector<uint64_t> special = specials(dt_);

    std::vector<buffer> src((size_t)max_src);
    std::vector<const void *> srcp((size_t)max_src);
    for (int j = 0; j < max_src; j++) {
        make_buffer(src[(size_t)j], n * sz, ((n + (size_t)j) % 7 + 1) * sz);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng() % 100, v;
            if (r < 15)
                v = special[rng() % special.size()];
            else if (r < 30)
                v = rng();
            else if (r < 40 && j > 0)
                v = get_bits(src[0].p + i * sz, sz);
            else
                v = ordinary(dt_, rng);
            put_bits(src[(size_t)j].p + i * sz, sz, v);
        }
        srcp[(size_t)j] = src[(size_t)j].p;
    }

    buffer ref_acc, acc, ref_out, out, fused;
    make_buffer(ref_acc, n * asz, 0);
    make_buffer(acc, n * asz, 3 * asz);
    make_buffer(ref_out, n * sz, sz);
    make_buffer(out, n * sz, 5 * sz);
    make_buffer(fused, n * sz, 2 * sz);
    std::vector<uint8_t> inplace(n * asz + 1);

    std::vector<uint64_t> ref(n); /* the reference's accumulators */
    for (int j = 0; j < max_src; j++) {
        std::string step = "after source " + std::to_string(j);
        for (size_t i = 0; i < n; i++) {
            const uint64_t x = ref_to_acc(dt_, get_bits(src[(size_t)j].p + i * sz, sz));
            ref[i] = j == 0 ? x : ref_combine(dt_, op_, ref[i], x);
            put_bits(ref_acc.p + i * asz, asz, ref[i]);
            put_bits(ref_out.p + i * sz, sz, ref_finish(dt_, op_, ref[i], nranks));
        }
        UseIsa use(isa_);
        ASSERT_TRUE(use.ok());
        if (j == 0)
            loom_reduce_init(dt_, acc.p, src[0].p, n);
        else
            loom_reduce_acc(dt_, op_, acc.p, src[(size_t)j].p, n);
        ASSERT_TRUE(same_bits(adt, op_, ref_acc.p, acc.p, n, ("accumulators " + step).c_str()));
        ASSERT_TRUE(guards_intact(acc, n * asz)) << "acc wrote outside its range, " << step;

        /* finish into a separate buffer and over the accumulators themselves. */
        loom_reduce_finish(dt_, op_, out.p, acc.p, n, nranks);
        ASSERT_TRUE(same_bits(dt_, op_, ref_out.p, out.p, n, ("finish " + step).c_str()));
        ASSERT_TRUE(guards_intact(out, n * sz)) << "finish wrote outside its range, " << step;
        if (n > 0) {
            std::memcpy(inplace.data(), acc.p, n * asz);
            loom_reduce_finish(dt_, op_, inplace.data(), inplace.data(), n, nranks);
            ASSERT_TRUE(same_bits(dt_, op_, ref_out.p, inplace.data(), n,
                                  ("in-place finish " + step).c_str()));
        }

        /* The fused form over the first j + 1 sources, then in place over one
         * of them (a copy, so the sources stay as they are). */
        loom_reduce_multi(dt_, op_, fused.p, srcp.data(), j + 1, n, nranks);
        ASSERT_TRUE(same_bits(dt_, op_, ref_out.p, fused.p, n, ("multi " + step).c_str()));
        ASSERT_TRUE(guards_intact(fused, n * sz)) << "multi wrote outside its range, " << step;
        const size_t k = (n + (size_t)j) % (size_t)(j + 1);
        buffer mine;
        make_buffer(mine, n * sz, 1 * sz);
        if (n > 0)
            std::memcpy(mine.p, src[k].p, n * sz);
        std::vector<const void *> aliased = srcp;
        aliased[k] = mine.p;
        loom_reduce_multi(dt_, op_, mine.p, aliased.data(), j + 1, n, nranks);
        ASSERT_TRUE(
            same_bits(dt_, op_, ref_out.p, mine.p, n,
                      ("multi in place over source " + std::to_string(k) + " " + step).c_str()));
        ASSERT_TRUE(guards_intact(mine, n * sz));
    }
}

TEST_P(IsaKernels, MatchesReferenceAtEveryLength)
{
    for (size_t n = 0; n <= 300; n++) {
        check_length(n, 1 + (int)(n % 9));
        if (HasFatalFailure())
            return;
    }
}

TEST_P(IsaKernels, MatchesReferenceOnLargeArrays)
{
    check_length(4096 + 7, 9);
    if (!HasFatalFailure())
        check_length(65536 + 3, 4);
}

std::string case_name(const ::testing::TestParamInfo<isa_case> &p)
{
    return std::string(loom_kernels_isa_name(std::get<0>(p.param))) + "_" +
           loom_dtype_name(std::get<1>(p.param)) + "_" + loom_redop_name(std::get<2>(p.param));
}

INSTANTIATE_TEST_SUITE_P(AllSets, IsaKernels,
                         ::testing::Combine(::testing::ValuesIn(all_isas),
                                            ::testing::ValuesIn(all_types),
                                            ::testing::ValuesIn(all_ops)),
                         case_name);

#if defined(__x86_64__)
/* Some frameworks run with flush-to-zero and denormals-are-zero set. The
 * conversions must ignore MXCSR (F16C's do; the scalar ones are integer
 * code), or a set would turn subnormal halves into zeros: each set gives the
 * reference's bits, computed before FTZ/DAZ is set. */
TEST(KernelsIsa, ConversionsIgnoreFlushToZero)
{
    const size_t n = 1024;
    std::vector<uint16_t> half(n), out(n);
    std::vector<uint8_t> fp8(n);
    std::vector<float> acc(n), wide(n);
    for (size_t i = 0; i < n; i++) {
        half[i] = (uint16_t)((i & 1 ? 0x8000 : 0) | (i % 0x400)); /* zero and subnormals */
        fp8[i] = (uint8_t)i;
        wide[i] = (float)((i % 37) + 1) * (i & 1 ? -0x1p-20f : 0x1p-17f); /* subnormal as half */
    }
    const loomDataType_t narrow[] = {loomFloat16, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};
    std::vector<std::vector<float>> acc_ref(4, std::vector<float>(n));
    std::vector<std::vector<uint16_t>> out_ref(4, std::vector<uint16_t>(n));
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < n; i++) {
            const uint64_t x = loom_dtype_size(narrow[k]) == 2 ? half[i] : fp8[i];
            acc_ref[k][i] = f32_of(ref_to_acc(narrow[k], x));
            out_ref[k][i] = (uint16_t)ref_finish(narrow[k], loomSum, bits_of(wide[i]), 1);
        }
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040); /* FTZ | DAZ */
    for (loom_kernels_isa_t isa : all_isas) {
        if (!loom_kernels_isa_available(isa))
            continue;
        SCOPED_TRACE(loom_kernels_isa_name(isa));
        UseIsa use(isa);
        for (size_t k = 0; k < 4; k++) {
            const loomDataType_t dt = narrow[k];
            const void *src = loom_dtype_size(dt) == 2 ? (const void *)half.data() : fp8.data();
            loom_reduce_init(dt, acc.data(), src, n);
            EXPECT_TRUE(same_bits(loomFloat32, loomMax, (const uint8_t *)acc_ref[k].data(),
                                  (const uint8_t *)acc.data(), n, loom_dtype_name(dt)));
            if (loom_dtype_size(dt) == 2) {
                loom_reduce_finish(dt, loomSum, out.data(), wide.data(), n, 1);
                EXPECT_TRUE(same_bits(dt, loomMax, (const uint8_t *)out_ref[k].data(),
                                      (const uint8_t *)out.data(), n, loom_dtype_name(dt)));
            }
        }
    }
    _mm_setcsr(saved);
}
#endif

/* ---- Choosing the instruction set ------------------------------------------ */

loom_kernels_isa_t best_isa()
{
    for (int i = LOOM_KERNELS_NUM_ISA - 1; i > 0; i--)
        if (loom_kernels_isa_available((loom_kernels_isa_t)i))
            return (loom_kernels_isa_t)i;
    return LOOM_KERNELS_SCALAR;
}

TEST(KernelsIsa, NamesAndAvailability)
{
    EXPECT_STREQ(loom_kernels_isa_name(LOOM_KERNELS_SCALAR), "scalar");
    EXPECT_STREQ(loom_kernels_isa_name(LOOM_KERNELS_AVX2), "avx2");
    EXPECT_STREQ(loom_kernels_isa_name(LOOM_KERNELS_AVX512), "avx512");
    EXPECT_STREQ(loom_kernels_isa_name(LOOM_KERNELS_NUM_ISA), "invalid");
    EXPECT_STREQ(loom_kernels_isa_name((loom_kernels_isa_t)-1), "invalid");
    EXPECT_TRUE(loom_kernels_isa_available(LOOM_KERNELS_SCALAR));
    EXPECT_FALSE(loom_kernels_isa_available(LOOM_KERNELS_NUM_ISA));
#if defined(__x86_64__)
    /* AVX-512 here implies AVX2 and F16C, so its table can fall back on them. */
    if (loom_kernels_isa_available(LOOM_KERNELS_AVX512)) {
        EXPECT_TRUE(loom_kernels_isa_available(LOOM_KERNELS_AVX2));
    }
    unsigned eax, ebx, ecx, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    EXPECT_EQ(loom_kernels_isa_available(LOOM_KERNELS_AVX2),
              __builtin_cpu_supports("avx2") && f16c);
#else
    EXPECT_FALSE(loom_kernels_isa_available(LOOM_KERNELS_AVX2));
    EXPECT_FALSE(loom_kernels_isa_available(LOOM_KERNELS_AVX512));
#endif
}

TEST(KernelsIsa, ChooseFollowsTheRequest)
{
    const loom_kernels_isa_t best = best_isa();
    EXPECT_EQ(loom_kernels_choose(nullptr), best);
    EXPECT_EQ(loom_kernels_choose(""), best);
    EXPECT_EQ(loom_kernels_choose("AUTO"), best);
    EXPECT_EQ(loom_kernels_choose("scalar"), LOOM_KERNELS_SCALAR);
    for (loom_kernels_isa_t isa : all_isas) {
        loom_clear_last_error();
        loom_kernels_isa_t got = loom_kernels_choose(loom_kernels_isa_name(isa));
        if (loom_kernels_isa_available(isa)) {
            EXPECT_EQ(got, isa);
            EXPECT_STREQ(loom_last_error(), "");
        } else {
            EXPECT_EQ(got, best);
            EXPECT_NE(std::string(loom_last_error()).find("lacks"), std::string::npos)
                << loom_last_error();
        }
    }
    loom_clear_last_error();
    EXPECT_EQ(loom_kernels_choose("sse9"), best);
    EXPECT_NE(std::string(loom_last_error()).find("not one of"), std::string::npos)
        << loom_last_error();
}

TEST(KernelsIsa, UseRejectsWhatIsMissing)
{
    const loom_kernels_isa_t before = loom_kernels_isa();
    EXPECT_EQ(loom_kernels_use(LOOM_KERNELS_NUM_ISA), loomInvalidArgument);
    EXPECT_EQ(loom_kernels_use((loom_kernels_isa_t)-1), loomInvalidArgument);
    for (loom_kernels_isa_t isa : all_isas) {
        if (!loom_kernels_isa_available(isa)) {
            EXPECT_EQ(loom_kernels_use(isa), loomInvalidArgument);
        }
    }
    EXPECT_EQ(loom_kernels_isa(), before);
    {
        UseIsa scalar(LOOM_KERNELS_SCALAR);
        EXPECT_EQ(loom_kernels_isa(), LOOM_KERNELS_SCALAR);
    }
    EXPECT_EQ(loom_kernels_isa(), before);
}

TEST(KernelsIsa, MultiIgnoresInvalidArguments)
{
    float a[4] = {1, 2, 3, 4}, d[4] = {9, 9, 9, 9};
    const void *srcs[1] = {a};
    loom_reduce_multi(loomFloat32, loomSum, d, srcs, 0, 4, 1);
    loom_reduce_multi(loomFloat32, loomSum, d, nullptr, 1, 4, 1);
    loom_reduce_multi(loomNumTypes, loomSum, d, srcs, 1, 4, 1);
    loom_reduce_multi(loomFloat32, loomNumOps, d, srcs, 1, 4, 1);
    loom_reduce_multi(loomFloat32, loomSum, d, srcs, 1, 0, 1);
    for (float v : d)
        EXPECT_EQ(v, 9.0f);
    loom_reduce_multi(loomFloat32, loomAvg, d, srcs, 1, 4, 0); /* nranks < 1 is 1 */
    for (int i = 0; i < 4; i++)
        EXPECT_EQ(d[i], a[i]);
}

/* The choice made at first use from LOOM_KERNELS needs a fresh process: this
 * test runs the binary again with only the child test below selected. */
const char child_flag[] = "LOOM_TEST_KERNELS_CHILD";

TEST(KernelsIsaChild, ReportsTheActiveSet)
{
    if (std::getenv(child_flag) == nullptr)
        GTEST_SKIP() << "runs only as the child process of KernelsIsa.EnvironmentPicksTheSet";
    std::fflush(stdout);
    _exit(10 + (int)loom_kernels_isa());
}

int run_child(const char *request)
{
    const int st =
        loomtest::RerunSelf("KernelsIsaChild.*",
                            {{"LOOM_KERNELS", request}, {child_flag, "1"}, {"LOOM_DEBUG", "NONE"}});
    return st < 0 ? st : st - 10;
}

TEST(KernelsIsa, EnvironmentPicksTheSet)
{
    const loom_kernels_isa_t best = best_isa();
    EXPECT_EQ(run_child("auto"), (int)best);
    EXPECT_EQ(run_child("scalar"), (int)LOOM_KERNELS_SCALAR);
    EXPECT_EQ(run_child("Avx2"),
              loom_kernels_isa_available(LOOM_KERNELS_AVX2) ? (int)LOOM_KERNELS_AVX2 : (int)best);
    EXPECT_EQ(run_child("avx512"), loom_kernels_isa_available(LOOM_KERNELS_AVX512)
                                       ? (int)LOOM_KERNELS_AVX512
                                       : (int)best);
    EXPECT_EQ(run_child("no-such-set"), (int)best);
}

} // namespace

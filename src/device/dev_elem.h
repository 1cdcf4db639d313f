/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_elem.h - the per-element arithmetic of loom's reductions and of the
 * 4-bit codec, written once for the CPU code (dtype.h, kernels_scalar.c, the
 * scalar codec of q4.c), the host twins of the device kernels
 * (dev_kernels_host.c) and the CUDA kernels (dev_kernels.cu). Every function
 * is LOOM_HD: __host__ __device__ under nvcc, static inline in C and C++.
 *
 * Same bits on both sides:
 *  - float arithmetic is one IEEE operation each, rounded to nearest even,
 *    never contracted into a fused multiply-add: __fadd_rn and friends on the
 *    device; on the host plain operators in a build without contraction (the
 *    C files are ISO C11, where GCC does not contract; C++ users compile with
 *    -ffp-contract=off). No flush-to-zero anywhere (no fast-math).
 *  - NaN results follow the x86-64 SSE rule, which the CPU code gets from
 *    the FPU: the first operand's NaN (quieted) if it is one, else the
 *    second's, else the default NaN 0xffc00000 (Inf - Inf, 0 * Inf). The GPU
 *    gives a canonical NaN instead, so the device versions patch NaN results
 *    to that rule (a compare and a select; the kernels are memory bound).
 *  - float16/bfloat16 conversions are integer code (round to nearest even,
 *    subnormals, NaN payloads kept and quieted), no compiler half types.
 * Max/min and the NaN rules of kernels.h never use the FPU. Integer sums and
 * products wrap (unsigned arithmetic), integer avg is C's truncating division.
 */
#ifndef LOOM_DEV_ELEM_H
#define LOOM_DEV_ELEM_H

#include <stddef.h>
#include <stdint.h>
#if !defined(__CUDA_ARCH__)
#include <string.h>
#endif

#if defined(__CUDACC__)
#define LOOM_HD static inline __host__ __device__
#else
#define LOOM_HD static inline
#endif

/* ---- Bits ------------------------------------------------------------------ */

LOOM_HD uint32_t loom_de_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

LOOM_HD float loom_de_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

LOOM_HD uint64_t loom_de_f64_bits(double f)
{
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(f);
#else
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

LOOM_HD double loom_de_f64_from_bits(uint64_t u)
{
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- IEEE operations ------------------------------------------------------- */

#if defined(__CUDA_ARCH__)
/* r = a op b from the GPU; a NaN r becomes what an x86-64 SSE instruction
 * with a as its first operand returns. */
__device__ static inline float loom_de_x86_nan_f32(float a, float b, float r)
{
    if (r == r)
        return r;
    uint32_t ua = __float_as_uint(a), ub = __float_as_uint(b);
    if ((ua & 0x7fffffffu) > 0x7f800000u)
        return __uint_as_float(ua | 0x00400000u);
    if ((ub & 0x7fffffffu) > 0x7f800000u)
        return __uint_as_float(ub | 0x00400000u);
    return __uint_as_float(0xffc00000u);
}

__device__ static inline double loom_de_x86_nan_f64(double a, double b, double r)
{
    if (r == r)
        return r;
    uint64_t ua = (uint64_t)__double_as_longlong(a), ub = (uint64_t)__double_as_longlong(b);
    const uint64_t inf = 0x7ff0000000000000ull, quiet = 0x0008000000000000ull;
    if ((ua & ~(1ull << 63)) > inf)
        return __longlong_as_double((long long)(ua | quiet));
    if ((ub & ~(1ull << 63)) > inf)
        return __longlong_as_double((long long)(ub | quiet));
    return __longlong_as_double((long long)0xfff8000000000000ull);
}
#define LOOM_DE_FOP(a, b, dev, op) loom_de_x86_nan_f32(a, b, dev(a, b))
#define LOOM_DE_DOP(a, b, dev, op) loom_de_x86_nan_f64(a, b, dev(a, b))
#else
#define LOOM_DE_FOP(a, b, dev, op) ((a)op(b))
#define LOOM_DE_DOP(a, b, dev, op) ((a)op(b))
#endif

LOOM_HD float loom_de_fadd(float a, float b)
{
    return LOOM_DE_FOP(a, b, __fadd_rn, +);
}

LOOM_HD float loom_de_fsub(float a, float b)
{
    return LOOM_DE_FOP(a, b, __fsub_rn, -);
}

LOOM_HD float loom_de_fmul(float a, float b)
{
    return LOOM_DE_FOP(a, b, __fmul_rn, *);
}

LOOM_HD float loom_de_fdiv(float a, float b)
{
    return LOOM_DE_FOP(a, b, __fdiv_rn, /);
}

LOOM_HD double loom_de_dadd(double a, double b)
{
    return LOOM_DE_DOP(a, b, __dadd_rn, +);
}

LOOM_HD double loom_de_dmul(double a, double b)
{
    return LOOM_DE_DOP(a, b, __dmul_rn, *);
}

LOOM_HD double loom_de_ddiv(double a, double b)
{
    return LOOM_DE_DOP(a, b, __ddiv_rn, /);
}

/* ---- float16 / bfloat16 <-> float32 ----------------------------------------- */

/* Magnitude bits em of a normal narrow float to float32 magnitude bits. */
LOOM_HD uint32_t loom_de_narrow_normal_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
{
    return (em << (23 - mbits)) + ((127u - ebias) << 23);
}

/* float32 magnitude bits ax that fall in the normal range of a narrow format
 * to its magnitude bits, rounding to nearest even. A carry out of the
 * mantissa moves into the exponent, which is exactly the next value up. */
LOOM_HD uint32_t loom_de_f32_bits_to_narrow_normal(uint32_t ax, unsigned mbits, unsigned ebias)
{
    unsigned drop = 23 - mbits;
    uint32_t r = ax - ((127u - ebias) << 23);
    return (r + ((1u << (drop - 1)) - 1) + ((r >> drop) & 1)) >> drop;
}

/* Magnitude bits em of a finite narrow float (mbits mantissa bits, exponent
 * bias ebias) to float32 magnitude bits. A subnormal is normalised in up to
 * four fixed-distance conditional shifts rather than a count-leading-zeros
 * loop, so loops over arrays stay branch-free and vectorise. */
LOOM_HD uint32_t loom_de_narrow_mag_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
{
    uint32_t mask = (1u << mbits) - 1;
    uint32_t top = 2u << mbits;
    uint32_t m = em & mask;
    uint32_t s = 0;
    uint32_t c;

    if (mbits >= 8) {
        c = m < (top >> 8);
        m = c ? m << 8 : m;
        s += c ? 8 : 0;
    }
    if (mbits >= 4) {
        c = m < (top >> 4);
        m = c ? m << 4 : m;
        s += c ? 4 : 0;
    }
    c = m < (top >> 2);
    m = c ? m << 2 : m;
    s += c ? 2 : 0;
    c = m < (top >> 1);
    m = c ? m << 1 : m;
    s += c ? 1 : 0;

    uint32_t normal = loom_de_narrow_normal_to_f32_bits(em, mbits, ebias);
    uint32_t sub = ((128u - ebias - s) << 23) | ((m & mask) << (23 - mbits));
    sub = (em & mask) ? sub : 0;
    return (em >> mbits) ? normal : sub;
}

/* float32 magnitude bits ax (not NaN, below the format's overflow threshold)
 * to narrow magnitude bits, rounding to nearest even; a subnormal result that
 * rounds up to the smallest normal gets its encoding through the same carry. */
LOOM_HD uint32_t loom_de_f32_bits_to_narrow_mag(uint32_t ax, unsigned mbits, unsigned ebias)
{
    if (ax >= ((128u - ebias) << 23))
        return loom_de_f32_bits_to_narrow_normal(ax, mbits, ebias);
    /* Subnormal in the narrow format: the shift is at least 24 - mbits; past 25
     * every float32 (its own subnormals included) rounds to zero, and capping
     * it keeps the shift defined. */
    uint32_t shift = 151u - ebias - mbits - (ax >> 23);
    shift = shift > 25 ? 25 : shift;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    return (mant + (1u << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift;
}

LOOM_HD float loom_de_f16_decode(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t mag = loom_de_narrow_mag_to_f32_bits(em, 10, 15);
    /* Exponent 31: infinity or NaN, payload kept. */
    mag = em >= 0x7c00u ? (em << 13) | 0x7f800000u : mag;
    return loom_de_f32_from_bits(sign | mag);
}

LOOM_HD uint16_t loom_de_f16_encode(float f)
{
    uint32_t x = loom_de_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u)
        r = 0x7e00u | ((ax >> 13) & 0x3ffu);
    else if (ax >= 0x477ff000u) /* 65520 and up: halfway past 65504 rounds to even = inf */
        r = 0x7c00u;
    else
        r = loom_de_f32_bits_to_narrow_mag(ax, 10, 15);
    return (uint16_t)(sign | r);
}

LOOM_HD float loom_de_bf16_decode(uint16_t b)
{
    return loom_de_f32_from_bits((uint32_t)b << 16);
}

LOOM_HD uint16_t loom_de_bf16_encode(float f)
{
    uint32_t x = loom_de_f32_bits(f);
    /* Same exponent range as float32: rounding the low half suffices, and a
     * carry into the exponent gives the next value (or infinity). The sign bit
     * cannot be reached because NaNs are handled apart. */
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    /* Compared as int32_t (the value is below 2^31): SSE2 has only signed
     * lane compares, so this keeps bulk loops cheap. */
    return (uint16_t)((int32_t)(x & 0x7fffffffu) > 0x7f800000 ? nan : r);
}

/* ---- Accumulate: acc = acc op x, per accumulator type ------------------------ */

/* Sum and product modulo 2^bits are the same bits whether the operands are
 * read as signed or unsigned, so signed integers use the unsigned ones and
 * signed overflow never happens. uint8_t promotes to int, but 255 * 255 fits. */
#define LOOM_DE_UINT_OPS(sfx, T)                                                                   \
    LOOM_HD T loom_de_sum_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return (T)(a + b);                                                                         \
    }                                                                                              \
    LOOM_HD T loom_de_prod_##sfx(T a, T b)                                                         \
    {                                                                                              \
        return (T)(a * b);                                                                         \
    }

#define LOOM_DE_ORDER_OPS(sfx, T)                                                                  \
    LOOM_HD T loom_de_max_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }                                                                                              \
    LOOM_HD T loom_de_min_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }

/* NaN checks come first because "a > b ? a : b" alone would drop a NaN in a;
 * the NaN operand is returned as it is (no FPU, payload and sign kept). */
#define LOOM_DE_FLOAT_OPS(sfx, T, add, mul)                                                        \
    LOOM_HD T loom_de_sum_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return add(a, b);                                                                          \
    }                                                                                              \
    LOOM_HD T loom_de_prod_##sfx(T a, T b)                                                         \
    {                                                                                              \
        return mul(a, b);                                                                          \
    }                                                                                              \
    LOOM_HD T loom_de_max_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return a != a ? a : b != b ? b : a > b ? a : b;                                            \
    }                                                                                              \
    LOOM_HD T loom_de_min_##sfx(T a, T b)                                                          \
    {                                                                                              \
        return a != a ? a : b != b ? b : a < b ? a : b;                                            \
    }

LOOM_DE_UINT_OPS(u8, uint8_t)
LOOM_DE_UINT_OPS(u32, uint32_t)
LOOM_DE_UINT_OPS(u64, uint64_t)
LOOM_DE_ORDER_OPS(i8, int8_t)
LOOM_DE_ORDER_OPS(u8, uint8_t)
LOOM_DE_ORDER_OPS(i32, int32_t)
LOOM_DE_ORDER_OPS(u32, uint32_t)
LOOM_DE_ORDER_OPS(i64, int64_t)
LOOM_DE_ORDER_OPS(u64, uint64_t)
LOOM_DE_FLOAT_OPS(f32, float, loom_de_fadd, loom_de_fmul)
LOOM_DE_FLOAT_OPS(f64, double, loom_de_dadd, loom_de_dmul)

/* ---- Finish: avg divides the accumulated sum once by nranks ----------------- */

/* The divisor of avg: nranks < 1 counts as 1. */
LOOM_HD int loom_de_ranks(int nranks)
{
    return nranks < 1 ? 1 : nranks;
}

/* The 8-bit integers divide in int (so nranks > 127 is not truncated), the
 * wider ones in their own type; C division truncates toward zero. */
LOOM_HD int8_t loom_de_avg_i8(int8_t x, int nranks)
{
    return (int8_t)((int)x / nranks);
}

LOOM_HD uint8_t loom_de_avg_u8(uint8_t x, int nranks)
{
    return (uint8_t)((int)x / nranks);
}

LOOM_HD int32_t loom_de_avg_i32(int32_t x, int nranks)
{
    return x / (int32_t)nranks;
}

LOOM_HD uint32_t loom_de_avg_u32(uint32_t x, int nranks)
{
    return x / (uint32_t)nranks;
}

LOOM_HD int64_t loom_de_avg_i64(int64_t x, int nranks)
{
    return x / (int64_t)nranks;
}

LOOM_HD uint64_t loom_de_avg_u64(uint64_t x, int nranks)
{
    return x / (uint64_t)nranks;
}

LOOM_HD float loom_de_avg_f32(float x, int nranks)
{
    return loom_de_fdiv(x, (float)nranks);
}

LOOM_HD double loom_de_avg_f64(double x, int nranks)
{
    return loom_de_ddiv(x, (double)nranks);
}

/* ---- The 4-bit codec (q4.h): layout and the rules of one block ---------------- */

#define LOOM_DE_Q4_BLOCK           32   /* values per scale */
#define LOOM_DE_Q4_TILE            2048 /* values per tile */
#define LOOM_DE_Q4_TILE_BYTES      1152 /* 1024 code bytes + 64 bf16 scales */
#define LOOM_DE_Q4_BLOCKS_PER_TILE 64
#define LOOM_DE_Q4_CODE_BYTES      1024 /* code bytes of a tile */
#define LOOM_DE_Q4_MAXCODE         7

/* Below 2^-123 (8 x FLT_MIN) a block is all zeros: then amax / 7 is a normal
 * float and 1 / scale finite (2^-126 / 7 would give an infinite inverse). */
#define LOOM_DE_Q4_TINY_BITS 0x02000000u
/* The largest bf16 scale with 7 * scale finite (1.140625 * 2^125): blocks
 * within 0.2 % of FLT_MAX clip slightly instead of decoding to infinity. */
#define LOOM_DE_Q4_SCALE_MAX_BITS 0x7e12u
#define LOOM_DE_Q4_SCALE_NAN_BITS 0x7fc0u
/* 1.5 * 2^23: adding it rounds any |v| < 2^22 to an integer, to nearest
 * even (what rintf does, without a libm call); subtracting it is exact. */
#define LOOM_DE_Q4_ROUND_MAGIC 12582912.0f

/* Bytes that n encoded values take: whole tiles. */
LOOM_HD size_t loom_de_q4_bytes(size_t n)
{
    return (n + LOOM_DE_Q4_TILE - 1) / LOOM_DE_Q4_TILE * LOOM_DE_Q4_TILE_BYTES;
}

/* Offset of the 16 code bytes of block k (counted from the stream's start). */
LOOM_HD size_t loom_de_q4_codes_off(size_t k)
{
    return k / LOOM_DE_Q4_BLOCKS_PER_TILE * LOOM_DE_Q4_TILE_BYTES +
           k % LOOM_DE_Q4_BLOCKS_PER_TILE * 16;
}

/* Offset of the two little-endian bytes of block k's bf16 scale. */
LOOM_HD size_t loom_de_q4_scale_off(size_t k)
{
    return k / LOOM_DE_Q4_BLOCKS_PER_TILE * LOOM_DE_Q4_TILE_BYTES + LOOM_DE_Q4_CODE_BYTES +
           k % LOOM_DE_Q4_BLOCKS_PER_TILE * 2;
}

/* |x| as float32 bits (sign cleared); the block's amax is the largest of
 * these compared as integers, so a NaN (above 0x7f800000) wins. */
LOOM_HD uint32_t loom_de_q4_abs_bits(float x)
{
    return loom_de_f32_bits(x) & 0x7fffffffu;
}

/* The bf16 bits of the scale of a block whose absolute maximum has float32
 * bits amax_bits. The division is one IEEE float32 operation; adding 0xffff
 * before dropping the low half rounds the positive quotient toward +inf. */
LOOM_HD uint32_t loom_de_q4_scale_bits(uint32_t amax_bits)
{
    if (amax_bits >= 0x7f800000u)
        return LOOM_DE_Q4_SCALE_NAN_BITS;
    if (amax_bits < LOOM_DE_Q4_TINY_BITS)
        return 0;
    float q = loom_de_fdiv(loom_de_f32_from_bits(amax_bits), 7.0f);
    uint32_t s = (loom_de_f32_bits(q) + 0xffffu) >> 16;
    return s < LOOM_DE_Q4_SCALE_MAX_BITS ? s : LOOM_DE_Q4_SCALE_MAX_BITS;
}

/* 1 if the block's codes are all 0 whatever its values (zero/subnormal or
 * non-finite absolute maximum); its scale is then 0 or NaN and inv unused. */
LOOM_HD int loom_de_q4_special(uint32_t amax_bits)
{
    return amax_bits >= 0x7f800000u || amax_bits < LOOM_DE_Q4_TINY_BITS;
}

/* The code of value u in a block that is not special: rint(u * inv) clamped
 * to [-7, 7]; inv = 1.0f / scale. */
LOOM_HD int loom_de_q4_code(float u, float inv)
{
    float v = loom_de_fmul(u, inv);
    float r = loom_de_fsub(loom_de_fadd(v, LOOM_DE_Q4_ROUND_MAGIC), LOOM_DE_Q4_ROUND_MAGIC);
    r = r < -7.0f ? -7.0f : r > 7.0f ? 7.0f : r;
    return (int)r;
}

/* Codes c0 (even element) and c1 (odd) as one byte, two's complement nibbles. */
LOOM_HD uint8_t loom_de_q4_pack(int c0, int c1)
{
    return (uint8_t)((c0 & 0xf) | (c1 & 0xf) << 4);
}

/* Nibble 0 (low) or 1 (high) of a code byte as a signed code: a foreign -8
 * decodes as -8. */
LOOM_HD int loom_de_q4_nibble(unsigned byte, int hi)
{
    unsigned nib = hi ? (byte >> 4) & 0xfu : byte & 0xfu;
    return (int)(nib ^ 8u) - 8;
}

/* D(code) = code * scale: exact in float32 for a scale the encoder made. */
LOOM_HD float loom_de_q4_dequant(int code, float scale)
{
    return loom_de_fmul((float)code, scale);
}

/* The residual u - D(code): one rounding. */
LOOM_HD float loom_de_q4_residual(float u, int code, float scale)
{
    return loom_de_fsub(u, loom_de_q4_dequant(code, scale));
}

#endif

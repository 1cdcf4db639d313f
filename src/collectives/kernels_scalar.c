/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_scalar.c - the portable C kernel table: small per-(datatype, op)
 * functions for init, accumulate and finish, with the 8/16-bit float
 * conversions inlined from dtype.h (float16/bfloat16 and the accumulate
 * steps are dev_elem.h's, shared with the device kernels). It is the
 * reference that the vector tables (kernels_avx2.c, kernels_avx512.c) must
 * match bit for bit, and the fallback for every entry they leave out. Reached only through the
 * dispatcher in kernels.c; it does not validate arguments, allocate, log or
 * use threads, and chunking for cache reuse is the caller's business.
 */
#include "kernels_impl.h"

#include <stdint.h>
#include <string.h>

#include "blocked_for.h"
#include "dtype.h"

/* ---- Block-wise narrow conversions -------------------------------------- */

/* The general f16 converters of dtype.h handle subnormals, infinities and
 * NaNs with selects and variable shifts that make a vectorised loop several
 * times slower than the plain case. Real data is nearly always zeros and
 * normal numbers, so each block of KBLOCK elements is checked first: a block
 * without anything unusual goes through the plain converter (a shift and an
 * add per element), any other block through the general one. Both give the
 * same bits for every value the plain one accepts; the rounding arithmetic is
 * shared with dtype.h. The fp8 encodings also get a plain encoder; bfloat16's
 * converters and the fp8 decoders (a table lookup) are as fast as a plain one
 * would be, so their "unusual" tests are constant 0 and fold away. */

/* On 16-bit lanes (subnormal: exponent 0 and not zero; or exponent 31), which
 * SSE2 compares directly without widening first. */
static inline uint16_t f16_decode_unusual(uint16_t h)
{
    uint16_t exp = h & 0x7c00u;
    uint16_t em = h & 0x7fffu;
    return (uint16_t)((exp == 0x7c00u) | ((exp == 0) & (em != 0)));
}

static inline float f16_decode_plain(uint16_t h)
{
    uint32_t em = h & 0x7fffu;
    uint32_t mag = em ? loom_narrow_normal_to_f32_bits(em, 10, 15) : 0;
    return loom_f32_from_bits(((uint32_t)(h & 0x8000u) << 16) | mag);
}

static inline uint16_t bf16_decode_unusual(uint16_t b)
{
    (void)b;
    return 0;
}

static inline float bf16_decode_plain(uint16_t b)
{
    return loom_bf16_decode(b);
}

static inline uint16_t e4m3_decode_unusual(uint8_t v)
{
    (void)v;
    return 0;
}

static inline float e4m3_decode_plain(uint8_t v)
{
    return loom_e4m3_decode(v);
}

static inline uint16_t e5m2_decode_unusual(uint8_t v)
{
    (void)v;
    return 0;
}

static inline float e5m2_decode_plain(uint8_t v)
{
    return loom_e5m2_decode(v);
}

/* The tests are written with & and | rather than && and || so that the loops
 * over a block stay branch-free and vectorise. For encoding, plain means zero
 * or a magnitude inside the format's normal range (up to its largest finite
 * value, or to the f16 overflow threshold); the comparisons are on int32_t
 * because SSE2 compares only signed lanes. */
static inline uint32_t f16_encode_unusual(float f)
{
    int32_t ax = (int32_t)(loom_f32_to_bits(f) & 0x7fffffffu);
    return (ax != 0) & ((ax < 0x38800000) | (ax >= 0x477ff000));
}

static inline uint16_t f16_encode_plain(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t mag = ax ? loom_f32_bits_to_narrow_normal(ax, 10, 15) : 0;
    return (uint16_t)(((x >> 16) & 0x8000u) | mag);
}

static inline uint32_t e4m3_encode_unusual(float f)
{
    int32_t ax = (int32_t)(loom_f32_to_bits(f) & 0x7fffffffu);
    return (ax != 0) & ((ax < 0x3c800000) | (ax > 0x43e00000));
}

static inline uint8_t e4m3_encode_plain(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t mag = ax ? loom_f32_bits_to_narrow_normal(ax, 3, 7) : 0;
    return (uint8_t)(((x >> 24) & 0x80u) | mag);
}

static inline uint32_t e5m2_encode_unusual(float f)
{
    int32_t ax = (int32_t)(loom_f32_to_bits(f) & 0x7fffffffu);
    return (ax != 0) & ((ax < 0x38800000) | (ax > 0x47600000));
}

static inline uint8_t e5m2_encode_plain(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t mag = ax ? loom_f32_bits_to_narrow_normal(ax, 2, 15) : 0;
    return (uint8_t)(((x >> 24) & 0x80u) | mag);
}

static inline uint32_t bf16_encode_unusual(float f)
{
    (void)f;
    return 0;
}

static inline uint16_t bf16_encode_plain(float f)
{
    return loom_bf16_encode(f);
}

#define DEFINE_BLOCK_TEST(name, T, unusual)                                                        \
    static inline int name(const T *x)                                                             \
    {                                                                                              \
        unsigned any = 0;                                                                          \
        for (size_t k = 0; k < KBLOCK; k++)                                                        \
            any |= unusual(x[k]);                                                                  \
        return any == 0;                                                                           \
    }

DEFINE_BLOCK_TEST(f16_decode_block_plain, uint16_t, f16_decode_unusual)
DEFINE_BLOCK_TEST(bf16_decode_block_plain, uint16_t, bf16_decode_unusual)
DEFINE_BLOCK_TEST(e4m3_decode_block_plain, uint8_t, e4m3_decode_unusual)
DEFINE_BLOCK_TEST(e5m2_decode_block_plain, uint8_t, e5m2_decode_unusual)
DEFINE_BLOCK_TEST(f16_encode_block_plain, float, f16_encode_unusual)
DEFINE_BLOCK_TEST(bf16_encode_block_plain, float, bf16_encode_unusual)
DEFINE_BLOCK_TEST(e4m3_encode_block_plain, float, e4m3_encode_unusual)
DEFINE_BLOCK_TEST(e5m2_encode_block_plain, float, e5m2_encode_unusual)

/* a[i] = combine(a[i], decode(s[i])) over n elements of format sfx; combine
 * may be a macro that ignores its first argument (init). */
#define NARROW_DECODE_LOOP(sfx, a, s, n, combine)                                                  \
    do {                                                                                           \
        size_t base_ = 0;                                                                          \
        for (; base_ + KBLOCK <= (n); base_ += KBLOCK) {                                           \
            if (sfx##_decode_block_plain((s) + base_)) {                                           \
                for (size_t k_ = 0; k_ < KBLOCK; k_++)                                             \
                    (a)[base_ + k_] =                                                              \
                        combine((a)[base_ + k_], sfx##_decode_plain((s)[base_ + k_]));             \
            } else {                                                                               \
                for (size_t k_ = 0; k_ < KBLOCK; k_++)                                             \
                    (a)[base_ + k_] =                                                              \
                        combine((a)[base_ + k_], loom_##sfx##_decode((s)[base_ + k_]));            \
            }                                                                                      \
        }                                                                                          \
        for (size_t i_ = base_; i_ < (n); i_++)                                                    \
            (a)[i_] = combine((a)[i_], loom_##sfx##_decode((s)[i_]));                              \
    } while (0)

/* ---- Accumulate -------------------------------------------------------- */

#define LOAD_SAME(x) (x)

#define DEFINE_ACC(name, AT, ST, load, combine)                                                    \
    static void name(void *restrict accv, const void *restrict srcv, size_t n)                     \
    {                                                                                              \
        AT *a = accv;                                                                              \
        const ST *s = srcv;                                                                        \
        BLOCKED_FOR(i, n, a[i] = combine(a[i], load(s[i])));                                       \
    }

DEFINE_ACC(acc_add_u8, uint8_t, uint8_t, LOAD_SAME, add_u8)
DEFINE_ACC(acc_mul_u8, uint8_t, uint8_t, LOAD_SAME, mul_u8)
DEFINE_ACC(acc_max_u8, uint8_t, uint8_t, LOAD_SAME, max_u8)
DEFINE_ACC(acc_min_u8, uint8_t, uint8_t, LOAD_SAME, min_u8)
DEFINE_ACC(acc_max_i8, int8_t, int8_t, LOAD_SAME, max_i8)
DEFINE_ACC(acc_min_i8, int8_t, int8_t, LOAD_SAME, min_i8)
DEFINE_ACC(acc_add_u32, uint32_t, uint32_t, LOAD_SAME, add_u32)
DEFINE_ACC(acc_mul_u32, uint32_t, uint32_t, LOAD_SAME, mul_u32)
DEFINE_ACC(acc_max_u32, uint32_t, uint32_t, LOAD_SAME, max_u32)
DEFINE_ACC(acc_min_u32, uint32_t, uint32_t, LOAD_SAME, min_u32)
DEFINE_ACC(acc_max_i32, int32_t, int32_t, LOAD_SAME, max_i32)
DEFINE_ACC(acc_min_i32, int32_t, int32_t, LOAD_SAME, min_i32)
DEFINE_ACC(acc_add_u64, uint64_t, uint64_t, LOAD_SAME, add_u64)
DEFINE_ACC(acc_mul_u64, uint64_t, uint64_t, LOAD_SAME, mul_u64)
DEFINE_ACC(acc_max_u64, uint64_t, uint64_t, LOAD_SAME, max_u64)
DEFINE_ACC(acc_min_u64, uint64_t, uint64_t, LOAD_SAME, min_u64)
DEFINE_ACC(acc_max_i64, int64_t, int64_t, LOAD_SAME, max_i64)
DEFINE_ACC(acc_min_i64, int64_t, int64_t, LOAD_SAME, min_i64)
DEFINE_ACC(acc_add_f32, float, float, LOAD_SAME, add_f32)
DEFINE_ACC(acc_mul_f32, float, float, LOAD_SAME, mul_f32)
DEFINE_ACC(acc_max_f32, float, float, LOAD_SAME, max_f32)
DEFINE_ACC(acc_min_f32, float, float, LOAD_SAME, min_f32)
DEFINE_ACC(acc_add_f64, double, double, LOAD_SAME, add_f64)
DEFINE_ACC(acc_mul_f64, double, double, LOAD_SAME, mul_f64)
DEFINE_ACC(acc_max_f64, double, double, LOAD_SAME, max_f64)
DEFINE_ACC(acc_min_f64, double, double, LOAD_SAME, min_f64)

#define DEFINE_NARROW_ACC_OP(op, sfx, ST)                                                          \
    static void acc_##op##_##sfx(void *restrict accv, const void *restrict srcv, size_t n)         \
    {                                                                                              \
        float *a = accv;                                                                           \
        const ST *s = srcv;                                                                        \
        NARROW_DECODE_LOOP(sfx, a, s, n, op##_f32);                                                \
    }

#define DEFINE_NARROW_ACC(sfx, ST)                                                                 \
    DEFINE_NARROW_ACC_OP(add, sfx, ST)                                                             \
    DEFINE_NARROW_ACC_OP(mul, sfx, ST)                                                             \
    DEFINE_NARROW_ACC_OP(max, sfx, ST)                                                             \
    DEFINE_NARROW_ACC_OP(min, sfx, ST)

DEFINE_NARROW_ACC(f16, uint16_t)
DEFINE_NARROW_ACC(bf16, uint16_t)
DEFINE_NARROW_ACC(e4m3, uint8_t)
DEFINE_NARROW_ACC(e5m2, uint8_t)

/* ---- Init -------------------------------------------------------------- */

/* Native init is a copy; memmove makes any overlap, the documented exact
 * alias included, safe. */
static void init_copy_1(void *acc, const void *src, size_t n)
{
    if (acc != src)
        memmove(acc, src, n);
}

static void init_copy_4(void *acc, const void *src, size_t n)
{
    if (acc != src)
        memmove(acc, src, n * 4);
}

static void init_copy_8(void *acc, const void *src, size_t n)
{
    if (acc != src)
        memmove(acc, src, n * 8);
}

/* init_fn has no restrict (native inits may alias), but a widening init has
 * distinct buffers by contract; the restrict-qualified parameters of the loop
 * helper say so to the vectoriser, which did not vectorise these loops when
 * the restrict was on local pointers instead. */
#define TAKE_SECOND(a, b) (b)

#define DEFINE_NARROW_INIT(sfx, ST)                                                                \
    static inline void init_##sfx##_loop(float *restrict a, const ST *restrict s, size_t n)        \
    {                                                                                              \
        NARROW_DECODE_LOOP(sfx, a, s, n, TAKE_SECOND);                                             \
    }                                                                                              \
    static void init_##sfx(void *acc, const void *src, size_t n)                                   \
    {                                                                                              \
        init_##sfx##_loop(acc, src, n);                                                            \
    }

DEFINE_NARROW_INIT(f16, uint16_t)
DEFINE_NARROW_INIT(bf16, uint16_t)
DEFINE_NARROW_INIT(e4m3, uint8_t)
DEFINE_NARROW_INIT(e5m2, uint8_t)

/* ---- Finish ------------------------------------------------------------ */

static void finish_copy_1(void *dst, const void *acc, size_t n, int nranks)
{
    (void)nranks;
    if (dst != acc)
        memmove(dst, acc, n);
}

static void finish_copy_4(void *dst, const void *acc, size_t n, int nranks)
{
    (void)nranks;
    if (dst != acc)
        memmove(dst, acc, n * 4);
}

static void finish_copy_8(void *dst, const void *acc, size_t n, int nranks)
{
    (void)nranks;
    if (dst != acc)
        memmove(dst, acc, n * 8);
}

/* Native avg: the in-place and the distinct-buffer cases get their own loop
 * so both vectorise without a runtime overlap check. DT is the type the
 * division runs in: int for the 8-bit integers (so nranks > 127 is not
 * truncated), the datatype itself otherwise. */
#define DEFINE_NATIVE_AVG(sfx, T, DT)                                                              \
    static inline void avg_##sfx##_loop(T *restrict y, const T *restrict x, size_t n, DT d)        \
    {                                                                                              \
        BLOCKED_FOR(i, n, y[i] = (T)((DT)x[i] / d));                                               \
    }                                                                                              \
    static void finish_avg_##sfx(void *dst, const void *acc, size_t n, int nranks)                 \
    {                                                                                              \
        DT d = (DT)nranks;                                                                         \
        if (dst == acc) {                                                                          \
            T *x = dst;                                                                            \
            BLOCKED_FOR(i, n, x[i] = (T)((DT)x[i] / d));                                           \
        } else {                                                                                   \
            avg_##sfx##_loop(dst, acc, n, d);                                                      \
        }                                                                                          \
    }

DEFINE_NATIVE_AVG(i8, int8_t, int)
DEFINE_NATIVE_AVG(u8, uint8_t, int)
DEFINE_NATIVE_AVG(i32, int32_t, int32_t)
DEFINE_NATIVE_AVG(u32, uint32_t, uint32_t)
DEFINE_NATIVE_AVG(i64, int64_t, int64_t)
DEFINE_NATIVE_AVG(u64, uint64_t, uint64_t)
DEFINE_NATIVE_AVG(f32, float, float)
DEFINE_NATIVE_AVG(f64, double, double)

/* Elements per step when a narrowing finish writes over its own float32
 * accumulator (dst == acc). Step k writes dst bytes below
 * size*(k+1)*FINISH_CHUNK, size <= 2, while later steps read acc bytes from
 * 4*(k+1)*FINISH_CHUNK on, so no step overwrites accumulator values that a
 * later one still needs. */
#define FINISH_CHUNK 512

/* Narrowing finish: the avg variant divides in float32, then rounds once to
 * the datatype. Each block is divided into a local array first so that the
 * plain-block test sees the values that are actually encoded. When dst aliases
 * acc the results go through a stack buffer one chunk at a time (see
 * FINISH_CHUNK), so the converting loop can still be restrict-qualified. */
#define DEFINE_NARROW_FINISH(name, sfx, ST, avg)                                                   \
    static void name##_block(ST *restrict y, const float *restrict x, size_t n, float d)           \
    {                                                                                              \
        size_t base = 0;                                                                           \
        for (; base + KBLOCK <= n; base += KBLOCK) {                                               \
            float q[KBLOCK];                                                                       \
            for (size_t k = 0; k < KBLOCK; k++)                                                    \
                q[k] = avg ? x[base + k] / d : x[base + k];                                        \
            if (sfx##_encode_block_plain(q)) {                                                     \
                for (size_t k = 0; k < KBLOCK; k++)                                                \
                    y[base + k] = sfx##_encode_plain(q[k]);                                        \
            } else {                                                                               \
                for (size_t k = 0; k < KBLOCK; k++)                                                \
                    y[base + k] = loom_##sfx##_encode(q[k]);                                       \
            }                                                                                      \
        }                                                                                          \
        for (size_t i = base; i < n; i++)                                                          \
            y[i] = loom_##sfx##_encode(avg ? x[i] / d : x[i]);                                     \
    }                                                                                              \
    static void name(void *dstv, const void *accv, size_t n, int nranks)                           \
    {                                                                                              \
        ST *y = dstv;                                                                              \
        const float *x = accv;                                                                     \
        float d = (float)nranks;                                                                   \
        if (!loom_kernels_overlap(dstv, n * sizeof(ST), accv, n * sizeof(float))) {                \
            name##_block(y, x, n, d);                                                              \
            return;                                                                                \
        }                                                                                          \
        ST tmp[FINISH_CHUNK];                                                                      \
        for (size_t off = 0; off < n; off += FINISH_CHUNK) {                                       \
            size_t len = n - off < FINISH_CHUNK ? n - off : FINISH_CHUNK;                          \
            name##_block(tmp, x + off, len, d);                                                    \
            memcpy(y + off, tmp, len * sizeof(ST));                                                \
        }                                                                                          \
    }

DEFINE_NARROW_FINISH(finish_copy_f16, f16, uint16_t, 0)
DEFINE_NARROW_FINISH(finish_avg_f16, f16, uint16_t, 1)
DEFINE_NARROW_FINISH(finish_copy_bf16, bf16, uint16_t, 0)
DEFINE_NARROW_FINISH(finish_avg_bf16, bf16, uint16_t, 1)
DEFINE_NARROW_FINISH(finish_copy_e4m3, e4m3, uint8_t, 0)
DEFINE_NARROW_FINISH(finish_avg_e4m3, e4m3, uint8_t, 1)
DEFINE_NARROW_FINISH(finish_copy_e5m2, e5m2, uint8_t, 0)
DEFINE_NARROW_FINISH(finish_avg_e5m2, e5m2, uint8_t, 1)

/* ---- The table --------------------------------------------------------- */

#define ACC_OPS(add, mul, max, min)                                                                \
    {                                                                                              \
        [loomSum] = add, [loomProd] = mul, [loomMax] = max, [loomMin] = min, [loomAvg] = add       \
    }
#define FINISH_OPS(copy, avg)                                                                      \
    {                                                                                              \
        [loomSum] = copy, [loomProd] = copy, [loomMax] = copy, [loomMin] = copy, [loomAvg] = avg   \
    }

#define NATIVE_ROW(size, sum, prod, max, min, avg)                                                 \
    {                                                                                              \
        .acc_size = size, .native = 1, .init = init_copy_##size,                                   \
        .acc = ACC_OPS(sum, prod, max, min), .finish = FINISH_OPS(finish_copy_##size, avg),        \
    }
#define NARROW_ROW(sfx)                                                                            \
    {                                                                                              \
        .acc_size = 4, .native = 0, .init = init_##sfx,                                            \
        .acc = ACC_OPS(acc_add_##sfx, acc_mul_##sfx, acc_max_##sfx, acc_min_##sfx),                \
        .finish = FINISH_OPS(finish_copy_##sfx, finish_avg_##sfx),                                 \
    }

/* No multi entries: the dispatcher's blocked init/acc/finish is what the
 * scalar table would do anyway. */
const struct loom_kernel_row loom_kernels_scalar_table[loomNumTypes] = {
    [loomInt8] = NATIVE_ROW(1, acc_add_u8, acc_mul_u8, acc_max_i8, acc_min_i8, finish_avg_i8),
    [loomUint8] = NATIVE_ROW(1, acc_add_u8, acc_mul_u8, acc_max_u8, acc_min_u8, finish_avg_u8),
    [loomInt32] = NATIVE_ROW(4, acc_add_u32, acc_mul_u32, acc_max_i32, acc_min_i32, finish_avg_i32),
    [loomUint32] =
        NATIVE_ROW(4, acc_add_u32, acc_mul_u32, acc_max_u32, acc_min_u32, finish_avg_u32),
    [loomInt64] = NATIVE_ROW(8, acc_add_u64, acc_mul_u64, acc_max_i64, acc_min_i64, finish_avg_i64),
    [loomUint64] =
        NATIVE_ROW(8, acc_add_u64, acc_mul_u64, acc_max_u64, acc_min_u64, finish_avg_u64),
    [loomFloat16] = NARROW_ROW(f16),
    [loomFloat32] =
        NATIVE_ROW(4, acc_add_f32, acc_mul_f32, acc_max_f32, acc_min_f32, finish_avg_f32),
    [loomFloat64] =
        NATIVE_ROW(8, acc_add_f64, acc_mul_f64, acc_max_f64, acc_min_f64, finish_avg_f64),
    [loomBfloat16] = NARROW_ROW(bf16),
    [loomFloat8e4m3] = NARROW_ROW(e4m3),
    [loomFloat8e5m2] = NARROW_ROW(e5m2),
};

/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_kernels_host.c - the host twins of the device kernels (dev_kernels.h):
 * plain element loops over dev_elem.h's functions, in the order the CUDA
 * kernels use per element (source 0, then sources 1..nsrc-1, one rounding at
 * the end), so they give the kernels' bits. The emulated device runs them
 * and the device tests compare the kernels with them. They are written for
 * clarity, not speed: the CPU's own kernels are kernels.h and q4.h.
 */
#include "dev_kernels.h"

#include <string.h>

#include "dev_elem.h"

int loom_dk_dtype_ok(loomDataType_t dt)
{
    return (int)dt >= 0 && dt < loomNumTypes && dt != loomFloat8e4m3 && dt != loomFloat8e5m2;
}

/* ---- Reduce ---------------------------------------------------------------- */

typedef void (*reduce_fn_t)(void *dst, const void *const *srcs, int nsrc, size_t n, int nranks,
                            int avg);

/* One (datatype, op) loop: ST is the element type, AT the accumulator's;
 * load widens an element, op accumulates, fin(a, nranks, avg) rounds once.
 * Every source of element i is read before dst[i] is written, so dst may be
 * one of the sources. */
#define DEFINE_REDUCE(name, ST, AT, load, op, fin)                                                 \
    static void name(void *dstv, const void *const *srcs, int nsrc, size_t n, int nranks, int avg) \
    {                                                                                              \
        ST *dst = dstv;                                                                            \
        for (size_t i = 0; i < n; i++) {                                                           \
            AT a = load(((const ST *)srcs[0])[i]);                                                 \
            for (int k = 1; k < nsrc; k++)                                                         \
                a = op(a, load(((const ST *)srcs[k])[i]));                                         \
            dst[i] = fin(a, nranks, avg);                                                          \
        }                                                                                          \
    }

#define SAME(x) (x)

/* Integers: sum and product in the unsigned type of the same width (wrap),
 * max/min and avg's division in the datatype's own signedness. */
#define DEFINE_INT(s, TS, u, TU)                                                                   \
    static inline TU fin_##s(TU a, int nranks, int avg)                                            \
    {                                                                                              \
        return avg ? (TU)loom_de_avg_##s((TS)a, nranks) : a;                                       \
    }                                                                                              \
    static inline TS fin_order_##s(TS a, int nranks, int avg)                                      \
    {                                                                                              \
        (void)nranks;                                                                              \
        (void)avg;                                                                                 \
        return a;                                                                                  \
    }                                                                                              \
    DEFINE_REDUCE(sum_##s, TU, TU, SAME, loom_de_sum_##u, fin_##s)                                 \
    DEFINE_REDUCE(prod_##s, TU, TU, SAME, loom_de_prod_##u, fin_##s)                               \
    DEFINE_REDUCE(max_##s, TS, TS, SAME, loom_de_max_##s, fin_order_##s)                           \
    DEFINE_REDUCE(min_##s, TS, TS, SAME, loom_de_min_##s, fin_order_##s)

DEFINE_INT(i8, int8_t, u8, uint8_t)
DEFINE_INT(u8, uint8_t, u8, uint8_t)
DEFINE_INT(i32, int32_t, u32, uint32_t)
DEFINE_INT(u32, uint32_t, u32, uint32_t)
DEFINE_INT(i64, int64_t, u64, uint64_t)
DEFINE_INT(u64, uint64_t, u64, uint64_t)

#define DEFINE_FLOAT(s, T)                                                                         \
    static inline T fin_##s(T a, int nranks, int avg)                                              \
    {                                                                                              \
        return avg ? loom_de_avg_##s(a, nranks) : a;                                               \
    }                                                                                              \
    DEFINE_REDUCE(sum_##s, T, T, SAME, loom_de_sum_##s, fin_##s)                                   \
    DEFINE_REDUCE(prod_##s, T, T, SAME, loom_de_prod_##s, fin_##s)                                 \
    DEFINE_REDUCE(max_##s, T, T, SAME, loom_de_max_##s, fin_##s)                                   \
    DEFINE_REDUCE(min_##s, T, T, SAME, loom_de_min_##s, fin_##s)

DEFINE_FLOAT(f32, float)
DEFINE_FLOAT(f64, double)

/* float16 and bfloat16 accumulate in float32 and round once. */
#define DEFINE_NARROW(s)                                                                           \
    static inline uint16_t fin_##s(float a, int nranks, int avg)                                   \
    {                                                                                              \
        return loom_de_##s##_encode(avg ? loom_de_avg_f32(a, nranks) : a);                         \
    }                                                                                              \
    DEFINE_REDUCE(sum_##s, uint16_t, float, loom_de_##s##_decode, loom_de_sum_f32, fin_##s)        \
    DEFINE_REDUCE(prod_##s, uint16_t, float, loom_de_##s##_decode, loom_de_prod_f32, fin_##s)      \
    DEFINE_REDUCE(max_##s, uint16_t, float, loom_de_##s##_decode, loom_de_max_f32, fin_##s)        \
    DEFINE_REDUCE(min_##s, uint16_t, float, loom_de_##s##_decode, loom_de_min_f32, fin_##s)

DEFINE_NARROW(f16)
DEFINE_NARROW(bf16)

#define ROW(s)                                                                                     \
    {                                                                                              \
        [loomSum] = sum_##s, [loomProd] = prod_##s, [loomMax] = max_##s, [loomMin] = min_##s,      \
        [loomAvg] = sum_##s                                                                        \
    }

static const reduce_fn_t reduce_table[loomNumTypes][loomNumOps] = {
    [loomInt8] = ROW(i8),       [loomUint8] = ROW(u8),    [loomInt32] = ROW(i32),
    [loomUint32] = ROW(u32),    [loomInt64] = ROW(i64),   [loomUint64] = ROW(u64),
    [loomFloat16] = ROW(f16),   [loomFloat32] = ROW(f32), [loomFloat64] = ROW(f64),
    [loomBfloat16] = ROW(bf16),
};

int loom_dk_host_reduce(loomDataType_t dt, loomRedOp_t op, void *dst, const void *const *srcs,
                        int nsrc, size_t n, int nranks)
{
    if (!loom_dk_dtype_ok(dt) || (int)op < 0 || op >= loomNumOps || nsrc < 1 ||
        nsrc > LOOM_DK_MAX_SRCS)
        return -1;
    if (n == 0)
        return 0;
    if (dst == NULL || srcs == NULL)
        return -1;
    for (int k = 0; k < nsrc; k++)
        if (srcs[k] == NULL)
            return -1;
    reduce_table[dt][op](dst, srcs, nsrc, n, loom_de_ranks(nranks), op == loomAvg);
    return 0;
}

/* ---- The 4-bit codec ----------------------------------------------------------- */

static int codec_dtype_ok(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomFloat16 || dt == loomBfloat16;
}

static float load_f(const void *src, loomDataType_t dt, size_t i)
{
    if (dt == loomFloat32)
        return ((const float *)src)[i];
    if (dt == loomBfloat16)
        return loom_de_bf16_decode(((const uint16_t *)src)[i]);
    return loom_de_f16_decode(((const uint16_t *)src)[i]);
}

static void store_f(void *dst, loomDataType_t dt, size_t i, float v)
{
    if (dt == loomFloat32)
        ((float *)dst)[i] = v;
    else if (dt == loomBfloat16)
        ((uint16_t *)dst)[i] = loom_de_bf16_encode(v);
    else
        ((uint16_t *)dst)[i] = loom_de_f16_encode(v);
}

int loom_dk_host_q4_encode(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                           size_t n, uint8_t *dst)
{
    if (!codec_dtype_ok(dt))
        return -1;
    if (n == 0)
        return 0;
    if (src == NULL || dst == NULL)
        return -1;
    /* Whole tiles: the blocks past n are zeros (scale 0, codes 0). */
    const size_t nblocks = loom_de_q4_bytes(n) / LOOM_DE_Q4_TILE_BYTES * LOOM_DE_Q4_BLOCKS_PER_TILE;
    for (size_t k = 0; k < nblocks; k++) {
        const size_t i0 = k * LOOM_DE_Q4_BLOCK;
        const size_t m = i0 >= n ? 0 : n - i0 < LOOM_DE_Q4_BLOCK ? n - i0 : LOOM_DE_Q4_BLOCK;
        float u[LOOM_DE_Q4_BLOCK] = {0};
        uint32_t amax = 0;
        for (size_t j = 0; j < m; j++) {
            u[j] = load_f(src, dt, i0 + j);
            if (err_in != NULL)
                u[j] = loom_de_fadd(u[j], err_in[i0 + j]);
            uint32_t a = loom_de_q4_abs_bits(u[j]);
            amax = a > amax ? a : amax;
        }
        const uint32_t sb = loom_de_q4_scale_bits(amax);
        const float scale = loom_de_bf16_decode((uint16_t)sb);
        int c[LOOM_DE_Q4_BLOCK] = {0};
        if (!loom_de_q4_special(amax)) {
            const float inv = loom_de_fdiv(1.0f, scale);
            for (int j = 0; j < LOOM_DE_Q4_BLOCK; j++)
                c[j] = loom_de_q4_code(u[j], inv);
        }
        uint8_t *codes = dst + loom_de_q4_codes_off(k);
        for (int j = 0; j < LOOM_DE_Q4_BLOCK / 2; j++)
            codes[j] = loom_de_q4_pack(c[2 * j], c[2 * j + 1]);
        uint8_t *s = dst + loom_de_q4_scale_off(k);
        s[0] = (uint8_t)(sb & 0xffu);
        s[1] = (uint8_t)(sb >> 8);
        for (size_t j = 0; err_out != NULL && j < m; j++)
            err_out[i0 + j] = loom_de_q4_residual(u[j], c[j], scale);
    }
    return 0;
}

/* D(code) of value i of an encoded stream. */
static float q4_value(const uint8_t *src, size_t i)
{
    const size_t k = i / LOOM_DE_Q4_BLOCK;
    const uint8_t *s = src + loom_de_q4_scale_off(k);
    const float scale = loom_de_bf16_decode((uint16_t)(s[0] | s[1] << 8));
    const unsigned byte = src[loom_de_q4_codes_off(k) + i % LOOM_DE_Q4_BLOCK / 2];
    return loom_de_q4_dequant(loom_de_q4_nibble(byte, (int)(i & 1)), scale);
}

int loom_dk_host_q4_decode(const uint8_t *src, size_t n, void *dst, loomDataType_t dt)
{
    if (!codec_dtype_ok(dt))
        return -1;
    if (n == 0)
        return 0;
    if (src == NULL || dst == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        store_f(dst, dt, i, q4_value(src, i));
    return 0;
}

int loom_dk_host_q4_decode_acc(const uint8_t *src, size_t n, float *acc)
{
    if (n == 0)
        return 0;
    if (src == NULL || acc == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        acc[i] = loom_de_fadd(acc[i], q4_value(src, i));
    return 0;
}

/* ---- Copy and cast ----------------------------------------------------------- */

static size_t dk_size(loomDataType_t dt)
{
    switch (dt) {
    case loomInt8:
    case loomUint8:
        return 1;
    case loomFloat16:
    case loomBfloat16:
        return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
        return 4;
    default:
        return 8;
    }
}

int loom_dk_host_cast(void *dst, loomDataType_t ddt, const void *src, loomDataType_t sdt, size_t n)
{
    if (!loom_dk_dtype_ok(ddt) || !loom_dk_dtype_ok(sdt))
        return -1;
    if (ddt != sdt && (!codec_dtype_ok(ddt) || !codec_dtype_ok(sdt)))
        return -1;
    if (n == 0)
        return 0;
    /* In place only element for element: the same address and size. */
    if (dst == src && dk_size(ddt) != dk_size(sdt))
        return -1;
    if (dst == NULL || src == NULL)
        return -1;
    if (ddt == sdt) {
        if (dst != src)
            memmove(dst, src, n * dk_size(ddt));
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        store_f(dst, ddt, i, load_f(src, sdt, i));
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * q4_impl.h - what the 4-bit codec's files share and nothing else includes:
 * the table of one instruction set's functions, the layout arithmetic of
 * q4.h, and the scalar steps of one block (scale from the block's absolute
 * maximum, element reads and writes). q4.c builds its reference on these;
 * q4_avx2.c and q4_avx512.c use the same steps for their tails and compute
 * the same formulas on vectors, so a tail gets the scalar code's bits by
 * construction.
 */
#ifndef LOOM_Q4_IMPL_H
#define LOOM_Q4_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../device/dev_elem.h"
#include "dtype.h"
#include "loom.h"
#include "q4.h"

typedef void (*loom_q4_encode_fn_t)(const void *src, loomDataType_t dt, const float *err_in,
                                    float *err_out, size_t n, uint8_t *dst);
typedef void (*loom_q4_decode_fn_t)(const uint8_t *src, size_t n, void *dst, loomDataType_t dt);
typedef void (*loom_q4_decode_acc_fn_t)(const uint8_t *src, size_t n, float *acc);

/* One instruction set's codec. Callers have checked dt (loom_q4_dtype_ok). */
struct loom_q4_ops {
    loom_q4_encode_fn_t encode;         /* n == 0 writes nothing */
    loom_q4_decode_fn_t decode;         /* dst never overlaps src */
    loom_q4_decode_acc_fn_t decode_acc; /* acc never overlaps src */
};

extern const struct loom_q4_ops loom_q4_scalar_ops;
#if defined(__x86_64__)
extern const struct loom_q4_ops loom_q4_avx2_ops;
extern const struct loom_q4_ops loom_q4_avx512_ops;
#endif

/* ---- Layout ---------------------------------------------------------------- */

/* The layout and the block rules are dev_elem.h's (one definition with the
 * device kernels); these are their names in the codec's files. */
#define Q4_BLOCKS_PER_TILE LOOM_DE_Q4_BLOCKS_PER_TILE /* 64 */
#define Q4_CODE_BYTES      LOOM_DE_Q4_CODE_BYTES      /* 1024: code bytes of a tile */

_Static_assert(LOOM_DE_Q4_BLOCK == LOOM_Q4_BLOCK && LOOM_DE_Q4_TILE == LOOM_Q4_TILE &&
                   LOOM_DE_Q4_TILE_BYTES == LOOM_Q4_TILE_BYTES &&
                   LOOM_DE_Q4_MAXCODE == LOOM_Q4_MAXCODE,
               "q4.h and dev_elem.h describe one layout");

/* Offset of the 16 code bytes of block k (counted from the stream's start). */
static inline size_t q4_codes_off(size_t k)
{
    return loom_de_q4_codes_off(k);
}
/* Offset of the two little-endian bytes of block k's bf16 scale. */
static inline size_t q4_scale_off(size_t k)
{
    return loom_de_q4_scale_off(k);
}

/* ---- The scale of a block ------------------------------------------------------ */

/* Below 2^-123 (8 x FLT_MIN) a block is all zeros; the largest bf16 scale
 * with 7 * scale finite; the scale of a non-finite block (dev_elem.h). */
#define Q4_TINY_BITS      LOOM_DE_Q4_TINY_BITS
#define Q4_SCALE_MAX_BITS LOOM_DE_Q4_SCALE_MAX_BITS
#define Q4_SCALE_NAN_BITS LOOM_DE_Q4_SCALE_NAN_BITS

/* The bf16 bits of the scale of a block whose absolute maximum has float32
 * bits amax_bits (sign cleared: any NaN is above 0x7f800000). */
static inline uint32_t q4_scale_bits(uint32_t amax_bits)
{
    return loom_de_q4_scale_bits(amax_bits);
}

/* 1 if the block's codes are all 0 whatever its values (zero/subnormal or
 * non-finite absolute maximum). */
static inline int q4_block_special(uint32_t amax_bits)
{
    return loom_de_q4_special(amax_bits);
}

/* ---- Elements -------------------------------------------------------------- */

/* Element i of src as float32; dt is one of float32, float16, bfloat16. */
static inline float q4_load(const void *src, loomDataType_t dt, size_t i)
{
    if (dt == loomFloat32)
        return ((const float *)src)[i];
    if (dt == loomBfloat16)
        return loom_bf16_decode(((const uint16_t *)src)[i]);
    return loom_f16_decode(((const uint16_t *)src)[i]);
}

static inline void q4_store(void *dst, loomDataType_t dt, size_t i, float v)
{
    if (dt == loomFloat32)
        ((float *)dst)[i] = v;
    else if (dt == loomBfloat16)
        ((uint16_t *)dst)[i] = loom_bf16_encode(v);
    else
        ((uint16_t *)dst)[i] = loom_f16_encode(v);
}

/* D(code) of value i of an encoded stream. Nibbles are read as two's
 * complement, so a foreign -8 decodes as -8 * scale on every instruction set. */
static inline float q4_value(const uint8_t *src, size_t i)
{
    size_t k = i / LOOM_Q4_BLOCK;
    const uint8_t *s = src + q4_scale_off(k);
    unsigned byte = src[q4_codes_off(k) + i % LOOM_Q4_BLOCK / 2];
    float scale = loom_bf16_decode((uint16_t)(s[0] | s[1] << 8));
    return loom_de_q4_dequant(loom_de_q4_nibble(byte, (int)(i & 1)), scale);
}

#endif

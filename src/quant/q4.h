/* SPDX-License-Identifier: Apache-2.0
 *
 * q4.h - the 4-bit block codec of Echo (docs/echo.md): symmetric signed codes
 * in [-7, 7], blocks of 32 values with one bfloat16 scale, packed in tiles
 * of 2048 values (1024 bytes of codes, then 64 scales = 128 bytes): 1152
 * bytes per tile, 4.5 bits per value.
 *
 * One block, bit for bit (every instruction set gives the scalar code's
 * bytes and values; all steps are single IEEE float32 operations):
 *   u[i]   = x[i] + e[i]            (e: the caller's fp32 residual; without
 *                                     one, u[i] = x[i], so -0 stays -0)
 *   amax   = max |u[i]| over the block
 *   scale  = bf16 of amax / 7.0f rounded toward +inf (so no code clips),
 *            at most 0x7e12 (1.140625 * 2^125, the largest with 7 * scale
 *            finite: blocks within 0.2 % of FLT_MAX clip a little rather
 *            than decode to infinity);
 *            0 when amax < 2^-123 = 8 * FLT_MIN (zero, subnormal and tiny
 *            blocks: codes 0; below that 1 / scale could overflow);
 *            the quiet NaN 0x7fc0 when amax is not finite (then every code
 *            is 0 and the block decodes to NaN: a bad input stays visible)
 *   inv    = 1.0f / scale (as float32; only used when scale is neither 0
 *            nor NaN)
 *   code   = clamp(rint(u[i] * inv), -7, 7), rounding half to even
 *   D(code)= (float)code * scale    (exact in float32)
 *   e'[i]  = u[i] - D(code)         (the residual, when asked for)
 * Packing: element 2k in the low nibble of byte k, 2k+1 in the high nibble,
 * two's complement; code -8 is never produced. Tile t holds values
 * [2048t, 2048t+2048): codes at byte 1152t, scales (little-endian bf16) at
 * byte 1152t + 1024. A tail shorter than a tile is padded with zeros
 * (codes 0, scale 0 for blocks past the end), so encoded sizes are whole
 * tiles and equal on every rank.
 *
 * The instruction set follows loom_kernels_isa() (LOOM_KERNELS), so tests
 * and benchmarks switch both with loom_kernels_use().
 */
#ifndef LOOM_Q4_H
#define LOOM_Q4_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_Q4_BLOCK      32   /* values per scale */
#define LOOM_Q4_TILE       2048 /* values per tile */
#define LOOM_Q4_TILE_BYTES 1152 /* 1024 code bytes + 64 bf16 scales */
#define LOOM_Q4_MAXCODE    7

/* Bytes that n encoded values take: whole tiles. */
static inline size_t loom_q4_bytes(size_t n)
{
    return (n + LOOM_Q4_TILE - 1) / LOOM_Q4_TILE * LOOM_Q4_TILE_BYTES;
}

/* 1 if dt is one the codec reads and writes: float32, float16, bfloat16.
 * The functions below do nothing for another dt (callers check first). */
int loom_q4_dtype_ok(loomDataType_t dt);

/* Encodes n values of src (datatype dt) plus err_in (fp32, may be NULL: 0)
 * into dst (loom_q4_bytes(n) bytes, tail padded). If err_out is not NULL it
 * receives u - D(code) per value; err_out may equal err_in (the same
 * address), no other overlap. */
void loom_q4_encode(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                    size_t n, uint8_t *dst);
/* Writes D(code) of the first n values of src to dst as datatype dt (fp32
 * exactly; fp16/bf16 rounded to nearest even, as loom_reduce_finish does). */
void loom_q4_decode(const uint8_t *src, size_t n, void *dst, loomDataType_t dt);
/* acc[i] += D(code_i) for the first n values (one float32 add each). */
void loom_q4_decode_acc(const uint8_t *src, size_t n, float *acc);

/* The same functions of one instruction set (tests compare them; benchmarks
 * time them). An isa this build or CPU lacks uses the scalar code. */
void loom_q4_encode_isa(loom_kernels_isa_t isa, const void *src, loomDataType_t dt,
                        const float *err_in, float *err_out, size_t n, uint8_t *dst);
void loom_q4_decode_isa(loom_kernels_isa_t isa, const uint8_t *src, size_t n, void *dst,
                        loomDataType_t dt);
void loom_q4_decode_acc_isa(loom_kernels_isa_t isa, const uint8_t *src, size_t n, float *acc);

#ifdef __cplusplus
}
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * dtype.h - datatype and reduction-op facts (sizes, names) and the scalar
 * conversions between float32 and the 8/16-bit float formats. Conversions
 * round to nearest, ties to even; fp8 conversions saturate to the largest
 * finite value (NaN stays NaN). The bulk kernels live in collectives/kernels.h.
 *
 * The conversions are written here as static inline integer code so that the
 * kernels can inline them into their loops; the extern loom_* functions below
 * are the same code for callers that want a plain function. No compiler
 * half-precision types or FPU rounding modes are involved, so every build on
 * every machine gives the same bits.
 */
#ifndef LOOM_DTYPE_H
#define LOOM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes per element; 0 for an invalid datatype. */
size_t loom_dtype_size(loomDataType_t dt);
/* nccl-tests names: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2.
 * "invalid" for an invalid datatype; never NULL. */
const char *loom_dtype_name(loomDataType_t dt);
/* sum prod max min avg; "invalid" for an invalid op; never NULL. */
const char *loom_redop_name(loomRedOp_t op);
int loom_dtype_valid(loomDataType_t dt);
int loom_redop_valid(loomRedOp_t op);
/* Parses a name above (also "float32", "fp16", "bf16", ...), ignoring ASCII
 * case; -1 if unknown or NULL. */
int loom_dtype_parse(const char *name);
int loom_redop_parse(const char *name);

/* Narrow -> float32 is exact. float32 -> narrow rounds to nearest, ties to
 * even, subnormals included. float16/bfloat16 overflow to infinity; fp8
 * saturates to +-448 (E4M3) or +-57344 (E5M2), infinities included. A NaN
 * gives a quiet NaN of the same sign. */
float loom_f16_to_f32(uint16_t h);
uint16_t loom_f32_to_f16(float f);
float loom_bf16_to_f32(uint16_t b);
uint16_t loom_f32_to_bf16(float f);
float loom_e4m3_to_f32(uint8_t v);
uint8_t loom_f32_to_e4m3(float f);
float loom_e5m2_to_f32(uint8_t v);
uint8_t loom_f32_to_e5m2(float f);

/* float32 bits of every fp8 encoding, indexed by the encoding (dtype.c). */
extern const uint32_t loom_e4m3_f32_bits[256];
extern const uint32_t loom_e5m2_f32_bits[256];

/* ---- Inline implementations (used by the kernels and by the functions above) ---- */

static inline float loom_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t loom_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Magnitude bits em of a normal narrow float to float32 magnitude bits. */
static inline uint32_t loom_narrow_normal_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
{
    return (em << (23 - mbits)) + ((127u - ebias) << 23);
}

/* float32 magnitude bits ax that fall in the normal range of a narrow format
 * to its magnitude bits, rounding to nearest even. A carry out of the
 * mantissa moves into the exponent, which is exactly the next value up. */
static inline uint32_t loom_f32_bits_to_narrow_normal(uint32_t ax, unsigned mbits, unsigned ebias)
{
    unsigned drop = 23 - mbits;
    uint32_t r = ax - ((127u - ebias) << 23);
    return (r + ((1u << (drop - 1)) - 1) + ((r >> drop) & 1)) >> drop;
}

/* Magnitude bits em of a finite narrow float (mbits mantissa bits, exponent
 * bias ebias) to float32 magnitude bits. A subnormal is normalised in up to
 * four fixed-distance conditional shifts rather than a count-leading-zeros
 * loop, so loops over arrays stay branch-free and vectorise. */
static inline uint32_t loom_narrow_mag_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
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

    uint32_t normal = loom_narrow_normal_to_f32_bits(em, mbits, ebias);
    uint32_t sub = ((128u - ebias - s) << 23) | ((m & mask) << (23 - mbits));
    sub = (em & mask) ? sub : 0;
    return (em >> mbits) ? normal : sub;
}

/* float32 magnitude bits ax (not NaN, below the format's overflow threshold)
 * to narrow magnitude bits, rounding to nearest even; a subnormal result that
 * rounds up to the smallest normal gets its encoding through the same carry. */
static inline uint32_t loom_f32_bits_to_narrow_mag(uint32_t ax, unsigned mbits, unsigned ebias)
{
    if (ax >= ((128u - ebias) << 23))
        return loom_f32_bits_to_narrow_normal(ax, mbits, ebias);
    /* Subnormal in the narrow format: the shift is at least 24 - mbits; past 25
     * every float32 (its own subnormals included) rounds to zero, and capping
     * it keeps the shift defined. */
    uint32_t shift = 151u - ebias - mbits - (ax >> 23);
    shift = shift > 25 ? 25 : shift;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    return (mant + (1u << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift;
}

static inline float loom_f16_decode(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t mag = loom_narrow_mag_to_f32_bits(em, 10, 15);
    /* Exponent 31: infinity or NaN, payload kept. */
    mag = em >= 0x7c00u ? (em << 13) | 0x7f800000u : mag;
    return loom_f32_from_bits(sign | mag);
}

static inline uint16_t loom_f16_encode(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u)
        r = 0x7e00u | ((ax >> 13) & 0x3ffu);
    else if (ax >= 0x477ff000u) /* 65520 and up: halfway past 65504 rounds to even = inf */
        r = 0x7c00u;
    else
        r = loom_f32_bits_to_narrow_mag(ax, 10, 15);
    return (uint16_t)(sign | r);
}

static inline float loom_bf16_decode(uint16_t b)
{
    return loom_f32_from_bits((uint32_t)b << 16);
}

static inline uint16_t loom_bf16_encode(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    /* Same exponent range as float32: rounding the low half suffices, and a
     * carry into the exponent gives the next value (or infinity). The sign bit
     * cannot be reached because NaNs are handled apart. */
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    /* Compared as int32_t (the value is below 2^31): SSE2 has only signed
     * lane compares, so this keeps bulk loops cheap. */
    return (uint16_t)((int32_t)(x & 0x7fffffffu) > 0x7f800000 ? nan : r);
}

/* fp8 decodes by table: for an 8-bit source a lookup is faster than any
 * SSE2 bit manipulation, and 2 x 1 KiB stay in L1. */
static inline float loom_e4m3_decode(uint8_t v)
{
    return loom_f32_from_bits(loom_e4m3_f32_bits[v]);
}

static inline uint8_t loom_e4m3_encode(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u)
        r = 0x7fu;
    else if (ax > 0x43e00000u) /* above 448, infinity included: saturate */
        r = 0x7eu;
    else
        r = loom_f32_bits_to_narrow_mag(ax, 3, 7);
    return (uint8_t)(sign | r);
}

static inline float loom_e5m2_decode(uint8_t v)
{
    return loom_f32_from_bits(loom_e5m2_f32_bits[v]);
}

static inline uint8_t loom_e5m2_encode(float f)
{
    uint32_t x = loom_f32_to_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u)
        r = 0x7eu;
    else if (ax > 0x47600000u) /* above 57344, infinity included: saturate */
        r = 0x7bu;
    else
        r = loom_f32_bits_to_narrow_mag(ax, 2, 15);
    return (uint8_t)(sign | r);
}

#ifdef __cplusplus
}
#endif

#endif

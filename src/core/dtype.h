/* SPDX-License-Identifier: Apache-2.0
 *
 * dtype.h - datatype and reduction-op facts (sizes, names) and the scalar
 * conversions between float32 and the 8/16-bit float formats. Conversions
 * round to nearest, ties to even; fp8 conversions saturate to the largest
 * finite value (NaN stays NaN). The bulk kernels live in collectives/kernels.h.
 *
 * The conversions are static inline integer code so that the kernels can
 * inline them into their loops (float16/bfloat16 from dev_elem.h, which the
 * device kernels share); the extern loom_* functions below are the same code
 * for callers that want a plain function. No compiler half-precision types
 * or FPU rounding modes are involved, so every build on every machine gives
 * the same bits.
 */
#ifndef LOOM_DTYPE_H
#define LOOM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../device/dev_elem.h"
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

/* The float16/bfloat16 conversions and the rounding helpers are the device
 * path's element functions (dev_elem.h, compiled for the CPU and the GPU
 * alike), so the CPU kernels, the codec and the device kernels share one
 * definition; these names are theirs for the CPU code. */
static inline float loom_f32_from_bits(uint32_t u)
{
    return loom_de_f32_from_bits(u);
}

static inline uint32_t loom_f32_to_bits(float f)
{
    return loom_de_f32_bits(f);
}

static inline uint32_t loom_narrow_normal_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
{
    return loom_de_narrow_normal_to_f32_bits(em, mbits, ebias);
}

static inline uint32_t loom_f32_bits_to_narrow_normal(uint32_t ax, unsigned mbits, unsigned ebias)
{
    return loom_de_f32_bits_to_narrow_normal(ax, mbits, ebias);
}

static inline uint32_t loom_narrow_mag_to_f32_bits(uint32_t em, unsigned mbits, unsigned ebias)
{
    return loom_de_narrow_mag_to_f32_bits(em, mbits, ebias);
}

static inline uint32_t loom_f32_bits_to_narrow_mag(uint32_t ax, unsigned mbits, unsigned ebias)
{
    return loom_de_f32_bits_to_narrow_mag(ax, mbits, ebias);
}

static inline float loom_f16_decode(uint16_t h)
{
    return loom_de_f16_decode(h);
}

static inline uint16_t loom_f16_encode(float f)
{
    return loom_de_f16_encode(f);
}

static inline float loom_bf16_decode(uint16_t b)
{
    return loom_de_bf16_decode(b);
}

static inline uint16_t loom_bf16_encode(float f)
{
    return loom_de_bf16_encode(f);
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

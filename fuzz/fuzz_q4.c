/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_q4.c - libFuzzer harness for Echo's 4-bit codec (src/quant/q4.c and its
 * AVX2/AVX-512 variants) against q4.h's description, recomputed here without
 * the codec's code. Decoding arbitrary wire bytes (codes -8..7, any bf16 scale,
 * NaN and infinity included) gives exactly (float)code * scale for every value
 * (as fp32, rounded to fp16/bf16 with dtype.h's conversions, and added to an
 * accumulator), whatever the instruction set. Encoding arbitrary values gives
 * the same bytes on every instruction set, the documented scale (bf16 of amax /
 * 7 rounded up, capped; 0 for tiny blocks; NaN for non-finite ones), codes that
 * decode within half a scale of the input (what does not clip), and the exact
 * residual. Built by fuzz/run.sh with q4*.c, the kernels (for the instruction
 * set) and dtype.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "fuzz_check.h"
#include "q4.h"

#define MAX_VALUES 4200 /* two tiles and part of a third */

static const loom_kernels_isa_t isas[] = {LOOM_KERNELS_SCALAR, LOOM_KERNELS_AVX2,
                                          LOOM_KERNELS_AVX512};
#define NISA (sizeof(isas) / sizeof(isas[0]))

static float f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* Equal bits, or both NaN. */
static int same(float a, float b)
{
    return bits(a) == bits(b) || (isnan(a) && isnan(b));
}

/* Value i of a stream as q4.h lays it out: the nibble (two's complement) and the bf16 scale. */
static float wire_value(const uint8_t *w, size_t i, float *scale_p)
{
    const size_t tile = i / LOOM_Q4_TILE, j = i % LOOM_Q4_TILE;
    const uint8_t byte = w[tile * LOOM_Q4_TILE_BYTES + j / 2];
    const int nib = (j % 2) ? byte >> 4 : byte & 15;
    const size_t s = tile * LOOM_Q4_TILE_BYTES + 1024 + j / LOOM_Q4_BLOCK * 2;
    const float scale = f32((uint32_t)(w[s] | (w[s + 1] << 8)) << 16);
    if (scale_p != NULL)
        *scale_p = scale;
    return (float)(nib >= 8 ? nib - 16 : nib) * scale;
}

/* Arbitrary bytes as a stream of n values: every decoder gives (float)code * scale. */
static void fuzz_decode(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    size_t n = ((size_t)data[0] << 8 | data[1]) % (MAX_VALUES + 1);
    const size_t bytes = loom_q4_bytes(n);
    uint8_t *w = calloc(bytes ? bytes : 1, 1); /* exact size: a read past it is an ASan error */
    float *out = malloc(sizeof(float) * (n + 1)), *acc = malloc(sizeof(float) * (n + 1));
    uint16_t *half = malloc(sizeof(uint16_t) * (n + 1));
    if (w == NULL || out == NULL || acc == NULL || half == NULL)
        goto out;
    memcpy(w, data + 2, size - 2 < bytes ? size - 2 : bytes);
    for (size_t k = 0; k < NISA; k++) {
        loom_q4_decode_isa(isas[k], w, n, out, loomFloat32);
        for (size_t i = 0; i < n; i++)
            REQUIRE(same(out[i], wire_value(w, i, NULL)));
        loom_q4_decode_isa(isas[k], w, n, half, loomBfloat16);
        for (size_t i = 0; i < n; i++)
            REQUIRE(half[i] == loom_f32_to_bf16(wire_value(w, i, NULL)) ||
                    (isnan(loom_bf16_to_f32(half[i])) && isnan(wire_value(w, i, NULL))));
        loom_q4_decode_isa(isas[k], w, n, half, loomFloat16);
        for (size_t i = 0; i < n; i++)
            REQUIRE(half[i] == loom_f32_to_f16(wire_value(w, i, NULL)) ||
                    (isnan(loom_f16_to_f32(half[i])) && isnan(wire_value(w, i, NULL))));
        for (size_t i = 0; i < n; i++)
            acc[i] = (float)(i % 7) - 3.0f;
        loom_q4_decode_acc_isa(isas[k], w, n, acc);
        for (size_t i = 0; i < n; i++)
            REQUIRE(same(acc[i], ((float)(i % 7) - 3.0f) + wire_value(w, i, NULL)));
    }
out:
    free(w);
    free(out);
    free(acc);
    free(half);
}

/* q4.h's scale of a block from its absolute maximum, written from the description. */
static uint32_t doc_scale_bits(float amax)
{
    if (!isfinite(amax))
        return 0x7fc0;
    if (amax < 0x1p-123f)
        return 0;
    const uint32_t q = bits(amax / 7.0f);
    const uint32_t up = (q >> 16) + ((q & 0xffff) != 0); /* toward +inf */
    return up < 0x7e12 ? up : 0x7e12;
}

/* Arbitrary values (fp32, bf16 or fp16, with or without a residual) encoded and decoded back. */
static void fuzz_round_trip(const uint8_t *data, size_t size)
{
    if (size < 1)
        return;
    const uint8_t mode = data[0];
    const loomDataType_t dt = mode % 3 == 0   ? loomFloat32
                              : mode % 3 == 1 ? loomBfloat16
                                              : loomFloat16;
    const size_t es = dt == loomFloat32 ? 4 : 2;
    const int with_err = (mode >> 2) & 1;
    data++;
    size--;
    size_t n = size / (es + (with_err ? 4 : 0));
    if (n > MAX_VALUES)
        n = MAX_VALUES;
    const size_t bytes = loom_q4_bytes(n);
    void *src = malloc(n * es + 1);
    float *x = malloc(sizeof(float) * (n + 1)), *e = malloc(sizeof(float) * (n + 1));
    float *e_out = malloc(sizeof(float) * (n + 1)), *dec = malloc(sizeof(float) * (n + 1));
    uint8_t *w = malloc(bytes + 1), *w2 = malloc(bytes + 1);
    if (src == NULL || x == NULL || e == NULL || e_out == NULL || dec == NULL || w == NULL ||
        w2 == NULL)
        goto out;
    memcpy(src, data, n * es);
    for (size_t i = 0; i < n; i++) {
        uint32_t b = 0;
        memcpy(&b, (const uint8_t *)src + i * es, es);
        x[i] = dt == loomFloat32    ? f32(b)
               : dt == loomBfloat16 ? loom_bf16_to_f32((uint16_t)b)
                                    : loom_f16_to_f32((uint16_t)b);
        e[i] = 0;
        if (with_err)
            memcpy(&e[i], data + n * es + 4 * i, 4);
    }
    loom_q4_encode_isa(LOOM_KERNELS_SCALAR, src, dt, with_err ? e : NULL, e_out, n, w);
    for (size_t k = 1; k < NISA; k++) { /* every instruction set writes the same bytes */
        float *e2 = malloc(sizeof(float) * (n + 1));
        if (e2 == NULL)
            goto out;
        loom_q4_encode_isa(isas[k], src, dt, with_err ? e : NULL, e2, n, w2);
        REQUIRE(memcmp(w, w2, bytes) == 0);
        for (size_t i = 0; i < n; i++)
            REQUIRE(bits(e2[i]) == bits(e_out[i]));
        free(e2);
    }
    loom_q4_decode(w, n, dec, loomFloat32);
    for (size_t b0 = 0; b0 < n; b0 += LOOM_Q4_BLOCK) {
        const size_t m = n - b0 < LOOM_Q4_BLOCK ? n - b0 : LOOM_Q4_BLOCK;
        float amax = 0;
        int finite = 1;
        for (size_t i = b0; i < b0 + m; i++) {
            const float u = with_err ? x[i] + e[i] : x[i]; /* without a residual -0 stays -0 */
            finite &= isfinite(u) != 0;
            amax = fabsf(u) > amax ? fabsf(u) : amax;
        }
        float scale;
        wire_value(w, b0, &scale);
        REQUIRE(bits(scale) >> 16 == doc_scale_bits(finite ? amax : INFINITY));
        for (size_t i = b0; i < b0 + m; i++) {
            const float u = with_err ? x[i] + e[i] : x[i];
            const size_t j = i % LOOM_Q4_TILE;
            const uint8_t byte = w[i / LOOM_Q4_TILE * LOOM_Q4_TILE_BYTES + j / 2];
            REQUIRE(((j % 2) ? byte >> 4 : byte & 15) != 8); /* code -8 is never produced */
            REQUIRE(same(dec[i], wire_value(w, i, NULL)));
            if (!finite) {
                REQUIRE(isnan(dec[i]));
                continue;
            }
            REQUIRE(bits(e_out[i]) == bits(u - dec[i])); /* the residual, exactly */
            if (7.0f * scale >= amax) /* nothing clips: within half a step (and rounding) */
                REQUIRE(fabsf(u - dec[i]) <= scale * (0.5f + 0x1p-20f));
        }
    }
out:
    free(src);
    free(x);
    free(e);
    free(e_out);
    free(dec);
    free(w);
    free(w2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        fuzz_decode(data + 1, size - 1);
    else
        fuzz_round_trip(data + 1, size - 1);
    return 0;
}

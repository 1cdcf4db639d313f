/* SPDX-License-Identifier: Apache-2.0
 *
 * q4_simd.h - the parts of the vector codecs that do not depend on the
 * register width, written once for q4_avx2.c and q4_avx512.c: the encode
 * driver (whole groups software-pipelined, the cut-off group through a
 * zero-padded buffer, the padding to a whole tile), its specializations per
 * source format and residual use, and the decode entry points. An including
 * file defines first:
 *   KFN, KINL               storage class + target attributes
 *   GROUP, GROUP_BLOCKS     values and blocks per encode group
 *   SRC_F32, SRC_BF16, SRC_F16   the source formats
 *   struct group_scale, group_scales_of(), group_codes_of()   pass 1 and 2
 *   decode_loop()           whole blocks of decode (acc = 1: add into float32)
 *   Q4_SIMD_OPS             the name of the ops table to define
 * Nothing else includes it.
 */
#ifndef Q4_SIMD_OPS
#error "q4_simd.h is included by the per-instruction-set codec files only"
#endif

/* Element offsets of group g inside the stream: codes and scales. */
static inline uint8_t *group_codes(uint8_t *dst, size_t g)
{
    return dst + q4_codes_off(g * GROUP_BLOCKS);
}
static inline uint8_t *group_scales(uint8_t *dst, size_t g)
{
    return dst + q4_scale_off(g * GROUP_BLOCKS);
}

/* The whole groups, software-pipelined: pass 1 of group g + 1 (ending in two
 * dependent divisions, about 40 cycles of latency) is issued before pass 2
 * of group g, so the out-of-order core overlaps that latency with pass 2's
 * independent work instead of stalling on it once per group. */
KINL void encode_loop(const void *src, int fmt, int has_ein, const float *ein, int has_eout,
                      float *eout, size_t n, uint8_t *dst)
{
    const size_t esz = fmt == SRC_F32 ? 4 : 2;
    const size_t nfull = n / GROUP;
    struct group_scale gs[2];
    if (nfull == 0)
        return;
    group_scales_of(src, fmt, has_ein, ein, group_scales(dst, 0), &gs[0]);
    for (size_t g = 0; g < nfull; g++) {
        const size_t i = g * GROUP, next = i + GROUP;
        if (g + 1 < nfull)
            group_scales_of((const char *)src + next * esz, fmt, has_ein,
                            has_ein ? ein + next : NULL, group_scales(dst, g + 1),
                            &gs[(g + 1) & 1]);
        group_codes_of((const char *)src + i * esz, fmt, has_ein, has_ein ? ein + i : NULL,
                       has_eout, has_eout ? eout + i : NULL, group_codes(dst, g), &gs[g & 1]);
    }
}

/* The cut-off group: u in a zero-padded buffer, encoded as float32. */
KFN void encode_tail(const void *src, loomDataType_t dt, const float *ein, float *eout, size_t i0,
                     size_t n, uint8_t *codes, uint8_t *scales)
{
    float u[GROUP], e[GROUP];
    const size_t m = n - i0;
    for (size_t j = 0; j < GROUP; j++) {
        if (j >= m)
            u[j] = 0.0f;
        else if (ein != NULL)
            u[j] = q4_load(src, dt, i0 + j) + ein[i0 + j];
        else
            u[j] = q4_load(src, dt, i0 + j);
    }
    struct group_scale gs;
    group_scales_of(u, SRC_F32, 0, NULL, scales, &gs);
    if (eout != NULL) {
        group_codes_of(u, SRC_F32, 0, NULL, 1, e, codes, &gs);
        memcpy(eout + i0, e, m * sizeof(float));
    } else {
        group_codes_of(u, SRC_F32, 0, NULL, 0, NULL, codes, &gs);
    }
}

#define ENCODE_VARIANT(name, fmt, has_ein, has_eout)                                               \
    KFN void name(const void *src, const float *ein, float *eout, size_t n, uint8_t *dst)          \
    {                                                                                              \
        encode_loop(src, fmt, has_ein, ein, has_eout, eout, n, dst);                               \
    }
#define ENCODE_VARIANTS(sfx, fmt)                                                                  \
    ENCODE_VARIANT(enc_##sfx##_00, fmt, 0, 0)                                                      \
    ENCODE_VARIANT(enc_##sfx##_10, fmt, 1, 0)                                                      \
    ENCODE_VARIANT(enc_##sfx##_01, fmt, 0, 1)                                                      \
    ENCODE_VARIANT(enc_##sfx##_11, fmt, 1, 1)
ENCODE_VARIANTS(f32, SRC_F32)
ENCODE_VARIANTS(bf16, SRC_BF16)
ENCODE_VARIANTS(f16, SRC_F16)

typedef void (*enc_fn_t)(const void *, const float *, float *, size_t, uint8_t *);
static const enc_fn_t enc_fns[3][4] = {
    {enc_f32_00, enc_f32_10, enc_f32_01, enc_f32_11},
    {enc_bf16_00, enc_bf16_10, enc_bf16_01, enc_bf16_11},
    {enc_f16_00, enc_f16_10, enc_f16_01, enc_f16_11},
};

static int fmt_of(loomDataType_t dt)
{
    return dt == loomFloat32 ? SRC_F32 : dt == loomBfloat16 ? SRC_BF16 : SRC_F16;
}

static void encode(const void *src, loomDataType_t dt, const float *err_in, float *err_out,
                   size_t n, uint8_t *dst)
{
    enc_fns[fmt_of(dt)][(err_in != NULL) | (err_out != NULL) << 1](src, err_in, err_out, n, dst);
    size_t g = n / GROUP;
    if (n % GROUP != 0) {
        encode_tail(src, dt, err_in, err_out, g * GROUP, n, group_codes(dst, g),
                    group_scales(dst, g));
        g++;
    }
    /* Groups past the end inside the last tile: codes 0, scales 0. */
    for (; g % (LOOM_Q4_TILE / GROUP) != 0; g++) {
        memset(group_codes(dst, g), 0, GROUP / 2);
        memset(group_scales(dst, g), 0, GROUP_BLOCKS * 2);
    }
}

KFN void dec_f32(const uint8_t *src, size_t n, void *dst)
{
    decode_loop(src, n, dst, SRC_F32, 0);
}
KFN void dec_bf16(const uint8_t *src, size_t n, void *dst)
{
    decode_loop(src, n, dst, SRC_BF16, 0);
}
KFN void dec_f16(const uint8_t *src, size_t n, void *dst)
{
    decode_loop(src, n, dst, SRC_F16, 0);
}
KFN void dec_acc(const uint8_t *src, size_t n, void *dst)
{
    decode_loop(src, n, dst, SRC_F32, 1);
}

static void decode(const uint8_t *src, size_t n, void *dst, loomDataType_t dt)
{
    int fmt = fmt_of(dt);
    (fmt == SRC_F32 ? dec_f32 : fmt == SRC_BF16 ? dec_bf16 : dec_f16)(src, n, dst);
    for (size_t i = n / LOOM_Q4_BLOCK * LOOM_Q4_BLOCK; i < n; i++)
        q4_store(dst, dt, i, q4_value(src, i));
}

static void decode_acc(const uint8_t *src, size_t n, float *acc)
{
    dec_acc(src, n, acc);
    for (size_t i = n / LOOM_Q4_BLOCK * LOOM_Q4_BLOCK; i < n; i++)
        acc[i] += q4_value(src, i);
}

const struct loom_q4_ops Q4_SIMD_OPS = {
    .encode = encode,
    .decode = decode,
    .decode_acc = decode_acc,
};

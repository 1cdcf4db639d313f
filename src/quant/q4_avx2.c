/* SPDX-License-Identifier: Apache-2.0
 *
 * q4_avx2.c - the 4-bit codec of q4.h on AVX2 + F16C, giving q4.c's
 * reference bytes and values. The shape is q4_avx512.c's at half the width:
 * encode groups of 8 blocks (256 values) with a transposing max-reduction so
 * the scale step's divisions run once per group, a second pass that rounds
 * (ROUNDPS with round-to-nearest-even, independent of MXCSR) and packs, pass
 * 1 of the next group issued before pass 2 of the current one, and a
 * zero-padded float32 buffer for the group that n cuts off. No FMA in the
 * target, so no contraction either. Empty on other architectures.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "q4_impl.h"

#define KFN             static __attribute__((target("avx2,f16c")))
#define KINL            static inline __attribute__((target("avx2,f16c"), always_inline))
#define SIMD_BF16_WIDTH 256
#include "simd_bf16.h"

#define GROUP        256 /* values per encode group: 8 blocks */
#define GROUP_BLOCKS 8
#define RNE          (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

enum { SRC_F32, SRC_BF16, SRC_F16 };

// ---- Conversions --------------------------------------------------------------

/* Eight values widened to float32 (the F16C note of q4_avx512.c applies). */
KINL __m256 load8(const void *src, int fmt, size_t i)
{
    if (fmt == SRC_F32)
        return _mm256_loadu_ps((const float *)src + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + i));
    if (fmt == SRC_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// ---- Encode -------------------------------------------------------------------

KINL __m256 load_u(const void *src, int fmt, int has_ein, const float *ein, size_t i)
{
    __m256 x = load8(src, fmt, i);
    return has_ein ? _mm256_add_ps(x, _mm256_loadu_ps(ein + i)) : x;
}

/* Lane b of the result = the maximum of m[b]'s 8 lanes (unsigned): halves,
 * then pairs, then single lanes; the last level leaves block 2k + j in lane
 * 4j + k, which the final permutation undoes. */
KINL __m256i reduce8_max(const __m256i m[GROUP_BLOCKS])
{
    __m256i r[4], s[2];
    for (int k = 0; k < 4; k++)
        r[k] = _mm256_max_epu32(_mm256_permute2x128_si256(m[2 * k], m[2 * k + 1], 0x20),
                                _mm256_permute2x128_si256(m[2 * k], m[2 * k + 1], 0x31));
    for (int k = 0; k < 2; k++)
        s[k] = _mm256_max_epu32(_mm256_unpacklo_epi64(r[2 * k], r[2 * k + 1]),
                                _mm256_unpackhi_epi64(r[2 * k], r[2 * k + 1]));
    __m256 s0 = _mm256_castsi256_ps(s[0]), s1 = _mm256_castsi256_ps(s[1]);
    __m256i t =
        _mm256_max_epu32(_mm256_castps_si256(_mm256_shuffle_ps(s0, s1, _MM_SHUFFLE(2, 0, 2, 0))),
                         _mm256_castps_si256(_mm256_shuffle_ps(s0, s1, _MM_SHUFFLE(3, 1, 3, 1))));
    return _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* rint(u * inv); q4.h's clamp cannot bind (see code16 in q4_avx512.c). */
KINL __m256i code8(__m256 u, __m256 inv)
{
    return _mm256_cvttps_epi32(_mm256_round_ps(_mm256_mul_ps(u, inv), RNE));
}

/* A block's 32 codes (c[q] holds elements 8q..8q+7) to 16 bytes. The
 * saturating packs interleave 128-bit lanes, leaving groups of four codes in
 * the order 0,2,4,6,1,3,5,7, which one permutation puts back; then each
 * 16-bit pair (2k, 2k+1) folds into its low byte. */
KINL __m128i pack_codes(const __m256i c[4])
{
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    __m256i w = _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
    w = _mm256_and_si256(_mm256_or_si256(w, _mm256_srli_epi16(w, 4)), _mm256_set1_epi16(0xff));
    return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

/* What pass 1 leaves for pass 2 of a group (in memory: broadcasts from
 * memory are loads, not shuffles). */
struct group_scale {
    float inv[GROUP_BLOCKS];   /* 1 / scale; 0 for special blocks */
    float scale[GROUP_BLOCKS]; /* the bf16 scale as float32 */
    unsigned nonfinite;        /* bit b: block b holds a NaN or infinity */
};

/* Pass 1 of a group (GROUP values from element 0): the 8 blocks' scales, as
 * bf16 at scales (16 bytes) and into gs. */
KINL void group_scales_of(const void *src, int fmt, int has_ein, const float *ein, uint8_t *scales,
                          struct group_scale *gs)
{
    __m256i m[GROUP_BLOCKS];
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        __m256i a[4];
        for (int q = 0; q < 4; q++)
            a[q] = _mm256_and_si256(
                _mm256_castps_si256(load_u(src, fmt, has_ein, ein, (size_t)(32 * b + 8 * q))),
                abs_mask);
        m[b] = _mm256_max_epu32(_mm256_max_epu32(a[0], a[1]), _mm256_max_epu32(a[2], a[3]));
    }
    const __m256i amax = reduce8_max(m);

    /* q4_scale_bits on 8 lanes; sign bits are clear, so signed compares do. */
    const __m256i nonfinite = _mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7f7fffff));
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(Q4_TINY_BITS), amax);
    const __m256i special = _mm256_or_si256(nonfinite, tiny);
    __m256 q = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(7.0f));
    __m256i sb =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(q), _mm256_set1_epi32(0xffff)), 16);
    sb = _mm256_min_epu32(sb, _mm256_set1_epi32(Q4_SCALE_MAX_BITS));
    sb = _mm256_andnot_si256(tiny, sb);
    sb = _mm256_blendv_epi8(sb, _mm256_set1_epi32(Q4_SCALE_NAN_BITS), nonfinite);
    _mm_storeu_si128((__m128i *)scales,
                     _mm_packus_epi32(_mm256_castsi256_si128(sb), _mm256_extracti128_si256(sb, 1)));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(sb, 16));
    _mm256_storeu_ps(gs->inv, _mm256_andnot_ps(_mm256_castsi256_ps(special),
                                               _mm256_div_ps(_mm256_set1_ps(1.0f), scale)));
    _mm256_storeu_ps(gs->scale, scale);
    gs->nonfinite = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(nonfinite));
}

/* Pass 2 of a group: codes (128 bytes) and residuals; eout may equal ein. */
KINL void group_codes_of(const void *src, int fmt, int has_ein, const float *ein, int has_eout,
                         float *eout, uint8_t *codes, const struct group_scale *gs)
{
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        const __m256 vinv = _mm256_set1_ps(gs->inv[b]);
        __m256 u[4];
        __m256i c[4];
        for (int q = 0; q < 4; q++) {
            u[q] = load_u(src, fmt, has_ein, ein, (size_t)(32 * b + 8 * q));
            c[q] = code8(u[q], vinv);
        }
        _mm_storeu_si128((__m128i *)(codes + 16 * b), pack_codes(c));
        if (has_eout) {
            const __m256 vs = _mm256_set1_ps(gs->scale[b]);
            for (int q = 0; q < 4; q++)
                _mm256_storeu_ps(eout + 32 * b + 8 * q,
                                 _mm256_sub_ps(u[q], _mm256_mul_ps(_mm256_cvtepi32_ps(c[q]), vs)));
        }
    }
    /* Non-finite blocks: codes 0 (rare, so a branch). */
    for (unsigned nf = gs->nonfinite; nf != 0; nf &= nf - 1)
        memset(codes + 16 * __builtin_ctz(nf), 0, 16);
}

// ---- Decode -------------------------------------------------------------------

/* A block's nibbles as byte indices 0..15 in element order: lane 0 holds
 * elements 0..15, lane 1 elements 16..31. */
KINL __m256i block_nibbles(const uint8_t *codes)
{
    const __m128i low = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadu_si128((const __m128i *)codes);
    __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

/* float32 values: the nibbles sign-extended ((v ^ 8) - 8), widened eight at
 * a time and scaled. */
KINL void decode_block_f32(const uint8_t *codes, __m256 scale, __m256 d[4])
{
    const __m256i eight = _mm256_set1_epi8(8);
    __m256i e = block_nibbles(codes);
    e = _mm256_sub_epi8(_mm256_xor_si256(e, eight), eight);
    __m128i e0 = _mm256_castsi256_si128(e), e1 = _mm256_extracti128_si256(e, 1);
    __m128i q[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
    for (int j = 0; j < 4; j++)
        d[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q[j])), scale);
}

KINL float block_scale(const uint8_t *src, size_t k)
{
    uint16_t s;
    memcpy(&s, src + q4_scale_off(k), 2);
    return loom_bf16_decode(s);
}

/* 16-bit values by table: a block has only 16 possible results, D(code) for
 * the 16 nibbles (nibble v holds code (v ^ 8) - 8), each computed and
 * rounded as any value would be. Their low and high bytes form two VPSHUFB
 * tables that the nibbles index directly. */
KINL void decode_block_u16(const uint8_t *codes, float scale, int fmt, uint16_t *y)
{
    const __m256 c0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 c1 = _mm256_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1);
    const __m256 s = _mm256_set1_ps(scale);
    __m256 t0 = _mm256_mul_ps(c0, s), t1 = _mm256_mul_ps(c1, s);
    /* F16C with immediate 0: round to nearest even whatever MXCSR says. */
    __m128i h0 = fmt == SRC_F16 ? _mm256_cvtps_ph(t0, 0) : bf16_encode8(t0);
    __m128i h1 = fmt == SRC_F16 ? _mm256_cvtps_ph(t1, 0) : bf16_encode8(t1);
    const __m128i split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    h0 = _mm_shuffle_epi8(h0, split);
    h1 = _mm_shuffle_epi8(h1, split);
    __m256i tlo = _mm256_broadcastsi128_si256(_mm_unpacklo_epi64(h0, h1));
    __m256i thi = _mm256_broadcastsi128_si256(_mm_unpackhi_epi64(h0, h1));

    __m256i e = block_nibbles(codes);
    __m256i lo = _mm256_shuffle_epi8(tlo, e), hi = _mm256_shuffle_epi8(thi, e);
    /* Per lane: elements 0..7 (16..23) and 8..15 (24..31). */
    __m256i w0 = _mm256_unpacklo_epi8(lo, hi), w1 = _mm256_unpackhi_epi8(lo, hi);
    _mm256_storeu_si256((__m256i *)y, _mm256_permute2x128_si256(w0, w1, 0x20));
    _mm256_storeu_si256((__m256i *)(y + 16), _mm256_permute2x128_si256(w0, w1, 0x31));
}

KINL void decode_loop(const uint8_t *src, size_t n, void *dst, int fmt, int acc)
{
    const size_t nblocks = n / LOOM_Q4_BLOCK;
    for (size_t k = 0; k < nblocks; k++) {
        const size_t i = k * LOOM_Q4_BLOCK;
        const uint8_t *codes = src + q4_codes_off(k);
        if (!acc && fmt != SRC_F32) {
            decode_block_u16(codes, block_scale(src, k), fmt, (uint16_t *)dst + i);
            continue;
        }
        __m256 d[4];
        decode_block_f32(codes, _mm256_set1_ps(block_scale(src, k)), d);
        for (int q = 0; q < 4; q++) {
            float *y = (float *)dst + i + 8 * q;
            _mm256_storeu_ps(y, acc ? _mm256_add_ps(_mm256_loadu_ps(y), d[q]) : d[q]);
        }
    }
}

#define Q4_SIMD_OPS loom_q4_avx2_ops
#include "q4_simd.h"

#endif

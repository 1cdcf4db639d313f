/* SPDX-License-Identifier: Apache-2.0
 *
 * q4_avx512.c - the 4-bit codec of q4.h on AVX-512 F/BW/VL/DQ (+ F16C),
 * giving q4.c's reference bytes and values. Like the reduction kernels,
 * every function carries a target attribute instead of the file being built
 * with -mavx512f; q4.c calls in only after loom_kernels_isa_available().
 * Empty on other architectures.
 *
 * Encode works on groups of 16 blocks (512 values, a quarter tile): pass 1
 * folds each block's |u| into one vector (integer max of the sign-cleared
 * bits, which orders floats by magnitude and puts any NaN or infinity on
 * top), then a transposing reduction leaves block b's maximum in lane b, so
 * the divisions of the scale step run once for 16 blocks. Pass 2 reads the
 * group again from L1 (recomputing u = x + e is cheaper than keeping 32
 * vectors live), multiplies by the broadcast inverse, rounds with an
 * embedded round-to-nearest-even (independent of MXCSR) and packs pairs of
 * codes into bytes. Pass 1 of the next group is issued before pass 2 of the
 * current one. A group that n cuts off is copied, as u, into a zero-padded
 * float32 buffer first: zeros change neither a block's maximum nor its other
 * codes, and they are the padding q4.h asks for. Decode looks values up in a
 * per-block table of the 16 possible results.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "q4_impl.h"

#define KFN static __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define KINL                                                                                       \
    static inline                                                                                  \
        __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"), always_inline))
#define SIMD_BF16_WIDTH 512
#include "simd_bf16.h"

#define GROUP        512 /* values per encode group: 16 blocks */
#define GROUP_BLOCKS 16
#define RNE          (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Source formats as compile-time constants of the inlined loops. */
enum { SRC_F32, SRC_BF16, SRC_F16 };

// ---- Conversions --------------------------------------------------------------

/* Sixteen values from element i of src, widened to float32. The F16C
 * widening quiets a signalling NaN that loom_f16_decode keeps; a NaN only
 * matters to the codec as "the block is non-finite" and through u - D, which
 * quiets it anyway, so the bits come out the same. */
KINL __m512 load16(const void *src, int fmt, size_t i)
{
    if (fmt == SRC_F32)
        return _mm512_loadu_ps((const float *)src + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i));
    if (fmt == SRC_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// ---- Encode -------------------------------------------------------------------

KINL __m512 load_u(const void *src, int fmt, int has_ein, const float *ein, size_t i)
{
    __m512 x = load16(src, fmt, i);
    return has_ein ? _mm512_add_ps(x, _mm512_loadu_ps(ein + i)) : x;
}

/* Lane b of the result = the maximum of m[b]'s 16 lanes (unsigned). Four
 * levels of "exchange halves, max": 128-bit quarters, then 64-bit pairs,
 * then single lanes. The last level leaves block 4k + j in lane 4j + k,
 * which the final permutation undoes. */
KINL __m512i reduce16_max(const __m512i m[GROUP_BLOCKS])
{
    __m512i r[8], s[4], w[2];
    for (int k = 0; k < 8; k++)
        r[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(m[2 * k], m[2 * k + 1], 0x44),
                                _mm512_shuffle_i32x4(m[2 * k], m[2 * k + 1], 0xee));
    for (int k = 0; k < 4; k++)
        s[k] = _mm512_max_epu32(_mm512_shuffle_i32x4(r[2 * k], r[2 * k + 1], 0x88),
                                _mm512_shuffle_i32x4(r[2 * k], r[2 * k + 1], 0xdd));
    for (int k = 0; k < 2; k++)
        w[k] = _mm512_max_epu32(_mm512_unpacklo_epi64(s[2 * k], s[2 * k + 1]),
                                _mm512_unpackhi_epi64(s[2 * k], s[2 * k + 1]));
    __m512 w0 = _mm512_castsi512_ps(w[0]), w1 = _mm512_castsi512_ps(w[1]);
    __m512i t =
        _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(2, 0, 2, 0))),
                         _mm512_castps_si512(_mm512_shuffle_ps(w0, w1, _MM_SHUFFLE(3, 1, 3, 1))));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(order, t);
}

/* A block's 32 codes (int32; c0 holds elements 0..15, c1 16..31) to 16
 * bytes: element 2k's nibble low, 2k+1's high. The qword shift brings each
 * odd element's nibble to bits 4..7 of the even one's lane. */
KINL __m128i pack_codes(__m512i c0, __m512i c1)
{
    const __m512i hi_nib = _mm512_set1_epi32(0xf0);
    /* bitselect(hi_nib ? shifted : c); only the low byte of each even lane
     * is kept below, so what lies above it does not matter. */
    __m512i t0 = _mm512_ternarylogic_epi32(hi_nib, _mm512_srli_epi64(c0, 28), c0, 0xca);
    __m512i t1 = _mm512_ternarylogic_epi32(hi_nib, _mm512_srli_epi64(c1, 28), c1, 0xca);
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(t0, even, t1));
}

/* rint(u * inv) without q4.h's clamp, which cannot bind here: in a block
 * with a real scale, scale >= amax / 7 * (1 - 2^-24) (the division rounds,
 * the bf16 step only rounds up or caps, and the cap leaves |u * inv| below
 * 7.02), so |u * inv| <= 7 * (1 + 2^-22) and rounds to at most 7. Tiny
 * blocks have inv = 0; non-finite ones are cleared afterwards. */
KINL __m512i code16(__m512 u, __m512 inv)
{
    return _mm512_cvt_roundps_epi32(_mm512_mul_ps(u, inv), RNE);
}

/* What pass 1 leaves for pass 2 of a group. The inverses and scales are
 * kept in memory: a broadcast from memory is a load, not a shuffle. */
struct group_scale {
    float inv[GROUP_BLOCKS];   /* 1 / scale; 0 for special blocks */
    float scale[GROUP_BLOCKS]; /* the bf16 scale as float32 */
    /* Bit b: block b holds a NaN or infinity. The mask's own 16-bit type:
     * GCC 12 under -fsanitize=thread stored a __mmask16 into an unsigned
     * field with a 16-bit KMOVW and read all 32 bits back, so stack bytes
     * became flags of blocks past the group, and clearing their codes below
     * zeroed the scales of the group's tile and bytes past its end. */
    __mmask16 nonfinite;
};

/* Pass 1 of a group (GROUP values of src and ein from element 0): the 16
 * blocks' scales, stored as bf16 at scales (32 bytes) and into gs. */
KINL void group_scales_of(const void *src, int fmt, int has_ein, const float *ein, uint8_t *scales,
                          struct group_scale *gs)
{
    __m512i m[GROUP_BLOCKS];
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        size_t i = (size_t)b * LOOM_Q4_BLOCK;
        __m512i a0 =
            _mm512_and_si512(_mm512_castps_si512(load_u(src, fmt, has_ein, ein, i)), abs_mask);
        __m512i a1 =
            _mm512_and_si512(_mm512_castps_si512(load_u(src, fmt, has_ein, ein, i + 16)), abs_mask);
        m[b] = _mm512_max_epu32(a0, a1);
    }
    const __m512i amax = reduce16_max(m);

    /* q4_scale_bits on 16 lanes. */
    const __mmask16 nonfinite = _mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(0x7f800000));
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(amax, _mm512_set1_epi32(Q4_TINY_BITS));
    __m512 q = _mm512_div_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(7.0f));
    __m512i sb =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(q), _mm512_set1_epi32(0xffff)), 16);
    sb = _mm512_min_epu32(sb, _mm512_set1_epi32(Q4_SCALE_MAX_BITS));
    sb = _mm512_mask_mov_epi32(sb, tiny, _mm512_setzero_si512());
    sb = _mm512_mask_mov_epi32(sb, nonfinite, _mm512_set1_epi32(Q4_SCALE_NAN_BITS));
    _mm256_storeu_si256((__m256i *)scales, _mm512_cvtepi32_epi16(sb));
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(sb, 16));
    /* Special blocks get inv = 0: finite values then code 0 by themselves;
     * non-finite blocks are cleared by pass 2. */
    _mm512_storeu_ps(
        gs->inv, _mm512_maskz_div_ps((__mmask16) ~(nonfinite | tiny), _mm512_set1_ps(1.0f), scale));
    _mm512_storeu_ps(gs->scale, scale);
    gs->nonfinite = nonfinite;
}

/* Pass 2 of a group: codes (256 bytes) and residuals. eout may equal ein:
 * every element is read before its residual is written. */
KINL void group_codes_of(const void *src, int fmt, int has_ein, const float *ein, int has_eout,
                         float *eout, uint8_t *codes, const struct group_scale *gs)
{
    for (int b = 0; b < GROUP_BLOCKS; b++) {
        size_t i = (size_t)b * LOOM_Q4_BLOCK;
        const __m512 vinv = _mm512_set1_ps(gs->inv[b]);
        __m512 u0 = load_u(src, fmt, has_ein, ein, i);
        __m512 u1 = load_u(src, fmt, has_ein, ein, i + 16);
        __m512i c0 = code16(u0, vinv), c1 = code16(u1, vinv);
        _mm_storeu_si128((__m128i *)(codes + 16 * b), pack_codes(c0, c1));
        if (has_eout) {
            /* D is exact; a NaN scale makes it NaN whatever the code. */
            const __m512 vs = _mm512_set1_ps(gs->scale[b]);
            _mm512_storeu_ps(eout + i,
                             _mm512_sub_ps(u0, _mm512_mul_ps(_mm512_cvtepi32_ps(c0), vs)));
            _mm512_storeu_ps(eout + i + 16,
                             _mm512_sub_ps(u1, _mm512_mul_ps(_mm512_cvtepi32_ps(c1), vs)));
        }
    }
    /* NaN or infinity in a block: its codes are 0 (u * 0 gave NaN, which
     * converted to INT_MIN). Rare, so a branch. */
    for (unsigned nf = gs->nonfinite; nf != 0; nf &= nf - 1)
        memset(codes + 16 * __builtin_ctz(nf), 0, 16);
}

// ---- Decode -------------------------------------------------------------------

/* A block has only 16 possible values, D(code) for the 16 nibbles, so
 * decoding is a table lookup: the table is made once per block with the
 * same multiply (and, for 16-bit outputs, the same rounding) that every
 * value would get, and the nibbles index it directly. Nibble v holds code
 * (v ^ 8) - 8, so -8 decodes like any other code. */
KINL __m512 block_table(const uint8_t *src, size_t k)
{
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    uint16_t s;
    memcpy(&s, src + q4_scale_off(k), 2);
    return _mm512_mul_ps(codes, _mm512_set1_ps(loom_bf16_decode(s)));
}

/* Eight code bytes to sixteen float32 values: byte j widens to qword j,
 * whose low dword indexes with its low nibble and whose high dword, after
 * the shift, with the high nibble (VPERMPS reads 4 bits of each index). */
KINL __m512 lookup16_f32(const uint8_t *codes, __m512 table)
{
    __m512i b = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)codes));
    return _mm512_permutexvar_ps(_mm512_or_si512(b, _mm512_slli_epi64(b, 28)), table);
}

/* Sixteen code bytes to 32 16-bit values: byte j widens to dword j, whose
 * words index with the low and the high nibble (VPERMW reads 5 bits, so
 * bit 4 of each word must be clear: the select keeps only b's low nibble). */
KINL __m512i lookup32_u16(const uint8_t *codes, __m256i table)
{
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)codes));
    __m512i idx = _mm512_ternarylogic_epi32(_mm512_set1_epi32((int)0xfffffff0u),
                                            _mm512_slli_epi32(b, 12), b, 0xca);
    return _mm512_permutexvar_epi16(idx, _mm512_zextsi256_si512(table));
}

/* acc == 0: dst receives D in format fmt; acc == 1: dst is float32 and D is
 * added to it. Whole blocks here; the last partial block is scalar. */
KINL void decode_loop(const uint8_t *src, size_t n, void *dst, int fmt, int acc)
{
    const size_t nblocks = n / LOOM_Q4_BLOCK;
    for (size_t k = 0; k < nblocks; k++) {
        const size_t i = k * LOOM_Q4_BLOCK;
        const uint8_t *codes = src + q4_codes_off(k);
        const __m512 table = block_table(src, k);
        if (acc || fmt == SRC_F32) {
            __m512 d0 = lookup16_f32(codes, table), d1 = lookup16_f32(codes + 8, table);
            float *y = (float *)dst + i;
            if (acc) {
                d0 = _mm512_add_ps(_mm512_loadu_ps(y), d0);
                d1 = _mm512_add_ps(_mm512_loadu_ps(y + 16), d1);
            }
            _mm512_storeu_ps(y, d0);
            _mm512_storeu_ps(y + 16, d1);
        } else {
            /* F16C with immediate 0 rounds to nearest even whatever MXCSR
             * says: loom_f16_encode's rounding, NaNs included. */
            __m256i t = fmt == SRC_F16 ? _mm512_cvtps_ph(table, 0) : bf16_encode16(table);
            _mm512_storeu_si512((uint16_t *)dst + i, lookup32_u16(codes, t));
        }
    }
}

#define Q4_SIMD_OPS loom_q4_avx512_ops
#include "q4_simd.h"

#endif

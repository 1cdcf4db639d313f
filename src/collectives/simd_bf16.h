/* SPDX-License-Identifier: Apache-2.0
 *
 * simd_bf16.h - loom_bf16_encode (dtype.h) on vector registers: float32 to
 * bfloat16, the low half rounded to nearest even, NaNs keeping their top
 * payload bits and made quiet. One copy for the AVX2 and AVX-512 reduction
 * kernels and the 4-bit codec's vector files, which must all give
 * loom_bf16_encode's bits. An including file defines KINL (its target
 * attributes) and SIMD_BF16_WIDTH (256 or 512) first.
 */
#ifndef LOOM_SIMD_BF16_H
#define LOOM_SIMD_BF16_H

#include <immintrin.h>

#if SIMD_BF16_WIDTH == 256
/* Eight lanes in, eight bfloat16 out. */
KINL __m128i bf16_encode8(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                       _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), isnan);
    /* Every lane is below 2^16, so the saturating pack only narrows. */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#elif SIMD_BF16_WIDTH == 512
/* Sixteen lanes in, sixteen bfloat16 out. */
KINL __m256i bf16_encode16(__m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, isnan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
#else
#error "define SIMD_BF16_WIDTH as 256 or 512 before including simd_bf16.h"
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_avx2.c - the vector primitives for AVX2 + F16C (256-bit registers)
 * behind loom_kernels_avx2_table; the loops and the table come from
 * kernels_simd.h. Every function carries a target attribute instead of the
 * file being built with -mavx2, so the library still runs on any x86-64:
 * kernels.c reaches this code only after the CPU check. Empty elsewhere.
 *
 * Conversions: F16C converts float16 in both directions with the scalar
 * code's rounding (to nearest even, subnormals kept, overflow to infinity);
 * it only differs on signalling NaNs when widening (it quiets them, the
 * scalar decoder keeps every bit), which a rare-path fix-up restores.
 * bfloat16 is shifts and integer rounding; fp8 is widened through float16
 * and narrowed with integer rounding.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#include "dtype.h"
#include "kernels_impl.h"

#define KFN             static __attribute__((target("avx2,f16c")))
#define KINL            static inline __attribute__((target("avx2,f16c"), always_inline))
#define SIMD_BF16_WIDTH 256
#include "simd_bf16.h"

/* ---- Accumulator vectors --------------------------------------------------- */

typedef float f32_acc_t;
typedef __m256 f32_vec_t;
enum { f32_W = 8 };
typedef double f64_acc_t;
typedef __m256d f64_vec_t;
enum { f64_W = 4 };

KINL __m256 f32_lda(const float *p)
{
    return _mm256_loadu_ps(p);
}
KINL void f32_sta(float *p, __m256 v)
{
    _mm256_storeu_ps(p, v);
}
KINL __m256 f32_set1(float x)
{
    return _mm256_set1_ps(x);
}
KINL __m256 f32_add(__m256 a, __m256 b)
{
    return _mm256_add_ps(a, b);
}
KINL __m256 f32_mul(__m256 a, __m256 b)
{
    return _mm256_mul_ps(a, b);
}
KINL __m256 f32_div(__m256 a, __m256 b)
{
    return _mm256_div_ps(a, b);
}
/* MAXPS gives "a > b ? a : b", and b when either is NaN; the scalar rule
 * wants a when a is NaN, so those lanes take a. */
KINL __m256 f32_max(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
KINL __m256 f32_min(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

KINL __m256d f64_lda(const double *p)
{
    return _mm256_loadu_pd(p);
}
KINL void f64_sta(double *p, __m256d v)
{
    _mm256_storeu_pd(p, v);
}
KINL __m256d f64_set1(double x)
{
    return _mm256_set1_pd(x);
}
KINL __m256d f64_add(__m256d a, __m256d b)
{
    return _mm256_add_pd(a, b);
}
KINL __m256d f64_mul(__m256d a, __m256d b)
{
    return _mm256_mul_pd(a, b);
}
KINL __m256d f64_div(__m256d a, __m256d b)
{
    return _mm256_div_pd(a, b);
}
KINL __m256d f64_max(__m256d a, __m256d b)
{
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
}
KINL __m256d f64_min(__m256d a, __m256d b)
{
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
}

/* ---- Native datatypes: the element is the accumulator ----------------------- */

typedef float f32_src_t;
typedef double f64_src_t;
#define f32_load   f32_lda
#define f32_load_q f32_lda
#define f64_load_q f64_lda
#define f32_store  f32_sta
#define f32_sload  (float)
#define f32_sstore (float)
#define f64_load   f64_lda
#define f64_store  f64_sta
#define f64_sload  (double)
#define f64_sstore (double)

#define NATIVE_INT(sfx, T, lanes)                                                                  \
    typedef T sfx##_src_t;                                                                         \
    typedef T sfx##_acc_t;                                                                         \
    typedef __m256i sfx##_vec_t;                                                                   \
    enum { sfx##_W = lanes };                                                                      \
    KINL __m256i sfx##_load(const T *p)                                                            \
    {                                                                                              \
        return _mm256_loadu_si256((const __m256i *)p);                                             \
    }                                                                                              \
    KINL void sfx##_store(T *p, __m256i v)                                                         \
    {                                                                                              \
        _mm256_storeu_si256((__m256i *)p, v);                                                      \
    }                                                                                              \
    KINL T sfx##_sload(T x)                                                                        \
    {                                                                                              \
        return x;                                                                                  \
    }                                                                                              \
    KINL T sfx##_sstore(T x)                                                                       \
    {                                                                                              \
        return x;                                                                                  \
    }
NATIVE_INT(i8, int8_t, 32)
NATIVE_INT(u8, uint8_t, 32)
NATIVE_INT(i32, int32_t, 8)
NATIVE_INT(u32, uint32_t, 8)
NATIVE_INT(i64, int64_t, 4)
NATIVE_INT(u64, uint64_t, 4)

KINL __m256i u8_add(__m256i a, __m256i b)
{
    return _mm256_add_epi8(a, b);
}
KINL __m256i i8_max(__m256i a, __m256i b)
{
    return _mm256_max_epi8(a, b);
}
KINL __m256i i8_min(__m256i a, __m256i b)
{
    return _mm256_min_epi8(a, b);
}
KINL __m256i u8_max(__m256i a, __m256i b)
{
    return _mm256_max_epu8(a, b);
}
KINL __m256i u8_min(__m256i a, __m256i b)
{
    return _mm256_min_epu8(a, b);
}
KINL __m256i u32_add(__m256i a, __m256i b)
{
    return _mm256_add_epi32(a, b);
}
KINL __m256i u32_mul(__m256i a, __m256i b)
{
    return _mm256_mullo_epi32(a, b);
}
KINL __m256i i32_max(__m256i a, __m256i b)
{
    return _mm256_max_epi32(a, b);
}
KINL __m256i i32_min(__m256i a, __m256i b)
{
    return _mm256_min_epi32(a, b);
}
KINL __m256i u32_max(__m256i a, __m256i b)
{
    return _mm256_max_epu32(a, b);
}
KINL __m256i u32_min(__m256i a, __m256i b)
{
    return _mm256_min_epu32(a, b);
}
KINL __m256i u64_add(__m256i a, __m256i b)
{
    return _mm256_add_epi64(a, b);
}
/* AVX2 has only a signed 64-bit compare; flipping the sign bits turns the
 * unsigned order into the signed one. */
KINL __m256i i64_max(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
}
KINL __m256i i64_min(__m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(b, a));
}
KINL __m256i u64_max(__m256i a, __m256i b)
{
    const __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    __m256i gt = _mm256_cmpgt_epi64(_mm256_xor_si256(a, bias), _mm256_xor_si256(b, bias));
    return _mm256_blendv_epi8(b, a, gt);
}
KINL __m256i u64_min(__m256i a, __m256i b)
{
    const __m256i bias = _mm256_set1_epi64x(INT64_MIN);
    __m256i lt = _mm256_cmpgt_epi64(_mm256_xor_si256(b, bias), _mm256_xor_si256(a, bias));
    return _mm256_blendv_epi8(b, a, lt);
}

/* ---- 8/16-bit floats, accumulated in float32 --------------------------------- */

typedef uint16_t f16_src_t;
typedef uint16_t bf16_src_t;
typedef uint8_t e4m3_src_t;
typedef uint8_t e5m2_src_t;

/* Eight float16 values to float32, every bit as loom_f16_decode gives it.
 * F16C quiets signalling NaNs, so those lanes are redone (rarely: a test and
 * a branch per vector); the _q form leaves them quiet. */
KINL __m256 f16_decode8_q(__m128i h)
{
    return _mm256_cvtph_ps(h);
}
KINL __m256 f16_decode8(__m128i h)
{
    __m256 f = _mm256_cvtph_ps(h);
    __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    if (_mm_testz_si128(nan, nan))
        return f;
    /* NaN: sign, all-ones exponent, the ten payload bits unchanged. */
    __m256i w = _mm256_cvtepu16_epi32(h);
    __m256i bits = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7fff)), 13)),
        _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(bits),
                            _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
}

KINL __m256 f16_load(const uint16_t *p)
{
    return f16_decode8(_mm_loadu_si128((const __m128i *)p));
}
KINL __m256 f16_load_q(const uint16_t *p)
{
    return f16_decode8_q(_mm_loadu_si128((const __m128i *)p));
}
/* Immediate 0: round to nearest even whatever MXCSR says. */
KINL void f16_store(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, 0));
}
#define f16_sload  loom_f16_decode
#define f16_sstore loom_f16_encode

KINL __m256 bf16_load(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
KINL void bf16_store(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, bf16_encode8(v));
}
#define bf16_load_q bf16_load
#define bf16_sload  loom_bf16_decode
#define bf16_sstore loom_bf16_encode

/* E5M2 is the top byte of a float16: same exponent, same specials. */
KINL __m256 e5m2_load(const uint8_t *p)
{
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return f16_decode8(_mm_slli_epi16(b, 8));
}
KINL __m256 e5m2_load_q(const uint8_t *p)
{
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return f16_decode8_q(_mm_slli_epi16(b, 8));
}
#define e5m2_sload loom_e5m2_decode

/* E4M3 shifted into a float16's fields has the right mantissa and an
 * exponent 8 too small (biases 7 vs 15), subnormals included; scaling by 2^8
 * is exact. Its only NaN, S.1111.111, would land on 1.875; adding 0x3e80
 * there makes it float16's quiet NaN, which widens to the table's. */
KINL __m256 e4m3_load(const uint8_t *p)
{
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(mag, 7));
    h = _mm_add_epi16(h, _mm_and_si128(nan, _mm_set1_epi16(0x3e80)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}
#define e4m3_load_q e4m3_load
#define e4m3_sload  loom_e4m3_decode

/* loom_e4m3_encode / loom_e5m2_encode on eight lanes: both the normal and
 * the subnormal rounding (with per-lane variable shifts) are computed, then
 * the lane's case is selected, saturation and NaN last. Lanes a case does
 * not apply to may compute nonsense (out-of-range shifts give 0); it is
 * discarded. */
KINL __m128i fp8_encode8(__m256 v, int mbits, int ebias, int32_t sat, int32_t satval,
                         int32_t nanval)
{
    const int drop = 23 - mbits;
    const __m256i one = _mm256_set1_epi32(1);
    __m256i x = _mm256_castps_si256(v);
    __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
    __m256i r = _mm256_sub_epi32(ax, _mm256_set1_epi32((127 - ebias) << 23));
    __m256i normal = _mm256_add_epi32(_mm256_add_epi32(r, _mm256_set1_epi32((1 << (drop - 1)) - 1)),
                                      _mm256_and_si256(_mm256_srli_epi32(r, drop), one));
    normal = _mm256_srli_epi32(normal, drop);
    __m256i shift = _mm256_min_epi32(
        _mm256_sub_epi32(_mm256_set1_epi32(151 - ebias - mbits), _mm256_srli_epi32(ax, 23)),
        _mm256_set1_epi32(25));
    __m256i mant = _mm256_or_si256(_mm256_and_si256(ax, _mm256_set1_epi32(0x7fffff)),
                                   _mm256_set1_epi32(0x800000));
    __m256i half_m1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one)), one);
    __m256i sub = _mm256_add_epi32(_mm256_add_epi32(mant, half_m1),
                                   _mm256_and_si256(_mm256_srlv_epi32(mant, shift), one));
    sub = _mm256_srlv_epi32(sub, shift);
    __m256i is_normal = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(((128 - ebias) << 23) - 1));
    __m256i mag = _mm256_blendv_epi8(sub, normal, is_normal);
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(satval),
                             _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(sat)));
    mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(nanval),
                             _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000)));
    __m256i b = _mm256_or_si256(sign, mag);
    /* Lanes are below 256, so the saturating packs only narrow. */
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm_packus_epi16(w, w);
}

KINL void e4m3_store(uint8_t *p, __m256 v)
{
    _mm_storel_epi64((__m128i *)p, fp8_encode8(v, 3, 7, 0x43e00000, 0x7e, 0x7f));
}
KINL void e5m2_store(uint8_t *p, __m256 v)
{
    _mm_storel_epi64((__m128i *)p, fp8_encode8(v, 2, 15, 0x47600000, 0x7b, 0x7e));
}
#define e4m3_sstore loom_e4m3_encode
#define e5m2_sstore loom_e5m2_encode

#define SIMD_TABLE        loom_kernels_avx2_table
#define SIMD_HAVE_U64_MUL 0
#include "kernels_simd.h"

#endif

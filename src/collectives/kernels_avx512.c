/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_avx512.c - the vector primitives for AVX-512 F/BW/VL/DQ (512-bit
 * registers, mask registers for NaN selects) behind
 * loom_kernels_avx512_table; the loops and the table come from
 * kernels_simd.h, and kernels.c fills what this leaves out from the AVX2
 * table. Target attributes, not -mavx512f, so the library runs on any
 * x86-64; kernels.c reaches this code only after the CPU check. No
 * AVX512-FP16 or AVX512-BF16: float16 goes through F16C-style conversions
 * (VCVTPH2PS/VCVTPS2PH, which AVX512F has at this width), bfloat16 through
 * integer rounding, fp8 through float16 one way and integer rounding the
 * other. Empty on other architectures.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#include "dtype.h"
#include "kernels_impl.h"

#define KFN static __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define KINL                                                                                       \
    static inline                                                                                  \
        __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"), always_inline))
#define SIMD_BF16_WIDTH 512
#include "simd_bf16.h"

/* ---- Accumulator vectors --------------------------------------------------- */

typedef float f32_acc_t;
typedef __m512 f32_vec_t;
enum { f32_W = 16 };
typedef double f64_acc_t;
typedef __m512d f64_vec_t;
enum { f64_W = 8 };

KINL __m512 f32_lda(const float *p)
{
    return _mm512_loadu_ps(p);
}
KINL void f32_sta(float *p, __m512 v)
{
    _mm512_storeu_ps(p, v);
}
KINL __m512 f32_set1(float x)
{
    return _mm512_set1_ps(x);
}
KINL __m512 f32_add(__m512 a, __m512 b)
{
    return _mm512_add_ps(a, b);
}
KINL __m512 f32_mul(__m512 a, __m512 b)
{
    return _mm512_mul_ps(a, b);
}
KINL __m512 f32_div(__m512 a, __m512 b)
{
    return _mm512_div_ps(a, b);
}
/* VMAXPS gives "a > b ? a : b", and b when either is NaN; the scalar rule
 * wants a when a is NaN, so those lanes take a. */
KINL __m512 f32_max(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}
KINL __m512 f32_min(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

KINL __m512d f64_lda(const double *p)
{
    return _mm512_loadu_pd(p);
}
KINL void f64_sta(double *p, __m512d v)
{
    _mm512_storeu_pd(p, v);
}
KINL __m512d f64_set1(double x)
{
    return _mm512_set1_pd(x);
}
KINL __m512d f64_add(__m512d a, __m512d b)
{
    return _mm512_add_pd(a, b);
}
KINL __m512d f64_mul(__m512d a, __m512d b)
{
    return _mm512_mul_pd(a, b);
}
KINL __m512d f64_div(__m512d a, __m512d b)
{
    return _mm512_div_pd(a, b);
}
KINL __m512d f64_max(__m512d a, __m512d b)
{
    return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
}
KINL __m512d f64_min(__m512d a, __m512d b)
{
    return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
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
    typedef __m512i sfx##_vec_t;                                                                   \
    enum { sfx##_W = lanes };                                                                      \
    KINL __m512i sfx##_load(const T *p)                                                            \
    {                                                                                              \
        return _mm512_loadu_si512(p);                                                              \
    }                                                                                              \
    KINL void sfx##_store(T *p, __m512i v)                                                         \
    {                                                                                              \
        _mm512_storeu_si512(p, v);                                                                 \
    }                                                                                              \
    KINL T sfx##_sload(T x)                                                                        \
    {                                                                                              \
        return x;                                                                                  \
    }                                                                                              \
    KINL T sfx##_sstore(T x)                                                                       \
    {                                                                                              \
        return x;                                                                                  \
    }
NATIVE_INT(i8, int8_t, 64)
NATIVE_INT(u8, uint8_t, 64)
NATIVE_INT(i32, int32_t, 16)
NATIVE_INT(u32, uint32_t, 16)
NATIVE_INT(i64, int64_t, 8)
NATIVE_INT(u64, uint64_t, 8)

KINL __m512i u8_add(__m512i a, __m512i b)
{
    return _mm512_add_epi8(a, b);
}
KINL __m512i i8_max(__m512i a, __m512i b)
{
    return _mm512_max_epi8(a, b);
}
KINL __m512i i8_min(__m512i a, __m512i b)
{
    return _mm512_min_epi8(a, b);
}
KINL __m512i u8_max(__m512i a, __m512i b)
{
    return _mm512_max_epu8(a, b);
}
KINL __m512i u8_min(__m512i a, __m512i b)
{
    return _mm512_min_epu8(a, b);
}
KINL __m512i u32_add(__m512i a, __m512i b)
{
    return _mm512_add_epi32(a, b);
}
KINL __m512i u32_mul(__m512i a, __m512i b)
{
    return _mm512_mullo_epi32(a, b);
}
KINL __m512i i32_max(__m512i a, __m512i b)
{
    return _mm512_max_epi32(a, b);
}
KINL __m512i i32_min(__m512i a, __m512i b)
{
    return _mm512_min_epi32(a, b);
}
KINL __m512i u32_max(__m512i a, __m512i b)
{
    return _mm512_max_epu32(a, b);
}
KINL __m512i u32_min(__m512i a, __m512i b)
{
    return _mm512_min_epu32(a, b);
}
KINL __m512i u64_add(__m512i a, __m512i b)
{
    return _mm512_add_epi64(a, b);
}
KINL __m512i u64_mul(__m512i a, __m512i b)
{
    return _mm512_mullo_epi64(a, b);
}
KINL __m512i i64_max(__m512i a, __m512i b)
{
    return _mm512_max_epi64(a, b);
}
KINL __m512i i64_min(__m512i a, __m512i b)
{
    return _mm512_min_epi64(a, b);
}
KINL __m512i u64_max(__m512i a, __m512i b)
{
    return _mm512_max_epu64(a, b);
}
KINL __m512i u64_min(__m512i a, __m512i b)
{
    return _mm512_min_epu64(a, b);
}

/* ---- 8/16-bit floats, accumulated in float32 --------------------------------- */

typedef uint16_t f16_src_t;
typedef uint16_t bf16_src_t;
typedef uint8_t e4m3_src_t;
typedef uint8_t e5m2_src_t;

/* Sixteen float16 values to float32, every bit as loom_f16_decode gives it.
 * VCVTPH2PS quiets signalling NaNs, so those lanes are redone (rarely: a test
 * and a branch per vector); the _q form leaves them quiet. */
KINL __m512 f16_decode16_q(__m256i h)
{
    return _mm512_cvtph_ps(h);
}
KINL __m512 f16_decode16(__m256i h)
{
    __m512 f = _mm512_cvtph_ps(h);
    __mmask16 nan = _mm256_cmpgt_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                            _mm256_set1_epi16(0x7c00));
    if (nan == 0)
        return f;
    __m512i w = _mm512_cvtepu16_epi32(h);
    __m512i bits = _mm512_or_si512(
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
                        _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x7fff)), 13)),
        _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(bits));
}

KINL __m512 f16_load(const uint16_t *p)
{
    return f16_decode16(_mm256_loadu_si256((const __m256i *)p));
}
KINL __m512 f16_load_q(const uint16_t *p)
{
    return f16_decode16_q(_mm256_loadu_si256((const __m256i *)p));
}
/* Immediate 0: round to nearest even whatever MXCSR says. */
KINL void f16_store(uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, 0));
}
#define f16_sload  loom_f16_decode
#define f16_sstore loom_f16_encode

KINL __m512 bf16_load(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
KINL void bf16_store(uint16_t *p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)p, bf16_encode16(v));
}
#define bf16_load_q bf16_load
#define bf16_sload  loom_bf16_decode
#define bf16_sstore loom_bf16_encode

/* E5M2 is the top byte of a float16: same exponent, same specials. */
KINL __m512 e5m2_load(const uint8_t *p)
{
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return f16_decode16(_mm256_slli_epi16(b, 8));
}
KINL __m512 e5m2_load_q(const uint8_t *p)
{
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return f16_decode16_q(_mm256_slli_epi16(b, 8));
}
#define e5m2_sload loom_e5m2_decode

/* E4M3 shifted into a float16's fields has the right mantissa and an
 * exponent 8 too small (biases 7 vs 15), subnormals included; scaling by 2^8
 * is exact. Its only NaN, S.1111.111, would land on 1.875; adding 0x3e80
 * there makes it float16's quiet NaN, which widens to the table's. */
KINL __m512 e4m3_load(const uint8_t *p)
{
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                _mm256_slli_epi16(mag, 7));
    __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
    h = _mm256_mask_add_epi16(h, nan, h, _mm256_set1_epi16(0x3e80));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}
#define e4m3_load_q e4m3_load
#define e4m3_sload  loom_e4m3_decode

/* loom_e4m3_encode / loom_e5m2_encode on sixteen lanes: both the normal and
 * the subnormal rounding (with per-lane variable shifts) are computed, then
 * the lane's case is selected, saturation and NaN last. Lanes a case does
 * not apply to may compute nonsense (out-of-range shifts give 0); it is
 * discarded. */
KINL __m128i fp8_encode16(__m512 v, int mbits, int ebias, int32_t sat, int32_t satval,
                          int32_t nanval)
{
    const int drop = 23 - mbits;
    const __m512i one = _mm512_set1_epi32(1);
    __m512i x = _mm512_castps_si512(v);
    __m512i ax = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(x, 24), _mm512_set1_epi32(0x80));
    __m512i r = _mm512_sub_epi32(ax, _mm512_set1_epi32((127 - ebias) << 23));
    __m512i normal = _mm512_add_epi32(_mm512_add_epi32(r, _mm512_set1_epi32((1 << (drop - 1)) - 1)),
                                      _mm512_and_si512(_mm512_srli_epi32(r, drop), one));
    normal = _mm512_srli_epi32(normal, drop);
    __m512i shift = _mm512_min_epi32(
        _mm512_sub_epi32(_mm512_set1_epi32(151 - ebias - mbits), _mm512_srli_epi32(ax, 23)),
        _mm512_set1_epi32(25));
    __m512i mant = _mm512_or_si512(_mm512_and_si512(ax, _mm512_set1_epi32(0x7fffff)),
                                   _mm512_set1_epi32(0x800000));
    __m512i half_m1 = _mm512_sub_epi32(_mm512_sllv_epi32(one, _mm512_sub_epi32(shift, one)), one);
    __m512i sub = _mm512_add_epi32(_mm512_add_epi32(mant, half_m1),
                                   _mm512_and_si512(_mm512_srlv_epi32(mant, shift), one));
    sub = _mm512_srlv_epi32(sub, shift);
    __mmask16 is_normal = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(((128 - ebias) << 23) - 1));
    __m512i mag = _mm512_mask_mov_epi32(sub, is_normal, normal);
    mag = _mm512_mask_mov_epi32(mag, _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(sat)),
                                _mm512_set1_epi32(satval));
    mag = _mm512_mask_mov_epi32(mag, _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000)),
                                _mm512_set1_epi32(nanval));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(sign, mag));
}

KINL void e4m3_store(uint8_t *p, __m512 v)
{
    _mm_storeu_si128((__m128i *)p, fp8_encode16(v, 3, 7, 0x43e00000, 0x7e, 0x7f));
}
KINL void e5m2_store(uint8_t *p, __m512 v)
{
    _mm_storeu_si128((__m128i *)p, fp8_encode16(v, 2, 15, 0x47600000, 0x7b, 0x7e));
}
#define e4m3_sstore loom_e4m3_encode
#define e5m2_sstore loom_e5m2_encode

#define SIMD_TABLE        loom_kernels_avx512_table
#define SIMD_HAVE_U64_MUL 1
#include "kernels_simd.h"

#endif

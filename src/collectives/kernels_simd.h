/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_simd.h - the loop shapes and the table of the x86 vector kernels,
 * written once for both kernels_avx2.c and kernels_avx512.c. Each of those
 * defines the vector primitives below for its register width and then
 * includes this file, which instantiates every kernel and the sparse table
 * SIMD_TABLE (only the entries the vector code improves; kernels.c fills the
 * rest from the scalar table). Nothing else includes it.
 *
 * What an including file provides (sfx: a datatype's element format; asfx:
 * its accumulator's):
 *   KFN                    storage class + target attribute of a kernel
 *   sfx##_src_t            the datatype's element type
 *   asfx##_acc_t, asfx##_vec_t, asfx##_W   accumulator element, vector, lanes
 *   sfx##_load(const src_t *) -> vec       W elements, widened to accumulators
 *   sfx##_load_q(const src_t *) -> vec     the same, except that signalling NaNs
 *                                          may come out quiet (see below)
 *   sfx##_store(src_t *, vec)              W accumulators, rounded to the datatype
 *   sfx##_sload(src_t) -> acc, sfx##_sstore(acc) -> src   the scalar forms
 *   asfx##_lda(const acc_t *), asfx##_sta(acc_t *, vec)   accumulator memory
 *   asfx##_add/mul/max/min(vec, vec), asfx##_div, asfx##_set1
 *   SIMD_HAVE_U64_MUL      1 if u64_mul exists (AVX-512DQ)
 * The scalar element ops (add_f32, max_i64, ...) come from kernels_impl.h and
 * finish every loop's tail, so tails are the scalar table's code.
 *
 * Every vector primitive must give exactly the scalar op's bits; the ops are
 * single IEEE operations in the accumulator's precision, in the same order
 * as the scalar loops, so the only work is in the conversions and the NaN
 * rules of max/min. A signalling NaN that comes out of a conversion quiet is
 * only a difference where it is stored or passed on as it is: init, and
 * acc's max/min. Arithmetic quiets it anyway, and so does every encoding in
 * finish (the payload bits that survive are the same), so acc's add/mul and
 * the fused kernels use the cheaper load_q. FMA contraction cannot change a result: gcc in ISO C
 * mode (-std=c11) does not contract, the AVX2 target leaves FMA out, and the
 * one multiply feeding an add (e4m3's scaling by 2^8) is exact, so a fused
 * form would round the same.
 */
#ifndef SIMD_TABLE
#error "kernels_simd.h is included by the per-instruction-set kernel files only"
#endif

/* Integers are their own accumulators: every access form is the plain one. */
#define i8_lda     i8_load
#define u8_lda     u8_load
#define i32_lda    i32_load
#define u32_lda    u32_load
#define i64_lda    i64_load
#define u64_lda    u64_load
#define i8_load_q  i8_load
#define u8_load_q  u8_load
#define i32_load_q i32_load
#define u32_load_q u32_load
#define i64_load_q i64_load
#define u64_load_q u64_load
#define i8_sta     i8_store
#define u8_sta     u8_store
#define i32_sta    i32_store
#define u32_sta    u32_store
#define i64_sta    i64_store
#define u64_sta    u64_store

/* The finishing step, chosen by a literal 0 (keep) or 1 (avg: divide by
 * nranks in the accumulator type, as the scalar finish does). */
#define SIMD_DIVISOR_0(asfx, nranks) (void)(nranks)
#define SIMD_DIVISOR_1(asfx, nranks)                                                               \
    const asfx##_acc_t d = (asfx##_acc_t)(nranks);                                                 \
    const asfx##_vec_t vd = asfx##_set1(d)
#define SIMD_FIN_0(asfx, v) (v)
#define SIMD_FIN_1(asfx, v) asfx##_div((v), vd)
#define SIMD_SFIN_0(x)      (x)
#define SIMD_SFIN_1(x)      ((x) / d)

/* acc[i] = acc[i] op decode(src[i]); four vectors per step so that loads of
 * the next vectors overlap the latency of the current ones. */
#define SIMD_ACC(sfx, asfx, op, ld)                                                                \
    KFN void acc_##op##_##sfx(void *restrict accv, const void *restrict srcv, size_t n)            \
    {                                                                                              \
        asfx##_acc_t *a = accv;                                                                    \
        const sfx##_src_t *s = srcv;                                                               \
        const size_t w = asfx##_W;                                                                 \
        size_t i = 0;                                                                              \
        for (; i + 4 * w <= n; i += 4 * w) {                                                       \
            asfx##_vec_t x0 = asfx##_##op(asfx##_lda(a + i), sfx##_##ld(s + i));                   \
            asfx##_vec_t x1 = asfx##_##op(asfx##_lda(a + i + w), sfx##_##ld(s + i + w));           \
            asfx##_vec_t x2 = asfx##_##op(asfx##_lda(a + i + 2 * w), sfx##_##ld(s + i + 2 * w));   \
            asfx##_vec_t x3 = asfx##_##op(asfx##_lda(a + i + 3 * w), sfx##_##ld(s + i + 3 * w));   \
            asfx##_sta(a + i, x0);                                                                 \
            asfx##_sta(a + i + w, x1);                                                             \
            asfx##_sta(a + i + 2 * w, x2);                                                         \
            asfx##_sta(a + i + 3 * w, x3);                                                         \
        }                                                                                          \
        for (; i + w <= n; i += w)                                                                 \
            asfx##_sta(a + i, asfx##_##op(asfx##_lda(a + i), sfx##_##ld(s + i)));                  \
        for (; i < n; i++)                                                                         \
            a[i] = op##_##asfx(a[i], sfx##_sload(s[i]));                                           \
    }

/* acc[i] = decode(src[i]), for datatypes whose accumulator is wider. */
#define SIMD_INIT(sfx, asfx)                                                                       \
    KFN void init_##sfx(void *accv, const void *srcv, size_t n)                                    \
    {                                                                                              \
        asfx##_acc_t *a = accv;                                                                    \
        const sfx##_src_t *s = srcv;                                                               \
        const size_t w = asfx##_W;                                                                 \
        size_t i = 0;                                                                              \
        for (; i + 2 * w <= n; i += 2 * w) {                                                       \
            asfx##_sta(a + i, sfx##_load(s + i));                                                  \
            asfx##_sta(a + i + w, sfx##_load(s + i + w));                                          \
        }                                                                                          \
        for (; i + w <= n; i += w)                                                                 \
            asfx##_sta(a + i, sfx##_load(s + i));                                                  \
        for (; i < n; i++)                                                                         \
            a[i] = sfx##_sload(s[i]);                                                              \
    }

/* dst[i] = encode(acc[i] (/ nranks)). dst == acc works because each step
 * loads all its accumulators before it stores, and the stores (at most as
 * wide) never reach accumulators a later step still has to load. */
#define SIMD_FINISH(name, sfx, asfx, avg)                                                          \
    KFN void name(void *dstv, const void *accv, size_t n, int nranks)                              \
    {                                                                                              \
        sfx##_src_t *y = dstv;                                                                     \
        const asfx##_acc_t *x = accv;                                                              \
        const size_t w = asfx##_W;                                                                 \
        SIMD_DIVISOR_##avg(asfx, nranks);                                                          \
        size_t i = 0;                                                                              \
        for (; i + 2 * w <= n; i += 2 * w) {                                                       \
            asfx##_vec_t v0 = asfx##_lda(x + i), v1 = asfx##_lda(x + i + w);                       \
            sfx##_store(y + i, SIMD_FIN_##avg(asfx, v0));                                          \
            sfx##_store(y + i + w, SIMD_FIN_##avg(asfx, v1));                                      \
        }                                                                                          \
        for (; i + w <= n; i += w) {                                                               \
            asfx##_vec_t v = asfx##_lda(x + i);                                                    \
            sfx##_store(y + i, SIMD_FIN_##avg(asfx, v));                                           \
        }                                                                                          \
        for (; i < n; i++)                                                                         \
            y[i] = sfx##_sstore(SIMD_SFIN_##avg(x[i]));                                            \
    }

/* The fused reduction: per step, four vectors of accumulators live in
 * registers while every source is folded in, in source order, then they are
 * finished and stored. Every source of the step is loaded before dst is
 * written, which is what makes dst == srcs[k] safe for any k. */
#define SIMD_MULTI(name, sfx, asfx, op, avg)                                                       \
    KFN void name(void *dstv, const void *const *srcs, int nsrc, size_t n, int nranks)             \
    {                                                                                              \
        sfx##_src_t *y = dstv;                                                                     \
        const sfx##_src_t *s0 = srcs[0];                                                           \
        const size_t w = asfx##_W;                                                                 \
        SIMD_DIVISOR_##avg(asfx, nranks);                                                          \
        size_t i = 0;                                                                              \
        for (; i + 4 * w <= n; i += 4 * w) {                                                       \
            asfx##_vec_t a0 = sfx##_load_q(s0 + i), a1 = sfx##_load_q(s0 + i + w);                 \
            asfx##_vec_t a2 = sfx##_load_q(s0 + i + 2 * w), a3 = sfx##_load_q(s0 + i + 3 * w);     \
            for (int j = 1; j < nsrc; j++) {                                                       \
                const sfx##_src_t *s = (const sfx##_src_t *)srcs[j] + i;                           \
                a0 = asfx##_##op(a0, sfx##_load_q(s));                                             \
                a1 = asfx##_##op(a1, sfx##_load_q(s + w));                                         \
                a2 = asfx##_##op(a2, sfx##_load_q(s + 2 * w));                                     \
                a3 = asfx##_##op(a3, sfx##_load_q(s + 3 * w));                                     \
            }                                                                                      \
            sfx##_store(y + i, SIMD_FIN_##avg(asfx, a0));                                          \
            sfx##_store(y + i + w, SIMD_FIN_##avg(asfx, a1));                                      \
            sfx##_store(y + i + 2 * w, SIMD_FIN_##avg(asfx, a2));                                  \
            sfx##_store(y + i + 3 * w, SIMD_FIN_##avg(asfx, a3));                                  \
        }                                                                                          \
        for (; i + w <= n; i += w) {                                                               \
            asfx##_vec_t a = sfx##_load_q(s0 + i);                                                 \
            for (int j = 1; j < nsrc; j++)                                                         \
                a = asfx##_##op(a, sfx##_load_q((const sfx##_src_t *)srcs[j] + i));                \
            sfx##_store(y + i, SIMD_FIN_##avg(asfx, a));                                           \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            asfx##_acc_t a = sfx##_sload(s0[i]);                                                   \
            for (int j = 1; j < nsrc; j++)                                                         \
                a = op##_##asfx(a, sfx##_sload(((const sfx##_src_t *)srcs[j])[i]));                \
            y[i] = sfx##_sstore(SIMD_SFIN_##avg(a));                                               \
        }                                                                                          \
    }

/* ---- Instantiations ------------------------------------------------------ */

/* Floats: every op. The narrow ones also convert in init and finish. */
#define SIMD_FLOAT_KERNELS(sfx, asfx)                                                              \
    SIMD_ACC(sfx, asfx, add, load_q)                                                               \
    SIMD_ACC(sfx, asfx, mul, load_q)                                                               \
    SIMD_ACC(sfx, asfx, max, load)                                                                 \
    SIMD_ACC(sfx, asfx, min, load)                                                                 \
    SIMD_FINISH(finish_avg_##sfx, sfx, asfx, 1)                                                    \
    SIMD_MULTI(multi_sum_##sfx, sfx, asfx, add, 0)                                                 \
    SIMD_MULTI(multi_prod_##sfx, sfx, asfx, mul, 0)                                                \
    SIMD_MULTI(multi_max_##sfx, sfx, asfx, max, 0)                                                 \
    SIMD_MULTI(multi_min_##sfx, sfx, asfx, min, 0)                                                 \
    SIMD_MULTI(multi_avg_##sfx, sfx, asfx, add, 1)

SIMD_FLOAT_KERNELS(f32, f32)
SIMD_FLOAT_KERNELS(f64, f64)
SIMD_FLOAT_KERNELS(f16, f32)
SIMD_FLOAT_KERNELS(bf16, f32)
SIMD_FLOAT_KERNELS(e4m3, f32)
SIMD_FLOAT_KERNELS(e5m2, f32)
SIMD_INIT(f16, f32)
SIMD_INIT(bf16, f32)
SIMD_INIT(e4m3, f32)
SIMD_INIT(e5m2, f32)
SIMD_FINISH(finish_copy_f16, f16, f32, 0)
SIMD_FINISH(finish_copy_bf16, bf16, f32, 0)
SIMD_FINISH(finish_copy_e4m3, e4m3, f32, 0)
SIMD_FINISH(finish_copy_e5m2, e5m2, f32, 0)

/* Integers: sum and prod are the unsigned ops for either signedness (the
 * bits are the same), max and min the signed or unsigned compare. 8-bit
 * products have no vector instruction, 64-bit ones only with AVX-512DQ; avg
 * divides (no integer vector division), so it is the scalar finish. */
#define SIMD_INT_ORDER(sfx)                                                                        \
    SIMD_ACC(sfx, sfx, max, load)                                                                  \
    SIMD_ACC(sfx, sfx, min, load)                                                                  \
    SIMD_MULTI(multi_max_##sfx, sfx, sfx, max, 0)                                                  \
    SIMD_MULTI(multi_min_##sfx, sfx, sfx, min, 0)

SIMD_ACC(u8, u8, add, load)
SIMD_MULTI(multi_sum_u8, u8, u8, add, 0)
SIMD_INT_ORDER(i8)
SIMD_INT_ORDER(u8)
SIMD_ACC(u32, u32, add, load)
SIMD_ACC(u32, u32, mul, load)
SIMD_MULTI(multi_sum_u32, u32, u32, add, 0)
SIMD_MULTI(multi_prod_u32, u32, u32, mul, 0)
SIMD_INT_ORDER(i32)
SIMD_INT_ORDER(u32)
SIMD_ACC(u64, u64, add, load)
SIMD_MULTI(multi_sum_u64, u64, u64, add, 0)
#if SIMD_HAVE_U64_MUL
SIMD_ACC(u64, u64, mul, load)
SIMD_MULTI(multi_prod_u64, u64, u64, mul, 0)
#define SIMD_U64_PROD_ACC   acc_mul_u64
#define SIMD_U64_PROD_MULTI multi_prod_u64
#else
#define SIMD_U64_PROD_ACC   NULL
#define SIMD_U64_PROD_MULTI NULL
#endif
SIMD_INT_ORDER(i64)
SIMD_INT_ORDER(u64)

/* ---- The table ----------------------------------------------------------- */

#define SIMD_ACC4(sfx)                                                                             \
    {                                                                                              \
        [loomSum] = acc_add_##sfx, [loomProd] = acc_mul_##sfx, [loomMax] = acc_max_##sfx,          \
        [loomMin] = acc_min_##sfx, [loomAvg] = acc_add_##sfx                                       \
    }
#define SIMD_MULTI5(sfx)                                                                           \
    {                                                                                              \
        [loomSum] = multi_sum_##sfx, [loomProd] = multi_prod_##sfx, [loomMax] = multi_max_##sfx,   \
        [loomMin] = multi_min_##sfx, [loomAvg] = multi_avg_##sfx                                   \
    }
#define SIMD_NATIVE_FLOAT_ROW(sfx)                                                                 \
    {                                                                                              \
        .acc = SIMD_ACC4(sfx), .finish = {[loomAvg] = finish_avg_##sfx},                           \
        .multi = SIMD_MULTI5(sfx),                                                                 \
    }
#define SIMD_NARROW_ROW(sfx)                                                                       \
    {                                                                                              \
        .init = init_##sfx, .acc = SIMD_ACC4(sfx),                                                 \
        .finish = {[loomSum] = finish_copy_##sfx,                                                  \
                   [loomProd] = finish_copy_##sfx,                                                 \
                   [loomMax] = finish_copy_##sfx,                                                  \
                   [loomMin] = finish_copy_##sfx,                                                  \
                   [loomAvg] = finish_avg_##sfx},                                                  \
        .multi = SIMD_MULTI5(sfx),                                                                 \
    }
#define SIMD_INT_ROW(wsfx, osfx, prod_acc, prod_multi)                                             \
    {                                                                                              \
        .acc = {[loomSum] = acc_add_##wsfx,                                                        \
                [loomProd] = prod_acc,                                                             \
                [loomMax] = acc_max_##osfx,                                                        \
                [loomMin] = acc_min_##osfx,                                                        \
                [loomAvg] = acc_add_##wsfx},                                                       \
        .multi = {[loomSum] = multi_sum_##wsfx,                                                    \
                  [loomProd] = prod_multi,                                                         \
                  [loomMax] = multi_max_##osfx,                                                    \
                  [loomMin] = multi_min_##osfx},                                                   \
    }

const struct loom_kernel_row SIMD_TABLE[loomNumTypes] = {
    [loomInt8] = SIMD_INT_ROW(u8, i8, NULL, NULL),
    [loomUint8] = SIMD_INT_ROW(u8, u8, NULL, NULL),
    [loomInt32] = SIMD_INT_ROW(u32, i32, acc_mul_u32, multi_prod_u32),
    [loomUint32] = SIMD_INT_ROW(u32, u32, acc_mul_u32, multi_prod_u32),
    [loomInt64] = SIMD_INT_ROW(u64, i64, SIMD_U64_PROD_ACC, SIMD_U64_PROD_MULTI),
    [loomUint64] = SIMD_INT_ROW(u64, u64, SIMD_U64_PROD_ACC, SIMD_U64_PROD_MULTI),
    [loomFloat16] = SIMD_NARROW_ROW(f16),
    [loomFloat32] = SIMD_NATIVE_FLOAT_ROW(f32),
    [loomFloat64] = SIMD_NATIVE_FLOAT_ROW(f64),
    [loomBfloat16] = SIMD_NARROW_ROW(bf16),
    [loomFloat8e4m3] = SIMD_NARROW_ROW(e4m3),
    [loomFloat8e5m2] = SIMD_NARROW_ROW(e5m2),
};

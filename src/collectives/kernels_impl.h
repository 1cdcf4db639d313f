/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_impl.h - what the kernel files share and nothing else includes: the
 * row type of a kernel table (one row per datatype), the per-instruction-set
 * tables, and the scalar element operations (dev_elem.h's, which the device
 * kernels share). The vector files use these same scalar operations for
 * their tails, so a tail element gets exactly the scalar table's bits by
 * construction.
 */
#ifndef LOOM_KERNELS_IMPL_H
#define LOOM_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../device/dev_elem.h"
#include "loom.h"

typedef void (*loom_kinit_fn_t)(void *acc, const void *src, size_t n);
typedef void (*loom_kacc_fn_t)(void *restrict acc, const void *restrict src, size_t n);
typedef void (*loom_kfinish_fn_t)(void *dst, const void *acc, size_t n, int nranks);
typedef void (*loom_kmulti_fn_t)(void *dst, const void *const *srcs, int nsrc, size_t n,
                                 int nranks);

/* One datatype's kernels. In the vector tables only the entries an
 * instruction set improves are set; the dispatcher fills the rest from the
 * table below it. */
struct loom_kernel_row {
    size_t acc_size;                      /* bytes per accumulator element */
    int native;                           /* 1: accumulator type == datatype */
    loom_kinit_fn_t init;                 /* may alias when native */
    loom_kacc_fn_t acc[loomNumOps];       /* avg uses sum */
    loom_kfinish_fn_t finish[loomNumOps]; /* dst == acc, or disjoint (the
                                           * dispatcher sends other overlaps
                                           * to the scalar table) */
    loom_kmulti_fn_t multi[loomNumOps];   /* NULL: blocked init/acc/finish */
};

extern const struct loom_kernel_row loom_kernels_scalar_table[loomNumTypes];
#if defined(__x86_64__)
extern const struct loom_kernel_row loom_kernels_avx2_table[loomNumTypes];
extern const struct loom_kernel_row loom_kernels_avx512_table[loomNumTypes];
#endif

/* ---- Scalar element operations ------------------------------------------ */

/* The accumulate step of each op: dev_elem.h's functions (one definition
 * with the device kernels). Sum and product of the signed integers use the
 * unsigned ones (the same bits modulo 2^bits, no signed overflow); float
 * max/min keep a NaN operand's bits without the FPU. */
#define LOOM_KOPS_UINT(sfx, T)                                                                     \
    static inline T add_##sfx(T a, T b)                                                            \
    {                                                                                              \
        return loom_de_sum_##sfx(a, b);                                                            \
    }                                                                                              \
    static inline T mul_##sfx(T a, T b)                                                            \
    {                                                                                              \
        return loom_de_prod_##sfx(a, b);                                                           \
    }

#define LOOM_KOPS_ORDER(sfx, T)                                                                    \
    static inline T max_##sfx(T a, T b)                                                            \
    {                                                                                              \
        return loom_de_max_##sfx(a, b);                                                            \
    }                                                                                              \
    static inline T min_##sfx(T a, T b)                                                            \
    {                                                                                              \
        return loom_de_min_##sfx(a, b);                                                            \
    }

#define LOOM_KOPS_FLOAT(sfx, T)                                                                    \
    LOOM_KOPS_UINT(sfx, T)                                                                         \
    LOOM_KOPS_ORDER(sfx, T)

LOOM_KOPS_UINT(u8, uint8_t)
LOOM_KOPS_UINT(u32, uint32_t)
LOOM_KOPS_UINT(u64, uint64_t)
LOOM_KOPS_ORDER(i8, int8_t)
LOOM_KOPS_ORDER(u8, uint8_t)
LOOM_KOPS_ORDER(i32, int32_t)
LOOM_KOPS_ORDER(u32, uint32_t)
LOOM_KOPS_ORDER(i64, int64_t)
LOOM_KOPS_ORDER(u64, uint64_t)
LOOM_KOPS_FLOAT(f32, float)
LOOM_KOPS_FLOAT(f64, double)

static inline int loom_kernels_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

#endif

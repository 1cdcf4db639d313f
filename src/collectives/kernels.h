/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels.h - the one place where reductions and dtype conversions run over
 * arrays (a table per datatype x op). Reductions accumulate in the
 * accumulator type: float32 for float16, bfloat16 and fp8; the datatype
 * itself otherwise (integers wrap modulo 2^bits, never undefined behaviour).
 * A reduction over ranks is: init with rank 0's data, acc with ranks 1..n-1
 * in order, finish once (which divides by n for avg and rounds to the
 * datatype). This fixes the order, so results are bitwise reproducible.
 *
 * Float max/min: if either operand is NaN the result is NaN, and it is the
 * accumulator's NaN if that one is NaN, else the incoming one (bits kept, no
 * FPU involved). Otherwise max is "acc > x ? acc : x" (so max(-0, +0) is the
 * incoming operand), min likewise with <. Float sum/prod/avg use the FPU: a
 * NaN operand gives a quiet NaN with that operand's payload; when both are
 * NaN, which of the two payloads survives is the instruction's choice.
 *
 * Each table exists per instruction set (scalar C, AVX2, AVX-512), chosen
 * once at first use from LOOM_KERNELS; every one gives the scalar table's bits
 * (the double-NaN case above aside). Pointers must be aligned to their
 * element type, nothing more.
 *
 * These are internal: callers validate dt and op first. An invalid dt or op
 * makes a call do nothing (no write, no crash) rather than fail.
 */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes per accumulator element for dt (4 for 8/16-bit floats); 0 if invalid. */
size_t loom_acc_size(loomDataType_t dt);
/* 1 if the accumulator type equals the datatype (acc may then alias the output). */
int loom_acc_is_native(loomDataType_t dt);

/* acc[i] = (acc type) src[i], i < n. acc and src may alias when native. */
void loom_reduce_init(loomDataType_t dt, void *acc, const void *src, size_t n);
/* acc[i] = acc[i] op (acc type) src[i]. For avg the op is sum. acc and src
 * must not overlap. */
void loom_reduce_acc(loomDataType_t dt, loomRedOp_t op, void *acc, const void *src, size_t n);
/* dst[i] = (dt) (acc[i] / nranks for avg, else acc[i]). dst and acc may alias
 * (the same address; for a non-native dt the results then occupy the first
 * n * loom_dtype_size(dt) bytes); other overlaps are not allowed. Integer avg
 * is C's truncating division of the wrapped sum in the datatype's signedness.
 * nranks < 1 is taken as 1. */
void loom_reduce_finish(loomDataType_t dt, loomRedOp_t op, void *dst, const void *acc, size_t n,
                        int nranks);
/* The whole reduction in one pass over memory, without an accumulator array:
 * dst = finish(init(srcs[0]) op srcs[1] op ... op srcs[nsrc-1]) with nranks
 * as in loom_reduce_finish, bit for bit what that sequence gives. Works in
 * blocks small enough to keep the accumulators in registers or L1. dst may
 * be one of the sources (the same address: in place, whichever rank's data
 * it holds); no other overlap between dst and a source.
 * Sources may overlap each other. nsrc < 1 or srcs == NULL does nothing. */
void loom_reduce_multi(loomDataType_t dt, loomRedOp_t op, void *dst, const void *const *srcs,
                       int nsrc, size_t n, int nranks);

/* ---- Instruction sets ------------------------------------------------------ */

typedef enum {
    LOOM_KERNELS_SCALAR = 0, /* portable C; the reference for the others */
    LOOM_KERNELS_AVX2 = 1,   /* x86-64 AVX2 + F16C */
    LOOM_KERNELS_AVX512 = 2, /* x86-64 AVX-512 F/BW/VL/DQ (+ AVX2, F16C) */
    LOOM_KERNELS_NUM_ISA = 3
} loom_kernels_isa_t;

/* "scalar", "avx2", "avx512"; "invalid" otherwise; never NULL. */
const char *loom_kernels_isa_name(loom_kernels_isa_t isa);
/* 1 if this build has the instruction set's kernels and this CPU and OS can
 * run them; scalar always. */
int loom_kernels_isa_available(loom_kernels_isa_t isa);
/* The instruction set for a LOOM_KERNELS value: NULL, "" and "auto" give the
 * best available; a name (any case) gives that set if available. An unknown
 * name, or a set this machine lacks, gives a WARN and the best available. */
loom_kernels_isa_t loom_kernels_choose(const char *request);
/* The instruction set loom_reduce_* use now. The first call of this or of any
 * loom_reduce_* function picks it from LOOM_KERNELS (loom_kernels_choose). */
loom_kernels_isa_t loom_kernels_isa(void);
/* Makes every later loom_reduce_* call use isa (tests, benchmarks). Calls
 * already running finish with the previous set. loomInvalidArgument with a
 * WARN if isa is not available. */
loomResult_t loom_kernels_use(loom_kernels_isa_t isa);

#ifdef __cplusplus
}
#endif

#endif

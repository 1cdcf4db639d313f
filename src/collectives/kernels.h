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
 * incoming operand), min likewise with <.
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

#ifdef __cplusplus
}
#endif

#endif

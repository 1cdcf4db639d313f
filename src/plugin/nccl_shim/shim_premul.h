/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_premul.h - ncclRedOpCreatePreMulSum's operators on loom: a per
 * communicator list of dynamic op ids (from ncclNumOps up, as NCCL numbers
 * them) with their scalar, and the scaling each rank applies to its input
 * before loom sums it.
 *
 * Scaling semantics (one rounding per element): float32 and float64 multiply
 * in their own type; float16, bfloat16 and both fp8 formats widen the element
 * and the scalar to float32, multiply once and round back once (loom's own
 * conversions: nearest even, fp8 saturating); the integer types multiply in
 * their own width, wrapping as unsigned arithmetic does (two's complement).
 */
#ifndef LOOM_NCCL_SHIM_PREMUL_H
#define LOOM_NCCL_SHIM_PREMUL_H

#include <stddef.h>

#include "shim_comm.h"

struct shim_premul {
    int id;
    ncclDataType_t datatype;
    ncclScalarResidence_t residence;
    unsigned char value[8]; /* ncclScalarHostImmediate: the scalar, read at creation */
    const void *ptr;        /* ncclScalarDevice: where the scalar is read at each call */
    struct shim_premul *next;
};

/* Size in bytes of an NCCL datatype; 0 if invalid. */
size_t shim_dtype_size(ncclDataType_t datatype);

/* Records an op on c. id < 0: the lowest free id from ncclNumOps; else that
 * id (route mode: the real library's, so that both backends agree). */
ncclResult_t shim_premul_create(shim_comm_t *c, int id, void *scalar, ncclDataType_t datatype,
                                ncclScalarResidence_t residence, ncclRedOp_t *op);
/* Forgets op; InvalidArgument if c has no such op. */
ncclResult_t shim_premul_destroy(shim_comm_t *c, ncclRedOp_t op);
/* A copy of op for a call of datatype; InvalidArgument (named by fn) if c has
 * no such op or it was made for another datatype. */
ncclResult_t shim_premul_get(shim_comm_t *c, ncclRedOp_t op, ncclDataType_t datatype,
                             const char *fn, shim_premul_t *out);
/* dst[i] = scalar * src[i] for i < count, the scalar read now. */
void shim_premul_scale(const shim_premul_t *op, const void *src, void *dst, size_t count);
/* Frees every op of c (when c is freed). */
void shim_premul_free_all(shim_comm_t *c);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_premul.c - PreMulSum operators and their scaling (shim_premul.h). The
 * sizes and the narrow float formats' conversions are loom's (dtype.c, linked in), so a
 * scaled input is bitwise what a loom user widening, multiplying and rounding
 * with loom's rules gets.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "shim_premul.h"

/* NCCL numbers its datatypes as loom does (loom.h says so). */
_Static_assert((int)ncclBfloat16 == (int)loomBfloat16 &&
                   (int)ncclFloat8e5m2 == (int)loomFloat8e5m2 &&
                   (int)ncclNumTypes == (int)loomNumTypes,
               "NCCL's and loom's datatype numbers differ");

size_t shim_dtype_size(ncclDataType_t datatype)
{
    return loom_dtype_size((loomDataType_t)datatype);
}

#define SCALE_UINT(type)                                                                           \
    do {                                                                                           \
        type s_, x_;                                                                               \
        memcpy(&s_, scalar, sizeof(s_));                                                           \
        for (size_t i = 0; i < count; i++) {                                                       \
            memcpy(&x_, (const char *)src + i * sizeof(x_), sizeof(x_));                           \
            x_ = (type)(x_ * s_);                                                                  \
            memcpy((char *)dst + i * sizeof(x_), &x_, sizeof(x_));                                 \
        }                                                                                          \
    } while (0)

#define SCALE_NARROW(type, decode, encode)                                                         \
    do {                                                                                           \
        type s_, x_;                                                                               \
        memcpy(&s_, scalar, sizeof(s_));                                                           \
        const float sf_ = decode(s_);                                                              \
        for (size_t i = 0; i < count; i++) {                                                       \
            memcpy(&x_, (const char *)src + i * sizeof(x_), sizeof(x_));                           \
            x_ = encode(decode(x_) * sf_);                                                         \
            memcpy((char *)dst + i * sizeof(x_), &x_, sizeof(x_));                                 \
        }                                                                                          \
    } while (0)

void shim_premul_scale(const shim_premul_t *op, const void *src, void *dst, size_t count)
{
    const void *scalar = op->residence == ncclScalarHostImmediate ? op->value : op->ptr;
    switch (op->datatype) {
    case ncclInt8: /* signed types wrap as unsigned arithmetic does: no overflow UB */
    case ncclUint8:
        SCALE_UINT(uint8_t);
        break;
    case ncclInt32:
    case ncclUint32:
        /* uint32_t promotes to unsigned int, never to int: the product wraps. */
        SCALE_UINT(uint32_t);
        break;
    case ncclInt64:
    case ncclUint64:
        SCALE_UINT(uint64_t);
        break;
    case ncclFloat32:
        SCALE_UINT(float);
        break;
    case ncclFloat64:
        SCALE_UINT(double);
        break;
    case ncclFloat16:
        SCALE_NARROW(uint16_t, loom_f16_decode, loom_f16_encode);
        break;
    case ncclBfloat16:
        SCALE_NARROW(uint16_t, loom_bf16_decode, loom_bf16_encode);
        break;
    case ncclFloat8e4m3:
        SCALE_NARROW(uint8_t, loom_e4m3_decode, loom_e4m3_encode);
        break;
    case ncclFloat8e5m2:
        SCALE_NARROW(uint8_t, loom_e5m2_decode, loom_e5m2_encode);
        break;
    default:
        break; /* the datatype was checked when the op was made */
    }
}

ncclResult_t shim_premul_create(shim_comm_t *c, int id, void *scalar, ncclDataType_t datatype,
                                ncclScalarResidence_t residence, ncclRedOp_t *op)
{
    shim_premul_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return shim_fail(ncclSystemError, "ncclRedOpCreatePreMulSum: out of memory");
    p->datatype = datatype;
    p->residence = residence;
    if (residence == ncclScalarHostImmediate)
        memcpy(p->value, scalar, shim_dtype_size(datatype));
    else
        p->ptr = scalar;
    pthread_mutex_lock(&c->lock);
    if (id < 0) {
        /* The lowest id no live op of c has, as NCCL numbers them: ranks that create and
         * destroy ops in the same order (as every rank must) get the same ids. */
        id = ncclNumOps;
        for (;;) {
            const shim_premul_t *q = c->premul;
            while (q != NULL && q->id != id)
                q = q->next;
            if (q == NULL)
                break;
            id++;
        }
    }
    p->id = id;
    p->next = c->premul;
    c->premul = p;
    pthread_mutex_unlock(&c->lock);
    *op = (ncclRedOp_t)id;
    return ncclSuccess;
}

ncclResult_t shim_premul_destroy(shim_comm_t *c, ncclRedOp_t op)
{
    pthread_mutex_lock(&c->lock);
    shim_premul_t **pp = &c->premul;
    while (*pp != NULL && (*pp)->id != (int)op)
        pp = &(*pp)->next;
    shim_premul_t *p = *pp;
    if (p != NULL)
        *pp = p->next;
    pthread_mutex_unlock(&c->lock);
    if (p == NULL)
        return shim_fail(ncclInvalidArgument,
                         "ncclRedOpDestroy: op %d is not a PreMulSum op of communicator %p "
                         "(destroyed already, or made on another communicator)",
                         (int)op, (void *)c->handle);
    free(p);
    return ncclSuccess;
}

ncclResult_t shim_premul_get(shim_comm_t *c, ncclRedOp_t op, ncclDataType_t datatype,
                             const char *fn, shim_premul_t *out)
{
    pthread_mutex_lock(&c->lock);
    const shim_premul_t *p = c->premul;
    while (p != NULL && p->id != (int)op)
        p = p->next;
    if (p != NULL)
        *out = *p;
    pthread_mutex_unlock(&c->lock);
    if (p == NULL)
        return shim_fail(ncclInvalidArgument,
                         "%s: op %d is neither a built-in op nor a live PreMulSum op of "
                         "communicator %p",
                         fn, (int)op, (void *)c->handle);
    if (out->datatype != datatype)
        return shim_fail(ncclInvalidArgument,
                         "%s: PreMulSum op %d was made for datatype %d, the call has datatype %d",
                         fn, (int)op, (int)out->datatype, (int)datatype);
    out->next = NULL;
    return ncclSuccess;
}

void shim_premul_free_all(shim_comm_t *c)
{
    while (c->premul != NULL) {
        shim_premul_t *p = c->premul;
        c->premul = p->next;
        free(p);
    }
}

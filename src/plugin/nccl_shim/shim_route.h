/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_route.h - which backend a call goes to: the rule list of
 * LOOM_NCCL_ROUTE (or the default rules) applied to a description of the
 * call. The decision is a pure function of values that are equal on every
 * rank (the communicator's size and host count fixed at init, the
 * collective, datatype, op, byte count, group and capture state, whether the
 * buffers are device memory - the same kind on every rank of an SPMD program
 * - and what loom's device path, agreed at init, does with them), never of
 * timing, pointers or history, so that every rank of a communicator decides
 * alike: a call sent to loom on one rank and to NCCL on another would hang.
 */
#ifndef LOOM_NCCL_SHIM_ROUTE_H
#define LOOM_NCCL_SHIM_ROUTE_H

#include <nccl.h>
#include <stddef.h>

typedef enum { SHIM_TO_NCCL, SHIM_TO_LOOM, SHIM_TO_ECHO } shim_target_t;

typedef enum {
    SHIM_COLL_ALLREDUCE,
    SHIM_COLL_ALLGATHER,
    SHIM_COLL_REDUCESCATTER,
    SHIM_COLL_BROADCAST, /* ncclBcast too */
    SHIM_COLL_REDUCE,
    SHIM_COLL_ALLTOALL,
    SHIM_COLL_GATHER,
    SHIM_COLL_SCATTER,
    SHIM_COLL_SEND,
    SHIM_COLL_RECV,
    SHIM_NUM_COLLS
} shim_coll_t;

/* What the rules may look at. Every field must be equal on every rank of the
 * communicator for the same call. */
typedef struct {
    shim_coll_t coll;
    ncclDataType_t datatype;
    int op;             /* ncclRedOp_t for reductions (ncclNumOps and above: a
                           PreMulSum op), -1 for the others */
    size_t bytes;       /* the call's count argument x datatype size */
    int nranks;         /* ranks of the communicator */
    int hosts;          /* hosts the communicator spans (measured at init) */
    const char *name;   /* ncclConfig_t.commName, or NULL */
    int in_group;       /* issued between ncclGroupStart and ncclGroupEnd */
    int device_buffers; /* a buffer is CUDA device memory */
    int paired;         /* route mode: the communicator has a real NCCL side */
    int capturing;      /* the stream is being captured into a CUDA graph */
    /* With device buffers: what loom's side of the communicator can do with
     * them (loomCommDeviceRuntime, loomCommDevicePlan: fixed at its creation,
     * equal on every rank). */
    int loom_device;      /* loom's communicator has a device path */
    int loom_device_coll; /* one of its transports runs this call */
    int loom_capturable;  /* that transport may be captured into a CUDA graph */
    const char *loom_why; /* why not, for the reason (may be NULL) */
} shim_call_t;

typedef struct shim_rules shim_rules_t;

/* Parses a rule list (grammar in docs/nccl-plugins.md). On a syntax error
 * returns ncclInvalidArgument and writes a message naming the rule and the
 * offending text into err. */
ncclResult_t shim_rules_parse(const char *text, shim_rules_t **rules, char *err, size_t errlen);
void shim_rules_free(shim_rules_t *rules);
/* The rules used when LOOM_NCCL_ROUTE is unset: bf16/fp16 sum AllReduce of
 * at least 1 MiB on a 2-8-rank one-host communicator goes to Echo when echo
 * is nonzero (LOOM_NCCL_ECHO=1), else to loom; everything else to NCCL. */
const shim_rules_t *shim_rules_default(int echo);
/* The rule list in canonical form (for the trace and the INFO line). */
const char *shim_rules_text(const shim_rules_t *rules);

/* The backend for call. Besides the rules, fixed constraints apply and win
 * (docs/nccl-plugins.md, "Fixed constraints"): Send/Recv and every call
 * inside a group go to NCCL, so that a group or a pair of peers is never
 * split across backends; device buffers go to NCCL where loom's side has no
 * device path, and for a PreMulSum op (loom scales its input on the host);
 * Echo takes only sum AllReduce of float32/float16/bfloat16 (else the call
 * goes to loom); a call the rules give to loom goes to NCCL when its device
 * buffers have no transport there, or when its stream is being captured and
 * loom would not run it on a transport a CUDA graph can capture (host
 * buffers never are; Echo never is). In loom mode the caller treats NCCL as
 * loom. why (may be NULL) receives a short reason: the rule that matched,
 * or the constraint. */
shim_target_t shim_route_decide(const shim_rules_t *rules, const shim_call_t *call, char *why,
                                size_t whylen);
const char *shim_target_name(shim_target_t target);
const char *shim_coll_name(shim_coll_t coll);
/* The rules' own spellings of a datatype and an op (for the trace, so that
 * its lines read as rules do): "fp16", "bf16", ...; "sum", ..., "premulsum"
 * for a created op, "none" for op < 0. */
const char *shim_dtype_name(ncclDataType_t datatype);
const char *shim_op_name(int op);

#endif

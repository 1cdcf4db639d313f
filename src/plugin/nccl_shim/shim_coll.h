/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_coll.h - one collective or point-to-point call as the shim handles it
 * (shim_impl_coll.c), and what the group code needs of it: in loom mode the
 * calls made between ncclGroupStart and ncclGroupEnd are recorded, then
 * issued inside one loomGroupStart/End at the outermost ncclGroupEnd (after
 * the inits deferred in the same group), or dropped by ncclGroupSimulateEnd.
 */
#ifndef LOOM_NCCL_SHIM_COLL_H
#define LOOM_NCCL_SHIM_COLL_H

#include "shim_comm.h"
#include "shim_premul.h"
#include "shim_route.h"

typedef struct {
    shim_coll_t coll;
    int bcast; /* ncclBcast (in place) rather than ncclBroadcast */
    const char *fn;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    ncclDataType_t datatype;
    int op; /* ncclRedOp_t of a reduction, -1 otherwise */
    int root, peer;
    cudaStream_t stream;
    /* Filled once the call is the shim's. */
    int device;        /* a buffer is CUDA device memory: loom's device path runs it */
    shim_comm_t *comm; /* held while the op is recorded */
    shim_target_t target;
    int premul; /* op is a PreMulSum op, copied into pm */
    shim_premul_t pm;
} shim_op_t;

/* Issues recorded ops (loom mode) inside one loom group; drops their
 * references. Returns the first failure. */
ncclResult_t shim_ops_replay(shim_op_t *ops, int n);
/* Drops recorded ops without running them; when sim is not NULL and every
 * op is one loomCommPlan models, sets sim->estimatedTime to the sum of its
 * predictions (microseconds), else leaves it as it was. */
void shim_ops_discard(shim_op_t *ops, int n, ncclSimInfo_t *sim);

#endif

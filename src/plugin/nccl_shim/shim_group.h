/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_group.h - the shim's own per-thread group state (shim_impl_group.c):
 * its nesting depth, the inits deferred to the outermost ncclGroupEnd, and in
 * loom mode the calls recorded until then.
 */
#ifndef LOOM_NCCL_SHIM_GROUP_H
#define LOOM_NCCL_SHIM_GROUP_H

#include "shim_coll.h"
#include "shim_init.h"

/* ncclGroupStart calls not yet ended on the calling thread. */
int shim_group_depth(void);
/* Defers job to the outermost ncclGroupEnd; blocking says whether that
 * GroupEnd waits for it (else it starts it on a thread and returns
 * ncclInProgress). On failure the job is dropped. */
ncclResult_t shim_group_defer(shim_job_t *job, int blocking);
/* Records a copy of op (loom mode); the record takes over op->comm's reference. */
ncclResult_t shim_group_record(const shim_op_t *op);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_comm.h - what comm.c, rows.c, verify.c and step.c share about communicators: the
 * check of a communicator against a plan, and the Rows layout's padded, even collectives
 * (rows.c), which copy through a staging buffer and so finish before they return.
 */
#ifndef LOOM_SHARD_COMM_H
#define LOOM_SHARD_COMM_H

#include "shard_plan.h"

/* comm must be non-NULL (InvalidArgument) and have the plan's rank count (InvalidUsage);
 * *rank gets the caller's rank in it. */
loomResult_t shard_check_comm(const struct loomShardPlan *p, loomComm_t comm, int *rank,
                              const char *fn);

/* Buckets [b0, b1) of the Rows layout. reduce: one even ReduceScatter per bucket of the
 * padded row chunks of grads (the full buffer), the rank's rows landing in out (its shard, or
 * the full buffer when in_place). gather: the rank's rows from src (shard, or the full buffer
 * when in_place) gathered into every rank's full buffer by one even AllGather per bucket.
 * Both add their payload to *c. */
loomResult_t shard_rows_reduce(const struct loomShardPlan *p, int rank, int b0, int b1,
                               const float *grads, float *out, int in_place, loomRedOp_t op,
                               loomComm_t comm, loomStream_t stream, loomShardCounters_t *c);
loomResult_t shard_rows_gather(const struct loomShardPlan *p, int rank, int b0, int b1,
                               const float *src, float *full, int in_place, loomComm_t comm,
                               loomStream_t stream, loomShardCounters_t *c);

#endif

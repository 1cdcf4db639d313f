/* SPDX-License-Identifier: Apache-2.0
 *
 * rows.c - the Rows layout's collectives (FSDP2's Shard(0)): each parameter split into row
 * chunks of ceil(rows/P), every rank's chunk padded to chunk x cols so that one even
 * loomReduceScatter or loomAllGather per bucket moves a whole bucket, as FSDP2's per-unit
 * collectives do. The staging copies need the data on the host, so with a stream these calls
 * wait for it before copying in and after the collectives before copying out.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard_comm.h"

/* One rank's block of bucket b in staging order (the plan order: matrices, then element-wise
 * parameters): copies rank q's rows between the block and the full buffer, or (shard != NULL)
 * between the block and the rank's shard. to_block: full/shard -> block, padding zeroed. */
static void block_copy(const struct loomShardPlan *p, int b, int q, float *blk, float *full,
                       float *shard, int to_block)
{
    const shard_bucket_t *bk = &p->buckets[b];
    size_t at = p->segs[b * p->nranks + q].shard_off;
    for (int k = bk->first; k < bk->end; k++) {
        const int i = p->order[k];
        const shard_param_t *x = &p->params[i];
        size_t row0, nrows;
        shard_rows_range(p, i, q, &row0, &nrows);
        const size_t n = nrows * x->cols, padded = x->chunk * x->cols;
        float *there = shard != NULL ? shard + at : full + x->offset + row0 * x->cols;
        if (to_block) {
            memcpy(blk, there, n * sizeof(float));
            memset(blk + n, 0, (padded - n) * sizeof(float));
        } else {
            memcpy(there, blk, n * sizeof(float));
        }
        blk += padded;
        at += n;
    }
}

static float *staging(const struct loomShardPlan *p, int b0, int b1, const char *fn)
{
    size_t n = 0;
    for (int b = b0; b < b1; b++)
        n += p->buckets[b].blk * (size_t)p->nranks;
    float *s = malloc((n > 0 ? n : 1) * sizeof(float));
    if (s == NULL)
        LOOM_WARN("%s: out of memory for a staging buffer of %zu floats", fn, n);
    return s;
}

static loomResult_t sync_stream(loomStream_t stream)
{
    return stream != NULL ? loomStreamSynchronize(stream) : loomSuccess;
}

/* Issues one even collective per bucket of [b0, b1) in one group: a ReduceScatter (in place,
 * into the rank's block) or an AllGather (in place, from it). */
static loomResult_t rows_group(const struct loomShardPlan *p, int rank, int b0, int b1,
                               float *stage, int gather, loomRedOp_t op, loomComm_t comm,
                               loomStream_t stream, loomShardCounters_t *c)
{
    loomResult_t res = loomGroupStart();
    if (res != loomSuccess)
        return res;
    float *at = stage;
    for (int b = b0; b < b1 && res == loomSuccess; b++) {
        const size_t blk = p->buckets[b].blk;
        if (blk == 0)
            continue;
        if (gather)
            res = loomAllGather(at + (size_t)rank * blk, at, blk, loomFloat32, comm, stream);
        else
            res =
                loomReduceScatter(at, at + (size_t)rank * blk, blk, loomFloat32, op, comm, stream);
        c->bytes_sent += 4 * (uint64_t)(p->nranks - 1) * blk;
        c->bytes_recv += 4 * (uint64_t)(p->nranks - 1) * blk;
        at += blk * (size_t)p->nranks;
    }
    loomResult_t end = loomGroupEnd();
    res = res != loomSuccess ? res : end;
    return res != loomSuccess ? res : sync_stream(stream);
}

loomResult_t shard_rows_reduce(const struct loomShardPlan *p, int rank, int b0, int b1,
                               const float *grads, float *out, int in_place, loomRedOp_t op,
                               loomComm_t comm, loomStream_t stream, loomShardCounters_t *c)
{
    float *stage = staging(p, b0, b1, "loomShardReduceGrads");
    if (stage == NULL)
        return loomSystemError;
    loomResult_t res = sync_stream(stream);
    float *at = stage;
    for (int b = b0; b < b1 && res == loomSuccess; b++) {
        for (int q = 0; q < p->nranks; q++)
            block_copy(p, b, q, at + (size_t)q * p->buckets[b].blk, (float *)grads, NULL, 1);
        at += p->buckets[b].blk * (size_t)p->nranks;
    }
    if (res == loomSuccess)
        res = rows_group(p, rank, b0, b1, stage, 0, op, comm, stream, c);
    at = stage;
    for (int b = b0; b < b1 && res == loomSuccess; b++) {
        block_copy(p, b, rank, at + (size_t)rank * p->buckets[b].blk, out, in_place ? NULL : out,
                   0);
        at += p->buckets[b].blk * (size_t)p->nranks;
    }
    free(stage);
    return res;
}

loomResult_t shard_rows_gather(const struct loomShardPlan *p, int rank, int b0, int b1,
                               const float *src, float *full, int in_place, loomComm_t comm,
                               loomStream_t stream, loomShardCounters_t *c)
{
    float *stage = staging(p, b0, b1, "loomShardGatherParams");
    if (stage == NULL)
        return loomSystemError;
    loomResult_t res = sync_stream(stream);
    float *at = stage;
    for (int b = b0; b < b1 && res == loomSuccess; b++) {
        block_copy(p, b, rank, at + (size_t)rank * p->buckets[b].blk, full,
                   in_place ? NULL : (float *)src, 1);
        at += p->buckets[b].blk * (size_t)p->nranks;
    }
    if (res == loomSuccess)
        res = rows_group(p, rank, b0, b1, stage, 1, loomSum, comm, stream, c);
    at = stage;
    for (int b = b0; b < b1 && res == loomSuccess; b++) {
        for (int q = 0; q < p->nranks; q++)
            block_copy(p, b, q, at + (size_t)q * p->buckets[b].blk, full, NULL, 0);
        at += p->buckets[b].blk * (size_t)p->nranks;
    }
    free(stage);
    return res;
}

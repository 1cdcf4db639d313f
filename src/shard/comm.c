/* SPDX-License-Identifier: Apache-2.0
 *
 * comm.c - loomShardReduceGrads and loomShardGatherParams (docs/shard.md, Communication).
 * Owner: per bucket one loomReduceScatterV over the matrix region (rank r's block is M(b,r))
 * and one over the element-wise region (E(b,r)), the buckets of one call in one group; the
 * gather is the same with loomAllGatherV. Replicated: one loomAllReduce per bucket. Rows:
 * rows.c. The V collectives queue on the caller's stream like any collective; the agreement
 * of `agree` needs the status, so it waits for the stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "param.h"
#include "shard_comm.h"
#include "timer.h"

loomResult_t shard_check_comm(const struct loomShardPlan *p, loomComm_t comm, int *rank,
                              const char *fn)
{
    int n = 0;
    if (comm == NULL) {
        LOOM_WARN("%s: comm is NULL", fn);
        return loomInvalidArgument;
    }
    LOOM_CHECK(loomCommCount(comm, &n));
    LOOM_CHECK(loomCommUserRank(comm, rank));
    if (n != p->nranks) {
        LOOM_WARN("%s: comm has %d ranks but the plan was built for %d", fn, n, p->nranks);
        return loomInvalidUsage;
    }
    return loomSuccess;
}

/* The checks of both calls, before any communication. */
static loomResult_t check_call(const struct loomShardPlan *p, int bucket, const void *full,
                               const void *shard, loomDataType_t dt, loomComm_t comm, int *rank,
                               const char *fn)
{
    LOOM_CHECK(shard_check_plan(p, fn));
    LOOM_CHECK(shard_check_dtype(dt, fn));
    LOOM_CHECK(shard_check_bucket(p, bucket, fn));
    LOOM_CHECK(shard_check_comm(p, comm, rank, fn));
    if (full == NULL || (shard == NULL && p->shard_elems[*rank] > 0)) {
        LOOM_WARN("%s: rank %d: full buffer %p (%zu elements) or shard %p (%zu elements) is NULL",
                  fn, *rank, full, p->total, shard, p->shard_elems[*rank]);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* The counts of one region of bucket b: rank r's block and where it starts in the region. */
static void region_counts(const struct loomShardPlan *p, int b, int elementwise, size_t *counts,
                          size_t *displs)
{
    const size_t base = elementwise ? p->segs[b * p->nranks].e_start : p->buckets[b].off;
    for (int r = 0; r < p->nranks; r++) {
        const shard_seg_t *s = &p->segs[b * p->nranks + r];
        counts[r] = elementwise ? s->e_len : s->m_len;
        displs[r] = (elementwise ? s->e_start : s->m_start) - base;
    }
}

/* The even split a payload count uses for AllReduce (reduce-scatter then all-gather). */
static size_t even_piece(size_t n, int r, int P)
{
    return (size_t)((unsigned __int128)n * (unsigned)(r + 1) / (unsigned)P) -
           (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)P);
}

static void count_v(loomShardCounters_t *c, size_t region, size_t mine, int P, int gather)
{
    const uint64_t out = 4 * (uint64_t)(region - mine), in = 4 * (uint64_t)(P - 1) * mine;
    c->bytes_sent += gather ? in : out;
    c->bytes_recv += gather ? out : in;
}

typedef struct {
    const struct loomShardPlan *p;
    int rank, b0, b1;
    const float *src;
    float *dst;
    int in_place;
    loomComm_t comm;
    loomStream_t stream;
    size_t *counts, *displs;
    loomShardCounters_t *c;
} call_t;

/* Owner: the V collectives of buckets [b0, b1), inside the caller's group; per bucket the
 * matrix region, then the element-wise one. The full buffer is src when reducing, dst when
 * gathering; the rank's part is in it (in place) or in its shard. */
static loomResult_t owner_regions(const call_t *a, int gather, loomRedOp_t op)
{
    const struct loomShardPlan *p = a->p;
    for (int b = a->b0; b < a->b1; b++)
        for (int ew = 0; ew < 2; ew++) {
            const shard_seg_t *s = &p->segs[b * p->nranks + a->rank];
            const size_t region = ew ? p->buckets[b].e_elems : p->buckets[b].m_elems;
            if (region == 0)
                continue;
            region_counts(p, b, ew, a->counts, a->displs);
            const size_t base = ew ? p->segs[b * p->nranks].e_start : p->buckets[b].off;
            const size_t mine_full = ew ? s->e_start : s->m_start;
            const size_t mine_shard = s->shard_off + (ew ? s->m_len : 0);
            const size_t n = a->counts[a->rank];
            if (gather)
                LOOM_CHECK(loomAllGatherV(a->in_place ? a->dst + mine_full : a->src + mine_shard, n,
                                          a->dst + base, a->counts, a->displs, loomFloat32, a->comm,
                                          a->stream));
            else
                LOOM_CHECK(loomReduceScatterV(a->src + base,
                                              a->dst + (a->in_place ? mine_full : mine_shard),
                                              a->counts, loomFloat32, op, a->comm, a->stream));
            count_v(a->c, region, n, p->nranks, gather);
        }
    return loomSuccess;
}

static loomResult_t replicated_reduce(const call_t *a, loomRedOp_t op)
{
    const struct loomShardPlan *p = a->p;
    for (int b = a->b0; b < a->b1; b++) {
        const shard_bucket_t *bk = &p->buckets[b];
        const size_t n = bk->m_elems + bk->e_elems, mine = even_piece(n, a->rank, p->nranks);
        if (n == 0)
            continue;
        LOOM_CHECK(loomAllReduce(a->src + bk->off, a->dst + bk->off, n, loomFloat32, op, a->comm,
                                 a->stream));
        count_v(a->c, n, mine, p->nranks, 0);
        count_v(a->c, n, mine, p->nranks, 1);
    }
    return loomSuccess;
}

/* Runs the calls of one layout in one group; GroupEnd runs even when recording failed. */
static loomResult_t grouped(const call_t *a, int gather, loomRedOp_t op)
{
    loomResult_t res = loomGroupStart();
    if (res != loomSuccess)
        return res;
    if (a->p->cfg.layout == loomShardOwner)
        res = owner_regions(a, gather, op);
    else
        res = replicated_reduce(a, op);
    loomResult_t end = loomGroupEnd();
    return res != loomSuccess ? res : end;
}

/* agree: every rank learns whether every rank succeeded (a MIN over one int32). A rank that
 * failed takes part too, so that ranks whose own blocks arrived are told at once rather than at
 * their timeout; its own first error stays its last error. */
static loomResult_t agree(loomResult_t res, loomComm_t comm, loomStream_t stream, int rank)
{
    if (res == loomSuccess && stream != NULL)
        res = loomStreamSynchronize(stream);
    char first[1024] = "";
    if (res != loomSuccess)
        snprintf(first, sizeof(first), "%s", loom_last_error());
    int32_t ok = res == loomSuccess, all = 0;
    loomResult_t r = loomAllReduce(&ok, &all, 1, loomInt32, loomMin, comm, NULL);
    if (res != loomSuccess) {
        loom_set_last_error("%s", first);
        return res;
    }
    if (r != loomSuccess)
        return r;
    if (all == 0) {
        LOOM_WARN("loomShardReduceGrads: rank %d: another rank failed its part, so no rank "
                  "keeps these gradients (agree)",
                  rank);
        return loomRemoteError;
    }
    return loomSuccess;
}

/* Fills a call of buckets `bucket` (-1: all) from src to dst; close it with call_close. */
static loomResult_t call_open(call_t *a, const struct loomShardPlan *p, int bucket, int rank,
                              const void *src, void *dst, loomComm_t comm, loomStream_t stream,
                              loomShardCounters_t *c, const char *fn)
{
    size_t *counts = malloc(2 * (size_t)p->nranks * sizeof(size_t));
    if (counts == NULL) {
        LOOM_WARN("%s: out of memory for %d counts", fn, 2 * p->nranks);
        return loomSystemError;
    }
    memset(c, 0, sizeof(*c));
    a->p = p;
    a->rank = rank;
    a->b0 = bucket < 0 ? 0 : bucket;
    a->b1 = bucket < 0 ? p->nbuckets : bucket + 1;
    a->src = src;
    a->dst = dst;
    a->in_place = src == dst;
    a->comm = comm;
    a->stream = stream;
    a->counts = counts;
    a->displs = counts + p->nranks;
    a->c = c;
    return loomSuccess;
}

static void call_close(call_t *a, uint64_t t0)
{
    free(a->counts);
    a->c->comm_seconds = (double)(loom_now_ns() - t0) * 1e-9;
    shard_count((struct loomShardPlan *)a->p, a->c);
}

LOOM_API loomResult_t loomShardReduceGrads(loomShardPlan_t plan, int bucket, const void *grads_full,
                                           void *grad_shard, loomDataType_t datatype,
                                           loomRedOp_t op, loomComm_t comm, loomStream_t stream)
{
    static const char fn[] = "loomShardReduceGrads";
    int rank = -1;
    LOOM_CHECK(check_call(plan, bucket, grads_full, grad_shard, datatype, comm, &rank, fn));
    if (op != loomSum && op != loomAvg) {
        LOOM_WARN("%s: op %d: only loomSum and loomAvg", fn, (int)op);
        return loomInvalidArgument;
    }
    if (plan->cfg.deterministic && loom_param_DETERMINISTIC() == 0) {
        LOOM_WARN("%s: the plan's config has deterministic = 1 but LOOM_DETERMINISTIC is 0, so "
                  "reductions may not add the ranks in order: set one or the other",
                  fn);
        return loomInvalidUsage;
    }
    const uint64_t t0 = loom_now_ns();
    loomShardCounters_t c;
    call_t a;
    LOOM_CHECK(call_open(&a, plan, bucket, rank, grads_full, grad_shard, comm, stream, &c, fn));
    loomResult_t res;
    if (plan->cfg.layout == loomShardRows)
        res = shard_rows_reduce(plan, rank, a.b0, a.b1, grads_full, grad_shard, a.in_place, op,
                                comm, stream, &c);
    else
        res = grouped(&a, 0, op);
    if (plan->cfg.agree)
        res = agree(res, comm, stream, rank);
    c.reduce_calls = 1;
    call_close(&a, t0);
    return res;
}

LOOM_API loomResult_t loomShardGatherParams(loomShardPlan_t plan, int bucket,
                                            const void *param_shard, void *params_full,
                                            loomDataType_t datatype, loomComm_t comm,
                                            loomStream_t stream)
{
    static const char fn[] = "loomShardGatherParams";
    int rank = -1;
    LOOM_CHECK(check_call(plan, bucket, params_full, param_shard, datatype, comm, &rank, fn));
    const uint64_t t0 = loom_now_ns();
    loomShardCounters_t c;
    call_t a;
    LOOM_CHECK(call_open(&a, plan, bucket, rank, param_shard, params_full, comm, stream, &c, fn));
    loomResult_t res = loomSuccess;
    if (plan->cfg.layout == loomShardRows) {
        res = shard_rows_gather(plan, rank, a.b0, a.b1, param_shard, params_full, a.in_place, comm,
                                stream, &c);
    } else if (plan->cfg.layout == loomShardOwner) {
        res = grouped(&a, 1, loomSum);
    } else if (!a.in_place) {
        /* Replicated: the shard is the full buffer; only a distinct one needs copying. */
        if (stream != NULL)
            res = loomStreamSynchronize(stream);
        const size_t off = plan->buckets[a.b0].off;
        const size_t end = a.b1 < plan->nbuckets ? plan->buckets[a.b1].off : plan->total;
        if (res == loomSuccess)
            memmove((float *)params_full + off, (const float *)param_shard + off,
                    (end - off) * sizeof(float));
    }
    c.gather_calls = 1;
    call_close(&a, t0);
    return res;
}

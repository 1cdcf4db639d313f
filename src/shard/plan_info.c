/* SPDX-License-Identifier: Apache-2.0
 *
 * plan_info.c - what a built plan says about itself: the pieces each rank holds (shard_plan.h),
 * the argument checks the other entry points share, loomShardParamInfo, loomShardRankInfo,
 * loomShardStats, loomShardStateElems and loomShardGetCounters. Local and read-only, except
 * the counters, which are under the plan's lock.
 */
#include <string.h>

#include "check.h"
#include "shard_plan.h"

void shard_rows_range(const struct loomShardPlan *p, int i, int r, size_t *row0, size_t *nrows)
{
    const shard_param_t *q = &p->params[i];
    size_t lo = q->chunk * (size_t)r, hi = lo + q->chunk;
    if (lo > q->rows)
        lo = q->rows;
    if (hi > q->rows)
        hi = q->rows;
    *row0 = lo;
    *nrows = hi - lo;
}

static int emit(shard_piece_t *out, int n, shard_piece_t piece)
{
    if (out != NULL)
        out[n] = piece;
    return n + 1;
}

/* Owner and Replicated: the segments of shard_seg_t, cut at parameter boundaries. */
static int pieces_segments(const struct loomShardPlan *p, int rank, int b, shard_piece_t *out)
{
    const shard_bucket_t *bk = &p->buckets[b];
    const shard_seg_t *s = &p->segs[b * p->nranks + rank];
    int n = 0;
    for (int k = bk->first; k < bk->end; k++) {
        const int i = p->order[k];
        const shard_param_t *q = &p->params[i];
        if (q->kind != loomShardMatrix || q->offset < s->m_start ||
            q->offset >= s->m_start + s->m_len)
            continue;
        n = emit(out, n,
                 (shard_piece_t){i, q->offset, s->shard_off + (q->offset - s->m_start),
                                 s->state_off + (q->offset - s->m_start), q->numel, 0, q->rows});
    }
    for (int k = bk->first; k < bk->end; k++) {
        const int i = p->order[k];
        const shard_param_t *q = &p->params[i];
        if (q->kind != loomShardElementwise)
            continue;
        size_t lo = q->offset > s->e_start ? q->offset : s->e_start;
        size_t hi = q->offset + q->numel, e_end = s->e_start + s->e_len;
        hi = hi < e_end ? hi : e_end;
        if (lo >= hi)
            continue;
        size_t row0 = (lo - q->offset) / q->cols, row1 = (hi - q->offset + q->cols - 1) / q->cols;
        size_t at = s->m_len + (lo - s->e_start);
        n = emit(out, n,
                 (shard_piece_t){i, lo, s->shard_off + at, s->state_off + at, hi - lo, row0,
                                 row1 - row0});
    }
    return n;
}

/* Rows: each parameter's row chunk, matrices first (list order), then element-wise ones. */
static int pieces_rows(const struct loomShardPlan *p, int rank, int b, shard_piece_t *out)
{
    const shard_bucket_t *bk = &p->buckets[b];
    const shard_seg_t *s = &p->segs[b * p->nranks + rank];
    size_t at[2] = {0, s->m_len};
    int n = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int k = bk->first; k < bk->end; k++) {
            const int i = p->order[k];
            const shard_param_t *q = &p->params[i];
            size_t row0, nrows;
            if ((int)q->kind != kind)
                continue;
            shard_rows_range(p, i, rank, &row0, &nrows);
            if (nrows == 0)
                continue;
            n = emit(out, n,
                     (shard_piece_t){i, q->offset + row0 * q->cols, s->shard_off + at[kind],
                                     s->state_off + at[kind], nrows * q->cols, row0, nrows});
            at[kind] += nrows * q->cols;
        }
    return n;
}

int shard_pieces(const struct loomShardPlan *p, int rank, int b, shard_piece_t *out)
{
    if (p->cfg.layout == loomShardRows)
        return pieces_rows(p, rank, b, out);
    return pieces_segments(p, rank, b, out);
}

loomResult_t shard_check_plan(const struct loomShardPlan *p, const char *fn)
{
    if (p == NULL) {
        LOOM_WARN("%s: plan is NULL", fn);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

loomResult_t shard_check_rank(const struct loomShardPlan *p, int rank, const char *fn)
{
    LOOM_CHECK(shard_check_plan(p, fn));
    if (rank < 0 || rank >= p->nranks) {
        LOOM_WARN("%s: rank %d outside 0..%d of the plan", fn, rank, p->nranks - 1);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

loomResult_t shard_check_bucket(const struct loomShardPlan *p, int bucket, const char *fn)
{
    if (bucket < -1 || bucket >= p->nbuckets) {
        LOOM_WARN("%s: bucket %d outside -1..%d of the plan", fn, bucket, p->nbuckets - 1);
        return loomInvalidUsage;
    }
    return loomSuccess;
}

loomResult_t shard_check_dtype(loomDataType_t dt, const char *fn)
{
    if (dt != loomFloat32) {
        LOOM_WARN("%s: datatype %d: only loomFloat32 (%d) is supported", fn, (int)dt,
                  (int)loomFloat32);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

void shard_count(struct loomShardPlan *p, const loomShardCounters_t *add)
{
    loomShardCounters_t *c = &p->counters;
    pthread_mutex_lock(&p->lock);
    c->reduce_calls += add->reduce_calls;
    c->gather_calls += add->gather_calls;
    c->step_calls += add->step_calls;
    c->step_collectives += add->step_collectives;
    c->bytes_sent += add->bytes_sent;
    c->bytes_recv += add->bytes_recv;
    c->comm_seconds += add->comm_seconds;
    c->ns_seconds += add->ns_seconds;
    c->step_seconds += add->step_seconds;
    pthread_mutex_unlock(&p->lock);
}

LOOM_API loomResult_t loomShardGetCounters(loomShardPlan_t plan, loomShardCounters_t *counters,
                                           int reset)
{
    LOOM_CHECK(shard_check_plan(plan, "loomShardGetCounters"));
    pthread_mutex_lock(&plan->lock);
    if (counters != NULL)
        *counters = plan->counters;
    if (reset)
        memset(&plan->counters, 0, sizeof(plan->counters));
    pthread_mutex_unlock(&plan->lock);
    return loomSuccess;
}

LOOM_API loomResult_t loomShardParamInfo(loomShardPlan_t plan, int param, int *owner,
                                         size_t *offset)
{
    LOOM_CHECK(shard_check_plan(plan, "loomShardParamInfo"));
    if (param < 0 || param >= plan->nparams) {
        LOOM_WARN("loomShardParamInfo: param %d outside 0..%d", param, plan->nparams - 1);
        return loomInvalidArgument;
    }
    if (owner != NULL)
        *owner = plan->params[param].owner;
    if (offset != NULL)
        *offset = plan->params[param].offset;
    return loomSuccess;
}

static size_t owned_bytes(const struct loomShardPlan *p, int r)
{
    return 4 * (2 * p->shard_elems[r] + p->state_elems[r]);
}

LOOM_API loomResult_t loomShardRankInfo(loomShardPlan_t plan, int rank, loomShardRankInfo_t *info)
{
    LOOM_CHECK(shard_check_rank(plan, rank, "loomShardRankInfo"));
    if (info == NULL) {
        LOOM_WARN("loomShardRankInfo: info is NULL");
        return loomInvalidArgument;
    }
    info->nmatrices = plan->rank_nmat[rank];
    info->shard_elems = plan->shard_elems[rank];
    info->state_elems = plan->state_elems[rank];
    info->ns_cost = plan->rank_cost[rank];
    info->owned_bytes = owned_bytes(plan, rank);
    return loomSuccess;
}

LOOM_API size_t loomShardStateElems(loomShardPlan_t plan, int rank)
{
    if (plan == NULL || rank < 0 || rank >= plan->nranks)
        return 0;
    return plan->state_elems[rank];
}

LOOM_API loomResult_t loomShardStats(loomShardPlan_t plan, loomShardStats_t *stats)
{
    LOOM_CHECK(shard_check_plan(plan, "loomShardStats"));
    if (stats == NULL) {
        LOOM_WARN("loomShardStats: stats is NULL");
        return loomInvalidArgument;
    }
    const struct loomShardPlan *p = plan;
    const double P = (double)p->nranks, share = (P - 1.0) / P;
    const int rows = p->cfg.layout == loomShardRows;
    loomShardStats_t s;
    memset(&s, 0, sizeof(s));
    s.nranks = p->nranks;
    s.nbuckets = p->nbuckets;
    s.total_elems = p->total;
    s.matrix_elems = p->matrix_elems;
    s.elementwise_elems = p->total - p->matrix_elems;
    s.padded_elems = rows ? p->padded : p->total;
    s.padded_matrix_elems = rows ? p->padded_matrix : p->matrix_elems;
    double item_max = 0, bytes_max = 0, bytes_sum = 0;
    for (int r = 0; r < p->nranks; r++) {
        s.cost_total += p->rank_cost[r];
        s.cost_max = p->rank_cost[r] > s.cost_max ? p->rank_cost[r] : s.cost_max;
        double b = (double)owned_bytes(p, r);
        bytes_sum += b;
        bytes_max = b > bytes_max ? b : bytes_max;
    }
    for (int i = 0; i < p->nparams; i++)
        if (p->params[i].kind == loomShardMatrix && p->params[i].ns_cost > item_max)
            item_max = p->params[i].ns_cost;
    s.cost_mean = s.cost_total / P;
    s.cost_bound = s.cost_mean + (1.0 - 1.0 / P) * item_max;
    s.bytes_imbalance = bytes_max / (bytes_sum / P);
    s.baseline_step_bytes_per_rank =
        share * (2.0 * (double)p->padded + (double)p->padded_matrix) * 4.0;
    s.step_bytes_per_rank =
        rows ? s.baseline_step_bytes_per_rank : 2.0 * share * (double)p->total * 4.0;
    s.fingerprint = p->fingerprint;
    *stats = s;
    return loomSuccess;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * step.c - loomShardStep (docs/shard.md, Step): per bucket, Muon on the matrices the rank
 * steps (step_jobs.c) and AdamW on its element-wise pieces, with the state laid out as
 * shard_plan.h says. Owner and Replicated run every matrix whole on one rank and never
 * communicate. Rows (the baseline) updates momentum on its own rows, all-gathers the
 * pre-Newton-Schulz update (per matrix, or per bucket with rows_bucketed), runs Newton-Schulz
 * on the whole matrix and keeps its own rows: the same kernels on the same bits, so the three
 * layouts agree bitwise. Queued work on the stream is waited for first (the step reads what
 * ReduceGrads wrote); Rows' gathers are waited for before Newton-Schulz reads them.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard_comm.h"
#include "shard_kernels.h"
#include "step_jobs.h"
#include "timer.h"

typedef struct {
    const struct loomShardPlan *p;
    int rank;
    float *params;
    const float *grads;
    float *state;
    unsigned int flags;
    const loomMuonConfig_t *cfg;
    loomComm_t comm;
    loomStream_t stream;
    loomShardCounters_t *c;
} step_t;

static float *param_at(const step_t *s, const shard_piece_t *pc)
{
    return s->params + ((s->flags & LOOM_SHARD_PARAMS_FULL) ? pc->full_off : pc->shard_off);
}

static const float *grad_at(const step_t *s, const shard_piece_t *pc)
{
    return s->grads + ((s->flags & LOOM_SHARD_GRADS_FULL) ? pc->full_off : pc->shard_off);
}

/* Rows: momentum of the rank's rows of each matrix into its padded slot of stage, then the
 * gathers, then one job per matrix reading every rank's rows out of stage. */
static loomResult_t rows_matrices(const step_t *s, int b, const shard_piece_t *pcs, float *stage,
                                  shard_job_t *jobs, int *njobs)
{
    const struct loomShardPlan *p = s->p;
    const shard_bucket_t *bk = &p->buckets[b];
    const size_t P = (size_t)p->nranks, me = (size_t)s->rank;
    const int bucketed = p->cfg.rows_bucketed;
    size_t moff = 0;
    int k = 0;
    for (int o = bk->first; o < bk->end; o++) {
        const int i = p->order[o];
        const shard_param_t *x = &p->params[i];
        if (x->kind != loomShardMatrix)
            continue;
        const size_t padded = x->chunk * x->cols;
        /* Bucketed: rank q's block is stage + q * blk_m, this matrix at moff inside it; per
         * matrix: the matrix's own region stage + P * moff, rank q's rows at q * padded. */
        float *region = bucketed ? stage + moff : stage + P * moff;
        const size_t stride = bucketed ? bk->blk_m : padded;
        float *mine = region + me * stride;
        size_t row0, nrows;
        shard_rows_range(p, i, s->rank, &row0, &nrows);
        float *param = NULL;
        if (nrows > 0) {
            const shard_piece_t *pc = &pcs[k++];
            loom_muon_momentum(mine, grad_at(s, pc), s->state + pc->state_off, pc->len, s->cfg);
            param = param_at(s, pc);
        }
        memset(mine + nrows * x->cols, 0, (padded - nrows * x->cols) * sizeof(float));
        if (!bucketed) {
            LOOM_CHECK(loomAllGather(mine, region, padded, loomFloat32, s->comm, s->stream));
            s->c->step_collectives++;
            s->c->bytes_sent += 4 * (uint64_t)(P - 1) * padded;
            s->c->bytes_recv += 4 * (uint64_t)(P - 1) * padded;
        }
        jobs[(*njobs)++] = (shard_job_t){x->rows, x->cols, param,    NULL, NULL,
                                         region,  stride,  x->chunk, row0, nrows};
        moff += padded;
    }
    if (bucketed && bk->blk_m > 0) {
        LOOM_CHECK(loomAllGather(stage + me * bk->blk_m, stage, bk->blk_m, loomFloat32, s->comm,
                                 s->stream));
        s->c->step_collectives++;
        s->c->bytes_sent += 4 * (uint64_t)(P - 1) * bk->blk_m;
        s->c->bytes_recv += 4 * (uint64_t)(P - 1) * bk->blk_m;
    }
    return s->stream != NULL ? loomStreamSynchronize(s->stream) : loomSuccess;
}

static loomResult_t step_bucket(const step_t *s, int b, shard_piece_t *pcs, shard_job_t *jobs,
                                float *stage)
{
    const struct loomShardPlan *p = s->p;
    const shard_seg_t *seg = &p->segs[b * p->nranks + s->rank];
    const int npcs = shard_pieces(p, s->rank, b, pcs);
    int njobs = 0, k = 0;
    if (p->cfg.layout == loomShardRows) {
        LOOM_CHECK(rows_matrices(s, b, pcs, stage, jobs, &njobs));
        while (k < npcs && p->params[pcs[k].param].kind == loomShardMatrix)
            k++;
    } else {
        for (; k < npcs && p->params[pcs[k].param].kind == loomShardMatrix; k++) {
            const shard_param_t *x = &p->params[pcs[k].param];
            jobs[njobs++] = (shard_job_t){x->rows,
                                          x->cols,
                                          param_at(s, &pcs[k]),
                                          grad_at(s, &pcs[k]),
                                          s->state + pcs[k].state_off,
                                          NULL,
                                          0,
                                          0,
                                          0,
                                          x->rows};
        }
    }
    LOOM_CHECK(shard_run_jobs(jobs, njobs, s->cfg, p->nranks, &s->c->ns_seconds));
    for (; k < npcs; k++) {
        float *m = s->state + pcs[k].state_off;
        LOOM_CHECK(loomAdamWUpdate(param_at(s, &pcs[k]), grad_at(s, &pcs[k]), m, m + seg->e_len,
                                   pcs[k].len, s->cfg));
    }
    return loomSuccess;
}

static loomResult_t check_step(const struct loomShardPlan *p, int rank, int bucket,
                               const void *params, const void *grads, const float *state,
                               unsigned int flags, const loomMuonConfig_t *cfg, loomComm_t comm)
{
    static const char fn[] = "loomShardStep";
    LOOM_CHECK(shard_check_rank(p, rank, fn));
    LOOM_CHECK(shard_check_bucket(p, bucket, fn));
    LOOM_CHECK(loom_muon_config_check(cfg, fn));
    if ((flags & ~(LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL)) != 0) {
        LOOM_WARN("%s: flags 0x%x has bits other than PARAMS_FULL and GRADS_FULL", fn, flags);
        return loomInvalidArgument;
    }
    if (p->shard_elems[rank] > 0 && (params == NULL || grads == NULL || state == NULL)) {
        LOOM_WARN("%s: rank %d holds %zu elements but params %p, grads %p or state %p is NULL", fn,
                  rank, p->shard_elems[rank], params, grads, (const void *)state);
        return loomInvalidArgument;
    }
    if (p->cfg.layout == loomShardRows) {
        int comm_rank = -1;
        LOOM_CHECK(shard_check_comm(p, comm, &comm_rank, fn));
        if (comm_rank != rank) {
            LOOM_WARN("%s: rank %d but comm's rank is %d: Rows steps as the comm's rank", fn, rank,
                      comm_rank);
            return loomInvalidUsage;
        }
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomShardStep(loomShardPlan_t plan, int rank, int bucket, void *params,
                                    const void *grads, float *state, unsigned int flags,
                                    const loomMuonConfig_t *config, loomComm_t comm,
                                    loomStream_t stream)
{
    LOOM_CHECK(check_step(plan, rank, bucket, params, grads, state, flags, config, comm));
    const uint64_t t0 = loom_now_ns();
    loomShardCounters_t c;
    memset(&c, 0, sizeof(c));
    const int b0 = bucket < 0 ? 0 : bucket, b1 = bucket < 0 ? plan->nbuckets : bucket + 1;
    int maxp = 0, maxm = 0;
    size_t stage_floats = 1;
    for (int b = b0; b < b1; b++) {
        const int n = shard_pieces(plan, rank, b, NULL);
        maxp = n > maxp ? n : maxp;
        maxm = plan->buckets[b].nmat > maxm ? plan->buckets[b].nmat : maxm;
        const size_t need = plan->buckets[b].blk_m * (size_t)plan->nranks;
        stage_floats = need > stage_floats ? need : stage_floats;
    }
    const int rows = plan->cfg.layout == loomShardRows;
    shard_piece_t *pcs = malloc((size_t)(maxp > 0 ? maxp : 1) * sizeof(*pcs));
    shard_job_t *jobs = malloc((size_t)(maxm > 0 ? maxm : 1) * sizeof(*jobs));
    float *stage = rows ? malloc(stage_floats * sizeof(float)) : NULL;
    loomResult_t res = loomSuccess;
    if (pcs == NULL || jobs == NULL || (rows && stage == NULL)) {
        LOOM_WARN("loomShardStep: rank %d: out of memory for %d pieces, %d jobs, %zu floats", rank,
                  maxp, maxm, rows ? stage_floats : 0);
        res = loomSystemError;
    }
    step_t s = {plan, rank, params, grads, state, flags, config, comm, stream, &c};
    if (res == loomSuccess && stream != NULL)
        res = loomStreamSynchronize(stream);
    for (int b = b0; b < b1 && res == loomSuccess; b++)
        res = step_bucket(&s, b, pcs, jobs, stage);
    free(pcs);
    free(jobs);
    free(stage);
    c.step_calls = 1;
    c.step_seconds = (double)(loom_now_ns() - t0) * 1e-9;
    shard_count(plan, &c);
    return res;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * muon.c - --optim muon: the attention and MLP matrices are stepped by Muon, everything else
 * (embeddings, LayerNorms, routers) by AdamW, as Muon is used in practice, all through loom_shard
 * (include/loom_shard.h). The rank's tensors become the parameter list of one plan over the data
 * group, one bucket per unit, and the local vector is laid out in the plan's order: params and
 * grads are then the plan's full buffers, and the forward, the backward and the shard calls all
 * work on one allocation without copies. A step is one ReduceGrads per unit (on the stream,
 * during the backward, as DP's all-reduces), the clip, loomShardStep on this rank's share and one
 * GatherParams. --shard owner gives each matrix whole to one rank of the data group, rows is
 * FSDP2's row sharding (the update all-gathered before Newton-Schulz), none is DDP Muon.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_matrix(const ltensor_t *t)
{
    switch (t->kind) {
    case TK_WQ:
    case TK_WK:
    case TK_WV:
    case TK_WO:
    case TK_WUP:
    case TK_WDOWN:
        return 1;
    default:
        return 0;
    }
}

static loomShardLayout_t shard_layout(int shard)
{
    return shard == SHARD_ROWS   ? loomShardRows
           : shard == SHARD_NONE ? loomShardReplicated
                                 : loomShardOwner;
}

static int muon_fail(const engine_t *e, const char *what, loomResult_t r)
{
    fprintf(stderr, "loom-train: rank %d: %s: %s: %s\n", e->c->rank, what, loomGetErrorString(r),
            loomGetLastError(NULL));
    return -1;
}

int muon_layout(engine_t *e)
{
    layout_t *lay = &e->lay;
    loomShardParam_t *ps = calloc((size_t)lay->nt, sizeof(*ps));
    int *tix = calloc((size_t)lay->nt, sizeof(int));
    if (!ps || !tix) {
        free(ps);
        free(tix);
        return -1;
    }
    /* The list in the units' order, so that bucket ids (unit indices) never decrease. */
    int np = 0;
    for (int u = 0; u < lay->nu; u++)
        for (int k = 0; k < lay->u[u].nt; k++) {
            const ltensor_t *t = &lay->t[lay->u[u].t0 + k];
            ps[np] =
                (loomShardParam_t){.rows = (size_t)t->rows,
                                   .cols = (size_t)t->cols,
                                   .kind = is_matrix(t) ? loomShardMatrix : loomShardElementwise,
                                   .owner = -1,
                                   .bucket = u};
            tix[np++] = lay->u[u].t0 + k;
        }
    loomShardConfig_t cfg = LOOM_SHARD_CONFIG_INITIALIZER;
    cfg.layout = shard_layout(e->o->shard);
    cfg.rows_bucketed = 1;
    loomResult_t r = loomShardPlanCreate(&e->plan, ps, np, e->shards, &cfg);
    free(ps);
    if (r != loomSuccess) {
        free(tix);
        return muon_fail(e, "loomShardPlanCreate", r);
    }
    /* Every tensor at its plan offset; each unit is its bucket, a contiguous range. The pieces
     * of gshard the global norm adds: the counted tensors' (not the head's copy of wte), and
     * under DDP Muon, where every data rank holds everything, data rank 0's alone. */
    e->norm_runs = calloc(2 * (size_t)np, sizeof(size_t));
    if (!e->norm_runs) {
        free(tix);
        return -1;
    }
    int counts = e->o->shard != SHARD_NONE || e->c->data_rank == 0;
    for (int i = 0; i < np; i++) {
        size_t off = 0, at = 0, n = 0;
        loomShardParamInfo(e->plan, i, NULL, &off);
        lay->t[tix[i]].off = off;
        loomShardParamPiece(e->plan, e->srank, i, &at, NULL, &n);
        if (counts && lay->t[tix[i]].counted && n > 0) {
            e->norm_runs[2 * e->nnorm] = at;
            e->norm_runs[2 * e->nnorm + 1] = n;
            e->nnorm++;
        }
    }
    free(tix);
    for (int u = 0; u < lay->nu; u++) {
        unit_t *un = &lay->u[u];
        size_t lo = (size_t)-1, len = 0;
        for (int k = 0; k < un->nt; k++) {
            const ltensor_t *t = &lay->t[un->t0 + k];
            lo = t->off < lo ? t->off : lo;
            len += (size_t)t->rows * (size_t)t->cols;
        }
        un->off = lo, un->len = len, un->padded = len;
    }
    loomShardStats_t st;
    loomShardRankInfo_t ri;
    loomShardStats(e->plan, &st);
    loomShardRankInfo(e->plan, e->srank, &ri);
    lay->total = st.total_elems;
    e->gsn = ri.shard_elems;
    e->on = loomShardStateElems(e->plan, e->srank);
    r = loomShardPlanVerify(e->plan, e->c->data, NULL);
    if (r != loomSuccess)
        return muon_fail(e, "loomShardPlanVerify", r);
    return 0;
}

/* Counts one shard call as the other collectives are counted: calls, and the bytes of the full
 * buffer it covers (the unit, or everything). */
static void count_shard(engine_t *e, int kind, size_t floats)
{
    e->c->calls[P_DATA][kind]++;
    e->c->bytes[P_DATA][kind] += floats * sizeof(float);
}

static void muon_reduce_unit(engine_t *e, const unit_t *u, loomStream_t s)
{
    tcomm_t *c = e->c;
    count_shard(e, K_SHARDREDUCE, u->len);
    double t = tc_now();
    tc_check(loomShardReduceGrads(e->plan, (int)(u - e->lay.u), e->grads, e->gshard, loomFloat32,
                                  loomSum, c->data, s),
             c, "loomShardReduceGrads");
    if (!s)
        c->comm_s += tc_now() - t;
}

/* The units whose gradients the tied embedding's sum changes: they are reduced after it. */
static int tied_unit(const engine_t *e, const unit_t *u)
{
    return e->c->tie &&
           ((e->lay.first && u->kind == UNIT_EMB) || (e->lay.last && u->kind == UNIT_FINAL));
}

void muon_unit_done(engine_t *e, const unit_t *u)
{
    if (!tied_unit(e, u))
        muon_reduce_unit(e, u, e->c->stream);
}

void muon_step(engine_t *e, double lr)
{
    tcomm_t *c = e->c;
    const layout_t *lay = &e->lay;
    const opts_t *o = e->o;
    if (o->overlap)
        tc_stream_sync(c);
    if (c->tie) {
        const unit_t *u = layout_unit_of(lay, lay->first ? UNIT_EMB : UNIT_FINAL);
        const ltensor_t *t = &lay->t[u->t0 + (lay->first ? 0 : 2)];
        tc_allreduce(c, P_TIE, c->tie, e->grads + t->off, (size_t)t->rows * (size_t)t->cols, NULL);
    }
    for (int i = 0; i < lay->nu; i++)
        if (!o->overlap || tied_unit(e, &lay->u[i]))
            muon_reduce_unit(e, &lay->u[i], NULL);
    if (o->dump_grads && !e->dumped_grads) {
        e->dumped_grads = 1;
        if (eng_dump(e, o->dump_grads, 1))
            exit(1);
    }
    /* The global norm: each element counted once, by the rank that holds it reduced. */
    double sumsq = 0;
    for (int k = 0; k < e->nnorm; k++) {
        const float *g = e->gshard + e->norm_runs[2 * k];
        for (size_t i = 0; i < e->norm_runs[2 * k + 1]; i++)
            sumsq += (double)g[i] * g[i];
    }
    tc_allreduce_d(c, P_MISC, c->world, &sumsq, 1);
    double norm = sqrt(sumsq);
    e->last_norm = norm;
    e->step++;
    if (o->clip > 0 && norm > o->clip) {
        double g = o->clip / (norm + 1e-6);
        for (size_t i = 0; i < e->gsn; i++)
            e->gshard[i] = (float)(e->gshard[i] * g);
    }
    loomMuonConfig_t mc = LOOM_MUON_CONFIG_INITIALIZER;
    double f = o->lr > 0 ? lr / o->lr : 1.0; /* the warmup's share of the full rate */
    mc.lr = (float)(o->muon_lr * f);
    mc.momentum = (float)o->muon_momentum;
    mc.weight_decay = (float)o->wd;
    mc.adam_lr = (float)lr;
    mc.adam_beta1 = (float)o->beta1;
    mc.adam_beta2 = (float)o->beta2;
    mc.adam_eps = (float)o->eps;
    mc.adam_weight_decay = 0.0f;
    mc.step = (long)e->step;
    loomShardCounters_t k0, k1;
    loomShardGetCounters(e->plan, &k0, 0);
    tc_check(loomShardStep(e->plan, e->srank, -1, e->params, e->gshard, e->m,
                           LOOM_SHARD_PARAMS_FULL, &mc, c->data, NULL),
             c, "loomShardStep");
    loomShardGetCounters(e->plan, &k1, 0);
    if (k1.step_collectives > k0.step_collectives) {
        c->calls[P_DATA][K_SHARDSTEP] += k1.step_collectives - k0.step_collectives;
        c->comm_s += k1.comm_seconds - k0.comm_seconds;
    }
    if (o->shard != SHARD_NONE) {
        count_shard(e, K_SHARDGATHER, lay->total);
        double t = tc_now();
        tc_check(
            loomShardGatherParams(e->plan, -1, e->params, e->params, loomFloat32, c->data, NULL), c,
            "loomShardGatherParams");
        c->comm_s += tc_now() - t;
    }
}

float *muon_full_grads(engine_t *e)
{
    float *full = calloc(e->lay.total ? e->lay.total : 1, sizeof(float));
    if (!full) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    if (e->o->shard == SHARD_NONE)
        memcpy(full, e->gshard, e->lay.total * sizeof(float));
    else
        tc_check(loomShardGatherParams(e->plan, -1, e->gshard, full, loomFloat32, e->c->data, NULL),
                 e->c, "loomShardGatherParams");
    return full;
}

void muon_figures(const engine_t *e, double out[5])
{
    loomShardCounters_t k;
    loomShardRankInfo_t ri;
    memset(out, 0, 5 * sizeof(double));
    if (!e->plan || loomShardGetCounters(e->plan, &k, 0) != loomSuccess ||
        loomShardRankInfo(e->plan, e->srank, &ri) != loomSuccess)
        return;
    out[0] = (double)k.bytes_sent;
    out[1] = (double)k.bytes_recv;
    out[2] = (double)k.step_collectives;
    out[3] = (double)e->on;
    out[4] = ri.ns_cost;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * engine.c - where a rank's parameters, gradients and optimizer state live, and how they are
 * reduced: plain data parallelism (an all-reduce per unit), ZeRO-1 (optimizer state sharded:
 * reduce-scatter, sharded AdamW, all-gather), ZeRO-2 (gradients sharded too: each unit's
 * gradients are reduce-scattered as soon as its backward ends, and only the shard is kept) and
 * ZeRO-3 (parameters sharded too: each unit is all-gathered before use and freed after). Shards
 * are equal ranges of each unit over the data group (DP x CP). --optim muon hands the layout and
 * the step to muon.c.
 */
#include "train.h"

#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t shard_len(const engine_t *e, const unit_t *u)
{
    return u->padded / (size_t)e->shards;
}
/* Offset of the unit's shard in a shard-packed vector. */
static size_t shard_base(const engine_t *e, const unit_t *u)
{
    return u->off / (size_t)e->shards;
}
/* First local-vector index of this rank's shard of u. */
static size_t shard_lo(const engine_t *e, const unit_t *u)
{
    return u->off + (size_t)e->srank * shard_len(e, u);
}

static float *falloc(size_t n)
{
    return train_calloc(n, sizeof(float));
}

static int uidx(const engine_t *e, const unit_t *u)
{
    return (int)(u - e->lay.u);
}

/* The buffers of stage pp_i's engine (the rank's own, or DualPipe's second copy). */
static int eng_alloc_at(engine_t *e, const opts_t *o, tcomm_t *c, int pp_i)
{
    memset(e, 0, sizeof(*e));
    e->o = o;
    e->c = c;
    e->zero = o->zero;
    e->shards = c->data_size;
    e->srank = c->data_rank;
    e->local_steps = o->diloco > 0;
    grid_pos_t g = c->g;
    g.pp_i = pp_i;
    if (layout_build(&e->lay, &o->model, &g, e->shards))
        return -1;
    if (o->optim == OPTIM_MUON && muon_layout(e))
        return -1;
    size_t total = e->lay.total, shard = total / (size_t)e->shards;
    e->pn = e->zero >= 3 ? shard : total;
    e->gn = e->zero >= 2 ? shard : total;
    if (!e->plan) {
        e->on = e->vn = e->zero >= 1 ? shard : total;
        e->gsn = e->zero == 1 ? shard : 0;
    }
    e->params = falloc(e->pn);
    e->grads = falloc(e->gn);
    e->m = falloc(e->on);
    e->v = falloc(e->vn); /* never NULL, so that a checkpoint may write its 0 floats */
    if (e->gsn)
        e->gshard = falloc(e->gsn);
    if (o->grad_halves)
        e->ghalf = falloc(e->gn); /* main.c allows it with full gradients only (ZeRO < 2) */
    int nu = e->lay.nu;
    e->ugath = calloc((size_t)nu, sizeof(float *));
    e->ugrad = calloc((size_t)nu, sizeof(float *));
    e->uref = calloc((size_t)nu, sizeof(int));
    e->ugref = calloc((size_t)nu, sizeof(int));
    if (!e->ugath || !e->ugrad || !e->uref || !e->ugref)
        return -1;
    e->step = 0;
    return 0;
}

int eng_alloc(engine_t *e, const opts_t *o, tcomm_t *c)
{
    return eng_alloc_at(e, o, c, c->g.pp_i);
}

void eng_init_params(engine_t *e)
{
    float *full = e->zero >= 3 ? falloc(e->lay.total) : e->params;
    layout_init_params(&e->lay, full);
    if (e->zero >= 3) {
        for (int i = 0; i < e->lay.nu; i++) {
            const unit_t *u = &e->lay.u[i];
            memcpy(e->params + shard_base(e, u), full + shard_lo(e, u),
                   shard_len(e, u) * sizeof(float));
        }
        free(full);
    }
    memset(e->m, 0, e->on * sizeof(float));
    memset(e->v, 0, e->vn * sizeof(float));
    e->step = 0;
}

int eng_init_at(engine_t *e, const opts_t *o, tcomm_t *c, int pp_i)
{
    if (eng_alloc_at(e, o, c, pp_i))
        return -1;
    eng_init_params(e);
    return 0;
}

int eng_init(engine_t *e, const opts_t *o, tcomm_t *c)
{
    return eng_init_at(e, o, c, c->g.pp_i);
}

void eng_free(engine_t *e)
{
    for (int i = 0; i < e->lay.nu; i++) {
        free(e->ugath[i]);
        free(e->ugrad[i]);
    }
    free(e->ugath);
    free(e->ugrad);
    free(e->uref);
    free(e->ugref);
    free(e->params);
    free(e->grads);
    free(e->ghalf);
    free(e->gshard);
    free(e->rs_tmp);
    free(e->m);
    free(e->v);
    if (e->plan)
        loomShardPlanDestroy(e->plan);
    free(e->norm_runs);
    layout_free(&e->lay);
}

static void tmp_add(engine_t *e, long n)
{
    e->cur_tmp = (size_t)((long)e->cur_tmp + n);
    if (e->cur_tmp > e->peak_tmp)
        e->peak_tmp = e->cur_tmp;
}

float *eng_acquire(engine_t *e, const unit_t *u)
{
    if (e->zero < 3)
        return e->params + u->off;
    int i = uidx(e, u);
    if (e->uref[i]++ == 0) {
        e->ugath[i] = falloc(u->padded);
        tmp_add(e, (long)u->padded);
        tc_allgather(e->c, P_DATA, e->c->data, e->params + shard_base(e, u), e->ugath[i],
                     shard_len(e, u));
    }
    return e->ugath[i];
}

void eng_release(engine_t *e, const unit_t *u)
{
    if (e->zero < 3)
        return;
    int i = uidx(e, u);
    if (--e->uref[i] == 0) {
        free(e->ugath[i]);
        e->ugath[i] = NULL;
        tmp_add(e, -(long)u->padded);
    }
}

float *eng_grad_begin(engine_t *e, const unit_t *u)
{
    if (e->zero < 2)
        return (e->ghalf && e->half ? e->ghalf : e->grads) + u->off;
    int i = uidx(e, u);
    if (e->ugref[i]++ == 0) {
        e->ugrad[i] = falloc(u->padded);
        tmp_add(e, (long)u->padded);
    }
    return e->ugrad[i];
}

/* Starts (or runs) the reduction of one unit's accumulated gradients over the data group. */
static void reduce_unit(engine_t *e, const unit_t *u, loomStream_t s)
{
    tcomm_t *c = e->c;
    if (e->zero == 0)
        tc_allreduce(c, P_DATA, u->kind == UNIT_EXPERTS ? c->edp : c->data, e->grads + u->off,
                     u->padded, s);
    else if (e->shards > 1)
        tc_reduce_scatter(c, P_DATA, c->data, e->grads + u->off, e->gshard + shard_base(e, u),
                          shard_len(e, u), s);
    else
        memcpy(e->gshard + shard_base(e, u), e->grads + u->off, u->padded * sizeof(float));
}

void eng_grad_end(engine_t *e, const unit_t *u, int last_micro)
{
    if (e->zero < 2) {
        /* --grad-halves: the unit's halves are added once, first half + second half, as
         * DualPipe adds its two copies' gradients, before any reduction. */
        if (last_micro && e->ghalf)
            for (size_t j = u->off; j < u->off + u->padded; j++)
                e->grads[j] += e->ghalf[j];
        if (last_micro && e->o->overlap && !e->local_steps)
            e->plan ? muon_unit_done(e, u) : reduce_unit(e, u, e->c->stream);
        return;
    }
    int i = uidx(e, u);
    if (--e->ugref[i] > 0)
        return;
    /* ZeRO-2/3: keep only this rank's shard of the unit's gradients, accumulated over
     * micro-batches; the full unit buffer goes at once. */
    size_t s = shard_len(e, u);
    float *dst = e->grads + shard_base(e, u);
    if (e->shards > 1) {
        /* held by the engine, so that a step unwound by --elastic does not lose it */
        float *tmp = e->rs_tmp = falloc(s);
        tc_reduce_scatter(e->c, P_DATA, e->c->data, e->ugrad[i], tmp, s, NULL);
        for (size_t j = 0; j < s; j++)
            dst[j] += tmp[j];
        free(tmp);
        e->rs_tmp = NULL;
    } else {
        for (size_t j = 0; j < s; j++)
            dst[j] += e->ugrad[i][j];
    }
    free(e->ugrad[i]);
    e->ugrad[i] = NULL;
    tmp_add(e, -(long)u->padded);
}

void eng_zero_grads(engine_t *e)
{
    memset(e->grads, 0, e->gn * sizeof(float));
    if (e->ghalf)
        memset(e->ghalf, 0, e->gn * sizeof(float));
}

/* What one optimizer pass over a range of the local vector needs. A local index i maps to
 * element i - delta of the (full or shard-packed) buffers. */
typedef struct {
    engine_t *e;
    float *p, *g, *m, *v;
    size_t pd, gd, od; /* deltas of p, g and m/v */
    int count_all;     /* count every counted tensor (the rank owns the range) */
    double sumsq, lr, gscale;
} pass_t;

static void sumsq_piece(const ltensor_t *t, size_t lo, size_t hi, void *arg)
{
    pass_t *a = arg;
    if (!t->counted || !a->count_all)
        return;
    for (size_t i = lo; i < hi; i++) {
        double g = a->g[i - a->gd];
        a->sumsq += g * g;
    }
}

static void adamw_piece(const ltensor_t *t, size_t lo, size_t hi, void *arg)
{
    pass_t *a = arg;
    const opts_t *o = a->e->o;
    adamw_f(a->p + lo - a->pd, a->g + lo - a->gd, a->m + lo - a->od, a->v + lo - a->od, hi - lo,
            a->lr, o->beta1, o->beta2, o->eps, t->decay ? o->wd : 0.0, a->e->step, a->gscale);
}

/* Without sharding, the one replica of unit u that counts it (norms, dumps): data rank 0, or for
 * experts the first of their replicas. */
static int counts_unit(const engine_t *e, const unit_t *u)
{
    return (u->kind == UNIT_EXPERTS ? e->c->edp_rank : e->c->data_rank) == 0;
}

/* Runs fn over the ranges this rank updates: everything (plain DP) or its shard of each unit. */
static void for_owned(engine_t *e, pass_t *a, void (*fn)(const ltensor_t *, size_t, size_t, void *))
{
    if (e->zero == 0) {
        a->p = e->params, a->g = e->grads, a->m = e->m, a->v = e->v;
        a->pd = a->gd = a->od = 0;
        for (int i = 0; i < e->lay.nu; i++) {
            const unit_t *u = &e->lay.u[i];
            a->count_all = e->local_steps || counts_unit(e, u);
            layout_for_range(&e->lay, u->off, u->off + u->padded, fn, a);
        }
        return;
    }
    for (int i = 0; i < e->lay.nu; i++) {
        const unit_t *u = &e->lay.u[i];
        size_t lo = shard_lo(e, u), d = lo - shard_base(e, u);
        a->p = e->params, a->pd = e->zero >= 3 ? d : 0;
        a->g = e->zero == 1 ? e->gshard : e->grads, a->gd = d;
        a->m = e->m, a->v = e->v, a->od = d;
        layout_for_range(&e->lay, lo, lo + shard_len(e, u), fn, a);
    }
}

void eng_step(engine_t *e, double lr)
{
    tcomm_t *c = e->c;
    const layout_t *lay = &e->lay;
    if (e->plan) {
        muon_step(e, lr);
        return;
    }
    if (e->zero < 2 && !e->local_steps) {
        if (e->o->overlap)
            tc_stream_sync(c);
        else
            for (int i = 0; i < lay->nu; i++)
                reduce_unit(e, &lay->u[i], NULL);
    }
    /* The tied embedding: the first stage's wte and the last stage's copy get the sum. */
    if (c->tie) {
        const unit_t *u = layout_unit_of(lay, lay->first ? UNIT_EMB : UNIT_FINAL);
        const ltensor_t *t = &lay->t[u->t0 + (lay->first ? 0 : 2)];
        tc_allreduce(c, P_TIE, c->tie, e->grads + t->off, (size_t)t->rows * (size_t)t->cols, NULL);
    }
    /* The run's first step's reduced gradients, for comparison with a reference. */
    if (e->o->dump_grads && !e->dumped_grads) {
        e->dumped_grads = 1;
        if (eng_dump(e, e->o->dump_grads, 1))
            exit(1);
    }
    double sumsq = eng_sumsq(e);
    if (!e->local_steps) /* DiLoCo: each replica clips by its own gradients' norm */
        tc_allreduce_d(c, P_MISC, c->world, &sumsq, 1);
    eng_update(e, lr, sqrt(sumsq));
}

double eng_sumsq(engine_t *e)
{
    pass_t a = {.e = e, .count_all = 1};
    for_owned(e, &a, sumsq_piece);
    return a.sumsq;
}

void eng_update(engine_t *e, double lr, double norm)
{
    tcomm_t *c = e->c;
    const layout_t *lay = &e->lay;
    pass_t a = {.e = e, .count_all = 1};
    e->last_norm = norm;
    e->step++;
    a.lr = lr;
    a.gscale = e->o->clip > 0 && norm > e->o->clip ? e->o->clip / (norm + 1e-6) : 1.0;
    for_owned(e, &a, adamw_piece);
    if (e->zero == 1 || e->zero == 2) {
        for (int i = 0; i < lay->nu; i++) {
            const unit_t *u = &lay->u[i];
            if (e->shards > 1)
                tc_allgather(c, P_DATA, c->data, e->params + shard_lo(e, u), e->params + u->off,
                             shard_len(e, u));
        }
    }
    if (e->zero == 1)
        memset(e->gshard, 0, e->on * sizeof(float));
}

/* ---- Dump and checkpoints ------------------------------------------------------------------ */

typedef struct {
    float *out;
    const float *p;
    size_t pd;
    int all;
} dump_t;

static void dump_piece(const ltensor_t *t, size_t lo, size_t hi, void *arg)
{
    dump_t *d = arg;
    if (!t->counted || !d->all)
        return;
    for (size_t i = lo; i < hi; i++) {
        size_t k = i - t->off;
        d->out[ltensor_global(t, (int)(k / (size_t)t->cols), (int)(k % (size_t)t->cols))] =
            d->p[i - d->pd];
    }
}

int eng_dump(engine_t *e, const char *path, int grads)
{
    tcomm_t *c = e->c;
    size_t n = e->lay.global_len;
    float *out = falloc(n);
    int sharded = grads ? e->zero >= 1 : e->zero >= 3;
    dump_t d = {.out = out};
    d.p = !grads ? e->params : e->zero == 1 ? e->gshard : e->grads;
    float *full = NULL; /* Muon's reduced gradients, gathered from the shards */
    if (grads && e->plan)
        d.p = full = muon_full_grads(e);
    if (!sharded) {
        for (int i = 0; i < e->lay.nu; i++) {
            const unit_t *u = &e->lay.u[i];
            d.all = counts_unit(e, u);
            layout_for_range(&e->lay, u->off, u->off + u->padded, dump_piece, &d);
        }
    } else {
        d.all = 1;
        for (int i = 0; i < e->lay.nu; i++) {
            const unit_t *u = &e->lay.u[i];
            size_t lo = shard_lo(e, u);
            d.pd = lo - shard_base(e, u);
            layout_for_range(&e->lay, lo, lo + shard_len(e, u), dump_piece, &d);
        }
    }
    free(full);
    /* Every element is owned by exactly one rank, so the sum is exact. */
    tc_check(loomReduce(out, out, n, loomFloat32, loomSum, 0, c->world, NULL), c, "loomReduce");
    int rc = 0;
    if (c->rank == 0) {
        FILE *f = fopen(path, "wb");
        rc = f && fwrite(out, sizeof(float), n, f) == n ? 0 : -1;
        if (f && fclose(f))
            rc = -1;
        if (rc)
            fprintf(stderr, "loom-train: cannot write %s\n", path);
    }
    free(out);
    return rc;
}

#define CKPT_MAGIC 0x6c6f6f6d74726e32ull /* "loomtrn2" */

typedef struct {
    uint64_t magic;
    int32_t size, dp, tp, pp, cp, zero, rank, optim, shard;
    int32_t vocab, ctx, d, heads, layers, moe_e, moe_k, moe_every, ep;
    uint64_t seed, pn, on, step; /* the data position is the step: batches depend on it alone */
} ckpt_hdr_t;

static void fill_hdr(const engine_t *e, ckpt_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    const grid_pos_t *g = &e->c->g;
    const model_cfg_t *m = &e->lay.cfg;
    h->magic = CKPT_MAGIC;
    h->size = e->c->size, h->dp = g->dp, h->tp = g->tp, h->pp = g->pp, h->cp = g->cp;
    h->zero = e->zero, h->rank = e->c->rank, h->optim = e->o->optim, h->shard = e->o->shard;
    h->vocab = m->vocab, h->ctx = m->ctx, h->d = m->d, h->heads = m->heads, h->layers = m->layers;
    h->moe_e = m->moe_e, h->moe_k = m->moe_k, h->moe_every = m->moe_every, h->ep = g->ep;
    h->seed = m->seed, h->pn = e->pn, h->on = e->on;
}

static void rank_path(char *buf, size_t n, const char *path, int rank)
{
    snprintf(buf, n, "%s.rank%d", path, rank);
}

int eng_save(engine_t *e, const char *path, char *err, size_t errlen)
{
    char p[4096], tmp[4200];
    rank_path(p, sizeof(p), path, e->c->rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    ckpt_hdr_t h;
    fill_hdr(e, &h);
    h.step = (uint64_t)e->step;
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(&h, sizeof(h), 1, f) == 1 &&
             fwrite(e->params, sizeof(float), e->pn, f) == e->pn &&
             fwrite(e->m, sizeof(float), e->on, f) == e->on &&
             fwrite(e->v, sizeof(float), e->vn, f) == e->vn;
    if (f && fclose(f))
        ok = 0;
    /* Written aside and renamed, so that a crash never leaves a torn checkpoint. */
    if (!ok || rename(tmp, p)) {
        snprintf(err, errlen, "cannot write checkpoint %s", p);
        remove(tmp);
        return -1;
    }
    return 0;
}

int eng_load(engine_t *e, const char *path, char *err, size_t errlen)
{
    char p[4096];
    rank_path(p, sizeof(p), path, e->c->rank);
    FILE *f = fopen(p, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open checkpoint %s", p);
        return -1;
    }
    ckpt_hdr_t h, want;
    fill_hdr(e, &want);
    int ok = fread(&h, sizeof(h), 1, f) == 1;
    if (ok) {
        uint64_t step = h.step;
        h.step = 0;
        if (memcmp(&h, &want, sizeof(h))) {
            snprintf(err, errlen, "checkpoint %s was written by another model or parallel layout",
                     p);
            fclose(f);
            return -1;
        }
        ok = fread(e->params, sizeof(float), e->pn, f) == e->pn &&
             fread(e->m, sizeof(float), e->on, f) == e->on &&
             fread(e->v, sizeof(float), e->vn, f) == e->vn;
        e->step = (int64_t)step;
    }
    fclose(f);
    if (!ok) {
        snprintf(err, errlen, "checkpoint %s is truncated", p);
        return -1;
    }
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * ckpt_global.c - the layout-independent checkpoint of --elastic: the global parameter vector and
 * AdamW's two moments in the global vector's order (what one process holds), so that any data
 * layout (dp 4 or dp 3, ZeRO 0 to 3, TP, PP) can write it and any other can read it. The
 * per-rank checkpoint of engine.c holds each rank's own buffers and so only fits the layout
 * that wrote it. Also the copy of a rank's state to and from global vectors in memory, which
 * the in-memory path of a recovery uses.
 */
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GCKPT_MAGIC 0x316267676d6f6f6cull /* "loomggb1" */

typedef struct {
    uint64_t magic;
    int32_t vocab, ctx, d, heads, layers, moe_e, moe_k, moe_every, optim, pad;
    uint64_t seed, global_len, step;
    uint64_t run_id; /* the run that wrote it (elastic.c): a recovery reloads only its own */
} gckpt_hdr_t;

/* What a walk over the rank's tensors copies between its buffers and the global vectors. A
 * local index i maps to element i - pd of params and i - od of m and v. */
typedef struct {
    engine_t *e;
    float *gp, *gm, *gv;
    size_t pd, od;
    int doparams, domoments; /* which buffers this range holds */
    int all;                 /* export: every element held, not only those this rank counts */
    int import;
} gwalk_t;

static void walk_piece(const ltensor_t *t, size_t lo, size_t hi, void *arg)
{
    gwalk_t *w = arg;
    engine_t *e = w->e;
    if (!w->import && !w->all && !t->counted)
        return;
    for (size_t i = lo; i < hi; i++) {
        size_t k = i - t->off;
        size_t g = ltensor_global(t, (int)(k / (size_t)t->cols), (int)(k % (size_t)t->cols));
        if (w->import) {
            if (w->doparams)
                e->params[i - w->pd] = w->gp[g];
            if (w->domoments)
                e->m[i - w->od] = w->gm[g], e->v[i - w->od] = w->gv[g];
        } else {
            if (w->doparams)
                w->gp[g] = e->params[i - w->pd];
            if (w->domoments)
                w->gm[g] = e->m[i - w->od], w->gv[g] = e->v[i - w->od];
        }
    }
}

/* Walks every unit: its full range for what the rank holds whole, its shard (an equal range of
 * the unit per data rank, as engine.c shards) for what ZeRO shards. On export without `all`, the
 * replicas of a whole unit other than data rank 0's are skipped, so that each element comes from
 * one rank of the world. */
static void walk(engine_t *e, gwalk_t *w)
{
    for (int i = 0; i < e->lay.nu; i++) {
        const unit_t *u = &e->lay.u[i];
        size_t len = u->padded / (size_t)e->shards, base = u->off / (size_t)e->shards;
        size_t lo = u->off + (size_t)e->srank * len, d = lo - base;
        int whole_counts = w->import || w->all || e->c->data_rank == 0;
        if (e->zero == 0) {
            w->pd = w->od = 0, w->doparams = w->domoments = whole_counts;
            layout_for_range(&e->lay, u->off, u->off + u->padded, walk_piece, w);
            continue;
        }
        /* the moments (and under ZeRO-3 the parameters) over the shard */
        w->pd = e->zero >= 3 ? d : 0, w->od = d;
        w->domoments = 1, w->doparams = e->zero >= 3 || !w->import;
        layout_for_range(&e->lay, lo, lo + len, walk_piece, w);
        if (e->zero < 3 && w->import) { /* ZeRO-1/2 hold the parameters whole */
            w->pd = 0, w->doparams = 1, w->domoments = 0;
            layout_for_range(&e->lay, u->off, u->off + u->padded, walk_piece, w);
        }
    }
}

void eng_export(engine_t *e, float *gp, float *gm, float *gv, int all)
{
    gwalk_t w = {.e = e, .gp = gp, .gm = gm, .gv = gv, .all = all};
    walk(e, &w);
}

void eng_import(engine_t *e, const float *gp, const float *gm, const float *gv)
{
    gwalk_t w = {.e = e, .gp = (float *)gp, .gm = (float *)gm, .gv = (float *)gv, .import = 1};
    walk(e, &w);
}

static void fill_hdr(const engine_t *e, gckpt_hdr_t *h)
{
    const model_cfg_t *m = &e->lay.cfg;
    memset(h, 0, sizeof(*h));
    h->magic = GCKPT_MAGIC;
    h->vocab = m->vocab, h->ctx = m->ctx, h->d = m->d, h->heads = m->heads;
    h->layers = m->layers, h->moe_e = m->moe_e, h->moe_k = m->moe_k, h->moe_every = m->moe_every;
    h->optim = e->o->optim, h->seed = m->seed, h->global_len = e->lay.global_len;
}

static void global_path(char *buf, size_t n, const char *prefix)
{
    snprintf(buf, n, "%s.global", prefix);
}

int ckpt_global_exists(const char *prefix)
{
    char p[4096];
    global_path(p, sizeof(p), prefix);
    FILE *f = fopen(p, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

int ckpt_global_save(engine_t *e, const char *prefix, uint64_t run_id, char *err, size_t errlen)
{
    tcomm_t *c = e->c;
    size_t n = e->lay.global_len;
    float *buf = calloc(3 * n, sizeof(float));
    double ok = buf ? 1 : 0;
    char p[4096], tmp[4200];
    global_path(p, sizeof(p), prefix);
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    loomResult_t rc = loomSuccess;
    if (buf) {
        eng_export(e, buf, buf + n, buf + 2 * n, 0);
        /* Every element comes from exactly one rank, so the sums are exact. */
        rc = loomReduce(buf, buf, 3 * n, loomFloat32, loomSum, 0, c->world, NULL);
    }
    if (buf && rc == loomSuccess && c->rank == 0) {
        gckpt_hdr_t h;
        fill_hdr(e, &h);
        h.step = (uint64_t)e->step, h.run_id = run_id;
        FILE *f = fopen(tmp, "wb");
        ok = f && fwrite(&h, sizeof(h), 1, f) == 1 && fwrite(buf, sizeof(float), 3 * n, f) == 3 * n;
        if (f && fclose(f))
            ok = 0;
        /* written aside and renamed: a crash never leaves a torn checkpoint */
        if (!ok || rename(tmp, p)) {
            remove(tmp);
            ok = 0;
        }
    }
    /* The buffer goes before a failed call can unwind the step (tc_check under --elastic). */
    free(buf);
    tc_check(rc, c, "loomReduce (checkpoint)");
    tc_check(loomAllReduce(&ok, &ok, 1, loomFloat64, loomMin, c->world, NULL), c,
             "loomAllReduce (checkpoint)");
    if (ok < 1) {
        snprintf(err, errlen, "cannot write checkpoint %s", p);
        return -1;
    }
    return 0;
}

int ckpt_global_load(engine_t *e, const char *prefix, uint64_t *step, uint64_t *run_id, char *err,
                     size_t errlen)
{
    char p[4096];
    global_path(p, sizeof(p), prefix);
    FILE *f = fopen(p, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open checkpoint %s", p);
        return -1;
    }
    gckpt_hdr_t h, want;
    fill_hdr(e, &want);
    int ok = fread(&h, sizeof(h), 1, f) == 1;
    if (ok) {
        *step = h.step, *run_id = h.run_id;
        h.step = 0, h.run_id = 0;
        if (memcmp(&h, &want, sizeof(h))) {
            snprintf(err, errlen, "checkpoint %s was written for another model or optimizer", p);
            fclose(f);
            return -1;
        }
    }
    size_t n = e->lay.global_len;
    float *buf = ok ? malloc(3 * n * sizeof(float)) : NULL;
    ok = buf && fread(buf, sizeof(float), 3 * n, f) == 3 * n;
    fclose(f);
    if (ok) {
        eng_import(e, buf, buf + n, buf + 2 * n);
        e->step = (int64_t)*step;
    }
    free(buf);
    if (!ok) {
        snprintf(err, errlen, "checkpoint %s is truncated (or out of memory)", p);
        return -1;
    }
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * stage.c - the forward and backward of this rank's pipeline stage for one micro-batch: the
 * embeddings on the first stage, the stage's blocks, and on the last stage the final LayerNorm,
 * the tied LM head and the loss. Parameters and gradient accumulators are taken from the engine
 * unit by unit, so that ZeRO-3 gathers a unit just before it is used and frees it after, and
 * gradient reduction starts as soon as a unit's backward is done.
 */
#include "train.h"

#include "ops.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xalloc(size_t n, size_t sz, size_t *count)
{
    if (count)
        *count += n;
    return train_calloc(n, sz);
}

int mb_alloc(mb_acts_t *a, const layout_t *lay, int nseq, int tl)
{
    memset(a, 0, sizeof(*a));
    int n = nseq * tl, C = lay->cfg.d, nl = lay->l1 - lay->l0;
    size_t N = (size_t)n, *f = &a->floats;
    a->n = n, a->nseq = nseq, a->tl = tl, a->nl = nl;
    a->tok = xalloc(N, 1, NULL);
    a->tgt = xalloc(N, 1, NULL);
    a->pos = xalloc(N, sizeof(int32_t), NULL);
    a->x = xalloc((size_t)(nl + 1) * N * (size_t)C, sizeof(float), f);
    a->b = xalloc((size_t)nl, sizeof(block_acts_t), NULL);
    for (int l = 0; l < nl; l++) {
        block_acts_t *b = &a->b[l];
        b->h1 = xalloc(N * (size_t)C, sizeof(float), f);
        b->mean1 = xalloc(N, sizeof(float), f);
        b->rstd1 = xalloc(N, sizeof(float), f);
        b->qkv = xalloc(3 * N * (size_t)lay->cl, sizeof(float), f);
        b->att = xalloc(N * (size_t)lay->cl, sizeof(float), f);
        b->lse = xalloc(N * (size_t)lay->hl, sizeof(float), f);
        b->x2 = xalloc(N * (size_t)C, sizeof(float), f);
        b->h2 = xalloc(N * (size_t)C, sizeof(float), f);
        b->mean2 = xalloc(N, sizeof(float), f);
        b->rstd2 = xalloc(N, sizeof(float), f);
        if (layout_is_moe(&lay->cfg, lay->l0 + l)) {
            moe_acts_alloc(b, lay, lay->l0 + l, n, f);
            continue;
        }
        b->up = xalloc(N * (size_t)lay->fl, sizeof(float), f);
        b->gel = xalloc(N * (size_t)lay->fl, sizeof(float), f);
    }
    if (lay->last) {
        a->hf = xalloc(N * (size_t)C, sizeof(float), f);
        a->meanf = xalloc(N, sizeof(float), f);
        a->rstdf = xalloc(N, sizeof(float), f);
        a->dlogits = xalloc(N * (size_t)lay->cfg.vocab, sizeof(float), f);
    }
    return 0;
}

static void block_acts_free(block_acts_t *b)
{
    free(b->h1), free(b->mean1), free(b->rstd1), free(b->qkv), free(b->att), free(b->lse);
    free(b->x2), free(b->h2), free(b->mean2), free(b->rstd2), free(b->up), free(b->gel);
    moe_acts_free(b);
}

void mb_free(mb_acts_t *a)
{
    for (int l = 0; l < a->nl && a->b; l++)
        block_acts_free(&a->b[l]);
    free(a->b);
    free(a->tok);
    free(a->tgt);
    free(a->pos);
    free(a->x);
    free(a->hf);
    free(a->meanf);
    free(a->rstdf);
    free(a->dlogits);
    memset(a, 0, sizeof(*a));
}

int stage_init(stage_t *s, engine_t *e, tcomm_t *c, const opts_t *o, int nseq)
{
    memset(s, 0, sizeof(*s));
    s->e = e, s->c = c, s->o = o, s->lay = &e->lay;
    const layout_t *lay = s->lay;
    int cp = lay->g.cp, T = lay->cfg.ctx, tc = T / (2 * cp), tl = T / cp;
    /* Zigzag: CP rank r holds chunks r and 2cp-1-r of every sequence, so that each rank has as
     * much causal attention work as any other. */
    s->cppos = xalloc((size_t)cp, sizeof(int32_t *), NULL);
    for (int r = 0; r < cp; r++) {
        s->cppos[r] = xalloc((size_t)tl, sizeof(int32_t), NULL);
        for (int j = 0; j < tc; j++) {
            s->cppos[r][j] = r * tc + j;
            s->cppos[r][tc + j] = (2 * cp - 1 - r) * tc + j;
        }
    }
    size_t N = (size_t)nseq * (size_t)tl, C = (size_t)lay->cfg.d, cl = (size_t)lay->cl;
    s->ml = xalloc(2 * N * (size_t)lay->hl, sizeof(float), NULL);
    for (int i = 0; i < 2; i++) {
        s->kvbuf[i] = xalloc(2 * N * cl, sizeof(float), NULL);
        s->dkvbuf[i] = xalloc(2 * N * cl, sizeof(float), NULL);
    }
    s->dx = xalloc(N * C, sizeof(float), NULL);
    s->dh = xalloc(N * C, sizeof(float), NULL);
    s->dtmp = xalloc(N * C, sizeof(float), NULL);
    s->dqkv = xalloc(3 * N * cl, sizeof(float), NULL);
    s->datt = xalloc(N * cl, sizeof(float), NULL);
    s->dup = xalloc(N * (size_t)lay->fl, sizeof(float), NULL);
    s->delta = xalloc(N * (size_t)lay->hl, sizeof(float), NULL);
    moe_init(s, (int)N);
    ulysses_init(s, (int)N);
    return 0;
}

void stage_free(stage_t *s)
{
    for (int r = 0; s->cppos && r < s->lay->g.cp; r++)
        free(s->cppos[r]);
    free(s->cppos);
    free(s->ml);
    for (int i = 0; i < 2; i++) {
        free(s->kvbuf[i]);
        free(s->dkvbuf[i]);
    }
    free(s->dx), free(s->dh), free(s->dtmp), free(s->dqkv), free(s->datt), free(s->dup);
    free(s->delta);
    free(s->lossbuf);
    moe_free(s);
    ulysses_free(s);
    zb_free(s);
    memset(s, 0, sizeof(*s));
}

/* wte as the head sees it: the embedding unit's on a single stage, the last stage's copy
 * otherwise. Returns the unit it lives in, and its offset inside that unit. */
static const unit_t *head_wte(const layout_t *lay, size_t *off)
{
    const unit_t *u = layout_unit_of(lay, lay->first ? UNIT_EMB : UNIT_FINAL);
    *off = lay->t[u->t0 + (lay->first ? 0 : 2)].off - u->off;
    return u;
}

static size_t toff(const layout_t *lay, const unit_t *u, int i)
{
    return lay->t[u->t0 + i].off - u->off;
}

void stage_forward(stage_t *s, mb_acts_t *a, double scale)
{
    engine_t *e = s->e;
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, V = lay->cfg.vocab, nl = lay->l1 - lay->l0;
    size_t nc = (size_t)n * (size_t)C;
    const unit_t *emb = layout_unit_of(lay, UNIT_EMB);
    const float *PE = NULL;
    a->scale = scale;
    a->aux = 0;
    if (lay->first) {
        PE = eng_acquire(e, emb);
        embed_fwd_f(a->x, a->tok, a->pos, PE + toff(lay, emb, 0), PE + toff(lay, emb, 1), n, C);
    }
    for (int l = lay->l0; l < lay->l1; l++) {
        const unit_t *u = layout_block_unit(lay, l), *ux = layout_expert_unit(lay, l);
        const float *P = eng_acquire(e, u), *PX = ux ? eng_acquire(e, ux) : NULL;
        block_forward(s, l, P, PX, a, a->x + (size_t)(l - lay->l0) * nc,
                      a->x + (size_t)(l - lay->l0 + 1) * nc);
        if (ux)
            eng_release(e, ux);
        eng_release(e, u);
    }
    if (lay->last) {
        const unit_t *fin = layout_unit_of(lay, UNIT_FINAL);
        const float *PF = eng_acquire(e, fin);
        layernorm_fwd_f(a->hf, a->meanf, a->rstdf, a->x + (size_t)nl * nc, PF + toff(lay, fin, 0),
                        PF + toff(lay, fin, 1), n, C);
        size_t wo;
        const unit_t *hu = head_wte(lay, &wo);
        const float *wte = (hu == fin ? PF : PE) + wo;
        /* logits = hf wte^T: the head is the embedding, transposed. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, a->hf, C, wte, C, 0.0f,
                    a->dlogits, V);
        a->loss = xent_fwd_bwd_f(a->dlogits, a->tgt, n, V, scale);
        eng_release(e, fin);
    }
    if (lay->first)
        eng_release(e, emb);
}

void stage_backward(stage_t *s, mb_acts_t *a, float *dx, int last_micro)
{
    engine_t *e = s->e;
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, V = lay->cfg.vocab, nl = lay->l1 - lay->l0;
    size_t nc = (size_t)n * (size_t)C;
    const unit_t *emb = layout_unit_of(lay, UNIT_EMB);
    const float *PE = NULL;
    float *GE = NULL;
    /* On a single stage the embedding unit is used at both ends (tied head): it stays acquired
     * for the whole backward, and its gradients are reduced once the embedding's are in. */
    if (lay->first) {
        PE = eng_acquire(e, emb);
        GE = eng_grad_begin(e, emb);
    }
    if (lay->last) {
        const unit_t *fin = layout_unit_of(lay, UNIT_FINAL);
        const float *PF = eng_acquire(e, fin);
        float *GF = eng_grad_begin(e, fin);
        size_t wo;
        const unit_t *hu = head_wte(lay, &wo);
        const float *wte = (hu == fin ? PF : PE) + wo;
        float *dwte = (hu == fin ? GF : GE) + wo;
        /* dhf = dlogits wte; dwte += dlogits^T hf */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, a->dlogits, V, wte, C,
                    0.0f, s->dh, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, a->dlogits, V, a->hf, C,
                    1.0f, dwte, C);
        memset(dx, 0, nc * sizeof(float));
        layernorm_bwd_f(dx, GF + toff(lay, fin, 0), GF + toff(lay, fin, 1), s->dh,
                        a->x + (size_t)nl * nc, a->meanf, a->rstdf, PF + toff(lay, fin, 0), n, C);
        eng_grad_end(e, fin, last_micro);
        eng_release(e, fin);
    }
    for (int l = lay->l1 - 1; l >= lay->l0; l--) {
        const unit_t *u = layout_block_unit(lay, l), *ux = layout_expert_unit(lay, l);
        const float *P = eng_acquire(e, u), *PX = ux ? eng_acquire(e, ux) : NULL;
        float *G = eng_grad_begin(e, u), *GX = ux ? eng_grad_begin(e, ux) : NULL;
        block_backward(s, l, P, G, PX, GX, a, a->x + (size_t)(l - lay->l0) * nc, dx);
        if (ux) {
            eng_grad_end(e, ux, last_micro);
            eng_release(e, ux);
        }
        eng_grad_end(e, u, last_micro);
        eng_release(e, u);
    }
    if (lay->first) {
        embed_bwd_f(GE + toff(lay, emb, 0), GE + toff(lay, emb, 1), dx, a->tok, a->pos, n, C);
        eng_grad_end(e, emb, last_micro);
        eng_release(e, emb);
    }
}

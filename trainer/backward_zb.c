/* SPDX-License-Identifier: Apache-2.0
 *
 * backward_zb.c - the backward of a stage split in two for the zero-bubble schedules (Qi et al.,
 * "Zero Bubble Pipeline Parallelism", 2023). B computes the gradient of the stage's input, which
 * the previous stage waits for, with the LayerNorms' gradients (cheap, and they need the
 * LayerNorm's input gradient at hand) and a MoE block's whole MLP backward; it keeps the output
 * gradient of each linear layer. TP's all-reduces, CP's ring and Ulysses' all-to-alls stay in B.
 * W computes the weight gradients of the linear layers, the head and the embeddings from those,
 * later. Every matrix product is the one block_backward and
 * stage_backward run, on the same operands and accumulated with beta 1, so that W's run in
 * micro-batch order accumulate exactly the gradients of 1F1B.
 */
#include "zb.h"

#include "ops.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *zalloc(size_t n, size_t *count)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    *count += n;
    return p;
}

static float **palloc(int n)
{
    float **p = calloc((size_t)(n ? n : 1), sizeof(float *));
    if (!p) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    return p;
}

void zb_keep_alloc(zb_keep_t *k, const layout_t *lay, int n)
{
    memset(k, 0, sizeof(*k));
    int nl = lay->l1 - lay->l0;
    size_t N = (size_t)n, C = (size_t)lay->cfg.d;
    k->dxo = palloc(nl), k->dup = palloc(nl), k->dx2 = palloc(nl), k->dqkv = palloc(nl);
    for (int l = 0; l < nl; l++) {
        if (!layout_is_moe(&lay->cfg, lay->l0 + l)) {
            k->dxo[l] = zalloc(N * C, &k->floats);
            k->dup[l] = zalloc(N * (size_t)lay->fl, &k->floats);
        }
        k->dx2[l] = zalloc(N * C, &k->floats);
        k->dqkv[l] = zalloc(3 * N * (size_t)lay->cl, &k->floats);
    }
    if (lay->first)
        k->dx0 = zalloc(N * C, &k->floats);
    k->nl = nl;
}

void zb_keep_free(zb_keep_t *k)
{
    for (int l = 0; l < k->nl; l++)
        free(k->dxo[l]), free(k->dup[l]), free(k->dx2[l]), free(k->dqkv[l]);
    free(k->dxo), free(k->dup), free(k->dx2), free(k->dqkv), free(k->dx0);
    memset(k, 0, sizeof(*k));
}

static const float *Wt(const stage_t *s, const float *P, int layer, int kind)
{
    const ltensor_t *t = layout_block_tensor(s->lay, layer, kind);
    const unit_t *u = layout_block_unit(s->lay, layer);
    return P + (t->off - u->off);
}

static float *GWt(const stage_t *s, float *G, int layer, int kind)
{
    return (float *)Wt(s, G, layer, kind);
}

/* B of one block: dx, the gradient of the block's output on entry, is that of its input on
 * return. block_backward's order, without the weight products. */
static void block_b(stage_t *s, int layer, const float *P, float *G, const float *PX, float *GX,
                    mb_acts_t *a, const float *x, float *dx, zb_keep_t *k)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, cl = lay->cl, fl = lay->fl, l = layer - lay->l0;
    block_acts_t *b = &a->b[l];
    size_t nc = (size_t)n * (size_t)C, blk = (size_t)n * (size_t)cl;
    if (PX) {
        moe_backward(s, layer, P, G, PX, GX, a, b, dx, s->dh);
    } else {
        memcpy(k->dxo[l], dx, nc * sizeof(float));
        linear_bwd_f(k->dup[l], NULL, dx, b->gel, Wt(s, P, layer, TK_WDOWN), n, fl, C);
        gelu_bwd_f(k->dup[l], k->dup[l], b->up, (size_t)n * (size_t)fl);
        linear_bwd_f(s->dh, NULL, k->dup[l], b->h2, Wt(s, P, layer, TK_WUP), n, C, fl);
        tc_tp_backward(s->c, s->dh, nc);
    }
    layernorm_bwd_f(dx, GWt(s, G, layer, TK_LN2W), GWt(s, G, layer, TK_LN2B), s->dh, b->x2,
                    b->mean2, b->rstd2, Wt(s, P, layer, TK_LN2W), n, C);
    memcpy(k->dx2[l], dx, nc * sizeof(float));
    linear_bwd_f(s->datt, NULL, dx, b->att, Wt(s, P, layer, TK_WO), n, cl, C);
    float *dqkv = k->dqkv[l];
    if (s->o->sp > 1)
        ulysses_bwd(s, a, b->qkv, b->att, b->lse, s->datt, dqkv);
    else
        attention_bwd(s, a, b->qkv, b->att, b->lse, s->datt, dqkv);
    linear_bwd_f(s->dh, NULL, dqkv, b->h1, Wt(s, P, layer, TK_WQ), n, C, cl);
    for (int j = 1; j < 3; j++) {
        int kind = j == 1 ? TK_WK : TK_WV;
        linear_bwd_f(s->dtmp, NULL, dqkv + (size_t)j * blk, b->h1, Wt(s, P, layer, kind), n, C, cl);
        for (size_t i = 0; i < nc; i++)
            s->dh[i] += s->dtmp[i];
    }
    tc_tp_backward(s->c, s->dh, nc);
    layernorm_bwd_f(dx, GWt(s, G, layer, TK_LN1W), GWt(s, G, layer, TK_LN1B), s->dh, x, b->mean1,
                    b->rstd1, Wt(s, P, layer, TK_LN1W), n, C);
}

/* W of one block: the weight products block_backward runs (linear_bwd_f's first product). */
static void block_w(stage_t *s, int layer, float *G, mb_acts_t *a, const zb_keep_t *k)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, cl = lay->cl, fl = lay->fl, l = layer - lay->l0;
    block_acts_t *b = &a->b[l];
    size_t blk = (size_t)n * (size_t)cl;
    if (k->dxo[l]) {
        linear_bwd_f(NULL, GWt(s, G, layer, TK_WDOWN), k->dxo[l], b->gel, NULL, n, fl, C);
        linear_bwd_f(NULL, GWt(s, G, layer, TK_WUP), k->dup[l], b->h2, NULL, n, C, fl);
    }
    linear_bwd_f(NULL, GWt(s, G, layer, TK_WO), k->dx2[l], b->att, NULL, n, cl, C);
    static const int kinds[3] = {TK_WQ, TK_WK, TK_WV};
    for (int j = 0; j < 3; j++)
        linear_bwd_f(NULL, GWt(s, G, layer, kinds[j]), k->dqkv[l] + (size_t)j * blk, b->h1, NULL, n,
                     C, cl);
}

/* wte as the head sees it (stage.c's head_wte): the embedding unit's on a single stage, the last
 * stage's copy otherwise; its offset inside that unit. */
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

void stage_backward_b(stage_t *s, mb_acts_t *a, float *dx, zb_keep_t *k, int last_micro)
{
    engine_t *e = s->e;
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, V = lay->cfg.vocab, nl = lay->l1 - lay->l0;
    size_t nc = (size_t)n * (size_t)C;
    const unit_t *emb = layout_unit_of(lay, UNIT_EMB);
    const float *PE = NULL;
    if (lay->first)
        PE = eng_acquire(e, emb);
    if (lay->last) {
        const unit_t *fin = layout_unit_of(lay, UNIT_FINAL);
        const float *PF = eng_acquire(e, fin);
        float *GF = eng_grad_begin(e, fin);
        size_t wo;
        const unit_t *hu = head_wte(lay, &wo);
        const float *wte = (hu == fin ? PF : PE) + wo;
        /* dhf = dlogits wte; the head's dwte is W's */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, a->dlogits, V, wte, C,
                    0.0f, s->dh, C);
        memset(dx, 0, nc * sizeof(float));
        layernorm_bwd_f(dx, GF + toff(lay, fin, 0), GF + toff(lay, fin, 1), s->dh,
                        a->x + (size_t)nl * nc, a->meanf, a->rstdf, PF + toff(lay, fin, 0), n, C);
        eng_grad_end(e, fin, 0);
        eng_release(e, fin);
    }
    for (int l = lay->l1 - 1; l >= lay->l0; l--) {
        const unit_t *u = layout_block_unit(lay, l), *ux = layout_expert_unit(lay, l);
        const float *P = eng_acquire(e, u), *PX = ux ? eng_acquire(e, ux) : NULL;
        float *G = eng_grad_begin(e, u), *GX = ux ? eng_grad_begin(e, ux) : NULL;
        block_b(s, l, P, G, PX, GX, a, a->x + (size_t)(l - lay->l0) * nc, dx, k);
        if (ux) {
            /* the experts' unit has no W: its gradients are whole after this B */
            eng_grad_end(e, ux, last_micro);
            eng_release(e, ux);
        }
        eng_grad_end(e, u, 0);
        eng_release(e, u);
    }
    if (lay->first) {
        memcpy(k->dx0, dx, nc * sizeof(float));
        eng_release(e, emb);
    }
}

void stage_backward_w(stage_t *s, mb_acts_t *a, const zb_keep_t *k, int last_micro)
{
    engine_t *e = s->e;
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, V = lay->cfg.vocab;
    const unit_t *emb = layout_unit_of(lay, UNIT_EMB);
    float *GE = lay->first ? eng_grad_begin(e, emb) : NULL;
    if (lay->last) {
        const unit_t *fin = layout_unit_of(lay, UNIT_FINAL);
        float *GF = eng_grad_begin(e, fin);
        size_t wo;
        const unit_t *hu = head_wte(lay, &wo);
        float *dwte = (hu == fin ? GF : GE) + wo;
        /* dwte += dlogits^T hf, as stage_backward: before the embedding's (single stage) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, a->dlogits, V, a->hf, C,
                    1.0f, dwte, C);
        eng_grad_end(e, fin, last_micro);
    }
    for (int l = lay->l1 - 1; l >= lay->l0; l--) {
        const unit_t *u = layout_block_unit(lay, l);
        float *G = eng_grad_begin(e, u);
        block_w(s, l, G, a, k);
        eng_grad_end(e, u, last_micro);
    }
    if (lay->first) {
        embed_bwd_f(GE + toff(lay, emb, 0), GE + toff(lay, emb, 1), k->dx0, a->tok, a->pos, n, C);
        eng_grad_end(e, emb, last_micro);
    }
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * block.c - one transformer block on one rank: Megatron tensor parallelism (Q, K, V and the MLP's
 * first layer split by columns, the attention output and the MLP's second layer by rows, one
 * all-reduce after each row-parallel layer in the forward and one per column-parallel input in
 * the backward) and context parallelism (ring attention: each rank keeps its queries and passes
 * key/value blocks around the CP ring, merging them with an online softmax; in the backward the
 * key/value gradients travel with their blocks and arrive home after a full turn), or with --sp
 * ulysses.c's all-to-all attention over the same split. A MoE block's MLP is moe.c's mixture of
 * experts.
 */
#include "train.h"

#include "ops.h"

#include <math.h>
#include <string.h>

static const float *W(const stage_t *s, const float *P, int layer, int kind)
{
    const ltensor_t *t = layout_block_tensor(s->lay, layer, kind);
    const unit_t *u = layout_block_unit(s->lay, layer);
    return P + (t->off - u->off);
}

static float *GW(const stage_t *s, float *G, int layer, int kind)
{
    return (float *)W(s, G, layer, kind);
}

/* Attention over the whole sequence for this rank's queries: a turn of the CP ring (one step
 * when cp is 1). att receives the output, lse the log-sum-exp per row and head. */
static void attention_fwd(stage_t *s, mb_acts_t *a, const float *qkv, float *att, float *lse)
{
    const layout_t *lay = s->lay;
    tcomm_t *c = s->c;
    int n = a->n, tl = a->tl, cl = lay->cl, hl = lay->hl, hd = lay->cfg.d / lay->cfg.heads;
    int cp = lay->g.cp, me = lay->g.cp_i;
    size_t blk = (size_t)n * (size_t)cl;
    const float *q = qkv, *kv = qkv + blk; /* [k | v], each n x cl: the block that travels */
    float *m = s->ml, *l = s->ml + (size_t)n * (size_t)hl;
    memset(att, 0, blk * sizeof(float));
    for (size_t i = 0; i < (size_t)n * (size_t)hl; i++)
        m[i] = -INFINITY, l[i] = 0.0f;
    int nb = 0;
    for (int step = 0; step < cp; step++) {
        int src = (me - step + cp) % cp;
        for (int b = 0; b < a->nseq; b++) {
            size_t r = (size_t)b * (size_t)tl;
            attn_fwd_block_f(att + r * cl, m + r * hl, l + r * hl, cl, q + r * cl, cl, s->cppos[me],
                             tl, kv + r * cl, cl, kv + blk + r * cl, cl, s->cppos[src], tl, hl, hd);
        }
        if (step + 1 < cp) {
            tc_exchange(c, P_CP, c->cp, c->cp_next, kv, NULL, c->cp_prev, s->kvbuf[nb], NULL,
                        2 * blk);
            kv = s->kvbuf[nb];
            nb ^= 1;
        }
    }
    attn_fwd_finish_f(att, cl, lse, att, cl, m, l, n, hl, hd);
}

/* Backward of attention_fwd: datt in, dq/dk/dv out (written) into dqkv. */
void attention_bwd(stage_t *s, mb_acts_t *a, const float *qkv, const float *att, const float *lse,
                   const float *datt, float *dqkv)
{
    const layout_t *lay = s->lay;
    tcomm_t *c = s->c;
    int n = a->n, tl = a->tl, cl = lay->cl, hl = lay->hl, hd = lay->cfg.d / lay->cfg.heads;
    int cp = lay->g.cp, me = lay->g.cp_i;
    size_t blk = (size_t)n * (size_t)cl;
    const float *q = qkv, *kv = qkv + blk;
    float *dq = dqkv, *dkv = s->dkvbuf[0];
    attn_bwd_delta_f(s->delta, datt, cl, att, cl, n, hl, hd);
    memset(dq, 0, blk * sizeof(float));
    memset(dkv, 0, 2 * blk * sizeof(float));
    int nb = 0, dnb = 1;
    for (int step = 0; step < cp; step++) {
        int src = (me - step + cp) % cp;
        for (int b = 0; b < a->nseq; b++) {
            size_t r = (size_t)b * (size_t)tl;
            attn_bwd_block_f(dq + r * cl, cl, dkv + r * cl, cl, dkv + blk + r * cl, cl,
                             datt + r * cl, cl, lse + r * hl, s->delta + r * hl, q + r * cl, cl,
                             s->cppos[me], tl, kv + r * cl, cl, kv + blk + r * cl, cl,
                             s->cppos[src], tl, hl, hd);
        }
        if (cp > 1) {
            /* The key/value gradients follow their block; after cp moves they are home. */
            tc_exchange(c, P_CP, c->cp, c->cp_next, kv, dkv, c->cp_prev, s->kvbuf[nb],
                        s->dkvbuf[dnb], 2 * blk);
            kv = s->kvbuf[nb];
            dkv = s->dkvbuf[dnb];
            nb ^= 1;
            dnb ^= 1;
        }
    }
    memcpy(dqkv + blk, dkv, 2 * blk * sizeof(float));
}

void block_forward(stage_t *s, int layer, const float *P, const float *PX, mb_acts_t *a,
                   const float *x, float *xout)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, cl = lay->cl, fl = lay->fl;
    block_acts_t *b = &a->b[layer - lay->l0];
    size_t nc = (size_t)n * (size_t)C, blk = (size_t)n * (size_t)cl;
    layernorm_fwd_f(b->h1, b->mean1, b->rstd1, x, W(s, P, layer, TK_LN1W), W(s, P, layer, TK_LN1B),
                    n, C);
    linear_fwd_f(b->qkv, b->h1, W(s, P, layer, TK_WQ), n, C, cl, 0);
    linear_fwd_f(b->qkv + blk, b->h1, W(s, P, layer, TK_WK), n, C, cl, 0);
    linear_fwd_f(b->qkv + 2 * blk, b->h1, W(s, P, layer, TK_WV), n, C, cl, 0);
    if (s->o->sp > 1)
        ulysses_fwd(s, a, b->qkv, b->att, b->lse);
    else
        attention_fwd(s, a, b->qkv, b->att, b->lse);
    /* Row-parallel output projection: partial sums, completed by the TP all-reduce. */
    linear_fwd_f(b->x2, b->att, W(s, P, layer, TK_WO), n, cl, C, 0);
    tc_tp_forward(s->c, b->x2, nc, s->eval);
    for (size_t i = 0; i < nc; i++)
        b->x2[i] += x[i];
    layernorm_fwd_f(b->h2, b->mean2, b->rstd2, b->x2, W(s, P, layer, TK_LN2W),
                    W(s, P, layer, TK_LN2B), n, C);
    if (PX) {
        moe_forward(s, layer, P, PX, a, b, xout);
        for (size_t i = 0; i < nc; i++)
            xout[i] += b->x2[i];
        return;
    }
    linear_fwd_f(b->up, b->h2, W(s, P, layer, TK_WUP), n, C, fl, 0);
    gelu_fwd_f(b->gel, b->up, (size_t)n * (size_t)fl);
    linear_fwd_f(xout, b->gel, W(s, P, layer, TK_WDOWN), n, fl, C, 0);
    tc_tp_forward(s->c, xout, nc, s->eval);
    for (size_t i = 0; i < nc; i++)
        xout[i] += b->x2[i];
}

void block_backward(stage_t *s, int layer, const float *P, float *G, const float *PX, float *GX,
                    mb_acts_t *a, const float *x, float *dx)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, cl = lay->cl, fl = lay->fl;
    block_acts_t *b = &a->b[layer - lay->l0];
    size_t nc = (size_t)n * (size_t)C, blk = (size_t)n * (size_t)cl;
    /* MLP: dx is the gradient of the block output and, through the residual, of x2. */
    if (PX) {
        moe_backward(s, layer, P, G, PX, GX, a, b, dx, s->dh);
    } else {
        linear_bwd_f(s->dup, GW(s, G, layer, TK_WDOWN), dx, b->gel, W(s, P, layer, TK_WDOWN), n, fl,
                     C);
        gelu_bwd_f(s->dup, s->dup, b->up, (size_t)n * (size_t)fl);
        linear_bwd_f(s->dh, GW(s, G, layer, TK_WUP), s->dup, b->h2, W(s, P, layer, TK_WUP), n, C,
                     fl);
        tc_tp_backward(s->c, s->dh, nc);
    }
    layernorm_bwd_f(dx, GW(s, G, layer, TK_LN2W), GW(s, G, layer, TK_LN2B), s->dh, b->x2, b->mean2,
                    b->rstd2, W(s, P, layer, TK_LN2W), n, C);
    /* Attention: dx is now the gradient of x2 and, through the residual, of x. */
    linear_bwd_f(s->datt, GW(s, G, layer, TK_WO), dx, b->att, W(s, P, layer, TK_WO), n, cl, C);
    if (s->o->sp > 1)
        ulysses_bwd(s, a, b->qkv, b->att, b->lse, s->datt, s->dqkv);
    else
        attention_bwd(s, a, b->qkv, b->att, b->lse, s->datt, s->dqkv);
    linear_bwd_f(s->dh, GW(s, G, layer, TK_WQ), s->dqkv, b->h1, W(s, P, layer, TK_WQ), n, C, cl);
    for (int k = 1; k < 3; k++) {
        int kind = k == 1 ? TK_WK : TK_WV;
        linear_bwd_f(s->dtmp, GW(s, G, layer, kind), s->dqkv + (size_t)k * blk, b->h1,
                     W(s, P, layer, kind), n, C, cl);
        for (size_t i = 0; i < nc; i++)
            s->dh[i] += s->dtmp[i];
    }
    tc_tp_backward(s->c, s->dh, nc);
    layernorm_bwd_f(dx, GW(s, G, layer, TK_LN1W), GW(s, G, layer, TK_LN1B), s->dh, x, b->mean1,
                    b->rstd1, W(s, P, layer, TK_LN1W), n, C);
}

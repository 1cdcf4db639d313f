/* SPDX-License-Identifier: Apache-2.0
 *
 * ulysses.c - DeepSpeed-Ulysses sequence parallelism (--sp N): the sequence is split over the
 * grid's cp dimension in the same zigzag chunks as ring attention, but around attention an
 * all-to-all turns the sequence-sharded Q, K, V (this rank's tokens, all its heads) into
 * head-sharded ones (every token of the sequence, heads/sp of them); attention then runs locally
 * over whole sequences and a second all-to-all brings the output back to the rank of its tokens.
 * The backward does the reverse: one all-to-all for the output's gradient (with the softmax's row
 * terms, computed where the output lives), one for the Q, K, V gradients.
 *
 * Layouts (w: q, k, v; b: sequence of the micro-batch; t: token of a rank's chunk; r, j: SP
 * ranks; width = cl / sp, the floats of this rank's hs = hl / sp heads):
 *   sequence-sharded  [w][b][t][cl]          (rank r's tokens, all local heads)
 *   exchanged block   [j][w][b][t][width]    (block j goes to / comes from rank j)
 *   head-sharded      [w][b][r * tl + t][width]  (whole sequences in the order of sppos)
 * A head-sharded tensor holds exactly as many floats as its sequence-sharded one, so the block's
 * activations (qkv, lse) keep the head-sharded form for the backward at no extra memory.
 */
#include "train.h"

#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ulysses_init(stage_t *s, int n)
{
    int sp = s->o->sp, tl = s->lay->cfg.ctx / (sp > 0 ? sp : 1);
    if (sp <= 1)
        return;
    size_t buf = 3 * (size_t)n * (size_t)s->lay->cl;
    s->sppos = malloc((size_t)sp * (size_t)tl * sizeof(int32_t));
    s->spbuf[0] = malloc(buf * sizeof(float));
    s->spbuf[1] = malloc(buf * sizeof(float));
    if (!s->sppos || !s->spbuf[0] || !s->spbuf[1]) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < sp; r++)
        memcpy(s->sppos + (size_t)r * (size_t)tl, s->cppos[r], (size_t)tl * sizeof(int32_t));
}

void ulysses_free(stage_t *s)
{
    free(s->sppos);
    free(s->spbuf[0]);
    free(s->spbuf[1]);
    s->sppos = NULL;
    s->spbuf[0] = s->spbuf[1] = NULL;
}

/* Sequence-sharded -> exchange blocks: dst[j * pstride + (w * n + i) * width] = src[(w * n + i)
 * * ld + j * width], for nw matrices of n rows. */
static void scatter_cols(float *dst, size_t pstride, const float *src, int nw, int n, int ld,
                         int width, int sp)
{
    for (int j = 0; j < sp; j++)
        for (size_t i = 0; i < (size_t)nw * (size_t)n; i++)
            memcpy(dst + (size_t)j * pstride + i * (size_t)width,
                   src + i * (size_t)ld + (size_t)j * (size_t)width, (size_t)width * sizeof(float));
}

/* Its inverse: exchange blocks -> sequence-sharded columns. */
static void gather_cols(float *dst, int ld, const float *src, size_t pstride, int nw, int n,
                        int width, int sp)
{
    for (int j = 0; j < sp; j++)
        for (size_t i = 0; i < (size_t)nw * (size_t)n; i++)
            memcpy(dst + i * (size_t)ld + (size_t)j * (size_t)width,
                   src + (size_t)j * pstride + i * (size_t)width, (size_t)width * sizeof(float));
}

/* Exchange blocks (rank r's chunk of each sequence) -> whole sequences, chunks in rank order:
 * dst[((w * nseq + b) * sp * tl + r * tl + t) * width] = src[r * pstride + ((w * nseq + b) * tl +
 * t) * width]; with to_blocks, the other way. */
static void chunks(float *seq, float *blocks, size_t pstride, int nw, int nseq, int tl, int width,
                   int sp, int to_blocks)
{
    size_t run = (size_t)tl * (size_t)width;
    for (int r = 0; r < sp; r++)
        for (size_t wb = 0; wb < (size_t)nw * (size_t)nseq; wb++) {
            float *sq = seq + (wb * (size_t)sp + (size_t)r) * run;
            float *bl = blocks + (size_t)r * pstride + wb * run;
            if (to_blocks)
                memcpy(bl, sq, run * sizeof(float));
            else
                memcpy(sq, bl, run * sizeof(float));
        }
}

void ulysses_fwd(stage_t *s, mb_acts_t *a, float *qkv, float *att, float *lse)
{
    const layout_t *lay = s->lay;
    tcomm_t *c = s->c;
    int sp = s->o->sp, n = a->n, tl = a->tl, T = tl * sp, cl = lay->cl, hl = lay->hl;
    int hd = lay->cfg.d / lay->cfg.heads, hs = hl / sp, width = cl / sp;
    size_t blk = (size_t)n * (size_t)cl, nh = (size_t)n * (size_t)hl;
    float *sb = s->spbuf[0], *rb = s->spbuf[1];
    /* Q, K, V: my tokens, every local head -> every token, my heads; kept head-sharded. */
    scatter_cols(sb, 3 * (size_t)n * (size_t)width, qkv, 3, n, cl, width, sp);
    tc_alltoall(c, P_SP, c->cp, sb, rb, 3 * (size_t)n * (size_t)width);
    chunks(qkv, rb, 3 * (size_t)n * (size_t)width, 3, a->nseq, tl, width, sp, 0);
    /* Causal attention over each whole sequence; the zigzag order of the positions is the mask's
     * business, not the order of the rows. */
    float *acc = sb, *m = s->ml, *l = s->ml + nh;
    memset(acc, 0, blk * sizeof(float));
    for (size_t i = 0; i < nh; i++)
        m[i] = -INFINITY, l[i] = 0.0f;
    for (int b = 0; b < a->nseq; b++) {
        size_t r = (size_t)b * (size_t)T;
        attn_fwd_block_f(acc + r * width, m + r * hs, l + r * hs, width, qkv + r * width, width,
                         s->sppos, T, qkv + blk + r * width, width, qkv + 2 * blk + r * width,
                         width, s->sppos, T, hs, hd);
    }
    attn_fwd_finish_f(acc, width, lse, acc, width, m, l, a->nseq * T, hs, hd);
    /* The output back to the ranks of its tokens. */
    chunks(acc, rb, (size_t)n * (size_t)width, 1, a->nseq, tl, width, sp, 1);
    tc_alltoall(c, P_SP, c->cp, rb, sb, (size_t)n * (size_t)width);
    gather_cols(att, cl, sb, (size_t)n * (size_t)width, 1, n, width, sp);
}

void ulysses_bwd(stage_t *s, mb_acts_t *a, const float *qkv, const float *att, const float *lse,
                 const float *datt, float *dqkv)
{
    const layout_t *lay = s->lay;
    tcomm_t *c = s->c;
    int sp = s->o->sp, n = a->n, tl = a->tl, T = tl * sp, cl = lay->cl, hl = lay->hl;
    int hd = lay->cfg.d / lay->cfg.heads, hs = hl / sp, width = cl / sp;
    size_t blk = (size_t)n * (size_t)cl;
    float *sb = s->spbuf[0], *rb = s->spbuf[1];
    /* The softmax backward's row terms (dout . out per row and head) are computed here, where the
     * sequence-sharded output is, and travel with dout: one all-to-all, no head-sharded copy of
     * the output kept from the forward. Block j: dout of j's heads, then their row terms. */
    size_t pd = (size_t)n * (size_t)(width + hs);
    attn_bwd_delta_f(s->delta, datt, cl, att, cl, n, hl, hd);
    scatter_cols(sb, pd, datt, 1, n, cl, width, sp);
    scatter_cols(sb + (size_t)n * (size_t)width, pd, s->delta, 1, n, hl, hs, sp);
    tc_alltoall(c, P_SP, c->cp, sb, rb, pd);
    float *dout = sb, *dq = rb;
    chunks(dout, rb, pd, 1, a->nseq, tl, width, sp, 0);
    chunks(s->delta, rb + (size_t)n * (size_t)width, pd, 1, a->nseq, tl, hs, sp, 0);
    memset(dq, 0, 3 * blk * sizeof(float));
    for (int b = 0; b < a->nseq; b++) {
        size_t r = (size_t)b * (size_t)T;
        attn_bwd_block_f(dq + r * width, width, dq + blk + r * width, width,
                         dq + 2 * blk + r * width, width, dout + r * width, width, lse + r * hs,
                         s->delta + r * hs, qkv + r * width, width, s->sppos, T,
                         qkv + blk + r * width, width, qkv + 2 * blk + r * width, width, s->sppos,
                         T, hs, hd);
    }
    /* dq, dk, dv back to the ranks of their tokens. */
    size_t pq = 3 * (size_t)n * (size_t)width;
    chunks(dq, sb, pq, 3, a->nseq, tl, width, sp, 1);
    tc_alltoall(c, P_SP, c->cp, sb, rb, pq);
    gather_cols(dqkv, cl, rb, pq, 3, n, width, sp);
}

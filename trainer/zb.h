/* SPDX-License-Identifier: Apache-2.0
 *
 * zb.h - the split backward of the zero-bubble schedules: B (input gradients, what the previous
 * stage waits for) and W (the weight gradients of the linear layers and the embedding, deferred),
 * and what a micro-batch keeps from its B to its W. Shared by backward_zb.c and schedule_zb.c.
 */
#ifndef LOOM_TRAINER_ZB_H
#define LOOM_TRAINER_ZB_H

#include "train.h"

/* The output gradients (dy) the W of one micro-batch needs; their inputs (h1, att, h2, gel, hf)
 * are in the micro-batch's activations already. Per local layer; NULL for a MoE block's MLP,
 * whose whole backward runs in B. */
typedef struct {
    float **dxo;  /* [nl] [n][C]: the gradient of the block's output (dy of wdown) */
    float **dup;  /* [nl] [n][fl]: of the MLP's first layer, after GELU (dy of wup) */
    float **dx2;  /* [nl] [n][C]: of x2, the attention's residual sum (dy of wo) */
    float **dqkv; /* [nl] [3][n][cl]: of q, k and v (dy of wq, wk, wv) */
    float *dx0;   /* first stage: [n][C], the gradient of the embeddings' output */
    int nl;
    size_t floats; /* of one micro-batch: what each deferred W keeps */
} zb_keep_t;

void zb_keep_alloc(zb_keep_t *k, const layout_t *lay, int n);
void zb_keep_free(zb_keep_t *k);
/* B of the stage for one micro-batch: as stage_backward, but the linear layers' weight gradients
 * (and the embedding's, and the head's) are left to stage_backward_w; LayerNorm and MoE gradients
 * are accumulated here. TP and CP communication happen here. k receives what W needs. */
void stage_backward_b(stage_t *s, mb_acts_t *a, float *dx, zb_keep_t *k, int last_micro);
/* W: the weight gradients B left, with the same matrix products as stage_backward (same operands,
 * accumulated with beta 1); ends each unit's gradients (its reduction starts after the last
 * micro-batch's W). */
void stage_backward_w(stage_t *s, mb_acts_t *a, const zb_keep_t *k, int last_micro);

#endif

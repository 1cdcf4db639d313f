/* SPDX-License-Identifier: Apache-2.0
 *
 * schedule.c - the order of micro-batches through the pipeline. 1F1B (PipeDream-flush, as
 * Megatron-LM runs it): stage r first runs pp-r-1 forwards, then alternates one forward with one
 * backward, then drains the backwards; at most pp micro-batches are in flight. GPipe: every
 * forward, then every backward. Both run backwards in micro-batch order, so that they accumulate
 * gradients identically. With one stage, 1F1B is plain gradient accumulation. DualPipe has a
 * file of its own (schedule_dualpipe.c).
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t io_len(const stage_t *s, const mb_acts_t *a)
{
    return (size_t)a->n * (size_t)s->lay->cfg.d;
}
static float *stage_in(const stage_t *s, mb_acts_t *a)
{
    (void)s;
    return a->x;
}
static float *stage_out(const stage_t *s, mb_acts_t *a)
{
    return a->x + (size_t)a->nl * io_len(s, a);
}

/* Point to point with the neighbouring stages; absent neighbours make these no-ops. */
static void recv_forward(stage_t *s, mb_acts_t *a)
{
    tc_pp(s->c, -1, NULL, 0, s->c->pp_prev, stage_in(s, a), io_len(s, a));
}
static void send_forward(stage_t *s, mb_acts_t *a)
{
    tc_pp(s->c, s->c->pp_next, stage_out(s, a), io_len(s, a), -1, NULL, 0);
}
static void recv_backward(stage_t *s, mb_acts_t *a)
{
    tc_pp(s->c, -1, NULL, 0, s->c->pp_next, s->dx, io_len(s, a));
}
static void send_backward(stage_t *s, mb_acts_t *a)
{
    tc_pp(s->c, s->c->pp_prev, s->dx, io_len(s, a), -1, NULL, 0);
}

static void fwd(stage_t *s, mb_acts_t *a, double scale)
{
    stage_forward(s, a, scale);
}
static void bwd(stage_t *s, mb_acts_t *mbs, int b, int nmb)
{
    s->e->half = 2 * b >= nmb; /* --grad-halves: the accumulator of the second half (engine.c) */
    stage_backward(s, &mbs[b], s->dx, b == nmb - 1);
}

/* The step's loss: every micro-batch's loss, added in the order one process adds them (data rank,
 * then micro-batch). A sum over ranks would associate the parts differently (with dp 2 and 2
 * micro-batches each, (l0 + l1) + (l2 + l3)); in this order a layout that computes the same
 * micro-batch losses reports the same bits as one process. Each token's loss is counted once: on
 * the last stage, by TP rank 0; the other ranks give zeros, which add exactly. */
static double global_loss(stage_t *s, mb_acts_t *mbs, int nmb)
{
    size_t n = (size_t)nmb, world = (size_t)s->c->size, need = n * (world + 1);
    /* The stage's buffer, not one per call: --elastic may leave this function by a longjmp
     * from the all-gather. */
    if (need > s->lossbuf_n) {
        free(s->lossbuf);
        s->lossbuf = train_calloc(need, sizeof(double));
        s->lossbuf_n = need;
    }
    double *mine = s->lossbuf, *all = mine + n, loss = 0;
    memset(mine, 0, need * sizeof(double));
    if (s->lay->last && s->lay->g.tp_i == 0)
        for (size_t i = 0; i < n; i++)
            mine[i] = mbs[i].loss;
    if (s->local_loss) { /* DiLoCo gathers them at its outer step */
        for (size_t i = 0; i < n; i++)
            loss += mine[i];
        return loss;
    }
    tc_allgather_d(s->c, P_MISC, s->c->world, mine, all, n);
    for (size_t i = 0; i < n * world; i++)
        loss += all[i];
    return loss;
}

double schedule_run(stage_t *s, mb_acts_t *mbs, int nmb, int backward, double scale)
{
    if (s->dual)
        return dualpipe_run(s, mbs, nmb, backward, scale);
    int pp = s->lay->g.pp, r = s->lay->g.pp_i;
    s->eval = !backward;
    if (backward && (s->o->schedule == SCHED_ZB_H1 || s->o->schedule == SCHED_ZB_H2)) {
        zb_run(s, mbs, nmb, scale);
        return global_loss(s, mbs, nmb);
    }
    if (!backward || s->o->schedule == SCHED_GPIPE) {
        for (int i = 0; i < nmb; i++) {
            recv_forward(s, &mbs[i]);
            fwd(s, &mbs[i], scale);
            send_forward(s, &mbs[i]);
        }
        for (int i = 0; backward && i < nmb; i++) {
            recv_backward(s, &mbs[i]);
            bwd(s, mbs, i, nmb);
            send_backward(s, &mbs[i]);
        }
        s->eval = 0;
        return global_loss(s, mbs, nmb);
    }
    int warmup = pp - r - 1 < nmb ? pp - r - 1 : nmb, steady = nmb - warmup;
    int f = 0, b = 0; /* next micro-batch to run forward / backward */
    for (int i = 0; i < warmup; i++, f++) {
        recv_forward(s, &mbs[f]);
        fwd(s, &mbs[f], scale);
        send_forward(s, &mbs[f]);
    }
    if (steady > 0)
        recv_forward(s, &mbs[f]);
    for (int i = 0; i < steady; i++, f++, b++) {
        fwd(s, &mbs[f], scale);
        /* send this output forward while the gradient of the oldest comes back */
        tc_pp(s->c, s->c->pp_next, stage_out(s, &mbs[f]), io_len(s, &mbs[f]), s->c->pp_next, s->dx,
              io_len(s, &mbs[b]));
        bwd(s, mbs, b, nmb);
        if (i == steady - 1)
            send_backward(s, &mbs[b]);
        else
            tc_pp(s->c, s->c->pp_prev, s->dx, io_len(s, &mbs[b]), s->c->pp_prev,
                  stage_in(s, &mbs[f + 1]), io_len(s, &mbs[f + 1]));
    }
    for (int i = 0; i < warmup; i++, b++) {
        recv_backward(s, &mbs[b]);
        bwd(s, mbs, b, nmb);
        send_backward(s, &mbs[b]);
    }
    return global_loss(s, mbs, nmb);
}

double schedule_ideal_bubble(const stage_t *s, int nmb)
{
    int pp = s->lay->g.pp;
    if (s->dual)
        return dualpipe_ideal_bubble(s);
    if (s->o->schedule == SCHED_ZB_H1 || s->o->schedule == SCHED_ZB_H2)
        return NAN; /* depends on the split backward's times (schedule_zb.c) */
    return (double)(pp - 1) / (double)(nmb + pp - 1);
}

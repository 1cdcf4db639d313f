/* SPDX-License-Identifier: Apache-2.0
 *
 * schedule_zb.c - ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): the backward of a
 * micro-batch is split into B (the stage's input gradient, which the previous stage waits for)
 * and W (the weight gradients, which nobody waits for; backward_zb.c). Stage r of pp runs 1F1B's
 * order of forwards and B's, with 1F1B's sends and receives, and defers W: W of micro-batch j runs
 * after the B of micro-batch j + r, and the W's left at the end fill the cool-down, where 1F1B's
 * stages wait for the gradients coming back. Every stage then has at most pp micro-batches
 * between their F and their W, as stage 0 has under 1F1B, and in the cost model F = B = W the
 * bubble drops from (pp-1)(F+B+W) to (pp-1)(F+B-W). W's run in micro-batch order, so the weight
 * gradients accumulate in 1F1B's order, bit for bit; a unit's reduction over the data group
 * starts at the end of its last W.
 */
#include "zb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zb_state {
    zb_keep_t *slot; /* what each deferred W keeps; micro-batch j uses slot j % nslot */
    int nslot;
    int calls;                  /* steps run, the first of which is not timed */
    double t[3];                /* seconds of F, B, W over the timed steps (all if one step) */
    long cnt[3];                /* and how many */
    double t1[3];               /* the same over the first step */
    long cnt1[3];               /* ... */
    int inflight, inflight_max; /* micro-batches between their F and their W */
    int pending, pending_max;   /* W's deferred: B done, W not */
};

enum { PASS_F, PASS_B, PASS_W };

static size_t io_len(const stage_t *s, const mb_acts_t *a)
{
    return (size_t)a->n * (size_t)s->lay->cfg.d;
}
static float *stage_out(const stage_t *s, mb_acts_t *a)
{
    return a->x + (size_t)a->nl * io_len(s, a);
}

/* The pipeline's sends and receives, through tc_pp so that their waits count as pipeline wait;
 * absent neighbours make them no-ops. */
static void recv_forward(stage_t *s, mb_acts_t *a)
{
    tc_pp(s->c, -1, NULL, 0, s->c->pp_prev, a->x, io_len(s, a));
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

static void account(struct zb_state *z, int pass, double t0)
{
    double dt = tc_now() - t0;
    if (z->calls == 1) {
        z->t1[pass] += dt;
        z->cnt1[pass]++;
    } else {
        z->t[pass] += dt;
        z->cnt[pass]++;
    }
}

static void pass_f(stage_t *s, struct zb_state *z, mb_acts_t *a, double scale)
{
    double t0 = tc_now();
    stage_forward(s, a, scale);
    account(z, PASS_F, t0);
    if (++z->inflight > z->inflight_max)
        z->inflight_max = z->inflight;
}

static void pass_b(stage_t *s, struct zb_state *z, mb_acts_t *mbs, int b, int nmb)
{
    if (z->pending >= z->nslot) {
        /* the order below never defers more W's than it has slots for */
        fprintf(stderr, "loom-train: zero-bubble schedule: more than %d W's deferred\n", z->nslot);
        exit(1);
    }
    double t0 = tc_now();
    stage_backward_b(s, &mbs[b], s->dx, &z->slot[b % z->nslot], b == nmb - 1);
    account(z, PASS_B, t0);
    if (++z->pending > z->pending_max)
        z->pending_max = z->pending;
}

static void pass_w(stage_t *s, struct zb_state *z, mb_acts_t *mbs, int w, int nmb)
{
    double t0 = tc_now();
    stage_backward_w(s, &mbs[w], &z->slot[w % z->nslot], w == nmb - 1);
    account(z, PASS_W, t0);
    z->pending--;
    z->inflight--;
}

/* The W's a stage defers: ZB-H1's stage r runs W of micro-batch j after the B of j + r. */
static int w_delay(const stage_t *s)
{
    return s->lay->g.pp_i;
}

static struct zb_state *state(stage_t *s, int nmb)
{
    if (s->zb)
        return s->zb;
    struct zb_state *z = calloc(1, sizeof(*z));
    int d = w_delay(s);
    if (z)
        z->nslot = d + 1 < nmb ? d + 1 : nmb;
    if (z && !(z->slot = calloc((size_t)z->nslot, sizeof(zb_keep_t))))
        free(z), z = NULL;
    if (!z) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < z->nslot; i++)
        zb_keep_alloc(&z->slot[i], s->lay,
                      s->o->batch / s->lay->g.dp / s->o->micro * (s->lay->cfg.ctx / s->lay->g.cp));
    s->zb = z;
    return z;
}

void zb_run(stage_t *s, mb_acts_t *mbs, int nmb, double scale)
{
    int pp = s->lay->g.pp, r = s->lay->g.pp_i, d = w_delay(s);
    struct zb_state *z = state(s, nmb);
    z->calls++;
    z->inflight = z->pending = 0;
    int warmup = pp - r - 1 < nmb ? pp - r - 1 : nmb, steady = nmb - warmup;
    int f = 0, b = 0, w = 0; /* next micro-batch to run F, B, W */
    for (int i = 0; i < warmup; i++, f++) {
        recv_forward(s, &mbs[f]);
        pass_f(s, z, &mbs[f], scale);
        send_forward(s, &mbs[f]);
    }
    if (steady > 0)
        recv_forward(s, &mbs[f]);
    for (int i = 0; i < steady; i++, f++, b++) {
        pass_f(s, z, &mbs[f], scale);
        /* 1F1B's exchanges: this output goes forward while the oldest gradient comes back, and
         * the input gradient goes back while the next input comes */
        tc_pp(s->c, s->c->pp_next, stage_out(s, &mbs[f]), io_len(s, &mbs[f]), s->c->pp_next, s->dx,
              io_len(s, &mbs[b]));
        pass_b(s, z, mbs, b, nmb);
        if (i == steady - 1)
            send_backward(s, &mbs[b]);
        else
            tc_pp(s->c, s->c->pp_prev, s->dx, io_len(s, &mbs[b]), s->c->pp_prev, mbs[f + 1].x,
                  io_len(s, &mbs[f + 1]));
        for (; w <= b - d; w++)
            pass_w(s, z, mbs, w, nmb);
    }
    for (int i = 0; i < warmup; i++, b++) {
        recv_backward(s, &mbs[b]);
        pass_b(s, z, mbs, b, nmb);
        send_backward(s, &mbs[b]);
        /* the W's deferred so far fill the wait for the next gradient */
        for (; w <= b - d; w++)
            pass_w(s, z, mbs, w, nmb);
    }
    for (; w < nmb; w++)
        pass_w(s, z, mbs, w, nmb);
}

void zb_free(stage_t *s)
{
    struct zb_state *z = s->zb;
    if (!z)
        return;
    for (int i = 0; i < z->nslot; i++)
        zb_keep_free(&z->slot[i]);
    free(z->slot);
    free(z);
    s->zb = NULL;
}

void zb_figures(const stage_t *s, double out[ZB_FIGS])
{
    memset(out, 0, ZB_FIGS * sizeof(double));
    const struct zb_state *z = s->zb;
    if (!z)
        return;
    for (int p = 0; p < 3; p++) {
        /* the first step pays for page faults: it counts only when it is the only one */
        double t = z->cnt[p] ? z->t[p] : z->t1[p];
        long c = z->cnt[p] ? z->cnt[p] : z->cnt1[p];
        out[ZB_F_MS + p] = c ? 1e3 * t / (double)c : 0.0;
    }
    out[ZB_INFLIGHT] = z->inflight_max;
    out[ZB_PENDING] = z->pending_max;
    out[ZB_KEEP_BYTES] = (double)z->pending_max * (double)z->slot[0].floats * 4.0;
}

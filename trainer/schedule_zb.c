/* SPDX-License-Identifier: Apache-2.0
 *
 * schedule_zb.c - the zero-bubble schedules of Qi et al. ("Zero Bubble Pipeline Parallelism",
 * 2023). The backward of a micro-batch is split into B (the stage's input gradient, which the
 * previous stage waits for) and W (the weight gradients, which nobody waits for; backward_zb.c),
 * and W's are deferred into the pipeline's bubbles. Stage r of pp, m micro-batches:
 *
 *   ZB-H1: 1F1B's pp-r-1 warm-up forwards, then one F and one B in turn; W of micro-batch j runs
 *          after the B of j + r. At most pp micro-batches are between their F and their W on
 *          every stage (1F1B's peak, which only stage 0 reaches there). With costs F, B, W the
 *          bubble is (pp-1)(F+B-W), against 1F1B's (pp-1)(F+B+W).
 *   ZB-H2: 2(pp-1-r) warm-up forwards, W of j after the B of j + 2r: up to 2pp-1 micro-batches in
 *          flight, and no stage waits between its first and its last pass when F = B = W; the
 *          bubble is (pp-1)(F+B-2W), where positive.
 *
 * W's run in micro-batch order, so the weight gradients accumulate in 1F1B's order, bit for bit,
 * and a unit's reduction over the data group starts at the end of its last W.
 *
 * Sends and receives go through tc_pp, blocking, so each rank's order of them must not deadlock
 * when a send waits for its receiver. The rule, as Megatron-LM pairs them for 1F1B: after an F or
 * a B whose output goes to a neighbour, that send is posted in one group with the receive of the
 * next F or B that needs one (W's skipped), or alone; a receive not posted that way is posted
 * alone just before its pass. Every rank builds every rank's program (the order of passes and
 * groups) and checks, by running them against each other with sends that wait for their
 * receivers, that they complete, before the first step.
 */
#include "zb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PASS_F, PASS_B, PASS_W, PASS_COMM };

/* One step of a rank's program: a pass on micro-batch mb, or a group of one send (to the next
 * stage: an F's output; to the previous: a B's input gradient) and one receive, either absent. */
typedef struct {
    int pass, mb;
    int send, smb; /* +1: to the next stage, -1: to the previous, 0: none; of micro-batch smb */
    int recv, rmb; /* -1: from the previous stage (an F's input), +1: from the next (a B's) */
} zb_step_t;

struct zb_state {
    zb_step_t *prog;
    int nprog, kind, nmb;
    zb_keep_t *slot; /* what each deferred W keeps; micro-batch j uses slot j % nslot */
    int nslot;
    float *g[2];        /* the gradients of the stage's output: micro-batch j's in g[j % 2] */
    int calls;          /* steps run, the first of which is not timed */
    double t[3], t1[3]; /* seconds of F, B, W over the later steps / the first */
    long cnt[3], cnt1[3];
    int inflight, inflight_max; /* micro-batches between their F and their W */
    int pending, pending_max;   /* W's deferred: B done, W not */
};

/* Warm-up forwards and W delay of stage r. */
static void shape(int kind, int pp, int r, int nmb, int *warmup, int *delay)
{
    int w = kind == SCHED_ZB_H2 ? 2 * (pp - 1 - r) : pp - 1 - r;
    *warmup = w < nmb ? w : nmb;
    *delay = kind == SCHED_ZB_H2 ? 2 * r : r;
}

/* The passes of stage r in order (3 nmb of them). */
static void pass_order(int kind, int pp, int r, int nmb, zb_step_t *ops)
{
    int warmup, d, n = 0, f = 0, w = 0;
    shape(kind, pp, r, nmb, &warmup, &d);
    for (; f < warmup; f++)
        ops[n++] = (zb_step_t){.pass = PASS_F, .mb = f};
    for (int b = 0; b < nmb; b++) {
        if (f < nmb)
            ops[n++] = (zb_step_t){.pass = PASS_F, .mb = f++};
        ops[n++] = (zb_step_t){.pass = PASS_B, .mb = b};
        for (; w <= b - d; w++)
            ops[n++] = (zb_step_t){.pass = PASS_W, .mb = w};
    }
    for (; w < nmb; w++)
        ops[n++] = (zb_step_t){.pass = PASS_W, .mb = w};
}

/* Where a pass's input comes from and its output goes (0: nowhere). */
static int recv_dir(const zb_step_t *o, int pp, int r)
{
    if (o->pass == PASS_F)
        return r > 0 ? -1 : 0;
    return o->pass == PASS_B && r < pp - 1 ? +1 : 0;
}
static int send_dir(const zb_step_t *o, int pp, int r)
{
    if (o->pass == PASS_F)
        return r < pp - 1 ? +1 : 0;
    return o->pass == PASS_B && r > 0 ? -1 : 0;
}

/* Stage r's program: its passes with their groups (at most 7 nmb steps); returns its length. */
static int program(int kind, int pp, int r, int nmb, zb_step_t *prog)
{
    int nops = 3 * nmb, n = 0;
    zb_step_t *ops = train_calloc((size_t)nops, sizeof(*ops));
    char *posted = train_calloc((size_t)nops, 1);
    pass_order(kind, pp, r, nmb, ops);
    for (int i = 0; i < nops; i++) {
        const zb_step_t *o = &ops[i];
        int rd = recv_dir(o, pp, r), sd = send_dir(o, pp, r);
        if (rd && !posted[i])
            prog[n++] = (zb_step_t){.pass = PASS_COMM, .recv = rd, .rmb = o->mb};
        prog[n++] = *o;
        if (!sd)
            continue;
        zb_step_t g = {.pass = PASS_COMM, .send = sd, .smb = o->mb};
        int j = i + 1;
        while (j < nops && ops[j].pass == PASS_W)
            j++;
        if (j < nops && recv_dir(&ops[j], pp, r)) {
            g.recv = recv_dir(&ops[j], pp, r), g.rmb = ops[j].mb;
            posted[j] = 1;
        }
        prog[n++] = g;
    }
    free(ops);
    free(posted);
    return n;
}

/* Runs every stage's program against the others with sends that complete only when their
 * receiver has posted the receive (the strictest a transport may be): 0 if every program ends,
 * -1 if they deadlock. */
static int check_programs(int kind, int pp, int nmb)
{
    size_t cap = 7 * (size_t)nmb + 1;
    zb_step_t *progs = train_calloc((size_t)pp * cap, sizeof(zb_step_t));
    int *len = train_calloc((size_t)pp, sizeof(int)), *pc = train_calloc((size_t)pp, sizeof(int));
    char *sdone = train_calloc((size_t)pp, 1), *rdone = train_calloc((size_t)pp, 1);
    for (int r = 0; r < pp; r++)
        len[r] = program(kind, pp, r, nmb, progs + (size_t)r * cap);
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < pp; r++) { /* skip passes: they never wait */
            while (pc[r] < len[r] && progs[(size_t)r * cap + (size_t)pc[r]].pass != PASS_COMM)
                pc[r]++, progress = 1;
        }
        for (int r = 0; r < pp; r++) {
            const zb_step_t *g = pc[r] < len[r] ? &progs[(size_t)r * cap + (size_t)pc[r]] : NULL;
            if (!g || !g->send || sdone[r])
                continue;
            int q = r + g->send;
            const zb_step_t *h = pc[q] < len[q] ? &progs[(size_t)q * cap + (size_t)pc[q]] : NULL;
            if (h && h->pass == PASS_COMM && h->recv == -g->send && h->rmb == g->smb && !rdone[q])
                sdone[r] = rdone[q] = 1, progress = 1;
        }
        for (int r = 0; r < pp; r++) {
            const zb_step_t *g = pc[r] < len[r] ? &progs[(size_t)r * cap + (size_t)pc[r]] : NULL;
            if (g && (!g->send || sdone[r]) && (!g->recv || rdone[r]))
                pc[r]++, sdone[r] = rdone[r] = 0, progress = 1;
        }
    }
    int ok = 1;
    for (int r = 0; r < pp; r++)
        ok &= pc[r] == len[r];
    free(progs), free(len), free(pc), free(sdone), free(rdone);
    return ok ? 0 : -1;
}

static struct zb_state *state(stage_t *s, int nmb)
{
    struct zb_state *z = s->zb;
    if (z && z->nmb == nmb)
        return z;
    if (z)
        zb_free(s);
    int pp = s->lay->g.pp, r = s->lay->g.pp_i, kind = s->o->schedule, warmup, d;
    if (check_programs(kind, pp, nmb)) {
        fprintf(stderr,
                "loom-train: --pp-schedule %s: the order of sends and receives for pp %d "
                "and %d micro-batches would deadlock\n",
                schedule_names[kind], pp, nmb);
        exit(1);
    }
    z = train_calloc(1, sizeof(*z));
    z->kind = kind, z->nmb = nmb;
    z->prog = train_calloc(7 * (size_t)nmb + 1, sizeof(zb_step_t));
    z->nprog = program(kind, pp, r, nmb, z->prog);
    shape(kind, pp, r, nmb, &warmup, &d);
    z->nslot = d + 1 < nmb ? d + 1 : nmb;
    z->slot = train_calloc((size_t)z->nslot, sizeof(zb_keep_t));
    int n = s->o->batch / s->lay->g.dp / s->o->micro * (s->lay->cfg.ctx / s->lay->g.cp);
    for (int i = 0; i < z->nslot; i++)
        zb_keep_alloc(&z->slot[i], s->lay, n);
    for (int i = 0; i < 2; i++)
        z->g[i] = train_calloc((size_t)n * (size_t)s->lay->cfg.d, sizeof(float));
    s->zb = z;
    return z;
}

static size_t io_len(const stage_t *s, const mb_acts_t *a)
{
    return (size_t)a->n * (size_t)s->lay->cfg.d;
}

/* One group of the program through tc_pp (its wait counts as pipeline wait). */
static void comm(stage_t *s, struct zb_state *z, mb_acts_t *mbs, const zb_step_t *g)
{
    const float *sb = NULL;
    float *rb = NULL;
    size_t sn = 0, rn = 0;
    int to = -1, from = -1;
    if (g->send) {
        mb_acts_t *a = &mbs[g->smb];
        to = g->send > 0 ? s->c->pp_next : s->c->pp_prev;
        sb = g->send > 0 ? a->x + (size_t)a->nl * io_len(s, a) : z->g[g->smb % 2];
        sn = io_len(s, a);
    }
    if (g->recv) {
        mb_acts_t *a = &mbs[g->rmb];
        from = g->recv < 0 ? s->c->pp_prev : s->c->pp_next;
        rb = g->recv < 0 ? a->x : z->g[g->rmb % 2];
        rn = io_len(s, a);
    }
    tc_pp(s->c, to, sb, sn, from, rb, rn);
}

static void account(struct zb_state *z, int pass, double t0)
{
    double dt = tc_now() - t0;
    if (z->calls == 1)
        z->t1[pass] += dt, z->cnt1[pass]++;
    else
        z->t[pass] += dt, z->cnt[pass]++;
}

void zb_run(stage_t *s, mb_acts_t *mbs, int nmb, double scale)
{
    struct zb_state *z = state(s, nmb);
    z->calls++;
    z->inflight = z->pending = 0;
    for (int i = 0; i < z->nprog; i++) {
        const zb_step_t *o = &z->prog[i];
        mb_acts_t *a = &mbs[o->mb];
        int last = o->mb == nmb - 1;
        double t0 = tc_now();
        switch (o->pass) {
        case PASS_COMM:
            comm(s, z, mbs, o);
            break;
        case PASS_F:
            stage_forward(s, a, scale);
            account(z, PASS_F, t0);
            if (++z->inflight > z->inflight_max)
                z->inflight_max = z->inflight;
            break;
        case PASS_B:
            stage_backward_b(s, a, z->g[o->mb % 2], &z->slot[o->mb % z->nslot], last);
            account(z, PASS_B, t0);
            if (++z->pending > z->pending_max)
                z->pending_max = z->pending;
            break;
        case PASS_W:
            stage_backward_w(s, a, &z->slot[o->mb % z->nslot], last);
            account(z, PASS_W, t0);
            z->pending--, z->inflight--;
            break;
        }
    }
}

void zb_free(stage_t *s)
{
    struct zb_state *z = s->zb;
    if (!z)
        return;
    for (int i = 0; i < z->nslot; i++)
        zb_keep_free(&z->slot[i]);
    free(z->slot), free(z->prog), free(z->g[0]), free(z->g[1]);
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

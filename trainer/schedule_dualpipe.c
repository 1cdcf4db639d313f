/* SPDX-License-Identifier: Apache-2.0
 *
 * schedule_dualpipe.c - DualPipe (--pp-schedule dualpipe; DeepSeek-V3 technical report, §3.2.1)
 * as a plain bidirectional pipeline: without the overlap of one micro-batch's forward with
 * another's backward and without the split of the backward into input and weight gradients.
 *
 * With pp ranks (pp even) the model's stages are held twice: rank r holds stage r of copy A and
 * stage pp-1-r of copy B. The first half of the micro-batches enters at rank 0 and flows down
 * copy A; the second half enters at rank pp-1 and flows up copy B; both at once. Each rank's
 * order of work is its part of one program that every rank computes alike: a greedy simulation
 * in which a forward takes one time unit and a backward two and a ready backward goes before a
 * ready forward (of a few tie-breaking policies, the one of the shortest makespan). Messages are
 * sent when made and received at the receiver's first point between two operations at or after that
 * time: both sides of every link post them in the same order, and no rank can wait on one that
 * waits on it (the points are ordered by the simulated time).
 *
 * After the backward the two copies of each stage (rank r's copy A, rank pp-1-r's copy B) add
 * their gradients over the mirror pair {r, pp-1-r}, then over the data group, so both take the
 * same AdamW step and stay identical. Both ends of the tied embedding live on ranks 0 and pp-1
 * (stage 0 of one copy, stage pp-1 of the other), so the tie is a local sum there.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_F, OP_B, OP_COMM };
enum { MSG_ACT, MSG_GRAD }; /* a stage's output forward, or its input's gradient backward */

/* One entry of a rank's program: a forward or backward of micro-batch j of copy d, or a group of
 * messages [m0, m0 + mn). */
typedef struct {
    int kind, d, j, m0, mn;
} step_t;

typedef struct {
    int peer, send, d, j, what; /* peer: a pipeline position (0 .. pp-1) */
} msg_t;

typedef struct {
    step_t *steps;
    msg_t *msgs;
    int nsteps, nmsgs, maxgroup;
    int makespan; /* in forward times */
} program_t;

struct dualpipe {
    engine_t e; /* copy B: stage pp-1-r */
    stage_t s;
    loomComm_t mirror; /* this rank and rank pp-1-r (same dp, cp and tp position) */
    int P, r, M;       /* pp, this rank's stage in copy A, micro-batches per copy */
    program_t train, eval;
    float *gin; /* [2][M][io]: the gradient of each micro-batch's stage output, then its input's */
    size_t io;
    tc_p2p_t *ops;
};

/* A simulated operation. */
typedef struct {
    int r, d, kind, j, t0, t1;
} sop_t;

static int stage_of(int P, int d, int r)
{
    return d == 0 ? r : P - 1 - r;
}
static int rank_of(int P, int d, int st)
{
    return d == 0 ? st : P - 1 - st;
}

/* The policies of the simulation, each a choice among the ready forwards and backwards of a
 * rank; the program takes the one of the shortest makespan (no one policy is best for every pp
 * and m). Backwards always go first. 0: the later stage's backward, the earlier stage's forward
 * (of the rank's two); 1: the same backwards, and the forward of the copy with fewer micro-batches
 * in flight on this rank; 2: the older micro-batch's backward, the earlier stage's forward. */
#define POLICIES 3

/* The whole pipeline's operations (every rank's), M micro-batches a copy; forward 1, backward 2
 * time units. Returns the count written to out (2PM or 4PM), or -1 if it stalls (a bug). */
static int simulate(int P, int M, int backward, int policy, sop_t *out, int *makespan)
{
    size_t n = (size_t)2 * (size_t)P * (size_t)M;
    int *endf = train_calloc(n, sizeof(int)), *endb = train_calloc(n, sizeof(int));
    int *nextf = train_calloc((size_t)2 * P, sizeof(int)),
        *nextb = train_calloc((size_t)2 * P, sizeof(int));
    int *busy = train_calloc((size_t)P, sizeof(int));
    for (size_t i = 0; i < n; i++)
        endf[i] = endb[i] = -1;
#define AT(d, st, j) (((size_t)(d) * (size_t)P + (size_t)(st)) * (size_t)M + (size_t)(j))
    int total = P * 2 * M * (backward ? 2 : 1), done = 0, t = 0, limit = 6 * P * M + 6 * P;
    for (; done < total && t <= limit; t++) {
        for (int r = 0; r < P; r++) {
            if (busy[r] > t)
                continue;
            /* the best ready operation by (kind, k1, k2, copy): a backward before a forward,
             * then the policy's keys (POLICIES) */
            int bk = -1, bd = -1, bj = 0, b1 = 0, b2 = 0;
            for (int d = 0; d < 2; d++) {
                int st = stage_of(P, d, r), j = nextb[2 * r + d];
                int cand = -1, k1 = 0, k2 = 0;
                if (backward && j < M && endf[AT(d, st, j)] >= 0 && endf[AT(d, st, j)] <= t &&
                    (st == P - 1 || (endb[AT(d, st + 1, j)] >= 0 && endb[AT(d, st + 1, j)] <= t))) {
                    cand = OP_B;
                    k1 = policy == 2 ? j : -st, k2 = policy == 2 ? -st : j;
                }
                j = cand < 0 ? nextf[2 * r + d] : j;
                if (cand < 0 && j < M &&
                    (st == 0 || (endf[AT(d, st - 1, j)] >= 0 && endf[AT(d, st - 1, j)] <= t))) {
                    cand = OP_F;
                    k1 = policy == 1 ? nextf[2 * r + d] - nextb[2 * r + d] : st;
                    k2 = policy == 1 ? st * M + j : j;
                }
                if (cand < 0)
                    continue;
                if (bk < 0 || (cand == OP_B && bk == OP_F) ||
                    (cand == bk && (k1 < b1 || (k1 == b1 && k2 < b2))))
                    bk = cand, bd = d, bj = j, b1 = k1, b2 = k2;
            }
            if (bk < 0)
                continue;
            int st = stage_of(P, bd, r), dur = bk == OP_F ? 1 : 2;
            (bk == OP_F ? endf : endb)[AT(bd, st, bj)] = t + dur;
            (bk == OP_F ? nextf : nextb)[2 * r + bd]++;
            busy[r] = t + dur;
            out[done++] = (sop_t){r, bd, bk, bj, t, t + dur};
        }
    }
#undef AT
    int span = 0;
    for (int r = 0; r < P; r++)
        span = busy[r] > span ? busy[r] : span;
    *makespan = span;
    free(endf), free(endb), free(nextf), free(nextb), free(busy);
    return done == total ? done : -1;
}

/* The message an operation makes, if any: its destination rank and kind. */
static int makes(int P, const sop_t *o, int *to, int *what)
{
    int st = stage_of(P, o->d, o->r);
    if (o->kind == OP_F && st < P - 1) {
        *to = rank_of(P, o->d, st + 1), *what = MSG_ACT;
        return 1;
    }
    if (o->kind == OP_B && st > 0) {
        *to = rank_of(P, o->d, st - 1), *what = MSG_GRAD;
        return 1;
    }
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Rank r's program from the simulation. Boundaries are its operations' start and end times; at
 * each, one group: the message its just-ended operation makes, and every message made for it
 * since its previous boundary (ordered by the time made, so that per link the order is the
 * sender's); then the operation that starts there. */
static int build_program(program_t *pg, int P, int M, int r, int backward)
{
    int nops = P * 2 * M * (backward ? 2 : 1);
    sop_t *all = train_calloc((size_t)nops, sizeof(sop_t));
    int best = -1, span = 0;
    for (int policy = 0; policy < POLICIES; policy++)
        if (simulate(P, M, backward, policy, all, &span) == nops &&
            (best < 0 || span < pg->makespan))
            best = policy, pg->makespan = span;
    if (best < 0 || simulate(P, M, backward, best, all, &span) != nops) {
        free(all);
        return -1;
    }
    int mine = 0, *bt = train_calloc((size_t)nops * 2, sizeof(int)), nb = 0;
    for (int i = 0; i < nops; i++)
        if (all[i].r == r) {
            bt[nb++] = all[i].t0, bt[nb++] = all[i].t1;
            mine++;
        }
    qsort(bt, (size_t)nb, sizeof(int), cmp_int);
    int u = 0;
    for (int i = 0; i < nb; i++)
        if (u == 0 || bt[i] != bt[u - 1])
            bt[u++] = bt[i];
    nb = u;
    /* messages from and to r, each with the boundary at which r posts it */
    msg_t *msgs = train_calloc((size_t)nops, sizeof(msg_t));
    int *mat = train_calloc((size_t)nops, sizeof(int)),
        *mtime = train_calloc((size_t)nops, sizeof(int));
    int nm = 0;
    for (int i = 0; i < nops; i++) {
        int to, what;
        const sop_t *o = &all[i];
        if (!makes(P, o, &to, &what) || (o->r != r && to != r))
            continue;
        int at = o->t1;
        if (o->r != r) {
            int k = 0;
            while (k < nb && bt[k] < at)
                k++;
            if (k == nb) { /* a message r never uses: cannot happen */
                free(all), free(bt), free(msgs), free(mat), free(mtime);
                return -1;
            }
            at = bt[k];
        }
        msgs[nm] = (msg_t){o->r == r ? to : o->r, o->r == r, o->d, o->j, what};
        mat[nm] = at, mtime[nm] = o->t1;
        nm++;
    }
    pg->msgs = train_calloc((size_t)nm, sizeof(msg_t));
    pg->steps = train_calloc((size_t)(nb + mine), sizeof(step_t));
    pg->nmsgs = 0, pg->nsteps = 0, pg->maxgroup = 0;
    for (int k = 0; k < nb; k++) {
        int m0 = pg->nmsgs;
        /* sends first, then receives by the time they were made (ties: lower peer) */
        for (int pass = 0; pass < 2; pass++)
            for (;;) {
                int best = -1;
                for (int i = 0; i < nm; i++)
                    if (mat[i] == bt[k] && msgs[i].send == (pass == 0) &&
                        (best < 0 || mtime[i] < mtime[best] ||
                         (mtime[i] == mtime[best] && msgs[i].peer < msgs[best].peer)))
                        best = i;
                if (best < 0)
                    break;
                pg->msgs[pg->nmsgs++] = msgs[best];
                mat[best] = -1;
            }
        if (pg->nmsgs > m0) {
            pg->steps[pg->nsteps++] = (step_t){OP_COMM, 0, 0, m0, pg->nmsgs - m0};
            if (pg->nmsgs - m0 > pg->maxgroup)
                pg->maxgroup = pg->nmsgs - m0;
        }
        for (int i = 0; i < nops; i++)
            if (all[i].r == r && all[i].t0 == bt[k])
                pg->steps[pg->nsteps++] = (step_t){all[i].kind, all[i].d, all[i].j, 0, 0};
    }
    free(all), free(bt), free(msgs), free(mat), free(mtime);
    return 0;
}

static void program_free(program_t *pg)
{
    free(pg->steps);
    free(pg->msgs);
    memset(pg, 0, sizeof(*pg));
}

int dualpipe_check(const opts_t *o)
{
    const char *bad = NULL;
    if (o->grad_halves &&
        ((o->schedule != SCHED_1F1B && o->schedule != SCHED_GPIPE) || o->zero >= 2 || o->micro % 2))
        bad = "--grad-halves needs --pp-schedule 1f1b or gpipe, --zero 0 or 1 and an even --micro";
    else if (o->schedule != SCHED_DUALPIPE)
        return 0;
    else if (o->pp < 2 || o->pp % 2)
        bad = "--pp-schedule dualpipe needs an even --pp of at least 2 (rank r holds stage r of "
              "one copy of the model and stage pp-1-r of the other)";
    else if (o->micro % 2)
        bad = "--pp-schedule dualpipe needs an even --micro (half of the micro-batches go down "
              "each copy)";
    else if (o->zero > 0 || o->optim != OPTIM_ADAMW)
        bad = "--pp-schedule dualpipe is not supported with --zero or --optim muon (the copies' "
              "sum is built for full gradients and AdamW)";
    else if (o->model.moe_e > 0)
        bad = "--pp-schedule dualpipe is not supported with --moe";
    else if (o->tp_reduce == TP_ECHO)
        bad = "--pp-schedule dualpipe is not supported with --tp-allreduce echo (the two copies "
              "would share one feedback state)";
    else if (o->save || o->resume)
        bad = "--pp-schedule dualpipe is not supported with --save or --resume (a checkpoint "
              "holds one copy of the rank's stages)";
    if (bad)
        fprintf(stderr, "loom-train: %s\n", bad);
    return bad ? -1 : 0;
}

int dualpipe_init(stage_t *s, int nmb, int nseq)
{
    struct dualpipe *d = train_calloc(1, sizeof(*d));
    const grid_pos_t *g = &s->lay->g;
    tcomm_t *c = s->c;
    d->P = g->pp, d->r = g->pp_i, d->M = nmb / 2;
    if (eng_init_at(&d->e, s->o, c, d->P - 1 - d->r)) {
        free(d);
        fprintf(stderr, "loom-train: out of memory\n");
        return -1;
    }
    /* Copy A holds every stage once over the ranks: only its elements count (norm, dumps). */
    for (int i = 0; i < d->e.lay.nt; i++)
        d->e.lay.t[i].counted = 0;
    stage_init(&d->s, &d->e, c, s->o, nseq);
    int low = d->r < d->P - 1 - d->r ? d->r : d->P - 1 - d->r;
    tc_check(loomCommSplit(c->world, g->tp_i + g->tp * (g->cp_i + g->cp * (g->dp_i + g->dp * low)),
                           d->r, &d->mirror, NULL),
             c, "split mirror");
    d->io = (size_t)nseq * (size_t)(s->lay->cfg.ctx / g->cp) * (size_t)s->lay->cfg.d;
    d->gin = train_calloc((size_t)2 * (size_t)d->M * d->io, sizeof(float));
    if (build_program(&d->train, d->P, d->M, d->r, 1) ||
        build_program(&d->eval, d->P, d->M, d->r, 0)) {
        fprintf(stderr, "loom-train: the DualPipe program could not be built\n");
        return -1;
    }
    int mg = d->train.maxgroup > d->eval.maxgroup ? d->train.maxgroup : d->eval.maxgroup;
    d->ops = train_calloc((size_t)mg, sizeof(tc_p2p_t));
    s->dual = d;
    return 0;
}

void dualpipe_free(stage_t *s)
{
    struct dualpipe *d = s->dual;
    if (!d)
        return;
    program_free(&d->train);
    program_free(&d->eval);
    free(d->gin);
    free(d->ops);
    stage_free(&d->s);
    eng_free(&d->e);
    loomCommDestroy(d->mirror);
    free(d);
    s->dual = NULL;
}

const layout_t *dualpipe_mb_layout(const stage_t *s, int i, int nmb)
{
    return 2 * i < nmb ? s->lay : &s->dual->e.lay;
}

double dualpipe_ideal_bubble(const stage_t *s)
{
    const struct dualpipe *d = s->dual;
    double busy = 2.0 * d->M * 3.0; /* every micro-batch's forward (1) and backward (2) */
    return d->train.makespan > 0 ? 1.0 - busy / d->train.makespan : 0.0;
}

/* The step's loss: each micro-batch's loss comes from the last stage of its copy (rank pp-1 for
 * copy A, rank 0 for copy B). They are added in 1F1B's order (data rank, CP rank, micro-batch),
 * which with DP and PP alone is one process's; the zeros of the ranks that do not hold a loss add
 * exactly. */
static double dual_loss(stage_t *s, mb_acts_t *mbs, int nmb)
{
    const struct dualpipe *d = s->dual;
    const grid_pos_t *g = &s->lay->g;
    size_t n = (size_t)nmb, world = (size_t)s->c->size;
    double *mine = train_calloc(n * (world + 1), sizeof(double)), *all = mine + n, loss = 0;
    for (int i = 0; i < nmb; i++) {
        const layout_t *lay = 2 * i < nmb ? s->lay : &d->e.lay;
        if (lay->last && g->tp_i == 0)
            mine[i] = mbs[i].loss;
    }
    tc_allgather_d(s->c, P_MISC, s->c->world, mine, all, n);
    /* world ranks are (pp, dp, cp, tp), tp fastest: k runs over one pipeline position's ranks in
     * the order schedule.c adds them, and the pipeline positions of each are summed first */
    size_t stride = world / (size_t)g->pp;
    for (size_t k = 0; k < stride; k++)
        for (size_t i = 0; i < n; i++) {
            double v = 0;
            for (size_t q = 0; q < (size_t)g->pp; q++)
                v += all[(k + q * stride) * n + i];
            loss += v;
        }
    free(mine);
    return loss;
}

double dualpipe_run(stage_t *s, mb_acts_t *mbs, int nmb, int backward, double scale)
{
    struct dualpipe *d = s->dual;
    if (nmb != 2 * d->M) {
        fprintf(stderr, "loom-train: DualPipe program made for %d micro-batches, run with %d\n",
                2 * d->M, nmb);
        exit(1);
    }
    const program_t *pg = backward ? &d->train : &d->eval;
    const grid_pos_t *g = &s->lay->g;
    stage_t *st[2] = {s, &d->s};
    s->eval = d->s.eval = !backward;
    if (backward)
        eng_zero_grads(&d->e); /* main.c zeroes the first copy's */
    for (int k = 0; k < pg->nsteps; k++) {
        const step_t *p = &pg->steps[k];
        if (p->kind != OP_COMM) {
            mb_acts_t *a = &mbs[p->d * d->M + p->j];
            float *gin = d->gin + ((size_t)p->d * (size_t)d->M + (size_t)p->j) * d->io;
            if (p->kind == OP_F)
                stage_forward(st[p->d], a, scale);
            else
                stage_backward(st[p->d], a, gin, 0); /* reduced after the backward */
            continue;
        }
        for (int i = 0; i < p->mn; i++) {
            const msg_t *m = &pg->msgs[p->m0 + i];
            mb_acts_t *a = &mbs[m->d * d->M + m->j];
            float *buf = d->gin + ((size_t)m->d * (size_t)d->M + (size_t)m->j) * d->io;
            if (m->what == MSG_ACT)
                buf = m->send ? a->x + (size_t)a->nl * d->io : a->x;
            /* the program names pipeline positions; the peer is the world rank at that one */
            int peer = g->tp_i + g->tp * (g->cp_i + g->cp * (g->dp_i + g->dp * m->peer));
            d->ops[i] = (tc_p2p_t){peer, m->send, buf, d->io};
        }
        tc_pp_many(s->c, d->ops, p->mn);
    }
    s->eval = d->s.eval = 0;
    return dual_loss(s, mbs, nmb);
}

void dualpipe_step(stage_t *s, double lr)
{
    struct dualpipe *d = s->dual;
    tcomm_t *c = s->c;
    engine_t *ea = s->e, *eb = &d->e;
    /* In ascending stage order, which the partner shares: rank r's copy A is stage r, its copy
     * B stage pp-1-r. A sum of two is the same in either order, so each stage's gradient is its
     * first half's plus its second half's, as with --grad-halves. */
    engine_t *lo = d->r < d->P - 1 - d->r ? ea : eb, *hi = lo == ea ? eb : ea;
    tc_allreduce(c, P_MIRROR, d->mirror, lo->grads, lo->gn, NULL);
    tc_allreduce(c, P_MIRROR, d->mirror, hi->grads, hi->gn, NULL);
    tc_allreduce(c, P_DATA, c->data, lo->grads, lo->gn, NULL);
    tc_allreduce(c, P_DATA, c->data, hi->grads, hi->gn, NULL);
    /* The tied embedding: on ranks 0 and pp-1, one copy's stage 0 and the other's stage pp-1. */
    if (ea->lay.first || ea->lay.last) {
        engine_t *ef = ea->lay.first ? ea : eb, *el = ea->lay.last ? ea : eb;
        const unit_t *ue = layout_unit_of(&ef->lay, UNIT_EMB);
        const unit_t *uf = layout_unit_of(&el->lay, UNIT_FINAL);
        const ltensor_t *t = &ef->lay.t[ue->t0];
        float *ge = ef->grads + t->off, *gh = el->grads + el->lay.t[uf->t0 + 2].off;
        for (size_t i = 0; i < (size_t)t->rows * (size_t)t->cols; i++)
            ge[i] = gh[i] = ge[i] + gh[i];
    }
    if (s->o->dump_grads && !ea->dumped_grads) {
        ea->dumped_grads = 1;
        if (eng_dump(ea, s->o->dump_grads, 1))
            exit(1);
    }
    double sumsq = eng_sumsq(ea);
    tc_allreduce_d(c, P_MISC, c->world, &sumsq, 1);
    eng_update(ea, lr, sqrt(sumsq));
    eng_update(eb, lr, sqrt(sumsq));
}

void dualpipe_mem(const stage_t *s, double mem[6])
{
    const engine_t *e = &s->dual->e;
    mem[0] += (double)e->pn * 4;
    mem[1] += (double)(e->gn + e->gsn) * 4;
    mem[2] += (double)(e->on + e->vn) * 4;
    mem[3] += (double)e->peak_tmp * 4;
    mem[4] += (double)(2 * (size_t)s->dual->M * s->dual->io) * 4;
    mem[5] += (double)e->lay.total;
}

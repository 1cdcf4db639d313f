/* SPDX-License-Identifier: Apache-2.0
 *
 * diloco.c - DiLoCo (Douillard et al., 2023): each data-parallel replica trains alone for H inner
 * AdamW steps on its share of every global batch, with no communication between replicas; then an
 * outer step averages the replicas' parameter deltas (theta_outer - theta_i) with one all-reduce
 * over the data group (exact, or Echo's 4-bit one with error feedback) and moves theta_outer by
 * Nesterov momentum along the mean delta, and every replica restarts from it. The AdamW moments
 * stay each replica's own. --diloco-sim R runs the R replicas one after the other in one process,
 * with the same arithmetic in the same order, so that a test can require the distributed run's
 * bits.
 */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int diloco_check(const opts_t *o)
{
    const char *bad = NULL;
    if (!o->diloco) {
        if (o->diloco_echo || o->diloco_sim || o->outer_lr != 0.7 || o->outer_momentum != 0.9)
            bad = "--diloco-echo, --diloco-sim, --outer-lr and --outer-momentum need --diloco H";
    } else if (o->tp > 1 || o->pp > 1 || o->cp > 1)
        bad = "--diloco with --tp, --pp, --cp or --sp is not supported (a replica is one rank: its "
              "gradient norm and loss are not reduced within a model-parallel group)";
    else if (o->zero > 0 || o->optim != OPTIM_ADAMW)
        bad = "--diloco runs AdamW with every replica's whole state on its rank: not with --zero "
              "or --optim muon";
    else if (o->model.moe_e > 0)
        bad = "--diloco with --moe is not supported (experts' gradients are reduced over their "
              "replicas every step)";
    else if (o->save || o->resume)
        bad = "--diloco with --save or --resume is not supported (a checkpoint does not hold "
              "theta_outer, the outer momentum or the other replicas' state)";
    else if (o->outer_momentum >= 1)
        bad = "--outer-momentum must be < 1";
    else if (o->diloco_sim && o->diloco_echo)
        bad = "--diloco-sim runs the exact all-reduce only (Echo's rounding depends on the ranks' "
              "transport chunks)";
    else if (o->diloco_sim && o->dp > 1)
        bad = "--diloco-sim runs its replicas in one process: leave --dp out";
    else if (o->val_every % o->diloco)
        bad = "--val-every must be a multiple of --diloco H (validation evaluates theta_outer, "
              "after an outer step)";
    if (bad)
        fprintf(stderr, "loom-train: %s\n", bad);
    return bad ? -1 : 0;
}

int diloco_replicas(const opts_t *o, const grid_pos_t *g)
{
    return o->diloco && o->diloco_sim ? o->diloco_sim : g->dp;
}

static float *dl_alloc(size_t n)
{
    return train_calloc(n, sizeof(float));
}

int diloco_init(diloco_t *d, engine_t *e, const opts_t *o)
{
    memset(d, 0, sizeof(*d));
    if (!o->diloco)
        return 0;
    const tcomm_t *c = e->c;
    d->h = o->diloco;
    d->replicas = diloco_replicas(o, &c->g);
    if (o->diloco_sim && c->size != 1) {
        fprintf(stderr, "loom-train: rank %d: --diloco-sim runs in one process, not %d\n", c->rank,
                c->size);
        return -1;
    }
    if (o->batch % (d->replicas * o->micro)) {
        fprintf(stderr, "loom-train: --batch %d must be a multiple of %d replicas x --micro %d\n",
                o->batch, d->replicas, o->micro);
        return -1;
    }
    d->outer = dl_alloc(e->pn);
    d->mom = dl_alloc(e->pn);
    const size_t round = (size_t)d->h * (size_t)o->micro;
    d->own = calloc(round * (size_t)(o->diloco_sim ? d->replicas : 1), sizeof(double));
    d->all = calloc(round * (size_t)c->size, sizeof(double));
    d->norms = calloc((size_t)d->h, sizeof(double));
    d->done_loss = calloc((size_t)d->h, sizeof(double));
    if (!d->own || !d->all || !d->norms || !d->done_loss) {
        fprintf(stderr, "loom-train: out of memory\n");
        return -1;
    }
    memcpy(d->outer, e->params, e->pn * sizeof(float));
    if (o->diloco_sim) {
        int r = d->replicas;
        d->rp = calloc((size_t)r, sizeof(float *));
        d->rm = calloc((size_t)r, sizeof(float *));
        d->rv = calloc((size_t)r, sizeof(float *));
        d->mb_loss = calloc((size_t)r * (size_t)o->micro, sizeof(double));
        if (!d->rp || !d->rm || !d->rv || !d->mb_loss) {
            fprintf(stderr, "loom-train: out of memory\n");
            return -1;
        }
        d->rp[0] = e->params, d->rm[0] = e->m, d->rv[0] = e->v;
        for (int i = 1; i < r; i++) {
            d->rp[i] = dl_alloc(e->pn);
            memcpy(d->rp[i], e->params, e->pn * sizeof(float));
            d->rm[i] = dl_alloc(e->on);
            d->rv[i] = dl_alloc(e->vn);
        }
    }
    if (o->diloco_echo && c->data_size > 1)
        tc_check(loomEchoCreate(c->data, e->pn, loomFloat32, &d->echo), c, "loomEchoCreate");
    return 0;
}

void diloco_free(diloco_t *d)
{
    if (d->echo)
        loomEchoDestroy(d->echo);
    for (int i = 1; d->rp && i < d->replicas; i++) {
        free(d->rp[i]);
        free(d->rm[i]);
        free(d->rv[i]);
    }
    free(d->rp);
    free(d->rm);
    free(d->rv);
    free(d->mb_loss);
    free(d->own);
    free(d->all);
    free(d->norms);
    free(d->done_loss);
    free(d->outer);
    free(d->mom);
}

/* Makes replica i the engine's state (--diloco-sim). */
static void use_replica(diloco_t *d, engine_t *e, int i)
{
    e->params = d->rp[i], e->m = d->rm[i], e->v = d->rv[i];
}

/* The outer optimizer on the summed deltas: the mean delta g = sum / R (the division after the
 * sum, as an all-reduce followed by a scaling does), then Nesterov as PyTorch's SGD runs it
 * (m = mu m + g; theta -= lr (g + mu m)). With lr 1 and mu 0 this is theta - (theta - mean
 * theta_i), the replicas' average up to the rounding of the subtraction. */
static void outer_update(diloco_t *d, const opts_t *o, const float *sum, size_t n)
{
    const float inv_r = (float)d->replicas, lr = (float)o->outer_lr, mu = (float)o->outer_momentum;
    for (size_t i = 0; i < n; i++) {
        float g = sum[i] / inv_r;
        float m = mu * d->mom[i] + g;
        d->mom[i] = m;
        d->outer[i] = d->outer[i] - lr * (g + mu * m);
    }
    d->outer_steps++;
}

/* The distributed outer step: this rank's delta, one all-reduce of it over the data group (in
 * place, in the gradient buffer, which the next step zeroes anyway), the update, the restart. */
static void outer_step(diloco_t *d, engine_t *e)
{
    tcomm_t *c = e->c;
    const size_t n = e->pn;
    float *delta = e->grads;
    for (size_t i = 0; i < n; i++)
        delta[i] = d->outer[i] - e->params[i];
    if (d->echo) {
        c->calls[P_DATA][K_ECHO]++;
        c->bytes[P_DATA][K_ECHO] += n * sizeof(float);
        double t = tc_now();
        tc_check(loomEchoAllReduce(delta, delta, n, loomFloat32, c->data, d->echo, NULL), c,
                 "loomEchoAllReduce");
        c->comm_s += tc_now() - t;
    } else {
        tc_allreduce(c, P_DATA, c->data, delta, n, NULL);
    }
    outer_update(d, e->o, delta, n);
    memcpy(e->params, d->outer, n * sizeof(float));
}

/* The same in one process: the deltas added replica after replica, as loom's rank-order
 * reduction adds the ranks' ((d0 + d1) + d2) + ... */
static void sim_outer_step(diloco_t *d, engine_t *e)
{
    const size_t n = e->pn;
    float *sum = e->grads;
    for (size_t i = 0; i < n; i++)
        sum[i] = d->outer[i] - d->rp[0][i];
    for (int r = 1; r < d->replicas; r++)
        for (size_t i = 0; i < n; i++)
            sum[i] = sum[i] + (d->outer[i] - d->rp[r][i]);
    outer_update(d, e->o, sum, n);
    for (int r = 0; r < d->replicas; r++)
        memcpy(d->rp[r], d->outer, n * sizeof(float));
}

int diloco_step(diloco_t *d, stage_t *s, const corpus_t *cp, mb_acts_t *mbs, int nmb, int bl,
                int bm, int64_t step, double lr)
{
    engine_t *e = s->e;
    const opts_t *o = s->o;
    const double scale = 1.0 / ((double)bl * (double)o->model.ctx);
    const int sync = (step + 1) % d->h == 0 || step + 1 == o->steps, k = d->pending;
    const int nown = nmb * (o->diloco_sim ? d->replicas : 1); /* a step's losses in own */
    if (!o->diloco_sim) {
        eng_zero_grads(e);
        for (int i = 0; i < nmb; i++)
            corpus_fill(cp, o, s, &mbs[i], (uint64_t)step, s->lay->g.dp_i * bl + i * bm, 0);
        s->local_loss = 1;
        schedule_run(s, mbs, nmb, 1, scale);
        s->local_loss = 0;
        for (int i = 0; i < nmb; i++)
            d->own[(size_t)k * nown + (size_t)i] = mbs[i].loss;
        eng_step(e, lr);
        d->norms[k] = e->last_norm;
    } else {
        const int64_t t0 = e->step;
        for (int r = 0; r < d->replicas; r++) {
            use_replica(d, e, r);
            e->step = t0;
            eng_zero_grads(e);
            for (int i = 0; i < nmb; i++)
                corpus_fill(cp, o, s, &mbs[i], (uint64_t)step, r * bl + i * bm, 0);
            schedule_run(s, mbs, nmb, 1, scale);
            for (int i = 0; i < nmb; i++)
                d->own[(size_t)k * nown + (size_t)(r * nmb + i)] = mbs[i].loss;
            eng_step(e, lr);
            if (r == 0)
                d->norms[k] = e->last_norm;
        }
        use_replica(d, e, 0);
    }
    d->pending++;
    if (!sync)
        return 0;
    if (o->diloco_sim)
        sim_outer_step(d, e);
    else
        outer_step(d, e);
    /* The round's losses: each step's is every micro-batch's loss added in (rank, micro-batch)
     * order, as global_loss adds them, divided by R. */
    const int n = d->pending, ranks = e->c->size;
    if (!o->diloco_sim)
        tc_allgather_d(e->c, P_MISC, e->c->world, d->own, d->all, (size_t)n * (size_t)nmb);
    for (int t = 0; t < n; t++) {
        double sum = 0;
        if (o->diloco_sim)
            for (int i = 0; i < nown; i++)
                sum += d->own[(size_t)t * nown + (size_t)i];
        else
            for (int r = 0; r < ranks; r++)
                for (int i = 0; i < nmb; i++)
                    sum += d->all[((size_t)r * n + (size_t)t) * nmb + (size_t)i];
        d->done_loss[t] = sum / d->replicas;
    }
    d->pending = 0;
    return n;
}

double diloco_sim_validate(diloco_t *d, stage_t *s, const corpus_t *cp, mb_acts_t *mbs, int nmb,
                           int bl, int bm, double scale)
{
    engine_t *e = s->e;
    const opts_t *o = s->o;
    double sum = 0;
    for (int v = 0; v < o->val_batches; v++) {
        double lv = 0;
        for (int r = 0; r < d->replicas; r++) {
            use_replica(d, e, r);
            for (int i = 0; i < nmb; i++)
                corpus_fill(cp, o, s, &mbs[i], (uint64_t)v, r * bl + i * bm, 1);
            schedule_run(s, mbs, nmb, 0, scale);
            for (int i = 0; i < nmb; i++)
                d->mb_loss[r * nmb + i] = mbs[i].loss;
        }
        for (int i = 0; i < d->replicas * nmb; i++)
            lv += d->mb_loss[i];
        sum += lv;
    }
    use_replica(d, e, 0);
    return o->val_batches ? sum / o->val_batches : NAN;
}

void diloco_summary(const diloco_t *d, const engine_t *e, int64_t steps_run, FILE *log)
{
    const tcomm_t *c = e->c;
    const opts_t *o = e->o;
    /* per rank: theta_outer and the momentum, and (--diloco-sim) the other replicas' state */
    double mine[2] = {(double)e->pn * 2 * sizeof(float), 0}, *all;
    if (d->rp)
        mine[1] = (double)(d->replicas - 1) * (double)(e->pn + e->on + e->vn) * sizeof(float);
    if (!(all = calloc((size_t)c->size * 2, sizeof(double)))) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    tc_check(loomAllGather(mine, all, 2, loomFloat64, c->world, NULL), c, "loomAllGather");
    loomEchoCounters_t ec = {0};
    if (d->echo)
        tc_check(loomEchoGetCounters(c->data, &ec), c, "loomEchoGetCounters");
    if (log) {
        /* Bytes per token trained: the counters' data-group payload (rank 0's) against two
         * closed forms over the local vector of pn floats (padding included, as sent): plain DP
         * all-reduces all of it every step, DiLoCo once every H steps. */
        const double tok = (double)steps_run * o->batch * o->model.ctx;
        const double sent = (double)(c->bytes[P_DATA][K_ALLREDUCE] + c->bytes[P_DATA][K_ECHO]);
        const double per_step = (double)e->pn * sizeof(float) / ((double)o->batch * o->model.ctx);
        fprintf(log,
                "\"diloco\":%d,\"replicas\":%d,\"outer_lr\":%.17g,\"outer_momentum\":%.17g,"
                "\"diloco_echo\":%d,\"diloco_sim\":%d,\"outer_steps\":%lld,"
                "\"diloco_bytes_per_token\":%.6g,\"diloco_bytes_per_token_model\":%.6g,"
                "\"dp_bytes_per_token\":%.6g,\"diloco_echo_wire_bytes_per_token\":%.6g,"
                "\"diloco_mem\":[",
                d->h, d->replicas, o->outer_lr, o->outer_momentum, d->echo != NULL, o->diloco_sim,
                (long long)d->outer_steps, tok > 0 ? sent / tok : 0.0,
                d->replicas > 1 ? per_step / d->h : 0.0, d->replicas > 1 ? per_step : 0.0,
                tok > 0 ? (double)ec.bytes_sent / tok : 0.0);
        for (int k = 0; k < c->size; k++)
            fprintf(log, "%s[%.0f,%.0f]", k ? "," : "", all[2 * k], all[2 * k + 1]);
        fprintf(log, "],");
    }
    free(all);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * main.c - loom-train: the training loop, validation, logging (a line per step and JSON lines
 * with --log-json), checkpoints, elastic recovery and the final summary; the options are
 * options.c's. Start it with loomrun:
 *   loomrun -n 8 loom-train --dp 2 --tp 2 --pp 2
 * See trainer/README.md for what each parallel mode does.
 */
#include "train.h"

#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Numbers per rank in the summary: 6 of memory, 5 of loom_shard (muon_figures). */
#define MEMN 11

static const char *purpose_name[P_COUNT] = {"tp",  "cp",   "pp", "data",
                                            "tie", "misc", "sp", "mirror"};
static const char *kind_name[K_COUNT] = {"allreduce", "echo",    "reducescatter", "allgather",
                                         "send",      "recv",    "shardreduce",   "shardgather",
                                         "shardstep", "alltoall"};

static void json_counters(FILE *f, const tcomm_t *c)
{
    fprintf(f, "\"comm\":{");
    int first = 1;
    for (int p = 0; p < P_COUNT; p++)
        for (int k = 0; k < K_COUNT; k++)
            if (c->calls[p][k]) {
                fprintf(f, "%s\"%s.%s\":[%llu,%llu]", first ? "" : ",", purpose_name[p],
                        kind_name[k], (unsigned long long)c->calls[p][k],
                        (unsigned long long)c->bytes[p][k]);
                first = 0;
            }
    fprintf(f, "}");
}

/* A number for JSON: non-finite values (a diverged loss, no validation) are null. */
static const char *jnum(char *buf, double x)
{
    if (!isfinite(x))
        return "null";
    snprintf(buf, 32, "%.17g", x);
    return buf;
}

static double lr_at(const opts_t *o, int64_t step)
{
    return step < o->warmup ? o->lr * (double)(step + 1) / (double)o->warmup : o->lr;
}

static double validate(stage_t *s, const corpus_t *cp, mb_acts_t *mbs, int nmb, double scale)
{
    const opts_t *o = s->o;
    double sum = 0;
    int bl = o->batch / s->lay->g.dp, bm = bl / nmb;
    for (int v = 0; v < o->val_batches; v++) {
        for (int i = 0; i < nmb; i++)
            corpus_fill(cp, o, s, &mbs[i], (uint64_t)v, s->lay->g.dp_i * bl + i * bm, 1);
        sum += schedule_run(s, mbs, nmb, 0, scale);
    }
    return o->val_batches ? sum / o->val_batches : NAN;
}

// ---- One run ---------------------------------------------------------------------------

/* Everything a run holds from set-up to tear-down. The engine and the stage keep pointers to o
 * and c, so a run_t stays where main put it. */
typedef struct {
    opts_t o;
    tcomm_t c;
    grid_pos_t g;
    corpus_t corpus;
    engine_t e;
    stage_t s;
    mb_acts_t *mbs;
    int nmb, bl, bm;   /* micro-batches per step; sequences per rank and per micro-batch */
    size_t act_floats; /* activations of all micro-batches */
    FILE *log;         /* --log-json, rank 0 only */
    double scale;      /* 1 / tokens of the global batch */
    const char *sched;
    /* Totals over the timed steps: all but the run's first, which pays for connections and
     * page faults. */
    double t_total, comm_total, wait_total;
    int timed;
    int64_t first_step;
    double loss, val;   /* the last step's loss, the last validation loss (NAN: none yet) */
    diloco_t dl;        /* --diloco */
    elastic_state_t el; /* --elastic: checkpoints written and recoveries made */
    int restoring;      /* setup_model leaves the initial values out: the recovery restores */
} run_t;

static double run_validate(run_t *r)
{
    if (r->o.diloco_sim)
        return diloco_sim_validate(&r->dl, &r->s, &r->corpus, r->mbs, r->nmb, r->bl, r->bm,
                                   r->scale);
    return validate(&r->s, &r->corpus, r->mbs, r->nmb, r->scale);
}

/* The communicator, the grid checks and the corpus; 0, or the exit code. */
static int setup_comm(run_t *r)
{
    /* Ranks share the host's cores: one BLAS thread each, unless the user says otherwise. */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    memset(&r->c, 0, sizeof(r->c));
    if (tc_init(&r->c, &r->o))
        return 2;
    char err[512];
    r->g = r->c.g;
    int bad = layout_check(&r->o.model, &r->g, err, sizeof(err));
    if (!bad && r->o.batch % (r->g.dp * r->o.micro)) {
        snprintf(err, sizeof(err), "--batch %d must be a multiple of dp %d x --micro %d",
                 r->o.batch, r->g.dp, r->o.micro);
        bad = 1;
    }
    if (!bad && corpus_load(&r->corpus, r->o.data, r->o.val_frac, r->o.model.ctx, err, sizeof(err)))
        bad = 1;
    if (bad) {
        /* every rank says it: the launcher may stop the others as soon as one exits */
        fprintf(stderr, "loom-train: rank %d: %s\n", r->c.rank, err);
        tc_free(&r->c);
        return 2;
    }
    return 0;
}

/* The engine, the stage and the activations of every micro-batch; 0, or the exit code. */
static int setup_model(run_t *r)
{
    if ((r->restoring ? eng_alloc : eng_init)(&r->e, &r->o, &r->c)) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    r->nmb = r->o.micro;
    if (diloco_init(&r->dl, &r->e, &r->o))
        return 2;
    r->bl = r->o.batch / diloco_replicas(&r->o, &r->g);
    r->bm = r->bl / r->nmb;
    const int tl = r->o.model.ctx / r->g.cp;
    r->scale = 1.0 / ((double)r->o.batch * (double)r->o.model.ctx);
    r->sched = schedule_names[r->o.schedule];
    stage_init(&r->s, &r->e, &r->c, &r->o, r->bm);
    if (r->o.schedule == SCHED_DUALPIPE && dualpipe_init(&r->s, r->nmb, r->bm))
        return 1;
    r->mbs = calloc((size_t)r->nmb, sizeof(mb_acts_t));
    if (!r->mbs) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    for (int i = 0; i < r->nmb; i++) {
        mb_alloc(&r->mbs[i], r->s.dual ? dualpipe_mb_layout(&r->s, i, r->nmb) : &r->e.lay, r->bm,
                 tl);
        r->act_floats += r->mbs[i].floats;
    }
    return 0;
}

/* --resume: every rank learns whether every rank could load, so that all stop together. */
static int resume(run_t *r)
{
    if (!r->o.resume)
        return 0;
    char err[512];
    double failed;
    uint64_t step, id;
    if (ckpt_global_exists(r->o.resume)) { /* PREFIX.global (--elastic): any layout reads it */
        failed = ckpt_global_load(&r->e, r->o.resume, &step, &id, err, sizeof(err)) ? 1 : 0;
        r->el.resume_global = (int64_t)step;
    } else {
        failed = eng_load(&r->e, r->o.resume, err, sizeof(err)) ? 1 : 0;
    }
    if (failed)
        fprintf(stderr, "loom-train: rank %d: %s\n", r->c.rank, err);
    tc_check(loomAllReduce(&failed, &failed, 1, loomFloat64, loomSum, r->c.world, NULL), &r->c,
             "loomAllReduce");
    if (failed > 0) {
        tc_free(&r->c);
        return 1;
    }
    return 0;
}

/* Rank 0's --dump-batch and --log-json files, and its banner; 0, or the exit code. */
static int open_outputs(run_t *r)
{
    const opts_t *o = &r->o;
    if (o->dump_batch && r->c.rank == 0 &&
        corpus_dump_batch(&r->corpus, o, (uint64_t)r->e.step, o->dump_batch)) {
        fprintf(stderr, "loom-train: cannot write %s\n", o->dump_batch);
        return 1;
    }
    if (o->log_json && r->c.rank == 0 && !(r->log = fopen(o->log_json, "w"))) {
        fprintf(stderr, "loom-train: cannot write %s\n", o->log_json);
        return 1;
    }
    if (r->c.rank == 0 && !o->quiet)
        printf("loom-train: %d ranks = dp %d x tp %d x pp %d x cp %d, zero %d, %s, tp all-reduce "
               "%s; model L%d C%d H%d T%d, %zu parameters; batch %d x %d tokens, %d "
               "micro-batches\n",
               r->c.size, r->g.dp, r->g.tp, r->g.pp, r->g.cp, o->zero, r->sched,
               o->tp_reduce == TP_ECHO ? "echo" : "fp32", o->model.layers, o->model.d,
               o->model.heads, o->model.ctx, r->e.lay.global_len, o->batch, o->model.ctx, r->nmb);
    if (r->c.rank == 0 && !o->quiet && o->sp > 1)
        printf("loom-train: Ulysses sequence parallelism: the cp split of %d, attention on %d of "
               "the %d local heads between two all-to-alls\n",
               o->sp, r->e.lay.hl / o->sp, r->e.lay.hl);
    if (r->c.rank == 0 && !o->quiet && o->optim == OPTIM_MUON) {
        static const char *shard[] = {"none (DDP Muon)", "zero1", "owner", "rows"};
        printf("loom-train: Muon on the attention and MLP matrices (lr %g, momentum %g), AdamW on "
               "the rest; shard %s over the data group of %d\n",
               o->muon_lr, o->muon_momentum, shard[o->shard], r->c.data_size);
    }
    if (r->c.rank == 0 && !o->quiet && o->diloco)
        printf("loom-train: DiLoCo over %d replicas: %d inner AdamW steps, then an outer Nesterov "
               "step (lr %g, momentum %g) on the mean delta, %s all-reduce%s\n",
               r->dl.replicas, o->diloco, o->outer_lr, o->outer_momentum,
               o->diloco_echo ? "Echo" : "fp32", o->diloco_sim ? ", simulated in one process" : "");
    if (r->c.rank == 0 && !o->quiet && o->model.moe_e > 0)
        printf("loom-train: mixture of %d experts, top %d, every %d-th block, ep %d, %s dispatch, "
               "aux coefficient %g\n",
               o->model.moe_e, o->model.moe_k, o->model.moe_every, r->g.ep,
               o->moe_mode == loomMoeModeNaive ? "naive" : "dedup", o->moe_aux);
    return 0;
}

/* What one step measured, for its report line. */
typedef struct {
    int64_t step;
    double lr, dt, dc, dw; /* learning rate; seconds of the step, of communication, of pipeline
                              waits */
    int validated;         /* r->val is this step's validation loss */
    /* MoE: the auxiliary loss and the counters of moe_take_stats, summed over the ranks (the
     * seconds: rank 0's) */
    double aux, moe[MOE_STATS];
    int moved; /* experts --moe-place moved after this step */
} step_stats_t;

/* Rank 0's line and JSON line of one step. */
static void report_step(const run_t *r, const step_stats_t *st)
{
    const opts_t *o = &r->o;
    const double tps = (double)o->batch * o->model.ctx / st->dt;
    char b1[32], b2[32];
    if (!o->quiet) {
        printf("step %4lld/%d | loss %.6f | lr %.2e | norm %.3f | %8.0f tok/s | %7.2f ms | "
               "comm %4.1f%%",
               (long long)st->step + 1, o->steps, r->loss, st->lr, r->e.last_norm, tps,
               st->dt * 1e3, 100.0 * st->dc / st->dt);
        if (r->g.pp > 1)
            printf(" | pipeline wait %4.1f%%", 100.0 * st->dw / st->dt);
        if (st->validated)
            printf(" | val %.4f", r->val);
        printf("\n");
        fflush(stdout);
    }
    if (r->log) {
        fprintf(r->log,
                "{\"step\":%lld,\"loss\":%s,\"lr\":%.6g,\"norm\":%s,\"ms\":%.4f,"
                "\"tok_s\":%.1f,\"comm_share\":%.4f,\"pp_wait_share\":%.4f",
                (long long)st->step + 1, jnum(b1, r->loss), st->lr, jnum(b2, r->e.last_norm),
                st->dt * 1e3, tps, st->dc / st->dt, st->dw / st->dt);
        if (st->validated)
            fprintf(r->log, ",\"val_loss\":%s", jnum(b1, r->val));
        if (o->model.moe_e > 0)
            fprintf(r->log,
                    ",\"aux_loss\":%s,\"moe_rows_saved\":%.0f,\"moe_rows_sent\":%.0f,"
                    "\"moe_local_hits\":%.0f,\"moe_selections\":%.0f,\"moe_a2a_ms\":%.4f,\"moe_"
                    "moved\":%d",
                    jnum(b1, st->aux), st->moe[MOE_ROWS_SAVED], st->moe[MOE_ROWS_SENT],
                    st->moe[MOE_PAIRS_LOCAL], st->moe[MOE_PAIRS], st->moe[MOE_SECONDS] * 1e3,
                    st->moved);
        fprintf(r->log, "}\n");
        fflush(r->log);
    }
}

/* The step's MoE figures, summed over the ranks; the time is rank 0's own. */
static void moe_step_report(run_t *r, step_stats_t *st)
{
    double v[MOE_STATS + 1];
    moe_take_stats(&r->s, v);
    double secs = v[MOE_SECONDS];
    v[MOE_STATS] = 0;
    for (int i = 0; i < r->nmb; i++)
        v[MOE_STATS] += r->mbs[i].aux;
    tc_allreduce_d(&r->c, P_MISC, r->c.world, v, MOE_STATS + 1);
    memcpy(st->moe, v, sizeof(st->moe));
    st->moe[MOE_SECONDS] = secs;
    st->aux = v[MOE_STATS];
}

/* DiLoCo's replicas exchange their losses only at the outer step: the round's steps are
 * reported then, each with its own loss and norm. */
static void report_diloco(run_t *r, const step_stats_t *st, int known)
{
    static step_stats_t *pend;
    static int np;
    if (!pend && !(pend = calloc((size_t)r->o.diloco, sizeof(*pend)))) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    pend[np++] = *st;
    for (int i = 0; i < known; i++) {
        r->loss = r->dl.done_loss[i], r->e.last_norm = r->dl.norms[i];
        if (r->c.rank == 0)
            report_step(r, &pend[i]);
    }
    if (known)
        np = 0;
}

/* One optimizer step on the global batch `step`, then --val-every's validation. */
static void train_step(run_t *r, int64_t step)
{
    const opts_t *o = &r->o;
    step_stats_t st = {.step = step};
    double t0 = tc_now(), c0 = r->c.comm_s, w0 = r->c.pp_wait_s;
    st.lr = lr_at(o, step);
    int known = 0; /* DiLoCo: the steps whose losses this outer step made known */
    if (o->diloco) {
        known = diloco_step(&r->dl, &r->s, &r->corpus, r->mbs, r->nmb, r->bl, r->bm, step, st.lr);
    } else {
        eng_zero_grads(&r->e);
        if (o->model.moe_e > 0)
            moe_take_stats(&r->s, st.moe); /* drops what validation counted */
        for (int i = 0; i < r->nmb; i++)
            corpus_fill(&r->corpus, o, &r->s, &r->mbs[i], (uint64_t)step,
                        r->g.dp_i * r->bl + i * r->bm, 0);
        r->loss = schedule_run(&r->s, r->mbs, r->nmb, 1, r->scale);
        if (r->s.dual)
            dualpipe_step(&r->s, st.lr);
        else
            eng_step(&r->e, st.lr);
    }
    if (o->model.moe_e > 0)
        moe_step_report(r, &st);
    /* after the step's counters: a new placement makes new plans */
    if (o->moe_place && (step + 1) % o->moe_place == 0)
        st.moved = moe_replace(&r->s, &r->e);
    st.dt = tc_now() - t0, st.dc = r->c.comm_s - c0, st.dw = r->c.pp_wait_s - w0;
    if (step > r->first_step) {
        r->t_total += st.dt, r->comm_total += st.dc, r->wait_total += st.dw;
        r->timed++;
    }
    st.validated = o->val_every > 0 && (step + 1) % o->val_every == 0;
    if (st.validated)
        r->val = run_validate(r);
    if (o->diloco)
        report_diloco(r, &st, known);
    else if (r->c.rank == 0)
        report_step(r, &st);
}

/* --save: the per-rank checkpoint, or under --elastic the layout-independent one (collective);
 * 0 or -1 with a message. */
static int save(run_t *r)
{
    char err[512];
    int rc = r->o.elastic ? ckpt_global_save(&r->e, r->o.save, r->el.run_id, err, sizeof(err))
                          : eng_save(&r->e, r->o.save, err, sizeof(err));
    if (rc)
        fprintf(stderr, "loom-train: rank %d: %s\n", r->c.rank, err);
    else if (r->o.elastic)
        r->el.ckpt_step = r->e.step;
    return rc;
}

static void free_model(run_t *r)
{
    for (int i = 0; i < r->nmb; i++)
        mb_free(&r->mbs[i]);
    free(r->mbs);
    stage_free(&r->s);
    eng_free(&r->e);
    r->act_floats = 0;
}

/* --elastic: after a failure in step `failed`, the grid shrunk to the survivors, the model
 * rebuilt for the new dp and the state restored; rank 0 logs an "elastic" event. */
static void recover(run_t *r, const tc_recover_t *rec, int64_t failed)
{
    elastic_ev_t ev = {.failed_step = failed, .t_seen = rec->t};
    r->c.recover = NULL; /* a failure during the recovery ends the run */
    r->c.kill_after = 0;
    int inmem = elastic_in_memory(&r->o);
    size_t n = r->e.lay.global_len;
    float *g = inmem ? calloc(3 * n, sizeof(float)) : NULL;
    int64_t step = r->e.step;
    if (inmem && !g) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    if (inmem)
        eng_export(&r->e, g, g + n, g + 2 * n, 1);
    elastic_shrink(&r->c, &r->o, &ev);
    r->g = r->c.g;
    double t = tc_now();
    free_model(r);
    r->restoring = 1;
    if (setup_model(r))
        exit(1);
    r->restoring = 0;
    ev.rebuild_s = tc_now() - t;
    if (inmem) {
        elastic_restore_memory(&r->e, g, step);
        ev.path = "in-memory";
    } else {
        ev.path = elastic_restore_ckpt(&r->e, &r->o, &r->el, r->first_step);
    }
    free(g);
    ev.resume_step = r->e.step;
    ev.recovery_s = tc_now() - ev.t_seen;
    r->el.recoveries++;
    if (r->c.rank != 0)
        return;
    if (!r->log && r->o.log_json && !(r->log = fopen(r->o.log_json, "a")))
        fprintf(stderr, "loom-train: cannot write %s\n", r->o.log_json);
    elastic_report(r->log, &ev, r->el.recoveries, r->g.dp, r->o.quiet);
}

/* The steps left (all of them unless --resume), then the end-of-run validation. Under --elastic
 * a failed collective unwinds the step to here (tc_check), and the run goes on from the step
 * the recovery restored. */
static void train(run_t *r)
{
    r->loss = NAN, r->val = NAN;
    r->first_step = r->e.step;
    tc_recover_t rec;
    volatile int64_t step = r->e.step;
    if (r->o.elastic) {
        r->el.run_id = elastic_run_id(&r->c);
        if (setjmp(rec.jb)) {
            recover(r, &rec, step);
            step = r->e.step;
        }
        r->c.recover = &rec;
    }
    for (; step < r->o.steps; step++) {
        elastic_arm_kill(&r->c, &r->o, step, r->el.recoveries);
        train_step(r, step);
        if (r->o.save_every && (step + 1) % r->o.save_every == 0 && step + 1 < r->o.steps &&
            save(r))
            exit(1);
    }
    r->c.recover = NULL;
    if (r->o.val_batches > 0 && r->o.val_every == 0)
        r->val = run_validate(r);
}

/* Rank 0's summary JSON line: the run's shape and totals, every rank's memory (mem: 6 numbers a
 * rank), for Muon every rank's loom_shard figures (shard: bytes sent, bytes received, step
 * collectives, state floats, Newton-Schulz multiply-adds per step; muon_figures) and rank 0's
 * collective counters, which let a test check what each mode calls. */
/* Numbers per rank for the pipeline: its pipeline wait's share of the step, then zb_figures. */
#define PIPEN (1 + ZB_FIGS)

/* The pipeline's per-rank figures: every rank's pipeline wait share ("pp_wait_ranks") and, for the
 * zero-bubble schedules, "zb": per rank the mean ms of an F, a B and a W, the most micro-batches
 * in flight, the most deferred W's and the bytes they keep. */
static void pipe_json(const run_t *r, const double *pipe)
{
    fprintf(r->log, "\"pp_wait_ranks\":[");
    for (int k = 0; k < r->c.size; k++)
        fprintf(r->log, "%s%.4f", k ? "," : "", pipe[PIPEN * k]);
    fprintf(r->log, "],");
    if (r->o.schedule != SCHED_ZB_H1 && r->o.schedule != SCHED_ZB_H2)
        return;
    fprintf(r->log, "\"zb\":[");
    for (int k = 0; k < r->c.size; k++) {
        const double *z = pipe + PIPEN * k + 1;
        fprintf(r->log, "%s[%.4f,%.4f,%.4f,%.0f,%.0f,%.0f]", k ? "," : "", z[ZB_F_MS], z[ZB_B_MS],
                z[ZB_W_MS], z[ZB_INFLIGHT], z[ZB_PENDING], z[ZB_KEEP_BYTES]);
    }
    fprintf(r->log, "],");
}

static void summary_json(run_t *r, const double *mem, const double *pipe, double tps)
{
    const opts_t *o = &r->o;
    char b1[32], b2[32], b3[32];
    fprintf(r->log,
            "{\"summary\":1,\"ranks\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,\"cp\":%d,\"sp\":%d,"
            "\"zero\":%d,\"micro\":%d,\"schedule\":\"%s\",\"echo\":%d,\"steps\":%lld,"
            "\"loss\":%s,\"val_loss\":%s,\"tok_s\":%.1f,\"comm_share\":%.4f,"
            "\"pp_wait_share\":%.4f,\"ideal_bubble\":%s,\"global_params\":%zu,\"moe\":%d,"
            "\"top_k\":%d,\"ep\":%d,\"mem\":[",
            r->c.size, r->g.dp, r->g.tp, r->g.pp, o->sp > 1 ? 1 : r->g.cp, o->sp, o->zero, r->nmb,
            r->sched, o->tp_reduce == TP_ECHO, (long long)(o->steps - r->first_step),
            jnum(b1, r->loss), jnum(b2, r->val), tps,
            r->t_total > 0 ? r->comm_total / r->t_total : 0.0,
            r->t_total > 0 ? r->wait_total / r->t_total : 0.0,
            jnum(b3, r->g.pp > 1 ? schedule_ideal_bubble(&r->s, r->nmb) : 0.0), r->e.lay.global_len,
            o->model.moe_e, o->model.moe_k, r->g.ep);
    for (int k = 0; k < r->c.size; k++)
        fprintf(r->log, "%s[%.0f,%.0f,%.0f,%.0f,%.0f,%.0f]", k ? "," : "", mem[MEMN * k],
                mem[MEMN * k + 1], mem[MEMN * k + 2], mem[MEMN * k + 3], mem[MEMN * k + 4],
                mem[MEMN * k + 5]);
    fprintf(r->log, "]");
    if (o->elastic)
        fprintf(r->log, ",\"recoveries\":%d", r->el.recoveries);
    fprintf(r->log, ",\"optim\":\"%s\",\"shard\":\"%s\",",
            o->optim == OPTIM_MUON ? "muon" : "adamw",
            (const char *[]){"none", "zero1", "owner", "rows"}[o->shard]);
    if (o->optim == OPTIM_MUON) {
        fprintf(r->log, "\"shard_figures\":[");
        for (int k = 0; k < r->c.size; k++)
            fprintf(r->log, "%s[%.0f,%.0f,%.0f,%.0f,%.0f]", k ? "," : "", mem[MEMN * k + 6],
                    mem[MEMN * k + 7], mem[MEMN * k + 8], mem[MEMN * k + 9], mem[MEMN * k + 10]);
        fprintf(r->log, "],");
    }
    pipe_json(r, pipe);
    if (o->diloco)
        diloco_summary(&r->dl, &r->e, o->steps - r->first_step, r->log);
    json_counters(r->log, &r->c);
    fprintf(r->log, "}\n");
}

/* The summary: every rank's memory is gathered so that rank 0 can report each one's share;
 * 0, or the exit code. */
static int report_summary(run_t *r)
{
    const opts_t *o = &r->o;
    const engine_t *e = &r->e;
    double mem[MEMN] = {(double)e->pn * 4,           (double)(e->gn + e->gsn) * 4,
                        (double)(e->on + e->vn) * 4, (double)e->peak_tmp * 4,
                        (double)r->act_floats * 4,   (double)e->lay.total};
    muon_figures(e, mem + 6);
    if (r->s.dual)
        dualpipe_mem(&r->s, mem);
    double pipe[PIPEN] = {r->t_total > 0 ? r->wait_total / r->t_total : 0.0};
    zb_figures(&r->s, pipe + 1);
    double *all = calloc((size_t)r->c.size * (MEMN + PIPEN), sizeof(double));
    double *pall = all ? all + (size_t)r->c.size * MEMN : NULL;
    if (!all) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    tc_check(loomAllGather(mem, all, MEMN, loomFloat64, r->c.world, NULL), &r->c, "loomAllGather");
    tc_check(loomAllGather(pipe, pall, PIPEN, loomFloat64, r->c.world, NULL), &r->c,
             "loomAllGather");
    if (r->c.rank == 0) {
        double tps = r->timed ? (double)o->batch * o->model.ctx * r->timed / r->t_total : 0;
        if (!o->quiet)
            printf("loom-train: done: %lld steps, loss %.4f, val loss %.4f, %.0f tok/s, "
                   "comm %.1f%% of step time\n",
                   (long long)(o->steps - r->first_step), r->loss, r->val, tps,
                   r->t_total > 0 ? 100.0 * r->comm_total / r->t_total : 0.0);
        double ideal = r->g.pp > 1 ? schedule_ideal_bubble(&r->s, r->nmb) : 0.0;
        char ib[64] = "";
        if (isfinite(ideal))
            snprintf(ib, sizeof(ib), "; its ideal bubble is %.1f%%", 100.0 * ideal);
        if (r->g.pp > 1 && !o->quiet)
            printf("loom-train: pipeline wait (bubble) %.1f%% of step time on rank 0 (%s)%s\n",
                   r->t_total > 0 ? 100.0 * r->wait_total / r->t_total : 0.0, r->sched, ib);
        if (r->log)
            summary_json(r, all, pall, tps);
    }
    if (o->diloco && !r->log) /* every rank joins its gather; rank 0 with a log did */
        diloco_summary(&r->dl, &r->e, o->steps - r->first_step, NULL);
    free(all);
    return 0;
}

/* --save and --dump-params, then everything released; the exit code. */
static int finish(run_t *r)
{
    int rc = 0;
    if (r->o.save && save(r))
        rc = 1;
    if (r->o.dump_params && eng_dump(&r->e, r->o.dump_params, 0))
        rc = 1;
    if (r->log)
        fclose(r->log);
    for (int i = 0; i < r->nmb; i++)
        mb_free(&r->mbs[i]);
    free(r->mbs);
    dualpipe_free(&r->s);
    stage_free(&r->s);
    diloco_free(&r->dl);
    eng_free(&r->e);
    corpus_free(&r->corpus);
    tc_free(&r->c);
    return rc;
}

int main(int argc, char **argv)
{
    static run_t run; /* zeroed, and alive as long as the engine's and stage's pointers into it */
    run_t *r = &run;
    r->el.ckpt_step = r->el.resume_global = -1;
    int rc;
    if (opts_parse(argc, argv, &r->o))
        return 2;
    if ((rc = setup_comm(r)) || (rc = setup_model(r)) || (rc = resume(r)) || (rc = open_outputs(r)))
        return rc;
    train(r);
    if ((rc = report_summary(r)))
        return rc;
    return finish(r);
}

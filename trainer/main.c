/* SPDX-License-Identifier: Apache-2.0
 *
 * main.c - loom-train: options, the training loop, validation, logging (a line per step and
 * JSON lines with --log-json), checkpoints and the final summary. Start it with loomrun:
 *   loomrun -n 8 loom-train --dp 2 --tp 2 --pp 2
 * See trainer/README.md for what each parallel mode does.
 */
#include "train.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CORPUS "/usr/share/common-licenses/GPL-3"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: loomrun -n N loom-train [options]\n"
            "model:    --layers L (4) --d C (64) --heads H (4) --ctx T (64) --seed S (1)\n"
            "grid:     --dp D (world / (tp*pp*cp)) --tp T (1) --pp P (1) --cp C (1)\n"
            "          --zero 0|1|2|3 (0)   --schedule 1f1b|gpipe   --tp-allreduce fp32|echo\n"
            "          --no-overlap (reduce gradients after the backward instead of during it)\n"
            "batch:    --batch B sequences per step (8) --micro M per rank (1) --steps N (50)\n"
            "optim:    --lr (3e-3) --warmup (10) --wd (0.1) --clip (1.0) --beta1 --beta2 --eps\n"
            "data:     --data FILE (%s) --val-every N (0 = end only) --val-batches N (4)\n"
            "output:   --log-json FILE --save PREFIX --resume PREFIX --dump-params FILE --quiet\n"
            "checks:   --dump-grads FILE, --dump-batch FILE: the reduced gradients and the global "
            "batch\n"
            "          (tokens, then targets) of the run's first step\n",
            DEFAULT_CORPUS);
}

/* The options: each names its field and how to read it. */
enum optkind { OK_INT, OK_U64, OK_DBL, OK_STR, OK_OFF, OK_ON, OK_SCHED, OK_TPRED, OK_HELP };
typedef struct {
    const char *name;
    enum optkind kind;
    size_t off; /* offsetof(opts_t, field) */
} optdef_t;

#define OPT(n, k, f)                                                                               \
    {                                                                                              \
        n, k, offsetof(opts_t, f)                                                                  \
    }
static const optdef_t optdefs[] = {
    OPT("layers", OK_INT, model.layers),
    OPT("d", OK_INT, model.d),
    OPT("heads", OK_INT, model.heads),
    OPT("ctx", OK_INT, model.ctx),
    OPT("seed", OK_U64, model.seed),
    OPT("dp", OK_INT, dp),
    OPT("tp", OK_INT, tp),
    OPT("pp", OK_INT, pp),
    OPT("cp", OK_INT, cp),
    OPT("zero", OK_INT, zero),
    OPT("batch", OK_INT, batch),
    OPT("micro", OK_INT, micro),
    OPT("steps", OK_INT, steps),
    OPT("warmup", OK_INT, warmup),
    OPT("val-every", OK_INT, val_every),
    OPT("val-batches", OK_INT, val_batches),
    OPT("lr", OK_DBL, lr),
    OPT("wd", OK_DBL, wd),
    OPT("clip", OK_DBL, clip),
    OPT("beta1", OK_DBL, beta1),
    OPT("beta2", OK_DBL, beta2),
    OPT("eps", OK_DBL, eps),
    OPT("data", OK_STR, data),
    OPT("log-json", OK_STR, log_json),
    OPT("save", OK_STR, save),
    OPT("resume", OK_STR, resume),
    OPT("dump-params", OK_STR, dump_params),
    OPT("dump-grads", OK_STR, dump_grads),
    OPT("dump-batch", OK_STR, dump_batch),
    OPT("no-overlap", OK_OFF, overlap),
    OPT("quiet", OK_ON, quiet),
    OPT("schedule", OK_SCHED, schedule),
    OPT("tp-allreduce", OK_TPRED, tp_reduce),
    OPT("help", OK_HELP, quiet),
};
#define NOPTS (sizeof(optdefs) / sizeof(optdefs[0]))

/* Stores optarg into the option's field; -1 if the value is not valid for it. */
static int set_opt(opts_t *o, const optdef_t *d, const char *arg)
{
    char *field = (char *)o + d->off, *end = NULL;
    switch (d->kind) {
    case OK_INT:
    case OK_U64: {
        errno = 0;
        long long v = strtoll(arg, &end, 10);
        if (!*arg || *end || errno || v < 0 || (d->kind == OK_INT && v > (1 << 30)))
            return -1;
        if (d->kind == OK_INT)
            *(int *)field = (int)v;
        else
            *(uint64_t *)field = (uint64_t)v;
        return 0;
    }
    case OK_DBL: {
        double v = strtod(arg, &end);
        if (!*arg || *end || !isfinite(v) || v < 0)
            return -1;
        *(double *)field = v;
        return 0;
    }
    case OK_STR:
        *(const char **)field = arg;
        return 0;
    case OK_OFF:
        *(int *)field = 0;
        return 0;
    case OK_ON:
        *(int *)field = 1;
        return 0;
    case OK_SCHED:
    case OK_TPRED: {
        const char *a = d->kind == OK_SCHED ? "1f1b" : "fp32",
                   *b = d->kind == OK_SCHED ? "gpipe" : "echo";
        if (strcmp(arg, a) && strcmp(arg, b))
            return -1;
        *(int *)field =
            strcmp(arg, a) ? 1 : 0; /* SCHED_1F1B/TP_FP32 = 0, SCHED_GPIPE/TP_ECHO = 1 */
        return 0;
    }
    case OK_HELP:
        usage(stdout);
        exit(0);
    }
    return -1;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.model = {.vocab = 256, .ctx = 64, .d = 64, .heads = 4, .layers = 4, .seed = 1},
                  .dp = 0,
                  .tp = 1,
                  .pp = 1,
                  .cp = 1,
                  .batch = 8,
                  .micro = 1,
                  .steps = 50,
                  .overlap = 1,
                  .lr = 3e-3,
                  .beta1 = 0.9,
                  .beta2 = 0.95,
                  .eps = 1e-8,
                  .wd = 0.1,
                  .clip = 1.0,
                  .warmup = 10,
                  .data = DEFAULT_CORPUS,
                  .val_frac = 0.1,
                  .val_batches = 4};
    struct option lo[NOPTS + 1];
    for (size_t i = 0; i < NOPTS; i++) {
        enum optkind k = optdefs[i].kind;
        lo[i] = (struct option){optdefs[i].name, k == OK_OFF || k == OK_ON || k == OK_HELP ? 0 : 1,
                                NULL, (int)i};
    }
    lo[NOPTS] = (struct option){0, 0, 0, 0};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c < 0 || (size_t)c >= NOPTS) {
            usage(stderr);
            return -1;
        }
        if (set_opt(o, &optdefs[c], optarg)) {
            fprintf(stderr, "loom-train: bad value '%s' for --%s\n", optarg, optdefs[c].name);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "loom-train: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->tp < 1 || o->pp < 1 || o->cp < 1 || o->micro < 1 || o->batch < 1 || o->zero > 3 ||
        o->beta1 >= 1 || o->beta2 >= 1) {
        fprintf(stderr, "loom-train: degrees, --micro and --batch must be >= 1, --zero 0..3, "
                        "betas < 1\n");
        return -1;
    }
    if (o->zero > 0 && o->pp > 1) {
        fprintf(stderr, "loom-train: --zero with --pp > 1 is not supported (as in DeepSpeed, "
                        "ZeRO shards over the data group of a single stage)\n");
        return -1;
    }
    return 0;
}

static const char *purpose_name[P_COUNT] = {"tp", "cp", "pp", "data", "tie", "misc"};
static const char *kind_name[K_COUNT] = {"allreduce", "echo", "reducescatter",
                                         "allgather", "send", "recv"};

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

int main(int argc, char **argv)
{
    opts_t o;
    if (parse(argc, argv, &o))
        return 2;
    /* Ranks share the host's cores: one BLAS thread each, unless the user says otherwise. */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    tcomm_t c;
    memset(&c, 0, sizeof(c));
    if (tc_init(&c, &o))
        return 2;
    char err[512];
    grid_pos_t g = c.g;
    int bad = layout_check(&o.model, &g, err, sizeof(err));
    if (!bad && o.batch % (g.dp * o.micro)) {
        snprintf(err, sizeof(err), "--batch %d must be a multiple of dp %d x --micro %d", o.batch,
                 g.dp, o.micro);
        bad = 1;
    }
    corpus_t corpus = {0};
    if (!bad && corpus_load(&corpus, o.data, o.val_frac, o.model.ctx, err, sizeof(err)))
        bad = 1;
    if (bad) {
        /* every rank says it: the launcher may stop the others as soon as one exits */
        fprintf(stderr, "loom-train: rank %d: %s\n", c.rank, err);
        tc_free(&c);
        return 2;
    }
    engine_t e;
    if (eng_init(&e, &o, &c)) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    int nmb = o.micro, bl = o.batch / g.dp, bm = bl / nmb, tl = o.model.ctx / g.cp;
    stage_t s;
    stage_init(&s, &e, &c, &o, bm);
    mb_acts_t *mbs = calloc((size_t)nmb, sizeof(mb_acts_t));
    if (!mbs) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    size_t act_floats = 0;
    for (int i = 0; i < nmb; i++) {
        mb_alloc(&mbs[i], &e.lay, bm, tl);
        act_floats += mbs[i].floats;
    }
    if (o.resume) {
        /* Every rank learns whether every rank could load, so that all stop together. */
        double failed = eng_load(&e, o.resume, err, sizeof(err)) ? 1 : 0;
        if (failed)
            fprintf(stderr, "loom-train: rank %d: %s\n", c.rank, err);
        tc_check(loomAllReduce(&failed, &failed, 1, loomFloat64, loomSum, c.world, NULL), &c,
                 "loomAllReduce");
        if (failed > 0) {
            tc_free(&c);
            return 1;
        }
    }
    if (o.dump_batch && c.rank == 0 &&
        corpus_dump_batch(&corpus, &o, (uint64_t)e.step, o.dump_batch)) {
        fprintf(stderr, "loom-train: cannot write %s\n", o.dump_batch);
        return 1;
    }
    FILE *log = NULL;
    if (o.log_json && c.rank == 0 && !(log = fopen(o.log_json, "w"))) {
        fprintf(stderr, "loom-train: cannot write %s\n", o.log_json);
        return 1;
    }
    const double scale = 1.0 / ((double)o.batch * (double)o.model.ctx);
    const char *sched = o.schedule == SCHED_GPIPE ? "gpipe" : "1f1b";
    if (c.rank == 0 && !o.quiet)
        printf("loom-train: %d ranks = dp %d x tp %d x pp %d x cp %d, zero %d, %s, tp all-reduce "
               "%s; model L%d C%d H%d T%d, %zu parameters; batch %d x %d tokens, %d "
               "micro-batches\n",
               c.size, g.dp, g.tp, g.pp, g.cp, o.zero, sched,
               o.tp_reduce == TP_ECHO ? "echo" : "fp32", o.model.layers, o.model.d, o.model.heads,
               o.model.ctx, e.lay.global_len, o.batch, o.model.ctx, nmb);
    char b1[32], b2[32];
    double t_total = 0, comm_total = 0, wait_total = 0, loss = NAN, val = NAN;
    int timed = 0;
    int64_t first_step = e.step;
    for (int64_t step = e.step; step < o.steps; step++) {
        double t0 = tc_now(), c0 = c.comm_s, w0 = c.pp_wait_s;
        eng_zero_grads(&e);
        for (int i = 0; i < nmb; i++)
            corpus_fill(&corpus, &o, &s, &mbs[i], (uint64_t)step, g.dp_i * bl + i * bm, 0);
        loss = schedule_run(&s, mbs, nmb, 1, scale);
        double lr = lr_at(&o, step);
        eng_step(&e, lr);
        double dt = tc_now() - t0, dc = c.comm_s - c0, dw = c.pp_wait_s - w0;
        if (step > first_step) { /* the first step pays for connections and page faults */
            t_total += dt, comm_total += dc, wait_total += dw;
            timed++;
        }
        double tps = (double)o.batch * o.model.ctx / dt;
        int do_val = o.val_every > 0 && (step + 1) % o.val_every == 0;
        if (do_val)
            val = validate(&s, &corpus, mbs, nmb, scale);
        if (c.rank == 0) {
            if (!o.quiet) {
                printf("step %4lld/%d | loss %.6f | lr %.2e | norm %.3f | %8.0f tok/s | %7.2f ms | "
                       "comm %4.1f%%",
                       (long long)step + 1, o.steps, loss, lr, e.last_norm, tps, dt * 1e3,
                       100.0 * dc / dt);
                if (g.pp > 1)
                    printf(" | pipeline wait %4.1f%%", 100.0 * dw / dt);
                if (do_val)
                    printf(" | val %.4f", val);
                printf("\n");
                fflush(stdout);
            }
            if (log) {
                fprintf(log,
                        "{\"step\":%lld,\"loss\":%s,\"lr\":%.6g,\"norm\":%s,\"ms\":%.4f,"
                        "\"tok_s\":%.1f,\"comm_share\":%.4f,\"pp_wait_share\":%.4f",
                        (long long)step + 1, jnum(b1, loss), lr, jnum(b2, e.last_norm), dt * 1e3,
                        tps, dc / dt, dw / dt);
                if (do_val)
                    fprintf(log, ",\"val_loss\":%s", jnum(b1, val));
                fprintf(log, "}\n");
                fflush(log);
            }
        }
    }
    if (o.val_batches > 0 && o.val_every == 0)
        val = validate(&s, &corpus, mbs, nmb, scale);
    /* Per-rank memory, gathered so that rank 0 can report every rank's share. */
    double mem[6] = {(double)e.pn * 4,       (double)(e.gn + (e.gshard ? e.on : 0)) * 4,
                     (double)e.on * 8,       (double)e.peak_tmp * 4,
                     (double)act_floats * 4, (double)e.lay.total};
    double *all = calloc((size_t)c.size * 6, sizeof(double));
    if (!all) {
        fprintf(stderr, "loom-train: out of memory\n");
        return 1;
    }
    tc_check(loomAllGather(mem, all, 6, loomFloat64, c.world, NULL), &c, "loomAllGather");
    /* Rank 0 reports; its collective counters let a test check what each mode calls. */
    if (c.rank == 0) {
        double tps = timed ? (double)o.batch * o.model.ctx * timed / t_total : 0;
        if (!o.quiet)
            printf("loom-train: done: %lld steps, loss %.4f, val loss %.4f, %.0f tok/s, "
                   "comm %.1f%% of step time\n",
                   (long long)(o.steps - first_step), loss, val, tps,
                   t_total > 0 ? 100.0 * comm_total / t_total : 0.0);
        if (g.pp > 1 && !o.quiet)
            printf("loom-train: pipeline wait (bubble) %.1f%% of step time on rank 0; 1F1B's "
                   "ideal bubble is (pp-1)/(m+pp-1) = %.1f%%\n",
                   t_total > 0 ? 100.0 * wait_total / t_total : 0.0,
                   100.0 * (g.pp - 1) / (nmb + g.pp - 1));
        if (log) {
            fprintf(log,
                    "{\"summary\":1,\"ranks\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,\"cp\":%d,"
                    "\"zero\":%d,\"micro\":%d,\"schedule\":\"%s\",\"echo\":%d,\"steps\":%lld,"
                    "\"loss\":%s,\"val_loss\":%s,\"tok_s\":%.1f,\"comm_share\":%.4f,"
                    "\"pp_wait_share\":%.4f,\"global_params\":%zu,\"mem\":[",
                    c.size, g.dp, g.tp, g.pp, g.cp, o.zero, nmb, sched, o.tp_reduce == TP_ECHO,
                    (long long)(o.steps - first_step), jnum(b1, loss), jnum(b2, val), tps,
                    t_total > 0 ? comm_total / t_total : 0.0,
                    t_total > 0 ? wait_total / t_total : 0.0, e.lay.global_len);
            for (int r = 0; r < c.size; r++)
                fprintf(log, "%s[%.0f,%.0f,%.0f,%.0f,%.0f,%.0f]", r ? "," : "", all[6 * r],
                        all[6 * r + 1], all[6 * r + 2], all[6 * r + 3], all[6 * r + 4],
                        all[6 * r + 5]);
            fprintf(log, "],");
            json_counters(log, &c);
            fprintf(log, "}\n");
        }
    }
    free(all);
    int rc = 0;
    if (o.save && eng_save(&e, o.save, err, sizeof(err))) {
        fprintf(stderr, "loom-train: rank %d: %s\n", c.rank, err);
        rc = 1;
    }
    if (o.dump_params && eng_dump(&e, o.dump_params, 0))
        rc = 1;
    if (log)
        fclose(log);
    for (int i = 0; i < nmb; i++)
        mb_free(&mbs[i]);
    free(mbs);
    stage_free(&s);
    eng_free(&e);
    corpus_free(&corpus);
    tc_free(&c);
    return rc;
}

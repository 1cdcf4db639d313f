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
    fprintf(
        f,
        "usage: loomrun -n N loom-train [options]\n"
        "model:    --layers L (4) --d C (64) --heads H (4) --ctx T (64) --seed S (1)\n"
        "grid:     --dp D (world / (tp*pp*cp)) --tp T (1) --pp P (1) --cp C (1)\n"
        "          --sp S (Ulysses: the sequence split over S ranks as --cp does, attention\n"
        "          head-sharded between two all-to-alls instead of the ring; 1)\n"
        "          --zero 0|1|2|3 (0)   --tp-allreduce fp32|echo\n"
        "          --pp-schedule 1f1b|gpipe|zb-h1|zb-h2|dualpipe (1f1b; --schedule is the same\n"
        "          option; dualpipe: two copies of the stages, half of the micro-batches each "
        "way)\n"
        "          --grad-halves (1f1b, gpipe: each half of the micro-batches' gradients added\n"
        "          apart, as dualpipe's two copies add them)\n"
        "          --no-overlap (reduce gradients after the backward instead of during it)\n"
        "batch:    --batch B sequences per step (8) --micro M per rank (1) --steps N (50)\n"
        "optim:    --lr (3e-3) --warmup (10) --wd (0.1) --clip (1.0) --beta1 --beta2 --eps\n"
        "          --optim adamw|muon (adamw; muon: matrices by Muon, the rest by AdamW)\n"
        "          --shard none|zero1|owner|rows (adamw: none, or zero1 = --zero 1; muon: owner,\n"
        "          each matrix whole on one rank of the data group; rows: FSDP2's row shards;\n"
        "          none: DDP Muon) --muon-lr (0.02) --muon-momentum (0.95)\n"
        "data:     --data FILE (%s) --val-every N (0 = end only) --val-batches N (4)\n"
        "output:   --log-json FILE --save PREFIX --resume PREFIX --dump-params FILE --quiet\n"
        "          --save-every N (also --save after every N steps)\n"
        "elastic:  --elastic (when a rank dies, the survivors shrink the world, rebuild the grid\n"
        "          with a smaller dp and go on from memory (plain DP) or the last --save;\n"
        "          checkpoints become PREFIX.global, readable by any layout)\n"
        "          --elastic-kill-rank R --elastic-kill-step K (tests: rank R dies in step K)\n"
        "checks:   --dump-grads FILE, --dump-batch FILE: the reduced gradients and the global "
        "batch\n"
        "          (tokens, then targets) of the run's first step\n"
        "moe:      --moe E:k (a mixture of E experts, k per token, in place of the MLP)\n"
        "          --moe-every N (every N-th block; 1) --moe-aux COEF (load balancing; 0.01)\n"
        "          --ep N (experts over N ranks of the data group; 1) --moe-mode dedup|naive\n"
        "          --moe-place static|coselect[:N] (re-place experts by co-selection every N "
        "steps; 10)\n"
        "          --moe-trace PREFIX (the routing as LMTR traces, PREFIX.rankR.lmtr)\n"
        "          --moe-replay FILE (the training forwards' routing forced from a trace)\n"
        "diloco:   --diloco H (replicas train alone, an outer step every H steps) --outer-lr "
        "(0.7)\n"
        "          --outer-momentum (0.9) --diloco-echo (the deltas' all-reduce through Echo)\n"
        "          --diloco-sim R (R replicas one after the other in one process, for tests)\n",
        DEFAULT_CORPUS);
}

/* The options: each names its field and how to read it. */
enum optkind {
    OK_INT,
    OK_U64,
    OK_DBL,
    OK_STR,
    OK_OFF,
    OK_ON,
    OK_SCHED,
    OK_TPRED,
    OK_MOEMODE,
    OK_MOE,
    OK_PLACE,
    OK_OPTIM,
    OK_SHARD,
    OK_HELP
};
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
    OPT("sp", OK_INT, sp),
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
    OPT("pp-schedule", OK_SCHED, schedule),
    OPT("tp-allreduce", OK_TPRED, tp_reduce),
    OPT("moe", OK_MOE, model.moe_e),
    OPT("moe-every", OK_INT, model.moe_every),
    OPT("moe-aux", OK_DBL, moe_aux),
    OPT("moe-mode", OK_MOEMODE, moe_mode),
    OPT("ep", OK_INT, ep),
    OPT("moe-place", OK_PLACE, moe_place),
    OPT("moe-trace", OK_STR, moe_trace),
    OPT("moe-replay", OK_STR, moe_replay),
    OPT("optim", OK_OPTIM, optim),
    OPT("shard", OK_SHARD, shard),
    OPT("muon-lr", OK_DBL, muon_lr),
    OPT("muon-momentum", OK_DBL, muon_momentum),
    OPT("diloco", OK_INT, diloco),
    OPT("outer-lr", OK_DBL, outer_lr),
    OPT("outer-momentum", OK_DBL, outer_momentum),
    OPT("diloco-echo", OK_ON, diloco_echo),
    OPT("diloco-sim", OK_INT, diloco_sim),
    OPT("grad-halves", OK_ON, grad_halves),
    OPT("elastic", OK_ON, elastic),
    OPT("save-every", OK_INT, save_every),
    OPT("elastic-kill-rank", OK_INT, kill_rank),
    OPT("elastic-kill-step", OK_INT, kill_step),
    OPT("help", OK_HELP, quiet),
};
#define NOPTS (sizeof(optdefs) / sizeof(optdefs[0]))

#define TRAIN_SCHED_NAME(e, name) [e] = name,
const char *const schedule_names[SCHED_COUNT] = {TRAIN_SCHEDULES(TRAIN_SCHED_NAME)};
#undef TRAIN_SCHED_NAME

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
        for (int i = 0; i < SCHED_COUNT; i++)
            if (!strcmp(arg, schedule_names[i])) {
                *(int *)field = i;
                return 0;
            }
        return -1;
    case OK_TPRED:
    case OK_MOEMODE:
    case OK_OPTIM: {
        static const char *names[][2] = {[OK_TPRED] = {"fp32", "echo"},
                                         [OK_MOEMODE] = {"dedup", "naive"},
                                         [OK_OPTIM] = {"adamw", "muon"}};
        const char *a = names[d->kind][0], *b = names[d->kind][1];
        if (strcmp(arg, a) && strcmp(arg, b))
            return -1;
        /* TP_FP32, loomMoeModeDedup, OPTIM_ADAMW = 0; TP_ECHO, loomMoeModeNaive,
         * OPTIM_MUON = 1 */
        *(int *)field = strcmp(arg, a) ? 1 : 0;
        return 0;
    }
    case OK_MOE: {
        /* E:k, stored in model.moe_e and model.moe_k */
        long e = strtol(arg, &end, 10), k = *end == ':' ? strtol(end + 1, &end, 10) : 0;
        if (!*arg || *end || e < 1 || e > 32767 || k < 1 || k > e || k > 64)
            return -1;
        ((model_cfg_t *)(field - offsetof(model_cfg_t, moe_e)))->moe_e = (int)e;
        ((model_cfg_t *)(field - offsetof(model_cfg_t, moe_e)))->moe_k = (int)k;
        return 0;
    }
    case OK_PLACE: {
        /* static, coselect (every 10 steps) or coselect:N */
        long every = 10;
        if (!strcmp(arg, "static"))
            every = 0;
        else if (!strncmp(arg, "coselect:", 9))
            every = strtol(arg + 9, &end, 10);
        else if (strcmp(arg, "coselect"))
            return -1;
        if (every < 0 || every > (1 << 30) || (end && *end) || (end && end == arg + 9))
            return -1;
        *(int *)field = (int)every;
        return 0;
    }
    case OK_SHARD: {
        static const char *names[] = {"none", "zero1", "owner", "rows"}; /* enum shard_mode */
        for (int i = 0; i < 4; i++)
            if (!strcmp(arg, names[i])) {
                *(int *)field = i;
                return 0;
            }
        return -1;
    }
    case OK_HELP:
        usage(stdout);
        exit(0);
    }
    return -1;
}

/* --optim and --shard: resolves the shard mode (ZeRO-1 is --shard zero1 for AdamW; owner is
 * Muon's default) and refuses the combinations that are not built; 0 or -1 with a message. */
static int check_optim(opts_t *o)
{
    const char *bad = NULL;
    if (o->optim == OPTIM_ADAMW) {
        if (o->shard == SHARD_OWNER || o->shard == SHARD_ROWS)
            bad = "--shard owner and rows place matrices for Muon: they need --optim muon";
        else if (o->shard == SHARD_ZERO1 && o->zero != 0 && o->zero != 1)
            bad = "--shard zero1 contradicts --zero";
        else if (o->shard == SHARD_ZERO1)
            o->zero = 1;
        o->shard = o->zero == 1 ? SHARD_ZERO1 : SHARD_NONE;
        if (o->muon_lr != 0.02 || o->muon_momentum != 0.95)
            bad = bad ? bad : "--muon-lr and --muon-momentum need --optim muon";
    } else {
        if (o->shard == SHARD_UNSET)
            o->shard = SHARD_OWNER;
        if (o->shard == SHARD_ZERO1 || o->zero > 0)
            bad = "--optim muon shards with --shard owner or rows, not with ZeRO (--zero, --shard "
                  "zero1 shard AdamW's state)";
        else if (o->tp > 1)
            bad = "--optim muon with --tp is not supported yet (Newton-Schulz needs each matrix "
                  "whole, and the gather within the TP group is not built)";
        else if (o->ep > 1 || o->moe_place)
            bad = "--optim muon with --ep > 1 or --moe-place is not supported (experts' gradients "
                  "are reduced over their replicas, not over the data group the plan spans)";
        else if (o->muon_momentum >= 1)
            bad = "--muon-momentum must be < 1";
    }
    if (bad)
        fprintf(stderr, "loom-train: %s\n", bad);
    return bad ? -1 : 0;
}

/* --sp: Ulysses takes the grid's cp dimension for its sequence split (the same zigzag chunks, the
 * same data group), so it sets cp; refuses what it cannot run. 0 or -1 with a message. */
static int check_sp(opts_t *o)
{
    const char *bad = NULL;
    char buf[256];
    int hl = o->tp > 0 ? o->model.heads / o->tp : 0;
    if (o->sp < 1)
        bad = "--sp must be >= 1";
    else if (o->sp == 1)
        return 0;
    else if (o->cp > 1)
        bad = "--sp with --cp > 1 is not supported (both split the sequence over the grid's cp "
              "dimension: Ulysses between all-to-alls, CP around a ring; choose one)";
    else if (o->model.moe_e > 0)
        bad = "--sp with --moe is not supported (the load-balancing loss is taken over the whole "
              "sequences of a micro-batch, as with --cp)";
    else if (o->model.heads % o->tp == 0 && hl % o->sp) {
        snprintf(buf, sizeof(buf),
                 "--sp %d must divide the heads per tensor-parallel rank (--heads %d / --tp %d = "
                 "%d): Ulysses gives each rank of the sequence split whole heads",
                 o->sp, o->model.heads, o->tp, hl);
        bad = buf;
    } else if (o->model.ctx % (2 * o->sp)) {
        snprintf(buf, sizeof(buf),
                 "--ctx %d must be a multiple of 2 * --sp (%d): each rank keeps two zigzag "
                 "chunks of every sequence",
                 o->model.ctx, 2 * o->sp);
        bad = buf;
    }
    if (bad) {
        fprintf(stderr, "loom-train: %s\n", bad);
        return -1;
    }
    o->cp = o->sp;
    return 0;
}

/* --pp-schedule zb-h1|zb-h2: the split backward keeps whole weight-gradient buffers until the
 * deferred W's have run, which ZeRO-2/3 free after each backward; 0 or -1 with a message. */
static int check_zb(const opts_t *o)
{
    if (o->schedule != SCHED_ZB_H1 && o->schedule != SCHED_ZB_H2)
        return 0;
    if (o->zero >= 2) {
        fprintf(stderr,
                "loom-train: --pp-schedule %s with --zero %d is not supported (the "
                "deferred weight gradients need the whole gradient buffer of each unit "
                "until the last W; ZeRO-2/3 keep only a shard)\n",
                schedule_names[o->schedule], o->zero);
        return -1;
    }
    return 0;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.model = {.vocab = 256, .ctx = 64, .d = 64, .heads = 4, .layers = 4, .seed = 1},
                  .dp = 0,
                  .tp = 1,
                  .pp = 1,
                  .cp = 1,
                  .sp = 1,
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
                  .val_batches = 4,
                  .ep = 1,
                  .moe_aux = 0.01,
                  .moe_mode = loomMoeModeDedup,
                  .optim = OPTIM_ADAMW,
                  .shard = SHARD_UNSET,
                  .muon_lr = 0.02,
                  .muon_momentum = 0.95,
                  .outer_lr = 0.7,
                  .outer_momentum = 0.9};
    o->model.moe_every = 1;
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
    if (check_sp(o))
        return -1;
    if (o->ep < 1 || o->model.moe_every < 1 ||
        ((o->ep > 1 || o->moe_trace || o->moe_replay) && !o->model.moe_e)) {
        fprintf(stderr, "loom-train: --ep and --moe-every must be >= 1; --ep > 1, --moe-trace and "
                        "--moe-replay need --moe\n");
        return -1;
    }
    if (o->model.moe_e > 0 && (o->tp > 1 || o->cp > 1)) {
        fprintf(stderr, "loom-train: --moe with --tp or --cp is not supported (experts are not "
                        "split by tensor parallelism, and the load-balancing loss is taken over "
                        "the whole sequences of a micro-batch)\n");
        return -1;
    }
    if (o->ep > 1 && (o->pp > 1 || o->zero > 0)) {
        fprintf(stderr, "loom-train: --ep > 1 with --pp or --zero is not supported (expert "
                        "parallelism spans the data group of the whole model, and the experts' "
                        "gradients are reduced over their replicas only)\n");
        return -1;
    }
    if (o->ep > o->model.moe_e && o->model.moe_e > 0) {
        fprintf(stderr, "loom-train: --ep %d is larger than the %d experts\n", o->ep,
                o->model.moe_e);
        return -1;
    }
    if (o->moe_place && (o->model.moe_e == 0 || o->pp > 1 || o->save || o->resume)) {
        fprintf(stderr, "loom-train: --moe-place coselect needs --moe, and is not supported with "
                        "--pp, --save or --resume (a checkpoint does not hold the placement)\n");
        return -1;
    }
    if (check_optim(o) || check_zb(o) || diloco_check(o) || dualpipe_check(o) || elastic_check(o))
        return -1;
    if (o->zero > 0 && o->pp > 1) {
        fprintf(stderr, "loom-train: --zero with --pp > 1 is not supported (as in DeepSpeed, "
                        "ZeRO shards over the data group of a single stage)\n");
        return -1;
    }
    return 0;
}

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
    if (parse(argc, argv, &r->o))
        return 2;
    if ((rc = setup_comm(r)) || (rc = setup_model(r)) || (rc = resume(r)) || (rc = open_outputs(r)))
        return rc;
    train(r);
    if ((rc = report_summary(r)))
        return rc;
    return finish(r);
}

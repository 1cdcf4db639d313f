/* SPDX-License-Identifier: Apache-2.0
 *
 * options.c - loom-train's command line: the option table, its parser, and the checks that
 * refuse combinations a mode does not support, each with the reason.
 */
#include "train.h"

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

int opts_parse(int argc, char **argv, opts_t *o)
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

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf.c - MoE dispatch and combine (include/loom_moe.h) measured per step: layout, dispatch
 * and combine times, remote rows, local hit rate, wire bytes and the busiest rank's rows, for
 * four modes run in one process on the same routing: naive (one row per (token, expert),
 * contiguous placement: the baseline of every ratio), dedup (one row per (token, rank),
 * contiguous), dedup+place (dedup under a placement learned on the first half of the routing
 * batches, all modes being measured on the second half) and dedup+place+reorder (dedup+place
 * with the tokens re-ordered toward their experts' ranks, predicted from the layer before by
 * an affinity learned on the first half). Beside each measured time it prints
 * the cost model's prediction of the step's exchanges (moe_exchange.c) and, for generated
 * routing, a projection of each mode to 16-64 ranks from its measured time per row; with
 * --exchange it writes naive mode's bytes per pair of ranks for the MPI_Alltoallv replay
 * (bench/peers/mpi_alltoallv_bench.c). Routing comes from the generators of src/moe/moe_gen.h
 * or an LMTR v1 trace (src/moe/moe_trace.h), so this program links the library's modules
 * statically, as the MoE tests do. docs/moe.md, "Benchmark", explains the columns.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "loom.h"
#include "loom_moe.h"
#include "moe_exchange.h"
#include "moe_gen.h"
#include "moe_trace.h"
#include "options.h"

enum { GEN_UNIFORM, GEN_PLANTED, GEN_TEXT, GEN_SKEW };
enum { PLACE_CONTIGUOUS, PLACE_RANDOM, PLACE_COSELECT };
enum { MODE_NAIVE, MODE_DEDUP, MODE_PLACE, MODE_REORDER, NUM_MODES };
static const char *const k_gen_names[] = {"uniform", "planted", "text", "skew"};
static const char *const k_place_names[] = {"contiguous", "random", "coselect"};
static const char *const k_mode_names[] = {"naive", "dedup", "dedup+place", "dedup+place+reorder"};

#define MAX_LIST 16
/* Rank counts the projection predicts (project()). */
static const int k_proj_ranks[] = {16, 32, 64};
#define NUM_PROJ 3

typedef struct opts {
    int num_experts;
    int top_k[MAX_LIST], n_top_k;
    size_t hidden[MAX_LIST];
    int n_hidden;
    size_t tokens; /* per rank and batch */
    loomDataType_t dtype;
    int warmup, iters, check, batches;
    int gen, placement;
    unsigned modes;     /* 1 << MODE_* */
    int modes_explicit; /* --modes named them: a mode the routing cannot run is an error */
    double rho, rho_layer, zipf, mask, hot_ratio;
    int groups; /* hidden groups; 0: one per rank */
    uint64_t seed;
    const char *trace, *text, *json;
    const char *exchange; /* naive mode's exchanges, for the MPI replay */
} opts_t;

/* This rank's routing: batch b holds ntok[b] tokens at topk + off[b] * k. */
typedef struct routing {
    int num_experts, top_k, nbatches;
    int32_t *topk;
    size_t *off, *ntok, max_tok;
    char label[64];
} routing_t;

/* Every rank's tokens of each batch in natural order, for re-ordering: the measured layer's
 * routing (cur) and the layer before's (prev), batch b's ntok[b] tokens at off[b] * k of each;
 * prev owns both arrays. Rank g's own tokens of a batch are its share of them (share()). */
typedef struct layers {
    int nbatches;
    int32_t *prev, *cur;
    size_t *off, *ntok;
} layers_t;

typedef struct result {
    int k;
    size_t hidden;
    int mode;
    double rows, saved, hit, bytes, layout_us, dispatch_us, combine_us, total_us, maxrank;
    double xfer_us;             /* median of dispatch + combine */
    double reorder_us;          /* re-ordering: prediction, its AllGather, the permutation */
    double gather_us;           /* of which the prediction's AllGather */
    double model_bytes;         /* bytes from the row counts and the wire format */
    double pred_us[2];          /* the cost model's dispatch and combine, mean over steps */
    double a2av_us[3];          /* naive's bytes through loomAllToAllv: d, c and d + c */
    double proj_rows[NUM_PROJ]; /* the busiest rank's rows at k_proj_ranks ranks */
    long long wrong;
} result_t;

static int g_rank, g_nranks;
static loomComm_t g_comm;

#define CHECK(_call)                                                                               \
    do {                                                                                           \
        loomResult_t res_ = (_call);                                                               \
        if (res_ != loomSuccess) {                                                                 \
            fprintf(stderr, "moe_perf: rank %d: %s failed: %s / %s\n", g_rank, #_call,             \
                    loomGetErrorString(res_), loomGetLastError(g_comm));                           \
            if (g_comm)                                                                            \
                loomCommAbort(g_comm);                                                             \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        bench_die("lower -t, -d or --batches", "cannot allocate %zu x %zu bytes", n, size);
    return p;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// ---- Flags -------------------------------------------------------------------

static void usage(void)
{
    printf("Usage: moe_perf [flags]   (several ranks: loomrun -n N moe_perf ...)\n"
           "  -E experts (64)            -k top-k, a comma list (6)\n"
           "  -d hidden elements, a comma list (1024)\n"
           "  -t tokens per rank and batch (2048)   -y float|bfloat16|half (bfloat16)\n"
           "  -w warm-up steps (2)       -n timed steps, median reported (10)\n"
           "  -c 1: check combine's output against a local reference (#wrong)\n"
           "  -J FILE: JSON results\n"
           "  --gen uniform|planted|text|skew (planted), with --rho P (0.8),\n"
           "        --rho-layer P (planted, skew: 0.8; P(a token keeps its group from the\n"
           "        layer before to the measured one)),\n"
           "        --groups G (hidden groups; default one per rank), --zipf A (0),\n"
           "        --mask P (0), --hot-ratio R (skew: 1.5), --seed S (1),\n"
           "        --text FILE (text: the bytes tokens stand for, cycled); skew makes rank\n"
           "        0's experts hot-ratio times as popular (hot-ratio < ranks)\n"
           "  --trace FILE: an LMTR v1 trace instead (docs/moe-trace.md); each batch is split\n"
           "        evenly over the ranks, -E, -k and -t come from it; with two consecutive\n"
           "        layers of one step, the second layer's batches are measured\n"
           "  --batches B: routing batches (8): placement learns on the first half, every\n"
           "        mode is measured on the second\n"
           "  --placement contiguous|random|coselect: dedup+place's placement (coselect)\n"
           "  --modes a comma list of naive,dedup,dedup+place,dedup+place+reorder (all;\n"
           "        re-ordering needs the layer before the measured one)\n"
           "  --exchange FILE: naive mode's bytes between each pair of ranks per step, for\n"
           "        bench/peers/mpi_alltoallv_bench.c (MPI_Alltoallv on the same rows)\n"
           "Not built: --import of other formats.\n");
}

static double parse_num(const char *flag, const char *v, double lo, double hi)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi))
        bench_die(NULL, "%s wants a number in [%g, %g], not '%s'", flag, lo, hi, v);
    return x;
}

static int parse_name(const char *flag, const char *v, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    bench_die(NULL, "%s: unknown value '%s' (see -h)", flag, v);
}

/* A comma list of numbers into out[MAX_LIST]; returns how many. */
static int parse_list(const char *flag, const char *v, double lo, double hi, double *out)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_LIST)
            bench_die(NULL, "%s: at most %d values", flag, MAX_LIST);
        out[n++] = parse_num(flag, tok, lo, hi);
    }
    if (n == 0)
        bench_die(NULL, "%s wants at least one value", flag);
    return n;
}

static void parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.num_experts = 64,
                  .top_k = {6},
                  .n_top_k = 1,
                  .hidden = {1024},
                  .n_hidden = 1,
                  .tokens = 2048,
                  .dtype = loomBfloat16,
                  .warmup = 2,
                  .iters = 10,
                  .batches = 8,
                  .gen = GEN_PLANTED,
                  .placement = PLACE_COSELECT,
                  .modes = (1u << NUM_MODES) - 1,
                  .rho = 0.8,
                  .rho_layer = 0.8,
                  .hot_ratio = 1.5,
                  .seed = 1};
    static const struct option longs[] = {
        {"gen", required_argument, 0, 1},        {"rho", required_argument, 0, 2},
        {"groups", required_argument, 0, 3},     {"zipf", required_argument, 0, 4},
        {"mask", required_argument, 0, 5},       {"hot-ratio", required_argument, 0, 6},
        {"seed", required_argument, 0, 7},       {"text", required_argument, 0, 8},
        {"trace", required_argument, 0, 9},      {"batches", required_argument, 0, 10},
        {"placement", required_argument, 0, 11}, {"modes", required_argument, 0, 12},
        {"exchange", required_argument, 0, 13},  {"rho-layer", required_argument, 0, 14},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    static const char *const dtypes[] = {"float", "bfloat16", "half"};
    static const loomDataType_t dtype_ids[] = {loomFloat32, loomBfloat16, loomFloat16};
    double list[MAX_LIST];
    int c;
    while ((c = getopt_long(argc, argv, "E:k:d:t:y:w:n:c:J:h", longs, NULL)) != -1) {
        switch (c) {
        case 'E':
            o->num_experts = (int)parse_num("-E", optarg, 1, 32767);
            break;
        case 'k':
            o->n_top_k = parse_list("-k", optarg, 1, 64, list);
            for (int i = 0; i < o->n_top_k; i++)
                o->top_k[i] = (int)list[i];
            break;
        case 'd':
            o->n_hidden = parse_list("-d", optarg, 1, 1 << 24, list);
            for (int i = 0; i < o->n_hidden; i++)
                o->hidden[i] = (size_t)list[i];
            break;
        case 't':
            o->tokens = (size_t)parse_num("-t", optarg, 0, 1 << 24);
            break;
        case 'y':
            o->dtype = dtype_ids[parse_name("-y", optarg, dtypes, 3)];
            break;
        case 'w':
            o->warmup = (int)parse_num("-w", optarg, 0, 1e6);
            break;
        case 'n':
            o->iters = (int)parse_num("-n", optarg, 1, 1e6);
            break;
        case 'c':
            o->check = (int)parse_num("-c", optarg, 0, 1);
            break;
        case 'J':
            o->json = optarg;
            break;
        case 1:
            o->gen = parse_name("--gen", optarg, k_gen_names, 4);
            break;
        case 2:
            o->rho = parse_num("--rho", optarg, 0, 1);
            break;
        case 3:
            o->groups = (int)parse_num("--groups", optarg, 1, 32767);
            break;
        case 4:
            o->zipf = parse_num("--zipf", optarg, 0, 8);
            break;
        case 5:
            o->mask = parse_num("--mask", optarg, 0, 1);
            break;
        case 6:
            o->hot_ratio = parse_num("--hot-ratio", optarg, 1, 1e6);
            break;
        case 7:
            o->seed = (uint64_t)parse_num("--seed", optarg, 0, 9e15);
            break;
        case 8:
            o->text = optarg;
            break;
        case 9:
            o->trace = optarg;
            break;
        case 10:
            o->batches = (int)parse_num("--batches", optarg, 2, 1 << 20);
            break;
        case 11:
            o->placement = parse_name("--placement", optarg, k_place_names, 3);
            break;
        case 12: {
            char buf[128];
            snprintf(buf, sizeof(buf), "%s", optarg);
            o->modes = 0;
            o->modes_explicit = 1;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save))
                o->modes |= 1u << parse_name("--modes", tok, k_mode_names, NUM_MODES);
            break;
        }
        case 13:
            o->exchange = optarg;
            break;
        case 14:
            o->rho_layer = parse_num("--rho-layer", optarg, 0, 1);
            break;
        case 'h':
            usage();
            exit(EXIT_SUCCESS);
        default:
            bench_die("moe_perf -h lists the flags", "bad flag");
        }
    }
    if (optind < argc)
        bench_die("moe_perf -h lists the flags", "unexpected argument '%s'", argv[optind]);
    if (o->gen == GEN_TEXT && o->text == NULL && o->trace == NULL)
        bench_die("for example --text README.md", "--gen text needs --text FILE");
    if (o->modes == 0)
        bench_die(NULL, "--modes names no mode");
}

// ---- Routing -------------------------------------------------------------------

static void routing_alloc(routing_t *r, int nbatches, size_t total_tokens)
{
    r->nbatches = nbatches;
    r->off = xcalloc((size_t)nbatches, sizeof(size_t));
    r->ntok = xcalloc((size_t)nbatches, sizeof(size_t));
    r->topk = xcalloc(total_tokens * (size_t)r->top_k, sizeof(int32_t));
}

static void layers_alloc(layers_t *ly, int nbatches, size_t total_tokens, int k)
{
    ly->nbatches = nbatches;
    ly->off = xcalloc((size_t)nbatches, sizeof(size_t));
    ly->ntok = xcalloc((size_t)nbatches, sizeof(size_t));
    ly->prev = xcalloc(2 * total_tokens * (size_t)k, sizeof(int32_t));
    ly->cur = ly->prev + total_tokens * (size_t)k;
}

static void layers_free(layers_t *ly)
{
    free(ly->prev);
    free(ly->off);
    free(ly->ntok);
    memset(ly, 0, sizeof(*ly));
}

/* Pairs of a trace's batches for re-ordering: the j-th batch of layer lmin + 1 at a step (lmin
 * the least layer in the file) and the j-th of layer lmin at that step (micro-batches keep
 * their order), when they hold as many tokens; their indices go to cur_i[] and prev_i[] in file
 * order. Returns how many. */
static size_t trace_pairs(const loom_moe_trace_t *t, size_t *cur_i, size_t *prev_i)
{
    uint32_t lmin = UINT32_MAX;
    for (size_t b = 0; b < t->num_batches; b++)
        lmin = t->batches[b].layer < lmin ? t->batches[b].layer : lmin;
    size_t n = 0;
    for (size_t b = 0; b < t->num_batches; b++) {
        const loom_moe_trace_batch_t *c = &t->batches[b];
        if (c->layer != lmin + 1)
            continue;
        size_t j = 0; /* c is the j-th batch of its step and layer */
        for (size_t a = 0; a < b; a++)
            j += t->batches[a].layer == c->layer && t->batches[a].step == c->step;
        for (size_t a = 0; a < t->num_batches; a++) {
            const loom_moe_trace_batch_t *p = &t->batches[a];
            if (p->layer != lmin || p->step != c->step || j-- > 0)
                continue;
            if (p->num_tokens == c->num_tokens) {
                cur_i[n] = b;
                prev_i[n++] = a;
            }
            break;
        }
    }
    return n;
}

/* Each batch of the trace split evenly over the ranks, in file order. With re-ordering among
 * the modes, only the batches of trace_pairs() are measured (by every mode), and ly receives
 * them whole with the batches of the layer before; a trace without two such pairs drops the
 * mode, or refuses it when --modes named it. */
static void routing_from_trace(opts_t *o, routing_t *r, layers_t *ly)
{
    loom_moe_trace_t *t = NULL;
    if (loom_moe_trace_read(o->trace, &t) != loomSuccess)
        bench_die("check the path; docs/moe-trace.md gives the format", "cannot read trace %s: %s",
                  o->trace, loomGetLastError(NULL));
    if (t->num_batches < 2)
        bench_die(NULL, "trace %s has %zu batches; placement needs at least 2", o->trace,
                  t->num_batches);
    size_t nb = t->num_batches, *cur_i = xcalloc(nb, sizeof(size_t)),
           *prev_i = xcalloc(nb, sizeof(size_t));
    size_t npairs = (o->modes & (1u << MODE_REORDER)) ? trace_pairs(t, cur_i, prev_i) : 0;
    if ((o->modes & (1u << MODE_REORDER)) && npairs < 2) {
        if (o->modes_explicit)
            bench_die("record the routing of two consecutive layers (docs/moe-trace.md), or "
                      "leave dedup+place+reorder out of --modes",
                      "trace %s: dedup+place+reorder predicts the measured layer from the layer "
                      "before, but the trace holds %zu batch(es) of two consecutive layers at "
                      "one step with equal token counts, not at least 2",
                      o->trace, npairs);
        if (g_rank == 0)
            printf("# dedup+place+reorder left out: trace %s has no two consecutive layers at "
                   "one step to predict the measured layer from\n",
                   o->trace);
        o->modes &= ~(1u << MODE_REORDER);
    }
    if (npairs >= 2) {
        nb = npairs;
    } else {
        for (size_t b = 0; b < nb; b++)
            cur_i[b] = b;
    }
    r->num_experts = (int)t->header.num_experts;
    r->top_k = (int)t->header.top_k;
    size_t k = (size_t)r->top_k, total = 0, whole = 0;
    for (size_t b = 0; b < nb; b++) {
        total += t->batches[cur_i[b]].num_tokens / (size_t)g_nranks + 1;
        whole += t->batches[cur_i[b]].num_tokens;
    }
    routing_alloc(r, (int)nb, total);
    if (npairs >= 2)
        layers_alloc(ly, (int)nb, whole, r->top_k);
    size_t pos = 0, at = 0;
    for (size_t b = 0; b < nb; b++) {
        const loom_moe_trace_batch_t *c = &t->batches[cur_i[b]];
        size_t n = c->num_tokens, lo = n * (size_t)g_rank / (size_t)g_nranks;
        size_t hi = n * (size_t)(g_rank + 1) / (size_t)g_nranks;
        r->off[b] = pos;
        r->ntok[b] = hi - lo;
        memcpy(r->topk + pos * k, c->topk + lo * k, (hi - lo) * k * sizeof(int32_t));
        pos += hi - lo;
        if (hi - lo > r->max_tok)
            r->max_tok = hi - lo;
        if (npairs >= 2) {
            ly->off[b] = at;
            ly->ntok[b] = n;
            memcpy(ly->cur + at * k, c->topk, n * k * sizeof(int32_t));
            memcpy(ly->prev + at * k, t->batches[prev_i[b]].topk, n * k * sizeof(int32_t));
            at += n;
        }
    }
    const char *base = strrchr(o->trace, '/');
    snprintf(r->label, sizeof(r->label), "%s", base ? base + 1 : o->trace);
    free(cur_i);
    free(prev_i);
    loom_moe_trace_free(t);
}

/* Two generated layers of batches x nranks x T tokens, (layer, token, k): the measured one is
 * the second, so that re-ordering can predict it from the first. The generator's knobs are
 * those of this run's G ranks whatever nranks is (hidden groups, skew's hot experts), so that a
 * projection to other rank counts (project_rows()) routes as the measured run does. */
static int32_t *generate_topk(const opts_t *o, int top_k, int nranks)
{
    size_t all = o->tokens * (size_t)nranks * (size_t)o->batches;
    int32_t *topk = xcalloc(2 * all * (size_t)top_k, sizeof(int32_t));
    loom_moe_gen_t g = {.num_experts = (uint32_t)o->num_experts,
                        .top_k = (uint32_t)top_k,
                        .num_groups = (uint32_t)(o->groups ? o->groups : g_nranks),
                        .rho = o->gen == GEN_UNIFORM ? 0.0 : o->rho,
                        .zipf_alpha = o->zipf,
                        .rho_layer = o->rho_layer,
                        .mask = o->mask,
                        .seed = o->seed};
    if (g.num_groups > g.num_experts)
        g.num_groups = g.num_experts;
    if (o->gen == GEN_SKEW && g_nranks > 1) {
        g.hot_experts = (uint32_t)(o->num_experts / g_nranks);
        g.hot_ratio = o->hot_ratio;
    }
    loomResult_t res;
    if (o->gen == GEN_UNIFORM && o->mask == 0.0) {
        /* Independent layers: the prediction carries nothing (the control). */
        res = loom_moe_gen_uniform(g.num_experts, g.top_k, 2 * all, o->seed, topk, NULL);
    } else if (o->gen == GEN_TEXT) {
        FILE *f = fopen(o->text, "rb");
        uint8_t *text = xcalloc(all, 1);
        size_t got = f ? fread(text, 1, all, f) : 0;
        if (f)
            fclose(f);
        if (got == 0)
            bench_die(NULL, "cannot read any byte of --text %s", o->text);
        for (size_t i = got; i < all; i++)
            text[i] = text[i % got];
        res = loom_moe_gen_text(&g, text, all, 2, topk, NULL, NULL, NULL);
        free(text);
    } else {
        res = loom_moe_gen_planted(&g, all, 2, topk, NULL, NULL);
    }
    if (res != loomSuccess)
        bench_die("see the generator knobs in moe_perf -h",
                  "the routing generator refused E=%d k=%d "
                  "groups=%u: %s",
                  o->num_experts, top_k, g.num_groups, loomGetLastError(NULL));
    return topk;
}

/* The second of two generated layers, the same on every rank; rank g of batch b takes tokens
 * (b * G + g) * T onwards, so that the hidden structure is shared by all. With re-ordering
 * among the modes, ly receives both layers whole. */
static void routing_generate(const opts_t *o, int top_k, routing_t *r, layers_t *ly)
{
    r->num_experts = o->num_experts;
    r->top_k = top_k;
    size_t per = o->tokens, G = (size_t)g_nranks, k = (size_t)top_k;
    size_t all = per * G * (size_t)o->batches;
    int32_t *topk = generate_topk(o, top_k, g_nranks);
    const int32_t *cur = topk + all * k;
    routing_alloc(r, o->batches, per * (size_t)o->batches);
    for (int b = 0; b < o->batches; b++) {
        r->off[b] = (size_t)b * per;
        r->ntok[b] = per;
        memcpy(r->topk + r->off[b] * k, cur + ((size_t)b * G + (size_t)g_rank) * per * k,
               per * k * sizeof(int32_t));
    }
    r->max_tok = per;
    if (o->modes & (1u << MODE_REORDER)) {
        layers_alloc(ly, o->batches, all, top_k);
        for (int b = 0; b < o->batches; b++) {
            ly->off[b] = (size_t)b * per * G;
            ly->ntok[b] = per * G;
        }
        memcpy(ly->prev, topk, 2 * all * k * sizeof(int32_t));
    }
    free(topk);
    if (o->gen == GEN_UNIFORM || o->gen == GEN_TEXT)
        snprintf(r->label, sizeof(r->label), "%s", k_gen_names[o->gen]);
    else
        snprintf(r->label, sizeof(r->label), "%s%g", k_gen_names[o->gen], o->rho);
}

static void routing_free(routing_t *r)
{
    free(r->topk);
    free(r->off);
    free(r->ntok);
}

// ---- Placements ------------------------------------------------------------------

/* Rank r holds the next floor(E/G) experts, plus one for r < E mod G (loom_moe.h's shares). */
static void place_contiguous(int E, int G, int32_t *expert_rank)
{
    int e = 0;
    for (int r = 0; r < G; r++)
        for (int i = 0; i < E / G + (r < E % G); i++)
            expert_rank[e++] = r;
}

/* The contiguous shares, shuffled by a seed every rank shares. */
static void place_random(int E, int G, uint64_t seed, int32_t *expert_rank)
{
    place_contiguous(E, G, expert_rank);
    uint64_t s = seed ^ 0x5eedULL;
    for (int i = E - 1; i > 0; i--) {
        int j = (int)(splitmix64(&s) % (uint64_t)(i + 1));
        int32_t t = expert_rank[i];
        expert_rank[i] = expert_rank[j];
        expert_rank[j] = t;
    }
}

/* The placement of E experts on G ranks from co-selection counts cos[E * E] and loads
 * cos[E * E ..]. */
static void place_counts(const uint64_t *cos, int E, int G, int32_t *expert_rank)
{
    loomMoePlacementConfig_t cfg = LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER;
    cfg.nranks = G;
    CHECK(loomMoePlacementCompute(cos, cos + (size_t)E * (size_t)E, E, &cfg, expert_rank, NULL));
}

/* Co-selection counts of every rank's first half of the batches, summed, then placed. */
static void place_coselect(const routing_t *r, int32_t *expert_rank)
{
    size_t E = (size_t)r->num_experts;
    uint64_t *cos = xcalloc(E * E + E, sizeof(uint64_t));
    for (int b = 0; b < r->nbatches / 2; b++)
        CHECK(loomMoeCoselectAccumulate(r->topk + r->off[b] * (size_t)r->top_k, r->ntok[b],
                                        r->top_k, r->num_experts, cos, cos + E * E));
    CHECK(loomAllReduce(cos, cos, E * E + E, loomUint64, loomSum, g_comm, NULL));
    place_counts(cos, r->num_experts, g_nranks, expert_rank);
    free(cos);
}

// ---- Metrics of the routing ----------------------------------------------------------

/* Rows one rank at home `home` sends each of G ranks for T tokens (itself included): dedup[G]
 * one per (token, rank), naive[G] one per (token, expert); tot[4] += pairs, pairs_local, R0
 * and R1 (remote rows of naive and dedup). */
static void rows_of(const int32_t *topk, size_t T, int k, int E, const int32_t *expert_rank, int G,
                    int home, uint64_t *dedup, uint64_t *naive, uint64_t *tot)
{
    int32_t *homes = xcalloc(T, sizeof(int32_t));
    for (size_t t = 0; t < T; t++)
        homes[t] = home;
    loom_moe_rows_t rows;
    if (loom_moe_rows_count(topk, T, (uint32_t)k, (uint32_t)E, expert_rank, (uint32_t)G, homes,
                            dedup, &rows) != loomSuccess)
        bench_die(NULL, "the routing holds an expert id out of range");
    dedup[home] = rows.rows - rows.rows_remote;
    memset(naive, 0, (size_t)G * sizeof(uint64_t));
    for (size_t i = 0; i < T * (size_t)k; i++)
        if (topk[i] >= 0)
            naive[expert_rank[topk[i]]]++;
    tot[0] += rows.pairs;
    tot[1] += rows.pairs_local;
    tot[2] += rows.rows_naive_remote;
    tot[3] += rows.rows_remote;
    free(homes);
}

/* The most remote rows one rank receives in a step whose rows rank s sends rank d are
 * m[s * G + d]. */
static uint64_t max_received(const uint64_t *m, int G)
{
    uint64_t most = 0;
    for (int d = 0; d < G; d++) {
        uint64_t n = 0;
        for (int s = 0; s < G; s++)
            n += s == d ? 0 : m[(size_t)s * (size_t)G + (size_t)d];
        most = n > most ? n : most;
    }
    return most;
}

typedef struct counts {
    double rows_naive, rows_dedup, hit; /* per step, over all ranks */
    double max_naive, max_dedup;        /* per step, the most remote rows one rank receives */
    /* [nb][G][G]: rows rank s sends rank d in evaluation batch b, itself included */
    uint64_t *naive, *dedup;
} counts_t;

static void counts_free(counts_t *c)
{
    free(c->naive);
    free(c->dedup);
}

/* Row counts of the evaluation batches under a placement, every token at home on its rank. */
static counts_t count_rows(const routing_t *r, const int32_t *expert_rank)
{
    int first = r->nbatches / 2, nb = r->nbatches - first;
    size_t G = (size_t)g_nranks, GG = G * G, k = (size_t)r->top_k;
    /* per batch: dedup then naive rows to each rank, gathered from every rank */
    size_t n = (size_t)nb * 2 * G;
    uint64_t *mine = xcalloc(n, sizeof(uint64_t)), *all = xcalloc(n * G, sizeof(uint64_t));
    uint64_t tot[4] = {0};
    for (int b = 0; b < nb; b++) {
        int bb = first + b;
        uint64_t *dedup = mine + (size_t)b * 2 * G;
        rows_of(r->topk + r->off[bb] * k, r->ntok[bb], (int)k, r->num_experts, expert_rank,
                g_nranks, g_rank, dedup, dedup + G, tot);
    }
    CHECK(loomAllGather(mine, all, n, loomUint64, g_comm, NULL));
    CHECK(loomAllReduce(tot, tot, 4, loomUint64, loomSum, g_comm, NULL));
    counts_t c = {.rows_naive = (double)tot[2] / nb,
                  .rows_dedup = (double)tot[3] / nb,
                  .hit = tot[0] ? 100.0 * (double)tot[1] / (double)tot[0] : 0.0,
                  .naive = xcalloc((size_t)nb * GG, sizeof(uint64_t)),
                  .dedup = xcalloc((size_t)nb * GG, sizeof(uint64_t))};
    for (int b = 0; b < nb; b++) {
        for (size_t s = 0; s < G; s++)
            for (size_t d = 0; d < G; d++) {
                const uint64_t *from = all + s * n + (size_t)b * 2 * G;
                c.dedup[(size_t)b * GG + s * G + d] = from[d];
                c.naive[(size_t)b * GG + s * G + d] = from[G + d];
            }
        c.max_dedup += (double)max_received(c.dedup + (size_t)b * GG, g_nranks) / nb;
        c.max_naive += (double)max_received(c.naive + (size_t)b * GG, g_nranks) / nb;
    }
    free(mine);
    free(all);
    return c;
}

// ---- Re-ordering -----------------------------------------------------------------------------

/* Rank g's share of T tokens (loom_moe.h, "Re-ordering"): n tokens from first. */
static void share(size_t T, int G, int g, size_t *first, size_t *n)
{
    size_t q = T / (size_t)G, m = T % (size_t)G;
    *first = (size_t)g * q + ((size_t)g < m ? (size_t)g : m);
    *n = q + ((size_t)g < m);
}

/* The rank whose share of T tokens holds token t, and t's index there. */
static int share_owner(size_t T, int G, size_t t, size_t *index)
{
    size_t q = T / (size_t)G, m = T % (size_t)G, first, n;
    size_t g = t < m * (q + 1) ? t / (q + 1) : m + (t - m * (q + 1)) / q;
    share(T, G, (int)g, &first, &n);
    *index = t - first;
    return (int)g;
}

/* What dedup+place+reorder needs beyond a routing: the layers, the learned affinity, the
 * placement, scratch for one batch, and per evaluation batch the permutation its counts used
 * (perm + poff[b]) and each of this rank's rows' natural owner and index there (src, two per
 * row of the re-ordered routing, at its offsets), for the check. */
typedef struct reorder {
    const layers_t *ly;
    const int32_t *expert_rank;
    int E, k;
    uint64_t *aff;
    int32_t *ident, *pred_own, *pred, *perm_now; /* one batch */
    int32_t *perm, *src;
    size_t *poff;
} reorder_t;

/* The affinity from the layer before to the measured one over every rank's share of the first
 * half of the batches, summed over the ranks, as place_coselect() learns the placement. */
static void reorder_init(reorder_t *ro, const layers_t *ly, const int32_t *expert_rank, int E,
                         int k)
{
    size_t most = 1, nperm = 0, first, n;
    for (int b = 0; b < ly->nbatches; b++) {
        most = ly->ntok[b] > most ? ly->ntok[b] : most;
        nperm += b >= ly->nbatches / 2 ? ly->ntok[b] : 0;
    }
    *ro = (reorder_t){.ly = ly, .expert_rank = expert_rank, .E = E, .k = k};
    ro->aff = xcalloc((size_t)E * (size_t)E, sizeof(uint64_t));
    for (int b = 0; b < ly->nbatches / 2; b++) {
        share(ly->ntok[b], g_nranks, g_rank, &first, &n);
        size_t at = (ly->off[b] + first) * (size_t)k;
        CHECK(loomMoeAffinityAccumulate(ly->prev + at, k, E, ly->cur + at, k, E, n, ro->aff));
    }
    CHECK(
        loomAllReduce(ro->aff, ro->aff, (size_t)E * (size_t)E, loomUint64, loomSum, g_comm, NULL));
    ro->ident = xcalloc(most, sizeof(int32_t));
    for (size_t t = 0; t < most; t++)
        ro->ident[t] = (int32_t)t;
    ro->pred_own = xcalloc(most * (size_t)k, sizeof(int32_t));
    ro->pred = xcalloc(most * (size_t)k, sizeof(int32_t));
    ro->perm_now = xcalloc(most, sizeof(int32_t));
    ro->perm = xcalloc(nperm, sizeof(int32_t));
    ro->poff = xcalloc((size_t)ly->nbatches, sizeof(size_t));
}

static void reorder_free(reorder_t *ro)
{
    free(ro->aff);
    free(ro->ident);
    free(ro->pred_own);
    free(ro->pred);
    free(ro->perm_now);
    free(ro->perm);
    free(ro->src);
    free(ro->poff);
}

/* Batch b's re-ordering as a layer runs it, into ro->perm_now: this rank predicts its share's
 * experts from the layer before, an AllGather of the T * k int32 predictions gives every rank
 * all of them in natural order, and every rank computes the same permutation. What moves the
 * tokens, the permuted ReduceScatter, stands in for one the layer runs anyway. With times,
 * times[3] receives the microseconds of the local work, times[4] those of the AllGather. */
static void reorder_batch(reorder_t *ro, int b, double *times)
{
    const layers_t *ly = ro->ly;
    size_t T = ly->ntok[b], k = (size_t)ro->k, first, n;
    share(T, g_nranks, g_rank, &first, &n);
    double t0 = now_us();
    CHECK(loomMoeAffinityPredict(ro->aff, ro->E, ro->E, ly->prev + (ly->off[b] + first) * k, ro->k,
                                 n, ro->k, ro->pred_own));
    double t1 = now_us();
    CHECK(loomMoeAllGatherPermuted(ro->pred_own, ro->pred, k, loomInt32, ro->ident, T, g_comm));
    double t2 = now_us();
    CHECK(loomMoeReorderCompute(ro->expert_rank, ro->E, g_nranks, ro->pred, ro->k, T, ro->perm_now,
                                NULL));
    if (times) {
        times[3] = t1 - t0 + now_us() - t2;
        times[4] = t2 - t1;
    }
}

/* The measured layer as re-ordering hands it out: evaluation batch b of rr holds the rows of
 * the tokens perm[first .. first + n) of this rank's share, the first half none. */
static void routing_reordered(reorder_t *ro, const routing_t *r, routing_t *rr)
{
    const layers_t *ly = ro->ly;
    size_t k = (size_t)ro->k, total = 0, at = 0, first, n;
    for (int b = ly->nbatches / 2; b < ly->nbatches; b++) {
        share(ly->ntok[b], g_nranks, g_rank, &first, &n);
        total += n;
    }
    *rr = (routing_t){.num_experts = ro->E, .top_k = ro->k};
    snprintf(rr->label, sizeof(rr->label), "%s", r->label);
    routing_alloc(rr, ly->nbatches, total);
    ro->src = xcalloc(2 * total, sizeof(int32_t));
    for (int b = 0, pos = 0; b < ly->nbatches; b++) {
        rr->off[b] = (size_t)pos;
        if (b < ly->nbatches / 2)
            continue;
        reorder_batch(ro, b, NULL);
        size_t T = ly->ntok[b];
        ro->poff[b] = at;
        memcpy(ro->perm + at, ro->perm_now, T * sizeof(int32_t));
        at += T;
        share(T, g_nranks, g_rank, &first, &n);
        for (size_t j = 0; j < n; j++) {
            size_t t = (size_t)ro->perm_now[first + j], f;
            memcpy(rr->topk + ((size_t)pos + j) * k, ly->cur + (ly->off[b] + t) * k,
                   k * sizeof(int32_t));
            int32_t *src = ro->src + 2 * ((size_t)pos + j);
            src[0] = share_owner(T, g_nranks, t, &f);
            src[1] = (int32_t)f;
        }
        rr->ntok[b] = n;
        rr->max_tok = n > rr->max_tok ? n : rr->max_tok;
        pos += (int)n;
    }
}

// ---- Data and the check ------------------------------------------------------------------

/* Inputs are integers in [-4, 4] and weights multiples of 1/8, so that every product and sum
 * of the reference is exact and the expected output is rounded once, as combine's is. */
static double x_value(size_t t, int rank, size_t i)
{
    return (double)((t * 7 + i * 3 + (size_t)rank * 5) % 9) - 4.0;
}

static float weight_value(size_t t, int j)
{
    return (float)(1 + (t + (size_t)j) % 4) / 8.0f;
}

/* The expert function: expert e multiplies by e + 1, rounded to the datatype. */
static double expert_value(loomDataType_t dt, double x, int e)
{
    char tmp[8];
    bench_store(dt, tmp, 0, x * (e + 1));
    return bench_load_float(dt, tmp, 0);
}

static void run_experts(loomDataType_t dt, size_t H, const int32_t *expert_rank, int E,
                        const loomMoeLayoutInfo_t *info, const void *in, void *out)
{
    int l = 0;
    for (int e = 0; e < E; e++) {
        if (expert_rank[e] != g_rank)
            continue;
        size_t lo = (size_t)info->expert_offset[l], hi = lo + (size_t)info->expert_count[l];
        for (size_t i = lo * H; i < hi * H; i++)
            bench_store(dt, out, i, expert_value(dt, bench_load_float(dt, in, i), e));
        l++;
    }
}

/* Elements of y that differ from the reference of this rank's tokens: token t's input is
 * x_value(t, this rank), or with src (two per token) that of token src[2t + 1] of rank src[2t]. */
static long long count_wrong(loomDataType_t dt, size_t H, const int32_t *topk, int k, size_t T,
                             const int32_t *src, const void *y)
{
    long long wrong = 0;
    char ref[8];
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < H; i++) {
            double acc = 0.0,
                   x = src ? x_value((size_t)src[2 * t + 1], src[2 * t], i) : x_value(t, g_rank, i);
            for (int j = 0; j < k; j++)
                if (topk[t * (size_t)k + (size_t)j] >= 0)
                    acc += (double)weight_value(t, j) *
                           expert_value(dt, x, topk[t * (size_t)k + (size_t)j]);
            bench_store(dt, ref, 0, acc);
            wrong += bench_load_float(dt, ref, 0) != bench_load_float(dt, y, t * H + i);
        }
    return wrong;
}

// ---- One mode ---------------------------------------------------------------------------

typedef struct bufs {
    void *x, *y, *recv, *out;
    float *w;
    size_t recv_cap; /* slots recv and out hold */
    int64_t *ecount, *eoffset;
    const int32_t *src; /* the batch's count_wrong() sources, or NULL */
} bufs_t;

static void ensure_slots(bufs_t *b, size_t slots, size_t row_bytes)
{
    if (slots <= b->recv_cap)
        return;
    free(b->recv);
    free(b->out);
    b->recv = xcalloc(slots, row_bytes);
    b->out = xcalloc(slots, row_bytes);
    b->recv_cap = slots;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Phases of a step, in all[iters][NPH]: layout, dispatch, combine, and re-ordering's local
 * work (prediction, permutation) and AllGather. */
#define NPH 5

/* all[iters][NPH]: each step's phases on this rank, then iters more of scratch. med[NPH + 3]:
 * the medians of the phases' slowest rank, of their sum, of dispatch + combine and of the
 * re-ordering's two. Stragglers set the pace: each phase's time is its slowest rank's. */
static void phase_medians(double *all, int iters, double *med)
{
    CHECK(loomAllReduce(all, all, (size_t)iters * NPH, loomFloat64, loomMax, g_comm, NULL));
    double *col = all + (size_t)iters * NPH;
    for (int p = 0; p < NPH + 3; p++) {
        for (int i = 0; i < iters; i++) {
            const double *t = all + (size_t)i * NPH;
            double dc = t[1] + t[2], re = t[3] + t[4];
            col[i] = p < NPH ? t[p] : p == NPH ? t[0] + dc + re : p == NPH + 1 ? dc : re;
        }
        med[p] = median(col, iters);
    }
}

/* One step on batch b: layout, dispatch, the experts (only when checking), combine; returns
 * the wrong elements of y when checking. times[0..2] receive each phase's microseconds. */
static long long step(const opts_t *o, loomMoePlan_t plan, const routing_t *r, int b, size_t H,
                      const int32_t *expert_rank, bufs_t *bf, int check, double *times)
{
    size_t es = bench_type_size(o->dtype), T = r->ntok[b];
    const int32_t *topk = r->topk + r->off[b] * (size_t)r->top_k;
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = bf->ecount;
    info.expert_offset = bf->eoffset;
    loomMoeHandle_t h = NULL;
    double t0 = now_us();
    CHECK(loomMoeLayout(plan, topk, bf->w, T, &h, &info));
    double t1 = now_us();
    ensure_slots(bf, info.recv_slots, H * es);
    CHECK(loomMoeDispatch(h, bf->x, bf->recv));
    double t2 = now_us();
    if (check)
        run_experts(o->dtype, H, expert_rank, r->num_experts, &info, bf->recv, bf->out);
    double t3 = now_us();
    CHECK(loomMoeCombine(h, check ? bf->out : bf->recv, bf->y));
    double t4 = now_us();
    CHECK(loomMoeHandleDestroy(h));
    times[0] = t1 - t0;
    times[1] = t2 - t1;
    times[2] = t4 - t3;
    return check ? count_wrong(o->dtype, H, topk, r->top_k, T, bf->src, bf->y) : 0;
}

/* Re-ordering's inputs of batch b into x: rank g holds its share's rows of x_value(., g) in a
 * batch of T rows, the others zero, and the permuted ReduceScatter hands each rank the rows
 * of its tokens, as a layer's own ReduceScatter would (untimed: the layer runs one anyway). */
static void reorder_inputs(const opts_t *o, const reorder_t *ro, int b, size_t H, void *x)
{
    size_t T = ro->ly->ntok[b], first, n, es = bench_type_size(o->dtype);
    share(T, g_nranks, g_rank, &first, &n);
    void *p = xcalloc(T * H, es);
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < H; i++)
            bench_store(o->dtype, p, (first + t) * H + i, x_value(t, g_rank, i));
    CHECK(loomMoeReduceScatterPermuted(p, x, H, o->dtype, loomSum, ro->perm + ro->poff[b], T,
                                       g_comm));
    free(p);
}

/* Mode `mode` on routing r: with ro (dedup+place+reorder) r is routing_reordered()'s, and each
 * step first re-orders its batch as a layer would (reorder_batch(), timed as its own phase). */
static void run_mode(const opts_t *o, const routing_t *r, size_t H, int mode,
                     const int32_t *expert_rank, reorder_t *ro, result_t *res)
{
    size_t es = bench_type_size(o->dtype);
    int first = r->nbatches / 2, nb = r->nbatches - first;
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = r->num_experts;
    cfg.top_k = r->top_k;
    cfg.datatype = (int)o->dtype;
    cfg.mode = mode == MODE_NAIVE ? loomMoeModeNaive : loomMoeModeDedup;
    cfg.hidden = H;
    cfg.expert_rank = expert_rank;
    loomMoePlan_t plan = NULL;
    CHECK(loomMoePlanCreate(&plan, &cfg, g_comm));

    bufs_t bf = {0};
    bf.x = xcalloc(r->max_tok * H, es);
    bf.y = xcalloc(r->max_tok * H, es);
    bf.w = xcalloc(r->max_tok * (size_t)r->top_k, sizeof(float));
    bf.ecount = xcalloc((size_t)r->num_experts, sizeof(int64_t));
    bf.eoffset = xcalloc((size_t)r->num_experts, sizeof(int64_t));
    for (size_t t = 0; t < r->max_tok; t++) {
        for (size_t i = 0; i < H; i++)
            bench_store(o->dtype, bf.x, t * H + i, x_value(t, g_rank, i));
        for (int j = 0; j < r->top_k; j++)
            bf.w[t * (size_t)r->top_k + (size_t)j] = weight_value(t, j);
    }

    /* One untimed pass over the evaluation batches: the check and the wire bytes. */
    double times[NPH];
    long long wrong = 0;
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    CHECK(loomMoePlanGetStats(plan, &st, 1));
    for (int b = first; b < r->nbatches; b++) {
        if (ro && o->check) {
            reorder_inputs(o, ro, b, H, bf.x);
            bf.src = ro->src + 2 * r->off[b];
        }
        wrong += step(o, plan, r, b, H, expert_rank, &bf, o->check, times);
    }
    CHECK(loomMoePlanGetStats(plan, &st, 1));
    double sums[2] = {(double)wrong, (double)st.bytes_sent};
    CHECK(loomAllReduce(sums, sums, 2, loomFloat64, loomSum, g_comm, NULL));

    double *all = xcalloc((size_t)o->iters * (NPH + 1) + NPH, sizeof(double));
    for (int i = -o->warmup; i < o->iters; i++) {
        int b = first + (i < 0 ? i + o->warmup : i) % nb;
        double *t = all + (size_t)(i < 0 ? o->iters : i) * NPH;
        CHECK(loomBarrier(g_comm, NULL));
        if (ro)
            reorder_batch(ro, b, t);
        step(o, plan, r, b, H, expert_rank, &bf, 0, t);
    }
    double med[NPH + 3];
    phase_medians(all, o->iters, med);
    res->layout_us = med[0];
    res->dispatch_us = med[1];
    res->combine_us = med[2];
    res->gather_us = med[4];
    res->total_us = med[NPH];
    res->xfer_us = med[NPH + 1];
    res->reorder_us = med[NPH + 2];
    res->bytes = sums[1] / nb;
    res->wrong = o->check ? (long long)sums[0] : -1;
    free(all);
    free(bf.x);
    free(bf.y);
    free(bf.w);
    free(bf.recv);
    free(bf.out);
    free(bf.ecount);
    free(bf.eoffset);
    CHECK(loomMoePlanDestroy(plan));
}

// ---- The model, the replay file and the projection ---------------------------------------

/* The bytes of mode m's exchanges per step from the row counts (the wire format of
 * docs/moe.md), the cost model's time of each, averaged over the evaluation batches, and with
 * xf the naive exchange for bench/peers/mpi_alltoallv_bench.c. */
static void predict(const opts_t *o, const routing_t *r, const uint64_t *rows,
                    const moe_x_links_t *links, FILE *xf, result_t *x)
{
    int G = g_nranks, nb = r->nbatches - r->nbatches / 2;
    size_t GG = (size_t)G * (size_t)G;
    size_t drow = moe_x_dispatch_row(x->hidden, bench_type_size(o->dtype),
                                     x->mode == MODE_NAIVE ? 1 : (size_t)r->top_k);
    double *disp = xcalloc(2 * GG, sizeof(double)), *comb = disp + GG;
    if (xf)
        fprintf(xf, "case k %d hidden %zu dtype %s trace %s steps %d\n", x->k, x->hidden,
                bench_type_names[o->dtype], r->label, nb);
    for (int b = 0; b < nb; b++) {
        moe_x_bytes(rows + (size_t)b * GG, G, drow, moe_x_combine_row(x->hidden), disp, comb);
        for (size_t i = 0; i < GG; i++)
            x->model_bytes += i % (size_t)(G + 1) ? (disp[i] + comb[i]) / nb : 0;
        x->pred_us[0] += moe_x_predict_us(links, disp) / nb;
        x->pred_us[1] += moe_x_predict_us(links, comb) / nb;
        if (xf) {
            moe_x_write_step(xf, G, b, "dispatch", disp);
            moe_x_write_step(xf, G, b, "combine", comb);
        }
    }
    free(disp);
}

/* One exchange of bytes[s * G + d] through loomAllToAllv of bytes; cnt holds 4 G counts. */
static void alltoallv_bytes(const double *bytes, const char *send, char *recv, size_t *cnt)
{
    size_t G = (size_t)g_nranks, *sc = cnt, *sd = cnt + G, *rc = cnt + 2 * G, *rd = cnt + 3 * G;
    for (size_t p = 0, so = 0, ro = 0; p < G; p++) {
        sc[p] = (size_t)bytes[(size_t)g_rank * G + p];
        rc[p] = (size_t)bytes[p * G + (size_t)g_rank];
        sd[p] = so;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
    }
    CHECK(loomAllToAllv(send, sc, sd, recv, rc, rd, loomUint8, g_comm, NULL));
}

/* Naive mode's exchanges, the same bytes between the same ranks, through loomAllToAllv alone,
 * timed as run_mode times a step: the transport without packing, expanding and summing rows,
 * and what mpi_alltoallv_bench.c runs through MPI_Alltoallv. x->a2av_us: dispatch, combine
 * and their sum. */
static void time_alltoallv(const opts_t *o, const routing_t *r, const uint64_t *rows, result_t *x)
{
    int G = g_nranks, nb = r->nbatches - r->nbatches / 2;
    size_t GG = (size_t)G * (size_t)G, most = 0;
    size_t drow = moe_x_dispatch_row(x->hidden, bench_type_size(o->dtype), 1);
    double *m = xcalloc(2 * GG * (size_t)nb, sizeof(double));
    for (int b = 0; b < nb; b++) {
        double *disp = m + (size_t)b * 2 * GG;
        moe_x_bytes(rows + (size_t)b * GG, G, drow, moe_x_combine_row(x->hidden), disp, disp + GG);
        for (size_t ph = 0; ph < 2; ph++)
            for (size_t side = 0; side < 2; side++) {
                double n = 0;
                for (size_t p = 0; p < (size_t)G; p++)
                    n += side ? disp[ph * GG + p * (size_t)G + (size_t)g_rank]
                              : disp[ph * GG + (size_t)g_rank * (size_t)G + p];
                most = (size_t)n > most ? (size_t)n : most;
            }
    }
    char *send = xcalloc(most, 1), *recv = xcalloc(most, 1);
    size_t *cnt = xcalloc(4 * (size_t)G, sizeof(size_t));
    double *all = xcalloc((size_t)o->iters * (NPH + 1) + NPH, sizeof(double));
    for (int i = -o->warmup; i < o->iters; i++) {
        const double *disp = m + (size_t)((i + o->warmup) % nb) * 2 * GG;
        double *t = all + (size_t)(i < 0 ? o->iters : i) * NPH;
        CHECK(loomBarrier(g_comm, NULL));
        double t0 = now_us();
        alltoallv_bytes(disp, send, recv, cnt);
        double t1 = now_us();
        alltoallv_bytes(disp + GG, send, recv, cnt);
        t[0] = t[3] = t[4] = 0;
        t[1] = t1 - t0;
        t[2] = now_us() - t1;
    }
    double med[NPH + 3];
    phase_medians(all, o->iters, med);
    x->a2av_us[0] = med[1];
    x->a2av_us[1] = med[2];
    x->a2av_us[2] = med[NPH + 1];
    free(all);
    free(cnt);
    free(send);
    free(recv);
    free(m);
}

/* The busiest rank's remote rows per step on G ranks, for each mode, from this run's
 * generator and knobs with T tokens per rank: what projected_us() scales the measured times by. */
static void project_rows(const opts_t *o, int k, int G, double *out)
{
    int E = o->num_experts, nb = o->batches - o->batches / 2;
    size_t T = o->tokens, GG = (size_t)G * (size_t)G, BT = (size_t)G * T;
    int32_t *prev = generate_topk(o, k, G), *topk = prev + (size_t)o->batches * BT * (size_t)k;
    int32_t *contig = xcalloc((size_t)E, sizeof(int32_t)),
            *placed = xcalloc((size_t)E, sizeof(int32_t));
    place_contiguous(E, G, contig);
    memcpy(placed, contig, (size_t)E * sizeof(int32_t));
    if (o->placement == PLACE_COSELECT) {
        uint64_t *cos = xcalloc((size_t)E * (size_t)E + (size_t)E, sizeof(uint64_t));
        CHECK(loomMoeCoselectAccumulate(topk, (size_t)(o->batches / 2) * (size_t)G * T, k, E, cos,
                                        cos + (size_t)E * (size_t)E));
        place_counts(cos, E, G, placed);
        free(cos);
    } else if (o->placement == PLACE_RANDOM) {
        place_random(E, G, o->seed, placed);
    }
    /* naive, dedup and dedup+place, then the placed naive rows, unused */
    uint64_t *m = xcalloc(4 * GG, sizeof(uint64_t)), tot[4] = {0};
    for (int b = o->batches - nb; b < o->batches; b++) {
        for (int s = 0; s < G; s++) {
            const int32_t *tk = topk + ((size_t)b * (size_t)G + (size_t)s) * T * (size_t)k;
            uint64_t *row = m + (size_t)s * (size_t)G;
            rows_of(tk, T, k, E, contig, G, s, row + GG, row, tot);
            rows_of(tk, T, k, E, placed, G, s, row + 2 * GG, row + 3 * GG, tot);
        }
        for (int mode = 0; mode <= MODE_PLACE; mode++)
            out[mode] += (double)max_received(m + (size_t)mode * GG, G) / nb;
    }
    if (o->modes & (1u << MODE_REORDER)) {
        /* Each batch's G * T tokens re-ordered as reorder_batch() does on G ranks. */
        uint64_t *aff = xcalloc((size_t)E * (size_t)E, sizeof(uint64_t));
        int32_t *pred = xcalloc(BT * (size_t)k, sizeof(int32_t)),
                *home = xcalloc(BT, sizeof(int32_t)), *perm = xcalloc(BT, sizeof(int32_t));
        CHECK(
            loomMoeAffinityAccumulate(prev, k, E, topk, k, E, (size_t)(o->batches / 2) * BT, aff));
        for (int b = o->batches - nb; b < o->batches; b++) {
            loom_moe_rows_t rows;
            size_t at = (size_t)b * BT * (size_t)k;
            CHECK(loomMoeAffinityPredict(aff, E, E, prev + at, k, BT, k, pred));
            CHECK(loomMoeReorderCompute(placed, E, G, pred, k, BT, perm, home));
            if (loom_moe_rows_count(topk + at, BT, (uint32_t)k, (uint32_t)E, placed, (uint32_t)G,
                                    home, NULL, &rows) != loomSuccess)
                bench_die(NULL, "the routing holds an expert id out of range");
            out[MODE_REORDER] += (double)rows.rows_max_to_rank / nb;
        }
        free(aff);
        free(pred);
        free(home);
        free(perm);
    }
    free(m);
    free(prev);
    free(contig);
    free(placed);
}

// ---- Output --------------------------------------------------------------------------------

static const char *dtype_name(loomDataType_t dt)
{
    return bench_type_names[dt];
}

static void print_header(const routing_t *r, const opts_t *o, const moe_x_links_t *links)
{
    char desc[320];
    moe_x_links_describe(links, desc, sizeof(desc));
    printf("# moe_perf: %d ranks, %zu tokens per rank and step, %d batches (placement learns on "
           "%d), %d warm-up and %d timed steps; times are the slowest rank's, median\n",
           g_nranks, r->max_tok, r->nbatches, r->nbatches / 2, o->warmup, o->iters);
    printf("# cost model (pred): an all-to-all-v of each step's bytes on %s\n", desc);
    printf("#%4s %3s %6s %8s %3s %-12s %-19s %9s %8s %6s %12s %10s %12s %11s %10s %8s %12s %6s "
           "%10s %10s %9s %11s %10s\n",
           "E", "k", "H", "dtype", "G", "trace", "mode", "rows", "saved%", "hit%", "bytes",
           "layout(us)", "dispatch(us)", "combine(us)", "total(us)", "vs_naive", "maxrank_rows",
           "#wrong", "d+c(us)", "pred(us)", "meas/pred", "reorder(us)", "gather(us)");
}

static void print_row(const opts_t *o, const routing_t *r, const result_t *x, double naive_total)
{
    char vs[16] = "-", wrong[24] = "N/A", reorder[24] = "-", gather[24] = "-";
    if (x->mode == MODE_REORDER) {
        snprintf(reorder, sizeof(reorder), "%.1f", x->reorder_us);
        snprintf(gather, sizeof(gather), "%.1f", x->gather_us);
    }
    if (naive_total > 0)
        snprintf(vs, sizeof(vs), "%.3f", naive_total / x->total_us);
    if (x->wrong >= 0)
        snprintf(wrong, sizeof(wrong), "%lld", x->wrong);
    double pred = x->pred_us[0] + x->pred_us[1];
    printf("%5d %3d %6zu %8s %3d %-12s %-19s %9.0f %8.1f %6.1f %12.0f %10.1f %12.1f %11.1f "
           "%10.1f %8s %12.0f %6s %10.1f %10.1f %9.2f %11s %10s\n",
           r->num_experts, x->k, x->hidden, dtype_name(o->dtype), g_nranks, r->label,
           k_mode_names[x->mode], x->rows, x->saved, x->hit, x->bytes, x->layout_us, x->dispatch_us,
           x->combine_us, x->total_us, vs, x->maxrank, wrong, x->xfer_us, pred,
           pred > 0 ? x->xfer_us / pred : 0.0, reorder, gather);
}

/* Projected dispatch + combine of x on k_proj_ranks[i] ranks: its measured time per row of the
 * busiest rank, times that rank's rows there. */
static double projected_us(const result_t *x, int i)
{
    return x->maxrank > 0 ? x->xfer_us / x->maxrank * x->proj_rows[i] : 0.0;
}

static int proj_valid(const opts_t *o, int i)
{
    return o->trace == NULL && k_proj_ranks[i] <= o->num_experts;
}

/* The projection's table: one row per rank count, mode and (k, H), after the measured ones. */
static void print_projection(const opts_t *o, const routing_t *r, const result_t *res, int nres)
{
    if (o->trace) {
        printf("# projection: none for a trace (its batches hold the tokens of %d ranks)\n",
               g_nranks);
        return;
    }
    printf("# projection to EP 16-64, not measured: d+c(us) of each mode above / its "
           "maxrank_rows, times the busiest rank's rows on G ranks (the same generator and "
           "knobs, %zu tokens per rank, placement learned the same way); assumes each rank's "
           "per-row cost stays as measured on %d ranks\n",
           o->tokens, g_nranks);
    printf("#%4s %3s %6s %3s %-12s %-19s %12s %14s %8s\n", "E", "k", "H", "G", "trace", "mode",
           "maxrank_rows", "projected(us)", "vs_naive");
    for (int i = 0; i < NUM_PROJ; i++) {
        if (!proj_valid(o, i))
            continue;
        double naive = 0;
        for (int j = 0; j < nres; j++) {
            const result_t *x = &res[j];
            double us = projected_us(x, i);
            naive = x->mode == MODE_NAIVE ? us : naive;
            char vs[16] = "-";
            if (naive > 0 && us > 0)
                snprintf(vs, sizeof(vs), "%.3f", naive / us);
            printf("%5d %3d %6zu %3d %-12s %-19s %12.0f %14.1f %8s\n", r->num_experts, x->k,
                   x->hidden, k_proj_ranks[i], r->label, k_mode_names[x->mode], x->proj_rows[i], us,
                   vs);
        }
    }
}

static void write_json(const opts_t *o, const routing_t *r, const result_t *res, int nres,
                       const double *geo, const int *geo_n, const char *links)
{
    FILE *f = fopen(o->json, "w");
    if (f == NULL)
        bench_die(NULL, "cannot write -J %s", o->json);
    fprintf(f,
            "{\"program\":\"moe_perf\",\"nranks\":%d,\"experts\":%d,\"tokens_per_rank\":%zu,"
            "\"dtype\":\"%s\",\"trace\":\"%s\",\"batches\":%d,\"iters\":%d,\"cost_model\":\"%s\","
            "\"results\":[",
            g_nranks, r->num_experts, r->max_tok, dtype_name(o->dtype), r->label, r->nbatches,
            o->iters, links);
    for (int i = 0; i < nres; i++) {
        const result_t *x = &res[i];
        double pred = x->pred_us[0] + x->pred_us[1];
        fprintf(f,
                "%s{\"k\":%d,\"hidden\":%zu,\"mode\":\"%s\",\"rows\":%.1f,"
                "\"rows_saved_pct\":%.3f,\"hit_pct\":%.3f,\"bytes\":%.0f,\"model_bytes\":%.0f,"
                "\"layout_us\":%.2f,\"dispatch_us\":%.2f,\"combine_us\":%.2f,\"total_us\":%.2f,"
                "\"dispatch_combine_us\":%.2f,\"predicted_dispatch_us\":%.2f,"
                "\"predicted_combine_us\":%.2f,\"measured_over_predicted\":%.4f,"
                "\"maxrank_rows\":%.1f,\"wrong\":%lld,\"reorder_us\":%.2f,"
                "\"reorder_gather_us\":%.2f,",
                i ? "," : "", x->k, x->hidden, k_mode_names[x->mode], x->rows, x->saved, x->hit,
                x->bytes, x->model_bytes, x->layout_us, x->dispatch_us, x->combine_us, x->total_us,
                x->xfer_us, x->pred_us[0], x->pred_us[1], pred > 0 ? x->xfer_us / pred : 0.0,
                x->maxrank, x->wrong, x->reorder_us, x->gather_us);
        if (x->mode == MODE_NAIVE)
            fprintf(f,
                    "\"alltoallv_dispatch_us\":%.2f,\"alltoallv_combine_us\":%.2f,"
                    "\"alltoallv_dispatch_combine_us\":%.2f,",
                    x->a2av_us[0], x->a2av_us[1], x->a2av_us[2]);
        fprintf(f, "\"projection\":[");
        for (int p = 0, comma = 0; p < NUM_PROJ; p++)
            if (proj_valid(o, p)) {
                fprintf(f, "%s{\"ranks\":%d,\"maxrank_rows\":%.1f,\"projected_us\":%.2f}",
                        comma ? "," : "", k_proj_ranks[p], x->proj_rows[p], projected_us(x, p));
                comma = 1;
            }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"geomean_vs_naive\":{");
    int comma = 0;
    for (int m = 0; m < NUM_MODES; m++)
        if (geo_n[m]) {
            fprintf(f, "%s\"%s\":%.4f", comma ? "," : "", k_mode_names[m], exp(geo[m] / geo_n[m]));
            comma = 1;
        }
    fprintf(f, "}}\n");
    fclose(f);
}

/* One routing (one top-k, or the trace) and what every mode of it shares: the placements, their
 * row counts, the re-ordered routing and the projection's rows. */
typedef struct k_run {
    routing_t r, rr; /* the routing; rr: re-ordered (dedup+place+reorder only) */
    layers_t ly;
    reorder_t ro;
    int32_t *contig, *placed;
    counts_t c_contig, c_placed, c_reord;
    double proj[NUM_PROJ][NUM_MODES];
} k_run_t;

static void k_run_init(opts_t *o, int top_k, k_run_t *k)
{
    memset(k, 0, sizeof(*k));
    if (o->trace)
        routing_from_trace(o, &k->r, &k->ly);
    else
        routing_generate(o, top_k, &k->r, &k->ly);
    size_t E = (size_t)k->r.num_experts;
    /* Past 1024 experts the reference's sums would no longer be exact in float32. */
    if (o->check && E > 1024)
        bench_die("run the check with E <= 1024",
                  "-c 1 checks exactly up to 1024 experts, "
                  "not %zu",
                  E);
    k->contig = xcalloc(E, sizeof(int32_t));
    k->placed = xcalloc(E, sizeof(int32_t));
    place_contiguous(k->r.num_experts, g_nranks, k->contig);
    if (o->placement == PLACE_COSELECT)
        place_coselect(&k->r, k->placed);
    else if (o->placement == PLACE_RANDOM)
        place_random(k->r.num_experts, g_nranks, o->seed, k->placed);
    else
        memcpy(k->placed, k->contig, E * sizeof(int32_t));
    k->c_contig = count_rows(&k->r, k->contig);
    k->c_placed = count_rows(&k->r, k->placed);
    /* dedup+place+reorder: the placement of dedup+place, the tokens re-ordered. */
    if (o->modes & (1u << MODE_REORDER)) {
        reorder_init(&k->ro, &k->ly, k->placed, k->r.num_experts, k->r.top_k);
        routing_reordered(&k->ro, &k->r, &k->rr);
        k->c_reord = count_rows(&k->rr, k->placed);
    }
    for (int i = 0; i < NUM_PROJ; i++)
        if (g_rank == 0 && proj_valid(o, i))
            project_rows(o, k->r.top_k, k_proj_ranks[i], k->proj[i]);
}

/* Frees all but k->r, which the JSON of the last routing still needs. */
static void k_run_free(const opts_t *o, k_run_t *k)
{
    counts_free(&k->c_contig);
    counts_free(&k->c_placed);
    counts_free(&k->c_reord);
    if (o->modes & (1u << MODE_REORDER)) {
        routing_free(&k->rr);
        reorder_free(&k->ro);
    }
    layers_free(&k->ly);
    free(k->contig);
    free(k->placed);
}

/* Every mode of `o` on one routing at one hidden size: a result each into res (from *nres on),
 * printed, and their speed-ups over naive into the geomean sums. Returns the wrong elements. */
static long long run_modes(const opts_t *o, k_run_t *k, size_t hidden, const moe_x_links_t *links,
                           FILE *xf, result_t *res, int *nres, double *geo, int *geo_n)
{
    double naive_total = 0;
    long long wrong = 0;
    for (int m = 0; m < NUM_MODES; m++) {
        if (!(o->modes & (1u << m)))
            continue;
        result_t *x = &res[(*nres)++];
        const counts_t *c = m == MODE_REORDER ? &k->c_reord
                            : m == MODE_PLACE ? &k->c_placed
                                              : &k->c_contig;
        *x = (result_t){.k = k->r.top_k, .hidden = hidden, .mode = m};
        run_mode(o, m == MODE_REORDER ? &k->rr : &k->r, hidden, m,
                 m >= MODE_PLACE ? k->placed : k->contig, m == MODE_REORDER ? &k->ro : NULL, x);
        x->rows = m == MODE_NAIVE ? c->rows_naive : c->rows_dedup;
        x->saved =
            k->c_contig.rows_naive > 0 ? 100.0 * (1.0 - x->rows / k->c_contig.rows_naive) : 0.0;
        x->hit = c->hit;
        x->maxrank = m == MODE_NAIVE ? c->max_naive : c->max_dedup;
        predict(o, &k->r, m == MODE_NAIVE ? c->naive : c->dedup, links, m == MODE_NAIVE ? xf : NULL,
                x);
        if (m == MODE_NAIVE)
            time_alltoallv(o, &k->r, c->naive, x);
        for (int i = 0; i < NUM_PROJ; i++)
            x->proj_rows[i] = k->proj[i][m];
        if (m == MODE_NAIVE)
            naive_total = x->total_us;
        if (naive_total > 0) {
            geo[m] += log(naive_total / x->total_us);
            geo_n[m]++;
        }
        wrong += x->wrong > 0 ? x->wrong : 0;
        if (g_rank == 0)
            print_row(o, &k->r, x, naive_total);
        if (g_rank == 0 && m == MODE_NAIVE)
            printf("# naive's bytes through loomAllToAllv alone: dispatch %.1f us, "
                   "combine %.1f us, d+c %.1f us\n",
                   x->a2av_us[0], x->a2av_us[1], x->a2av_us[2]);
        fflush(stdout);
    }
    return wrong;
}

int main(int argc, char **argv)
{
    opts_t o;
    parse(argc, argv, &o);
    if (getenv("LOOM_RANK") && *getenv("LOOM_RANK")) {
        CHECK(loomCommInitFromEnv(&g_comm));
    } else {
        loomUniqueId id;
        CHECK(loomGetUniqueId(&id));
        CHECK(loomCommInitRank(&g_comm, 1, id, 0));
    }
    CHECK(loomCommUserRank(g_comm, &g_rank));
    CHECK(loomCommCount(g_comm, &g_nranks));

    int nk = o.trace ? 1 : o.n_top_k;
    result_t *res = xcalloc((size_t)nk * (size_t)o.n_hidden * NUM_MODES, sizeof(result_t));
    int nres = 0, geo_n[NUM_MODES] = {0};
    double geo[NUM_MODES] = {0};
    long long wrong_total = 0;
    moe_x_links_t *links = moe_x_links_get(g_comm);
    if (links == NULL)
        bench_die(NULL, "out of memory");
    FILE *xf = NULL;
    if (o.exchange && g_rank == 0) {
        xf = fopen(o.exchange, "w");
        if (xf == NULL)
            bench_die("check the path", "cannot write --exchange %s", o.exchange);
        moe_x_write_header(xf, g_nranks, "naive");
    }
    k_run_t k;
    for (int ki = 0; ki < nk; ki++) {
        if (ki > 0)
            routing_free(&k.r);
        k_run_init(&o, o.trace ? 0 : o.top_k[ki], &k);
        if (g_rank == 0)
            print_header(&k.r, &o, links);
        const int first_res = nres;
        for (int hi = 0; hi < o.n_hidden; hi++)
            wrong_total += run_modes(&o, &k, o.hidden[hi], links, xf, res, &nres, geo, geo_n);
        if (g_rank == 0)
            print_projection(&o, &k.r, res + first_res, nres - first_res);
        k_run_free(&o, &k);
    }
    if (g_rank == 0) {
        printf("# geomean vs_naive:");
        for (int m = 0; m < NUM_MODES; m++)
            if (geo_n[m])
                printf("  %s %.3f", k_mode_names[m], exp(geo[m] / geo_n[m]));
        printf("\n# #wrong total: %lld\n", wrong_total);
        if (o.json) {
            char desc[320];
            moe_x_links_describe(links, desc, sizeof(desc));
            write_json(&o, &k.r, res, nres, geo, geo_n, desc);
        }
    }
    if (xf && fclose(xf) != 0)
        bench_die(NULL, "cannot write --exchange %s", o.exchange);
    moe_x_links_free(links);
    routing_free(&k.r);
    free(res);
    CHECK(loomCommDestroy(g_comm));
    return wrong_total ? EXIT_FAILURE : EXIT_SUCCESS;
}

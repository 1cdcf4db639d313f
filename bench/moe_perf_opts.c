/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf_opts.c - moe_perf's flags: the usage text, their parsing and checks, the
 * names of generators, placements and modes (moe_perf.h).
 */
#include <getopt.h>
#include <math.h>
#include <string.h>

#include "moe_perf.h"
#include "options.h"

const char *const k_gen_names[] = {"uniform", "planted", "text", "skew"};
const char *const k_place_names[] = {"contiguous", "random", "coselect"};
const char *const k_mode_names[] = {"naive", "dedup", "dedup+place", "dedup+place+reorder"};
const int k_proj_ranks[] = {16, 32, 64};

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

void parse(int argc, char **argv, opts_t *o)
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

/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf_opts.c - shard_perf's flags: the usage text, their parsing and checks, the
 * layout and balance names (shard_perf.h).
 */
#include <getopt.h>
#include <string.h>

#include "shard_perf.h"

const char *const k_layout_names[] = {"owner", "rows", "rows-bucketed", "replicated"};
const char *const k_balance_names[] = {"nscost", "numel", "roundrobin"};

static void usage(void)
{
    printf("Usage: shard_perf [flags]   (several ranks: loomrun -n N shard_perf ...)\n"
           "  --model gpt-tiny|gpt-cpu|gpt2-124m (gpt-cpu)\n"
           "  --layout a comma list of owner,rows,rows-bucketed,replicated (all)\n"
           "  --balance a comma list of nscost,numel,roundrobin: Owner's balances (nscost)\n"
           "  -w warm-up steps (3)     -n timed steps, median and minimum reported (10)\n"
           "  --deterministic 0|1: gradients summed in rank order (0: the cost model's\n"
           "        algorithm)\n"
           "  --seed S: the gradients' seed (1)\n"
           "  -J FILE: JSON results (bench/shard_perf_plot.py draws them)\n"
           "  --predict-only --ranks N: no communication, one process: the cost model's\n"
           "        projection of every layout to N ranks on N cores, from the plan and the\n"
           "        rates measured here; --proj-gbps B adds the in-step gather at B GB/s\n"
           "OPENBLAS_NUM_THREADS and OMP_NUM_THREADS default to 1 (set before BLAS starts).\n");
}

static double parse_number(const char *flag, const char *v, double lo, double hi)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi))
        bench_die("shard_perf -h lists the flags", "%s wants a number in [%g, %g], not '%s'", flag,
                  lo, hi, v);
    return x;
}

void sp_parse(int argc, char **argv, sp_opts_t *o)
{
    *o = (sp_opts_t){.model = MODEL_CPU,
                     .layouts = (1u << NUM_LAYOUTS) - 1,
                     .balances = 1u << loomShardBalanceNsCost,
                     .warmup = 3,
                     .iters = 10,
                     .seed = 1};
    static const struct option longs[] = {
        {"model", required_argument, 0, 1},   {"layout", required_argument, 0, 2},
        {"balance", required_argument, 0, 3}, {"deterministic", required_argument, 0, 4},
        {"seed", required_argument, 0, 5},    {"predict-only", no_argument, 0, 6},
        {"ranks", required_argument, 0, 7},   {"proj-gbps", required_argument, 0, 8},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "w:n:J:h", longs, NULL)) != -1) {
        switch (c) {
        case 'w':
            o->warmup = (int)parse_number("-w", optarg, 0, 1e6);
            break;
        case 'n':
            o->iters = (int)parse_number("-n", optarg, 1, 1e6);
            break;
        case 'J':
            o->json = optarg;
            break;
        case 1: {
            unsigned m =
                bench_parse_names("--model", optarg, "value", "shard_perf -h lists the values",
                                  k_model_names, NUM_MODELS);
            if (m & (m - 1))
                bench_die(NULL, "--model takes one model");
            o->model = __builtin_ctz(m);
            break;
        }
        case 2:
            o->layouts =
                bench_parse_names("--layout", optarg, "value", "shard_perf -h lists the values",
                                  k_layout_names, NUM_LAYOUTS);
            break;
        case 3:
            o->balances =
                bench_parse_names("--balance", optarg, "value", "shard_perf -h lists the values",
                                  k_balance_names, NUM_BALANCES);
            break;
        case 4:
            o->deterministic = (int)parse_number("--deterministic", optarg, 0, 1);
            break;
        case 5:
            o->seed = (uint64_t)parse_number("--seed", optarg, 0, 9e15);
            break;
        case 6:
            o->predict_only = 1;
            break;
        case 7:
            o->ranks = (int)parse_number("--ranks", optarg, 1, 1 << 20);
            break;
        case 8:
            o->proj_gbps = parse_number("--proj-gbps", optarg, 0, 1e6);
            break;
        case 'h':
            usage();
            exit(EXIT_SUCCESS);
        default:
            bench_die("shard_perf -h lists the flags", "bad flag");
        }
    }
    if (optind < argc)
        bench_die("shard_perf -h lists the flags", "unexpected argument '%s'", argv[optind]);
    if (o->ranks && !o->predict_only)
        bench_die("loomrun -n N starts N ranks", "--ranks needs --predict-only");
    if (o->predict_only && o->ranks == 0)
        bench_die("for example --predict-only --ranks 64", "--predict-only needs --ranks N");
}

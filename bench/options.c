/* SPDX-License-Identifier: Apache-2.0
 *
 * options.c - the benchmarks' command-line flags: nccl-tests' letters, long
 * names, meanings and defaults, binary K/M/G size suffixes, -h usage text and
 * HINT lines on misuse. It only parses: common.c's driver acts on the result.
 * The parsers of single values serve the programs with flags of their own.
 */
#include "options.h"

#include "common.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *g_prog = "bench";

void bench_set_prog(const char *prog)
{
    g_prog = prog;
}

void bench_die(const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", g_prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (hint)
        fprintf(stderr, "HINT: %s\n", hint);
    exit(EXIT_FAILURE);
}

size_t bench_parse_size(const char *flag, const char *value)
{
    double size;
    char unit = 0;
    int n = sscanf(value, "%lf %c", &size, &unit);
    double mult = 1;
    if (n == 2 && (unit == 'K' || unit == 'k'))
        mult = 1024.0;
    else if (n == 2 && (unit == 'M' || unit == 'm'))
        mult = 1024.0 * 1024.0;
    else if (n == 2 && (unit == 'G' || unit == 'g'))
        mult = 1024.0 * 1024.0 * 1024.0;
    else if (n != 1)
        size = -1;
    if (size < 0)
        bench_die("sizes are bytes with an optional K, M or G suffix, e.g. -b 8 -e 128M",
                  "invalid size '%s' for %s", value, flag);
    return (size_t)(size * mult);
}

int bench_parse_int(const char *flag, const char *value, int min)
{
    char *end;
    long v = strtol(value, &end, 0);
    if (end == value || *end || v < min || v > 1000000000L)
        bench_die(NULL, "invalid value '%s' for %s (an integer >= %d)", value, flag, min);
    return (int)v;
}

unsigned bench_parse_names(const char *flag, const char *value, const char *what, const char *hint,
                           const char *const *names, int n)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", value);
    unsigned set = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int i = 0;
        while (i < n && strcasecmp(tok, names[i]) != 0)
            i++;
        if (i == n)
            bench_die(hint, "%s: unknown %s '%s'", flag, what, tok);
        set |= 1u << i;
    }
    if (set == 0)
        bench_die(hint, "%s '%s' names no %s", flag, value, what);
    return set;
}

static int parse_name(const char *flag, const char *value, const char *const *names, int n)
{
    if (!strcmp(value, "all"))
        return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i]))
            return i;
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, names[i], sizeof(list) - strlen(list) - 1);
        strncat(list, i + 1 < n ? ", " : " or all", sizeof(list) - strlen(list) - 1);
    }
    bench_die(list, "unknown value '%s' for %s; valid values:", value, flag);
    return 0;
}

static void usage(void)
{
    printf("USAGE: %s\n"
           "\t[-b,--minbytes <min size in bytes, K/M/G suffixes>] (default: 32M)\n"
           "\t[-e,--maxbytes <max size in bytes>] (default: 32M)\n"
           "\t[-i,--stepbytes <increment size>] (default: 1M)\n"
           "\t[-f,--stepfactor <increment factor>] (default: disabled)\n"
           "\t[-n,--iters <iteration count>] (default: 20)\n"
           "\t[-w,--warmup_iters <warmup iteration count per size>] (default: 1)\n"
           "\t[-m,--agg_iters <operations per iteration, in one group>] (default: 1)\n"
           "\t[-c,--check <check iterations, 0 disables>] (default: 1)\n"
           "\t[-d,--datatype <int8|uint8|int32|uint32|int64|uint64|half|float|double|"
           "bfloat16|f8e4m3|f8e5m2|all>] (default: float)\n"
           "\t[-o,--op <sum|prod|max|min|avg|all>] (default: sum)\n"
           "\t[-r,--root <root rank|all>] (default: 0)\n"
           "\t[-z,--blocking <0: queue on a stream, one synchronize per timed loop; 1: NULL\n"
           "\t                stream, each call completes, barrier after each iteration;\n"
           "\t                2: NULL stream, calls back to back (an MPI benchmark's loop)>]"
           " (default: 0)\n"
           "\t[-u,--unalign <misalign buffers by this many elements>] (default: 0)\n"
           "\t[-T,--timeout <seconds a phase may take before the communicator is aborted>]\n"
           "\t[-J,--output_file <JSON output file>]\n"
           "\t[-M,--model <1: add each row's algorithm and the cost model's predicted time\n"
           "\t             (loomCommPlan) next to the measured one>] (default: 0)\n"
           "\t[-a,--average <0: rank 0, 1: average, 2: min, 3: max across ranks>]"
           " (default: 1)\n"
           "\t[-G,--device <1: send and receive buffers in device memory (loomMemAlloc), -z 0\n"
           "\t              queueing on a CUDA stream (loomStreamCreateFromCuda); LOOM_DEVICE\n"
           "\t              picks the runtime, emulated for the host emulation>] (default: 0)\n"
           "\t[-t,--nthreads 1] [-g,--ngpus 1] (accepted for nccl-tests command lines)\n"
           "\t[-h,--help]\n"
           "Run N ranks with: loomrun -n N %s ...\n",
           g_prog, g_prog);
}

static const bench_opts_t defaults = {
    .min_bytes = 32u << 20,
    .max_bytes = 32u << 20,
    .step_bytes = 1u << 20,
    .step_factor = 1,
    .iters = 20,
    .warmup_iters = 1,
    .agg_iters = 1,
    .check = 1,
    .blocking = 0,
    .unalign = 0,
    .timeout_s = 0,
    .average = 1,
    .dtype = loomFloat32,
    .op = loomSum,
    .root = 0,
    .json_path = NULL,
};

static const char shortopts[] = "t:g:b:e:i:f:n:m:w:c:o:d:r:z:u:T:J:M:a:G:h";

static const struct option longopts[] = {
    {"nthreads", required_argument, 0, 't'},
    {"ngpus", required_argument, 0, 'g'},
    {"minbytes", required_argument, 0, 'b'},
    {"maxbytes", required_argument, 0, 'e'},
    {"stepbytes", required_argument, 0, 'i'},
    {"stepfactor", required_argument, 0, 'f'},
    {"iters", required_argument, 0, 'n'},
    {"agg_iters", required_argument, 0, 'm'},
    {"warmup_iters", required_argument, 0, 'w'},
    {"check", required_argument, 0, 'c'},
    {"op", required_argument, 0, 'o'},
    {"datatype", required_argument, 0, 'd'},
    {"root", required_argument, 0, 'r'},
    {"blocking", required_argument, 0, 'z'},
    {"unalign", required_argument, 0, 'u'},
    {"timeout", required_argument, 0, 'T'},
    {"output_file", required_argument, 0, 'J'},
    {"model", required_argument, 0, 'M'},
    {"average", required_argument, 0, 'a'},
    {"device", required_argument, 0, 'G'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* -t and -g exist so that nccl-tests command lines run: only 1 makes sense here. */
static void check_one_per_process(int c, const char *value)
{
    if (bench_parse_int(c == 't' ? "-t" : "-g", value, 1) != 1)
        bench_die("start one process per rank with loomrun -n N instead",
                  "-%c accepts only 1: each rank is one process with one set of buffers", c);
}

/* The flags whose value is a size in bytes; NULL for the others. */
static size_t *size_field(bench_opts_t *o, int c)
{
    switch (c) {
    case 'b':
        return &o->min_bytes;
    case 'e':
        return &o->max_bytes;
    case 'i':
        return &o->step_bytes;
    default:
        return NULL;
    }
}

/* The flags whose value is an int, with its least value in *min_p; NULL for the others. */
static int *int_field(bench_opts_t *o, int c, int *min_p)
{
    *min_p = 0;
    switch (c) {
    case 'n':
        *min_p = 1;
        return &o->iters;
    case 'm':
        *min_p = 1;
        return &o->agg_iters;
    case 'w':
        return &o->warmup_iters;
    case 'c':
        return &o->check;
    case 'z':
        return &o->blocking;
    case 'u':
        return &o->unalign;
    case 'T':
        return &o->timeout_s;
    case 'a':
        return &o->average;
    case 'M':
        return &o->model;
    case 'G':
        return &o->device;
    default:
        return NULL;
    }
}

/* The flags that name a value (-o, -d, -r) or a file (-J); 0 when c is none of them. */
static int apply_named(bench_opts_t *o, int c, const char *value)
{
    switch (c) {
    case 'o':
        o->op = parse_name("-o", value, bench_op_names, loomNumOps);
        return 1;
    case 'd':
        o->dtype = parse_name("-d", value, bench_type_names, loomNumTypes);
        return 1;
    case 'r':
        o->root = strcmp(value, "all") ? bench_parse_int("-r", value, 0) : -1;
        return 1;
    case 'J':
        o->json_path = value;
        return 1;
    default:
        return 0;
    }
}

/* One flag from getopt_long: c and its value (optarg). */
static void apply_flag(bench_opts_t *o, int c, const char *value)
{
    char flag[3] = {'-', (char)c, '\0'};
    size_t *size_p = size_field(o, c);
    int min, *int_p = int_field(o, c, &min);
    if (size_p)
        *size_p = bench_parse_size(flag, value);
    else if (int_p)
        *int_p = bench_parse_int(flag, value, min);
    else if (c == 'f')
        o->step_factor = (size_t)bench_parse_int(flag, value, 1);
    else if (c == 't' || c == 'g')
        check_one_per_process(c, value);
    else if (apply_named(o, c, value))
        return;
    else if (c == 'h') {
        usage();
        exit(EXIT_SUCCESS);
    } else {
        usage();
        exit(EXIT_FAILURE);
    }
}

/* What only the flags together can get wrong, and values out of range. */
static void check_opts(const bench_opts_t *o)
{
    if (o->min_bytes > o->max_bytes)
        bench_die(NULL, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu", o->min_bytes,
                  o->max_bytes);
    if (o->blocking < 0 || o->blocking > 2)
        bench_die("-z 0 queues on a stream, -z 1 blocks and adds a barrier per iteration, -z 2 "
                  "blocks without one",
                  "-z %d is not supported", o->blocking);
    if (o->model > 1)
        bench_die("-M 1 prints the model's choice and prediction, -M 0 does not",
                  "-M %d is not supported", o->model);
    if (o->device > 1)
        bench_die("-G 1 puts the buffers in device memory, -G 0 (the default) in host memory",
                  "-G %d is not supported", o->device);
    if (o->average > 3)
        bench_die("-a 0: rank 0, 1: average, 2: min, 3: max", "-a %d is not supported", o->average);
}

size_t bench_next_size(const bench_opts_t *o, size_t size)
{
    size_t next = o->step_factor > 1 ? size * o->step_factor : size + o->step_bytes;
    return next > size ? next : (size_t)-1; /* 0 x factor, step 0 or overflow: stop */
}

void bench_opts_parse(int argc, char **argv, const char *prog, bench_opts_t *o)
{
    *o = defaults;
    g_prog = prog;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1)
        apply_flag(o, c, optarg);
    if (optind < argc)
        bench_die("run with -h for the flags", "unexpected argument '%s'", argv[optind]);
    check_opts(o);
}

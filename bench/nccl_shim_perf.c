/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_shim_perf.c - what the drop-in NCCL library costs over loom itself.
 *
 *   loomrun -n N nccl_shim_perf [-b 8] [-e 16M] [-f 4] [-n reps] [-w warm] [-c colls] [-J f]
 *
 * Each rank makes a loom communicator the usual way (loomrun's environment, or a lone rank)
 * and, through nccl.h, an NCCL communicator of the drop-in library (linked as libnccl.so.2):
 * rank 0's ncclGetUniqueId is broadcast over the loom communicator. The library runs in loom
 * mode: the program sets LOOM_NCCL_MODE=loom before its first NCCL call when the variable is
 * unset, and refuses any other mode. Both paths then run the same loom code on the same host
 * buffers with stream NULL, so what separates their times is the library's own work per
 * call: the handle lookup, the checks of buffers and stream, the routing decision and the
 * trace check (and, for Send/Recv, recording the group and replaying it).
 *
 * Per collective and size: one call each way on the same input, the outputs compared bit for
 * bit (the receive buffers start with different poison, so a path that wrote nothing fails);
 * then warm-up calls, then -n repetitions of a pair of blocks, one of calls through the
 * library and one of direct calls, in alternating order. A block's time per call is a sample;
 * the row has each path's median over the repetitions and the median of the pairs'
 * differences, averaged over the ranks.
 */
#include "nccl_shim_perf.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static struct {
    int rank, nranks;
    loomComm_t loom;
    ncclComm_t nccl;
    float *send, *recv, *check; /* check: the direct path's output in the comparison */
    size_t elems;               /* of each buffer */
} g;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

// ---- Failures ------------------------------------------------------------------

static void fail(const char *what, const char *result, const char *last)
{
    char msg[768];
    snprintf(msg, sizeof(msg), "rank %d: %s failed: %s (%s)", g.rank, what, result,
             last && *last ? last : "no further detail");
    nsp_report_close(0, msg);
    bench_die("every rank stops; loomrun names the first one that failed", "%s", msg);
}

static void check_loom(loomResult_t r, const char *what)
{
    if (r != loomSuccess)
        fail(what, loomGetErrorString(r), loomGetLastError(g.loom));
}

static void check_nccl(ncclResult_t r, const char *what)
{
    if (r != ncclSuccess)
        fail(what, ncclGetErrorString(r), ncclGetLastError(g.nccl));
}

// ---- Flags -----------------------------------------------------------------------

static void usage(void)
{
    printf("USAGE: nccl_shim_perf   (several ranks: loomrun -n N nccl_shim_perf ...)\n"
           "\t[-b,--minbytes <first row: bytes of the call's count, K/M/G suffixes>] "
           "(default: 8)\n"
           "\t[-e,--maxbytes <last row at most>] (default: 16M)\n"
           "\t[-f,--stepfactor <factor between rows>] (default: 4)\n"
           "\t[-n,--iters <repetitions of a block pair per row>] (default: 100)\n"
           "\t[-w,--warmup_iters <calls each way before a row is timed>] (default: 5)\n"
           "\t[-c,--colls <a comma list of collectives, or all>] (default: all)\n"
           "\t\tcollectives:");
    for (int i = 0; i < nsp_ncolls; i++)
        printf(" %s", nsp_colls[i].key);
    printf("\n"
           "\t[-J,--output_file <JSON output file>]\n"
           "\t[-h,--help]\n"
           "LOOM_NCCL_MODE must be unset (the program sets loom) or loom.\n");
}

static unsigned parse_colls(const char *v)
{
    if (strcmp(v, "all") == 0)
        return (1u << nsp_ncolls) - 1;
    const char *keys[32];
    for (int i = 0; i < nsp_ncolls; i++)
        keys[i] = nsp_colls[i].key;
    return bench_parse_names("-c", v, "collective", "nccl_shim_perf -h lists the collectives", keys,
                             nsp_ncolls);
}

void nsp_parse(int argc, char **argv, nsp_opts_t *o)
{
    bench_set_prog("nccl_shim_perf");
    *o = (nsp_opts_t){.sweep = {.min_bytes = 8,
                                .max_bytes = 16u << 20,
                                .step_factor = 4,
                                .iters = 100,
                                .warmup_iters = 5},
                      .colls = (1u << nsp_ncolls) - 1};
    static const struct option longs[] = {{"minbytes", required_argument, 0, 'b'},
                                          {"maxbytes", required_argument, 0, 'e'},
                                          {"stepfactor", required_argument, 0, 'f'},
                                          {"iters", required_argument, 0, 'n'},
                                          {"warmup_iters", required_argument, 0, 'w'},
                                          {"colls", required_argument, 0, 'c'},
                                          {"output_file", required_argument, 0, 'J'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:J:h", longs, NULL)) != -1) {
        switch (c) {
        case 'b':
            o->sweep.min_bytes = bench_parse_size("-b", optarg);
            break;
        case 'e':
            o->sweep.max_bytes = bench_parse_size("-e", optarg);
            break;
        case 'f':
            o->sweep.step_factor = (size_t)bench_parse_int("-f", optarg, 2);
            break;
        case 'n':
            o->sweep.iters = bench_parse_int("-n", optarg, 1);
            break;
        case 'w':
            o->sweep.warmup_iters = bench_parse_int("-w", optarg, 0);
            break;
        case 'c':
            o->colls = parse_colls(optarg);
            break;
        case 'J':
            o->sweep.json_path = optarg;
            break;
        case 'h':
            usage();
            exit(EXIT_SUCCESS);
        default:
            usage();
            exit(EXIT_FAILURE);
        }
    }
    if (optind < argc)
        bench_die("run with -h for the flags", "unexpected argument '%s'", argv[optind]);
    if (o->sweep.min_bytes > o->sweep.max_bytes)
        bench_die(NULL, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu",
                  o->sweep.min_bytes, o->sweep.max_bytes);
    if (o->sweep.max_bytes > ((size_t)1 << 40))
        bench_die("each rank holds three buffers of up to nranks times -e", "-e %zu is too large",
                  o->sweep.max_bytes);
}

int nsp_block_calls(size_t bytes)
{
    const size_t calls = (256u << 10) / (bytes ? bytes : 1);
    return calls < 1 ? 1 : calls > 32 ? 32 : (int)calls;
}

// ---- Communicators and buffers ---------------------------------------------------------

/* The library reads LOOM_NCCL_MODE once, at its first call: this must run before any. */
static void require_loom_mode(void)
{
    const char *m = getenv("LOOM_NCCL_MODE");
    if (m == NULL || *m == '\0') {
        setenv("LOOM_NCCL_MODE", "loom", 1);
        return;
    }
    if (strcasecmp(m, "loom") != 0)
        bench_die("unset LOOM_NCCL_MODE (the program then sets loom) or set it to loom",
                  "LOOM_NCCL_MODE=%s: this benchmark compares the library's loom mode, which "
                  "runs every call on loom, with loom itself",
                  m);
}

static void init_comms(void)
{
    const char *hint = NULL;
    loomResult_t lr = bench_comm_create(&g.loom, &hint);
    if (lr != loomSuccess)
        bench_die(hint, "creating loom's communicator failed: %s (%s)", loomGetErrorString(lr),
                  loomGetLastError(NULL));
    check_loom(loomCommUserRank(g.loom, &g.rank), "loomCommUserRank");
    check_loom(loomCommCount(g.loom, &g.nranks), "loomCommCount");
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (g.rank == 0)
        check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    check_loom(loomBroadcast(&id, &id, sizeof(id), loomUint8, 0, g.loom, NULL),
               "loomBroadcast of the NCCL unique id");
    check_nccl(ncclCommInitRank(&g.nccl, g.nranks, id, g.rank), "ncclCommInitRank");
}

static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n * sizeof(float)))
        bench_die("lower -e (each rank holds three buffers of nranks x maxBytes)",
                  "cannot allocate %zu bytes", n * sizeof(float));
    memset(p, 0, n * sizeof(float));
    return p;
}

static size_t row_count(size_t bytes)
{
    const size_t n = bytes / sizeof(float);
    return n ? n : 1;
}

// ---- One row ---------------------------------------------------------------------------

static void call_shim(const nsp_coll_t *c, float *recv, size_t count)
{
    ncclResult_t r = c->via_shim(g.send, recv, count, g.nccl, g.rank, g.nranks);
    if (r != ncclSuccess) {
        char what[96];
        snprintf(what, sizeof(what), "%s through the library (count %zu)", c->name, count);
        check_nccl(r, what);
    }
}

static void call_direct(const nsp_coll_t *c, float *recv, size_t count)
{
    loomResult_t r = c->direct(g.send, recv, count, g.loom, g.rank, g.nranks);
    if (r != loomSuccess) {
        char what[96];
        snprintf(what, sizeof(what), "%s on loom (count %zu)", c->name, count);
        check_loom(r, what);
    }
}

/* One call each way on fresh input; the elements, on every rank, whose bits differ. */
static long long compare_paths(const nsp_coll_t *c, size_t count, uint64_t seed)
{
    bench_ctx_t ctx = {.rank = g.rank,
                       .nranks = g.nranks,
                       .dtype = loomFloat32,
                       .elt_size = sizeof(float),
                       .op = loomSum,
                       .seed = seed};
    bench_fill_input(&ctx, g.send, c->send_elems(count, g.nranks), g.rank, 0);
    const size_t n = c->recv_elems(count, g.nranks);
    memset(g.recv, 0xA5, n * sizeof(float));
    memset(g.check, 0x5A, n * sizeof(float));
    call_shim(c, g.recv, count);
    call_direct(c, g.check, count);
    long long wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += memcmp(&g.recv[i], &g.check[i], sizeof(float)) != 0;
    check_loom(loomAllReduce(&wrong, &wrong, 1, loomInt64, loomSum, g.loom, NULL),
               "loomAllReduce of the comparison");
    return wrong;
}

/* Time per call of a block of `calls` calls one way. */
static double block_us(const nsp_coll_t *c, int shim, size_t count, int calls)
{
    const double t0 = now_us();
    for (int k = 0; k < calls; k++) {
        if (shim)
            call_shim(c, g.recv, count);
        else
            call_direct(c, g.recv, count);
    }
    return (now_us() - t0) / calls;
}

static void measure_row(const nsp_coll_t *c, const bench_opts_t *sw, size_t count, nsp_row_t *row,
                        uint64_t seed)
{
    *row = (nsp_row_t){.bytes = count * sizeof(float),
                       .count = count,
                       .calls_per_block = nsp_block_calls(count * sizeof(float))};
    row->wrong = compare_paths(c, count, seed);
    for (int i = 0; i < sw->warmup_iters; i++) {
        call_shim(c, g.recv, count);
        call_direct(c, g.recv, count);
    }
    const int reps = sw->iters;
    double *t = malloc(3 * (size_t)reps * sizeof(*t)); /* shim, direct, difference */
    if (t == NULL)
        bench_die("lower -n", "out of memory for %d repetitions", reps);
    check_loom(loomBarrier(g.loom, NULL), "loomBarrier");
    for (int r = 0; r < reps; r++) {
        /* Alternate which path goes first, so that neither always follows the other. */
        const int shim_first = r % 2 == 0;
        double s, d;
        if (shim_first) {
            s = block_us(c, 1, count, row->calls_per_block);
            d = block_us(c, 0, count, row->calls_per_block);
        } else {
            d = block_us(c, 0, count, row->calls_per_block);
            s = block_us(c, 1, count, row->calls_per_block);
        }
        t[r] = s;
        t[reps + r] = d;
        t[2 * reps + r] = s - d;
    }
    double med[3] = {bench_median(t, reps), bench_median(t + reps, reps),
                     bench_median(t + 2 * reps, reps)};
    free(t);
    check_loom(loomAllReduce(med, med, 3, loomFloat64, loomSum, g.loom, NULL),
               "loomAllReduce of the medians");
    row->shim_us = med[0] / g.nranks;
    row->direct_us = med[1] / g.nranks;
    row->overhead_ns = med[2] / g.nranks * 1e3;
}

// ---- Main ------------------------------------------------------------------------------

int main(int argc, char **argv)
{
    setlinebuf(stdout);
    nsp_opts_t o;
    nsp_parse(argc, argv, &o);
    require_loom_mode();
    init_comms();

    const size_t max_count = row_count(o.sweep.max_bytes);
    g.elems = max_count * (size_t)g.nranks;
    g.send = alloc_floats(g.elems);
    g.recv = alloc_floats(g.elems);
    g.check = alloc_floats(g.elems);

    nsp_report_open(&o, argc, argv, g.rank, g.nranks);
    long long wrong_rows = 0;
    uint64_t seed = 1;
    for (int i = 0; i < nsp_ncolls; i++) {
        if (!(o.colls & (1u << i)))
            continue;
        const nsp_coll_t *c = &nsp_colls[i];
        nsp_report_coll_start(c);
        nsp_row_t first = {0};
        int rows = 0;
        for (size_t size = o.sweep.min_bytes; size <= o.sweep.max_bytes;
             size = bench_next_size(&o.sweep, size)) {
            nsp_row_t row;
            measure_row(c, &o.sweep, row_count(size), &row, seed++);
            wrong_rows += row.wrong != 0;
            nsp_report_row(c, &row);
            if (rows++ == 0)
                first = row;
        }
        nsp_report_coll_end(c, &first);
    }
    nsp_report_close(wrong_rows, NULL);
    fflush(stdout);
    /* Launchers stop every rank when one exits non-zero: let rank 0 finish printing first. */
    check_loom(loomBarrier(g.loom, NULL), "loomBarrier");
    check_nccl(ncclCommDestroy(g.nccl), "ncclCommDestroy");
    g.nccl = NULL;
    check_loom(loomCommDestroy(g.loom), "loomCommDestroy");
    g.loom = NULL;
    free(g.send);
    free(g.recv);
    free(g.check);
    return wrong_rows ? EXIT_FAILURE : EXIT_SUCCESS;
}

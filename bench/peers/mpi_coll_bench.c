/* SPDX-License-Identifier: Apache-2.0
 *
 * mpi_coll_bench.c - the MPI side of bench/compare: MPI_Allreduce,
 * MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Bcast,
 * MPI_Reduce, and the uneven MPI_Allgatherv and MPI_Reduce_scatter (rank r's
 * block (r+1) units, as all_gatherv_perf and reduce_scatterv_perf) on float32
 * (sum), timed the way loom's *_perf driver
 * (bench/common.c) times its out-of-place column, after nccl-tests: the same
 * buffer shapes and 16-byte rounding, warm-up walking the sizes by doubling,
 * one untimed call and a barrier before each timed loop, successive calls
 * walking through the buffers, times averaged over ranks, the same algbw bytes
 * and busbw factors, and one exact check of the results per size.
 * Each band MIN:MAX:FACTOR:ITERS is one sweep, as one *_perf run with
 * -b MIN -e MAX -f FACTOR -n ITERS would be. Built twice by bench/compare,
 * with mpicc.openmpi and mpicc.mpich; it uses nothing of loom.
 * Usage: mpi_coll_bench -C COLL [-w WARMUP] [-c 0|1] [-J FILE] BAND...
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#endif
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BANDS 64

typedef struct counts {
    size_t send, recv; /* elements in this rank's send and receive buffers */
    size_t param;      /* the count argument of the call (per rank or per peer) */
} counts_t;

typedef struct coll {
    const char *flag; /* -C value: the *_perf program's name without _perf */
    const char *name; /* experiment_name, as loom's benchmarks write it */
    int reduces, rooted;
    void (*counts)(size_t count, int nranks, counts_t *c);
    int algbw_mult;  /* algbw bytes = param x 4 x (0: 1, 1: nranks, 2: nranks(nranks+1)/2) */
    int factor_kind; /* busbw factor: 0 -> 1, 1 -> (n-1)/n, 2 -> 2(n-1)/n */
    int (*run)(const float *send, float *recv, size_t param, int rank);
    /* Writes what this rank must hold in recv; returns how many elements. */
    size_t (*expected)(const counts_t *c, int rank, int nranks, uint64_t seed, float *out);
} coll_t;

typedef struct band {
    size_t min, max, factor;
    int iters;
} band_t;

static struct {
    int rank, nranks;
    const coll_t *coll;
    int warmup, check;
    band_t bands[MAX_BANDS];
    int nbands;
    char *send, *recv;
    float *expected;
    size_t band_max; /* bytes the current band's calls walk through */
    FILE *json;
    int rows, errors;
} g = {.warmup = 1, .check = 1};

#define MPI_CHECK(_call)                                                                           \
    do {                                                                                           \
        int rc_ = (_call);                                                                         \
        if (rc_ != MPI_SUCCESS)                                                                    \
            mpi_fail(rc_, #_call, __LINE__);                                                       \
    } while (0)

static void mpi_fail(int rc, const char *call, int line)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "mpi_coll_bench: rank %d: %s failed at line %d: %s\n", g.rank, call, line, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void die(const char *fmt, const char *arg)
{
    if (g.rank == 0) {
        fprintf(stderr, "mpi_coll_bench: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\nHINT: mpi_coll_bench -C all_reduce|all_gather|reduce_scatter|alltoall|"
                        "broadcast|reduce|all_gatherv|reduce_scatterv [-w N] [-c 0|1] [-J FILE] "
                        "MIN:MAX:FACTOR:ITERS...\n");
    }
    MPI_Finalize();
    exit(2);
}

// ---- Verifiable data ---------------------------------------------------------

/* Small integers, so that sums over up to 64 ranks are exact in float32 in
 * any order; bench/peers/gloo_bench.py uses the same formula. */
static float input(uint64_t seed, int rank, size_t i)
{
    uint64_t h = (uint64_t)i * 2654435761u + (uint64_t)rank * 40503u + seed * 97u;
    return (float)((int)(h % 17) - 8);
}

static float sum_input(uint64_t seed, int nranks, size_t i)
{
    float s = 0;
    for (int r = 0; r < nranks; r++)
        s += input(seed, r, i);
    return s;
}

// ---- The collectives -----------------------------------------------------------

static size_t round16(size_t count)
{
    return count & ~(size_t)3; /* 16 bytes of float */
}

static void counts_same(size_t count, int nranks, counts_t *c)
{
    (void)nranks;
    *c = (counts_t){.send = count, .recv = count, .param = count};
}

static void counts_gather(size_t count, int nranks, counts_t *c)
{
    size_t base = round16(count / (size_t)nranks);
    *c = (counts_t){.send = base, .recv = base * (size_t)nranks, .param = base};
}

static void counts_scatter(size_t count, int nranks, counts_t *c)
{
    size_t base = round16(count / (size_t)nranks);
    *c = (counts_t){.send = base * (size_t)nranks, .recv = base, .param = base};
}

static void counts_alltoall(size_t count, int nranks, counts_t *c)
{
    size_t base = round16(count / (size_t)nranks);
    *c = (counts_t){.send = base * (size_t)nranks, .recv = base * (size_t)nranks, .param = base};
}

/* The uneven pattern: units of count / (n(n+1)/2), rank r's block r+1 of them. */
static size_t parts_v(int nranks)
{
    return (size_t)nranks * (size_t)(nranks + 1) / 2;
}

static size_t displ_v(size_t unit, int r)
{
    return unit * (size_t)r * (size_t)(r + 1) / 2;
}

static void counts_gatherv(size_t count, int nranks, counts_t *c)
{
    size_t unit = round16(count / parts_v(nranks));
    *c = (counts_t){.send = unit * (size_t)nranks, .recv = unit * parts_v(nranks), .param = unit};
}

static void counts_scatterv(size_t count, int nranks, counts_t *c)
{
    size_t unit = round16(count / parts_v(nranks));
    *c = (counts_t){.send = unit * parts_v(nranks), .recv = unit * (size_t)nranks, .param = unit};
}

/* MPI's int counts and displacements of a unit, kept between calls. */
static void v_arrays(size_t unit, int **counts, int **displs)
{
    static int *v, vn;
    static size_t vunit;
    if (v == NULL || vn != g.nranks || vunit != unit) {
        free(v);
        v = malloc(2 * (size_t)g.nranks * sizeof(*v));
        if (v == NULL)
            die("out of memory for %s", "counts");
        for (int r = 0; r < g.nranks; r++) {
            v[r] = (int)((size_t)(r + 1) * unit);
            v[g.nranks + r] = (int)displ_v(unit, r);
        }
        vn = g.nranks;
        vunit = unit;
    }
    *counts = v;
    *displs = v + g.nranks;
}

static int run_allgatherv(const float *send, float *recv, size_t unit, int rank)
{
    int *counts, *displs;
    v_arrays(unit, &counts, &displs);
    return MPI_Allgatherv(send, counts[rank], MPI_FLOAT, recv, counts, displs, MPI_FLOAT,
                          MPI_COMM_WORLD);
}

static int run_reduce_scatterv(const float *send, float *recv, size_t unit, int rank)
{
    int *counts, *displs;
    (void)rank;
    v_arrays(unit, &counts, &displs);
    return MPI_Reduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static int run_allreduce(const float *send, float *recv, size_t n, int rank)
{
    (void)rank;
    return MPI_Allreduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static int run_allgather(const float *send, float *recv, size_t n, int rank)
{
    (void)rank;
    return MPI_Allgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
}

static int run_reduce_scatter(const float *send, float *recv, size_t n, int rank)
{
    (void)rank;
    return MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static int run_alltoall(const float *send, float *recv, size_t n, int rank)
{
    (void)rank;
    return MPI_Alltoall(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
}

/* MPI_Bcast has one buffer: the root sends from its send buffer, the others
 * receive into their receive buffer, so no extra copy is timed. */
static int run_broadcast(const float *send, float *recv, size_t n, int rank)
{
    void *buf = rank == 0 ? (void *)send : (void *)recv;
    return MPI_Bcast(buf, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

static int run_reduce(const float *send, float *recv, size_t n, int rank)
{
    (void)rank;
    return MPI_Reduce(send, recv, (int)n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
}

static size_t exp_allreduce(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    (void)rank;
    for (size_t i = 0; i < c->recv; i++)
        out[i] = sum_input(seed, nranks, i);
    return c->recv;
}

static size_t exp_allgather(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    (void)rank;
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < c->param; i++)
            out[(size_t)r * c->param + i] = input(seed, r, i);
    return c->recv;
}

static size_t exp_reduce_scatter(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    for (size_t i = 0; i < c->recv; i++)
        out[i] = sum_input(seed, nranks, (size_t)rank * c->param + i);
    return c->recv;
}

static size_t exp_alltoall(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < c->param; i++)
            out[(size_t)p * c->param + i] = input(seed, p, (size_t)rank * c->param + i);
    return c->recv;
}

static size_t exp_broadcast(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    (void)nranks;
    if (rank == 0)
        return 0; /* the root's data never left its send buffer */
    for (size_t i = 0; i < c->recv; i++)
        out[i] = input(seed, 0, i);
    return c->recv;
}

static size_t exp_reduce(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    return rank == 0 ? exp_allreduce(c, rank, nranks, seed, out) : 0;
}

static size_t exp_allgatherv(const counts_t *c, int rank, int nranks, uint64_t seed, float *out)
{
    (void)rank;
    for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < (size_t)(r + 1) * c->param; i++)
            out[displ_v(c->param, r) + i] = input(seed, r, i);
    return c->param * parts_v(nranks);
}

static size_t exp_reduce_scatterv(const counts_t *c, int rank, int nranks, uint64_t seed,
                                  float *out)
{
    const size_t mine = (size_t)(rank + 1) * c->param;
    for (size_t i = 0; i < mine; i++)
        out[i] = sum_input(seed, nranks, displ_v(c->param, rank) + i);
    return mine;
}

static const coll_t colls[] = {
    {"all_reduce", "AllReduce", 1, 0, counts_same, 0, 2, run_allreduce, exp_allreduce},
    {"all_gather", "AllGather", 0, 0, counts_gather, 1, 1, run_allgather, exp_allgather},
    {"reduce_scatter", "ReduceScatter", 1, 0, counts_scatter, 1, 1, run_reduce_scatter,
     exp_reduce_scatter},
    {"alltoall", "AlltoAll", 0, 0, counts_alltoall, 1, 1, run_alltoall, exp_alltoall},
    {"broadcast", "Broadcast", 0, 1, counts_same, 0, 0, run_broadcast, exp_broadcast},
    {"reduce", "Reduce", 1, 1, counts_same, 0, 0, run_reduce, exp_reduce},
    {"all_gatherv", "AllGatherV", 0, 0, counts_gatherv, 2, 1, run_allgatherv, exp_allgatherv},
    {"reduce_scatterv", "ReduceScatterV", 1, 0, counts_scatterv, 2, 1, run_reduce_scatterv,
     exp_reduce_scatterv},
};

// ---- Timing --------------------------------------------------------------------

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t total_bytes(const counts_t *c)
{
    return (c->send > c->recv ? c->send : c->recv) * sizeof(float);
}

/* Call number `iter` uses the iter-th slice of the band's buffers, as
 * bench/common.c's op_buffers does, so calls do not all hit one cache. */
static void call(const counts_t *c, int iter)
{
    size_t total = total_bytes(c);
    size_t steps = total ? g.band_max / total : 1;
    size_t shift = total * ((size_t)iter % (steps ? steps : 1));
    MPI_CHECK(
        g.coll->run((const float *)(g.send + shift), (float *)(g.recv + shift), c->param, g.rank));
}

static void fill_send(const counts_t *c, uint64_t seed)
{
    float *s = (float *)g.send;
    for (size_t i = 0; i < c->send; i++)
        s[i] = input(seed, g.rank, i);
}

/* One checked call; returns the wrong elements summed over all ranks. */
static long long check(const counts_t *c, uint64_t seed)
{
    fill_send(c, seed);
    memset(g.recv, 0xA5, total_bytes(c));
    call(c, 0);
    size_t n = g.coll->expected(c, g.rank, g.nranks, seed, g.expected);
    long long wrong = 0, all = 0;
    const float *got = (const float *)g.recv;
    for (size_t i = 0; i < n; i++)
        wrong += memcmp(&got[i], &g.expected[i], sizeof(float)) != 0;
    MPI_CHECK(MPI_Allreduce(&wrong, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    return all;
}

static void row(size_t bytes, int iters, int rep)
{
    counts_t c;
    g.coll->counts(bytes / sizeof(float), g.nranks, &c);
    if (c.param > INT_MAX)
        die("%s: a count above INT_MAX elements does not fit MPI's int", "size");
    if (g.check)
        fill_send(&c, 99);
    call(&c, 0);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = now_s();
    for (int it = 0; it < iters; it++)
        call(&c, it);
    double sec = (now_s() - t0) / iters, sum = 0;
    MPI_CHECK(MPI_Allreduce(&sec, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    sec = sum / g.nranks;
    long long wrong = g.check ? check(&c, (uint64_t)rep << 16) : 0;
    g.errors += wrong != 0;

    int n = g.nranks;
    double factor = g.coll->factor_kind == 0   ? 1.0
                    : g.coll->factor_kind == 1 ? (double)(n - 1) / n
                                               : 2.0 * (n - 1) / n;
    const double units = g.coll->algbw_mult == 2   ? (double)parts_v(n)
                         : g.coll->algbw_mult == 1 ? n
                                                   : 1;
    double algbw = (double)c.param * sizeof(float) * units / 1e9 / sec;
    double busbw = algbw * factor;
    if (g.rank != 0)
        return;
    size_t size = total_bytes(&c);
    printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6lld\n", size, c.param, "float",
           g.coll->reduces ? "sum" : "none", g.coll->rooted ? 0 : -1, sec * 1e6, algbw, busbw,
           g.check ? wrong : 0);
    if (!g.json)
        return;
    char nwrong[32] = "null";
    if (g.check)
        snprintf(nwrong, sizeof(nwrong), "%lld", wrong);
    fprintf(g.json,
            "%s{\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":\"%s\",\"root\":%d,"
            "\"nranks\":%d,\"out_of_place\":{\"time\":%.6f,\"alg_bw\":%.6f,\"bus_bw\":%.6f,"
            "\"nwrong\":%s},\"actual_iterations\":%d,\"experiment_name\":\"%s\"}",
            g.rows++ ? "," : "", size, c.param, g.coll->reduces ? "sum" : "none",
            g.coll->rooted ? 0 : -1, n, sec * 1e6, algbw, busbw, nwrong, iters, g.coll->name);
}

/* One band: warm up every doubling size, then one row per size (nccl-tests' TimeTest). */
static void sweep(const band_t *b, int *rep)
{
    g.band_max = b->max;
    counts_t c;
    for (size_t size = b->min; size <= b->max; size = size ? size * 2 : 1) {
        g.coll->counts(size / sizeof(float), g.nranks, &c);
        for (int it = 0; it < g.warmup; it++)
            call(&c, it);
    }
    for (size_t size = b->min;; size *= b->factor) {
        row(size, b->iters, ++*rep);
        if (size == 0 || size > b->max / b->factor)
            break; /* at 0 bench/common.c's next_size stops too */
    }
}

// ---- Command line and main ---------------------------------------------------------

static size_t parse_size(const char *s, char **end_p)
{
    double v = strtod(s, end_p);
    char u = **end_p;
    double mult = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 1;
    if (mult > 1)
        ++*end_p;
    if (*end_p == s || v < 0 || v * mult > 1e12)
        die("bad size in '%s'", s);
    return (size_t)(v * mult);
}

static void parse_band(const char *arg, band_t *b)
{
    char *end;
    b->min = parse_size(arg, &end);
    if (*end++ != ':')
        die("a band is MIN:MAX:FACTOR:ITERS, not '%s'", arg);
    b->max = parse_size(end, &end);
    if (*end++ != ':')
        die("a band is MIN:MAX:FACTOR:ITERS, not '%s'", arg);
    long f = strtol(end, &end, 10);
    if (*end++ != ':')
        die("a band is MIN:MAX:FACTOR:ITERS, not '%s'", arg);
    long it = strtol(end, &end, 10);
    if (*end || f < 2 || it < 1 || it > 1000000 || b->min > b->max)
        die("band '%s': want MIN <= MAX, FACTOR at least 2, ITERS 1 to 1000000", arg);
    b->factor = (size_t)f;
    b->iters = (int)it;
}

static void parse_args(int argc, char **argv)
{
    const char *coll = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (g.nbands == MAX_BANDS)
                die("more than %s bands", "64");
            parse_band(a, &g.bands[g.nbands++]);
            continue;
        }
        if (i + 1 >= argc)
            die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-C"))
            coll = v;
        else if (!strcmp(a, "-w"))
            g.warmup = atoi(v);
        else if (!strcmp(a, "-c"))
            g.check = atoi(v) != 0;
        else if (!strcmp(a, "-J"))
            g.json = g.rank == 0 ? fopen(v, "w") : NULL;
        else
            die("unknown option '%s'", a);
        if (!strcmp(a, "-J") && g.rank == 0 && !g.json)
            die("cannot write '%s'", v);
    }
    for (size_t i = 0; coll && i < sizeof(colls) / sizeof(colls[0]); i++)
        if (!strcmp(coll, colls[i].flag))
            g.coll = &colls[i];
    if (!g.coll)
        die("-C names the collective; '%s' is not one", coll ? coll : "(none)");
    if (!g.nbands)
        die("no band given%s", "");
    if (g.warmup < 0 || g.warmup > 1000)
        die("-w wants 0 to 1000 %s", "iterations");
}

/* A JSON string; control characters are dropped, quotes and backslashes escaped. */
static void json_str(const char *s)
{
    fputc('"', g.json);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', g.json);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, g.json);
    }
    fputc('"', g.json);
}

/* Header lines: the library, the flags, and where every rank runs (binding). */
static void header(int argc, char **argv)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n")] = '\0';
    int mine[2] = {(int)getpid(), sched_getcpu()}, *all = malloc(sizeof(int) * 2 * g.nranks);
    if (!all)
        die("out of %s", "memory");
    MPI_CHECK(MPI_Gather(mine, 2, MPI_INT, all, 2, MPI_INT, 0, MPI_COMM_WORLD));
    if (g.rank == 0) {
        printf("# mpi_coll_bench %s on %d ranks; %s\n", g.coll->name, g.nranks, lib);
        printf("# warmup iters: %d validation: %d bands:", g.warmup, g.check);
        for (int i = 0; i < g.nbands; i++)
            printf(" %zu:%zu:%zu:%d", g.bands[i].min, g.bands[i].max, g.bands[i].factor,
                   g.bands[i].iters);
        printf("\n");
        for (int r = 0; r < g.nranks; r++)
            printf("#  Rank %2d Pid %6d cpu %d\n", r, all[2 * r], all[2 * r + 1]);
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
               "(us)", "(GB/s)", "(GB/s)", "");
    }
    if (g.json) {
        fprintf(g.json, "{\"implementation\":");
        json_str(lib);
        fprintf(g.json, ",\"args\":[");
        for (int i = 0; i < argc; i++) {
            fprintf(g.json, i ? "," : "");
            json_str(argv[i]);
        }
        fprintf(g.json, "],\"nranks\":%d,\"cpus\":[", g.nranks);
        for (int r = 0; r < g.nranks; r++)
            fprintf(g.json, "%s%d", r ? "," : "", all[2 * r + 1]);
        fprintf(g.json, "],\"results\":[");
    }
    free(all);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g.nranks));
    setvbuf(stdout, NULL, _IOLBF, 0);
    parse_args(argc, argv);

    size_t max = 0;
    for (int i = 0; i < g.nbands; i++)
        max = g.bands[i].max > max ? g.bands[i].max : max;
    if (posix_memalign((void **)&g.send, 4096, max + 4096) ||
        posix_memalign((void **)&g.recv, 4096, max + 4096) ||
        posix_memalign((void **)&g.expected, 4096, max + 4096))
        die("cannot allocate three buffers of %s", "MAX bytes");
    memset(g.send, 0, max);
    memset(g.recv, 0, max);
    header(argc, argv);

    int rep = 0;
    for (int i = 0; i < g.nbands; i++)
        sweep(&g.bands[i], &rep);

    if (g.rank == 0) {
        printf("# Out of bounds values : %d %s\n", g.errors, g.errors ? "FAILED" : "OK");
        if (g.json) {
            fprintf(g.json, "],\"out_of_bounds\":%d}\n", g.errors);
            fclose(g.json);
        }
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(g.send);
    free(g.recv);
    free(g.expected);
    MPI_Finalize();
    return g.errors ? 1 : 0;
}

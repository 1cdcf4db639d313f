/* SPDX-License-Identifier: Apache-2.0
 *
 * common.c - the driver shared by every *_perf benchmark, after nccl-tests'
 * src/common.cu and src/util.cu: communicator creation (loomrun's environment,
 * or a lone rank), the size/type/op/root sweep, timing with CLOCK_MONOTONIC
 * combined across ranks, exact verification of the results, the -T watchdog,
 * and nccl-tests' text table and JSON records (rank 0 prints).
 * It knows no collective: bench/<coll>.c supplies a bench_coll_t and calls
 * bench_main(). Flags are parsed in options.c; verifiable inputs and reference
 * results live in verifiable.c; the communicator comes from launch.c and the
 * JSON values are written by json.c; device buffers (-G 1) are device.c's, the V
 * collectives' count arrays counts.c's.
 * Only include/loom.h of libloom is used.
 */
#include "common.h"
#include "device.h"
#include "options.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_PAD_BYTES 8 /* per -u element: room for the widest type */
#define BENCH_HOST_LEN  56

static bench_opts_t g_opt; /* the flags (options.c) */

// ---- Run state -------------------------------------------------------------

static struct {
    const bench_coll_t *coll;
    const char *prog;
    char host[BENCH_HOST_LEN];
    loomComm_t comm;
    loomStream_t stream; /* NULL with -z 1 */
    int rank, nranks;
    bench_bufs_t bufs; /* send and receive buffers: host memory, or device memory with -G 1 */
    char *expected;
    FILE *json;
    int json_rows;         /* records written to "results" */
    int json_results_open; /* "results":[ written */
    int json_row_open;     /* a record's { written, its } not yet */
    int errors;            /* measurements with any wrong element */
    double bw_sum;
    int bw_count;
    int rep;        /* counts measurements; seeds the checks */
    double rel_err; /* lossy collectives: the last check's relative L2 error */
} g;

/* Watchdog for -T: a phase (warm-up, timed loop, check) that runs longer than
 * the timeout aborts the communicator, as nccl-tests does around its waits. */
static struct {
    atomic_llong phase_start_ns; /* 0: idle */
    atomic_int fired;
    pthread_mutex_t lock; /* held while aborting; taken to disarm for good */
    int disarmed;
} g_wd = {.lock = PTHREAD_MUTEX_INITIALIZER};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// ---- JSON output (rank 0, -J) ----------------------------------------------

/* Closes the results list and the document; msg (may be NULL) goes to "errors". */
static void json_finish(const char *msg)
{
    if (!g.json)
        return;
    if (!g.json_results_open)
        fprintf(g.json, "\"results\":[");
    if (g.json_row_open)
        fprintf(g.json, "}");
    fprintf(g.json, "],\"out_of_bounds\":{\"count\":%d,\"okay\":%s},", g.errors,
            g.errors ? "false" : "true");
    fprintf(g.json, "\"average_bus_bandwidth\":{\"bandwidth\":");
    bench_json_double(g.json, g.bw_count ? g.bw_sum / g.bw_count : 0.0);
    fprintf(g.json, ",\"okay\":\"unchecked\"},\"errors\":[");
    if (msg)
        bench_json_str(g.json, msg);
    fprintf(g.json, "],\"end_time\":");
    bench_json_now(g.json);
    fprintf(g.json, "}\n");
    fclose(g.json);
    g.json = NULL;
}

// ---- Failure paths ----------------------------------------------------------

/* A loom call failed: say where and why, stop the communicator, exit. */
static void fail_loom(loomResult_t res, const char *call, const char *file, int line,
                      const char *hint)
{
    pthread_mutex_lock(&g_wd.lock); /* the watchdog may be aborting right now */
    int dead = atomic_load(&g_wd.fired);
    g_wd.disarmed = 1;
    pthread_mutex_unlock(&g_wd.lock);
    const char *last = loomGetLastError(dead ? NULL : g.comm);
    char msg[1024];
    snprintf(msg, sizeof(msg), "rank %d: %s failed: '%s / %s'", g.rank, call,
             loomGetErrorString(res), last);
    fprintf(stderr, "%s: Test loom failure %s:%d %s\n", g.host, file, line, msg);
    if (hint)
        fprintf(stderr, "HINT: %s\n", hint);
    fflush(NULL);
    json_finish(msg);
    if (!dead && g.comm)
        loomCommAbort(g.comm);
    exit(EXIT_FAILURE);
}

#define BENCH_CHECK_HINT(_call, _hint)                                                             \
    do {                                                                                           \
        loomResult_t res_ = (_call);                                                               \
        if (res_ != loomSuccess)                                                                   \
            fail_loom(res_, #_call, __FILE__, __LINE__, (_hint));                                  \
    } while (0)
#define BENCH_CHECK(_call)                                                                         \
    do {                                                                                           \
        loomResult_t res_ = (_call);                                                               \
        if (res_ != loomSuccess)                                                                   \
            fail_loom(res_, #_call, __FILE__, __LINE__, NULL);                                     \
    } while (0)

// ---- Watchdog (-T) -----------------------------------------------------------

static void wd_phase(void)
{
    if (g_opt.timeout_s > 0)
        atomic_store(&g_wd.phase_start_ns, now_ns());
}

static void *wd_main(void *arg)
{
    (void)arg;
    const struct timespec tick = {0, 50 * 1000 * 1000};
    for (;;) {
        nanosleep(&tick, NULL);
        long long start = atomic_load(&g_wd.phase_start_ns);
        if (!start || now_ns() - start < (long long)g_opt.timeout_s * 1000000000LL)
            continue;
        pthread_mutex_lock(&g_wd.lock);
        if (g_wd.disarmed) {
            pthread_mutex_unlock(&g_wd.lock);
            return NULL;
        }
        atomic_store(&g_wd.fired, 1);
        printf("%s: Test timeout (%ds) %s:%d\n", g.host, g_opt.timeout_s, __FILE__, __LINE__);
        fflush(stdout);
        loomCommAbort(g.comm);
        pthread_mutex_unlock(&g_wd.lock);
        /* The blocked call now fails and the main thread exits; if it cannot, do it here. */
        const struct timespec grace = {5, 0};
        nanosleep(&grace, NULL);
        fflush(NULL);
        _exit(EXIT_FAILURE);
    }
}

static void wd_disarm(void)
{
    pthread_mutex_lock(&g_wd.lock);
    g_wd.disarmed = 1;
    atomic_store(&g_wd.phase_start_ns, 0);
    pthread_mutex_unlock(&g_wd.lock);
}

// ---- Communicator -----------------------------------------------------------

static void init_comm(void)
{
    const char *hint = NULL;
    BENCH_CHECK_HINT(bench_comm_create(&g.comm, &hint), hint);
    BENCH_CHECK(loomCommUserRank(g.comm, &g.rank));
    BENCH_CHECK(loomCommCount(g.comm, &g.nranks));
}

static void *alloc_buf(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1))
        bench_die("lower -e (each rank holds three buffers of maxBytes)",
                  "cannot allocate %zu bytes", bytes);
    memset(p, 0, bytes);
    return p;
}

/* Device buffers (-G 1): the runtime is started before the communicator exists, so that
 * loom finds it when the communicator is created. */
static bench_dev_kind_t g_dev_kind;
static const char *g_dev_why; /* why CUDA did not start, or NULL */

static void start_device(void)
{
    if (g_opt.device)
        g_dev_kind = bench_dev_start(&g_dev_why);
}

static void alloc_buffers(size_t bytes)
{
    loomResult_t res = bench_bufs_alloc(&g.bufs, bytes, g_opt.device);
    if (res != loomSuccess)
        fail_loom(res, "loomMemAlloc of the -G 1 buffers", __FILE__, __LINE__,
                  g_dev_why ? g_dev_why : bench_dev_error());
}

// ---- Header and table ---------------------------------------------------------

static void print_header(int version)
{
    typedef struct {
        int32_t pid;
        char host[BENCH_HOST_LEN];
        int32_t device; /* -G 1: the device's ordinal, bus id and name */
        char bus[24];
        char name[BENCH_HOST_LEN];
    } rank_info_t;
    rank_info_t mine = {.pid = (int32_t)getpid()};
    memcpy(mine.host, g.host, sizeof(mine.host)); /* same size; g.host ends in NUL */
    if (g_opt.device)
        bench_dev_describe(&mine.device, mine.bus, sizeof(mine.bus), mine.name, sizeof(mine.name));
    rank_info_t *all = calloc((size_t)g.nranks, sizeof(*all));
    if (!all)
        bench_die(NULL, "out of memory");
    BENCH_CHECK(loomAllGather(&mine, all, sizeof(mine), loomUint8, g.comm, NULL));
    if (g.rank != 0) {
        free(all);
        return;
    }
    size_t step = g_opt.step_factor > 1 ? g_opt.step_factor : g_opt.step_bytes;
    printf("# loom-tests version %d.%d.%d loom-headers=%d loom-library=%d\n", LOOM_MAJOR,
           LOOM_MINOR, LOOM_PATCH, LOOM_VERSION_CODE, version);
    printf("# Collective test starting: %s\n", g.prog);
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: "
           "%d agg iters: %d validation: %d graph: 0 unalign: %d\n",
           g_opt.min_bytes, g_opt.max_bytes, step, g_opt.step_factor > 1 ? "factor" : "bytes",
           g_opt.warmup_iters, g_opt.iters, g_opt.agg_iters, g_opt.check, g_opt.unalign);
    if (g_opt.blocking == 1)
        printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
    else if (g_opt.blocking == 2)
        printf("# Blocking Enabled: wait for completion of each collective, no barrier\n");
    if (g_opt.device)
        printf("# Device buffers: loomMemAlloc (%s runtime)%s\n", bench_dev_kind_name(g_dev_kind),
               g_opt.blocking ? ""
                              : ", calls queued on a device stream (loomStreamCreateFromCuda)");
    printf("#\n# Using devices\n");
    if (g.json) {
        fprintf(g.json, "\"config\":{\"nthreads\":1,\"ngpus\":1,\"nranks\":%d,", g.nranks);
        fprintf(g.json, "\"minimum_bytes\":%zu,\"maximum_bytes\":%zu,\"%s\":%zu,", g_opt.min_bytes,
                g_opt.max_bytes, g_opt.step_factor > 1 ? "step_factor" : "step_bytes", step);
        fprintf(g.json,
                "\"warmup_iters\":%d,\"iterations\":%d,\"aggregated_iterations\":%d,"
                "\"validation\":%d,\"graph\":0,\"blocking_collectives\":%s,\"unalign\":%d,"
                "\"average\":%d,\"timeout\":%d,\"devices\":[",
                g_opt.warmup_iters, g_opt.iters, g_opt.agg_iters, g_opt.check,
                g_opt.blocking ? "true" : "false", g_opt.unalign, g_opt.average, g_opt.timeout_s);
    }
    for (int r = 0; r < g.nranks; r++) {
        int local = 0; /* device = local rank: ranks before r on the same host */
        for (int q = 0; q < r; q++)
            local += !strcmp(all[q].host, all[r].host);
        const int dev = g_opt.device ? all[r].device : local;
        const char *bus = g_opt.device ? all[r].bus : "cpu";
        const char *info = g_opt.device ? all[r].name : "host";
        printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", r, 0, (int)all[r].pid,
               all[r].host, dev, bus, info);
        if (g.json) {
            fprintf(g.json, "%s{\"rank\":%d,\"group\":0,\"pid\":%d,\"hostname\":", r ? "," : "", r,
                    (int)all[r].pid);
            bench_json_str(g.json, all[r].host);
            fprintf(g.json, ",\"device\":%d,\"device_hex\":", dev);
            bench_json_str(g.json, bus);
            fprintf(g.json, ",\"device_info\":");
            bench_json_str(g.json, info);
            fprintf(g.json, "}");
        }
    }
    if (g.json) {
        fprintf(g.json, "]},\"results\":[");
        g.json_results_open = 1;
    }
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place   "
           "       \n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
           "busbw", "#wrong", g_opt.model ? "  algorithm            model" : "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
           g_opt.model ? "                        (us)" : "");
    free(all);
}

/* nccl-tests' getFloatStr: 2 decimals, then 1, then 0, then exponent notation. */
static void float_str(double value, int width, char *str, size_t len)
{
    int power = 0;
    if (!isfinite(value)) {
        snprintf(str, len, "%*.2f", width, value);
        return;
    }
    for (uint64_t val = 1; value >= (double)val && power < 20; val *= 10)
        power++;
    if (power < width - 2)
        snprintf(str, len, "%*.2f", width, value);
    else if (power < width - 1)
        snprintf(str, len, "%*.1f", width, value);
    else if (power < width + 1)
        snprintf(str, len, "%*.0f", width, value);
    else
        snprintf(str, len, "%*.1e", width, value);
}

/* One placement's columns; measured == 0 prints N/A everywhere (not run). */
static void print_body(int measured, double usec, double algbw, double busbw, int64_t wrong,
                       int in_place)
{
    if (g.rank != 0)
        return;
    if (!measured) {
        printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
        if (g.json)
            fprintf(g.json, ",\"%s\":null", in_place ? "in_place" : "out_of_place");
        return;
    }
    char t[32], a[32], b[32];
    float_str(usec, 7, t, sizeof(t));
    float_str(algbw, 6, a, sizeof(a));
    float_str(busbw, 6, b, sizeof(b));
    if (g_opt.check && g.coll->lossy_bound > 0)
        printf("  %7s  %6s  %6s  %6.4f", t, a, b, g.rel_err);
    else if (g_opt.check)
        printf("  %7s  %6s  %6s  %6g", t, a, b, (double)wrong);
    else
        printf("  %7s  %6s  %6s    N/A", t, a, b);
    if (g.json) {
        fprintf(g.json, ",\"%s\":{\"time\":", in_place ? "in_place" : "out_of_place");
        bench_json_double(g.json, usec);
        fprintf(g.json, ",\"alg_bw\":");
        bench_json_double(g.json, algbw);
        fprintf(g.json, ",\"bus_bw\":");
        bench_json_double(g.json, busbw);
        if (g_opt.check && g.coll->lossy_bound > 0) {
            fprintf(g.json, ",\"nwrong\":%lld,\"relerr\":", (long long)wrong);
            bench_json_double(g.json, g.rel_err);
            fprintf(g.json, "}");
        } else if (g_opt.check)
            fprintf(g.json, ",\"nwrong\":%lld}", (long long)wrong);
        else
            fprintf(g.json, ",\"nwrong\":null}");
    }
}

// ---- One measurement ----------------------------------------------------------

static size_t total_bytes(const bench_ctx_t *ctx)
{
    size_t n = ctx->counts.send_count > ctx->counts.recv_count ? ctx->counts.send_count
                                                               : ctx->counts.recv_count;
    return n * ctx->elt_size;
}

/* Buffers of operation number `iter`: like nccl-tests, successive operations
 * walk through the maxBytes buffers so that they do not all hit one cache. */
static void op_buffers(const bench_ctx_t *ctx, int in_place, int iter, char **send_p, char **recv_p)
{
    size_t total = total_bytes(ctx);
    size_t steps = total ? g_opt.max_bytes / total : 1;
    size_t shift = total * ((size_t)iter % (steps ? steps : 1));
    size_t unalign = (size_t)g_opt.unalign * ctx->elt_size;
    char *send = g.bufs.send + unalign + shift;
    char *recv = g.bufs.recv + unalign + shift;
    size_t rank = (size_t)ctx->rank;
    size_t send_at = ctx->counts.send_inplace_off * rank,
           recv_at = ctx->counts.recv_inplace_off * rank;
    if (in_place && g.coll->inplace_at) {
        send_at = g.coll->inplace_at(ctx, 1);
        recv_at = g.coll->inplace_at(ctx, 0);
    }
    *send_p = in_place ? recv + send_at * ctx->elt_size : send;
    *recv_p = in_place ? recv + recv_at * ctx->elt_size : recv;
}

static void start_op(const bench_ctx_t *ctx, int in_place, int iter)
{
    char *send, *recv;
    op_buffers(ctx, in_place, iter, &send, &recv);
    loomResult_t res = g.coll->run(send, recv, ctx->counts.param_count, ctx->dtype, ctx->op,
                                   ctx->root, g.comm, g.stream);
    if (res != loomSuccess) {
        char call[160];
        snprintf(call, sizeof(call), "%s (%s, count %zu, %s, op %s, root %d)", g.coll->name,
                 in_place ? "in place" : "out of place", ctx->counts.param_count,
                 bench_type_names[ctx->dtype],
                 (g.coll->flags & BENCH_REDUCES) ? bench_op_names[ctx->op] : "none", ctx->root);
        fail_loom(res, call, __FILE__, __LINE__, NULL);
    }
}

static void complete_ops(void)
{
    if (g.stream)
        BENCH_CHECK(loomStreamSynchronize(g.stream));
}

/* Writes fresh inputs for operation 0 and poisons its receive buffer (in the host
 * mirrors, copied to the device with -G 1). */
static void prepare_data(bench_ctx_t *ctx, int in_place, uint64_t seed)
{
    char *send, *recv;
    ctx->seed = seed;
    op_buffers(ctx, in_place, 0, &send, &recv);
    char *base = g.bufs.recv + (size_t)g_opt.unalign * ctx->elt_size;
    memset(bench_bufs_host(&g.bufs, base), 0xA5, total_bytes(ctx));
    g.coll->init_data(ctx, bench_bufs_host(&g.bufs, send));
    BENCH_CHECK_HINT(bench_bufs_put(&g.bufs, base, total_bytes(ctx)), bench_dev_error());
    BENCH_CHECK_HINT(bench_bufs_put(&g.bufs, send, ctx->counts.send_count * ctx->elt_size),
                     bench_dev_error());
}

/* Runs one checked operation; returns the number of wrong elements on all ranks. */
static int64_t check_data(bench_ctx_t *ctx, int in_place, uint64_t seed)
{
    char *send, *recv;
    prepare_data(ctx, in_place, seed);
    start_op(ctx, in_place, 0);
    complete_ops();
    op_buffers(ctx, in_place, 0, &send, &recv);
    size_t n = g.coll->expected(ctx, g.expected);
    BENCH_CHECK_HINT(bench_bufs_get(&g.bufs, recv, n * ctx->elt_size), bench_dev_error());
    recv = bench_bufs_host(&g.bufs, recv);
    int64_t wrong = 0;
    if (g.coll->lossy_bound > 0) {
        double sq[2] = {0, 0}; /* squared error, squared exact value */
        for (size_t i = 0; i < n; i++) {
            const double want = bench_load_float(ctx->dtype, g.expected, i);
            const double d = bench_load_float(ctx->dtype, recv, i) - want;
            sq[0] += d * d;
            sq[1] += want * want;
        }
        BENCH_CHECK(loomAllReduce(sq, sq, 2, loomFloat64, loomSum, g.comm, NULL));
        g.rel_err = sq[1] > 0 ? sqrt(sq[0] / sq[1]) : sqrt(sq[0]);
        return !(g.rel_err <= g.coll->lossy_bound); /* NaN fails too */
    }
    if (n && memcmp(recv, g.expected, n * ctx->elt_size)) {
        for (size_t i = 0; i < n; i++)
            wrong += memcmp(recv + i * ctx->elt_size, g.expected + i * ctx->elt_size,
                            ctx->elt_size) != 0;
    }
    BENCH_CHECK(loomAllReduce(&wrong, &wrong, 1, loomInt64, loomSum, g.comm, NULL));
    return wrong;
}

static double combine_time(double sec)
{
    static const loomRedOp_t ops[] = {loomSum, loomSum, loomMin, loomMax};
    if (g_opt.average == 0) {
        BENCH_CHECK(loomBroadcast(&sec, &sec, 1, loomFloat64, 0, g.comm, NULL));
        return sec;
    }
    BENCH_CHECK(loomAllReduce(&sec, &sec, 1, loomFloat64, ops[g_opt.average], g.comm, NULL));
    return g_opt.average == 1 ? sec / g.nranks : sec;
}

/* nccl-tests' BenchTime: time iters x agg operations, then check -c times. */
static void bench_time(bench_ctx_t *ctx, int in_place)
{
    if (in_place && (g.coll->flags & BENCH_NO_INPLACE)) {
        print_body(0, 0, 0, 0, 0, 1);
        return;
    }
    wd_phase();
    if (g_opt.check)
        prepare_data(ctx, in_place, 99);
    start_op(ctx, in_place, 0);
    complete_ops();
    BENCH_CHECK(loomBarrier(g.comm, NULL));

    wd_phase();
    long long t0 = now_ns();
    for (int iter = 0; iter < g_opt.iters; iter++) {
        if (g_opt.agg_iters > 1)
            BENCH_CHECK(loomGroupStart());
        for (int a = 0; a < g_opt.agg_iters; a++)
            start_op(ctx, in_place, iter * g_opt.agg_iters + a);
        if (g_opt.agg_iters > 1)
            BENCH_CHECK(loomGroupEnd());
        if (g_opt.blocking == 1)
            BENCH_CHECK(loomBarrier(g.comm, NULL));
    }
    complete_ops();
    double sec = (double)(now_ns() - t0) * 1e-9 / ((double)g_opt.iters * g_opt.agg_iters);
    sec = combine_time(sec);

    double bytes, factor;
    g.coll->get_bw(ctx->counts.param_count, ctx->elt_size, g.nranks, &bytes, &factor);
    double algbw = bytes / 1.0e9 / sec;
    double busbw = algbw * factor;

    int64_t wrong = 0;
    g.rep++;
    for (int c = 0; c < g_opt.check && !wrong; c++) {
        wd_phase();
        wrong = check_data(ctx, in_place, ((uint64_t)g.rep << 16) + (uint64_t)c);
    }
    if (wrong)
        g.errors++;
    print_body(1, sec * 1.0e6, algbw, busbw, wrong, in_place);
    g.bw_sum += busbw;
    g.bw_count++;
}

static void setup_ctx(bench_ctx_t *ctx, size_t bytes)
{
    g.coll->get_counts(bytes / ctx->elt_size, ctx->elt_size, g.nranks, &ctx->counts);
}

/* Warm-up sizes: doubling from -b, as nccl-tests does. */
static size_t warm_next(size_t size)
{
    return size == 0 ? 1 : size > SIZE_MAX / 2 ? SIZE_MAX : size * 2;
}

/* The collective as loomCommPlan names it, from the table's name; -1 for
 * what it does not describe (Send/Recv, Echo). */
static int plan_collective(void)
{
    static const struct {
        const char *name;
        loomCollective_t coll;
    } map[] = {{"AllReduce", loomCollAllReduce},
               {"AllGather", loomCollAllGather},
               {"ReduceScatter", loomCollReduceScatter},
               {"Broadcast", loomCollBroadcast},
               {"Reduce", loomCollReduce},
               {"AlltoAll", loomCollAllToAll}}; /* nccl-tests' spelling, alltoall.c's name */
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(g.coll->name, map[i].name) == 0)
            return (int)map[i].coll;
    return -1;
}

/* -M 1: the algorithm this row's call runs and the model's predicted time,
 * after the measured columns (rank 0). */
static void print_plan(const bench_ctx_t *ctx)
{
    if (g.rank != 0)
        return;
    const int coll = plan_collective();
    const char *algo = "-";
    double us = -1;
    if (coll >= 0 && loomCommPlan(g.comm, (loomCollective_t)coll, ctx->counts.param_count,
                                  ctx->dtype, &algo, &us) != loomSuccess)
        algo = "?";
    char model[32] = "-";
    if (us >= 0)
        float_str(us, 9, model, sizeof(model));
    printf("  %-18s %9s", algo, model);
    if (g.json) {
        fprintf(g.json, ",\"algorithm\":");
        bench_json_str(g.json, algo);
        fprintf(g.json, ",\"model_us\":");
        if (us >= 0)
            bench_json_double(g.json, us);
        else
            fprintf(g.json, "null");
    }
}

/* nccl-tests' TimeTest: warm up every size, then one row per size. */
static void time_test(loomDataType_t dtype, int op, int root)
{
    bench_ctx_t ctx = {.rank = g.rank,
                       .nranks = g.nranks,
                       .dtype = dtype,
                       .elt_size = bench_type_size(dtype),
                       .op = (loomRedOp_t)op,
                       .root = root};
    BENCH_CHECK(loomBarrier(g.comm, NULL));
    for (size_t size = g_opt.min_bytes; size <= g_opt.max_bytes; size = warm_next(size)) {
        wd_phase();
        setup_ctx(&ctx, size);
        for (int iter = 0; iter < g_opt.warmup_iters; iter++)
            start_op(&ctx, 0, iter);
        complete_ops();
    }
    const char *op_name = (g.coll->flags & BENCH_REDUCES) ? bench_op_names[op] : "none";
    for (size_t size = g_opt.min_bytes; size <= g_opt.max_bytes;
         size = bench_next_size(&g_opt, size)) {
        setup_ctx(&ctx, size);
        size_t bytes = total_bytes(&ctx);
        if (g.rank == 0) {
            printf("%12zu  %12zu  %8s  %6s  %6i", bytes, ctx.counts.param_count,
                   bench_type_names[dtype], op_name, root);
            if (g.json) {
                fprintf(g.json, "%s{\"size\":%zu,\"count\":%zu,\"type\":", g.json_rows++ ? "," : "",
                        bytes, ctx.counts.param_count);
                bench_json_str(g.json, bench_type_names[dtype]);
                fprintf(g.json, ",\"redop\":");
                bench_json_str(g.json, op_name);
                fprintf(g.json, ",\"root\":%d,\"nranks\":%d", root, g.nranks);
                g.json_row_open = 1;
            }
        }
        bench_time(&ctx, 0);
        bench_time(&ctx, 1);
        if (g_opt.model)
            print_plan(&ctx);
        if (g.rank == 0) {
            printf("\n");
            if (g.json) {
                fprintf(g.json, ",\"actual_iterations\":%d,\"experiment_name\":", g_opt.iters);
                bench_json_str(g.json, g.coll->name);
                fprintf(g.json, "}");
                g.json_row_open = 0;
            }
        }
    }
}

// ---- Main ---------------------------------------------------------------------

static void open_json(int argc, char **argv, int version)
{
    if (!g_opt.json_path || g.rank != 0)
        return;
    g.json = fopen(g_opt.json_path, "w");
    if (!g.json) {
        printf("# skipping json output; %s not accessible\n", g_opt.json_path);
        return;
    }
    printf("# Writing JSON output to %s\n", g_opt.json_path);
    fprintf(g.json, "{\"version\":2,\"start_time\":");
    bench_json_now(g.json);
    fprintf(g.json, ",\"args\":[");
    for (int i = 0; i < argc; i++) {
        fprintf(g.json, i ? "," : "");
        bench_json_str(g.json, argv[i]);
    }
    fprintf(g.json, "],\"loom_version\":%d,", version);
}

int bench_main(int argc, char **argv, const bench_coll_t *coll)
{
    setlinebuf(stdout);
    g.coll = coll;
    g.prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    gethostname(g.host, sizeof(g.host) - 1);
    g.host[strcspn(g.host, ".")] = '\0';
    bench_opts_parse(argc, argv, g.prog, &g_opt);

    int version = 0;
    BENCH_CHECK(loomGetVersion(&version));
    start_device();
    init_comm();
    if (g_opt.root >= g.nranks && (coll->flags & BENCH_ROOTED))
        bench_die("-r takes a rank below the rank count, or all", "root %d is not a rank of %d",
                  g_opt.root, g.nranks);
    size_t bytes = g_opt.max_bytes + (size_t)g_opt.unalign * BENCH_PAD_BYTES;
    alloc_buffers(bytes);
    if (!g_opt.blocking && g_opt.device)
        BENCH_CHECK_HINT(bench_dev_stream_create(&g.stream), bench_dev_error());
    else if (!g_opt.blocking)
        BENCH_CHECK(loomStreamCreate(&g.stream));
    g.expected = alloc_buf(g_opt.max_bytes);
    open_json(argc, argv, version);
    print_header(version);
    if (g_opt.timeout_s > 0) {
        pthread_t wd;
        if (pthread_create(&wd, NULL, wd_main, NULL) == 0)
            pthread_detach(wd);
    }

    int type0 = g_opt.dtype < 0 ? 0 : g_opt.dtype;
    int type1 = g_opt.dtype < 0 ? loomNumTypes - 1 : g_opt.dtype;
    int reduces = coll->flags & BENCH_REDUCES;
    int op0 = !reduces ? loomNumOps : g_opt.op < 0 ? 0 : g_opt.op;
    int op1 = !reduces ? loomNumOps : g_opt.op < 0 ? loomNumOps - 1 : g_opt.op;
    int rooted = coll->flags & BENCH_ROOTED;
    int root0 = !rooted ? -1 : g_opt.root < 0 ? 0 : g_opt.root;
    int root1 = !rooted ? -1 : g_opt.root < 0 ? g.nranks - 1 : g_opt.root;
    for (int t = type0; t <= type1; t++)
        for (int op = op0; op <= op1; op++)
            for (int root = root0; root <= root1; root++)
                time_test((loomDataType_t)t, op, root);

    int errors = g.errors; /* wrong counts were summed over ranks: every rank agrees */
    double avg_bw = g.bw_count ? g.bw_sum / g.bw_count : 0.0;
    if (g.rank == 0) {
        printf("# %-20s : %d %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
        printf("# %-20s : %g \n", "Avg bus bandwidth", avg_bw);
        printf("#\n# Collective test concluded: %s\n", g.prog);
    }
    json_finish(NULL);
    fflush(stdout);
    /* Launchers stop every rank when one exits non-zero: let rank 0 finish printing first. */
    BENCH_CHECK(loomBarrier(g.comm, NULL));
    wd_disarm();
    if (g.stream && g_opt.device)
        BENCH_CHECK_HINT(bench_dev_stream_destroy(g.stream), bench_dev_error());
    else if (g.stream)
        BENCH_CHECK(loomStreamDestroy(g.stream));
    BENCH_CHECK(loomCommDestroy(g.comm));
    g.comm = NULL;
    BENCH_CHECK_HINT(bench_bufs_free(&g.bufs), bench_dev_error());
    free(g.expected);
    return errors ? EXIT_FAILURE : EXIT_SUCCESS;
}

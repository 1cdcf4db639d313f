/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf.c - the optimizer step of owner-shaped sharding (include/loom_shard.h) against
 * the FSDP2-style baseline that all-gathers each matrix's update and runs Newton-Schulz on
 * every rank (Rows, per matrix and per bucket) and against DDP (Replicated), on GPT-2 shaped
 * parameter lists. Per iteration: gradients filled from a (step, rank) seed (not timed), a
 * barrier, ReduceGrads, Step, GatherParams, each interval's slowest rank found afterwards (not
 * timed); medians and minima over the timed iterations, the CPU seconds of all ranks, the
 * bytes the counters saw checked against the closed forms, and the cost model's prediction
 * of the step. --predict-only projects to more ranks without communicating.
 * docs/PERFORMANCE.md, "Owner-shaped sharding", explains the columns.
 */
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "shard_perf.h"

int g_rank, g_nranks = 1;
loomComm_t g_comm;

void sp_check(loomResult_t res, const char *call)
{
    if (res == loomSuccess)
        return;
    fprintf(stderr, "shard_perf: rank %d: %s failed: %s / %s\n", g_rank, call,
            loomGetErrorString(res), loomGetLastError(g_comm));
    if (g_comm)
        loomCommAbort(g_comm);
    exit(EXIT_FAILURE);
}

void *sp_alloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        bench_die("a smaller --model", "cannot allocate %zu x %zu bytes", n, size);
    return p;
}

double sp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double sp_min(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* splitmix64: the gradients of (seed, step, rank), uniform in [-0.5, 0.5). */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(float *v, size_t n, uint64_t seed, float scale)
{
    uint64_t s = mix(seed);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * ((float)(mix(s + i) >> 40) * 0x1p-24f - 0.5f);
}

/* OpenBLAS reads its thread count when the library loads, before main, so a process that
 * finds it unset sets it to one thread and starts itself again. */
static void pin_blas_threads(char **argv)
{
    if (getenv("OPENBLAS_NUM_THREADS") != NULL)
        return;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (getenv("OMP_NUM_THREADS") == NULL)
        setenv("OMP_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "shard_perf: cannot restart with OPENBLAS_NUM_THREADS=1, running as is\n");
}

typedef struct sp_bufs {
    float *params, *grads, *state;
    size_t n;
} sp_bufs_t;

/* One iteration of the protocol; times[4]: ReduceGrads, Step, minus GatherParams and the
 * whole iteration on this rank, in seconds (GatherParams negated, so that the MAX over ranks
 * finds its shortest: the rank that arrived last, whose time holds no wait for a slower
 * step); returns this rank's CPU seconds of it. */
static double iteration(const sp_opts_t *o, loomShardPlan_t plan, sp_bufs_t *b, int it,
                        double *times)
{
    fill(b->grads, b->n, o->seed ^ ((uint64_t)it << 32) ^ (uint64_t)g_rank, 1.0f);
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    cfg.step = it + 1;
    const unsigned full = LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL;
    SP_CHECK(loomBarrier(g_comm, NULL));
    double c0 = cpu_seconds(), t0 = sp_now();
    SP_CHECK(
        loomShardReduceGrads(plan, -1, b->grads, b->grads, loomFloat32, loomAvg, g_comm, NULL));
    double t1 = sp_now();
    SP_CHECK(
        loomShardStep(plan, g_rank, -1, b->params, b->grads, b->state, full, &cfg, g_comm, NULL));
    double t2 = sp_now();
    SP_CHECK(loomShardGatherParams(plan, -1, b->params, b->params, loomFloat32, g_comm, NULL));
    double t3 = sp_now();
    times[0] = t1 - t0;
    times[1] = t2 - t1;
    times[2] = t2 - t3;
    times[3] = t3 - t0;
    return cpu_seconds() - c0;
}

/* One layout (and balance) on every rank: warm-up, timed iterations, the slowest rank's
 * intervals, the counters' bytes and the prediction into *x. */
static void run_layout(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc, int layout,
                       int balance, sp_result_t *x)
{
    loomShardPlan_t plan = sp_plan(m, g_nranks, layout, balance, o->deterministic);
    SP_CHECK(loomShardPlanVerify(plan, g_comm, NULL));
    loomShardStats_t st;
    SP_CHECK(loomShardStats(plan, &st));
    sp_machine_t here = *mc; /* the rates while this layout runs: the mean of before and after */
    sp_probe_rates(&here, 3);
    sp_bufs_t b = {.n = st.total_elems};
    b.params = sp_alloc(b.n, sizeof(float));
    b.grads = sp_alloc(b.n, sizeof(float));
    b.state = sp_alloc(loomShardStateElems(plan, g_rank), sizeof(float));
    fill(b.params, b.n, o->seed + 0x5eed, 0.04f);

    *x = (sp_result_t){.layout = layout, .balance = layout == LAY_OWNER ? balance : -1};
    double *all = sp_alloc((size_t)o->iters * 4, sizeof(double));
    double cpu = 0, t[4];
    loomShardCounters_t c;
    for (int it = 0; it < o->warmup + o->iters; it++) {
        if (it == o->warmup)
            SP_CHECK(loomShardGetCounters(plan, &c, 1));
        double ci = iteration(o, plan, &b, it, t);
        if (it < o->warmup)
            continue;
        cpu += ci;
        SP_CHECK(loomAllReduce(t, all + (size_t)(it - o->warmup) * 4, 4, loomFloat64, loomMax,
                               g_comm, NULL));
    }
    SP_CHECK(loomShardGetCounters(plan, &c, 0));
    sp_machine_t after = *mc;
    sp_probe_rates(&after, 3);
    here.ns_gmacs = 0.5 * (here.ns_gmacs + after.ns_gmacs);
    here.elem_ns = 0.5 * (here.elem_ns + after.elem_ns);
    here.ns_gmacs_cpu = 0.5 * (here.ns_gmacs_cpu + after.ns_gmacs_cpu);
    here.elem_ns_cpu = 0.5 * (here.elem_ns_cpu + after.elem_ns_cpu);

    double *col = sp_alloc((size_t)o->iters * 3, sizeof(double));
    for (int i = 0; i < o->iters; i++) {
        const double *r = all + (size_t)i * 4;
        col[i] = r[1] * 1e3;
        col[o->iters + i] = (r[0] - r[2]) * 1e3;
        col[2 * o->iters + i] = r[3] * 1e3;
    }
    x->step_ms = bench_median(col, o->iters);
    x->step_min = sp_min(col, o->iters);
    x->sync_ms = bench_median(col + o->iters, o->iters);
    x->sync_min = sp_min(col + o->iters, o->iters);
    x->total_ms = bench_median(col + 2 * o->iters, o->iters);
    x->total_min = sp_min(col + 2 * o->iters, o->iters);
    x->step_colls = (double)c.step_collectives / o->iters;
    double sums[2] = {cpu / o->iters, (double)c.bytes_sent / o->iters};
    SP_CHECK(loomAllReduce(sums, sums, 2, loomFloat64, loomSum, g_comm, NULL));
    x->cpu_s = sums[0];
    sp_plan_work(plan, g_nranks, x);
    sp_check_bytes(plan, layout, sums[1], x);
    sp_predict(&here, m, plan, layout, g_nranks, mc->cores, 0, x);

    free(col);
    free(all);
    free(b.params);
    free(b.grads);
    free(b.state);
    SP_CHECK(loomShardPlanDestroy(plan));
}

/* Rows variants first: the ratios of the others are to the better of them. */
static int run_all(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc,
                   sp_result_t *res)
{
    static const int order[] = {LAY_ROWS, LAY_ROWS_BUCKETED, LAY_OWNER, LAY_REPLICATED};
    int nres = 0;
    for (int i = 0; i < NUM_LAYOUTS; i++) {
        int lay = order[i];
        if (!(o->layouts & (1u << lay)))
            continue;
        for (int bal = 0; bal < NUM_BALANCES; bal++) {
            if (lay == LAY_OWNER ? !(o->balances & (1u << bal)) : bal > 0)
                continue;
            run_layout(o, m, mc, lay, bal, &res[nres++]);
        }
    }
    return nres;
}

int main(int argc, char **argv)
{
    pin_blas_threads(argv);
    sp_opts_t o;
    sp_parse(argc, argv, &o);
    sp_model_t m;
    sp_model_build(o.model, &m);
    sp_machine_t mc = {0};
    if (o.predict_only) {
        sp_probe(&mc);
        sp_print_header(&o, &m, &mc);
        sp_project(&o, &m, &mc);
        sp_model_free(&m);
        return EXIT_SUCCESS;
    }
    const char *hint = NULL; /* the launcher's variables: loomrun -n N sets them */
    SP_CHECK(bench_comm_create(&g_comm, &hint));
    SP_CHECK(loomCommUserRank(g_comm, &g_rank));
    SP_CHECK(loomCommCount(g_comm, &g_nranks));
    sp_probe(&mc);
    if (g_rank == 0)
        sp_print_header(&o, &m, &mc);

    sp_result_t res[NUM_LAYOUTS + NUM_BALANCES];
    int nres = run_all(&o, &m, &mc, res);
    sp_ratios(res, nres);
    int bad = 0;
    for (int i = 0; i < nres; i++) {
        if (g_rank == 0)
            sp_print_row(&res[i], g_nranks);
        bad += !res[i].bytes_ok;
    }
    if (g_rank == 0)
        sp_print_cpu(res, nres);
    if (g_rank == 0 && o.json)
        sp_write_json(&o, &m, &mc, res, nres);
    if (g_rank == 0 && bad)
        fprintf(stderr,
                "shard_perf: BYTES MISMATCH: %d row(s) sent other bytes than the closed forms "
                "(see the lines above)\n",
                bad);
    sp_model_free(&m);
    /* A rank that exits non-zero makes loomrun stop the others: not before rank 0 has written. */
    SP_CHECK(loomBarrier(g_comm, NULL));
    SP_CHECK(loomCommDestroy(g_comm));
    return bad ? EXIT_FAILURE : EXIT_SUCCESS;
}

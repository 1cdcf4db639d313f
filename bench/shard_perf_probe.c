/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf_probe.c - what shard_perf's cost model needs to know about the machine, measured
 * at start: R, the single-core rate of loom's Newton-Schulz (its sgemm calls) on a shape no
 * list uses, the single-core AdamW time per element (memory bound), the CPUs the ranks run on
 * and the CPU's name. Ranks probe in rounds of one rank per CPU, so that an oversubscribed run
 * measures one core's rate, and all ranks then take the slowest rank's rates.
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "shard_perf.h"

#define PROBE_ROWS  256
#define PROBE_COLS  1024
#define PROBE_STEPS 5
#define PROBE_ELEMS ((size_t)1 << 22)
#define PROBE_REPS  5
#define MAX_CPUS    1024

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs fn reps + 1 times (reps <= PROBE_REPS); t[0] and t[1] get the medians of the last reps
 * runs' wall and CPU seconds. Medians, as the steps they predict are, so that a machine busy
 * with other work weighs alike in both; the CPU seconds do not count the other work. */
static void time_runs(void (*fn)(void *, int), void *arg, int reps, double *t)
{
    double wall[PROBE_REPS + 1], cpu[PROBE_REPS + 1];
    for (int r = 0; r <= reps; r++) {
        double w0 = sp_now(), c0 = cpu_now();
        fn(arg, r);
        wall[r] = sp_now() - w0;
        cpu[r] = cpu_now() - c0;
    }
    t[0] = bench_median(wall + 1, reps);
    t[1] = bench_median(cpu + 1, reps);
}

typedef struct ns_probe {
    float *in, *out, *work;
} ns_probe_t;

static void run_ns(void *arg, int r)
{
    (void)r;
    ns_probe_t *p = arg;
    SP_CHECK(
        loomNewtonSchulz(p->out, p->in, PROBE_ROWS, PROBE_COLS, PROBE_STEPS, NULL, 1e-7f, p->work));
}

/* Newton-Schulz on PROBE_ROWS x PROBE_COLS: gmacs[0] per wall second, [1] per CPU second. */
static void probe_ns(int reps, double *gmacs)
{
    const size_t n = (size_t)PROBE_ROWS * PROBE_COLS;
    ns_probe_t p = {sp_alloc(n, sizeof(float)), sp_alloc(n, sizeof(float)),
                    sp_alloc(loomNewtonSchulzWorkspace(PROBE_ROWS, PROBE_COLS), sizeof(float))};
    for (size_t i = 0; i < n; i++)
        p.in[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    double t[2];
    time_runs(run_ns, &p, reps, t);
    free(p.in);
    free(p.out);
    free(p.work);
    const double s = PROBE_ROWS, l = PROBE_COLS, macs = PROBE_STEPS * s * s * (2 * l + s);
    gmacs[0] = macs / t[0] / 1e9;
    gmacs[1] = macs / t[1] / 1e9;
}

static void run_adamw(void *arg, int r)
{
    float *p = arg, *g = p + PROBE_ELEMS, *m = g + PROBE_ELEMS, *v = m + PROBE_ELEMS;
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    cfg.step = r + 1;
    SP_CHECK(loomAdamWUpdate(p, g, m, v, PROBE_ELEMS, &cfg));
}

/* AdamW on PROBE_ELEMS elements: ns[0] wall and ns[1] CPU nanoseconds per element. */
static void probe_adamw(int reps, double *ns)
{
    float *p = sp_alloc(PROBE_ELEMS * 4, sizeof(float));
    for (size_t i = 0; i < PROBE_ELEMS; i++)
        p[PROBE_ELEMS + i] = (float)(i % 97) * 1e-3f;
    time_runs(run_adamw, p, reps, ns);
    free(p);
    ns[0] *= 1e9 / (double)PROBE_ELEMS;
    ns[1] *= 1e9 / (double)PROBE_ELEMS;
}

/* CPUs any rank may run on: the union of the ranks' affinities (loomrun pins each rank to
 * one CPU; unpinned ranks each see them all). */
static int count_cores(void)
{
    unsigned char mask[MAX_CPUS] = {0};
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int i = 0; i < MAX_CPUS && i < CPU_SETSIZE; i++)
            mask[i] = CPU_ISSET(i, &set) ? 1 : 0;
    } else {
        mask[0] = 1;
    }
    if (g_comm)
        SP_CHECK(loomAllReduce(mask, mask, MAX_CPUS, loomUint8, loomMax, g_comm, NULL));
    int n = 0;
    for (int i = 0; i < MAX_CPUS; i++)
        n += mask[i];
    return n > 0 ? n : 1;
}

void sp_probe_rates(sp_machine_t *mc, int reps)
{
    /* GMAC/s wall and CPU, then minus ns per element wall and CPU: MIN takes the slowest rank */
    double rate[4] = {0, 0, 0, 0};
    for (int round = 0; round * mc->cores < g_nranks; round++) {
        if (g_rank / mc->cores == round) {
            probe_ns(reps, rate);
            probe_adamw(reps, rate + 2);
            rate[2] = -rate[2];
            rate[3] = -rate[3];
        }
        if (g_comm)
            SP_CHECK(loomBarrier(g_comm, NULL));
    }
    if (g_comm)
        SP_CHECK(loomAllReduce(rate, rate, 4, loomFloat64, loomMin, g_comm, NULL));
    mc->ns_gmacs = rate[0];
    mc->ns_gmacs_cpu = rate[1];
    mc->elem_ns = -rate[2];
    mc->elem_ns_cpu = -rate[3];
}

void sp_probe(sp_machine_t *mc)
{
    mc->ranks = g_nranks;
    mc->cores = count_cores();
    bench_cpu_model(mc->cpu, sizeof(mc->cpu));
    sp_probe_rates(mc, PROBE_REPS);
}

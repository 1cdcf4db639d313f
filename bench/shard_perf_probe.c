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

#include "shard_perf.h"

#define PROBE_ROWS  256
#define PROBE_COLS  1024
#define PROBE_STEPS 5
#define PROBE_ELEMS ((size_t)1 << 22)
#define PROBE_REPS  5
#define MAX_CPUS    1024

/* The median of reps (<= PROBE_REPS) Newton-Schulz runs, after one warm-up, in GMAC/s: the median,
 * as the steps it predicts are, so that a machine busy with other work weighs alike in both. */
static double probe_ns(int reps)
{
    const size_t n = (size_t)PROBE_ROWS * PROBE_COLS;
    float *in = sp_alloc(n, sizeof(float)), *out = sp_alloc(n, sizeof(float));
    float *work = sp_alloc(loomNewtonSchulzWorkspace(PROBE_ROWS, PROBE_COLS), sizeof(float));
    for (size_t i = 0; i < n; i++)
        in[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    double t[PROBE_REPS + 1];
    for (int r = 0; r <= reps; r++) {
        double t0 = sp_now();
        SP_CHECK(loomNewtonSchulz(out, in, PROBE_ROWS, PROBE_COLS, PROBE_STEPS, NULL, 1e-7f, work));
        t[r] = sp_now() - t0;
    }
    free(in);
    free(out);
    free(work);
    const double s = PROBE_ROWS, l = PROBE_COLS;
    return PROBE_STEPS * s * s * (2 * l + s) / sp_median(t + 1, reps) / 1e9;
}

/* The median of reps AdamW updates of PROBE_ELEMS elements, in ns per element. */
static double probe_adamw(int reps)
{
    float *p = sp_alloc(PROBE_ELEMS * 4, sizeof(float));
    float *g = p + PROBE_ELEMS, *m = g + PROBE_ELEMS, *v = m + PROBE_ELEMS;
    for (size_t i = 0; i < PROBE_ELEMS; i++)
        g[i] = (float)(i % 97) * 1e-3f;
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    double t[PROBE_REPS + 1];
    for (int r = 0; r <= reps; r++) {
        cfg.step = r + 1;
        double t0 = sp_now();
        SP_CHECK(loomAdamWUpdate(p, g, m, v, PROBE_ELEMS, &cfg));
        t[r] = sp_now() - t0;
    }
    free(p);
    return sp_median(t + 1, reps) * 1e9 / (double)PROBE_ELEMS;
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

void sp_describe_cpu(sp_machine_t *mc)
{
    snprintf(mc->cpu, sizeof(mc->cpu), "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || colon == NULL)
            continue;
        colon += 1 + strspn(colon + 1, " \t");
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(mc->cpu, sizeof(mc->cpu), "%s", colon);
        break;
    }
    fclose(f);
}

void sp_probe_rates(sp_machine_t *mc, int reps)
{
    double rate[2] = {0, 0}; /* GMAC/s and -ns per element, so that MIN takes the slowest */
    for (int round = 0; round * mc->cores < g_nranks; round++) {
        if (g_rank / mc->cores == round) {
            rate[0] = probe_ns(reps);
            rate[1] = -probe_adamw(reps);
        }
        if (g_comm)
            SP_CHECK(loomBarrier(g_comm, NULL));
    }
    if (g_comm)
        SP_CHECK(loomAllReduce(rate, rate, 2, loomFloat64, loomMin, g_comm, NULL));
    mc->ns_gmacs = rate[0];
    mc->elem_ns = -rate[1];
}

void sp_probe(sp_machine_t *mc)
{
    mc->ranks = g_nranks;
    mc->cores = count_cores();
    sp_describe_cpu(mc);
    sp_probe_rates(mc, PROBE_REPS);
}

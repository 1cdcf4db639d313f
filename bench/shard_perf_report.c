/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf_report.c - shard_perf's numbers beyond the clock: each rank's Newton-Schulz work
 * from the plan, the bytes per step from the closed forms (checked against the counters), the
 * cost model's step time, the ratios to the better Rows variant, the table and the
 * --predict-only projection.
 *
 * The cost model: a rank's step alone on a core takes its Newton-Schulz multiply-adds / R plus
 * its element-wise elements (its shard; every element for Replicated) x the AdamW time per
 * element; ranks pinned to one core (loomrun puts rank r on CPU r mod C) share it, so a core's
 * time is the sum over its ranks and the step takes the busiest core's time. Rows adds its
 * in-step all-gathers: loomCommPlan's predicted time (on one host the shared-memory variant's,
 * from the arena probe), else (one rank) the time of the same AllGather measured here.
 */
#include <string.h>

#include "shard_perf.h"

void sp_plan_work(loomShardPlan_t plan, int nranks, sp_result_t *x)
{
    double max = 0, sum = 0;
    for (int r = 0; r < nranks; r++) {
        loomShardRankInfo_t ri;
        SP_CHECK(loomShardRankInfo(plan, r, &ri));
        max = ri.ns_cost > max ? ri.ns_cost : max;
        sum += ri.ns_cost;
    }
    x->ns_gmac_max = max / 1e9;
    x->imb = sum > 0 ? max / (sum / nranks) : 1.0;
}

/* The in-step all-gathers' counts (elements per rank, padded): one per matrix, or one per
 * bucket summing its matrices. Returns how many, at most m->nparams. */
static int gather_counts(const sp_model_t *m, int nranks, int bucketed, size_t *counts)
{
    int n = 0, last_bucket = -1;
    for (int i = 0; i < m->nparams; i++) {
        const loomShardParam_t *p = &m->params[i];
        if (p->kind != loomShardMatrix)
            continue;
        size_t chunk = (p->rows + (size_t)nranks - 1) / (size_t)nranks;
        if (!bucketed || p->bucket != last_bucket)
            counts[n++] = 0;
        counts[n - 1] += chunk * p->cols;
        last_bucket = p->bucket;
    }
    return n;
}

/* A measured AllGather of count elements per rank: the slowest rank's best of three. */
static double measure_gather(size_t count)
{
    float *buf = sp_alloc(count * (size_t)g_nranks, sizeof(float));
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        SP_CHECK(loomBarrier(g_comm, NULL));
        double t0 = sp_now();
        SP_CHECK(
            loomAllGather(buf + count * (size_t)g_rank, buf, count, loomFloat32, g_comm, NULL));
        double t = sp_now() - t0;
        best = t < best ? t : best;
    }
    SP_CHECK(loomAllReduce(&best, &best, 1, loomFloat64, loomMax, g_comm, NULL));
    free(buf);
    return best;
}

/* Seconds of one in-step all-gather of count elements per rank, and where they come from. */
static double gather_seconds(size_t count, int nranks, double proj_gbps, const char **src)
{
    if (g_comm == NULL) {
        *src = proj_gbps > 0 ? "link GB/s" : "not counted";
        return proj_gbps > 0 ? (double)(nranks - 1) * (double)count * 4 / (proj_gbps * 1e9) : 0;
    }
    double us = -1;
    SP_CHECK(loomCommPlan(g_comm, loomCollAllGather, count, loomFloat32, NULL, &us));
    if (us >= 0) {
        *src = "loomCommPlan";
        return us * 1e-6;
    }
    *src = "measured AllGather";
    return measure_gather(count);
}

void sp_predict(const sp_machine_t *mc, const sp_model_t *m, loomShardPlan_t plan, int layout,
                int nranks, int cores, double proj_gbps, sp_result_t *x)
{
    loomShardStats_t st;
    SP_CHECK(loomShardStats(plan, &st));
    double *ns = sp_alloc((size_t)cores * 2, sizeof(double)), *el = ns + cores;
    x->pred_cpu_s = 0;
    for (int r = 0; r < nranks; r++) {
        loomShardRankInfo_t ri;
        SP_CHECK(loomShardRankInfo(plan, r, &ri));
        size_t elems = layout == LAY_REPLICATED ? st.total_elems : ri.shard_elems;
        ns[r % cores] += ri.ns_cost / (mc->ns_gmacs * 1e9);
        el[r % cores] += (double)elems * mc->elem_ns * 1e-9;
        x->pred_cpu_s +=
            ri.ns_cost / (mc->ns_gmacs_cpu * 1e9) + (double)elems * mc->elem_ns_cpu * 1e-9;
    }
    double busiest = 0;
    for (int c = 0; c < cores; c++) {
        if (ns[c] + el[c] > busiest) {
            busiest = ns[c] + el[c];
            x->pred_ns_ms = ns[c] * 1e3;
            x->pred_elem_ms = el[c] * 1e3;
        }
    }
    free(ns);
    x->pred_gather_ms = 0;
    x->gather_src = "none";
    if (layout == LAY_ROWS || layout == LAY_ROWS_BUCKETED) {
        size_t *counts = sp_alloc((size_t)m->nparams, sizeof(size_t));
        int n = gather_counts(m, nranks, layout == LAY_ROWS_BUCKETED, counts);
        for (int i = 0; i < n; i++)
            x->pred_gather_ms += gather_seconds(counts[i], nranks, proj_gbps, &x->gather_src) * 1e3;
        free(counts);
    }
    x->pred_step_ms = busiest * 1e3 + x->pred_gather_ms;
    x->ns_gmacs = mc->ns_gmacs;
    x->elem_ns = mc->elem_ns;
    x->ns_gmacs_cpu = mc->ns_gmacs_cpu;
    x->elem_ns_cpu = mc->elem_ns_cpu;
}

/* The bytes all ranks send per step, summed, by the closed forms: 2(P-1)N x 4 for Owner and
 * Replicated, (P-1)(2 N_pad + N_M,pad) x 4 for Rows. Compares them with what the counters
 * saw (bytes_sum) and with the plan's own step_bytes_per_rank; prints any difference. */
int sp_check_bytes(loomShardPlan_t plan, int layout, double bytes_sum, sp_result_t *x)
{
    loomShardStats_t st;
    SP_CHECK(loomShardStats(plan, &st));
    const double P = st.nranks;
    double model =
        layout == LAY_OWNER || layout == LAY_REPLICATED
            ? 2 * (P - 1) * (double)st.total_elems * 4
            : (P - 1) * (2 * (double)st.padded_elems + (double)st.padded_matrix_elems) * 4;
    double stats_sum = st.step_bytes_per_rank * P;
    x->bytes_rank = bytes_sum / P;
    x->bytes_model = model / P;
    x->bytes_ok = bytes_sum == model && stats_sum >= model - 1e-6 * model &&
                  stats_sum <= model + 1e-6 * model;
    if (!x->bytes_ok && g_rank == 0)
        fprintf(stderr,
                "shard_perf: BYTES MISMATCH (%s, %d ranks): the counters saw %.0f bytes per step "
                "over all ranks, the closed form gives %.0f, loomShardStats %.0f\n",
                k_layout_names[layout], st.nranks, bytes_sum, model, stats_sum);
    return x->bytes_ok;
}

void sp_ratios(sp_result_t *res, int nres)
{
    double step = 0, total = 0;
    for (int i = 0; i < nres; i++) {
        if (res[i].layout != LAY_ROWS && res[i].layout != LAY_ROWS_BUCKETED)
            continue;
        double s = res[i].step_ms > 0 ? res[i].step_ms : res[i].pred_step_ms;
        step = step == 0 || s < step ? s : step;
        total = total == 0 || res[i].total_ms < total ? res[i].total_ms : total;
    }
    for (int i = 0; i < nres; i++) {
        double s = res[i].step_ms > 0 ? res[i].step_ms : res[i].pred_step_ms;
        res[i].step_x = step > 0 && s > 0 ? step / s : 0;
        res[i].total_x = total > 0 && res[i].total_ms > 0 ? total / res[i].total_ms : 0;
    }
}

static const char *balance_name(const sp_result_t *x)
{
    return x->balance >= 0 ? k_balance_names[x->balance] : "-";
}

static const char *env_or(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : "unset";
}

void sp_print_header(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc)
{
    loomShardPlan_t one = sp_plan(m, 1, LAY_OWNER, loomShardBalanceNsCost, 0);
    loomShardStats_t st;
    SP_CHECK(loomShardStats(one, &st));
    SP_CHECK(loomShardPlanDestroy(one));
    int nmat = 0;
    for (int i = 0; i < m->nparams; i++)
        nmat += m->params[i].kind == loomShardMatrix;
    printf("# shard_perf: %s (L%d C%zu V%zu T%zu, tied embedding): %d matrices of %.2fM "
           "elements, %.2fM element-wise, %d buckets; Newton-Schulz %.1f GMAC per step (5 "
           "steps)\n",
           m->name, m->layers, m->C, m->V, m->T, nmat, (double)st.matrix_elems / 1e6,
           (double)st.elementwise_elems / 1e6, st.nbuckets, st.cost_total / 1e9);
    if (o->predict_only)
        printf("# CPU: %s, one core of it probed; the projection gives each rank a core", mc->cpu);
    else
        printf("# CPU: %s; %d core(s) for %d rank(s)", mc->cpu, mc->cores, mc->ranks);
    if (!o->predict_only && mc->ranks > mc->cores)
        printf(": %.1fx oversubscribed, ranks share cores, so times measure work and the "
               "predictions add up the ranks of each core",
               (double)mc->ranks / mc->cores);
    printf("\n# R = %.2f GMAC/s (loomNewtonSchulz 256x1024 on one core, median of 5, slowest "
           "rank; %.2f per CPU second); AdamW %.3f ns/element; OPENBLAS_NUM_THREADS=%s, "
           "OPENBLAS_CORETYPE=%s\n",
           mc->ns_gmacs, mc->ns_gmacs_cpu, mc->elem_ns, env_or("OPENBLAS_NUM_THREADS"),
           env_or("OPENBLAS_CORETYPE"));
    if (!o->predict_only)
        printf("# pred_step_ms uses the rates probed again before and after each row (their "
               "mean; -J has them)\n");
    if (!o->predict_only)
        printf("# %d warm-up and %d timed steps, medians; step and total: the slowest rank's; "
               "sync: the slowest ReduceGrads + GatherParams as the last rank to arrive saw it; "
               "cpu_s: all ranks' CPU seconds per step; deterministic %d\n"
               "# %5s %13s %10s %9s %9s %9s %7s %11s %5s %12s %6s %7s %12s\n",
               o->warmup, o->iters, o->deterministic, "ranks", "layout", "balance", "step_ms",
               "sync_ms", "total_ms", "cpu_s", "ns_gmac_max", "imb", "bytes_rank", "step_x",
               "total_x", "pred_step_ms");
    fflush(stdout);
}

void sp_print_row(const sp_result_t *x, int nranks)
{
    printf("  %5d %13s %10s %9.1f %9.1f %9.1f %7.3f %11.2f %5.2f %12.0f %6.2f %7.2f %12.1f\n",
           nranks, k_layout_names[x->layout], balance_name(x), x->step_ms, x->sync_ms, x->total_ms,
           x->cpu_s, x->ns_gmac_max, x->imb, x->bytes_rank, x->step_x, x->total_x, x->pred_step_ms);
    fflush(stdout);
}

/* The cost model in CPU seconds, which other work on the machine does not inflate: all ranks'
 * predicted compute against their measured CPU seconds (which also hold the collectives'). */
void sp_print_cpu(const sp_result_t *res, int nres)
{
    printf("# the cost model in CPU seconds per step, all ranks (compute only; cpu_s also holds "
           "the collectives')\n# %13s %10s %10s %7s %9s\n",
           "layout", "balance", "pred_cpu_s", "cpu_s", "meas/pred");
    for (int i = 0; i < nres; i++)
        printf("  %13s %10s %10.3f %7.3f %9.2f\n", k_layout_names[res[i].layout],
               balance_name(&res[i]), res[i].pred_cpu_s, res[i].cpu_s,
               res[i].pred_cpu_s > 0 ? res[i].cpu_s / res[i].pred_cpu_s : 0.0);
}

void sp_project(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc)
{
    /* Each rank has a core to itself: the rates per CPU second, which other work here leaves. */
    sp_machine_t alone = *mc;
    alone.ns_gmacs = mc->ns_gmacs_cpu;
    alone.elem_ns = mc->elem_ns_cpu;
    sp_result_t res[NUM_LAYOUTS + NUM_BALANCES];
    int nres = 0;
    for (int lay = 0; lay < NUM_LAYOUTS; lay++) {
        for (int bal = 0; bal < NUM_BALANCES; bal++) {
            if (!(o->layouts & (1u << lay)) ||
                (lay == LAY_OWNER ? !(o->balances & (1u << bal)) : bal > 0))
                continue;
            sp_result_t *x = &res[nres++];
            *x = (sp_result_t){.layout = lay, .balance = lay == LAY_OWNER ? bal : -1};
            loomShardPlan_t plan = sp_plan(m, o->ranks, lay, bal, o->deterministic);
            loomShardStats_t st;
            SP_CHECK(loomShardStats(plan, &st));
            sp_plan_work(plan, o->ranks, x);
            sp_predict(&alone, m, plan, lay, o->ranks, o->ranks, o->proj_gbps, x);
            x->bytes_ok = 1;
            x->bytes_model = st.step_bytes_per_rank;
            SP_CHECK(loomShardPlanDestroy(plan));
        }
    }
    sp_ratios(res, nres);
    printf("# PROJECTION (no communication, nothing timed): %s on %d ranks with one core each, "
           "from the plan and the rates per CPU second above; Rows' in-step gather %s\n"
           "# %5s %13s %10s %11s %5s %12s %10s %10s %10s %12s %7s\n",
           m->name, o->ranks,
           o->proj_gbps > 0 ? "at --proj-gbps" : "left out (--proj-gbps adds it)", "ranks",
           "layout", "balance", "ns_gmac_max", "imb", "bytes_rank", "ns_ms", "elem_ms", "gather_ms",
           "pred_step_ms", "step_x");
    for (int i = 0; i < nres; i++) {
        const sp_result_t *x = &res[i];
        printf("  %5d %13s %10s %11.2f %5.2f %12.0f %10.1f %10.1f %10.1f %12.1f %7.2f  "
               "projection\n",
               o->ranks, k_layout_names[x->layout], balance_name(x), x->ns_gmac_max, x->imb,
               x->bytes_model, x->pred_ns_ms, x->pred_elem_ms, x->pred_gather_ms, x->pred_step_ms,
               x->step_x);
    }
    if (o->json)
        sp_write_json(o, m, mc, res, nres);
}

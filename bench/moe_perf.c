/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf.c - MoE dispatch and combine (include/loom_moe.h) measured per step: layout, dispatch
 * and combine times, remote rows, local hit rate, wire bytes and the busiest rank's rows, for
 * four modes run in one process on the same routing: naive (one row per (token, expert),
 * contiguous placement: the baseline of every ratio), dedup (one row per (token, rank),
 * contiguous), dedup+place (dedup under a placement learned on the first half of the routing
 * batches, all modes being measured on the second half) and dedup+place+reorder (dedup+place
 * with the tokens re-ordered toward their experts' ranks, predicted from the layer before by
 * an affinity learned on the first half). Beside each measured time it prints
 * the cost model's prediction of the step's exchanges (moe_exchange.c) and, for generated
 * routing, a projection of each mode to 16-64 ranks from its measured time per row; with
 * --exchange it writes naive mode's bytes per pair of ranks for the MPI_Alltoallv replay
 * (bench/peers/mpi_alltoallv_bench.c). Routing comes from the generators of src/moe/moe_gen.h
 * or an LMTR v1 trace (src/moe/moe_trace.h), so this program links the library's modules
 * statically, as the MoE tests do. docs/moe.md, "Benchmark", explains the columns.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "moe_perf.h"

int g_rank, g_nranks;
loomComm_t g_comm;

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        bench_die("lower -t, -d or --batches", "cannot allocate %zu x %zu bytes", n, size);
    return p;
}

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

// ---- One mode ---------------------------------------------------------------------------

typedef struct bufs {
    void *x, *y, *recv, *out;
    float *w;
    size_t recv_cap; /* slots recv and out hold */
    int64_t *ecount, *eoffset;
    const int32_t *src; /* the batch's count_wrong() sources, or NULL */
} bufs_t;

static void ensure_slots(bufs_t *b, size_t slots, size_t row_bytes)
{
    if (slots <= b->recv_cap)
        return;
    free(b->recv);
    free(b->out);
    b->recv = xcalloc(slots, row_bytes);
    b->out = xcalloc(slots, row_bytes);
    b->recv_cap = slots;
}

/* all[iters][NPH]: each step's phases on this rank, then iters more of scratch. med[NPH + 3]:
 * the medians of the phases' slowest rank, of their sum, of dispatch + combine and of the
 * re-ordering's two. Stragglers set the pace: each phase's time is its slowest rank's. */
void phase_medians(double *all, int iters, double *med)
{
    CHECK(loomAllReduce(all, all, (size_t)iters * NPH, loomFloat64, loomMax, g_comm, NULL));
    double *col = all + (size_t)iters * NPH;
    for (int p = 0; p < NPH + 3; p++) {
        for (int i = 0; i < iters; i++) {
            const double *t = all + (size_t)i * NPH;
            double dc = t[1] + t[2], re = t[3] + t[4];
            col[i] = p < NPH ? t[p] : p == NPH ? t[0] + dc + re : p == NPH + 1 ? dc : re;
        }
        med[p] = bench_median(col, iters);
    }
}

/* One step on batch b: layout, dispatch, the experts (only when checking), combine; returns
 * the wrong elements of y when checking. times[0..2] receive each phase's microseconds. */
static long long step(const opts_t *o, loomMoePlan_t plan, const routing_t *r, int b, size_t H,
                      const int32_t *expert_rank, bufs_t *bf, int check, double *times)
{
    size_t es = bench_type_size(o->dtype), T = r->ntok[b];
    const int32_t *topk = r->topk + r->off[b] * (size_t)r->top_k;
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = bf->ecount;
    info.expert_offset = bf->eoffset;
    loomMoeHandle_t h = NULL;
    double t0 = now_us();
    CHECK(loomMoeLayout(plan, topk, bf->w, T, &h, &info));
    double t1 = now_us();
    ensure_slots(bf, info.recv_slots, H * es);
    CHECK(loomMoeDispatch(h, bf->x, bf->recv));
    double t2 = now_us();
    if (check)
        run_experts(o->dtype, H, expert_rank, r->num_experts, &info, bf->recv, bf->out);
    double t3 = now_us();
    CHECK(loomMoeCombine(h, check ? bf->out : bf->recv, bf->y));
    double t4 = now_us();
    CHECK(loomMoeHandleDestroy(h));
    times[0] = t1 - t0;
    times[1] = t2 - t1;
    times[2] = t4 - t3;
    return check ? count_wrong(o->dtype, H, topk, r->top_k, T, bf->src, bf->y) : 0;
}

/* Re-ordering's inputs of batch b into x: rank g holds its share's rows of x_value(., g) in a
 * batch of T rows, the others zero, and the permuted ReduceScatter hands each rank the rows
 * of its tokens, as a layer's own ReduceScatter would (untimed: the layer runs one anyway). */
static void reorder_inputs(const opts_t *o, const reorder_t *ro, int b, size_t H, void *x)
{
    size_t T = ro->ly->ntok[b], first, n, es = bench_type_size(o->dtype);
    share(T, g_nranks, g_rank, &first, &n);
    void *p = xcalloc(T * H, es);
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < H; i++)
            bench_store(o->dtype, p, (first + t) * H + i, x_value(t, g_rank, i));
    CHECK(loomMoeReduceScatterPermuted(p, x, H, o->dtype, loomSum, ro->perm + ro->poff[b], T,
                                       g_comm));
    free(p);
}

/* Mode `mode` on routing r: with ro (dedup+place+reorder) r is routing_reordered()'s, and each
 * step first re-orders its batch as a layer would (reorder_batch(), timed as its own phase). */
static void run_mode(const opts_t *o, const routing_t *r, size_t H, int mode,
                     const int32_t *expert_rank, reorder_t *ro, result_t *res)
{
    size_t es = bench_type_size(o->dtype);
    int first = r->nbatches / 2, nb = r->nbatches - first;
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = r->num_experts;
    cfg.top_k = r->top_k;
    cfg.datatype = (int)o->dtype;
    cfg.mode = mode == MODE_NAIVE ? loomMoeModeNaive : loomMoeModeDedup;
    cfg.hidden = H;
    cfg.expert_rank = expert_rank;
    loomMoePlan_t plan = NULL;
    CHECK(loomMoePlanCreate(&plan, &cfg, g_comm));

    bufs_t bf = {0};
    bf.x = xcalloc(r->max_tok * H, es);
    bf.y = xcalloc(r->max_tok * H, es);
    bf.w = xcalloc(r->max_tok * (size_t)r->top_k, sizeof(float));
    bf.ecount = xcalloc((size_t)r->num_experts, sizeof(int64_t));
    bf.eoffset = xcalloc((size_t)r->num_experts, sizeof(int64_t));
    for (size_t t = 0; t < r->max_tok; t++) {
        for (size_t i = 0; i < H; i++)
            bench_store(o->dtype, bf.x, t * H + i, x_value(t, g_rank, i));
        for (int j = 0; j < r->top_k; j++)
            bf.w[t * (size_t)r->top_k + (size_t)j] = weight_value(t, j);
    }

    /* One untimed pass over the evaluation batches: the check and the wire bytes. */
    double times[NPH];
    long long wrong = 0;
    loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
    CHECK(loomMoePlanGetStats(plan, &st, 1));
    for (int b = first; b < r->nbatches; b++) {
        if (ro && o->check) {
            reorder_inputs(o, ro, b, H, bf.x);
            bf.src = ro->src + 2 * r->off[b];
        }
        wrong += step(o, plan, r, b, H, expert_rank, &bf, o->check, times);
    }
    CHECK(loomMoePlanGetStats(plan, &st, 1));
    double sums[2] = {(double)wrong, (double)st.bytes_sent};
    CHECK(loomAllReduce(sums, sums, 2, loomFloat64, loomSum, g_comm, NULL));

    double *all = xcalloc((size_t)o->iters * (NPH + 1) + NPH, sizeof(double));
    for (int i = -o->warmup; i < o->iters; i++) {
        int b = first + (i < 0 ? i + o->warmup : i) % nb;
        double *t = all + (size_t)(i < 0 ? o->iters : i) * NPH;
        CHECK(loomBarrier(g_comm, NULL));
        if (ro)
            reorder_batch(ro, b, t);
        step(o, plan, r, b, H, expert_rank, &bf, 0, t);
    }
    double med[NPH + 3];
    phase_medians(all, o->iters, med);
    res->layout_us = med[0];
    res->dispatch_us = med[1];
    res->combine_us = med[2];
    res->gather_us = med[4];
    res->total_us = med[NPH];
    res->xfer_us = med[NPH + 1];
    res->reorder_us = med[NPH + 2];
    res->bytes = sums[1] / nb;
    res->wrong = o->check ? (long long)sums[0] : -1;
    free(all);
    free(bf.x);
    free(bf.y);
    free(bf.w);
    free(bf.recv);
    free(bf.out);
    free(bf.ecount);
    free(bf.eoffset);
    CHECK(loomMoePlanDestroy(plan));
}

/* One routing (one top-k, or the trace) and what every mode of it shares: the placements, their
 * row counts, the re-ordered routing and the projection's rows. */
typedef struct k_run {
    routing_t r, rr; /* the routing; rr: re-ordered (dedup+place+reorder only) */
    layers_t ly;
    reorder_t ro;
    int32_t *contig, *placed;
    counts_t c_contig, c_placed, c_reord;
    double proj[NUM_PROJ][NUM_MODES];
} k_run_t;

static void k_run_init(opts_t *o, int top_k, k_run_t *k)
{
    memset(k, 0, sizeof(*k));
    if (o->trace)
        routing_from_trace(o, &k->r, &k->ly);
    else
        routing_generate(o, top_k, &k->r, &k->ly);
    size_t E = (size_t)k->r.num_experts;
    /* Past 1024 experts the reference's sums would no longer be exact in float32. */
    if (o->check && E > 1024)
        bench_die("run the check with E <= 1024",
                  "-c 1 checks exactly up to 1024 experts, "
                  "not %zu",
                  E);
    k->contig = xcalloc(E, sizeof(int32_t));
    k->placed = xcalloc(E, sizeof(int32_t));
    place_contiguous(k->r.num_experts, g_nranks, k->contig);
    if (o->placement == PLACE_COSELECT)
        place_coselect(&k->r, k->placed);
    else if (o->placement == PLACE_RANDOM)
        place_random(k->r.num_experts, g_nranks, o->seed, k->placed);
    else
        memcpy(k->placed, k->contig, E * sizeof(int32_t));
    k->c_contig = count_rows(&k->r, k->contig);
    k->c_placed = count_rows(&k->r, k->placed);
    /* dedup+place+reorder: the placement of dedup+place, the tokens re-ordered. */
    if (o->modes & (1u << MODE_REORDER)) {
        reorder_init(&k->ro, &k->ly, k->placed, k->r.num_experts, k->r.top_k);
        routing_reordered(&k->ro, &k->r, &k->rr);
        k->c_reord = count_rows(&k->rr, k->placed);
    }
    for (int i = 0; i < NUM_PROJ; i++)
        if (g_rank == 0 && proj_valid(o, i))
            project_rows(o, k->r.top_k, k_proj_ranks[i], k->proj[i]);
}

/* Frees all but k->r, which the JSON of the last routing still needs. */
static void k_run_free(const opts_t *o, k_run_t *k)
{
    counts_free(&k->c_contig);
    counts_free(&k->c_placed);
    counts_free(&k->c_reord);
    if (o->modes & (1u << MODE_REORDER)) {
        routing_free(&k->rr);
        reorder_free(&k->ro);
    }
    layers_free(&k->ly);
    free(k->contig);
    free(k->placed);
}

/* Every mode of `o` on one routing at one hidden size: a result each into res (from *nres on),
 * printed, and their speed-ups over naive into the geomean sums. Returns the wrong elements. */
static long long run_modes(const opts_t *o, k_run_t *k, size_t hidden, const moe_x_links_t *links,
                           FILE *xf, result_t *res, int *nres, double *geo, int *geo_n)
{
    double naive_total = 0;
    long long wrong = 0;
    for (int m = 0; m < NUM_MODES; m++) {
        if (!(o->modes & (1u << m)))
            continue;
        result_t *x = &res[(*nres)++];
        const counts_t *c = m == MODE_REORDER ? &k->c_reord
                            : m == MODE_PLACE ? &k->c_placed
                                              : &k->c_contig;
        *x = (result_t){.k = k->r.top_k, .hidden = hidden, .mode = m};
        run_mode(o, m == MODE_REORDER ? &k->rr : &k->r, hidden, m,
                 m >= MODE_PLACE ? k->placed : k->contig, m == MODE_REORDER ? &k->ro : NULL, x);
        x->rows = m == MODE_NAIVE ? c->rows_naive : c->rows_dedup;
        x->saved =
            k->c_contig.rows_naive > 0 ? 100.0 * (1.0 - x->rows / k->c_contig.rows_naive) : 0.0;
        x->hit = c->hit;
        x->maxrank = m == MODE_NAIVE ? c->max_naive : c->max_dedup;
        predict(o, &k->r, m == MODE_NAIVE ? c->naive : c->dedup, links, m == MODE_NAIVE ? xf : NULL,
                x);
        if (m == MODE_NAIVE)
            time_alltoallv(o, &k->r, c->naive, x);
        for (int i = 0; i < NUM_PROJ; i++)
            x->proj_rows[i] = k->proj[i][m];
        if (m == MODE_NAIVE)
            naive_total = x->total_us;
        if (naive_total > 0) {
            geo[m] += log(naive_total / x->total_us);
            geo_n[m]++;
        }
        wrong += x->wrong > 0 ? x->wrong : 0;
        if (g_rank == 0)
            print_row(o, &k->r, x, naive_total);
        if (g_rank == 0 && m == MODE_NAIVE)
            printf("# naive's bytes through loomAllToAllv alone: dispatch %.1f us, "
                   "combine %.1f us, d+c %.1f us\n",
                   x->a2av_us[0], x->a2av_us[1], x->a2av_us[2]);
        fflush(stdout);
    }
    return wrong;
}

int main(int argc, char **argv)
{
    opts_t o;
    parse(argc, argv, &o);
    const char *hint = NULL; /* the launcher's variables: loomrun -n N sets them */
    CHECK(bench_comm_create(&g_comm, &hint));
    CHECK(loomCommUserRank(g_comm, &g_rank));
    CHECK(loomCommCount(g_comm, &g_nranks));

    int nk = o.trace ? 1 : o.n_top_k;
    result_t *res = xcalloc((size_t)nk * (size_t)o.n_hidden * NUM_MODES, sizeof(result_t));
    int nres = 0, geo_n[NUM_MODES] = {0};
    double geo[NUM_MODES] = {0};
    long long wrong_total = 0;
    moe_x_links_t *links = moe_x_links_get(g_comm);
    if (links == NULL)
        bench_die(NULL, "out of memory");
    FILE *xf = NULL;
    if (o.exchange && g_rank == 0) {
        xf = fopen(o.exchange, "w");
        if (xf == NULL)
            bench_die("check the path", "cannot write --exchange %s", o.exchange);
        moe_x_write_header(xf, g_nranks, "naive");
    }
    k_run_t k;
    for (int ki = 0; ki < nk; ki++) {
        if (ki > 0)
            routing_free(&k.r);
        k_run_init(&o, o.trace ? 0 : o.top_k[ki], &k);
        if (g_rank == 0)
            print_header(&k.r, &o, links);
        const int first_res = nres;
        for (int hi = 0; hi < o.n_hidden; hi++)
            wrong_total += run_modes(&o, &k, o.hidden[hi], links, xf, res, &nres, geo, geo_n);
        if (g_rank == 0)
            print_projection(&o, &k.r, res + first_res, nres - first_res);
        k_run_free(&o, &k);
    }
    if (g_rank == 0) {
        printf("# geomean vs_naive:");
        for (int m = 0; m < NUM_MODES; m++)
            if (geo_n[m])
                printf("  %s %.3f", k_mode_names[m], exp(geo[m] / geo_n[m]));
        printf("\n# #wrong total: %lld\n", wrong_total);
        if (o.json) {
            char desc[320];
            moe_x_links_describe(links, desc, sizeof(desc));
            write_json(&o, &k.r, res, nres, geo, geo_n, desc);
        }
    }
    if (xf && fclose(xf) != 0)
        bench_die(NULL, "cannot write --exchange %s", o.exchange);
    moe_x_links_free(links);
    routing_free(&k.r);
    free(res);
    CHECK(loomCommDestroy(g_comm));
    return wrong_total ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf_report.c - moe_perf's model and output: the cost model's prediction of each
 * step's exchanges, naive's bytes through loomAllToAllv alone and the --exchange file, the
 * projection to 16-64 ranks, the table rows and the JSON.
 */
#include <math.h>
#include <string.h>

#include "moe_gen.h"
#include "moe_perf.h"

// ---- The model, the replay file and the projection ---------------------------------------

/* The bytes of mode m's exchanges per step from the row counts (the wire format of
 * docs/moe.md), the cost model's time of each, averaged over the evaluation batches, and with
 * xf the naive exchange for bench/peers/mpi_alltoallv_bench.c. */
void predict(const opts_t *o, const routing_t *r, const uint64_t *rows, const moe_x_links_t *links,
             FILE *xf, result_t *x)
{
    int G = g_nranks, nb = r->nbatches - r->nbatches / 2;
    size_t GG = (size_t)G * (size_t)G;
    size_t drow = moe_x_dispatch_row(x->hidden, bench_type_size(o->dtype),
                                     x->mode == MODE_NAIVE ? 1 : (size_t)r->top_k);
    double *disp = xcalloc(2 * GG, sizeof(double)), *comb = disp + GG;
    if (xf)
        fprintf(xf, "case k %d hidden %zu dtype %s trace %s steps %d\n", x->k, x->hidden,
                bench_type_names[o->dtype], r->label, nb);
    for (int b = 0; b < nb; b++) {
        moe_x_bytes(rows + (size_t)b * GG, G, drow, moe_x_combine_row(x->hidden), disp, comb);
        for (size_t i = 0; i < GG; i++)
            x->model_bytes += i % (size_t)(G + 1) ? (disp[i] + comb[i]) / nb : 0;
        x->pred_us[0] += moe_x_predict_us(links, disp) / nb;
        x->pred_us[1] += moe_x_predict_us(links, comb) / nb;
        if (xf) {
            moe_x_write_step(xf, G, b, "dispatch", disp);
            moe_x_write_step(xf, G, b, "combine", comb);
        }
    }
    free(disp);
}

/* One exchange of bytes[s * G + d] through loomAllToAllv of bytes; cnt holds 4 G counts. */
static void alltoallv_bytes(const double *bytes, const char *send, char *recv, size_t *cnt)
{
    size_t G = (size_t)g_nranks, *sc = cnt, *sd = cnt + G, *rc = cnt + 2 * G, *rd = cnt + 3 * G;
    for (size_t p = 0, so = 0, ro = 0; p < G; p++) {
        sc[p] = (size_t)bytes[(size_t)g_rank * G + p];
        rc[p] = (size_t)bytes[p * G + (size_t)g_rank];
        sd[p] = so;
        rd[p] = ro;
        so += sc[p];
        ro += rc[p];
    }
    CHECK(loomAllToAllv(send, sc, sd, recv, rc, rd, loomUint8, g_comm, NULL));
}

/* Naive mode's exchanges, the same bytes between the same ranks, through loomAllToAllv alone,
 * timed as run_mode times a step: the transport without packing, expanding and summing rows,
 * and what mpi_alltoallv_bench.c runs through MPI_Alltoallv. x->a2av_us: dispatch, combine
 * and their sum. */
void time_alltoallv(const opts_t *o, const routing_t *r, const uint64_t *rows, result_t *x)
{
    int G = g_nranks, nb = r->nbatches - r->nbatches / 2;
    size_t GG = (size_t)G * (size_t)G, most = 0;
    size_t drow = moe_x_dispatch_row(x->hidden, bench_type_size(o->dtype), 1);
    double *m = xcalloc(2 * GG * (size_t)nb, sizeof(double));
    for (int b = 0; b < nb; b++) {
        double *disp = m + (size_t)b * 2 * GG;
        moe_x_bytes(rows + (size_t)b * GG, G, drow, moe_x_combine_row(x->hidden), disp, disp + GG);
        for (size_t ph = 0; ph < 2; ph++)
            for (size_t side = 0; side < 2; side++) {
                double n = 0;
                for (size_t p = 0; p < (size_t)G; p++)
                    n += side ? disp[ph * GG + p * (size_t)G + (size_t)g_rank]
                              : disp[ph * GG + (size_t)g_rank * (size_t)G + p];
                most = (size_t)n > most ? (size_t)n : most;
            }
    }
    char *send = xcalloc(most, 1), *recv = xcalloc(most, 1);
    size_t *cnt = xcalloc(4 * (size_t)G, sizeof(size_t));
    double *all = xcalloc((size_t)o->iters * (NPH + 1) + NPH, sizeof(double));
    for (int i = -o->warmup; i < o->iters; i++) {
        const double *disp = m + (size_t)((i + o->warmup) % nb) * 2 * GG;
        double *t = all + (size_t)(i < 0 ? o->iters : i) * NPH;
        CHECK(loomBarrier(g_comm, NULL));
        double t0 = now_us();
        alltoallv_bytes(disp, send, recv, cnt);
        double t1 = now_us();
        alltoallv_bytes(disp + GG, send, recv, cnt);
        t[0] = t[3] = t[4] = 0;
        t[1] = t1 - t0;
        t[2] = now_us() - t1;
    }
    double med[NPH + 3];
    phase_medians(all, o->iters, med);
    x->a2av_us[0] = med[1];
    x->a2av_us[1] = med[2];
    x->a2av_us[2] = med[NPH + 1];
    free(all);
    free(cnt);
    free(send);
    free(recv);
    free(m);
}

/* The busiest rank's remote rows per step on G ranks, for each mode, from this run's
 * generator and knobs with T tokens per rank: what projected_us() scales the measured times by. */
void project_rows(const opts_t *o, int k, int G, double *out)
{
    int E = o->num_experts, nb = o->batches - o->batches / 2;
    size_t T = o->tokens, GG = (size_t)G * (size_t)G, BT = (size_t)G * T;
    int32_t *prev = generate_topk(o, k, G), *topk = prev + (size_t)o->batches * BT * (size_t)k;
    int32_t *contig = xcalloc((size_t)E, sizeof(int32_t)),
            *placed = xcalloc((size_t)E, sizeof(int32_t));
    place_contiguous(E, G, contig);
    memcpy(placed, contig, (size_t)E * sizeof(int32_t));
    if (o->placement == PLACE_COSELECT) {
        uint64_t *cos = xcalloc((size_t)E * (size_t)E + (size_t)E, sizeof(uint64_t));
        CHECK(loomMoeCoselectAccumulate(topk, (size_t)(o->batches / 2) * (size_t)G * T, k, E, cos,
                                        cos + (size_t)E * (size_t)E));
        place_counts(cos, E, G, placed);
        free(cos);
    } else if (o->placement == PLACE_RANDOM) {
        place_random(E, G, o->seed, placed);
    }
    /* naive, dedup and dedup+place, then the placed naive rows, unused */
    uint64_t *m = xcalloc(4 * GG, sizeof(uint64_t)), tot[4] = {0};
    for (int b = o->batches - nb; b < o->batches; b++) {
        for (int s = 0; s < G; s++) {
            const int32_t *tk = topk + ((size_t)b * (size_t)G + (size_t)s) * T * (size_t)k;
            uint64_t *row = m + (size_t)s * (size_t)G;
            rows_of(tk, T, k, E, contig, G, s, row + GG, row, tot);
            rows_of(tk, T, k, E, placed, G, s, row + 2 * GG, row + 3 * GG, tot);
        }
        for (int mode = 0; mode <= MODE_PLACE; mode++)
            out[mode] += (double)max_received(m + (size_t)mode * GG, G) / nb;
    }
    if (o->modes & (1u << MODE_REORDER)) {
        /* Each batch's G * T tokens re-ordered as reorder_batch() does on G ranks. */
        uint64_t *aff = xcalloc((size_t)E * (size_t)E, sizeof(uint64_t));
        int32_t *pred = xcalloc(BT * (size_t)k, sizeof(int32_t)),
                *home = xcalloc(BT, sizeof(int32_t)), *perm = xcalloc(BT, sizeof(int32_t));
        CHECK(
            loomMoeAffinityAccumulate(prev, k, E, topk, k, E, (size_t)(o->batches / 2) * BT, aff));
        for (int b = o->batches - nb; b < o->batches; b++) {
            loom_moe_rows_t rows;
            size_t at = (size_t)b * BT * (size_t)k;
            CHECK(loomMoeAffinityPredict(aff, E, E, prev + at, k, BT, k, pred));
            CHECK(loomMoeReorderCompute(placed, E, G, pred, k, BT, perm, home));
            if (loom_moe_rows_count(topk + at, BT, (uint32_t)k, (uint32_t)E, placed, (uint32_t)G,
                                    home, NULL, &rows) != loomSuccess)
                bench_die(NULL, "the routing holds an expert id out of range");
            out[MODE_REORDER] += (double)rows.rows_max_to_rank / nb;
        }
        free(aff);
        free(pred);
        free(home);
        free(perm);
    }
    free(m);
    free(prev);
    free(contig);
    free(placed);
}

// ---- Output --------------------------------------------------------------------------------

static const char *dtype_name(loomDataType_t dt)
{
    return bench_type_names[dt];
}

void print_header(const routing_t *r, const opts_t *o, const moe_x_links_t *links)
{
    char desc[320];
    moe_x_links_describe(links, desc, sizeof(desc));
    printf("# moe_perf: %d ranks, %zu tokens per rank and step, %d batches (placement learns on "
           "%d), %d warm-up and %d timed steps; times are the slowest rank's, median\n",
           g_nranks, r->max_tok, r->nbatches, r->nbatches / 2, o->warmup, o->iters);
    printf("# cost model (pred): an all-to-all-v of each step's bytes on %s\n", desc);
    printf("#%4s %3s %6s %8s %3s %-12s %-19s %9s %8s %6s %12s %10s %12s %11s %10s %8s %12s %6s "
           "%10s %10s %9s %11s %10s\n",
           "E", "k", "H", "dtype", "G", "trace", "mode", "rows", "saved%", "hit%", "bytes",
           "layout(us)", "dispatch(us)", "combine(us)", "total(us)", "vs_naive", "maxrank_rows",
           "#wrong", "d+c(us)", "pred(us)", "meas/pred", "reorder(us)", "gather(us)");
}

void print_row(const opts_t *o, const routing_t *r, const result_t *x, double naive_total)
{
    char vs[16] = "-", wrong[24] = "N/A", reorder[24] = "-", gather[24] = "-";
    if (x->mode == MODE_REORDER) {
        snprintf(reorder, sizeof(reorder), "%.1f", x->reorder_us);
        snprintf(gather, sizeof(gather), "%.1f", x->gather_us);
    }
    if (naive_total > 0)
        snprintf(vs, sizeof(vs), "%.3f", naive_total / x->total_us);
    if (x->wrong >= 0)
        snprintf(wrong, sizeof(wrong), "%lld", x->wrong);
    double pred = x->pred_us[0] + x->pred_us[1];
    printf("%5d %3d %6zu %8s %3d %-12s %-19s %9.0f %8.1f %6.1f %12.0f %10.1f %12.1f %11.1f "
           "%10.1f %8s %12.0f %6s %10.1f %10.1f %9.2f %11s %10s\n",
           r->num_experts, x->k, x->hidden, dtype_name(o->dtype), g_nranks, r->label,
           k_mode_names[x->mode], x->rows, x->saved, x->hit, x->bytes, x->layout_us, x->dispatch_us,
           x->combine_us, x->total_us, vs, x->maxrank, wrong, x->xfer_us, pred,
           pred > 0 ? x->xfer_us / pred : 0.0, reorder, gather);
}

/* Projected dispatch + combine of x on k_proj_ranks[i] ranks: its measured time per row of the
 * busiest rank, times that rank's rows there. */
static double projected_us(const result_t *x, int i)
{
    return x->maxrank > 0 ? x->xfer_us / x->maxrank * x->proj_rows[i] : 0.0;
}

int proj_valid(const opts_t *o, int i)
{
    return o->trace == NULL && k_proj_ranks[i] <= o->num_experts;
}

/* The projection's table: one row per rank count, mode and (k, H), after the measured ones. */
void print_projection(const opts_t *o, const routing_t *r, const result_t *res, int nres)
{
    if (o->trace) {
        printf("# projection: none for a trace (its batches hold the tokens of %d ranks)\n",
               g_nranks);
        return;
    }
    printf("# projection to EP 16-64, not measured: d+c(us) of each mode above / its "
           "maxrank_rows, times the busiest rank's rows on G ranks (the same generator and "
           "knobs, %zu tokens per rank, placement learned the same way); assumes each rank's "
           "per-row cost stays as measured on %d ranks\n",
           o->tokens, g_nranks);
    printf("#%4s %3s %6s %3s %-12s %-19s %12s %14s %8s\n", "E", "k", "H", "G", "trace", "mode",
           "maxrank_rows", "projected(us)", "vs_naive");
    for (int i = 0; i < NUM_PROJ; i++) {
        if (!proj_valid(o, i))
            continue;
        double naive = 0;
        for (int j = 0; j < nres; j++) {
            const result_t *x = &res[j];
            double us = projected_us(x, i);
            naive = x->mode == MODE_NAIVE ? us : naive;
            char vs[16] = "-";
            if (naive > 0 && us > 0)
                snprintf(vs, sizeof(vs), "%.3f", naive / us);
            printf("%5d %3d %6zu %3d %-12s %-19s %12.0f %14.1f %8s\n", r->num_experts, x->k,
                   x->hidden, k_proj_ranks[i], r->label, k_mode_names[x->mode], x->proj_rows[i], us,
                   vs);
        }
    }
}

void write_json(const opts_t *o, const routing_t *r, const result_t *res, int nres,
                const double *geo, const int *geo_n, const char *links)
{
    FILE *f = fopen(o->json, "w");
    if (f == NULL)
        bench_die(NULL, "cannot write -J %s", o->json);
    fprintf(f,
            "{\"program\":\"moe_perf\",\"nranks\":%d,\"experts\":%d,\"tokens_per_rank\":%zu,"
            "\"dtype\":\"%s\",\"trace\":\"%s\",\"batches\":%d,\"iters\":%d,\"cost_model\":\"%s\","
            "\"results\":[",
            g_nranks, r->num_experts, r->max_tok, dtype_name(o->dtype), r->label, r->nbatches,
            o->iters, links);
    for (int i = 0; i < nres; i++) {
        const result_t *x = &res[i];
        double pred = x->pred_us[0] + x->pred_us[1];
        fprintf(f,
                "%s{\"k\":%d,\"hidden\":%zu,\"mode\":\"%s\",\"rows\":%.1f,"
                "\"rows_saved_pct\":%.3f,\"hit_pct\":%.3f,\"bytes\":%.0f,\"model_bytes\":%.0f,"
                "\"layout_us\":%.2f,\"dispatch_us\":%.2f,\"combine_us\":%.2f,\"total_us\":%.2f,"
                "\"dispatch_combine_us\":%.2f,\"predicted_dispatch_us\":%.2f,"
                "\"predicted_combine_us\":%.2f,\"measured_over_predicted\":%.4f,"
                "\"maxrank_rows\":%.1f,\"wrong\":%lld,\"reorder_us\":%.2f,"
                "\"reorder_gather_us\":%.2f,",
                i ? "," : "", x->k, x->hidden, k_mode_names[x->mode], x->rows, x->saved, x->hit,
                x->bytes, x->model_bytes, x->layout_us, x->dispatch_us, x->combine_us, x->total_us,
                x->xfer_us, x->pred_us[0], x->pred_us[1], pred > 0 ? x->xfer_us / pred : 0.0,
                x->maxrank, x->wrong, x->reorder_us, x->gather_us);
        if (x->mode == MODE_NAIVE)
            fprintf(f,
                    "\"alltoallv_dispatch_us\":%.2f,\"alltoallv_combine_us\":%.2f,"
                    "\"alltoallv_dispatch_combine_us\":%.2f,",
                    x->a2av_us[0], x->a2av_us[1], x->a2av_us[2]);
        fprintf(f, "\"projection\":[");
        for (int p = 0, comma = 0; p < NUM_PROJ; p++)
            if (proj_valid(o, p)) {
                fprintf(f, "%s{\"ranks\":%d,\"maxrank_rows\":%.1f,\"projected_us\":%.2f}",
                        comma ? "," : "", k_proj_ranks[p], x->proj_rows[p], projected_us(x, p));
                comma = 1;
            }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"geomean_vs_naive\":{");
    int comma = 0;
    for (int m = 0; m < NUM_MODES; m++)
        if (geo_n[m]) {
            fprintf(f, "%s\"%s\":%.4f", comma ? "," : "", k_mode_names[m], exp(geo[m] / geo_n[m]));
            comma = 1;
        }
    fprintf(f, "}}\n");
    fclose(f);
}

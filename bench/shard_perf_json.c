/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf_json.c - shard_perf's -J file: the run (model, ranks, cores, the probes' rates)
 * and one record per table row, measured or projected. bench/shard_perf_plot.py draws it and
 * bench/shard_perf_test.py checks it.
 */
#include "shard_perf.h"

/* s as a JSON string body: quotes and backslashes escaped, control characters dropped. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}

void sp_write_json(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc,
                   const sp_result_t *res, int nres)
{
    FILE *f = fopen(o->json, "w");
    if (f == NULL)
        bench_die("check the path", "cannot write -J %s", o->json);
    int ranks = o->predict_only ? o->ranks : g_nranks;
    fprintf(f,
            "{\"program\":\"shard_perf\",\"model\":\"%s\",\"projection\":%s,\"nranks\":%d,"
            "\"cores\":%d,\"oversubscribed\":%s,\"cpu\":",
            m->name, o->predict_only ? "true" : "false", ranks, o->predict_only ? ranks : mc->cores,
            !o->predict_only && ranks > mc->cores ? "true" : "false");
    put_string(f, mc->cpu);
    fprintf(f, ",\"openblas_coretype\":");
    put_string(f, getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "");
    fprintf(f,
            ",\"ns_gmacs\":%.4f,\"adamw_ns_per_elem\":%.5f,\"ns_gmacs_cpu\":%.4f,"
            "\"warmup\":%d,\"iters\":%d,\"deterministic\":%d,\"results\":[",
            mc->ns_gmacs, mc->elem_ns, mc->ns_gmacs_cpu, o->warmup, o->iters, o->deterministic);
    for (int i = 0; i < nres; i++) {
        const sp_result_t *x = &res[i];
        fprintf(f, "%s{\"ranks\":%d,\"layout\":\"%s\",\"balance\":", i ? "," : "", ranks,
                k_layout_names[x->layout]);
        put_string(f, x->balance >= 0 ? k_balance_names[x->balance] : "-");
        fprintf(f,
                ",\"step_ms\":%.3f,\"step_min_ms\":%.3f,\"sync_ms\":%.3f,\"sync_min_ms\":%.3f,"
                "\"total_ms\":%.3f,\"total_min_ms\":%.3f,\"cpu_s\":%.4f,\"ns_gmac_max\":%.4f,"
                "\"imb\":%.4f,\"bytes_rank\":%.1f,\"bytes_closed_form\":%.1f,\"bytes_ok\":%s,"
                "\"step_x\":%.4f,\"total_x\":%.4f,\"pred_step_ms\":%.3f,\"pred_ns_ms\":%.3f,"
                "\"pred_elem_ms\":%.3f,\"pred_gather_ms\":%.3f,\"pred_gather_source\":",
                x->step_ms, x->step_min, x->sync_ms, x->sync_min, x->total_ms, x->total_min,
                x->cpu_s, x->ns_gmac_max, x->imb, x->bytes_rank, x->bytes_model,
                x->bytes_ok ? "true" : "false", x->step_x, x->total_x, x->pred_step_ms,
                x->pred_ns_ms, x->pred_elem_ms, x->pred_gather_ms);
        put_string(f, x->gather_src ? x->gather_src : "none");
        fprintf(f,
                ",\"ns_gmacs\":%.4f,\"adamw_ns_per_elem\":%.5f,\"ns_gmacs_cpu\":%.4f,"
                "\"adamw_cpu_ns_per_elem\":%.5f,\"pred_cpu_s\":%.4f,\"step_collectives\":%.2f}",
                x->ns_gmacs, x->elem_ns, x->ns_gmacs_cpu, x->elem_ns_cpu, x->pred_cpu_s,
                x->step_colls);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0)
        bench_die("check the path", "cannot write -J %s", o->json);
}

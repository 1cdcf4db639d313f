/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_shim_perf_report.c - nccl_shim_perf's output on rank 0: a header in nccl-tests' manner,
 * one table per collective (size, count, calls per block, the two medians, their ratio, the
 * elements where the outputs differ), the library's per-call overhead at the smallest size
 * under each table, and the -J file (bench/common.c's record conventions; one record per row).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_shim_perf.h"

static struct {
    int rank, nranks;
    FILE *json;
    int json_rows; /* records written */
} r;

static void json_open(const nsp_opts_t *o, int argc, char **argv, int nccl_version, const char *cpu,
                      long cpus)
{
    r.json = fopen(o->sweep.json_path, "w");
    if (r.json == NULL) {
        printf("# skipping json output; %s not accessible\n", o->sweep.json_path);
        return;
    }
    printf("# Writing JSON output to %s\n", o->sweep.json_path);
    fprintf(r.json, "{\"version\":2,\"program\":\"nccl_shim_perf\",\"start_time\":");
    bench_json_now(r.json);
    fprintf(r.json, ",\"args\":[");
    for (int i = 0; i < argc; i++) {
        fprintf(r.json, i ? "," : "");
        bench_json_str(r.json, argv[i]);
    }
    fprintf(r.json,
            "],\"loom_version\":%d,\"nccl_version\":%d,\"config\":{\"nranks\":%d,"
            "\"minimum_bytes\":%zu,\"maximum_bytes\":%zu,\"step_factor\":%zu,"
            "\"warmup_iters\":%d,\"iterations\":%d,\"nccl_mode\":\"loom\",\"cpu\":",
            LOOM_VERSION_CODE, nccl_version, r.nranks, o->sweep.min_bytes, o->sweep.max_bytes,
            o->sweep.step_factor, o->sweep.warmup_iters, o->sweep.iters);
    bench_json_str(r.json, cpu);
    fprintf(r.json, ",\"online_cpus\":%ld},\"results\":[", cpus);
}

void nsp_report_open(const nsp_opts_t *o, int argc, char **argv, int rank, int nranks)
{
    r.rank = rank;
    r.nranks = nranks;
    if (rank != 0)
        return;
    int nccl_version = 0;
    if (ncclGetVersion(&nccl_version) != ncclSuccess)
        nccl_version = -1;
    char cpu[128];
    bench_cpu_model(cpu, sizeof(cpu));
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("# nccl_shim_perf: the drop-in NCCL library (LOOM_NCCL_MODE=loom) against loom "
           "itself\n");
    printf("# loom %d.%d.%d, NCCL API %d through the library; %d rank(s) on %s, %ld online "
           "CPU(s)\n",
           LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH, nccl_version, nranks, cpu, cpus);
    printf("# minBytes %zu maxBytes %zu step: %zu(factor) warmup calls: %d repetitions: %d\n",
           o->sweep.min_bytes, o->sweep.max_bytes, o->sweep.step_factor, o->sweep.warmup_iters,
           o->sweep.iters);
    printf("# size: bytes of the call's count (float32), host buffers, stream NULL. A row: the\n"
           "# outputs of one call each way compared bit for bit (#wrong), then repetitions of\n"
           "# two blocks of calls/block calls, through the library and direct, in alternating\n"
           "# order; times per call, each way's median over the repetitions, averaged over\n"
           "# the ranks\n");
    if (o->sweep.json_path)
        json_open(o, argc, argv, nccl_version, cpu, cpus);
}

void nsp_report_coll_start(const nsp_coll_t *c)
{
    if (r.rank != 0)
        return;
    printf("#\n# %s (float%s%s%s)\n", c->name, strcmp(c->op, "none") ? ", " : "",
           strcmp(c->op, "none") ? c->op : "", c->root >= 0 ? ", root 0" : "");
    printf("# %10s  %12s  %6s  %10s  %10s  %11s  %6s\n", "size", "count", "calls", "shim", "direct",
           "shim/direct", "#wrong");
    printf("# %10s  %12s  %6s  %10s  %10s\n", "(B)", "(elements)", "/block", "(us)", "(us)");
}

void nsp_report_row(const nsp_coll_t *c, const nsp_row_t *row)
{
    if (r.rank != 0)
        return;
    const double ratio = row->direct_us > 0 ? row->shim_us / row->direct_us : 0.0;
    printf("  %10zu  %12zu  %6d  %10.2f  %10.2f  %11.3f  %6lld\n", row->bytes, row->count,
           row->calls_per_block, row->shim_us, row->direct_us, ratio, row->wrong);
    if (r.json == NULL)
        return;
    fprintf(r.json,
            "%s{\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":", r.json_rows++ ? "," : "",
            row->bytes, row->count);
    bench_json_str(r.json, c->op);
    fprintf(r.json, ",\"root\":%d,\"nranks\":%d,\"experiment_name\":", c->root, r.nranks);
    bench_json_str(r.json, c->name);
    fprintf(r.json, ",\"calls_per_block\":%d,\"shim_time\":", row->calls_per_block);
    bench_json_double(r.json, row->shim_us);
    fprintf(r.json, ",\"direct_time\":");
    bench_json_double(r.json, row->direct_us);
    fprintf(r.json, ",\"ratio\":");
    bench_json_double(r.json, ratio);
    fprintf(r.json, ",\"overhead_ns\":");
    bench_json_double(r.json, row->overhead_ns);
    fprintf(r.json, ",\"nwrong\":%lld}", row->wrong);
}

void nsp_report_coll_end(const nsp_coll_t *c, const nsp_row_t *first)
{
    if (r.rank != 0)
        return;
    printf("# %s: the library's per-call overhead at %zu B: %+.0f ns (median of the paired "
           "block differences)\n",
           c->name, first->bytes, first->overhead_ns);
}

void nsp_report_close(long long wrong_rows, const char *msg)
{
    if (r.rank != 0)
        return;
    if (msg == NULL) {
        printf("#\n# %-20s : %lld %s\n", "Out of bounds values", wrong_rows,
               wrong_rows ? "FAILED" : "OK");
        printf("# Collective test concluded: nccl_shim_perf\n");
    }
    if (r.json == NULL)
        return;
    fprintf(r.json, "],\"out_of_bounds\":{\"count\":%lld,\"okay\":%s},\"errors\":[", wrong_rows,
            wrong_rows ? "false" : "true");
    if (msg)
        bench_json_str(r.json, msg);
    fprintf(r.json, "],\"end_time\":");
    bench_json_now(r.json);
    fprintf(r.json, "}\n");
    fclose(r.json);
    r.json = NULL;
}

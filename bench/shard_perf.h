/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf.h - what the files of bench/shard_perf share: the options, a model's parameter
 * list, one result row, the probes' rates and the helpers more than one file calls.
 * shard_perf.c holds main and the runs; shard_perf_opts.c parses the flags;
 * shard_perf_models.c builds the parameter lists; shard_perf_probe.c measures the machine
 * (Newton-Schulz and AdamW rates, the CPU); shard_perf_report.c predicts, checks the bytes and
 * prints; shard_perf_json.c writes -J. docs/PERFORMANCE.md, "Owner-shaped sharding", explains
 * the columns.
 */
#ifndef LOOM_BENCH_SHARD_PERF_H
#define LOOM_BENCH_SHARD_PERF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "loom.h"
#include "loom_shard.h"
#include "options.h"

enum { LAY_OWNER, LAY_ROWS, LAY_ROWS_BUCKETED, LAY_REPLICATED, NUM_LAYOUTS };
enum { MODEL_TINY, MODEL_CPU, MODEL_124M, NUM_MODELS };
#define NUM_BALANCES 3

typedef struct sp_opts {
    int model;
    unsigned layouts;  /* 1 << LAY_* */
    unsigned balances; /* 1 << loomShardBalance_t; Owner rows only */
    int warmup, iters;
    int deterministic; /* the plan's rank-order reduction */
    int predict_only, ranks;
    double proj_gbps; /* --predict-only: link GB/s for the in-step gather; 0 leaves it out */
    uint64_t seed;
    const char *json;
} sp_opts_t;

typedef struct sp_model {
    const char *name;
    int layers;
    size_t C, V, T;
    int nparams, nbuckets;
    loomShardParam_t *params;
} sp_model_t;

/* What the probes measured, agreed on every rank (the slowest rank's rates). */
typedef struct sp_machine {
    double ns_gmacs;     /* R: Newton-Schulz multiply-adds per second, single core, in 1e9 */
    double elem_ns;      /* AdamW nanoseconds per element, single core */
    double ns_gmacs_cpu; /* the same per CPU second, which other work on the machine leaves */
    double elem_ns_cpu;
    int cores, ranks; /* CPUs this process may use, ranks of the run */
    char cpu[128];    /* the CPU's model name */
} sp_machine_t;

/* One row of the table: a layout (and balance, for Owner) at this rank count. */
typedef struct sp_result {
    int layout, balance;
    /* Medians over steps: the slowest rank's Step and whole step; sync is the slowest rank's
     * ReduceGrads plus GatherParams as the last rank to arrive saw it */
    double step_ms, sync_ms, total_ms;
    double step_min, sync_min, total_min;
    double cpu_s;       /* CPU seconds per step, summed over ranks (the whole run's work) */
    double ns_gmac_max; /* the busiest rank's Newton-Schulz GMAC per step */
    double imb;         /* max / mean of the ranks' Newton-Schulz work */
    double bytes_rank;  /* mean bytes one rank sends per step, from the counters */
    double bytes_model; /* the same from the closed forms */
    double step_x, total_x;
    double pred_step_ms, pred_ns_ms, pred_elem_ms, pred_gather_ms;
    double ns_gmacs, elem_ns; /* the rates the prediction used: probed before and after */
    double ns_gmacs_cpu, elem_ns_cpu;
    double pred_cpu_s;      /* all ranks' compute in CPU seconds per step, at the CPU rates */
    const char *gather_src; /* where pred_gather_ms comes from (loomCommPlan, a probe, ...) */
    double step_colls;      /* collectives issued inside one Step, rank 0 */
    int bytes_ok;
} sp_result_t;

extern const char *const k_layout_names[];
extern const char *const k_balance_names[];
extern const char *const k_model_names[];

/* This process's rank and the benchmark's communicator (NULL with --predict-only). */
extern int g_rank, g_nranks;
extern loomComm_t g_comm;

/* A failed loom call: prints it with loom's message, aborts the communicator and exits. */
#define SP_CHECK(_call) sp_check((_call), #_call)

/* Functions more than one file calls; each is described where it is defined. */
void sp_check(loomResult_t res, const char *call);
void sp_parse(int argc, char **argv, sp_opts_t *o);
void sp_model_build(int model, sp_model_t *m);
void sp_model_free(sp_model_t *m);
size_t sp_model_elems(const sp_model_t *m, loomShardKind_t kind);
loomShardPlan_t sp_plan(const sp_model_t *m, int nranks, int layout, int balance,
                        int deterministic);
void *sp_alloc(size_t n, size_t size);
double sp_now(void);
double sp_min(const double *v, int n);
void sp_probe(sp_machine_t *mc);
void sp_probe_rates(sp_machine_t *mc, int reps);
void sp_predict(const sp_machine_t *mc, const sp_model_t *m, loomShardPlan_t plan, int layout,
                int nranks, int cores, double proj_gbps, sp_result_t *x);
void sp_plan_work(loomShardPlan_t plan, int nranks, sp_result_t *x);
int sp_check_bytes(loomShardPlan_t plan, int layout, double bytes_sum, sp_result_t *x);
void sp_print_header(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc);
void sp_print_row(const sp_result_t *x, int nranks);
void sp_print_cpu(const sp_result_t *res, int nres);
void sp_ratios(sp_result_t *res, int nres);
void sp_project(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc);
void sp_write_json(const sp_opts_t *o, const sp_model_t *m, const sp_machine_t *mc,
                   const sp_result_t *res, int nres);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf.h - what the files of bench/moe_perf share: the options, a rank's routing and the
 * layers re-ordering predicts from, the row counts, the re-ordering's state, one result row,
 * the communicator and the helpers every file calls. moe_perf.c runs the modes and holds main;
 * moe_perf_opts.c parses the flags; moe_perf_routing.c makes the routing, the placements, the
 * counts, the re-ordering and the check's data; moe_perf_report.c predicts, projects and
 * prints. docs/moe.md, "Benchmark", explains the columns.
 */
#ifndef LOOM_BENCH_MOE_PERF_H
#define LOOM_BENCH_MOE_PERF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "loom.h"
#include "loom_moe.h"
#include "moe_exchange.h"
#include "options.h"

enum { GEN_UNIFORM, GEN_PLANTED, GEN_TEXT, GEN_SKEW };
enum { PLACE_CONTIGUOUS, PLACE_RANDOM, PLACE_COSELECT };
enum { MODE_NAIVE, MODE_DEDUP, MODE_PLACE, MODE_REORDER, NUM_MODES };

#define MAX_LIST 16
/* Rank counts the projection predicts (project()). */
#define NUM_PROJ 3

typedef struct opts {
    int num_experts;
    int top_k[MAX_LIST], n_top_k;
    size_t hidden[MAX_LIST];
    int n_hidden;
    size_t tokens; /* per rank and batch */
    loomDataType_t dtype;
    int warmup, iters, check, batches;
    int gen, placement;
    unsigned modes;     /* 1 << MODE_* */
    int modes_explicit; /* --modes named them: a mode the routing cannot run is an error */
    double rho, rho_layer, zipf, mask, hot_ratio;
    int groups; /* hidden groups; 0: one per rank */
    uint64_t seed;
    const char *trace, *text, *json;
    const char *exchange; /* naive mode's exchanges, for the MPI replay */
} opts_t;

/* This rank's routing: batch b holds ntok[b] tokens at topk + off[b] * k. */
typedef struct routing {
    int num_experts, top_k, nbatches;
    int32_t *topk;
    size_t *off, *ntok, max_tok;
    char label[64];
} routing_t;

/* Every rank's tokens of each batch in natural order, for re-ordering: the measured layer's
 * routing (cur) and the layer before's (prev), batch b's ntok[b] tokens at off[b] * k of each;
 * prev owns both arrays. Rank g's own tokens of a batch are its share of them (share()). */
typedef struct layers {
    int nbatches;
    int32_t *prev, *cur;
    size_t *off, *ntok;
} layers_t;

typedef struct result {
    int k;
    size_t hidden;
    int mode;
    double rows, saved, hit, bytes, layout_us, dispatch_us, combine_us, total_us, maxrank;
    double xfer_us;             /* median of dispatch + combine */
    double reorder_us;          /* re-ordering: prediction, its AllGather, the permutation */
    double gather_us;           /* of which the prediction's AllGather */
    double model_bytes;         /* bytes from the row counts and the wire format */
    double pred_us[2];          /* the cost model's dispatch and combine, mean over steps */
    double a2av_us[3];          /* naive's bytes through loomAllToAllv: d, c and d + c */
    double proj_rows[NUM_PROJ]; /* the busiest rank's rows at k_proj_ranks ranks */
    long long wrong;
} result_t;

extern const char *const k_gen_names[];
extern const char *const k_place_names[];
extern const char *const k_mode_names[];
extern const int k_proj_ranks[];

/* This process's rank and the benchmark's communicator (moe_perf.c). */
extern int g_rank, g_nranks;
extern loomComm_t g_comm;

typedef struct counts {
    double rows_naive, rows_dedup, hit; /* per step, over all ranks */
    double max_naive, max_dedup;        /* per step, the most remote rows one rank receives */
    /* [nb][G][G]: rows rank s sends rank d in evaluation batch b, itself included */
    uint64_t *naive, *dedup;
} counts_t;

/* What dedup+place+reorder needs beyond a routing: the layers, the learned affinity, the
 * placement, scratch for one batch, and per evaluation batch the permutation its counts used
 * (perm + poff[b]) and each of this rank's rows' natural owner and index there (src, two per
 * row of the re-ordered routing, at its offsets), for the check. */
typedef struct reorder {
    const layers_t *ly;
    const int32_t *expert_rank;
    int E, k;
    uint64_t *aff;
    int32_t *ident, *pred_own, *pred, *perm_now; /* one batch */
    int32_t *perm, *src;
    size_t *poff;
} reorder_t;

/* Phases of a step, in all[iters][NPH]: layout, dispatch, combine, and re-ordering's local
 * work (prediction, permutation) and AllGather. */
#define NPH 5

#define CHECK(_call)                                                                               \
    do {                                                                                           \
        loomResult_t res_ = (_call);                                                               \
        if (res_ != loomSuccess) {                                                                 \
            fprintf(stderr, "moe_perf: rank %d: %s failed: %s / %s\n", g_rank, #_call,             \
                    loomGetErrorString(res_), loomGetLastError(g_comm));                           \
            if (g_comm)                                                                            \
                loomCommAbort(g_comm);                                                             \
            exit(EXIT_FAILURE);                                                                    \
        }                                                                                          \
    } while (0)

/* Functions more than one file calls; each is described where it is defined. */
void *xcalloc(size_t n, size_t size);
double now_us(void);
void parse(int argc, char **argv, opts_t *o);
void layers_free(layers_t *ly);
void routing_from_trace(opts_t *o, routing_t *r, layers_t *ly);
int32_t *generate_topk(const opts_t *o, int top_k, int nranks);
void routing_generate(const opts_t *o, int top_k, routing_t *r, layers_t *ly);
void routing_free(routing_t *r);
void place_contiguous(int E, int G, int32_t *expert_rank);
void place_random(int E, int G, uint64_t seed, int32_t *expert_rank);
void place_counts(const uint64_t *cos, int E, int G, int32_t *expert_rank);
void place_coselect(const routing_t *r, int32_t *expert_rank);
void rows_of(const int32_t *topk, size_t T, int k, int E, const int32_t *expert_rank, int G,
             int home, uint64_t *dedup, uint64_t *naive, uint64_t *tot);
uint64_t max_received(const uint64_t *m, int G);
void counts_free(counts_t *c);
counts_t count_rows(const routing_t *r, const int32_t *expert_rank);
void share(size_t T, int G, int g, size_t *first, size_t *n);
void reorder_init(reorder_t *ro, const layers_t *ly, const int32_t *expert_rank, int E, int k);
void reorder_free(reorder_t *ro);
void reorder_batch(reorder_t *ro, int b, double *times);
void routing_reordered(reorder_t *ro, const routing_t *r, routing_t *rr);
double x_value(size_t t, int rank, size_t i);
float weight_value(size_t t, int j);
void run_experts(loomDataType_t dt, size_t H, const int32_t *expert_rank, int E,
                 const loomMoeLayoutInfo_t *info, const void *in, void *out);
long long count_wrong(loomDataType_t dt, size_t H, const int32_t *topk, int k, size_t T,
                      const int32_t *src, const void *y);
void phase_medians(double *all, int iters, double *med);
void predict(const opts_t *o, const routing_t *r, const uint64_t *rows, const moe_x_links_t *links,
             FILE *xf, result_t *x);
void time_alltoallv(const opts_t *o, const routing_t *r, const uint64_t *rows, result_t *x);
void project_rows(const opts_t *o, int k, int G, double *out);
void print_header(const routing_t *r, const opts_t *o, const moe_x_links_t *links);
void print_row(const opts_t *o, const routing_t *r, const result_t *x, double naive_total);
int proj_valid(const opts_t *o, int i);
void print_projection(const opts_t *o, const routing_t *r, const result_t *res, int nres);
void write_json(const opts_t *o, const routing_t *r, const result_t *res, int nres,
                const double *geo, const int *geo_n, const char *links);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_shim_perf.h - what the files of nccl_shim_perf share. The program measures what the
 * drop-in NCCL library (libloom-nccl.so in LOOM_NCCL_MODE=loom) costs over calling loom
 * directly: every collective is issued through nccl.h on a communicator of the library and
 * through loom.h on a loom communicator of the same ranks, the two timed in alternating
 * blocks. nccl_shim_perf.c holds main, the flags and the timing; nccl_shim_perf_colls.c the
 * collectives, each spelled both ways; nccl_shim_perf_report.c the table and -J.
 * docs/PERFORMANCE.md, "Cost of the drop-in library", explains the columns.
 */
#ifndef LOOM_BENCH_NCCL_SHIM_PERF_H
#define LOOM_BENCH_NCCL_SHIM_PERF_H

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "loom.h"
#include "options.h"

/* One collective, both ways. count is the call's count argument (elements of float32); the
 * buffers hold send_elems and recv_elems elements. Send/Recv is a ring in one group: to rank
 * + 1, from rank - 1 (an exchange, a ping-pong, on two ranks). */
typedef struct nsp_coll {
    const char *name; /* the table's and the JSON records' name */
    const char *key;  /* its name for -c */
    const char *op;   /* "sum" for the reductions, "none" for the others */
    int root;         /* Broadcast's root; -1 for the others */
    size_t (*send_elems)(size_t count, int nranks);
    size_t (*recv_elems)(size_t count, int nranks);
    ncclResult_t (*via_shim)(const float *send, float *recv, size_t count, ncclComm_t comm,
                             int rank, int nranks);
    loomResult_t (*direct)(const float *send, float *recv, size_t count, loomComm_t comm, int rank,
                           int nranks);
} nsp_coll_t;

extern const nsp_coll_t nsp_colls[];
extern const int nsp_ncolls;

/* The flags: the sweep in bench_opts_t (-b, -e, -f, -n, -w, -J), the collectives in -c. */
typedef struct nsp_opts {
    bench_opts_t sweep; /* iters: repetitions of a block pair; warmup_iters: calls per path */
    unsigned colls;     /* bit i: nsp_colls[i] */
} nsp_opts_t;

void nsp_parse(int argc, char **argv, nsp_opts_t *o);

/* Calls per timed block at a row of `bytes`: many for small messages, so that a block
 * outlasts the clock's resolution and the loop's own cost, one for large ones. */
int nsp_block_calls(size_t bytes);

/* One row of a collective's table: times are the ranks' average of each rank's median over
 * the repetitions; overhead_ns the ranks' average of the median paired difference. */
typedef struct nsp_row {
    size_t bytes, count;
    int calls_per_block;
    double shim_us, direct_us, overhead_ns;
    long long wrong; /* elements, over all ranks, where the two paths' outputs differ */
} nsp_row_t;

/* The report (nccl_shim_perf_report.c); rank 0 prints, every rank may call. */
void nsp_report_open(const nsp_opts_t *o, int argc, char **argv, int rank, int nranks);
void nsp_report_coll_start(const nsp_coll_t *c);
void nsp_report_row(const nsp_coll_t *c, const nsp_row_t *r);
void nsp_report_coll_end(const nsp_coll_t *c, const nsp_row_t *first);
/* Closes the table and -J; msg (may be NULL) is the run's error. */
void nsp_report_close(long long wrong_rows, const char *msg);

#endif /* LOOM_BENCH_NCCL_SHIM_PERF_H */

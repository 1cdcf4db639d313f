/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_exchange.h - moe_perf's view of one step's exchanges as bytes between pairs of ranks:
 * the matrices that dispatch and combine move (from row counts and the wire format of
 * docs/moe.md), the cost model's prediction of them on a communicator's measured link
 * constants, and the replay file that bench/peers/mpi_alltoallv_bench.c runs through
 * MPI_Alltoallv. The prediction reads the communicator's internals (its link constants and
 * host layout), which is why this file, and not moe_perf.c, includes them.
 */
#ifndef LOOM_BENCH_MOE_EXCHANGE_H
#define LOOM_BENCH_MOE_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

/* Every segment (to each rank, itself included) starts with this header, rows or not. */
#define MOE_X_HEADER 16

/* The wire stride of a dispatch row: round16(round4(H s) + 4 + 6 P), P pairs per row. */
size_t moe_x_dispatch_row(size_t hidden, size_t elem_bytes, size_t pairs);
/* A combine row: H float32 partials. */
size_t moe_x_combine_row(size_t hidden);

/* rows[s * G + d]: rows rank s sends rank d in one step's dispatch. disp and comb (G x G)
 * receive the bytes rank s sends rank d in dispatch and in combine (which runs the segments
 * backwards, one float32 row per dispatch row). */
void moe_x_bytes(const uint64_t *rows, int G, size_t disp_row, size_t comb_row, double *disp,
                 double *comb);

/* What the prediction needs of a communicator, read when it is made: its link class's
 * constants, those inside a host, the L2 the model reads, and each rank's host. */
typedef struct moe_x_links moe_x_links_t;

/* NULL when out of memory. */
moe_x_links_t *moe_x_links_get(loomComm_t comm);
void moe_x_links_free(moe_x_links_t *l);
/* "tcp: alpha ... (measured), ...; 4 hosts x 2 ranks" into buf. */
void moe_x_links_describe(const moe_x_links_t *l, char *buf, size_t len);

/* The model's time in microseconds for an exchange of bytes[s * G + d]: the busiest rank's,
 * where a rank pays one step, a message to and from each peer, and its bytes to and from
 * other hosts on its host's link (shared by the host's ranks) plus those inside its host on
 * the host's own links. */
double moe_x_predict_us(const moe_x_links_t *l, const double *bytes);

/* One step of the replay file: a line "step B dispatch|combine", then G lines of G byte
 * counts (row s: what rank s sends to each rank). The first line names the format. */
void moe_x_write_header(FILE *f, int G, const char *what);
void moe_x_write_step(FILE *f, int G, int step, const char *phase, const double *bytes);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * coll.h - what a collective algorithm receives and the registry of
 * algorithms per collective. Every algorithm is a plain function with the
 * same signature; algo_select.c picks one per call from data (LOOM_ALGO, then
 * the default rules), never from if-chains spread through the code.
 * Algorithms talk to peers only through p2p.h and reduce only through kernels.h.
 */
#ifndef LOOM_COLL_H
#define LOOM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "p2p.h"

typedef enum {
    LOOM_COLL_ALLREDUCE,
    LOOM_COLL_ALLGATHER,
    LOOM_COLL_REDUCE_SCATTER,
    LOOM_COLL_BCAST,
    LOOM_COLL_REDUCE,
    LOOM_COLL_ALLTOALL,
    LOOM_COLL_ALLTOALLV,
    LOOM_COLL_BARRIER,
    LOOM_COLL_NUM
} loom_coll_kind_t;

/* One call's arguments, exactly as the public API received them (validated). */
typedef struct {
    loom_coll_kind_t kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count; /* the API's count: per rank for allgather/reduce_scatter/alltoall */
    loomDataType_t dt;
    loomRedOp_t op;
    int root;
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls; /* alltoallv, [nranks] */
} loom_coll_args_t;

/* Per-communicator state shared by all algorithms. */
typedef struct {
    loom_p2p_t *p2p;
    int rank;
    int nranks;
    uint64_t seq;     /* sequence number of the running collective (tags, messages) */
    uint8_t *scratch; /* grows on demand up to scratch_limit */
    size_t scratch_bytes;
    size_t chunk_bytes; /* pipeline chunk per peer (LOOM_CHUNK_BYTES) */
} loom_coll_ctx_t;

typedef loomResult_t (*loom_algo_fn_t)(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

typedef struct {
    loom_coll_kind_t kind;
    const char *name; /* LOOM_ALGO spelling */
    loom_algo_fn_t fn;
    size_t max_bytes; /* default only up to this many bytes (loom_coll_bytes); 0 = any */
} loom_algo_t;

/* Algorithms (one file per collective). */
loomResult_t loom_allreduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_reduce_bcast(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoallv_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_barrier_dissemination(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* Runs one collective with the selected algorithm; *algo_name_p (may be NULL)
 * receives the algorithm's name. */
loomResult_t loom_coll_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                           const char **algo_name_p);
const char *loom_coll_name(loom_coll_kind_t kind);
/* The algorithm table (first entry of a collective = its default). */
const loom_algo_t *loom_algo_table(int *n_p);
/* Bytes one rank sends or receives at most (for traces and benchmarks). */
size_t loom_coll_bytes(const loom_coll_args_t *a, int nranks);

/* Scratch of at least nbytes, kept for later calls. */
loomResult_t loom_coll_scratch(loom_coll_ctx_t *ctx, size_t nbytes, uint8_t **buf_p);
void loom_coll_ctx_free(loom_coll_ctx_t *ctx);

/* A contiguous range of elements. */
typedef struct {
    size_t off;
    size_t len;
} loom_span_t;

/* The reduce step shared by allreduce, reduce-scatter and reduce: every rank
 * sends sendbuff[spans[o]] to each owner o with spans[o].len > 0 (spans are
 * equal on all ranks); an owner receives its span from every rank and writes
 * the reduction, in rank order, to dst. Bounded scratch: (n-1) spans. */
loomResult_t loom_coll_reduce_to_owners(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                        const loom_span_t *spans, void *dst, unsigned step);

/* Even split of count elements over n parts: part r is [off, off+len). */
static inline void loom_split(size_t count, int n, int r, size_t *off_p, size_t *len_p)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    size_t ur = (size_t)r;
    *len_p = base + (ur < rem ? 1 : 0);
    *off_p = ur * base + (ur < rem ? ur : rem);
}

#endif

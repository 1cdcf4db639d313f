/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_util.h - small pieces the network algorithms (algo_*.c) share: the
 * accumulator datatype that partial reductions travel in, scratch carved
 * into aligned parts, the fold of a rank count onto a power of two, and a
 * request list that waits only on what was posted. No algorithm lives here.
 */
#ifndef LOOM_ALGO_UTIL_H
#define LOOM_ALGO_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Partial reductions travel and combine in the accumulator type: float32 for
 * the 16- and 8-bit floats, the datatype itself otherwise. Combining two
 * partials is then an ordinary accumulate over that type (avg sums, as the
 * kernels' avg does), and the one rounding to the datatype happens in
 * loom_reduce_finish at the end. */
static inline loomDataType_t loom_acc_dtype(loomDataType_t dt)
{
    return loom_acc_is_native(dt) ? dt : loomFloat32;
}

/* acc[i] = acc[i] op part[i], both partials in the accumulator type. */
static inline void loom_combine_partials(loomDataType_t dt, loomRedOp_t op, void *acc,
                                         const void *part, size_t n)
{
    loom_reduce_acc(loom_acc_dtype(dt), op, acc, part, n);
}

/* Elements per pipeline segment: LOOM_CHUNK_BYTES of the datatype, at least 1. */
static inline size_t loom_chunk_elems(const loom_coll_ctx_t *ctx, size_t elem_bytes)
{
    size_t ce = ctx->chunk_bytes / elem_bytes;
    return ce ? ce : 1;
}

/* The collective scratch split into k parts of sizes[i] bytes, each 64-byte
 * aligned; parts[i] is NULL for a part of 0 bytes. */
loomResult_t loom_coll_scratch_parts(loom_coll_ctx_t *ctx, const size_t *sizes, int k,
                                     uint8_t **parts);

/* The usual fold of n ranks onto p = 2^floor(log2 n) virtual ranks: of the
 * first 2*rem ranks (rem = n - p) each even rank hands its data to the odd
 * rank above it and sits out; the odd rank 2v+1 becomes virtual rank v, and
 * rank r >= 2*rem becomes r - rem. Virtual ranks keep the real ranks' order. */
typedef struct {
    int p;     /* power of two <= n */
    int rem;   /* n - p */
    int vrank; /* this rank's virtual rank, -1 if it sits out */
} loom_fold_t;

static inline loom_fold_t loom_fold(int n, int rank)
{
    loom_fold_t f;
    f.p = 1;
    while (f.p * 2 <= n)
        f.p *= 2;
    f.rem = n - f.p;
    if (rank < 2 * f.rem)
        f.vrank = rank % 2 ? rank / 2 : -1;
    else
        f.vrank = rank - f.rem;
    return f;
}

/* The real rank of virtual rank v. */
static inline int loom_fold_real(const loom_fold_t *f, int v)
{
    return v < f->rem ? 2 * v + 1 : v + f->rem;
}

/* The first real rank whose data virtual rank v carries, and how many. */
static inline int loom_fold_first(const loom_fold_t *f, int v)
{
    return v < f->rem ? 2 * v : v + f->rem;
}
static inline int loom_fold_width(const loom_fold_t *f, int v)
{
    return v < f->rem ? 2 : 1;
}

/* A handful of requests posted together and waited together. Sends and
 * receives of length 0 are not posted (both sides skip them alike). */
typedef struct {
    loom_p2p_req_t r[8];
    int n;
} loom_reqs_t;

loomResult_t loom_reqs_send(loom_coll_ctx_t *ctx, loom_reqs_t *q, int peer, const void *buf,
                            size_t nbytes, uint32_t tag);
loomResult_t loom_reqs_recv(loom_coll_ctx_t *ctx, loom_reqs_t *q, int peer, void *buf,
                            size_t nbytes, uint32_t tag);
/* Waits for every request in q, then empties it. */
loomResult_t loom_reqs_wait(loom_coll_ctx_t *ctx, loom_reqs_t *q);

/* One transfer of a paced exchange: nbytes to (send) or from peer. */
typedef struct {
    int peer;
    int send;
    uint8_t *buf;
    size_t nbytes;
} loom_xfer_t;

/* Runs the transfers together, each cut into pieces of LOOM_CHUNK_BYTES with
 * at most ctx->ring_depth pieces of each in flight: round k+depth is posted
 * once piece k of every transfer has completed. A large message posted whole
 * fills the sockets with megabytes that the receiver copies out long after
 * they left the cache; paced, it moves like the ring's segments
 * (docs/PERFORMANCE.md, *Defaults of the shm collectives and the tcp
 * transport*). Both ends of a transfer must pass the same nbytes; transfers
 * of 0 bytes are skipped. */
loomResult_t loom_coll_paced(loom_coll_ctx_t *ctx, const loom_xfer_t *x, int nx, uint32_t tag);
/* The paced exchange of AllGather and AllToAll direct: block p of recv (bytes
 * each) from every other rank p, and to every other rank p the block at
 * send + p * send_stride (AllGather: stride 0, the same block to everyone),
 * receiving from rank-d and sending to rank+d for d = 1..n-1. */
loomResult_t loom_coll_paced_blocks(loom_coll_ctx_t *ctx, uint8_t *recv, const uint8_t *send,
                                    size_t send_stride, size_t bytes);

/* The paced exchange of AllGatherV direct: rank p's block (counts[p] elements of es bytes,
 * at element displs[p] of recv) from every other rank p, and this rank's block from send to
 * every other rank, in the order of loom_coll_paced_blocks; empty blocks move nothing. */
loomResult_t loom_coll_paced_gatherv(loom_coll_ctx_t *ctx, uint8_t *recv, const size_t *counts,
                                     const size_t *displs, size_t es, const uint8_t *send);

/* AllGatherV: copies this rank's block from sendbuff to its place in recvbuff, unless the
 * call is in place or the block is empty (allgather.c). */
void loom_coll_gatherv_own(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* A context for part of ctx's communicator: n ranks, group[i] the
 * communicator rank of part rank i, this rank being `rank`; link: the
 * constants between them. It has no hosts of its own (no hierarchy inside a
 * part) and borrows ctx's scratch: whoever runs an algorithm on the part hands
 * part->scratch and part->scratch_bytes back to ctx afterwards, since growing
 * it frees the old one. */
void loom_coll_part_init(loom_coll_ctx_t *part, const loom_coll_ctx_t *ctx, const int *group,
                         int rank, int n, const loom_link_cost_t *link);

/* The all-gather half of the ring (algo_ring.c) over arbitrary blocks: block b
 * is len[b] elements at element offset off[b] of out, and this rank's block is
 * already in place. Used by AllGather ring and Broadcast scatter_allgather. */
loomResult_t loom_coll_ring_allgather_blocks(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                             const size_t *off, const size_t *len, void *out);

#ifdef __cplusplus
}
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_tiny.c - the tiny shm collectives: calls whose input per rank fits one
 * arena cell (LOOM_ARENA_CELL_BYTES, 48 bytes; p2p.h). Each contributing rank
 * writes its packed descriptor and its whole input into its cell of the call
 * and posts; a reader spins on the peer's cell, so one cache miss brings the
 * news, the descriptor and the data together. Calls take no descriptor buffer
 * and no slot half, and a rank that waits for nobody (a broadcast root, a
 * reduce's non-roots) returns at once and runs ahead by up to
 * LOOM_ARENA_CELLS - 1 calls, as a pipelined MPI does.
 * It holds the tiny family only; the "shm" entries of shm_reduce.c and
 * shm_move.c call it for calls that fit (loom_shm_pick).
 *
 * Reductions go through loom_shm_reduce over the cells in rank order, so the
 * bits equal the other shm and the point-to-point algorithms'.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "shm_coll.h"

/* Bytes of a rank's input, which its cell carries. */
static size_t input_bytes(const loom_coll_args_t *a, int n)
{
    const size_t es = loom_dtype_size(a->dt);
    switch (a->kind) {
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLTOALL:
        return a->count * es * (size_t)n;
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_BCAST:
    case LOOM_COLL_REDUCE:
        return a->count * es;
    default:
        return 0;
    }
}

static uint64_t packed(const loom_arena_desc_t *d)
{
    return loom_arena_tiny_desc(d->kind, d->dt, d->op, d->count, d->root);
}

/* Waits for rank's cell and checks its descriptor against this rank's. */
static loomResult_t take(shm_call_t *c, int rank, const uint8_t **data_p)
{
    uint64_t theirs;
    LOOM_CHECK(loom_arena_cell_wait(c->ar, rank, data_p, &theirs));
    if (theirs == packed(&c->desc))
        return loomSuccess;
    loom_arena_desc_t d;
    loom_shm_tiny_unpack(theirs, c->seq, &d);
    return loom_shm_mismatch(c, rank, &d);
}

/* Reduces element range [off, off + len) of every rank's cell into dst. */
static loomResult_t reduce_cells(shm_call_t *c, size_t off, size_t len, void *dst)
{
    const void *srcs_small[SHM_SRCS_SMALL];
    const void **srcs = loom_shm_srcs(c->n, c->me, srcs_small);
    if (srcs == NULL)
        return loomSystemError;
    loomResult_t res = loomSuccess;
    for (int r = 0; r < c->n && res == loomSuccess; r++) {
        const uint8_t *data;
        res = take(c, r, &data);
        srcs[r] = data + off * c->es;
    }
    if (res == loomSuccess) {
        /* Sources are cells, never dst: the fused kernel needs no accumulators. */
        uint64_t acc[LOOM_ARENA_CELL_BYTES]; /* 8 bytes per element at most */
        loom_shm_reduce(c, srcs, len, acc, dst, NULL);
    }
    loom_shm_srcs_free(srcs, srcs_small);
    return res;
}

loomResult_t loom_shm_tiny(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    shm_call_t c;
    LOOM_CHECK(loom_shm_call_init(&c, ctx, a));
    loom_shm_describe(&c, SHM_ALGO_TINY);
    const size_t bytes = input_bytes(a, c.n);
    if (bytes == 0 || bytes > LOOM_ARENA_CELL_BYTES) {
        LOOM_WARN("rank %d: %s of %zu bytes per rank does not fit a tiny-call cell", c.me,
                  loom_coll_name(a->kind), bytes);
        return loomInternalError;
    }
    const size_t blk = bytes / (size_t)c.n; /* reduce-scatter and all-to-all blocks */
    const int root = a->root;
    loom_arena_tiny_begin(c.ar, c.seq);
    const uint8_t *data;
    switch (a->kind) {
    case LOOM_COLL_BCAST:
        if (c.me == root) {
            LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
            if (a->recvbuff != a->sendbuff)
                memcpy(a->recvbuff, a->sendbuff, bytes);
        } else {
            LOOM_CHECK(take(&c, root, &data));
            memcpy(a->recvbuff, data, bytes);
        }
        break;
    case LOOM_COLL_REDUCE:
        LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
        if (c.me == root)
            LOOM_CHECK(reduce_cells(&c, 0, a->count, a->recvbuff));
        break;
    case LOOM_COLL_ALLREDUCE:
        LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
        LOOM_CHECK(reduce_cells(&c, 0, a->count, a->recvbuff));
        break;
    case LOOM_COLL_REDUCE_SCATTER:
        LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
        LOOM_CHECK(reduce_cells(&c, (size_t)c.me * a->count, a->count, a->recvbuff));
        break;
    case LOOM_COLL_ALLGATHER:
        LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
        for (int r = 0; r < c.n; r++) {
            LOOM_CHECK(take(&c, r, &data));
            memcpy((uint8_t *)a->recvbuff + (size_t)r * bytes, data, bytes);
        }
        break;
    case LOOM_COLL_ALLTOALL:
        LOOM_CHECK(loom_arena_cell_publish(c.ar, packed(&c.desc), a->sendbuff, bytes));
        for (int r = 0; r < c.n; r++) {
            LOOM_CHECK(take(&c, r, &data));
            memcpy((uint8_t *)a->recvbuff + (size_t)r * blk, data + (size_t)c.me * blk, blk);
        }
        break;
    default:
        LOOM_WARN("rank %d: %s has no tiny shm algorithm", c.me, loom_coll_name(a->kind));
        return loomInternalError;
    }
    loom_arena_tiny_end(c.ar);
    return loom_shm_end(&c);
}

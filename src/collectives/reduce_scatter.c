/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce_scatter.c - ReduceScatter and ReduceScatterV algorithms.
 *
 * direct: rank o owns block o (recvcount elements, or recvcounts[o] starting
 * at the prefix sum rdispls[o] for ReduceScatterV) of every rank's sendbuff.
 * In rounds of at most LOOM_CHUNK_BYTES per block, every rank sends its part
 * of block o straight to o, which reduces the n parts in rank order into
 * recvbuff (loom_coll_reduce_to_owners); a block shorter than the round has
 * no part in it. Bytes on the wire per rank: (n-1)/n of the send size for
 * equal blocks, out and in; an owner receives (n-1) times its block; n-1
 * messages each way per round. Equal counts give the even call's rounds and
 * spans, hence its bits. In place (recvbuff == sendbuff + the block's offset)
 * accumulates in scratch.
 */
#include <stdlib.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

/* Block o is len[o] elements at element off[o] of sendbuff; len == NULL: every block is
 * a->count elements at o * a->count. */
static loomResult_t reduce_scatter_blocks(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                          const size_t *off, const size_t *len)
{
    const int n = ctx->nranks;
    const size_t es = loom_dtype_size(a->dt);
    size_t ce = ctx->chunk_bytes / es;
    if (ce == 0)
        ce = 1;
    size_t maxlen = len ? 0 : a->count;
    for (int o = 0; len && o < n; o++)
        maxlen = len[o] > maxlen ? len[o] : maxlen;
    size_t rounds = (maxlen + ce - 1) / ce;
    loom_span_t spans_small[16];
    loom_span_t *spans = n <= 16 ? spans_small : malloc(sizeof(*spans) * (size_t)n);
    if (spans == NULL) {
        LOOM_WARN("out of memory for %d ranks", n);
        return loomSystemError;
    }
    loomResult_t res = loomSuccess;
    for (size_t k = 0; k < rounds && res == loomSuccess; k++) {
        size_t start = k * ce;
        for (int o = 0; o < n; o++) {
            size_t lo = len ? len[o] : a->count;
            spans[o].off = (len ? off[o] : (size_t)o * a->count) + start;
            spans[o].len = start >= lo ? 0 : lo - start < ce ? lo - start : ce;
        }
        /* A rank with no part in this round gets no output (its recvbuff may be NULL). */
        uint8_t *dst = spans[ctx->rank].len ? (uint8_t *)a->recvbuff + start * es : NULL;
        res = loom_coll_reduce_to_owners(ctx, a, spans, dst, 1);
    }
    if (spans != spans_small)
        free(spans);
    return res;
}

loomResult_t loom_reduce_scatter_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return reduce_scatter_blocks(ctx, a, NULL, NULL);
}

loomResult_t loom_reduce_scatterv_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return reduce_scatter_blocks(ctx, a, a->rdispls, a->recvcounts);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce_scatter.c - ReduceScatter algorithms.
 *
 * direct: rank o owns block o (recvcount elements) of every rank's sendbuff.
 * In rounds of at most LOOM_CHUNK_BYTES per block, every rank sends its part
 * of block o straight to o, which reduces the n parts in rank order into
 * recvbuff (loom_coll_reduce_to_owners). Bytes on the wire per rank:
 * (n-1)/n of the send size, out and in; n-1 messages each way per round.
 * In place (recvbuff == sendbuff + rank*recvcount) accumulates in scratch.
 */
#include <stdlib.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

loomResult_t loom_reduce_scatter_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks;
    const size_t es = loom_dtype_size(a->dt);
    size_t ce = ctx->chunk_bytes / es;
    if (ce == 0)
        ce = 1;
    size_t rounds = (a->count + ce - 1) / ce;
    loom_span_t spans_small[16];
    loom_span_t *spans = n <= 16 ? spans_small : malloc(sizeof(*spans) * (size_t)n);
    if (spans == NULL) {
        LOOM_WARN("out of memory for %d ranks", n);
        return loomSystemError;
    }
    loomResult_t res = loomSuccess;
    for (size_t k = 0; k < rounds && res == loomSuccess; k++) {
        size_t start = k * ce;
        size_t len = a->count - start < ce ? a->count - start : ce;
        for (int o = 0; o < n; o++) {
            spans[o].off = (size_t)o * a->count + start;
            spans[o].len = len;
        }
        res = loom_coll_reduce_to_owners(ctx, a, spans, (uint8_t *)a->recvbuff + start * es, 1);
    }
    if (spans != spans_small)
        free(spans);
    return res;
}

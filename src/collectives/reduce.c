/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce.c - Reduce algorithms.
 *
 * direct: in rounds of at most LOOM_CHUNK_BYTES, every rank sends its chunk to
 * the root, which reduces the n chunks in rank order into recvbuff
 * (loom_coll_reduce_to_owners with the root as the only owner). Bytes on the
 * wire: S per non-root rank, (n-1) S into the root; the root's link is the
 * bottleneck, which the binomial tree (algo_tree.c) relieves at the price of
 * ceil(log2 n) dependent steps.
 */
#include <stdlib.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

loomResult_t loom_reduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
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
    for (int o = 0; o < n; o++)
        spans[o].off = spans[o].len = 0;
    loomResult_t res = loomSuccess;
    for (size_t k = 0; k < rounds && res == loomSuccess; k++) {
        size_t start = k * ce;
        spans[a->root].off = start;
        spans[a->root].len = a->count - start < ce ? a->count - start : ce;
        /* recvbuff may be NULL off the root: form the pointer only where it is used. */
        uint8_t *dst = ctx->rank == a->root ? (uint8_t *)a->recvbuff + start * es : NULL;
        res = loom_coll_reduce_to_owners(ctx, a, spans, dst, 1);
    }
    if (spans != spans_small)
        free(spans);
    return res;
}

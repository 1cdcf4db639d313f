/* SPDX-License-Identifier: Apache-2.0
 *
 * allreduce.c - AllReduce algorithms.
 *
 * direct (two-shot): the count elements are split evenly into n slices, slice
 * o owned by rank o. In rounds of at most LOOM_CHUNK_BYTES per slice:
 *   1. reduce-scatter: every rank sends its part of each slice straight to the
 *      slice's owner, which reduces the n parts in rank order
 *      (loom_coll_reduce_to_owners);
 *   2. all-gather: each owner sends its reduced part to every other rank,
 *      which receives it straight into recvbuff.
 * Bytes on the wire per rank: 2 (n-1)/n S out and in (the bandwidth optimum),
 * with 2(n-1) messages per round but only two dependent steps; the cost
 * model weighs that against the ring and butterflies (algo_ring.c,
 * algo_rhd.c).
 * In place is safe: a rank's input of slice o for round k has been sent
 * before the reduced result of that part can arrive in the same place.
 *
 * reduce_bcast: reduce to rank 0 (rank order, loom_reduce_direct), then
 * broadcast from rank 0 (loom_bcast_direct). 2(n-1) messages in all instead
 * of 2n(n-1): the choice for small vectors, where messages cost more than bytes.
 */
#include <stdlib.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

loomResult_t loom_allreduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t es = loom_dtype_size(a->dt);
    size_t ce = ctx->chunk_bytes / es;
    if (ce == 0)
        ce = 1;
    size_t off0, len0;
    loom_split(a->count, n, 0, &off0, &len0); /* slice 0 is the longest */
    size_t rounds = (len0 + ce - 1) / ce;

    loom_span_t spans_small[16];
    loom_span_t *spans = n <= 16 ? spans_small : malloc(sizeof(*spans) * (size_t)n);
    loom_p2p_req_t reqs_small[32];
    loom_p2p_req_t *reqs = 2 * n <= 32 ? reqs_small : malloc(sizeof(*reqs) * 2 * (size_t)n);
    loomResult_t res = loomSuccess;
    if (spans == NULL || reqs == NULL) {
        LOOM_WARN("out of memory for %d ranks", n);
        res = loomSystemError;
        goto out;
    }
    uint8_t *recv = a->recvbuff;
    const uint32_t tag = loom_tag_coll(ctx->seq, 2);
    for (size_t k = 0; k < rounds; k++) {
        for (int o = 0; o < n; o++) {
            size_t off, len;
            loom_split(a->count, n, o, &off, &len);
            size_t start = k * ce;
            spans[o].off = off + start;
            spans[o].len = start >= len ? 0 : (len - start < ce ? len - start : ce);
        }
        LOOM_CHECK_GOTO(loom_coll_reduce_to_owners(ctx, a, spans, recv + spans[me].off * es, 1),
                        res, out);
        int nreq = 0;
        for (int d = 1; d < n; d++) {
            int p = (me - d + n) % n;
            if (spans[p].len > 0)
                LOOM_CHECK_GOTO(loom_coll_irecv(ctx, p, recv + spans[p].off * es, spans[p].len * es,
                                                tag, &reqs[nreq++]),
                                res, out);
        }
        for (int d = 1; d < n && spans[me].len > 0; d++) {
            int p = (me + d) % n;
            LOOM_CHECK_GOTO(loom_coll_isend(ctx, p, recv + spans[me].off * es, spans[me].len * es,
                                            tag, &reqs[nreq++]),
                            res, out);
        }
        LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    }
out:
    if (spans != spans_small)
        free(spans);
    if (reqs != reqs_small)
        free(reqs);
    return res;
}

loomResult_t loom_allreduce_reduce_bcast(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_coll_args_t r = *a;
    r.kind = LOOM_COLL_REDUCE;
    r.root = 0;
    LOOM_CHECK(loom_reduce_direct(ctx, &r));
    loom_coll_args_t b = *a;
    b.kind = LOOM_COLL_BCAST;
    b.root = 0;
    b.sendbuff = a->recvbuff; /* rank 0 holds the result in recvbuff: broadcast in place */
    return loom_bcast_direct(ctx, &b);
}

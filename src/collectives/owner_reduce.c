/* SPDX-License-Identifier: Apache-2.0
 *
 * owner_reduce.c - the reduce-to-owners step that allreduce, reduce-scatter
 * and reduce share, and the scratch allocator of the collective context.
 *
 * Step: each owner o has a span of elements (equal on all ranks). Every rank
 * sends its copy of span o directly to o (n-1 messages per owner); owner o
 * receives the n-1 copies into scratch, then reduces the n contributions in
 * rank order 0..n-1 in the accumulator type and rounds once into dst.
 * Bytes on the wire per rank: sum over owners o != me of span o, in and out.
 * Fixed rank order is what makes results bitwise identical on every rank
 * (only the owner computes them) and from run to run.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"
#include "kernels.h"

loomResult_t loom_coll_grow(uint8_t **buf, size_t *bytes, size_t need, int rank, const char *what)
{
    if (need > *bytes) {
        uint8_t *b = NULL;
        if (posix_memalign((void **)&b, 64, need) != 0) {
            LOOM_WARN("rank %d: cannot allocate %zu bytes of %s", rank, need, what);
            return loomSystemError;
        }
        free(*buf);
        *buf = b;
        *bytes = need;
        LOOM_INFO(LOOM_LOG_ALLOC, "rank %d: %s is now %zu bytes", rank, what, need);
    }
    return loomSuccess;
}

loomResult_t loom_coll_scratch(loom_coll_ctx_t *ctx, size_t nbytes, uint8_t **buf_p)
{
    LOOM_CHECK(loom_coll_grow(&ctx->scratch, &ctx->scratch_bytes, nbytes, ctx->rank,
                              "collective scratch"));
    *buf_p = ctx->scratch;
    return loomSuccess;
}

void loom_coll_ctx_free(loom_coll_ctx_t *ctx)
{
    free(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    free(ctx->hier_buf);
    ctx->hier_buf = NULL;
    ctx->hier_bytes = 0;
    loom_hosts_free(&ctx->hosts);
}

/* finish: round into dst in the datatype; else dst takes the accumulator. */
static loomResult_t reduce_to_owners(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                     const loom_span_t *spans, void *dst, unsigned step, int finish)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t es = loom_dtype_size(a->dt);
    const size_t mylen = spans[me].len;
    const uint32_t tag = loom_tag_coll(ctx->seq, step);
    const uint8_t *send = a->sendbuff;
    uint8_t *slots = NULL, *acc = NULL;

    if (mylen > 0) {
        size_t slot_bytes = mylen * es;
        size_t need =
            (size_t)(n - 1) * slot_bytes + (finish ? mylen * loom_acc_size(a->dt) : 0) + 64;
        LOOM_CHECK(loom_coll_scratch(ctx, need, &slots));
        acc = slots + (size_t)(n - 1) * slot_bytes;
        acc += (64 - ((uintptr_t)acc & 63)) & 63;
    }

    loom_p2p_req_t reqs_small[16];
    loom_p2p_req_t *reqs = reqs_small;
    if (2 * n > 16 && (reqs = malloc(sizeof(*reqs) * 2 * (size_t)n)) == NULL) {
        LOOM_WARN("out of memory for %d requests", 2 * n);
        return loomSystemError;
    }
    int nreq = 0;
    loomResult_t res = loomSuccess;
    for (int k = 1; k < n && mylen > 0; k++) {
        int p = (me - k + n) % n; /* receive order mirrors the send order below */
        int slot = p < me ? p : p - 1;
        LOOM_CHECK_GOTO(loom_coll_irecv(ctx, p, slots + (size_t)slot * mylen * es, mylen * es, tag,
                                        &reqs[nreq++]),
                        res, out);
    }
    for (int k = 1; k < n; k++) {
        int o = (me + k) % n;
        if (spans[o].len == 0)
            continue;
        LOOM_CHECK_GOTO(loom_coll_isend(ctx, o, send + spans[o].off * es, spans[o].len * es, tag,
                                        &reqs[nreq++]),
                        res, out);
    }
    LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);

    if (mylen > 0) {
        const uint8_t *mine = send + spans[me].off * es;
        /* Accumulate straight into dst unless dst is our own input (in place) or the
         * accumulator is wider than the datatype. */
        void *target =
            !finish || (loom_acc_is_native(a->dt) && (const uint8_t *)dst != mine) ? dst : acc;
        for (int r = 0; r < n; r++) {
            const void *src = r == me ? mine : slots + (size_t)(r < me ? r : r - 1) * mylen * es;
            if (r == 0)
                loom_reduce_init(a->dt, target, src, mylen);
            else
                loom_reduce_acc(a->dt, a->op, target, src, mylen);
        }
        if (finish)
            loom_reduce_finish(a->dt, a->op, dst, target, mylen, n);
    }
out:
    if (reqs != reqs_small)
        free(reqs);
    return res;
}

loomResult_t loom_coll_reduce_to_owners(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                        const loom_span_t *spans, void *dst, unsigned step)
{
    return reduce_to_owners(ctx, a, spans, dst, step, 1);
}

loomResult_t loom_coll_reduce_to_owners_partial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                                const loom_span_t *spans, void *acc_dst,
                                                unsigned step)
{
    return reduce_to_owners(ctx, a, spans, acc_dst, step, 0);
}

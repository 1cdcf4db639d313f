/* SPDX-License-Identifier: Apache-2.0
 *
 * alltoall.c - AllToAll and AllToAllv.
 *
 * pairwise: in step d = 1..n-1 a rank sends to rank+d and receives from
 * rank-d; all steps run at once so the transports overlap them, and the
 * step order spreads the load so no rank is everyone's first target.
 * AllToAll paces its blocks in pieces (loom_coll_paced); AllToAllv posts each
 * message whole, since a receive must see the size its peer sent.
 * Blocks go straight from sendbuff to the peer's recvbuff (no staging).
 * Bytes on the wire per rank: the (n-1) blocks it sends and receives. The
 * rank's own block is copied locally.
 * AllToAllv checks that every peer sent exactly recvcounts[peer] elements.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "coll.h"
#include "dtype.h"

/* AllToAllv: counts/displacements in elements, per peer. */
static loomResult_t alltoall_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                 const size_t *scount, const size_t *sdispl, const size_t *rcount,
                                 const size_t *rdispl)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t es = loom_dtype_size(a->dt);
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    if (rcount[me] != scount[me]) {
        LOOM_WARN("rank %d: alltoallv sends %zu elements to itself but expects %zu", me, scount[me],
                  rcount[me]);
        return loomInvalidArgument;
    }
    if (scount[me] > 0)
        memmove(recv + rdispl[me] * es, send + sdispl[me] * es, scount[me] * es);
    if (n == 1)
        return loomSuccess;
    loom_p2p_req_t *reqs = malloc(sizeof(*reqs) * 2 * (size_t)n);
    if (reqs == NULL) {
        LOOM_WARN("out of memory for %d requests", 2 * n);
        return loomSystemError;
    }
    const uint32_t tag = loom_tag_coll(ctx->seq, 1);
    loomResult_t res = loomSuccess;
    int nreq = 0;
    for (int d = 1; d < n; d++) {
        int p = (me - d + n) % n;
        /* A NULL buffer is legal when the count is 0: never offset it. */
        void *dst = rcount[p] ? recv + rdispl[p] * es : NULL;
        LOOM_CHECK_GOTO(loom_coll_irecv(ctx, p, dst, rcount[p] * es, tag, &reqs[nreq++]), res, out);
    }
    for (int d = 1; d < n; d++) {
        int p = (me + d) % n;
        const void *src = scount[p] ? send + sdispl[p] * es : NULL;
        LOOM_CHECK_GOTO(loom_coll_isend(ctx, p, src, scount[p] * es, tag, &reqs[nreq++]), res, out);
    }
    LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    for (int i = 0; i < n - 1; i++) {
        if (reqs[i].done_bytes != reqs[i].nbytes) {
            LOOM_WARN("rank %d: rank %d sent %zu bytes but recvcounts says %zu bytes", me,
                      reqs[i].peer, reqs[i].done_bytes, reqs[i].nbytes);
            res = loomInvalidUsage;
        }
    }
out:
    free(reqs);
    return res;
}

loomResult_t loom_alltoall_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    if (bytes == 0)
        return loomSuccess;
    memmove(recv + (size_t)me * bytes, send + (size_t)me * bytes, bytes);
    if (n == 1)
        return loomSuccess;
    return loom_coll_paced_blocks(ctx, recv, send, bytes, bytes);
}

loomResult_t loom_alltoallv_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return alltoall_run(ctx, a, a->sendcounts, a->sdispls, a->recvcounts, a->rdispls);
}

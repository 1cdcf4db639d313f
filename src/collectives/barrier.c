/* SPDX-License-Identifier: Apache-2.0
 *
 * barrier.c - Barrier.
 *
 * dissemination (Hensgen, Finkel and Manber 1988): in round k a rank sends an
 * empty message to rank + 2^k and waits for one from rank - 2^k; after
 * ceil(log2 n) rounds every rank has heard, transitively, from every other.
 */
#include "check.h"
#include "coll.h"

loomResult_t loom_barrier_dissemination(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    (void)a;
    const int n = ctx->nranks, me = ctx->rank;
    unsigned step = 1;
    for (int dist = 1; dist < n; dist <<= 1, step++) {
        loom_p2p_req_t reqs[2];
        uint32_t tag = loom_tag_coll(ctx->seq, step);
        LOOM_CHECK(loom_coll_irecv(ctx, (me - dist + n) % n, NULL, 0, tag, &reqs[0]));
        LOOM_CHECK(loom_coll_isend(ctx, (me + dist) % n, NULL, 0, tag, &reqs[1]));
        LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, reqs, 2));
    }
    return loomSuccess;
}

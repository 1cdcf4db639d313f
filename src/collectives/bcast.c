/* SPDX-License-Identifier: Apache-2.0
 *
 * bcast.c - Broadcast algorithms.
 *
 * direct: the root sends the whole buffer to each of the n-1 other ranks
 * (all sends posted at once), which receive it straight into recvbuff.
 * Bytes on the wire: (n-1) S out of the root, S into every other rank.
 * Out of place, the root also copies sendbuff to its own recvbuff.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

loomResult_t loom_bcast_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    const uint32_t tag = loom_tag_coll(ctx->seq, 1);
    if (bytes == 0)
        return loomSuccess;
    if (me != a->root) {
        loom_p2p_req_t req;
        LOOM_CHECK(loom_coll_irecv(ctx, a->root, a->recvbuff, bytes, tag, &req));
        return loom_p2p_wait_all(ctx->p2p, &req, 1);
    }
    if (a->sendbuff != a->recvbuff)
        memcpy(a->recvbuff, a->sendbuff, bytes);
    if (n == 1)
        return loomSuccess;
    loom_p2p_req_t *reqs = malloc(sizeof(*reqs) * (size_t)n);
    if (reqs == NULL) {
        LOOM_WARN("out of memory for %d requests", n);
        return loomSystemError;
    }
    loomResult_t res = loomSuccess;
    int nreq = 0;
    for (int d = 1; d < n; d++)
        LOOM_CHECK_GOTO(loom_coll_isend(ctx, (me + d) % n, a->recvbuff, bytes, tag, &reqs[nreq++]),
                        res, out);
    res = loom_p2p_wait_all(ctx->p2p, reqs, nreq);
out:
    free(reqs);
    return res;
}

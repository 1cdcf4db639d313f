/* SPDX-License-Identifier: Apache-2.0
 *
 * allgather.c - AllGather algorithms.
 *
 * direct: every rank sends its block (sendcount elements) straight to every
 * other rank and receives each peer's block straight into its place in
 * recvbuff; all 2(n-1) messages are posted at once and the transports stream
 * them (no staging copy). Bytes on the wire per rank: (n-1) blocks out and in.
 * The own block is copied locally unless the call is in place
 * (sendbuff == recvbuff + rank*sendcount).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"

loomResult_t loom_allgather_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    uint8_t *recv = a->recvbuff;
    if (bytes == 0)
        return loomSuccess;
    if ((const uint8_t *)a->sendbuff != recv + (size_t)me * bytes)
        memcpy(recv + (size_t)me * bytes, a->sendbuff, bytes);
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
        LOOM_CHECK_GOTO(
            loom_coll_irecv(ctx, p, recv + (size_t)p * bytes, bytes, tag, &reqs[nreq++]), res, out);
    }
    for (int d = 1; d < n; d++) {
        int p = (me + d) % n;
        LOOM_CHECK_GOTO(loom_coll_isend(ctx, p, a->sendbuff, bytes, tag, &reqs[nreq++]), res, out);
    }
    res = loom_p2p_wait_all(ctx->p2p, reqs, nreq);
out:
    free(reqs);
    return res;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * allgather.c - AllGather and AllGatherV algorithms.
 *
 * direct: every rank sends its block (sendcount elements) straight to every
 * other rank and receives each peer's block straight into its place in
 * recvbuff; all 2(n-1) transfers run at once, paced in pieces
 * (loom_coll_paced), and the transports stream them (no staging copy).
 * Bytes on the wire per rank: (n-1) blocks out and in. The own block is
 * copied locally unless the call is in place (sendbuff == recvbuff +
 * rank*sendcount).
 * AllGatherV direct is the same exchange with each rank's block of its own
 * size, recvcounts[r] elements at displs[r] (loom_coll_paced_gatherv); the
 * rank with the largest block B sends (n-1) B.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
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
    return loom_coll_paced_blocks(ctx, recv, a->sendbuff, 0, bytes);
}

void loom_coll_gatherv_own(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t es = loom_dtype_size(a->dt), bytes = a->recvcounts[ctx->rank] * es;
    uint8_t *own = bytes ? (uint8_t *)a->recvbuff + a->rdispls[ctx->rank] * es : NULL;
    if (bytes && (const uint8_t *)a->sendbuff != own)
        memcpy(own, a->sendbuff, bytes);
}

loomResult_t loom_allgatherv_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    loom_coll_gatherv_own(ctx, a);
    if (ctx->nranks == 1)
        return loomSuccess;
    return loom_coll_paced_gatherv(ctx, a->recvbuff, a->recvcounts, a->rdispls,
                                   loom_dtype_size(a->dt), a->sendbuff);
}

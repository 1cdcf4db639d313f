/* SPDX-License-Identifier: Apache-2.0
 *
 * allgather.c - AllGather algorithms.
 *
 * direct: every rank sends its block (sendcount elements) straight to every
 * other rank and receives each peer's block straight into its place in
 * recvbuff; all 2(n-1) transfers run at once, paced in pieces
 * (loom_coll_paced), and the transports stream them (no staging copy).
 * Bytes on the wire per rank: (n-1) blocks out and in. The own block is
 * copied locally unless the call is in place (sendbuff == recvbuff +
 * rank*sendcount).
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
    loom_xfer_t *x = malloc(sizeof(*x) * 2 * (size_t)n);
    if (x == NULL) {
        LOOM_WARN("out of memory for %d transfers", 2 * n);
        return loomSystemError;
    }
    int nx = 0;
    for (int d = 1; d < n; d++) {
        int p = (me - d + n) % n;
        x[nx++] =
            (loom_xfer_t){.peer = p, .send = 0, .buf = recv + (size_t)p * bytes, .nbytes = bytes};
    }
    for (int d = 1; d < n; d++)
        x[nx++] = (loom_xfer_t){
            .peer = (me + d) % n, .send = 1, .buf = (uint8_t *)a->sendbuff, .nbytes = bytes};
    loomResult_t res = loom_coll_paced(ctx, x, nx, loom_tag_coll(ctx->seq, 1));
    free(x);
    return res;
}

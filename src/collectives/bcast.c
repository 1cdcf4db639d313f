/* SPDX-License-Identifier: Apache-2.0
 *
 * bcast.c - Broadcast algorithms.
 *
 * direct: the root sends the whole buffer to each of the n-1 other ranks
 * (all sends at once, paced in pieces by loom_coll_paced), which receive it
 * straight into recvbuff.
 * Bytes on the wire: (n-1) S out of the root, S into every other rank.
 * Out of place, the root also copies sendbuff to its own recvbuff.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
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
        loom_xfer_t x = {.peer = a->root, .send = 0, .buf = a->recvbuff, .nbytes = bytes};
        return loom_coll_paced(ctx, &x, 1, tag);
    }
    if (a->sendbuff != a->recvbuff)
        memcpy(a->recvbuff, a->sendbuff, bytes);
    if (n == 1)
        return loomSuccess;
    loom_xfer_t *x = malloc(sizeof(*x) * (size_t)n);
    if (x == NULL) {
        LOOM_WARN("out of memory for %d transfers", n);
        return loomSystemError;
    }
    for (int d = 1; d < n; d++)
        x[d - 1] =
            (loom_xfer_t){.peer = (me + d) % n, .send = 1, .buf = a->recvbuff, .nbytes = bytes};
    loomResult_t res = loom_coll_paced(ctx, x, n - 1, tag);
    free(x);
    return res;
}

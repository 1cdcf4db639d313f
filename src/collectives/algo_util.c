/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_util.c - the shared helpers of algo_util.h: scratch carved into
 * aligned parts and the small request list of the exchange-based algorithms.
 */
#include "algo_util.h"

#include <string.h>

#include "check.h"

#define PART_ALIGN 64

static size_t round_up(size_t x)
{
    return (x + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN;
}

loomResult_t loom_coll_scratch_parts(loom_coll_ctx_t *ctx, const size_t *sizes, int k,
                                     uint8_t **parts)
{
    size_t total = 0;
    for (int i = 0; i < k; i++) {
        if (sizes[i] > SIZE_MAX / 2 - total) {
            LOOM_WARN("rank %d: collective scratch of more than %zu bytes requested", ctx->rank,
                      SIZE_MAX / 2);
            return loomSystemError;
        }
        total += round_up(sizes[i]);
    }
    uint8_t *base = NULL;
    if (total > 0)
        LOOM_CHECK(loom_coll_scratch(ctx, total, &base));
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        parts[i] = sizes[i] ? base + off : NULL;
        off += round_up(sizes[i]);
    }
    return loomSuccess;
}

static loomResult_t reqs_room(loom_coll_ctx_t *ctx, const loom_reqs_t *q)
{
    if (q->n < (int)(sizeof(q->r) / sizeof(q->r[0])))
        return loomSuccess;
    LOOM_WARN("rank %d: more than %zu requests in one exchange", ctx->rank,
              sizeof(q->r) / sizeof(q->r[0]));
    return loomInternalError;
}

loomResult_t loom_reqs_send(loom_coll_ctx_t *ctx, loom_reqs_t *q, int peer, const void *buf,
                            size_t nbytes, uint32_t tag)
{
    if (nbytes == 0)
        return loomSuccess;
    LOOM_CHECK(reqs_room(ctx, q));
    LOOM_CHECK(loom_coll_isend(ctx, peer, buf, nbytes, tag, &q->r[q->n]));
    q->n++;
    return loomSuccess;
}

loomResult_t loom_reqs_recv(loom_coll_ctx_t *ctx, loom_reqs_t *q, int peer, void *buf,
                            size_t nbytes, uint32_t tag)
{
    if (nbytes == 0)
        return loomSuccess;
    LOOM_CHECK(reqs_room(ctx, q));
    LOOM_CHECK(loom_coll_irecv(ctx, peer, buf, nbytes, tag, &q->r[q->n]));
    q->n++;
    return loomSuccess;
}

loomResult_t loom_reqs_wait(loom_coll_ctx_t *ctx, loom_reqs_t *q)
{
    int n = q->n;
    q->n = 0;
    return n ? loom_p2p_wait_all(ctx->p2p, q->r, n) : loomSuccess;
}

void loom_coll_part_init(loom_coll_ctx_t *part, const loom_coll_ctx_t *ctx, const int *group,
                         int rank, int n, const loom_link_cost_t *link)
{
    memset(part, 0, sizeof(*part));
    part->p2p = ctx->p2p;
    part->rank = rank;
    part->nranks = n;
    part->group = group;
    part->seq = ctx->seq;
    part->chunk_bytes = ctx->chunk_bytes;
    part->link = *link;
    part->intra = ctx->intra;
    part->ring_depth = loom_ring_depth(link->cls, n);
    part->hosts.nhosts = 1;
    part->scratch = ctx->scratch;
    part->scratch_bytes = ctx->scratch_bytes;
}

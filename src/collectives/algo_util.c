/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_util.c - the shared helpers of algo_util.h: scratch carved into
 * aligned parts and the small request list of the exchange-based algorithms.
 */
#include "algo_util.h"

#include <stdlib.h>
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

static loomResult_t post_piece(loom_coll_ctx_t *ctx, const loom_xfer_t *x, size_t k, size_t chunk,
                               uint32_t tag, loom_p2p_req_t *req)
{
    size_t off = k * chunk;
    size_t len = x->nbytes - off < chunk ? x->nbytes - off : chunk;
    if (x->send)
        return loom_coll_isend(ctx, x->peer, x->buf + off, len, tag, req);
    return loom_coll_irecv(ctx, x->peer, x->buf + off, len, tag, req);
}

/* Waits for one slot's pieces; a piece shorter than asked for means the ends
 * disagree on a transfer's size (ranks that passed different counts). */
static loomResult_t wait_slot(loom_coll_ctx_t *ctx, loom_p2p_req_t *slot, int nx)
{
    LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, slot, nx));
    for (int i = 0; i < nx; i++) {
        if (!slot[i].is_send && slot[i].done_bytes != slot[i].nbytes) {
            LOOM_WARN("rank %d: rank %d sent %zu bytes where %zu were expected: the ranks passed "
                      "different counts",
                      ctx->rank, slot[i].peer, slot[i].done_bytes, slot[i].nbytes);
            return loomInvalidUsage;
        }
    }
    return loomSuccess;
}

loomResult_t loom_coll_paced(loom_coll_ctx_t *ctx, const loom_xfer_t *x, int nx, uint32_t tag)
{
    const size_t depth = ctx->ring_depth < 1 ? 1 : (size_t)ctx->ring_depth;
    const size_t chunk = ctx->chunk_bytes ? ctx->chunk_bytes : 1;
    size_t rounds = 0;
    for (int i = 0; i < nx; i++) {
        size_t p = (x[i].nbytes + chunk - 1) / chunk;
        rounds = p > rounds ? p : rounds;
    }
    if (rounds == 0)
        return loomSuccess;
    /* req[s * nx + i]: transfer i's piece in slot s; a slot's pieces are waited together,
     * since a wait progresses only the requests it is given (each end must keep the sends
     * of the piece its peer waits for moving). Unposted entries stay done. */
    loom_p2p_req_t *req = calloc(depth * (size_t)nx, sizeof(*req));
    if (req == NULL) {
        LOOM_WARN("rank %d: out of memory for %zu x %d requests", ctx->rank, depth, nx);
        return loomSystemError;
    }
    for (size_t e = 0; e < depth * (size_t)nx; e++)
        req[e].done = 1;
    loomResult_t res = loomSuccess;
    for (size_t k = 0; k < rounds; k++) {
        loom_p2p_req_t *slot = &req[(k % depth) * (size_t)nx];
        if (k >= depth)
            LOOM_CHECK_GOTO(wait_slot(ctx, slot, nx), res, out);
        for (int i = 0; i < nx; i++) {
            slot[i].done = 1;
            if (k * chunk < x[i].nbytes)
                LOOM_CHECK_GOTO(post_piece(ctx, &x[i], k, chunk, tag, &slot[i]), res, out);
        }
    }
    for (size_t k = rounds > depth ? rounds - depth : 0; k < rounds; k++)
        LOOM_CHECK_GOTO(wait_slot(ctx, &req[(k % depth) * (size_t)nx], nx), res, out);
out:
    free(req);
    return res;
}

/* The transfers of a paced all-gather or all-to-all: from rank-d into recv_at(p), to rank+d
 * from send_at(p), d = 1..n-1; the bytes of each from rank p's (or this rank's) block. */
typedef struct {
    uint8_t *recv;
    const uint8_t *send;
    size_t send_stride, bytes;     /* even blocks */
    const size_t *counts, *displs; /* uneven blocks (NULL: even) */
    size_t es;
} blocks_t;

static loomResult_t paced_exchange(loom_coll_ctx_t *ctx, const blocks_t *b)
{
    const int n = ctx->nranks, me = ctx->rank;
    loom_xfer_t *x = malloc(sizeof(*x) * 2 * (size_t)n);
    if (x == NULL) {
        LOOM_WARN("rank %d: out of memory for %d transfers", me, 2 * n);
        return loomSystemError;
    }
    int nx = 0;
    for (int d = 1; d < n; d++) {
        int p = (me - d + n) % n;
        size_t nbytes = b->counts ? b->counts[p] * b->es : b->bytes;
        size_t at = b->counts ? b->displs[p] * b->es : (size_t)p * b->bytes;
        x[nx++] = (loom_xfer_t){
            .peer = p, .send = 0, .buf = nbytes ? b->recv + at : NULL, .nbytes = nbytes};
    }
    for (int d = 1; d < n; d++) {
        int p = (me + d) % n;
        size_t nbytes = b->counts ? b->counts[me] * b->es : b->bytes;
        x[nx++] = (loom_xfer_t){.peer = p,
                                .send = 1,
                                .buf = (uint8_t *)b->send + (size_t)p * b->send_stride,
                                .nbytes = nbytes};
    }
    loomResult_t res = loom_coll_paced(ctx, x, nx, loom_tag_coll(ctx->seq, 1));
    free(x);
    return res;
}

loomResult_t loom_coll_paced_blocks(loom_coll_ctx_t *ctx, uint8_t *recv, const uint8_t *send,
                                    size_t send_stride, size_t bytes)
{
    blocks_t b = {.recv = recv, .send = send, .send_stride = send_stride, .bytes = bytes};
    return paced_exchange(ctx, &b);
}

loomResult_t loom_coll_paced_gatherv(loom_coll_ctx_t *ctx, uint8_t *recv, const size_t *counts,
                                     const size_t *displs, size_t es, const uint8_t *send)
{
    blocks_t b = {.recv = recv, .send = send, .counts = counts, .displs = displs, .es = es};
    return paced_exchange(ctx, &b);
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

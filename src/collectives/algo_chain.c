/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_chain.c - Reduce along a chain in rank order: rank 0 sends its data to
 * rank 1, which adds its own and sends the partial to rank 2, ..., and rank
 * n-1 rounds the result and sends it to the root (or keeps it, as the root).
 * Each element is ((x0 op x1) op x2) ... op x[n-1], the order include/loom.h
 * states, wherever the root is; the binomial tree (algo_tree.c) adds subtrees
 * first and cannot.
 *
 * Pipelined in segments of at most a chunk of partials (LOOM_CHUNK_BYTES in
 * the accumulator type; fewer and longer where the cost model finds the
 * steps dearer than the fill, loom_chain_segments), with CHAIN_DEPTH segments
 * in flight per rank: a rank adds segment j while segments j+1.. arrive. Every rank receives and
 * sends S (in the accumulator type) and the root receives the result once more, where the binomial
 * tree's root receives ceil(log2 n) S; the price is n - 1 hops to fill the chain, which the cost
 * model weighs (direct wins small vectors). Waits: a segment's receive depends only on lower ranks,
 * a send on the next rank's receive of an earlier segment, the root's results on segments it has
 * already passed on, so there is no cycle; every wait also drives the rank's other pending
 * requests, since a send moves only when tested. Scratch: CHAIN_DEPTH segments of partials (rank 1
 * also keeps rank 0's raw segments when the accumulator is wider; rank n-1 the results it sends).
 */
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "dtype.h"

#define CHAIN_DEPTH 4

enum { STEP_PARTIAL = 1, STEP_RESULT = 2 };

/* Request slots: [k][s] for segment s mod CHAIN_DEPTH; one not posted is
 * marked done, which waits skip. */
enum { Q_IN, Q_OUT, Q_FINAL, Q_KINDS };

typedef struct {
    loom_coll_ctx_t *ctx;
    const loom_coll_args_t *a;
    size_t es, accsz, ce, nseg;
    int prev, next, last; /* -1 where none; last: this rank is n-1 */
    uint8_t *acc[CHAIN_DEPTH], *raw[CHAIN_DEPTH], *res[CHAIN_DEPTH];
    loom_p2p_req_t q[Q_KINDS * CHAIN_DEPTH];
} chain_t;

static loom_p2p_req_t *slot(chain_t *c, int kind, size_t j)
{
    return &c->q[kind * CHAIN_DEPTH + (int)(j % CHAIN_DEPTH)];
}

static size_t seg_len(const chain_t *c, size_t j)
{
    size_t off = j * c->ce;
    return c->a->count - off < c->ce ? c->a->count - off : c->ce;
}

/* Waits for one request while progressing all the others. */
static loomResult_t wait_one(chain_t *c, loom_p2p_req_t *r)
{
    return loom_p2p_wait_for(c->ctx->p2p, r, 1, c->q, Q_KINDS * CHAIN_DEPTH);
}

/* Segment j's partial (rank 0's raw data for rank 1) from the previous rank. */
static loomResult_t post_in(chain_t *c, size_t j)
{
    const int raw = c->prev == 0, wide = raw && !loom_acc_is_native(c->a->dt);
    uint8_t *dst = wide ? c->raw[j % CHAIN_DEPTH] : c->acc[j % CHAIN_DEPTH];
    return loom_coll_irecv(c->ctx, c->prev, dst, seg_len(c, j) * (raw ? c->es : c->accsz),
                           loom_tag_coll(c->ctx->seq, STEP_PARTIAL), slot(c, Q_IN, j));
}

/* The root's result of segment j, straight into recvbuff. */
static loomResult_t post_final(chain_t *c, size_t j)
{
    uint8_t *dst = (uint8_t *)c->a->recvbuff + j * c->ce * c->es;
    return loom_coll_irecv(c->ctx, c->ctx->nranks - 1, dst, seg_len(c, j) * c->es,
                           loom_tag_coll(c->ctx->seq, STEP_RESULT), slot(c, Q_FINAL, j));
}

/* This rank's part of segment j. */
static loomResult_t segment(chain_t *c, size_t j)
{
    const loom_coll_args_t *a = c->a;
    const size_t len = seg_len(c, j), off = j * c->ce;
    const uint8_t *own = (const uint8_t *)a->sendbuff + off * c->es;
    const int s = (int)(j % CHAIN_DEPTH);
    const uint32_t tag = loom_tag_coll(c->ctx->seq, STEP_PARTIAL);
    if (c->prev < 0) { /* rank 0: its raw data, straight from sendbuff */
        LOOM_CHECK(wait_one(c, slot(c, Q_OUT, j)));
        return loom_coll_isend(c->ctx, c->next, own, len * c->es, tag, slot(c, Q_OUT, j));
    }
    LOOM_CHECK(wait_one(c, slot(c, Q_IN, j)));
    if (c->prev == 0 && !loom_acc_is_native(a->dt))
        loom_reduce_init(a->dt, c->acc[s], c->raw[s], len);
    loom_reduce_acc(a->dt, a->op, c->acc[s], own, len);
    if (!c->last) {
        LOOM_CHECK(
            loom_coll_isend(c->ctx, c->next, c->acc[s], len * c->accsz, tag, slot(c, Q_OUT, j)));
    } else if (c->ctx->rank == a->root) {
        loom_reduce_finish(a->dt, a->op, (uint8_t *)a->recvbuff + off * c->es, c->acc[s], len,
                           c->ctx->nranks);
    } else {
        LOOM_CHECK(wait_one(c, slot(c, Q_OUT, j))); /* res[s] of segment j - CHAIN_DEPTH */
        loom_reduce_finish(a->dt, a->op, c->res[s], c->acc[s], len, c->ctx->nranks);
        LOOM_CHECK(loom_coll_isend(c->ctx, a->root, c->res[s], len * c->es,
                                   loom_tag_coll(c->ctx->seq, STEP_RESULT), slot(c, Q_OUT, j)));
    }
    /* The slot takes segment j + CHAIN_DEPTH once its partial has left. */
    if (j + CHAIN_DEPTH < c->nseg) {
        if (!c->last)
            LOOM_CHECK(wait_one(c, slot(c, Q_OUT, j)));
        LOOM_CHECK(post_in(c, j + CHAIN_DEPTH));
    }
    return loomSuccess;
}

loomResult_t loom_reduce_chain(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    if (n == 1 || a->count == 0)
        return loom_reduce_direct(ctx, a);
    chain_t c;
    memset(&c, 0, sizeof(c));
    c.ctx = ctx;
    c.a = a;
    c.es = loom_dtype_size(a->dt);
    c.accsz = loom_acc_size(a->dt);
    /* As many segments as the model finds fastest: long ones fill the chain slowly, short
     * ones pay a step each (loom_chain_segments). */
    const size_t m =
        loom_chain_segments(&ctx->link, (double)(a->count * c.accsz), n, ctx->chunk_bytes);
    c.ce = (a->count + m - 1) / m;
    c.nseg = (a->count + c.ce - 1) / c.ce;
    c.prev = me > 0 ? me - 1 : -1;
    c.next = me < n - 1 ? me + 1 : -1;
    c.last = me == n - 1;
    for (int i = 0; i < Q_KINDS * CHAIN_DEPTH; i++)
        c.q[i].done = 1;
    if (me > 0) {
        const int wide = me == 1 && !loom_acc_is_native(a->dt);
        const int results = c.last && a->root != me;
        size_t sizes[3 * CHAIN_DEPTH];
        uint8_t *parts[3 * CHAIN_DEPTH];
        for (int s = 0; s < CHAIN_DEPTH; s++) {
            sizes[s] = c.ce * c.accsz;
            sizes[CHAIN_DEPTH + s] = wide ? c.ce * c.es : 0;
            sizes[2 * CHAIN_DEPTH + s] = results ? c.ce * c.es : 0;
        }
        LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 3 * CHAIN_DEPTH, parts));
        for (int s = 0; s < CHAIN_DEPTH; s++) {
            c.acc[s] = parts[s];
            c.raw[s] = parts[CHAIN_DEPTH + s];
            c.res[s] = parts[2 * CHAIN_DEPTH + s];
        }
        for (size_t j = 0; j < c.nseg && j < CHAIN_DEPTH; j++)
            LOOM_CHECK(post_in(&c, j));
    }
    const int collects = me == a->root && !c.last;
    for (size_t j = 0; j < c.nseg; j++) {
        if (collects) { /* at most CHAIN_DEPTH results outstanding */
            if (j >= CHAIN_DEPTH)
                LOOM_CHECK(wait_one(&c, slot(&c, Q_FINAL, j)));
            LOOM_CHECK(post_final(&c, j));
        }
        LOOM_CHECK(segment(&c, j));
    }
    return loom_p2p_wait_all(ctx->p2p, c.q, Q_KINDS * CHAIN_DEPTH);
}

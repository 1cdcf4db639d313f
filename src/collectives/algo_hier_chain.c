/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_hier_chain.c - AllReduce across hosts in rank order (`hier_chain`),
 * for layouts where every host has L > 1 consecutive ranks: host h holds
 * ranks hL .. hL+L-1. The hierarchical AllReduce of algo_hier.c sums each
 * host's ranks first and then the hosts' partials, an order of its own; here
 * the partial of an element travels host 0 -> 1 -> ... -> H-1 and each host
 * adds its ranks to it one after another, so every element is
 * ((x0 op x1) op x2) ... op x[n-1], as include/loom.h states.
 *
 * Per round of LOOM_HIER_ROUND_BYTES of the vector, cut into L slices, local
 * index l owning slice l on every host:
 *  1. inside the host, every rank sends its raw data of slice o to local index
 *     o (the owner needs the L contributions themselves: they are added after
 *     the partial of the hosts before);
 *  2. on the rail of local index l, in segments of a chunk of partials: host 0
 *     starts the partial from its ranks' data, host h (0 < h < H-1) receives
 *     it from host h-1, adds its ranks in order and sends it to host h+1, host
 *     H-1 adds its ranks, rounds once and sends the result back down the
 *     rail, each host passing it on to the one below;
 *  3. inside the host, the L slices are all-gathered.
 * Between hosts every host sends S (partials up, in the accumulator type, or
 * results down): with two hosts as little as the hierarchical AllReduce's
 * 2(H-1)/H S, with H hosts H/(H-1) times that for the hosts in the middle,
 * which the cost model weighs (cost_hier.c). Segments pipeline the rail:
 * while segment j goes up, the results of earlier ones come down.
 * Waits: a partial depends on the hosts below, a result on the hosts above
 * having passed on that segment's partial, which they do without waiting
 * for results, so there is no cycle; every wait drives the other pending
 * requests, since a send moves only when tested.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_hier.h"
#include "algo_util.h"
#include "check.h"
#include "dtype.h"

#define HC_DEPTH 4 /* segments in flight per rail rank and direction */

/* Request slots [kind][segment mod HC_DEPTH]; one not posted is marked done. */
enum { Q_UP_IN, Q_UP_OUT, Q_DOWN_IN, Q_DOWN_OUT, Q_KINDS };

typedef struct {
    loom_hier_t *h;
    const loom_coll_args_t *a;
    const uint8_t *send;      /* the round's input */
    uint8_t *out;             /* the round's output */
    const loom_span_t *spans; /* the round's slices, [L] */
    const uint8_t *raw;       /* the other local ranks' data of slice l, by local index */
    size_t es, accsz, ce, nseg;
    uint8_t *acc[HC_DEPTH];
    loom_p2p_req_t q[Q_KINDS * HC_DEPTH];
} hchain_t;

static loom_p2p_req_t *slot(hchain_t *c, int kind, size_t j)
{
    return &c->q[kind * HC_DEPTH + (int)(j % HC_DEPTH)];
}

static size_t seg_len(const hchain_t *c, size_t j)
{
    const size_t n = c->spans[c->h->l].len, off = j * c->ce;
    return n - off < c->ce ? n - off : c->ce;
}

/* Element j * ce of this rank's slice in the output. */
static uint8_t *out_at(const hchain_t *c, size_t j)
{
    return c->out + (c->spans[c->h->l].off + j * c->ce) * c->es;
}

static loomResult_t wait_one(hchain_t *c, loom_p2p_req_t *r)
{
    return loom_p2p_wait_for(c->h->ctx->p2p, r, 1, c->q, Q_KINDS * HC_DEPTH);
}

static loomResult_t post_up_in(hchain_t *c, size_t j)
{
    return loom_coll_irecv(&c->h->rail, c->h->host - 1, c->acc[j % HC_DEPTH],
                           seg_len(c, j) * c->accsz, loom_tag_coll(c->h->rail.seq, STEP_CHAIN_UP),
                           slot(c, Q_UP_IN, j));
}

static loomResult_t post_down_in(hchain_t *c, size_t j)
{
    return loom_coll_irecv(&c->h->rail, c->h->host + 1, out_at(c, j), seg_len(c, j) * c->es,
                           loom_tag_coll(c->h->rail.seq, STEP_CHAIN_DOWN), slot(c, Q_DOWN_IN, j));
}

static loomResult_t send_down(hchain_t *c, size_t j)
{
    LOOM_CHECK(wait_one(c, slot(c, Q_DOWN_OUT, j)));
    return loom_coll_isend(&c->h->rail, c->h->host - 1, out_at(c, j), seg_len(c, j) * c->es,
                           loom_tag_coll(c->h->rail.seq, STEP_CHAIN_DOWN), slot(c, Q_DOWN_OUT, j));
}

/* acc = (partial of the hosts below, or nothing on host 0) op this host's
 * ranks' data of segment j, in local order. */
static void add_host(hchain_t *c, uint8_t *acc, size_t j, size_t len)
{
    const loom_hier_t *h = c->h;
    const size_t slice = c->spans[h->l].len, first = j * c->ce;
    for (int q = 0; q < h->L; q++) {
        const uint8_t *src =
            q == h->l ? c->send + (c->spans[h->l].off + first) * c->es
                      : c->raw + ((size_t)(q < h->l ? q : q - 1) * slice + first) * c->es;
        if (h->host == 0 && q == 0)
            loom_reduce_init(c->a->dt, acc, src, len);
        else
            loom_reduce_acc(c->a->dt, c->a->op, acc, src, len);
    }
}

/* Segment j on the way up, and, at the top, its result on the way down. */
static loomResult_t up(hchain_t *c, size_t j)
{
    const loom_hier_t *h = c->h;
    const size_t len = seg_len(c, j);
    uint8_t *acc = c->acc[j % HC_DEPTH];
    const int top = h->host == h->H - 1;
    if (h->host > 0)
        LOOM_CHECK(wait_one(c, slot(c, Q_UP_IN, j)));
    else
        LOOM_CHECK(wait_one(c, slot(c, Q_UP_OUT, j))); /* acc's partial of j - HC_DEPTH left */
    add_host(c, acc, j, len);
    if (top) {
        loom_reduce_finish(c->a->dt, c->a->op, out_at(c, j), acc, len, h->ctx->nranks);
        LOOM_CHECK(send_down(c, j));
    } else {
        LOOM_CHECK(loom_coll_isend(&c->h->rail, h->host + 1, acc, len * c->accsz,
                                   loom_tag_coll(c->h->rail.seq, STEP_CHAIN_UP),
                                   slot(c, Q_UP_OUT, j)));
    }
    /* The slot takes segment j + HC_DEPTH once its partial has left. */
    if (h->host > 0 && j + HC_DEPTH < c->nseg) {
        if (!top)
            LOOM_CHECK(wait_one(c, slot(c, Q_UP_OUT, j)));
        LOOM_CHECK(post_up_in(c, j + HC_DEPTH));
    }
    return loomSuccess;
}

/* Segment j's result from the host above, passed on to the one below. */
static loomResult_t down(hchain_t *c, size_t j)
{
    LOOM_CHECK(wait_one(c, slot(c, Q_DOWN_IN, j)));
    if (c->h->host > 0)
        LOOM_CHECK(send_down(c, j));
    if (j + HC_DEPTH < c->nseg)
        LOOM_CHECK(post_down_in(c, j + HC_DEPTH));
    return loomSuccess;
}

/* Step 2 for this rank's slice of the round. */
static loomResult_t rail_chain(hchain_t *c)
{
    const loom_hier_t *h = c->h;
    const int top = h->host == h->H - 1;
    for (int i = 0; i < Q_KINDS * HC_DEPTH; i++) {
        memset(&c->q[i], 0, sizeof(c->q[i]));
        c->q[i].done = 1;
    }
    for (size_t j = 0; j < c->nseg && j < HC_DEPTH; j++) {
        if (h->host > 0)
            LOOM_CHECK(post_up_in(c, j));
        if (!top)
            LOOM_CHECK(post_down_in(c, j));
    }
    /* A result comes down HC_DEPTH segments behind the partials going up. */
    for (size_t j = 0; j < c->nseg + HC_DEPTH; j++) {
        if (j < c->nseg)
            LOOM_CHECK(up(c, j));
        if (!top && j >= HC_DEPTH)
            LOOM_CHECK(down(c, j - HC_DEPTH));
    }
    return loom_p2p_wait_all(h->ctx->p2p, c->q, Q_KINDS * HC_DEPTH);
}

/* Step 1: slice o of this rank's round input to local index o, and the other
 * ranks' data of slice l into raw (by local index, this rank's skipped). */
static loomResult_t gather_raw(loom_hier_t *h, const uint8_t *send, const loom_span_t *spans,
                               uint8_t *raw, size_t es, loom_p2p_req_t *reqs)
{
    loom_coll_ctx_t *p = &h->local;
    const int L = h->L, me = h->l;
    const size_t mine = spans[me].len;
    const uint32_t tag = loom_tag_coll(p->seq, STEP_CHAIN_RAW);
    int nreq = 0;
    for (int k = 1; k < L && mine > 0; k++) {
        int q = (me - k + L) % L;
        LOOM_CHECK(loom_coll_irecv(p, q, raw + (size_t)(q < me ? q : q - 1) * mine * es, mine * es,
                                   tag, &reqs[nreq++]));
    }
    for (int k = 1; k < L; k++) {
        int o = (me + k) % L;
        if (spans[o].len > 0)
            LOOM_CHECK(loom_coll_isend(p, o, send + spans[o].off * es, spans[o].len * es, tag,
                                       &reqs[nreq++]));
    }
    return loom_p2p_wait_all(p->p2p, reqs, nreq);
}

loomResult_t loom_allreduce_hier_chain(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    if (!ctx->hosts.contiguous || !loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    hchain_t c;
    memset(&c, 0, sizeof(c));
    c.h = &h;
    c.a = a;
    c.es = loom_dtype_size(a->dt);
    c.accsz = loom_acc_size(a->dt);
    const size_t chunk_ce = loom_chunk_elems(ctx, c.accsz);
    c.ce = chunk_ce;
    const loom_link_cost_t shared = loom_link_cost_shared(&ctx->link, (double)h.L);
    const size_t L = (size_t)h.L;
    size_t round = LOOM_HIER_ROUND_BYTES / c.es;
    if (round < L)
        round = L;
    if (round > a->count)
        round = a->count;
    /* The buffer: the raw data of the largest slice from L - 1 ranks, and the partials. */
    const size_t raw_bytes = ((L - 1) * (round / L + 1) * c.es + 63) / 64 * 64;
    uint8_t *buf = NULL;
    loom_span_t *spans = NULL;
    loom_p2p_req_t *reqs = NULL;
    LOOM_CHECK(loom_hier_buf(ctx, raw_bytes + HC_DEPTH * c.ce * c.accsz, &buf));
    LOOM_CHECK(loom_hier_calloc(L, sizeof(*spans), &spans));
    loomResult_t res = loom_hier_calloc(2 * L, sizeof(*reqs), &reqs);
    for (int s = 0; s < HC_DEPTH; s++)
        c.acc[s] = buf + raw_bytes + (size_t)s * c.ce * c.accsz;
    c.raw = buf;
    c.spans = spans;
    for (size_t base = 0; res == loomSuccess && base < a->count; base += round) {
        const size_t rn = a->count - base < round ? a->count - base : round;
        for (int o = 0; o < h.L; o++)
            loom_split(rn, h.L, o, &spans[o].off, &spans[o].len);
        c.send = (const uint8_t *)a->sendbuff + base * c.es;
        c.out = (uint8_t *)a->recvbuff + base * c.es;
        /* Segments as the model finds fastest for a chain of 2H - 1 hops on the rail, whose
         * link the host's L rails share: at most a chunk, shorter where the pipeline's fill
         * costs more than the steps (loom_chain_segments). */
        const size_t m = loom_chain_segments(&shared, (double)(spans[h.l].len * c.accsz),
                                             2 * h.H - 1, ctx->chunk_bytes);
        c.ce = spans[h.l].len ? (spans[h.l].len + m - 1) / m : chunk_ce;
        c.nseg = spans[h.l].len ? (spans[h.l].len + c.ce - 1) / c.ce : 0;
        LOOM_CHECK_GOTO(gather_raw(&h, c.send, spans, buf, c.es, reqs), res, out);
        LOOM_CHECK_GOTO(rail_chain(&c), res, out);
        res = loom_hier_local_allgather(&h, c.out, spans, c.es, STEP_LOCAL_GATHER);
    }
out:
    free(spans);
    free(reqs);
    return res;
}

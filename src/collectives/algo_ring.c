/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_ring.c - ring algorithms: AllReduce (reduce-scatter + all-gather),
 * ReduceScatter and AllGather (and their uneven V forms), and the all-gather half of the scatter +
 * all-gather Broadcast (algo_tree.c). Ranks talk only to rank+1 (send) and
 * rank-1 (receive), the pattern with the best bandwidth on real links
 * (Patarasuk and Yuan, JPDC 2009).
 *
 * Blocks: the vector is cut into n blocks (AllReduce: loom_split of count;
 * ReduceScatter/AllGather: rank b's block of count elements; the V forms:
 * rank b's block of recvcounts[b], where a segment past a short block's end
 * is empty and not sent, so each link carries about (n-1)/n of the total
 * whatever the imbalance, and the rounds follow the largest block).
 * Reduce-scatter step s = 0..n-2: send block (r-s-1) to rank r+1, receive
 * block (r-s-2) from rank r-1 and add the own contribution to it; after n-1
 * steps rank r holds block r reduced. All-gather step u = 0..n-2: send block
 * (r-u), receive block (r-u-1) straight into the output.
 *
 * Reduction order (determinism): block b is reduced along the ring starting
 * at rank b+1: ((x[b+1] op x[b+2]) op ...) op x[b], with indices mod n; with
 * two ranks rank 0 puts its own data first, so both blocks are x0 op x1, rank
 * order (the other rank counts, where a ring's order cannot be rank order,
 * are not chosen with LOOM_DETERMINISTIC=1). The
 * first hop carries rank b+1's raw data in the datatype; later hops carry the
 * partial in the accumulator type (float32 for the 16/8-bit floats), so a
 * value is rounded to its datatype once, by the block's owner, which then
 * sends the same bits to everyone in the all-gather.
 *
 * Pipelining: every block is processed in rounds of ctx->ring_depth (up to
 * RING_DEPTH_MAX) segments of at most LOOM_CHUNK_BYTES; the depth is 1 on a
 * shared-memory communicator with more ranks than the machine has CPUs,
 * where segments in flight only make the ranks wait for each other's turn on
 * a core (loom_ring_depth). Within a round all segments of a step are in flight
 * together; as soon as segment j of step t has arrived (and this rank's own
 * segment j of step t has left) it is reduced and forwarded as segment j of
 * step t+1, and the receive of segment j of step t+1 is posted, while the
 * later segments are still on the wire (a segment that arrived before its
 * receive was posted would block the stream behind it). Each wait covers
 * only the segment's receive and send, whose peers post their side without
 * waiting for this rank to progress further (no cycle around the ring).
 * Scratch: 2 x depth segments in the accumulator type (reduce-scatter).
 * Bytes on the wire per rank: (n-1)/n S per phase, the reduce-scatter phase in
 * the accumulator type; 2(n-1) steps per round for AllReduce.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "dtype.h"

#define RING_DEPTH_MAX 4

typedef struct {
    const size_t *in_off;  /* block b's first element in the input, [n] */
    const size_t *out_off; /* block b's first element in the output, [n] */
    const size_t *len;     /* block b's elements, [n] */
    int rs_steps;          /* reduce-scatter steps: n-1 or 0 */
    int ag_steps;          /* all-gather steps: n-1 or 0 */
    const uint8_t *send;   /* contributions (reduce-scatter) */
    uint8_t *out;          /* output (reduce-scatter result, all-gather blocks) */
} ring_plan_t;

typedef struct {
    loom_coll_ctx_t *ctx;
    const loom_coll_args_t *a;
    const ring_plan_t *plan;
    size_t es, accsz, ce;
    int depth;                       /* segments per block and round */
    uint8_t *buf[2][RING_DEPTH_MAX]; /* partials of even / odd reduce-scatter steps */
    /* Segment j's receive [0] and send [1] of the current step; an entry not
     * posted is marked done, which the wait skips. */
    loom_p2p_req_t q[RING_DEPTH_MAX][2];
} ring_t;

static void req_clear(loom_p2p_req_t *r)
{
    memset(r, 0, sizeof(*r));
    r->done = 1;
}

static int mod(int x, int n)
{
    return ((x % n) + n) % n;
}

/* Segment j of round k of block b: first element within the block and length. */
static size_t seg(const ring_t *g, int b, size_t k, int j, size_t *start_p)
{
    size_t start = (k * (size_t)g->depth + (size_t)j) * g->ce;
    size_t len = g->plan->len[b];
    *start_p = start;
    if (start >= len)
        return 0;
    return len - start < g->ce ? len - start : g->ce;
}

/* The blocks step t sends and receives. */
static void step_blocks(const ring_t *g, int t, int *sb_p, int *rb_p)
{
    const int n = g->ctx->nranks, me = g->ctx->rank;
    if (t < g->plan->rs_steps) {
        *sb_p = mod(me - t - 1, n);
        *rb_p = mod(me - t - 2, n);
    } else {
        int u = t - g->plan->rs_steps;
        *sb_p = mod(me - u, n);
        *rb_p = mod(me - u - 1, n);
    }
}

static loomResult_t post_send(ring_t *g, size_t k, int t, int j)
{
    int sb, rb;
    step_blocks(g, t, &sb, &rb);
    size_t start, len = seg(g, sb, k, j, &start);
    req_clear(&g->q[j][1]);
    if (len == 0)
        return loomSuccess;
    const ring_plan_t *p = g->plan;
    const void *src;
    size_t nbytes;
    if (t >= p->rs_steps) {
        src = p->out + (p->out_off[sb] + start) * g->es;
        nbytes = len * g->es;
    } else if (t == 0) {
        src = p->send + (p->in_off[sb] + start) * g->es; /* raw data on the first hop */
        nbytes = len * g->es;
    } else {
        src = g->buf[(t - 1) % 2][j];
        nbytes = len * g->accsz;
    }
    int right = (g->ctx->rank + 1) % g->ctx->nranks;
    uint32_t tag = loom_tag_coll(g->ctx->seq, t < p->rs_steps ? 1 : 2);
    return loom_coll_isend(g->ctx, right, src, nbytes, tag, &g->q[j][1]);
}

static loomResult_t post_recv(ring_t *g, size_t k, int t, int j)
{
    int sb, rb;
    step_blocks(g, t, &sb, &rb);
    size_t start, len = seg(g, rb, k, j, &start);
    req_clear(&g->q[j][0]);
    if (len == 0)
        return loomSuccess;
    const ring_plan_t *p = g->plan;
    void *dst;
    size_t nbytes;
    if (t >= p->rs_steps) {
        dst = p->out + (p->out_off[rb] + start) * g->es;
        nbytes = len * g->es;
    } else if (t == 0) {
        /* Raw data: straight into the partial when the accumulator is the datatype, else
         * into the odd buffer (free until step 1) to be widened. */
        dst = g->buf[loom_acc_is_native(g->a->dt) ? 0 : 1][j];
        nbytes = len * g->es;
    } else {
        dst = g->buf[t % 2][j];
        nbytes = len * g->accsz;
    }
    int left = mod(g->ctx->rank - 1, g->ctx->nranks);
    uint32_t tag = loom_tag_coll(g->ctx->seq, t < p->rs_steps ? 1 : 2);
    return loom_coll_irecv(g->ctx, left, dst, nbytes, tag, &g->q[j][0]);
}

/* Adds this rank's contribution to the partial that arrived in step t (and, on
 * the last reduce-scatter step, rounds the block into the output). */
static void reduce_arrived(ring_t *g, size_t k, int t, int j)
{
    int sb, rb;
    step_blocks(g, t, &sb, &rb);
    size_t start, len = seg(g, rb, k, j, &start);
    if (len == 0)
        return;
    const ring_plan_t *p = g->plan;
    const loom_coll_args_t *a = g->a;
    const uint8_t *own = p->send + (p->in_off[rb] + start) * g->es;
    void *part = g->buf[t % 2][j];
    if (g->ctx->nranks == 2 && g->ctx->rank == 0) {
        /* Two ranks: rank 0 puts its own data first, so that both blocks are x0 op x1 (rank
         * order; a max of +0 and -0 keeps the second operand). The raw data arrived in the
         * other buffer, or in part when the accumulator is the datatype. */
        void *in = loom_acc_is_native(a->dt) ? part : g->buf[1][j];
        part = loom_acc_is_native(a->dt) ? g->buf[1][j] : part;
        loom_reduce_init(a->dt, part, own, len);
        loom_reduce_acc(a->dt, a->op, part, in, len);
    } else {
        if (t == 0 && !loom_acc_is_native(a->dt))
            loom_reduce_init(a->dt, part, g->buf[1][j], len);
        loom_reduce_acc(a->dt, a->op, part, own, len);
    }
    if (t == p->rs_steps - 1)
        loom_reduce_finish(a->dt, a->op, p->out + (p->out_off[rb] + start) * g->es, part, len,
                           g->ctx->nranks);
}

static loomResult_t ring_round(ring_t *g, size_t k)
{
    const int steps = g->plan->rs_steps + g->plan->ag_steps;
    for (int j = 0; j < g->depth; j++) {
        LOOM_CHECK(post_send(g, k, 0, j));
        LOOM_CHECK(post_recv(g, k, 0, j));
    }
    for (int t = 0; t < steps; t++) {
        for (int j = 0; j < g->depth; j++) {
            LOOM_CHECK(loom_p2p_wait_all(g->ctx->p2p, g->q[j], 2));
            if (t < g->plan->rs_steps)
                reduce_arrived(g, k, t, j);
            if (t + 1 < steps) {
                /* The next step's receive is posted as soon as its buffer is free, so
                 * the neighbour's segment never waits in the stream for a receive. */
                LOOM_CHECK(post_send(g, k, t + 1, j));
                LOOM_CHECK(post_recv(g, k, t + 1, j));
            }
        }
    }
    return loomSuccess;
}

static loomResult_t ring_run_host_order(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                        const ring_plan_t *plan);
static int ring_reorders(const loom_coll_ctx_t *ctx);

static loomResult_t ring_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                             const ring_plan_t *plan)
{
    if (ring_reorders(ctx))
        return ring_run_host_order(ctx, a, plan);
    ring_t g;
    memset(&g, 0, sizeof(g));
    g.ctx = ctx;
    g.a = a;
    g.plan = plan;
    g.es = loom_dtype_size(a->dt);
    g.accsz = loom_acc_size(a->dt);
    g.ce = loom_chunk_elems(ctx, g.es);
    g.depth = ctx->ring_depth < 1                ? 1
              : ctx->ring_depth > RING_DEPTH_MAX ? RING_DEPTH_MAX
                                                 : ctx->ring_depth;
    size_t maxlen = 0;
    for (int b = 0; b < ctx->nranks; b++)
        maxlen = plan->len[b] > maxlen ? plan->len[b] : maxlen;
    if (plan->rs_steps > 0) {
        size_t sizes[2 * RING_DEPTH_MAX];
        uint8_t *parts[2 * RING_DEPTH_MAX];
        size_t seg_elems = maxlen < g.ce ? maxlen : g.ce;
        for (int i = 0; i < 2 * g.depth; i++)
            sizes[i] = seg_elems * g.accsz;
        LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 2 * g.depth, parts));
        for (int i = 0; i < 2 * g.depth; i++)
            g.buf[i / g.depth][i % g.depth] = parts[i];
    }
    size_t per_round = (size_t)g.depth * g.ce;
    size_t rounds = (maxlen + per_round - 1) / per_round;
    for (size_t k = 0; k < rounds; k++)
        LOOM_CHECK(ring_round(&g, k));
    return loomSuccess;
}

/* A host's ranks that are not consecutive (ranks dealt round-robin over hosts)
 * would make a ring in rank order cross between hosts at every hop; the ring
 * then runs in host order (loom_hosts_t.order), which crosses each host
 * boundary once. Block b of the plan stays rank b's: the ring position p,
 * rank order[p], takes the plan's entries of that rank. */
static int ring_reorders(const loom_coll_ctx_t *ctx)
{
    return ctx->group == NULL && ctx->hosts.nhosts > 1 && !ctx->hosts.contiguous;
}

static loomResult_t ring_run_host_order(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                        const ring_plan_t *plan)
{
    const int n = ctx->nranks;
    const int *ord = ctx->hosts.order;
    size_t *v = malloc(sizeof(size_t) * 3 * (size_t)n);
    if (v == NULL) {
        LOOM_WARN("out of memory for %d ring blocks", n);
        return loomSystemError;
    }
    for (int p = 0; p < n; p++) {
        v[p] = plan->in_off[ord[p]];
        v[n + p] = plan->out_off[ord[p]];
        v[2 * n + p] = plan->len[ord[p]];
    }
    ring_plan_t pp = *plan;
    pp.in_off = v;
    pp.out_off = v + n;
    pp.len = v + 2 * n;
    loom_coll_ctx_t part;
    loom_coll_part_init(&part, ctx, ord, ctx->hosts.pos, n, &ctx->link);
    part.ring_depth = ctx->ring_depth;
    loomResult_t res = ring_run(&part, a, &pp);
    ctx->scratch = part.scratch;
    ctx->scratch_bytes = part.scratch_bytes;
    free(v);
    return res;
}

// ---- the collectives ------------------------------------------------------------

/* Per-block offsets and lengths: [0, n) offsets, [n, 2n) lengths. */
static loomResult_t alloc_blocks(int n, size_t **v_p)
{
    size_t *v = malloc(sizeof(size_t) * 3 * (size_t)n);
    if (v == NULL) {
        LOOM_WARN("out of memory for %d ring blocks", n);
        return loomSystemError;
    }
    *v_p = v;
    return loomSuccess;
}

loomResult_t loom_allreduce_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks;
    if (n == 1)
        return loom_allreduce_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    size_t *v = NULL;
    LOOM_CHECK(alloc_blocks(n, &v));
    for (int b = 0; b < n; b++)
        loom_split(a->count, n, b, &v[b], &v[n + b]);
    ring_plan_t plan = {.in_off = v,
                        .out_off = v,
                        .len = v + n,
                        .rs_steps = n - 1,
                        .ag_steps = n - 1,
                        .send = a->sendbuff,
                        .out = a->recvbuff};
    loomResult_t res = ring_run(ctx, a, &plan);
    free(v);
    return res;
}

/* The reduce-scatter ring over block b = len[b] elements at element in_off[b] of sendbuff;
 * len == NULL: every block is a->count elements at b * a->count. Each rank's block goes to the
 * start of its recvbuff. */
static loomResult_t reduce_scatter_ring_blocks(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                               const size_t *in_off, const size_t *len)
{
    const int n = ctx->nranks;
    size_t *v = NULL;
    LOOM_CHECK(alloc_blocks(n, &v));
    for (int b = 0; b < n; b++) {
        v[b] = len ? in_off[b] : (size_t)b * a->count;
        v[n + b] = len ? len[b] : a->count;
        v[2 * n + b] = 0; /* only the own block is written, at the start of recvbuff */
    }
    ring_plan_t plan = {.in_off = v,
                        .out_off = v + 2 * n,
                        .len = v + n,
                        .rs_steps = n - 1,
                        .ag_steps = 0,
                        .send = a->sendbuff,
                        .out = a->recvbuff};
    loomResult_t res = ring_run(ctx, a, &plan);
    free(v);
    return res;
}

loomResult_t loom_reduce_scatter_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (ctx->nranks == 1)
        return loom_reduce_scatter_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    return reduce_scatter_ring_blocks(ctx, a, NULL, NULL);
}

/* ReduceScatterV: the blocks of the counts; the one-rank call and an empty one as direct. */
loomResult_t loom_reduce_scatterv_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (ctx->nranks == 1)
        return loom_reduce_scatterv_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    return reduce_scatter_ring_blocks(ctx, a, a->rdispls, a->recvcounts);
}

loomResult_t loom_coll_ring_allgather_blocks(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                             const size_t *off, const size_t *len, void *out)
{
    ring_plan_t plan = {.in_off = off,
                        .out_off = off,
                        .len = len,
                        .rs_steps = 0,
                        .ag_steps = ctx->nranks - 1,
                        .send = NULL,
                        .out = out};
    return ring_run(ctx, a, &plan);
}

loomResult_t loom_allgather_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
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
    size_t *v = NULL;
    LOOM_CHECK(alloc_blocks(n, &v));
    for (int b = 0; b < n; b++) {
        v[b] = (size_t)b * a->count;
        v[n + b] = a->count;
    }
    loomResult_t res = loom_coll_ring_allgather_blocks(ctx, a, v, v + n, recv);
    free(v);
    return res;
}

/* AllGatherV: the own block into place, then the ring over the blocks of the counts. */
loomResult_t loom_allgatherv_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    loom_coll_gatherv_own(ctx, a);
    if (ctx->nranks == 1)
        return loomSuccess;
    return loom_coll_ring_allgather_blocks(ctx, a, a->rdispls, a->recvcounts, a->recvbuff);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_rhd.c - butterfly algorithms over a power of two of virtual ranks:
 * recursive doubling AllReduce (small vectors, in rank order), Rabenseifner's
 * recursive halving + doubling AllReduce, recursive halving ReduceScatter and
 * recursive doubling AllGather (Thakur, Rabenseifner and Gropp, IJHPCA 2005).
 *
 * Any rank count: n is folded onto p = 2^floor(log2 n) virtual ranks
 * (loom_fold, algo_util.h). In the fold-in step each even rank r < 2(n-p)
 * sends its data to r+1 and sits out; in the fold-out step r+1 sends it the
 * result. Cost of the fold: 2 extra steps and the whole vector twice on the
 * wire for those pairs.
 *
 * Recursive halving (Rabenseifner, ReduceScatter): for d = p/2, p/4, ..., 1
 * virtual rank v exchanges with v^d, sends the half of its current range that
 * the partner keeps and keeps the other half, so after lg p steps v holds
 * segment v. Reduction order (determinism): one tree for every element.
 * Leaves are the virtual ranks' data (x[2v] op x[2v+1] for a folded pair, even
 * rank first); pairs at distance p/2 combine first, then p/4, ..., and every
 * combine puts the lower virtual rank's partial first:
 *   p = 4: ((y0 op y2) op (y1 op y3)),
 * rank order for 2 ranks only. The owner of a segment computes it once and
 * sends it. Partials travel in the accumulator type (float32 for the 16/8-bit
 * floats, so the wire carries 2-4x the datatype's bytes in the reduction
 * phase) and are rounded once by loom_reduce_finish.
 *
 * Recursive doubling AllReduce keeps rank order instead: the ranks all-gather
 * their raw contributions by recursive doubling (the AllGather below), and
 * each rank reduces the n of them in rank order itself, the same expression
 * on every rank. The wire carries (p-1)/p n S instead of lg p S, which costs
 * little where this algorithm runs: small vectors, where the steps dominate.
 *
 * Rounds bound the scratch: Rabenseifner works on at most p chunks of the
 * vector at a time, recursive halving on one chunk of every block, recursive
 * doubling on RD_ROUND_SEGS chunks per rank. Scratch: two working vectors of a
 * round in the accumulator type (the butterflies), n x RD_ROUND_SEGS chunks
 * (recursive doubling).
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "dtype.h"

#define RD_ROUND_SEGS 4 /* recursive doubling AllReduce: chunks per rank and round */

enum { STEP_FOLD_IN = 1, STEP_BUTTERFLY = 2, STEP_GATHER = 3, STEP_FOLD_OUT = 4 };

/* This rank's contribution to one round, as npieces pieces of `piece`
 * elements, piece i at element i * stride of base; the round's working vector
 * is the pieces back to back. */
typedef struct {
    const uint8_t *base;
    size_t stride;
    size_t piece;
    int npieces;
} own_view_t;

/* One round of a butterfly reduction. */
typedef struct {
    loom_coll_ctx_t *ctx;
    const loom_coll_args_t *a;
    loom_fold_t f;
    size_t es, accsz;
    size_t len;            /* elements of the working vector */
    const size_t *seg_off; /* virtual segment v of the working vector, [p] */
    const size_t *seg_len;
    uint8_t *A, *B; /* working vectors in the accumulator type; A holds the partial */
} bfly_t;

static void own_init(const bfly_t *g, const own_view_t *o, uint8_t *dst)
{
    for (int i = 0; i < o->npieces; i++)
        loom_reduce_init(g->a->dt, dst + (size_t)i * o->piece * g->accsz,
                         o->base + (size_t)i * o->stride * g->es, o->piece);
}

static void own_acc(const bfly_t *g, const own_view_t *o, uint8_t *dst)
{
    for (int i = 0; i < o->npieces; i++)
        loom_reduce_acc(g->a->dt, g->a->op, dst + (size_t)i * o->piece * g->accsz,
                        o->base + (size_t)i * o->stride * g->es, o->piece);
}

static void swap_ab(bfly_t *g)
{
    uint8_t *t = g->A;
    g->A = g->B;
    g->B = t;
}

/* Fold-in: afterwards a rank with a virtual rank holds its leaf partial in A.
 * A rank that sits out has sent its data (as a partial, so pieces need no
 * packing) and returns. */
static loomResult_t fold_in(bfly_t *g, const own_view_t *own)
{
    loom_coll_ctx_t *ctx = g->ctx;
    const int me = ctx->rank;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_FOLD_IN);
    loom_reqs_t q = {.n = 0};
    if (me < 2 * g->f.rem && g->f.vrank < 0) {
        own_init(g, own, g->A);
        LOOM_CHECK(loom_reqs_send(ctx, &q, me + 1, g->A, g->len * g->accsz, tag));
        return loom_reqs_wait(ctx, &q);
    }
    if (me < 2 * g->f.rem) {
        LOOM_CHECK(loom_reqs_recv(ctx, &q, me - 1, g->B, g->len * g->accsz, tag));
        LOOM_CHECK(loom_reqs_wait(ctx, &q));
        own_acc(g, own, g->B); /* the even rank's data first */
        swap_ab(g);
        return loomSuccess;
    }
    own_init(g, own, g->A);
    return loomSuccess;
}

/* Elements [first, end) of the working vector covered by segments [lo, hi). */
static void seg_range(const bfly_t *g, int lo, int hi, size_t *first_p, size_t *n_p)
{
    *first_p = g->seg_off[lo];
    *n_p = g->seg_off[hi - 1] + g->seg_len[hi - 1] - g->seg_off[lo];
}

/* Recursive halving: A ends with segment v's partial. */
static loomResult_t butterfly(bfly_t *g)
{
    loom_coll_ctx_t *ctx = g->ctx;
    const int v = g->f.vrank;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_BUTTERFLY);
    int lo = 0, hi = g->f.p;
    for (int d = g->f.p / 2; d >= 1; d /= 2) {
        const int partner = v ^ d, peer = loom_fold_real(&g->f, partner);
        size_t keep_off, keep_n, send_off, send_n;
        int mid = lo + (hi - lo) / 2;
        int klo = (v & d) ? mid : lo, khi = (v & d) ? hi : mid;
        int slo = (v & d) ? lo : mid, shi = (v & d) ? mid : hi;
        seg_range(g, klo, khi, &keep_off, &keep_n);
        seg_range(g, slo, shi, &send_off, &send_n);
        lo = klo;
        hi = khi;
        loom_reqs_t q = {.n = 0};
        LOOM_CHECK(
            loom_reqs_recv(ctx, &q, peer, g->B + keep_off * g->accsz, keep_n * g->accsz, tag));
        LOOM_CHECK(
            loom_reqs_send(ctx, &q, peer, g->A + send_off * g->accsz, send_n * g->accsz, tag));
        LOOM_CHECK(loom_reqs_wait(ctx, &q));
        uint8_t *mine = g->A + keep_off * g->accsz, *theirs = g->B + keep_off * g->accsz;
        if (v < partner) {
            loom_combine_partials(g->a->dt, g->a->op, mine, theirs, keep_n);
        } else {
            loom_combine_partials(g->a->dt, g->a->op, theirs, mine, keep_n);
            swap_ab(g);
        }
    }
    return loomSuccess;
}

/* Recursive doubling all-gather of the virtual segments, in the datatype,
 * within out (segment v at element offset base + seg_off[v]). */
static loomResult_t gather_segments(bfly_t *g, uint8_t *out)
{
    loom_coll_ctx_t *ctx = g->ctx;
    const int v = g->f.vrank;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_GATHER);
    for (int d = 1; d < g->f.p; d *= 2) {
        int mine0 = v & ~(d - 1), theirs0 = mine0 ^ d;
        size_t moff, mn, toff, tn;
        seg_range(g, mine0, mine0 + d, &moff, &mn);
        seg_range(g, theirs0, theirs0 + d, &toff, &tn);
        int peer = loom_fold_real(&g->f, v ^ d);
        loom_reqs_t q = {.n = 0};
        LOOM_CHECK(loom_reqs_recv(ctx, &q, peer, out + toff * g->es, tn * g->es, tag));
        LOOM_CHECK(loom_reqs_send(ctx, &q, peer, out + moff * g->es, mn * g->es, tag));
        LOOM_CHECK(loom_reqs_wait(ctx, &q));
    }
    return loomSuccess;
}

/* Fold-out of a finished result of nbytes at buf: the odd rank of a pair sends it
 * to the even rank. */
static loomResult_t fold_out(bfly_t *g, uint8_t *buf, size_t nbytes)
{
    loom_coll_ctx_t *ctx = g->ctx;
    const int me = ctx->rank;
    if (me >= 2 * g->f.rem)
        return loomSuccess;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_FOLD_OUT);
    loom_reqs_t q = {.n = 0};
    if (g->f.vrank < 0)
        LOOM_CHECK(loom_reqs_recv(ctx, &q, me + 1, buf, nbytes, tag));
    else
        LOOM_CHECK(loom_reqs_send(ctx, &q, me - 1, buf, nbytes, tag));
    return loom_reqs_wait(ctx, &q);
}

/* Scratch for the two working vectors of max_len elements plus extra_bytes
 * (*extra_p), and the segment tables (*segs_p, freed by the caller). */
static loomResult_t bfly_setup(bfly_t *g, loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                               size_t max_len, size_t extra_bytes, uint8_t **extra_p,
                               size_t **segs_p)
{
    memset(g, 0, sizeof(*g));
    g->ctx = ctx;
    g->a = a;
    g->f = loom_fold(ctx->nranks, ctx->rank);
    g->es = loom_dtype_size(a->dt);
    g->accsz = loom_acc_size(a->dt);
    size_t sizes[3] = {max_len * g->accsz, max_len * g->accsz, extra_bytes};
    uint8_t *parts[3];
    LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 3, parts));
    g->A = parts[0];
    g->B = parts[1];
    if (extra_p)
        *extra_p = parts[2];
    size_t *segs = malloc(sizeof(size_t) * 2 * (size_t)g->f.p);
    if (segs == NULL) {
        LOOM_WARN("out of memory for %d segments", g->f.p);
        return loomSystemError;
    }
    g->seg_off = segs;
    g->seg_len = segs + g->f.p;
    *segs_p = segs;
    return loomSuccess;
}

// ---- AllReduce ------------------------------------------------------------------

/* One round of Rabenseifner's AllReduce over elements [base, base + len). */
static loomResult_t allreduce_round(bfly_t *g, size_t base, size_t len)
{
    const loom_coll_args_t *a = g->a;
    size_t *off = (size_t *)g->seg_off, *lens = (size_t *)g->seg_len;
    g->len = len;
    for (int v = 0; v < g->f.p; v++)
        loom_split(len, g->f.p, v, &off[v], &lens[v]);
    own_view_t own = {.base = (const uint8_t *)a->sendbuff + base * g->es,
                      .stride = 0,
                      .piece = len,
                      .npieces = 1};
    uint8_t *out = (uint8_t *)a->recvbuff + base * g->es;
    LOOM_CHECK(fold_in(g, &own));
    if (g->f.vrank >= 0) {
        LOOM_CHECK(butterfly(g));
        int v = g->f.vrank;
        loom_reduce_finish(a->dt, a->op, out + off[v] * g->es, g->A + off[v] * g->accsz, lens[v],
                           g->ctx->nranks);
        LOOM_CHECK(gather_segments(g, out));
    }
    return fold_out(g, out, len * g->es);
}

loomResult_t loom_allreduce_rhd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (ctx->nranks == 1)
        return loom_allreduce_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    loom_fold_t f = loom_fold(ctx->nranks, ctx->rank);
    size_t round = (size_t)f.p * loom_chunk_elems(ctx, loom_dtype_size(a->dt));
    if (round > a->count)
        round = a->count;
    bfly_t g;
    size_t *segs = NULL;
    loomResult_t res = bfly_setup(&g, ctx, a, round, 0, NULL, &segs);
    for (size_t base = 0; res == loomSuccess && base < a->count; base += round)
        res = allreduce_round(&g, base, a->count - base < round ? a->count - base : round);
    free(segs);
    return res;
}

loomResult_t loom_allreduce_rd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks;
    if (n == 1)
        return loom_allreduce_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    const size_t es = loom_dtype_size(a->dt);
    size_t round = RD_ROUND_SEGS * loom_chunk_elems(ctx, es);
    if (round > a->count)
        round = a->count;
    const void *srcs_small[16];
    const void **srcs = n <= 16 ? srcs_small : malloc(sizeof(*srcs) * (size_t)n);
    if (srcs == NULL) {
        LOOM_WARN("out of memory for %d ranks", n);
        return loomSystemError;
    }
    uint8_t *all = NULL;
    loomResult_t res = loom_coll_scratch(ctx, (size_t)n * round * es, &all);
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    for (size_t base = 0; res == loomSuccess && base < a->count; base += round) {
        const size_t len = a->count - base < round ? a->count - base : round;
        const loom_coll_args_t gather = {.kind = LOOM_COLL_ALLGATHER,
                                         .sendbuff = send + base * es,
                                         .recvbuff = all,
                                         .count = len,
                                         .dt = a->dt};
        res = loom_allgather_rd(ctx, &gather);
        for (int r = 0; r < n; r++)
            srcs[r] = all + (size_t)r * len * es;
        if (res == loomSuccess) /* the send slice is in `all` now: in place is safe */
            loom_reduce_multi(a->dt, a->op, recv + base * es, srcs, n, len, n);
    }
    if (srcs != srcs_small)
        free(srcs);
    return res;
}

// ---- ReduceScatter --------------------------------------------------------------

/* One round: elements [k0, k0 + len) of every rank's block. */
static loomResult_t reduce_scatter_round(bfly_t *g, size_t k0, size_t len, uint8_t *tmp)
{
    const loom_coll_args_t *a = g->a;
    const int me = g->ctx->rank, n = g->ctx->nranks;
    size_t *off = (size_t *)g->seg_off, *lens = (size_t *)g->seg_len;
    g->len = (size_t)n * len;
    for (int v = 0; v < g->f.p; v++) {
        off[v] = (size_t)loom_fold_first(&g->f, v) * len;
        lens[v] = (size_t)loom_fold_width(&g->f, v) * len;
    }
    own_view_t own = {.base = (const uint8_t *)a->sendbuff + k0 * g->es,
                      .stride = a->count,
                      .piece = len,
                      .npieces = n};
    uint8_t *out = (uint8_t *)a->recvbuff + k0 * g->es;
    LOOM_CHECK(fold_in(g, &own));
    const uint32_t tag = loom_tag_coll(g->ctx->seq, STEP_FOLD_OUT);
    loom_reqs_t q = {.n = 0};
    if (g->f.vrank < 0) {
        LOOM_CHECK(loom_reqs_recv(g->ctx, &q, me + 1, out, len * g->es, tag));
        return loom_reqs_wait(g->ctx, &q);
    }
    LOOM_CHECK(butterfly(g));
    const uint8_t *mine = g->A + off[g->f.vrank] * g->accsz;
    if (loom_fold_width(&g->f, g->f.vrank) == 2) {
        /* The pair's segment: the even rank's block first, then this rank's. */
        loom_reduce_finish(a->dt, a->op, tmp, mine, len, n);
        loom_reduce_finish(a->dt, a->op, out, mine + len * g->accsz, len, n);
        LOOM_CHECK(loom_reqs_send(g->ctx, &q, me - 1, tmp, len * g->es, tag));
        return loom_reqs_wait(g->ctx, &q);
    }
    loom_reduce_finish(a->dt, a->op, out, mine, len, n);
    return loomSuccess;
}

loomResult_t loom_reduce_scatter_rhd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks;
    if (n == 1)
        return loom_reduce_scatter_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    const size_t es = loom_dtype_size(a->dt);
    size_t c = loom_chunk_elems(ctx, es);
    if (c > a->count)
        c = a->count;
    bfly_t g;
    size_t *segs = NULL;
    uint8_t *tmp = NULL; /* a folded pair's second block, rounded, for the even rank */
    loomResult_t res = bfly_setup(&g, ctx, a, (size_t)n * c, c * es, &tmp, &segs);
    for (size_t k0 = 0; res == loomSuccess && k0 < a->count; k0 += c)
        res = reduce_scatter_round(&g, k0, a->count - k0 < c ? a->count - k0 : c, tmp);
    free(segs);
    return res;
}

// ---- AllGather ------------------------------------------------------------------

loomResult_t loom_allgather_rd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t es = loom_dtype_size(a->dt), bytes = a->count * es;
    uint8_t *recv = a->recvbuff;
    if (bytes == 0)
        return loomSuccess;
    loom_fold_t f = loom_fold(n, me);
    loom_reqs_t q = {.n = 0};
    if (me < 2 * f.rem && f.vrank < 0) {
        /* Sits out: hand the block over, then receive everything. */
        const uint32_t tag_in = loom_tag_coll(ctx->seq, STEP_FOLD_IN);
        LOOM_CHECK(loom_reqs_send(ctx, &q, me + 1, a->sendbuff, bytes, tag_in));
        LOOM_CHECK(loom_reqs_wait(ctx, &q));
        const uint32_t tag_out = loom_tag_coll(ctx->seq, STEP_FOLD_OUT);
        LOOM_CHECK(loom_reqs_recv(ctx, &q, me + 1, recv, (size_t)n * bytes, tag_out));
        return loom_reqs_wait(ctx, &q);
    }
    if ((const uint8_t *)a->sendbuff != recv + (size_t)me * bytes)
        memcpy(recv + (size_t)me * bytes, a->sendbuff, bytes);
    if (n == 1)
        return loomSuccess;
    if (me < 2 * f.rem) {
        LOOM_CHECK(loom_reqs_recv(ctx, &q, me - 1, recv + (size_t)(me - 1) * bytes, bytes,
                                  loom_tag_coll(ctx->seq, STEP_FOLD_IN)));
        LOOM_CHECK(loom_reqs_wait(ctx, &q));
    }
    /* Virtual segment v = the blocks of the real ranks it carries, contiguous. */
    bfly_t g;
    memset(&g, 0, sizeof(g));
    g.ctx = ctx;
    g.a = a;
    g.f = f;
    g.es = es;
    size_t *segs = malloc(sizeof(size_t) * 2 * (size_t)f.p);
    if (segs == NULL) {
        LOOM_WARN("out of memory for %d segments", f.p);
        return loomSystemError;
    }
    for (int v = 0; v < f.p; v++) {
        segs[v] = (size_t)loom_fold_first(&f, v) * a->count;
        segs[f.p + v] = (size_t)loom_fold_width(&f, v) * a->count;
    }
    g.seg_off = segs;
    g.seg_len = segs + f.p;
    loomResult_t res = gather_segments(&g, recv);
    if (res == loomSuccess)
        res = fold_out(&g, recv, (size_t)n * bytes);
    free(segs);
    return res;
}

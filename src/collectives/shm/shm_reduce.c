/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_reduce.c - the reducing shm collectives: AllReduce, ReduceScatter
 * (and ReduceScatterV) and Reduce over the communicator's arena (shm_coll.h,
 * p2p.h).
 *
 * All are "reduce to owners": owner o reduces, in rank order, one span
 * of elements (AllReduce and Reduce: the vector split in n slices;
 * ReduceScatter: block o; ReduceScatterV: block o of recvcounts[o] elements
 * at their prefix sum, the rounds following the longest, so ReduceScatter's
 * entry points run it as they are), and the results go to every rank (AllReduce), to
 * the owner (ReduceScatter) or to the root (Reduce). H = one slot half.
 *
 * flat (AllReduce, S <= H): copy the vector into this rank's half, post step
 *   1, wait for every peer's step 1, reduce all n halves into recvbuff. One
 *   flag and one wait per call; every rank reduces n S bytes (cheap while S is
 *   small, and no second synchronisation). The half is reused two rounds
 *   later, once every peer posted a flag of a later call.
 *   Reduce: the non-roots copy in pieces, posting after each, and return; the
 *   root posts ARRIVE and reduces each piece of the halves with its own
 *   sendbuff as it is posted.
 *
 * cico: rounds of E = H / n elements per owner (64-byte multiples). Round k,
 *   half h (alternating, so the copy-in of round k+1 never waits for round k's
 *   readers):
 *     1. copy this rank's part k of every other owner's span into the half,
 *        sub-block o at o E; post IN(k) = 2k+1; wait for every peer's IN(k);
 *     2. reduce sub-block `me` of the peers' halves and its own part of
 *        sendbuff (one fused pass, loom_reduce_multi) into the destination,
 *        and (AllReduce; Reduce off the root) into its own sub-block of the
 *        half, which only it writes and only the others read; post RED(k) =
 *        2k+2. A large out-of-place AllReduce reduces into the half and
 *        streams that to recvbuff (c->nt_out, loom_shm_copy); while copies in
 *        go past the cache (c->nt_in) the half's copy is the one streamed,
 *        and a Reduce off the root reduces into scratch and streams that;
 *     3. AllReduce: wait for every RED(k) and copy each owner's sub-block out;
 *        Reduce: the root does that alone.
 *   A peer's IN(k+1) proves it is done with this rank's half of round k.
 *   Bytes per rank: (n-1)/n S copied in, S/n reduced (n reads), (n-1)/n S
 *   copied out.
 *
 * cma: post ARRIVE with the buffers' addresses, wait for all; each owner
 *   reads its span of every peer's sendbuff with process_vm_readv in 128 KiB
 *   blocks and reduces them with its own, in rank order, into its recvbuff
 *   (AllReduce, ReduceScatter). AllReduce then posts RED = 2, and after every
 *   RED each rank reads the other spans straight out of their owners'
 *   recvbuff. Reduce goes in rounds of E = H elements per owner instead: the
 *   others reduce into their half, post RED(k) = k+2, and the root copies
 *   their results out. Finally DONE, so no rank leaves while its buffers are
 *   still being read. Bytes per rank: (n-1)/n S read from peers' sendbuff,
 *   and (AllReduce) (n-1)/n S from their recvbuff; nothing copied in.
 *
 * In place is safe in every variant: a rank's input elements are read (or
 * copied in) before the result of the same elements is written, and other
 * owners' results are copied into recvbuff only after their RED flag, which
 * they post after the last read of those elements.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "kernels.h"
#include "shm_coll.h"

enum { OUT_ALL, OUT_OWNER, OUT_ROOT };

/* The reduction plan of one call. */
typedef struct {
    shm_call_t c;
    loom_span_t spans_small[16];
    loom_span_t *spans; /* [n] owner spans of the send vector */
    int mode;           /* OUT_* */
    size_t maxlen;      /* longest span */
} plan_t;

static loomResult_t plan_init(plan_t *p, loom_coll_ctx_t *ctx, const loom_coll_args_t *a, int mode)
{
    const int n = ctx->nranks;
    p->mode = mode;
    p->maxlen = 0;
    p->spans = n <= 16 ? p->spans_small : malloc(sizeof(*p->spans) * (size_t)n);
    if (p->spans == NULL) {
        LOOM_WARN("rank %d: out of memory for %d spans", ctx->rank, n);
        return loomSystemError;
    }
    for (int o = 0; o < n; o++) {
        if (a->kind == LOOM_COLL_REDUCE_SCATTERV) {
            p->spans[o].off = a->rdispls[o];
            p->spans[o].len = a->recvcounts[o];
        } else if (mode == OUT_OWNER) {
            p->spans[o].off = (size_t)o * a->count;
            p->spans[o].len = a->count;
        } else {
            loom_split(a->count, n, o, &p->spans[o].off, &p->spans[o].len);
        }
        if (p->spans[o].len > p->maxlen)
            p->maxlen = p->spans[o].len;
    }
    return loomSuccess;
}

static void plan_fini(plan_t *p)
{
    if (p->spans != p->spans_small)
        free(p->spans);
}

/* Where element i of owner o's span lands in recvbuff (elements). */
static size_t dst_index(const plan_t *p, int o, size_t i)
{
    return p->mode == OUT_OWNER ? i : p->spans[o].off + i;
}

static size_t part_len(const loom_span_t *s, size_t lo, size_t e)
{
    return lo >= s->len ? 0 : (s->len - lo < e ? s->len - lo : e);
}

/* After RED(k): copies every other owner's part of round k out of its half. */
static loomResult_t copy_out(plan_t *p, unsigned h, size_t lo, size_t e, uint64_t red_flag,
                             size_t sub_stride)
{
    shm_call_t *c = &p->c;
    LOOM_CHECK(loom_arena_wait(c->ar, -1, red_flag));
    uint8_t *recv = c->a->recvbuff;
    for (int i = 1; i < c->n; i++) {
        int r = (c->me + i) % c->n;
        size_t len = part_len(&p->spans[r], lo, e);
        if (len > 0)
            loom_shm_copy_out(c, recv + dst_index(p, r, lo) * c->es,
                              loom_arena_half(c->ar, r, h) + (size_t)r * sub_stride, len * c->es);
    }
    return loomSuccess;
}

// ---- flat ----------------------------------------------------------------------------

/* A Reduce's pieces (AllReduce: one, the whole vector): SHM_FLAT_PIECES of whole lines, at
 * least the plan's piece (the L1d). Each non-root copies piece k into its half and posts
 * ARRIVE + k, so that the root, which reads its own part straight from sendbuff, reduces piece k
 * while the others copy piece k + 1; unpipelined, the root waited for the whole copy before its
 * first read. Every rank cuts the same pieces: they follow the plan, which every rank of an
 * arena computes from the same machine (docs/PERFORMANCE.md has the measurements). */
#define SHM_FLAT_PIECES 8

static size_t flat_piece_elems(size_t count, size_t es, size_t piece_min)
{
    size_t piece = (count * es + SHM_FLAT_PIECES - 1) / SHM_FLAT_PIECES;
    piece = (piece + 63) & ~(size_t)63;
    if (piece < piece_min)
        piece = piece_min;
    return piece / es ? piece / es : 1;
}

/* Starts a flat call: 1 and c, h (its half, acquired), or 0 and *res: the call is done (no
 * bytes) or ran as cico (it does not fit a half). */
static int flat_begin(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, loom_algo_fn_t cico,
                      shm_call_t *c, unsigned *h, loomResult_t *res)
{
    loom_arena_t *ar = loom_shm_arena(ctx);
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    *res = loomSuccess;
    if (bytes == 0)
        return 0;
    if (ar == NULL || bytes > loom_arena_half_bytes(ar)) { /* does not fit a half */
        *res = cico(ctx, a);
        return 0;
    }
    *res = loom_shm_begin(c, ctx, a, SHM_ALGO_FLAT);
    if (*res != loomSuccess)
        return 0;
    *h = loom_arena_next_half(ar);
    *res = loom_arena_half_acquire(ar, *h);
    /* Readers are done once they post anything of a later call. */
    loom_arena_half_release(ar, *h, shm_flag(c, SHM_STEP_ARRIVE + 1));
    return *res == loomSuccess;
}

/* Reduces all n halves of h into recvbuff, piece k once every peer posted ARRIVE + k; this
 * rank's own part from sendbuff where own_from_send (it copied nothing in). */
static loomResult_t flat_reduce(shm_call_t *c, unsigned h, size_t pe, size_t pieces,
                                int own_from_send)
{
    const loom_coll_args_t *a = c->a;
    uint8_t *acc, *tmp;
    LOOM_CHECK(loom_shm_scratch(c, &acc, &tmp));
    const void *srcs_small[SHM_SRCS_SMALL];
    const void **srcs = loom_shm_srcs(c->n, c->me, srcs_small);
    if (srcs == NULL)
        return loomSystemError;
    loomResult_t res = loomSuccess;
    const size_t be = loom_shm_block_elems(c);
    for (size_t k = 0; k < pieces && res == loomSuccess; k++) {
        res = loom_arena_wait(c->ar, -1, shm_flag(c, SHM_STEP_ARRIVE + k));
        if (res == loomSuccess && k == 0)
            res = loom_shm_check(c, -1);
        const size_t end = k + 1 == pieces ? a->count : (k + 1) * pe;
        for (size_t i = k * pe; i < end && res == loomSuccess; i += be) {
            const size_t len = end - i < be ? end - i : be;
            for (int r = 0; r < c->n; r++)
                srcs[r] = r == c->me && own_from_send ? (const uint8_t *)a->sendbuff + i * c->es
                                                      : loom_arena_half(c->ar, r, h) + i * c->es;
            loom_shm_reduce(c, srcs, len, acc, (uint8_t *)a->recvbuff + i * c->es, NULL);
        }
    }
    loom_shm_srcs_free(srcs, srcs_small);
    LOOM_CHECK(res);
    return loom_shm_end(c);
}

/* AllReduce: every rank copies its vector into its slot half and posts once, then reduces
 * all n halves. */
loomResult_t loom_allreduce_shm_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    shm_call_t c;
    unsigned h;
    loomResult_t res;
    if (!flat_begin(ctx, a, loom_allreduce_shm_cico, &c, &h, &res))
        return res;
    loom_shm_copy(loom_arena_half(c.ar, c.me, h), a->sendbuff, a->count * c.es, 0);
    loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE));
    return flat_reduce(&c, h, a->count, 1, 0);
}

/* Reduce: the non-roots copy piece by piece and leave; the root posts ARRIVE at once (so that
 * a non-root that runs two calls ahead finds its half free without waiting for the root to
 * finish, which costs a wake-up when it sleeps) and reduces the pieces as they come. */
static loomResult_t run_flat_reduce(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    shm_call_t c;
    unsigned h;
    loomResult_t res;
    if (!flat_begin(ctx, a, loom_reduce_shm_cico, &c, &h, &res))
        return res;
    const size_t pe = flat_piece_elems(a->count, c.es, c.plan.piece_bytes);
    const size_t pieces = (a->count + pe - 1) / pe;
    if (c.me == a->root) {
        loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE));
        return flat_reduce(&c, h, pe, pieces, 1);
    }
    for (size_t k = 0; k < pieces; k++) {
        const size_t off = k * pe * c.es;
        const size_t len = (k + 1 == pieces ? a->count - k * pe : pe) * c.es;
        loom_shm_copy(loom_arena_half(c.ar, c.me, h) + off, (const uint8_t *)a->sendbuff + off, len,
                      0);
        loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE + k));
    }
    return loom_shm_end(&c);
}

loomResult_t loom_reduce_shm_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return run_flat_reduce(ctx, a);
}

// ---- copy in, copy out ---------------------------------------------------------------

/* Elements per owner and round: the half holds one sub-block per owner. */
static size_t cico_elems(const loom_arena_t *ar, int n, size_t es)
{
    if (ar == NULL)
        return 0;
    size_t e = loom_arena_half_bytes(ar) / (size_t)n / es;
    size_t line = 64 / es;
    return e > line ? e / line * line : e;
}

static loomResult_t cico_round(plan_t *p, size_t k, size_t e, const void **srcs, uint8_t *acc,
                               uint8_t *tmp)
{
    shm_call_t *c = &p->c;
    loom_arena_t *ar = c->ar;
    const size_t es = c->es, lo = k * e, stride = e * es;
    const unsigned h = loom_arena_next_half(ar);
    LOOM_CHECK(loom_arena_half_acquire(ar, h));
    uint8_t *mine = loom_arena_half(ar, c->me, h);
    const uint8_t *send = c->a->sendbuff;
    for (int o = 0; o < c->n; o++) { /* the own part is reduced straight from sendbuff */
        size_t len = part_len(&p->spans[o], lo, e);
        if (len > 0 && o != c->me)
            loom_shm_copy_in(c, mine + (size_t)o * stride, send + (p->spans[o].off + lo) * es,
                             len * es);
    }
    loom_arena_post(ar, shm_flag(c, 2 * k + 1));
    LOOM_CHECK(loom_arena_wait(ar, -1, shm_flag(c, 2 * k + 1)));
    if (k == 0)
        LOOM_CHECK(loom_shm_check(c, -1));
    const size_t len = part_len(&p->spans[c->me], lo, e);
    const int to_recv = p->mode != OUT_ROOT || c->me == c->a->root;
    const int to_half = p->mode == OUT_ALL || (p->mode == OUT_ROOT && c->me != c->a->root);
    const size_t be = loom_shm_block_elems(c);
    uint8_t *recv = c->a->recvbuff;
    for (size_t i = 0; i < len; i += be) {
        size_t n = len - i < be ? len - i : be;
        for (int r = 0; r < c->n; r++)
            srcs[r] = loom_arena_half(ar, r, h) + (size_t)c->me * stride + i * es;
        srcs[c->me] = send + (p->spans[c->me].off + lo + i) * es;
        uint8_t *own = mine + (size_t)c->me * stride + i * es;
        uint8_t *dst = to_recv ? recv + dst_index(p, c->me, lo + i) * es : own;
        /* Into the slot, then streamed out; but when the slot's copy must go past
         * the cache (c->nt_in), into recvbuff and then streamed to the slot. */
        if (to_recv && to_half && c->nt_out && !c->nt_in) {
            loom_shm_reduce(c, srcs, n, acc, own, NULL);
            loom_shm_copy(dst, own, n * es, 1);
        } else if (!to_recv && c->nt_in) { /* through tmp, then past the cache */
            loom_shm_reduce(c, srcs, n, acc, tmp, own);
        } else {
            loom_shm_reduce(c, srcs, n, acc, dst, to_recv && to_half ? own : NULL);
        }
    }
    if (p->mode != OUT_OWNER)
        loom_arena_post(ar, shm_flag(c, 2 * k + 2));
    if (p->mode == OUT_ALL || (p->mode == OUT_ROOT && c->me == c->a->root))
        LOOM_CHECK(copy_out(p, h, lo, e, shm_flag(c, 2 * k + 2), stride));
    loom_arena_half_release(ar, h, shm_flag(c, 2 * k + 3));
    return loomSuccess;
}

/* The point-to-point algorithm, for calls the arena cannot take (too many
 * ranks for a half, or more rounds than flag steps); every rank sees this alike. */
static loomResult_t fallback(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, int mode)
{
    if (a->kind == LOOM_COLL_REDUCE_SCATTERV)
        return loom_reduce_scatterv_direct(ctx, a);
    return mode == OUT_ALL     ? loom_allreduce_direct(ctx, a)
           : mode == OUT_OWNER ? loom_reduce_scatter_direct(ctx, a)
                               : loom_reduce_direct(ctx, a);
}

/* Elements of a call's sendbuff: n blocks of count for ReduceScatter, count (the sum of the
 * counts for ReduceScatterV) otherwise. */
static size_t send_elems(const loom_coll_args_t *a, int n, int mode)
{
    return a->count * (mode == OUT_OWNER && a->kind != LOOM_COLL_REDUCE_SCATTERV ? (size_t)n : 1);
}

/* Elements this rank writes to recvbuff: its block (ReduceScatter and V), else count. */
static size_t out_elems(const loom_coll_args_t *a, int me)
{
    return a->kind == LOOM_COLL_REDUCE_SCATTERV ? a->recvcounts[me] : a->count;
}

/* The longest span of a call's plan (the owner's blocks), before the plan is made. */
static size_t longest_span(const loom_coll_args_t *a, int n, int mode)
{
    size_t m = 0;
    if (a->kind == LOOM_COLL_REDUCE_SCATTERV) {
        for (int o = 0; o < n; o++)
            m = a->recvcounts[o] > m ? a->recvcounts[o] : m;
        return m;
    }
    return mode == OUT_OWNER ? a->count : (a->count + (size_t)n - 1) / (size_t)n;
}

/* 1 if recvbuff lies in sendbuff (NCCL's in-place layouts). */
static int in_place(const shm_call_t *c, int mode)
{
    const loom_coll_args_t *a = c->a;
    const size_t send_bytes = send_elems(a, c->n, mode) * c->es;
    const uint8_t *s = a->sendbuff, *r = a->recvbuff;
    return r >= s && r < s + send_bytes;
}

static loomResult_t run_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, int mode)
{
    const size_t e = cico_elems(loom_shm_arena(ctx), ctx->nranks, loom_dtype_size(a->dt));
    const size_t span = longest_span(a, ctx->nranks, mode);
    if (e == 0 || !shm_rounds_fit((span + e - 1) / e, 2))
        return fallback(ctx, a, mode);
    plan_t p;
    LOOM_CHECK(plan_init(&p, ctx, a, mode));
    loomResult_t res = loomSuccess;
    const void *srcs_small[SHM_SRCS_SMALL];
    const void **srcs = loom_shm_srcs(ctx->nranks, ctx->rank, srcs_small);
    uint8_t *acc = NULL, *tmp = NULL;
    if (srcs == NULL) {
        res = loomSystemError;
        goto out;
    }
    LOOM_CHECK_GOTO(loom_shm_begin(&p.c, ctx, a, SHM_ALGO_CICO), res, out);
    LOOM_CHECK_GOTO(loom_shm_scratch(&p.c, &acc, &tmp), res, out);
    /* In place the destination of a copy out was read by this round's copy in. */
    shm_nt_out_if(&p.c, out_elems(a, ctx->rank) * p.c.es, in_place(&p.c, mode));
    /* Every rank copies (n-1)/n of its input in (ReduceScatter: of n blocks). */
    const size_t in_bytes = send_elems(a, ctx->nranks, mode) * p.c.es;
    shm_nt_in_if(&p.c, in_bytes - in_bytes / (size_t)ctx->nranks);
    const size_t rounds = (p.maxlen + e - 1) / e;
    for (size_t k = 0; k < rounds; k++)
        LOOM_CHECK_GOTO(cico_round(&p, k, e, srcs, acc, tmp), res, out);
    res = loom_shm_end(&p.c);
out:
    loom_shm_srcs_free(srcs, srcs_small);
    plan_fini(&p);
    return res;
}

// ---- single copy ---------------------------------------------------------------------

/* Reduces elements [lo, lo + len) of this rank's span, reading each peer's part. */
static loomResult_t cma_reduce_part(plan_t *p, size_t lo, size_t len,
                                    const loom_arena_desc_t *peers, uint8_t *acc, uint8_t *tmp,
                                    uint8_t *half)
{
    shm_call_t *c = &p->c;
    const size_t es = c->es, be = loom_shm_block_elems(c);
    const loomDataType_t dt = c->a->dt;
    const size_t off = p->spans[c->me].off + lo;
    const uint8_t *send = c->a->sendbuff;
    const int to_half = p->mode == OUT_ROOT && c->me != c->a->root;
    uint8_t *recv = c->a->recvbuff;
    for (size_t i = 0; i < len; i += be) {
        size_t n = len - i < be ? len - i : be;
        uint8_t *dst = to_half ? half + i * es : recv + dst_index(p, c->me, lo + i) * es;
        const uint8_t *own = send + (off + i) * es;
        /* As loom_shm_reduce: accumulate in dst unless it would clobber the own
         * part (in place) before a rank after rank 0 adds it. */
        const int in_dst = loom_acc_is_native(dt) &&
                           (own == dst ? c->me == 0 : own + n * es <= dst || dst + n * es <= own);
        void *target = in_dst ? (void *)dst : acc;
        for (int r = 0; r < c->n; r++) {
            const void *src = own;
            if (r != c->me) {
                LOOM_CHECK(loom_arena_read(c->ar, r, tmp, peers[r].send + (off + i) * es, n * es));
                src = tmp;
            }
            if (r == 0)
                loom_reduce_init(dt, target, src, n);
            else
                loom_reduce_acc(dt, c->a->op, target, src, n);
        }
        loom_reduce_finish(dt, c->a->op, dst, target, n, c->n);
    }
    return loomSuccess;
}

/* AllReduce: the owners reduce their whole span into their recvbuff, then
 * every rank reads the other spans out of their owners' recvbuff. */
static loomResult_t cma_allreduce(plan_t *p, const loom_arena_desc_t *peers, uint8_t *acc,
                                  uint8_t *tmp)
{
    shm_call_t *c = &p->c;
    LOOM_CHECK(cma_reduce_part(p, 0, p->spans[c->me].len, peers, acc, tmp, NULL));
    loom_arena_post(c->ar, shm_flag(c, 2));
    LOOM_CHECK(loom_arena_wait(c->ar, -1, shm_flag(c, 2)));
    uint8_t *recv = c->a->recvbuff;
    for (int i = 1; i < c->n; i++) {
        const int r = (c->me + i) % c->n;
        const size_t off = p->spans[r].off * c->es;
        if (p->spans[r].len > 0)
            LOOM_CHECK(loom_arena_read(c->ar, r, recv + off, peers[r].recv + off,
                                       p->spans[r].len * c->es));
    }
    return loomSuccess;
}

/* ReduceScatter (no staging) and Reduce (the others stage their results in
 * their halves, one round of a half per owner, for the root to copy out). */
static loomResult_t cma_rounds(plan_t *p, const loom_arena_desc_t *peers, uint8_t *acc,
                               uint8_t *tmp)
{
    shm_call_t *c = &p->c;
    loom_arena_t *ar = c->ar;
    if (p->mode == OUT_OWNER)
        return cma_reduce_part(p, 0, p->spans[c->me].len, peers, acc, tmp, NULL);
    const size_t e = loom_arena_half_bytes(ar) / c->es;
    const size_t rounds = (p->maxlen + e - 1) / e;
    const int staged = c->me != c->a->root;
    for (size_t k = 0; k < rounds; k++) {
        const unsigned h = loom_arena_next_half(ar);
        if (staged)
            LOOM_CHECK(loom_arena_half_acquire(ar, h));
        const size_t lo = k * e, len = part_len(&p->spans[c->me], lo, e);
        LOOM_CHECK(cma_reduce_part(p, lo, len, peers, acc, tmp, loom_arena_half(ar, c->me, h)));
        loom_arena_post(ar, shm_flag(c, k + 2));
        if (!staged)
            LOOM_CHECK(copy_out(p, h, lo, e, shm_flag(c, k + 2), 0));
        else
            loom_arena_half_release(ar, h, shm_flag(c, k + 3));
    }
    return loomSuccess;
}

static loomResult_t run_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, int mode)
{
    const loom_arena_t *ar = loom_shm_arena(ctx);
    if (ar == NULL || !loom_arena_single_copy(ar))
        return run_cico(ctx, a, mode);
    const size_t e = loom_arena_half_bytes(ar) / loom_dtype_size(a->dt);
    if (!shm_rounds_fit(a->count / e + 1, 1))
        return fallback(ctx, a, mode);
    plan_t p;
    LOOM_CHECK(plan_init(&p, ctx, a, mode));
    loomResult_t res = loomSuccess;
    loom_arena_desc_t peers_small[16];
    loom_arena_desc_t *peers =
        ctx->nranks <= 16 ? peers_small : malloc(sizeof(*peers) * (size_t)ctx->nranks);
    uint8_t *acc, *tmp;
    if (peers == NULL) {
        LOOM_WARN("rank %d: out of memory for %d descriptors", ctx->rank, ctx->nranks);
        res = loomSystemError;
        goto out;
    }
    LOOM_CHECK_GOTO(loom_shm_begin(&p.c, ctx, a, SHM_ALGO_CMA), res, out);
    LOOM_CHECK_GOTO(loom_shm_scratch(&p.c, &acc, &tmp), res, out);
    loom_arena_post(p.c.ar, shm_flag(&p.c, SHM_STEP_ARRIVE));
    LOOM_CHECK_GOTO(loom_arena_wait(p.c.ar, -1, shm_flag(&p.c, SHM_STEP_ARRIVE)), res, out);
    LOOM_CHECK_GOTO(loom_shm_check(&p.c, -1), res, out);
    for (int r = 0; r < p.c.n; r++)
        loom_arena_peer_desc(p.c.ar, r, &peers[r]);
    if (mode == OUT_ALL)
        LOOM_CHECK_GOTO(cma_allreduce(&p, peers, acc, tmp), res, out);
    else
        LOOM_CHECK_GOTO(cma_rounds(&p, peers, acc, tmp), res, out);
    res = loom_shm_finish_single_copy(&p.c);
out:
    if (peers != peers_small)
        free(peers);
    plan_fini(&p);
    return res;
}

// ---- entry points ----------------------------------------------------------------------

loomResult_t loom_allreduce_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cico(ctx, a, OUT_ALL);
}

loomResult_t loom_allreduce_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cma(ctx, a, OUT_ALL);
}

loomResult_t loom_allreduce_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, loom_allreduce_shm_flat, loom_allreduce_shm_cico,
                        loom_allreduce_shm_cma);
}

loomResult_t loom_reduce_scatter_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cico(ctx, a, OUT_OWNER);
}

loomResult_t loom_reduce_scatter_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cma(ctx, a, OUT_OWNER);
}

loomResult_t loom_reduce_scatter_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, NULL, loom_reduce_scatter_shm_cico, loom_reduce_scatter_shm_cma);
}

loomResult_t loom_reduce_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cico(ctx, a, OUT_ROOT);
}

loomResult_t loom_reduce_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (a->count == 0)
        return loomSuccess;
    return run_cma(ctx, a, OUT_ROOT);
}

loomResult_t loom_reduce_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, loom_reduce_shm_flat, loom_reduce_shm_cico, loom_reduce_shm_cma);
}

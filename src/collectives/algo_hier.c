/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_hier.c - hierarchical AllReduce, ReduceScatter, AllGather and
 * Broadcast for communicators that span several hosts with the same number
 * L > 1 of ranks on each (loom_hosts_t). Each call runs in three phases on
 * two parts of the communicator, each with a context of its own whose group
 * maps its ranks to the communicator's (coll.h):
 *  - "local": the L ranks of this rank's host, by local index, on the
 *    intra-host link constants;
 *  - "rail": the H ranks that share this rank's local index, one per host,
 *    by host; the flat algorithm the model picks for the part's call runs
 *    there, so that all L rails of a host use the network at once, each with
 *    1/L of the data (NCCL's and MPICH's SMP-aware scheme).
 * AllReduce: local reduce-to-owners of L slices (the partial stays in the
 * accumulator type), rail AllReduce of the slice, one rounding, local
 * all-gather of the slices. ReduceScatter: the blocks are packed by the local
 * index of their rank, local reduce-to-owners, rail ReduceScatter, rounding.
 * AllGather: rail AllGather of this rank's block, then every rank hands the H
 * blocks it holds to each other rank of its host. Broadcast: the root hands
 * each rank of its host a slice, each rail broadcasts its slice from the
 * root's host, local all-gather of the slices. AllToAll (small blocks):
 * blocks regrouped inside the host by destination local index, then one
 * message per other host on each rail. AllToAllv does the same with its small
 * blocks only, in algo_hier_a2av.c; what both files share is in algo_hier.h.
 * Determinism: the reduction order is fixed by the layout (a host's ranks in
 * local order, then the rail algorithm's own fixed order over hosts) and only
 * owners compute, so every rank gets the same bits, run to run. Calls are
 * cut in rounds of LOOM_HIER_ROUND_BYTES of the vector, which bounds the
 * buffer these algorithms keep (ctx->hier_buf) to about that much.
 * Where the layout has no hierarchy (one host, or hosts of unequal sizes) the
 * cost functions say LOOM_COST_NA; a call that LOOM_ALGO forces there runs
 * the flat algorithm the model picks instead.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_hier.h"
#include "algo_util.h"
#include "check.h"
#include "dtype.h"

static int hier_usable(const loom_coll_ctx_t *ctx)
{
    return ctx->group == NULL && ctx->hosts.nhosts > 1 && ctx->hosts.ppn > 1;
}

int loom_hier_begin(loom_hier_t *h, loom_coll_ctx_t *ctx)
{
    if (!hier_usable(ctx))
        return 0;
    const loom_hosts_t *k = &ctx->hosts;
    h->ctx = ctx;
    h->L = k->ppn;
    h->H = k->nhosts;
    h->l = k->lrank;
    h->host = k->host;
    loom_coll_part_init(&h->local, ctx, &k->rank_of[k->host * k->ppn], k->lrank, k->ppn,
                        &ctx->intra);
    loom_coll_part_init(&h->rail, ctx, k->rail, k->host, k->nhosts, &ctx->link);
    return 1;
}

/* The rails' share of a reduction: partials in the accumulator type, whose
 * avg is still a sum (rounded and divided once, by the owner). */
static loom_coll_args_t across_reduce(loom_coll_kind_t kind, const loom_coll_args_t *a,
                                      const void *in, void *out, size_t count)
{
    loom_coll_args_t c = {.kind = kind,
                          .sendbuff = in,
                          .recvbuff = out,
                          .count = count,
                          .dt = loom_acc_dtype(a->dt),
                          .op = a->op == loomAvg ? loomSum : a->op};
    return c;
}

/* The parts share the communicator's scratch: whoever grows it frees the old
 * one, so each part takes the current one before it runs and hands it back. */
static void take_scratch(loom_hier_t *h, loom_coll_ctx_t *part)
{
    part->scratch = h->ctx->scratch;
    part->scratch_bytes = h->ctx->scratch_bytes;
}
static void give_scratch(loom_hier_t *h, loom_coll_ctx_t *part)
{
    h->ctx->scratch = part->scratch;
    h->ctx->scratch_bytes = part->scratch_bytes;
}

/* Runs the flat algorithm the model picks for call a on a part. */
static loomResult_t run_flat(loom_hier_t *h, loom_coll_ctx_t *part, const loom_coll_args_t *a)
{
    const loom_algo_t *algo = loom_algo_pick_flat(part, a);
    if (algo == NULL) {
        LOOM_WARN("no algorithm for %s on %d ranks", loom_coll_name(a->kind), part->nranks);
        return loomInternalError;
    }
    take_scratch(h, part);
    loomResult_t res = algo->fn(part, a);
    give_scratch(h, part);
    return res;
}

static loomResult_t local_partial(loom_hier_t *h, const loom_coll_args_t *a,
                                  const loom_span_t *spans, void *acc)
{
    take_scratch(h, &h->local);
    loomResult_t res =
        loom_coll_reduce_to_owners_partial(&h->local, a, spans, acc, STEP_LOCAL_REDUCE);
    give_scratch(h, &h->local);
    return res;
}

loomResult_t loom_hier_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const loom_algo_t *algo = loom_algo_pick_flat(ctx, a);
    if (algo == NULL) {
        LOOM_WARN("no algorithm for %s on %d ranks", loom_coll_name(a->kind), ctx->nranks);
        return loomInternalError;
    }
    return algo->fn(ctx, a);
}

loomResult_t loom_hier_buf(loom_coll_ctx_t *ctx, size_t nbytes, uint8_t **buf_p)
{
    LOOM_CHECK(loom_coll_grow(&ctx->hier_buf, &ctx->hier_bytes, nbytes, ctx->rank,
                              "hierarchical collective buffer"));
    *buf_p = ctx->hier_buf;
    return loomSuccess;
}

loomResult_t loom_hier_calloc(size_t n, size_t size, void *p_out)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        LOOM_WARN("out of memory for %zu entries", n);
        return loomSystemError;
    }
    *(void **)p_out = p;
    return loomSuccess;
}

loomResult_t loom_hier_local_allgather(loom_hier_t *h, uint8_t *buf, const loom_span_t *spans,
                                       size_t es, unsigned step)
{
    loom_coll_ctx_t *p = &h->local;
    const int L = h->L, me = h->l;
    const uint32_t tag = loom_tag_coll(p->seq, step);
    loom_p2p_req_t *reqs = NULL;
    LOOM_CHECK(loom_hier_calloc(2 * (size_t)L, sizeof(*reqs), &reqs));
    loomResult_t res = loomSuccess;
    int nreq = 0;
    for (int k = 1; k < L; k++) {
        int q = (me - k + L) % L;
        if (spans[q].len > 0)
            LOOM_CHECK_GOTO(loom_coll_irecv(p, q, buf + spans[q].off * es, spans[q].len * es, tag,
                                            &reqs[nreq++]),
                            res, out);
    }
    for (int k = 1; k < L && spans[me].len > 0; k++)
        LOOM_CHECK_GOTO(loom_coll_isend(p, (me + k) % L, buf + spans[me].off * es,
                                        spans[me].len * es, tag, &reqs[nreq++]),
                        res, out);
    res = loom_p2p_wait_all(p->p2p, reqs, nreq);
out:
    free(reqs);
    return res;
}

loomResult_t loom_allreduce_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    if (!loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    const size_t es = loom_dtype_size(a->dt), accsz = loom_acc_size(a->dt);
    const size_t L = (size_t)h.L;
    size_t round = LOOM_HIER_ROUND_BYTES / es;
    if (round < L)
        round = L;
    uint8_t *acc = NULL;
    loom_span_t *spans = NULL;
    const size_t first = a->count < round ? a->count : round; /* no more than the call needs */
    LOOM_CHECK(loom_hier_buf(ctx, (first / L + 1) * accsz, &acc));
    LOOM_CHECK(loom_hier_calloc(L, sizeof(*spans), &spans));
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    loomResult_t res = loomSuccess;
    for (size_t base = 0; base < a->count; base += round) {
        const size_t rn = a->count - base < round ? a->count - base : round;
        for (int o = 0; o < h.L; o++)
            loom_split(rn, h.L, o, &spans[o].off, &spans[o].len);
        loom_coll_args_t part = *a;
        part.sendbuff = send + base * es;
        part.count = rn;
        LOOM_CHECK_GOTO(local_partial(&h, &part, spans, acc), res, out);
        const size_t mine = spans[h.l].len;
        loom_coll_args_t across = across_reduce(LOOM_COLL_ALLREDUCE, a, acc, acc, mine);
        LOOM_CHECK_GOTO(run_flat(&h, &h.rail, &across), res, out);
        loom_reduce_finish(a->dt, a->op, recv + (base + spans[h.l].off) * es, acc, mine,
                           ctx->nranks);
        LOOM_CHECK_GOTO(
            loom_hier_local_allgather(&h, recv + base * es, spans, es, STEP_LOCAL_GATHER), res,
            out);
    }
out:
    free(spans);
    return res;
}

loomResult_t loom_reduce_scatter_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    if (!loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    const loom_hosts_t *k = &ctx->hosts;
    const size_t es = loom_dtype_size(a->dt), accsz = loom_acc_size(a->dt);
    const size_t n = (size_t)ctx->nranks, H = (size_t)h.H;
    size_t round = LOOM_HIER_ROUND_BYTES / (es * n);
    if (round < 1)
        round = 1;
    /* The buffer: the packed blocks of a round (n x round), this rank's partial
     * of its H blocks and the rail's result, both in the accumulator type. */
    if (round > a->count)
        round = a->count ? a->count : 1;
    const size_t pack_bytes = (n * round * es + 63) / 64 * 64;
    const size_t part_bytes = (H * round * accsz + 63) / 64 * 64;
    uint8_t *buf = NULL;
    loom_span_t *spans = NULL;
    LOOM_CHECK(loom_hier_buf(ctx, pack_bytes + part_bytes + round * accsz, &buf));
    LOOM_CHECK(loom_hier_calloc((size_t)h.L, sizeof(*spans), &spans));
    uint8_t *pack = buf, *acc = buf + pack_bytes, *mine = acc + part_bytes;
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    loomResult_t res = loomSuccess;
    for (size_t c0 = 0; c0 < a->count; c0 += round) {
        const size_t rc = a->count - c0 < round ? a->count - c0 : round;
        /* Block of rank (h, l) goes to position l * H + h, so each local
         * index's blocks are one span, in host order. */
        for (int l = 0; l < h.L; l++) {
            for (int hh = 0; hh < h.H; hh++) {
                int r = k->rank_of[hh * h.L + l];
                memcpy(pack + ((size_t)l * H + (size_t)hh) * rc * es,
                       send + ((size_t)r * a->count + c0) * es, rc * es);
            }
            spans[l].off = (size_t)l * H * rc;
            spans[l].len = H * rc;
        }
        loom_coll_args_t part = *a;
        part.sendbuff = pack;
        part.count = n * rc;
        LOOM_CHECK_GOTO(local_partial(&h, &part, spans, acc), res, out);
        loom_coll_args_t across = across_reduce(LOOM_COLL_REDUCE_SCATTER, a, acc, mine, rc);
        LOOM_CHECK_GOTO(run_flat(&h, &h.rail, &across), res, out);
        loom_reduce_finish(a->dt, a->op, recv + c0 * es, mine, rc, ctx->nranks);
    }
out:
    free(spans);
    return res;
}

loomResult_t loom_allgather_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    if (!loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    const loom_hosts_t *k = &ctx->hosts;
    const size_t es = loom_dtype_size(a->dt), H = (size_t)h.H, c = a->count;
    size_t round = LOOM_HIER_ROUND_BYTES / (es * H);
    if (round < 1)
        round = 1;
    uint8_t *got = NULL; /* the rail's blocks of a round, in host order */
    loom_p2p_req_t *reqs = NULL;
    if (round > c)
        round = c ? c : 1;
    LOOM_CHECK(loom_hier_buf(ctx, H * round * es, &got));
    LOOM_CHECK(loom_hier_calloc(2 * (size_t)(h.L - 1) * H, sizeof(*reqs), &reqs));
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_LOCAL_GATHER);
    loomResult_t res = loomSuccess;
    for (size_t c0 = 0; c0 < c; c0 += round) {
        const size_t rc = c - c0 < round ? c - c0 : round;
        loom_coll_args_t across = {.kind = LOOM_COLL_ALLGATHER,
                                   .sendbuff = send + c0 * es,
                                   .recvbuff = got,
                                   .count = rc,
                                   .dt = a->dt};
        LOOM_CHECK_GOTO(run_flat(&h, &h.rail, &across), res, out);
        for (int hh = 0; hh < h.H; hh++) {
            uint8_t *dst = recv + ((size_t)k->rank_of[hh * h.L + h.l] * c + c0) * es;
            if (dst != got + (size_t)hh * rc * es)
                memmove(dst, got + (size_t)hh * rc * es, rc * es);
        }
        /* Inside the host: the H blocks of local index q land at their ranks'
         * places; ours go to every other local rank, one message a block. */
        int nreq = 0;
        for (int s = 1; s < h.L; s++) {
            int q = (h.l - s + h.L) % h.L;
            for (int hh = 0; hh < h.H; hh++)
                LOOM_CHECK_GOTO(
                    loom_coll_irecv(&h.local, q,
                                    recv + ((size_t)k->rank_of[hh * h.L + q] * c + c0) * es,
                                    rc * es, tag, &reqs[nreq++]),
                    res, out);
        }
        for (int s = 1; s < h.L; s++)
            for (int hh = 0; hh < h.H; hh++)
                LOOM_CHECK_GOTO(loom_coll_isend(&h.local, (h.l + s) % h.L,
                                                got + (size_t)hh * rc * es, rc * es, tag,
                                                &reqs[nreq++]),
                                res, out);
        LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    }
out:
    free(reqs);
    return res;
}

loomResult_t loom_bcast_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    if (!loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    const loom_hosts_t *k = &ctx->hosts;
    const size_t es = loom_dtype_size(a->dt), L = (size_t)h.L;
    const int root_host = k->host_of[a->root];
    int rl = 0; /* the root's local index */
    while (k->rank_of[root_host * h.L + rl] != a->root)
        rl++;
    size_t round = LOOM_HIER_ROUND_BYTES / es;
    if (round < L)
        round = L;
    loom_span_t *spans = NULL;
    loom_p2p_req_t *reqs = NULL;
    LOOM_CHECK(loom_hier_calloc(L, sizeof(*spans), &spans));
    loomResult_t res = loom_hier_calloc(L, sizeof(*reqs), &reqs);
    if (res != loomSuccess) {
        free(spans);
        return res;
    }
    uint8_t *recv = a->recvbuff;
    if (ctx->rank == a->root && a->sendbuff != a->recvbuff)
        memcpy(recv, a->sendbuff, a->count * es);
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_LOCAL_SCATTER);
    for (size_t base = 0; base < a->count; base += round) {
        const size_t rn = a->count - base < round ? a->count - base : round;
        for (int o = 0; o < h.L; o++)
            loom_split(rn, h.L, o, &spans[o].off, &spans[o].len);
        uint8_t *vec = recv + base * es;
        if (h.host == root_host) { /* the root hands each local rank its slice */
            int nreq = 0;
            if (h.l == rl) {
                for (int q = 0; q < h.L; q++)
                    if (q != rl && spans[q].len > 0)
                        LOOM_CHECK_GOTO(loom_coll_isend(&h.local, q, vec + spans[q].off * es,
                                                        spans[q].len * es, tag, &reqs[nreq++]),
                                        res, out);
            } else if (spans[h.l].len > 0) {
                LOOM_CHECK_GOTO(loom_coll_irecv(&h.local, rl, vec + spans[h.l].off * es,
                                                spans[h.l].len * es, tag, &reqs[nreq++]),
                                res, out);
            }
            LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
        }
        loom_coll_args_t across = {.kind = LOOM_COLL_BCAST,
                                   .sendbuff = vec + spans[h.l].off * es,
                                   .recvbuff = vec + spans[h.l].off * es,
                                   .count = spans[h.l].len,
                                   .dt = a->dt,
                                   .root = root_host};
        LOOM_CHECK_GOTO(run_flat(&h, &h.rail, &across), res, out);
        LOOM_CHECK_GOTO(loom_hier_local_allgather(&h, vec, spans, es, STEP_LOCAL_GATHER), res, out);
    }
out:
    free(spans);
    free(reqs);
    return res;
}

/* AllToAll in two exchanges, for small blocks: rank (h, l) first hands each
 * rank (h, q) of its host the H blocks bound for local index q on every host;
 * then each rail sends every other host, in one message, the P blocks bound
 * for its rank there. Each rank sends P - 1 + H - 1 messages instead of
 * n - 1, at the price of moving every byte twice. Buffers of 4 S are why the
 * model only offers it up to LOOM_HIER_ROUND_BYTES (larger calls run the
 * flat choice). */
loomResult_t loom_alltoall_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_hier_t h;
    const size_t es = loom_dtype_size(a->dt), blk = a->count * es;
    const size_t total = blk * (size_t)ctx->nranks;
    if (total > LOOM_HIER_ROUND_BYTES || !loom_hier_begin(&h, ctx))
        return loom_hier_flat(ctx, a);
    const loom_hosts_t *k = &ctx->hosts;
    const size_t H = (size_t)h.H, P = (size_t)h.L, grp = H * blk; /* one local peer's share */
    uint8_t *buf = NULL;
    loom_p2p_req_t *reqs = NULL;
    LOOM_CHECK(loom_hier_buf(ctx, 4 * total + 1, &buf));
    LOOM_CHECK(loom_hier_calloc(2 * (P + H), sizeof(*reqs), &reqs));
    /* togo[q]: blocks for local index q, by host; in[q]: those local rank q sent
     * here; fwd[g]: the P blocks for host g's rank, by source local index;
     * got[g]: those host g's rank sent here. */
    uint8_t *togo = buf, *in = buf + total, *fwd = in + total, *got = fwd + total;
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    const uint32_t tag_local = loom_tag_coll(ctx->seq, STEP_LOCAL_SCATTER),
                   tag_rail = loom_tag_coll(ctx->seq, STEP_RAIL_ALLTOALL);
    for (size_t q = 0; q < P; q++)
        for (size_t g = 0; g < H; g++)
            memcpy(togo + q * grp + g * blk, send + (size_t)k->rank_of[g * P + q] * blk, blk);
    loomResult_t res = loomSuccess;
    int nreq = 0;
    for (int s = 1; s < h.L; s++) {
        int q = (h.l - s + h.L) % h.L;
        LOOM_CHECK_GOTO(
            loom_coll_irecv(&h.local, q, in + (size_t)q * grp, grp, tag_local, &reqs[nreq++]), res,
            out);
    }
    for (int s = 1; s < h.L; s++) {
        int q = (h.l + s) % h.L;
        LOOM_CHECK_GOTO(
            loom_coll_isend(&h.local, q, togo + (size_t)q * grp, grp, tag_local, &reqs[nreq++]),
            res, out);
    }
    memcpy(in + (size_t)h.l * grp, togo + (size_t)h.l * grp, grp);
    LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    for (size_t g = 0; g < H; g++)
        for (size_t q = 0; q < P; q++)
            memcpy(fwd + (g * P + q) * blk, in + q * grp + g * blk, blk);
    nreq = 0;
    for (int s = 1; s < h.H; s++) {
        int g = (h.host - s + h.H) % h.H;
        LOOM_CHECK_GOTO(loom_coll_irecv(&h.rail, g, got + (size_t)g * P * blk, P * blk, tag_rail,
                                        &reqs[nreq++]),
                        res, out);
    }
    for (int s = 1; s < h.H; s++) {
        int g = (h.host + s) % h.H;
        LOOM_CHECK_GOTO(loom_coll_isend(&h.rail, g, fwd + (size_t)g * P * blk, P * blk, tag_rail,
                                        &reqs[nreq++]),
                        res, out);
    }
    memcpy(got + (size_t)h.host * P * blk, fwd + (size_t)h.host * P * blk, P * blk);
    LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    for (size_t g = 0; g < H; g++)
        for (size_t q = 0; q < P; q++)
            memcpy(recv + (size_t)k->rank_of[g * P + q] * blk, got + (g * P + q) * blk, blk);
out:
    free(reqs);
    return res;
}

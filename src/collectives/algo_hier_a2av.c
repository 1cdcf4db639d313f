/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_hier_a2av.c - hierarchical AllToAllv for communicators that span H > 1
 * hosts with P > 1 ranks on each (algo_hier.h). Small blocks between hosts
 * are aggregated: P - 1 + H - 1 messages per rank carry them instead of one
 * per rank of the other hosts. Large blocks, and every block inside a host,
 * go straight to their rank as in pairwise (alltoall.c). It does not split
 * calls in rounds: the small blocks bound its buffer (below). The counts
 * differ per rank, so no cost can see them: the model chooses it by the
 * layout's messages and steps alone (cost_hier.c), where the messages saved
 * between hosts outweigh its second step; without a hierarchy it runs the
 * flat choice.
 *
 * Which blocks are small must be known at both ends without a message: a
 * block of b bytes (sendcounts * size on the sender, recvcounts * size on the
 * receiver, equal by MPI's rules) is small when b <= T, with T from the
 * agreed link constants and the layout only. An aggregated block travels
 * once more, inside the host (beta of the intra-host link), and is copied
 * three times (gamma: packed, regrouped for the rail, unpacked); it saves a
 * message between hosts, o at each end. So T = 2 o / (beta + 3 gamma) of
 * those links (21 KB on the built-in constants), at most 64 KiB and at most
 * what keeps the buffer, about 4 n (T + 8) bytes, within
 * LOOM_HIER_ROUND_BYTES. Equal constants on every rank give the same T.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_hier.h"
#include "check.h"
#include "dtype.h"

/* A small block that this rank forwards: its bytes and where they are. */
typedef struct {
    size_t len;
    const uint8_t *at;
} block_t;

/* One call: the layout, T, and what the two phases pass on. */
typedef struct {
    loom_hier_t h;
    const loom_coll_args_t *a;
    const int *rank_of; /* the rank of local index p on host g at g * P + p */
    size_t es, T, H, P;
    size_t slot;                   /* the most bytes a phase-1 message can have */
    uint8_t *out, *in, *fwd, *got; /* parts of the kept buffer (loom_hier_buf) */
    block_t *blocks; /* [P * H]: the small block from local index p for host g at p * H + g */
    loom_p2p_req_t *direct, *reqs; /* the direct blocks (receives first); a phase's messages */
    int ndirect, nrecv_direct;
    loomResult_t bad; /* the first wrong count found; the call still runs to its end */
} a2av_t;

/* Bytes of a block of count elements between this rank and rank r that travel
 * aggregated: all of them if r is on another host and they are at most T, else 0. */
static size_t small(const a2av_t *c, int r, size_t count)
{
    const size_t b = count * c->es;
    return c->h.ctx->hosts.host_of[r] != c->h.host && b <= c->T ? b : 0;
}
static int goes_direct(const a2av_t *c, int r, size_t count)
{
    return c->h.ctx->hosts.host_of[r] == c->h.host || count * c->es > c->T;
}

/* Posts the blocks that go straight to their rank, in pairwise's order. */
static loomResult_t post_direct(a2av_t *c)
{
    loom_coll_ctx_t *ctx = c->h.ctx;
    const loom_coll_args_t *a = c->a;
    const int n = ctx->nranks, me = ctx->rank;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_A2AV_DIRECT);
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    for (int d = 1; d < n; d++) {
        const int p = (me - d + n) % n;
        const size_t rc = a->recvcounts[p];
        if (goes_direct(c, p, rc)) /* a NULL buffer is legal for 0 elements: never offset it */
            LOOM_CHECK(loom_coll_irecv(ctx, p, rc ? recv + a->rdispls[p] * c->es : NULL, rc * c->es,
                                       tag, &c->direct[c->ndirect++]));
    }
    c->nrecv_direct = c->ndirect;
    for (int d = 1; d < n; d++) {
        const int p = (me + d) % n;
        const size_t sc = a->sendcounts[p];
        if (goes_direct(c, p, sc))
            LOOM_CHECK(loom_coll_isend(ctx, p, sc ? send + a->sdispls[p] * c->es : NULL, sc * c->es,
                                       tag, &c->direct[c->ndirect++]));
    }
    return loomSuccess;
}

/* The phase-1 message for local index q: H sizes (uint64, 0 for this host),
 * then the small blocks for the ranks of local index q on the other hosts, in
 * host order. Returns its bytes. */
static size_t pack_local(const a2av_t *c, int q, uint8_t *msg)
{
    const loom_coll_args_t *a = c->a;
    const uint8_t *send = a->sendbuff;
    size_t pos = c->H * 8;
    for (size_t g = 0; g < c->H; g++) {
        const int r = c->rank_of[g * c->P + (size_t)q];
        const uint64_t b = small(c, r, a->sendcounts[r]);
        memcpy(msg + g * 8, &b, 8);
        if (b > 0)
            memcpy(msg + pos, send + a->sdispls[r] * c->es, b);
        pos += b;
    }
    return pos;
}

/* The blocks of the phase-1 message from local index p (nbytes long). One
 * whose header does not add up is reported and counts as empty, so the call
 * still completes on every rank (the blocks' receivers then find them missing). */
static void parse_local(a2av_t *c, int p, const uint8_t *msg, size_t nbytes)
{
    const size_t H = c->H;
    block_t *blk = c->blocks + (size_t)p * H;
    size_t pos = H * 8;
    int ok = nbytes >= pos;
    for (size_t g = 0; ok && g < H; g++) {
        uint64_t b;
        memcpy(&b, msg + g * 8, 8);
        ok = (int)g == c->h.host ? b == 0 : b <= c->T;
        blk[g].len = (size_t)b;
        pos += (size_t)b; /* at most H * (8 + T): no overflow */
    }
    if (ok && pos == nbytes) {
        pos = H * 8;
        for (size_t g = 0; g < H; pos += blk[g].len, g++)
            blk[g].at = msg + pos;
        return;
    }
    LOOM_WARN("rank %d: rank %d sent %zu bytes of small blocks that do not match their header "
              "(small-block limit %zu bytes)",
              c->h.ctx->rank, c->rank_of[(size_t)c->h.host * c->P + (size_t)p], nbytes, c->T);
    memset(blk, 0, H * sizeof(*blk));
    if (c->bad == loomSuccess)
        c->bad = loomInvalidUsage;
}

/* Phase 1: inside the host, each local index gets the small blocks bound for
 * its rail peers on the other hosts; this rank's own stay in sendbuff. */
static loomResult_t local_phase(a2av_t *c)
{
    loom_coll_ctx_t *ctx = c->h.ctx;
    const loom_coll_args_t *a = c->a;
    const int P = c->h.L, l = c->h.l;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_A2AV_LOCAL);
    int nreq = 0;
    for (int k = 1; k < P; k++) /* slot k - 1: from local index l - k */
        LOOM_CHECK(loom_coll_irecv(&c->h.local, (l - k + P) % P, c->in + (size_t)(k - 1) * c->slot,
                                   c->slot, tag, &c->reqs[nreq++]));
    uint8_t *msg = c->out;
    for (int k = 1; k < P; k++) {
        const size_t nbytes = pack_local(c, (l + k) % P, msg);
        LOOM_CHECK(loom_coll_isend(&c->h.local, (l + k) % P, msg, nbytes, tag, &c->reqs[nreq++]));
        msg += nbytes;
    }
    LOOM_CHECK(loom_p2p_wait_for(ctx->p2p, c->reqs, nreq, c->direct, c->ndirect));
    for (int k = 1; k < P; k++)
        parse_local(c, (l - k + P) % P, c->in + (size_t)(k - 1) * c->slot,
                    c->reqs[k - 1].done_bytes);
    for (size_t g = 0; g < c->H; g++) {
        const int r = c->rank_of[g * c->P + (size_t)l];
        block_t *blk = &c->blocks[(size_t)l * c->H + g];
        blk->len = small(c, r, a->sendcounts[r]);
        blk->at = blk->len ? (const uint8_t *)a->sendbuff + a->sdispls[r] * c->es : NULL;
    }
    return loomSuccess;
}

/* Bytes of small blocks this rank expects from host g, by recvcounts. */
static size_t expected_from(const a2av_t *c, size_t g)
{
    size_t sum = 0;
    for (size_t p = 0; p < c->P; p++) {
        const int r = c->rank_of[g * c->P + p];
        sum += small(c, r, c->a->recvcounts[r]);
    }
    return sum;
}

/* The blocks of host g's message (in its local order) to their places. */
static void unpack_rail(const a2av_t *c, size_t g, const uint8_t *msg)
{
    const loom_coll_args_t *a = c->a;
    uint8_t *recv = a->recvbuff;
    for (size_t p = 0; p < c->P; p++) {
        const int r = c->rank_of[g * c->P + p];
        const size_t b = small(c, r, a->recvcounts[r]);
        if (b > 0)
            memcpy(recv + a->rdispls[r] * c->es, msg, b);
        msg += b;
    }
}

/* Phase 2: on the rail, one message per other host with the small blocks of
 * this host's ranks (in local order) for the rail peer there. */
static loomResult_t rail_phase(a2av_t *c)
{
    loom_coll_ctx_t *ctx = c->h.ctx;
    const int H = c->h.H, me = c->h.host;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_A2AV_RAIL);
    int nreq = 0;
    uint8_t *at = c->got;
    for (int k = 1; k < H; k++) {
        const size_t want = expected_from(c, (size_t)((me - k + H) % H));
        LOOM_CHECK(loom_coll_irecv(&c->h.rail, (me - k + H) % H, at, want, tag, &c->reqs[nreq++]));
        at += want;
    }
    at = c->fwd;
    for (int k = 1; k < H; k++) {
        const int g = (me + k) % H;
        uint8_t *msg = at;
        for (size_t p = 0; p < c->P; p++) {
            const block_t *blk = &c->blocks[p * c->H + (size_t)g];
            if (blk->len > 0)
                memcpy(at, blk->at, blk->len);
            at += blk->len;
        }
        LOOM_CHECK(loom_coll_isend(&c->h.rail, g, msg, (size_t)(at - msg), tag, &c->reqs[nreq++]));
    }
    LOOM_CHECK(loom_p2p_wait_for(ctx->p2p, c->reqs, nreq, c->direct, c->ndirect));
    at = c->got;
    for (int k = 1; k < H; k++) {
        const loom_p2p_req_t *r = &c->reqs[k - 1];
        if (r->done_bytes == r->nbytes) {
            unpack_rail(c, (size_t)((me - k + H) % H), at);
        } else {
            LOOM_WARN("rank %d: the small blocks from the ranks of host %d (forwarded by rank %d) "
                      "are %zu bytes but recvcounts says %zu bytes",
                      ctx->rank, (me - k + H) % H, r->peer, r->done_bytes, r->nbytes);
            if (c->bad == loomSuccess)
                c->bad = loomInvalidUsage;
        }
        at += r->nbytes;
    }
    return loomSuccess;
}

/* The buffer: phase-1 messages out (as packed) and in (P - 1 slots of the
 * most a message can have), the rail messages out (at most the small blocks
 * received plus this rank's own) and in (as recvcounts says). */
static loomResult_t carve(a2av_t *c)
{
    const loom_coll_args_t *a = c->a;
    size_t out = (c->P - 1) * c->H * 8, own = 0, want = 0;
    for (size_t q = 0; q < c->P; q++)
        for (size_t g = 0; g < c->H; g++) {
            const int r = c->rank_of[g * c->P + q];
            const size_t b = small(c, r, a->sendcounts[r]);
            *((int)q == c->h.l ? &own : &out) += b;
        }
    for (size_t g = 0; g < c->H; g++)
        if ((int)g != c->h.host)
            want += expected_from(c, g);
    const size_t in = (c->P - 1) * c->slot, fwd = (c->P - 1) * (c->H - 1) * c->T + own;
    uint8_t *buf = NULL;
    LOOM_CHECK(loom_hier_buf(c->h.ctx, out + in + fwd + want + 1, &buf));
    c->out = buf;
    c->in = c->out + out;
    c->fwd = c->in + in;
    c->got = c->fwd + fwd;
    return loomSuccess;
}

/* The rank's block to itself, as pairwise does (a count that differs is the
 * caller's error, reported after the exchange so that no peer waits). */
static loomResult_t self_block(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a, size_t es)
{
    const int me = ctx->rank;
    const size_t sc = a->sendcounts[me], rc = a->recvcounts[me];
    if (rc != sc) {
        LOOM_WARN("rank %d: alltoallv sends %zu elements to itself but expects %zu", me, sc, rc);
        return loomInvalidArgument;
    }
    if (sc > 0)
        memcpy((uint8_t *)a->recvbuff + a->rdispls[me] * es,
               (const uint8_t *)a->sendbuff + a->sdispls[me] * es, sc * es);
    return loomSuccess;
}

/* Direct blocks: every receive got what recvcounts says. */
static void check_direct(a2av_t *c)
{
    for (int i = 0; i < c->nrecv_direct; i++) {
        const loom_p2p_req_t *r = &c->direct[i];
        if (r->done_bytes != r->nbytes) {
            LOOM_WARN("rank %d: rank %d sent %zu bytes but recvcounts says %zu bytes",
                      c->h.ctx->rank, r->peer, r->done_bytes, r->nbytes);
            if (c->bad == loomSuccess)
                c->bad = loomInvalidUsage;
        }
    }
}

loomResult_t loom_alltoallv_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    a2av_t c = {.a = a};
    if (!loom_hier_begin(&c.h, ctx))
        return loom_hier_flat(ctx, a);
    const size_t n = (size_t)ctx->nranks;
    c.rank_of = ctx->hosts.rank_of;
    c.es = loom_dtype_size(a->dt);
    c.H = (size_t)c.h.H;
    c.P = (size_t)c.h.L;
    c.T = loom_a2av_small_bytes(&ctx->link, &ctx->intra, c.H, c.P);
    c.slot = c.H * 8 + (c.H - 1) * c.T;
    LOOM_CHECK(carve(&c));
    LOOM_CHECK(loom_hier_calloc(c.P * c.H, sizeof(*c.blocks), &c.blocks));
    loomResult_t res = loom_hier_calloc(4 * n, sizeof(*c.direct), &c.direct);
    if (res != loomSuccess) {
        free(c.blocks);
        return res;
    }
    c.reqs = c.direct + 2 * n; /* direct: at most 2 (n - 1); a phase: 2 (max(P, H) - 1) */
    c.bad = self_block(ctx, a, c.es);
    LOOM_CHECK_GOTO(post_direct(&c), res, out);
    LOOM_CHECK_GOTO(local_phase(&c), res, out);
    LOOM_CHECK_GOTO(rail_phase(&c), res, out);
    LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, c.direct, c.ndirect), res, out);
    check_direct(&c);
    res = c.bad;
out:
    free(c.blocks);
    free(c.direct);
    return res;
}

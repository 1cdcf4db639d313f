/* SPDX-License-Identifier: Apache-2.0
 *
 * echo_run.c - one Echo all-reduce over the point-to-point layer, pipelined
 * by segments of each owner chunk. Four kinds of message, each with its own
 * tag, matched in posting order per connection:
 *   A  (per-host variant) the input of another local rank's slice, raw;
 *   B  a chunk for its owner, quantized once (Q1) by the sender;
 *   C  an owner's sum, quantized once (Q2), to the same local index on every
 *      other host (every rank, when flat);
 *   D  (per-host variant) Q2 bytes forwarded unchanged to the host's ranks.
 * Every receive is posted first and every send is non-blocking, so that the
 * stages below only wait for messages the previous stage of every rank has
 * already sent: A (posted at once) -> stage 1 sends B -> stage 2 waits for
 * B, sends C -> stage 3 waits for C, sends D -> stage 4 waits for D. Stage 1
 * quantizes segment k+1 while segment k is on the wire; stage 2 sums
 * segment k while later segments arrive. Each wait also drives every pending
 * send, since a send moves only when tested.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "echo.h"
#include "kernels.h"
#include "param.h"
#include "q4.h"

enum { PH_A, PH_B, PH_C, PH_D };

typedef struct {
    loom_p2p_t *p2p;
    const loom_echo_layout_t *lay;
    const loom_echo_args_t *a;
    uint64_t seq;
    int H, L, h, l;
    size_t es, chunk, seg, qbc, qbs;
    int nseg;
    uint8_t *qsend, *qrecv, *q2, *raw; /* encoded per host / per chunk; raw slices */
    float *own_acc, *slice_acc, *oacc, *wtmp;
    loom_p2p_req_t *rA, *rB, *rC, *rD; /* receive slots [nseg][per] */
    int perA, perB;                    /* L*H and H */
    loom_p2p_req_t *sends;
    int nsends, sdone; /* posted, and the first not known to be done */
    uint64_t q1, q2n, exact;
} run_t;

static int chunk_of(const run_t *r, int l, int h)
{
    return l * r->H + h;
}
static size_t seg_len(const run_t *r, int c, int k)
{
    size_t start = (size_t)c * r->chunk + (size_t)k * r->seg;
    size_t end = (size_t)c * r->chunk + r->chunk;
    if (end > r->a->count)
        end = r->a->count;
    if (start >= end)
        return 0;
    return end - start < r->seg ? end - start : r->seg;
}
static size_t goff(const run_t *r, int c, int k)
{
    return (size_t)c * r->chunk + (size_t)k * r->seg;
}
static uint8_t *q2_at(const run_t *r, int c, int k)
{
    return r->q2 + (size_t)c * r->qbc + (size_t)k * r->qbs;
}
static const uint8_t *in_at(const run_t *r, size_t elem)
{
    return (const uint8_t *)r->a->sendbuff + elem * r->es;
}
static uint8_t *out_at(const run_t *r, size_t elem)
{
    return (uint8_t *)r->a->recvbuff + elem * r->es;
}
static int rank_at(const run_t *r, int h, int l)
{
    return r->lay->rank_of[h * r->L + l];
}

static loomResult_t post_send(run_t *r, int peer, const void *buf, size_t bytes, int phase)
{
    return loom_p2p_isend(r->p2p, peer, buf, bytes, loom_tag_coll(r->seq, (unsigned)phase),
                          &r->sends[r->nsends++]);
}

/* Posts a receive into slot, or marks the slot done when nothing comes. */
static loomResult_t post_recv(run_t *r, loom_p2p_req_t *slot, int peer, void *buf, size_t bytes,
                              int phase)
{
    if (bytes == 0) {
        memset(slot, 0, sizeof(*slot));
        slot->done = 1;
        return loomSuccess;
    }
    return loom_p2p_irecv(r->p2p, peer, buf, bytes, loom_tag_coll(r->seq, (unsigned)phase), slot);
}

static void skip_done_sends(run_t *r)
{
    while (r->sdone < r->nsends && r->sends[r->sdone].done)
        r->sdone++;
}

/* Waits for n receive slots while driving every pending send. */
static loomResult_t wait_slots(run_t *r, loom_p2p_req_t *slots, int n)
{
    skip_done_sends(r);
    return loom_p2p_wait_for(r->p2p, slots, n, r->sends + r->sdone, r->nsends - r->sdone);
}

/* Moves pending sends along without waiting. */
static loomResult_t poke(run_t *r)
{
    skip_done_sends(r);
    int all = 0;
    if (r->sdone == r->nsends)
        return loomSuccess;
    return loom_p2p_test_all(r->p2p, r->sends + r->sdone, r->nsends - r->sdone, &all);
}

static loomResult_t post_receives(run_t *r)
{
    for (int k = 0; k < r->nseg; k++) {
        for (int lp = 0; lp < r->L && r->L > 1; lp++) {
            for (int hh = 0; hh < r->H; hh++) {
                const int c = chunk_of(r, r->l, hh);
                loom_p2p_req_t *sa = &r->rA[k * r->perA + lp * r->H + hh];
                loom_p2p_req_t *sd = &r->rD[k * r->perA + lp * r->H + hh];
                if (lp == r->l) {
                    LOOM_CHECK(post_recv(r, sa, 0, NULL, 0, PH_A));
                    LOOM_CHECK(post_recv(r, sd, 0, NULL, 0, PH_D));
                    continue;
                }
                const int from = rank_at(r, r->h, lp);
                uint8_t *raw = r->raw + ((size_t)(lp * r->H + hh) * r->chunk + k * r->seg) * r->es;
                LOOM_CHECK(post_recv(r, sa, from, raw, seg_len(r, c, k) * r->es, PH_A));
                const int cd = chunk_of(r, lp, hh);
                LOOM_CHECK(post_recv(r, sd, from, q2_at(r, cd, k), loom_q4_bytes(seg_len(r, cd, k)),
                                     PH_D));
            }
        }
        const size_t own_n = seg_len(r, chunk_of(r, r->l, r->h), k);
        for (int hh = 0; hh < r->H; hh++) {
            loom_p2p_req_t *sb = &r->rB[k * r->perB + hh];
            loom_p2p_req_t *sc = &r->rC[k * r->perB + hh];
            const int c = chunk_of(r, r->l, hh);
            const int from = rank_at(r, hh, r->l);
            const int self = hh == r->h;
            LOOM_CHECK(post_recv(r, sb, from, r->qrecv + (size_t)hh * r->qbc + k * r->qbs,
                                 self ? 0 : loom_q4_bytes(own_n), PH_B));
            LOOM_CHECK(post_recv(r, sc, from, q2_at(r, c, k),
                                 self ? 0 : loom_q4_bytes(seg_len(r, c, k)), PH_C));
        }
    }
    return loomSuccess;
}

/* The raw input of the other local ranks' slices, all segments at once. */
static loomResult_t send_slices(run_t *r)
{
    for (int k = 0; k < r->nseg; k++)
        for (int lp = 0; lp < r->L; lp++) {
            if (lp == r->l)
                continue;
            for (int hh = 0; hh < r->H; hh++) {
                const int c = chunk_of(r, lp, hh);
                const size_t n = seg_len(r, c, k);
                if (n == 0)
                    continue;
                LOOM_CHECK(
                    post_send(r, rank_at(r, r->h, lp), in_at(r, goff(r, c, k)), n * r->es, PH_A));
                r->exact += n;
            }
        }
    return loomSuccess;
}

/* Stage 1, segment k: (per host) sum the slice in float32 in local rank
 * order; quantize every other host's chunk with the residual and send it. */
static loomResult_t stage_quantize(run_t *r, int k)
{
    const loomDataType_t dt = r->a->dt;
    if (r->L > 1) {
        LOOM_CHECK(wait_slots(r, &r->rA[k * r->perA], r->perA));
        for (int hh = 0; hh < r->H; hh++) {
            const int c = chunk_of(r, r->l, hh);
            const size_t n = seg_len(r, c, k);
            if (n == 0)
                continue;
            float *dst = hh == r->h ? r->own_acc + (size_t)k * r->seg : r->slice_acc + hh * r->seg;
            for (int lp = 0; lp < r->L; lp++) {
                const void *src =
                    lp == r->l
                        ? in_at(r, goff(r, c, k))
                        : r->raw + ((size_t)(lp * r->H + hh) * r->chunk + k * r->seg) * r->es;
                if (lp == 0)
                    loom_reduce_init(dt, dst, src, n);
                else
                    loom_reduce_acc(dt, loomSum, dst, src, n);
            }
        }
    }
    for (int hh = 0; hh < r->H; hh++) {
        const int c = chunk_of(r, r->l, hh);
        const size_t n = seg_len(r, c, k);
        if (hh == r->h || n == 0)
            continue;
        const void *src = r->L > 1 ? (const void *)(r->slice_acc + hh * r->seg)
                                   : (const void *)in_at(r, goff(r, c, k));
        float *e = r->a->state ? r->a->state->e1 + goff(r, c, k) : NULL;
        uint8_t *q = r->qsend + (size_t)hh * r->qbc + k * r->qbs;
        loom_q4_encode(src, r->L > 1 ? loomFloat32 : dt, e, e, n, q);
        r->q1 += n;
        LOOM_CHECK(post_send(r, rank_at(r, hh, r->l), q, loom_q4_bytes(n), PH_B));
    }
    return poke(r);
}

/* Stage 2, segment k of the own chunk: add the contributions in host order
 * in float32, add the owner residual, quantize once, send to every other
 * host, and keep exactly what the others will decode. */
static loomResult_t stage_own(run_t *r, int k)
{
    const loomDataType_t dt = r->a->dt;
    const int c = chunk_of(r, r->l, r->h);
    const size_t n = seg_len(r, c, k);
    LOOM_CHECK(wait_slots(r, &r->rB[k * r->perB], r->perB));
    if (n == 0)
        return loomSuccess;
    /* The first term initializes the sum (no zeroing pass); the others add in host order. */
    for (int hh = 0; hh < r->H; hh++) {
        const uint8_t *q = r->qrecv + (size_t)hh * r->qbc + k * r->qbs;
        const void *own = r->L > 1 ? (const void *)(r->own_acc + (size_t)k * r->seg)
                                   : (const void *)in_at(r, goff(r, c, k));
        const loomDataType_t own_dt = r->L > 1 ? loomFloat32 : dt;
        if (hh != r->h && hh == 0)
            loom_q4_decode(q, n, r->oacc, loomFloat32);
        else if (hh != r->h)
            loom_q4_decode_acc(q, n, r->oacc);
        else if (hh == 0)
            loom_reduce_init(own_dt, r->oacc, own, n);
        else
            loom_reduce_acc(own_dt, loomSum, r->oacc, own, n);
    }
    float *e2 = r->a->state ? r->a->state->e2 + (size_t)k * r->seg : NULL;
    if (e2)
        loom_reduce_acc(loomFloat32, loomSum, r->oacc, e2, n);
    uint8_t *q = q2_at(r, c, k);
    loom_q4_encode(r->oacc, loomFloat32, NULL, NULL, n, q);
    r->q2n += n;
    for (int hh = 0; hh < r->H; hh++)
        if (hh != r->h)
            LOOM_CHECK(post_send(r, rank_at(r, hh, r->l), q, loom_q4_bytes(n), PH_C));
    uint8_t *out = out_at(r, goff(r, c, k));
    loom_q4_decode(q, n, out, dt);
    if (e2) {
        /* The residual is measured against what every rank holds after rounding
         * to the datatype, so the feedback also repays that rounding. */
        loom_reduce_init(dt, r->wtmp, out, n);
        for (size_t i = 0; i < n; i++)
            e2[i] = r->oacc[i] - r->wtmp[i];
    }
    return poke(r);
}

/* Stage 3, segment k: the other hosts' sums of this slice arrive; forward
 * them (and the own one) unchanged to the host's other ranks; decode. */
static loomResult_t stage_slice(run_t *r, int k)
{
    LOOM_CHECK(wait_slots(r, &r->rC[k * r->perB], r->perB));
    for (int lp = 0; lp < r->L && r->L > 1; lp++) {
        if (lp == r->l)
            continue;
        for (int hh = 0; hh < r->H; hh++) {
            const int c = chunk_of(r, r->l, hh);
            const size_t n = seg_len(r, c, k);
            if (n > 0)
                LOOM_CHECK(
                    post_send(r, rank_at(r, r->h, lp), q2_at(r, c, k), loom_q4_bytes(n), PH_D));
        }
    }
    for (int hh = 0; hh < r->H; hh++) {
        const int c = chunk_of(r, r->l, hh);
        const size_t n = seg_len(r, c, k);
        if (hh != r->h && n > 0)
            loom_q4_decode(q2_at(r, c, k), n, out_at(r, goff(r, c, k)), r->a->dt);
    }
    return poke(r);
}

/* Stage 4, segment k: the other slices, forwarded by the host's ranks. */
static loomResult_t stage_forwarded(run_t *r, int k)
{
    LOOM_CHECK(wait_slots(r, &r->rD[k * r->perA], r->perA));
    for (int lp = 0; lp < r->L; lp++) {
        if (lp == r->l)
            continue;
        for (int hh = 0; hh < r->H; hh++) {
            const int c = chunk_of(r, lp, hh);
            const size_t n = seg_len(r, c, k);
            if (n > 0)
                loom_q4_decode(q2_at(r, c, k), n, out_at(r, goff(r, c, k)), r->a->dt);
        }
    }
    return loomSuccess;
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Carves the workspace and the request arrays out of ctx's buffers. */
static loomResult_t carve(loom_echo_ctx_t *ctx, run_t *r)
{
    const size_t P = (size_t)r->H * (size_t)r->L, H = (size_t)r->H, L = (size_t)r->L;
    const size_t nseg = (size_t)r->nseg;
    size_t sizes[8] = {
        H * r->qbc,                             /* qsend */
        H * r->qbc,                             /* qrecv */
        P * r->qbc,                             /* q2 */
        L > 1 ? P * r->chunk * r->es : 0,       /* raw */
        L > 1 ? r->chunk * sizeof(float) : 0,   /* own_acc */
        L > 1 ? H * r->seg * sizeof(float) : 0, /* slice_acc */
        r->seg * sizeof(float),                 /* oacc */
        r->seg * sizeof(float),                 /* wtmp */
    };
    size_t total = 0;
    for (int i = 0; i < 8; i++)
        total += align64(sizes[i]);
    if (total > ctx->ws_bytes) {
        free(ctx->ws);
        ctx->ws_bytes = 0;
        if ((ctx->ws = aligned_alloc(64, total)) == NULL) {
            LOOM_WARN("rank %d: out of memory for %zu bytes of Echo workspace", r->lay->rank,
                      total);
            return loomSystemError;
        }
        ctx->ws_bytes = total;
        LOOM_INFO(LOOM_LOG_ECHO,
                  "rank %d: Echo workspace grown to %zu bytes: chunks of %zu values in %d "
                  "segment(s) of %zu values",
                  r->lay->rank, total, r->chunk, r->nseg, r->seg);
    }
    uint8_t *p = ctx->ws;
    void *parts[8];
    for (int i = 0; i < 8; i++) {
        parts[i] = p;
        p += align64(sizes[i]);
    }
    r->qsend = parts[0], r->qrecv = parts[1], r->q2 = parts[2], r->raw = parts[3];
    r->own_acc = parts[4], r->slice_acc = parts[5], r->oacc = parts[6], r->wtmp = parts[7];

    const size_t slots = nseg * (2 * L * H + 2 * H);
    const size_t sends = nseg * (2 * (L - 1) * H + 2 * (H - 1));
    const size_t need = slots + sends;
    if (need > ctx->nreqs_cap) {
        free(ctx->reqs);
        ctx->nreqs_cap = 0;
        if ((ctx->reqs = malloc(need * sizeof(*ctx->reqs))) == NULL) {
            LOOM_WARN("rank %d: out of memory for %zu Echo requests", r->lay->rank, need);
            return loomSystemError;
        }
        ctx->nreqs_cap = need;
    }
    r->rA = ctx->reqs;
    r->rD = r->rA + nseg * L * H;
    r->rB = r->rD + nseg * L * H;
    r->rC = r->rB + nseg * H;
    r->sends = r->rC + nseg * H;
    return loomSuccess;
}

loomResult_t loom_echo_run(loom_echo_ctx_t *ctx, loom_p2p_t *p2p, uint64_t seq,
                           const loom_echo_args_t *a)
{
    const loom_echo_layout_t *lay = &ctx->lay;
    __atomic_add_fetch(&ctx->counters.calls, 1, __ATOMIC_RELAXED);
    if (lay->local > 1)
        __atomic_add_fetch(&ctx->counters.hierarchical, 1, __ATOMIC_RELAXED);
    if (a->count == 0)
        return loomSuccess;
    loom_p2p_set_context(p2p, "echo allreduce", seq);
    run_t r = {.p2p = p2p, .lay = lay, .a = a, .seq = seq};
    r.H = lay->hosts, r.L = lay->local, r.h = lay->host, r.l = lay->lrank;
    r.es = a->dt == loomFloat32 ? 4 : 2;
    r.chunk = loom_echo_chunk(a->count, lay->nranks);
    size_t seg = (size_t)loom_param_ECHO_SEGMENT() / LOOM_Q4_TILE * LOOM_Q4_TILE;
    if (seg < LOOM_Q4_TILE)
        seg = LOOM_Q4_TILE;
    r.seg = seg < r.chunk ? seg : r.chunk;
    r.nseg = (int)((r.chunk + r.seg - 1) / r.seg);
    r.qbc = loom_q4_bytes(r.chunk);
    r.qbs = loom_q4_bytes(r.seg);
    r.perA = r.L * r.H;
    r.perB = r.H;
    LOOM_CHECK(carve(ctx, &r));

    loomResult_t res = loomSuccess;
    uint64_t sent0 = loom_p2p_bytes_sent(p2p);
    LOOM_CHECK_GOTO(post_receives(&r), res, out);
    if (r.L > 1)
        LOOM_CHECK_GOTO(send_slices(&r), res, out);
    for (int k = 0; k < r.nseg; k++)
        LOOM_CHECK_GOTO(stage_quantize(&r, k), res, out);
    for (int k = 0; k < r.nseg; k++)
        LOOM_CHECK_GOTO(stage_own(&r, k), res, out);
    for (int k = 0; k < r.nseg; k++)
        LOOM_CHECK_GOTO(stage_slice(&r, k), res, out);
    for (int k = 0; k < r.nseg && r.L > 1; k++)
        LOOM_CHECK_GOTO(stage_forwarded(&r, k), res, out);
    skip_done_sends(&r);
    LOOM_CHECK_GOTO(loom_p2p_wait_all(p2p, r.sends + r.sdone, r.nsends - r.sdone), res, out);
out:
    __atomic_add_fetch(&ctx->counters.bytes_sent, loom_p2p_bytes_sent(p2p) - sent0,
                       __ATOMIC_RELAXED);
    __atomic_add_fetch(&ctx->counters.values_sent_q4, r.q1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ctx->counters.values_owner_q4, r.q2n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ctx->counters.values_exact, r.exact, __ATOMIC_RELAXED);
    return res;
}

loomResult_t loom_echo_ctx_create(const loom_peer_info_t *peers, int nranks, int rank,
                                  loom_echo_ctx_t **ctx_p)
{
    loom_echo_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        LOOM_WARN("out of memory for the Echo engine");
        return loomSystemError;
    }
    loomResult_t res =
        loom_echo_layout_init(&ctx->lay, peers, nranks, rank, (int)loom_param_ECHO_HIER());
    if (res != loomSuccess) {
        free(ctx);
        return res;
    }
    const loom_echo_layout_t *lay = &ctx->lay;
    LOOM_INFO(LOOM_LOG_ECHO, "rank %d: Echo layout %s: %d host(s) x %d rank(s), host %d local %d",
              rank, lay->local > 1 ? "hierarchical" : "flat", lay->hosts, lay->local, lay->host,
              lay->lrank);
    *ctx_p = ctx;
    return loomSuccess;
}

void loom_echo_ctx_free(loom_echo_ctx_t *ctx)
{
    if (ctx == NULL)
        return;
    loom_echo_layout_free(&ctx->lay);
    free(ctx->ws);
    free(ctx->reqs);
    free(ctx);
}

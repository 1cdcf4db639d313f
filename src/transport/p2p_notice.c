/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_notice.c - the notices of the failure protocol (p2p_impl.h): a
 * fixed-size message each rank sends every peer when its communicator breaks,
 * is aborted or is destroyed, saying why; their encoding, the bounds checks on
 * what arrives, polling for them without blocking, and sending them with a
 * bounded flush. It decides nothing about failures (p2p_wait.c does) and words no
 * message (p2p_report.c). Callers: p2p_setup.c, p2p_wait.c.
 */
#include <stdint.h>

#include "check.h"
#include "p2p_impl.h"
#include "timer.h"

/* Posts the receive of every peer's notice (see the failure protocol). */
loomResult_t loom_p2p_notice_recvs_post(loom_p2p_t *p)
{
    for (int r = 0; r < p->nranks; r++) {
        peer_conn_t *c = &p->conns[r];
        if (r == p->rank)
            continue;
        c->notice_state = NS_WAITING;
        LOOM_CHECK(p->tps[c->tp]->irecv(c->recv, c->notice_buf, NOTICE_BYTES, LOOM_TAG_NOTICE,
                                        &c->notice_req));
    }
    return loomSuccess;
}

static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void notice_encode(loom_p2p_t *p, int kind, const cause_t *c)
{
    const uint64_t seq = c && c->via >= 0 ? c->seq : p->seq;
    const uint64_t v = c ? c->value : 0, v2 = c ? c->value2 : 0;
    const uint32_t w[NOTICE_BYTES / 4] = {NOTICE_MAGIC,      (uint32_t)kind,
                                          (uint32_t)p->rank, (uint32_t)(c ? c->rank : p->rank),
                                          c ? c->code : 0u,  (uint32_t)(c ? c->rank2 : 0),
                                          (uint32_t)seq,     (uint32_t)(seq >> 32),
                                          (uint32_t)v,       (uint32_t)(v >> 32),
                                          (uint32_t)v2,      (uint32_t)(v2 >> 32)};
    for (int i = 0; i < NOTICE_BYTES / 4; i++)
        put32(p->notice_out + 4 * i, w[i]);
}

static uint64_t get64(const uint8_t *b)
{
    return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32;
}

/* Checks a received notice against fixed bounds before anything uses it. */
static void notice_decode(loom_p2p_t *p, int peer, size_t nbytes)
{
    peer_conn_t *c = &p->conns[peer];
    const uint8_t *b = c->notice_buf;
    cause_t n = {.kind = (int)get32(b + 4),
                 .via = (int32_t)get32(b + 8),
                 .rank = (int32_t)get32(b + 12),
                 .code = get32(b + 16),
                 .rank2 = (int32_t)get32(b + 20),
                 .seq = get64(b + 24),
                 .value = get64(b + 32),
                 .value2 = get64(b + 40)};
    /* A mismatch names a second rank and a non-empty set of fields. */
    const int mm_bad = n.kind == N_MISMATCH && (n.rank2 < 0 || n.rank2 >= p->nranks ||
                                                n.code == 0 || (n.code & ~(uint32_t)MM_ALL) != 0);
    if (nbytes != NOTICE_BYTES || get32(b) != NOTICE_MAGIC || n.kind <= N_NONE ||
        n.kind >= N_KINDS || n.via != peer || n.rank < 0 || n.rank >= p->nranks || mm_bad) {
        LOOM_WARN("rank %d: malformed notice from rank %d (%zu bytes, kind %d, from %d, cause %d, "
                  "second rank %d, fields 0x%x); treated as its failure",
                  p->rank, peer, nbytes, n.kind, n.via, n.rank, n.rank2, n.code);
        n = (cause_t){.kind = N_ERROR, .rank = peer, .via = peer, .code = loomRemoteError};
    }
    c->got = n;
    c->notice_state = NS_GOT;
}

/* Looks for peer's notice without blocking (progresses its receive stream). */
void loom_p2p_notice_poll(loom_p2p_t *p, int peer)
{
    peer_conn_t *c = &p->conns[peer];
    if (c->notice_req == NULL)
        return;
    int done = 0;
    size_t nb = 0;
    const loom_tp_t *tp = p->tps[c->tp];
    if (tp->test(c->notice_req, &done, &nb) != loomSuccess) {
        c->notice_req = NULL; /* the stream ended without a notice */
        c->notice_state = NS_ENDED;
        return;
    }
    if (done) {
        c->notice_req = NULL;
        notice_decode(p, peer, nb);
    }
}

/* Polls every peer's notice; returns a peer whose notice reports a failure or
 * whose stream ended without one (it died or could not say why), or -1. */
int loom_p2p_notices_poll_all(loom_p2p_t *p)
{
    for (int r = 0; r < p->nranks; r++) {
        if (r == p->rank)
            continue;
        loom_p2p_notice_poll(p, r);
        const peer_conn_t *c = &p->conns[r];
        if (p->found.set) /* found in what a peer sent, maybe by this very poll */
            return p->found.peer;
        if (c->notice_state == NS_ENDED || (c->notice_state == NS_GOT && c->got.kind != N_BYE))
            return r;
    }
    return -1;
}

/* Queues the notice on every open send connection except to `skip`, then
 * drives them for at most NOTICE_FLUSH_NS. A notice that cannot leave in that
 * time (a dead or stuck peer) is dropped: the close that follows still tells
 * the peer, only without the cause. Errors here are expected and ignored. */
void loom_p2p_notices_send(loom_p2p_t *p, int kind, const cause_t *cause, int skip)
{
    notice_encode(p, kind, cause);
    int pending = 0;
    for (int r = 0; r < p->nranks; r++) {
        peer_conn_t *c = &p->conns[r];
        p->flush[r] = NULL;
        if (r == p->rank || r == skip || c->send == NULL)
            continue;
        if (p->tps[c->tp]->isend(c->send, p->notice_out, NOTICE_BYTES, LOOM_TAG_NOTICE,
                                 &p->flush[r]) == loomSuccess &&
            p->flush[r] != NULL)
            pending++;
    }
    uint64_t deadline = loom_now_ns() + NOTICE_FLUSH_NS;
    while (pending > 0) {
        for (int r = 0; r < p->nranks; r++) {
            if (p->flush[r] == NULL)
                continue;
            int done = 0;
            size_t nb = 0;
            if (p->tps[p->conns[r].tp]->test(p->flush[r], &done, &nb) != loomSuccess || done) {
                p->flush[r] = NULL;
                pending--;
            }
        }
        if (pending == 0 || loom_now_ns() > deadline)
            break;
        for (int t = 0; t < p->ntp; t++)
            if (p->tps[t]->wait && p->ctx[t] != NULL)
                (void)p->tps[t]->wait(p->ctx[t], 1000);
    }
    if (pending > 0)
        LOOM_INFO(LOOM_LOG_P2P, "rank %d: %d notice(s) (%s) could not be sent within %llu ms",
                  p->rank, pending, loom_p2p_kind_name(kind), NOTICE_FLUSH_NS / 1000000ull);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p.c - posting on the point-to-point layer: tagged non-blocking sends
 * and receives handed to the peer's transport, messages to self matched
 * here in order per tag, and what the layer says about itself (rank,
 * transport per peer, bytes sent). Setup and teardown are p2p_setup.c's,
 * waits p2p_wait.c's, the failure protocol's notices p2p_notice.c's.
 * Callers: api/ (send/recv) and the collective algorithms.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "p2p_impl.h"

// ---- messages to self ---------------------------------------------------------

static loomResult_t self_grow(loom_p2p_t *p)
{
    if (p->nself_sends < p->self_cap && p->nself_recvs < p->self_cap)
        return loomSuccess;
    int cap = p->self_cap ? p->self_cap * 2 : 16;
    loom_p2p_req_t **s = realloc(p->self_sends, (size_t)cap * sizeof(*s));
    if (s)
        p->self_sends = s;
    const void **sb = realloc(p->self_bufs, (size_t)cap * sizeof(*sb));
    if (sb)
        p->self_bufs = sb;
    loom_p2p_req_t **r = realloc(p->self_recvs, (size_t)cap * sizeof(*r));
    if (r)
        p->self_recvs = r;
    void **rb = realloc(p->self_rbufs, (size_t)cap * sizeof(*rb));
    if (rb)
        p->self_rbufs = rb;
    if (!s || !sb || !r || !rb) {
        LOOM_WARN("out of memory queueing a message to self");
        return loomSystemError;
    }
    p->self_cap = cap;
    return loomSuccess;
}

static loomResult_t self_complete(loom_p2p_req_t *send, const void *sbuf, loom_p2p_req_t *recv,
                                  void *rbuf)
{
    if (send->nbytes > recv->nbytes) {
        LOOM_WARN("message to self of %zu bytes is longer than the %zu byte receive", send->nbytes,
                  recv->nbytes);
        return loomInvalidUsage;
    }
    if (send->nbytes > 0 && sbuf != rbuf)
        memmove(rbuf, sbuf, send->nbytes);
    send->done = recv->done = 1;
    send->done_bytes = recv->done_bytes = send->nbytes;
    return loomSuccess;
}

static loomResult_t self_post(loom_p2p_t *p, loom_p2p_req_t *req, const void *sbuf, void *rbuf)
{
    LOOM_CHECK(self_grow(p));
    loom_p2p_req_t **other = req->is_send ? p->self_recvs : p->self_sends;
    int *nother = req->is_send ? &p->nself_recvs : &p->nself_sends;
    for (int i = 0; i < *nother; i++) {
        if (other[i]->tag != req->tag)
            continue;
        loomResult_t res;
        if (req->is_send)
            res = self_complete(req, sbuf, other[i], p->self_rbufs[i]);
        else
            res = self_complete(other[i], p->self_bufs[i], req, rbuf);
        for (int j = i + 1; j < *nother; j++) {
            other[j - 1] = other[j];
            if (req->is_send)
                p->self_rbufs[j - 1] = p->self_rbufs[j];
            else
                p->self_bufs[j - 1] = p->self_bufs[j];
        }
        (*nother)--;
        return res;
    }
    if (req->is_send) {
        p->self_sends[p->nself_sends] = req;
        p->self_bufs[p->nself_sends++] = sbuf;
    } else {
        p->self_recvs[p->nself_recvs] = req;
        p->self_rbufs[p->nself_recvs++] = rbuf;
    }
    return loomSuccess;
}

// ---- posting ------------------------------------------------------------------

static loomResult_t check_peer(loom_p2p_t *p, int peer)
{
    if (p->broken) {
        LOOM_WARN("rank %d: communicator is broken by an earlier failure; destroy it", p->rank);
        return loomInvalidUsage;
    }
    if (peer < 0 || peer >= p->nranks) {
        LOOM_WARN("rank %d: peer %d out of range [0, %d)", p->rank, peer, p->nranks);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

loomResult_t loom_p2p_isend(loom_p2p_t *p, int peer, const void *buf, size_t nbytes, uint32_t tag,
                            loom_p2p_req_t *req)
{
    LOOM_CHECK(check_peer(p, peer));
    memset(req, 0, sizeof(*req));
    req->peer = peer;
    req->is_send = 1;
    req->tag = tag;
    req->nbytes = nbytes;
    if (peer == p->rank)
        return self_post(p, req, buf, NULL);
    peer_conn_t *c = &p->conns[peer];
    req->tp = p->tps[c->tp];
    __atomic_add_fetch(&p->bytes_sent, (uint64_t)nbytes, __ATOMIC_RELAXED);
    loomResult_t res = req->tp->isend(c->send, buf, nbytes, tag, &req->tp_req);
    return res == loomSuccess ? res : loom_p2p_request_failed(p, NULL, 0, peer, 1, res, 0);
}

loomResult_t loom_p2p_irecv(loom_p2p_t *p, int peer, void *buf, size_t nbytes, uint32_t tag,
                            loom_p2p_req_t *req)
{
    LOOM_CHECK(check_peer(p, peer));
    memset(req, 0, sizeof(*req));
    req->peer = peer;
    req->is_send = 0;
    req->tag = tag;
    req->nbytes = nbytes;
    if (peer == p->rank)
        return self_post(p, req, NULL, buf);
    peer_conn_t *c = &p->conns[peer];
    req->tp = p->tps[c->tp];
    loomResult_t res = req->tp->irecv(c->recv, buf, nbytes, tag, &req->tp_req);
    return res == loomSuccess ? res : loom_p2p_request_failed(p, NULL, 0, peer, 0, res, 0);
}

uint64_t loom_p2p_bytes_sent(const loom_p2p_t *p)
{
    return __atomic_load_n(&p->bytes_sent, __ATOMIC_RELAXED);
}

const char *loom_p2p_transport_name(loom_p2p_t *p, int peer)
{
    if (peer == p->rank || peer < 0 || peer >= p->nranks)
        return "self";
    return p->tps[p->conns[peer].tp]->name;
}

int loom_p2p_rank(const loom_p2p_t *p)
{
    return p->rank;
}

int loom_p2p_nranks(const loom_p2p_t *p)
{
    return p->nranks;
}

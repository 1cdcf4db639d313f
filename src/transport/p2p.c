/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p.c - a communicator's point-to-point layer over the transport tables:
 * it chooses a transport per peer (first can_connect in LOOM_NET order),
 * connects every peer in both directions through the bootstrap-exchanged
 * listen handles, loops messages to self, and runs every wait with the
 * communicator's bounds: abort flag, timeout without progress, and a
 * liveness check of same-machine peers (a dead pid is reported at once
 * instead of after the timeout).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "p2p.h"
#include "param.h"
#include "timer.h"

#define MAX_TP             4
#define LIVENESS_PERIOD_NS 100000000ull /* check peers' pids every 100 ms without progress */

typedef struct {
    int tp;     /* index into p2p->tps, -1 for self */
    void *send; /* transport send connection */
    void *recv; /* transport receive connection */
} peer_conn_t;

/* Handles every rank publishes: one slot per registry transport. */
typedef struct {
    uint8_t present[MAX_TP];
    uint8_t handle[MAX_TP][LOOM_TP_HANDLE_MAX];
} handles_t;

struct loom_p2p {
    int rank;
    int nranks;
    loom_tp_init_args_t args;
    loom_peer_info_t *peers;
    int ntp;
    const loom_tp_t *tps[MAX_TP];
    void *ctx[MAX_TP];
    void *listen[MAX_TP];
    peer_conn_t *conns;
    /* Messages to self: posted sends and receives, matched in order per tag. */
    loom_p2p_req_t **self_sends;
    const void **self_bufs;
    int nself_sends;
    loom_p2p_req_t **self_recvs;
    void **self_rbufs;
    int nself_recvs;
    int self_cap;
    char what[64];
    uint64_t seq;
    int broken;
};

// ---- setup ------------------------------------------------------------------

/* Parses LOOM_NET-style lists ("shm,tcp", "tcp", "^shm") into transports in order. */
static loomResult_t pick_transports(loom_p2p_t *p, const char *list)
{
    int n = 0;
    const loom_tp_t *const *reg = loom_tp_registry(&n);
    int negate = list && list[0] == '^';
    if (list == NULL || list[0] == '\0' || negate) {
        for (int i = 0; i < n && p->ntp < MAX_TP; i++) {
            if (negate && strstr(list + 1, reg[i]->name) != NULL)
                continue;
            p->tps[p->ntp++] = reg[i];
        }
    } else {
        char buf[128];
        snprintf(buf, sizeof(buf), "%s", list);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int found = 0;
            for (int i = 0; i < n; i++) {
                if (strcasecmp(tok, reg[i]->name) == 0 && p->ntp < MAX_TP) {
                    p->tps[p->ntp++] = reg[i];
                    found = 1;
                }
            }
            if (!found) {
                LOOM_WARN("LOOM_NET names unknown transport '%s' (known: shm, tcp)", tok);
                return loomInvalidArgument;
            }
        }
    }
    if (p->ntp == 0) {
        LOOM_WARN("LOOM_NET '%s' leaves no transport to use", list);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static loomResult_t connect_all(loom_p2p_t *p, const handles_t *all)
{
    int pending_send = 0, pending_recv = 0;
    for (int r = 0; r < p->nranks; r++) {
        if (r == p->rank)
            continue;
        pending_send++;
        pending_recv++;
    }
    uint64_t deadline = loom_deadline_ms(p->args.timeout_ms);
    while (pending_send > 0 || pending_recv > 0) {
        for (int r = 0; r < p->nranks; r++) {
            peer_conn_t *c = &p->conns[r];
            if (r == p->rank || c->send != NULL)
                continue;
            const loom_tp_t *tp = p->tps[c->tp];
            LOOM_CHECK(tp->connect(p->ctx[c->tp], all[r].handle[c->tp], r, &c->send));
            if (c->send != NULL)
                pending_send--;
        }
        for (int t = 0; t < p->ntp; t++) {
            for (;;) {
                void *rc = NULL;
                int from = -1;
                LOOM_CHECK(p->tps[t]->accept(p->listen[t], &rc, &from));
                if (rc == NULL)
                    break;
                if (from < 0 || from >= p->nranks || from == p->rank ||
                    p->conns[from].recv != NULL || p->conns[from].tp != t) {
                    LOOM_WARN("rank %d: unexpected %s connection from rank %d; closed", p->rank,
                              p->tps[t]->name, from);
                    p->tps[t]->close_recv(rc);
                    continue;
                }
                p->conns[from].recv = rc;
                pending_recv--;
            }
        }
        if (pending_send == 0 && pending_recv == 0)
            break;
        if (p->args.abort_flag && *p->args.abort_flag) {
            LOOM_WARN("rank %d: communicator aborted while connecting", p->rank);
            return loomRemoteError;
        }
        if (loom_now_ns() > deadline) {
            char msg[256];
            int o = 0;
            for (int r = 0; r < p->nranks && o < 200; r++)
                if (r != p->rank && (p->conns[r].send == NULL || p->conns[r].recv == NULL))
                    o += snprintf(msg + o, sizeof(msg) - (size_t)o, " %d", r);
            msg[o] = '\0';
            LOOM_WARN("rank %d: could not connect to ranks%s within %lld ms", p->rank, msg,
                      (long long)p->args.timeout_ms);
            return loomTimeout;
        }
        usleep(50);
    }
    return loomSuccess;
}

loomResult_t loom_p2p_create(struct loom_bootstrap *bs, const loom_tp_init_args_t *args,
                             const char *net_list, loom_p2p_t **p2p_p)
{
    loomResult_t res = loomSuccess;
    handles_t *all = NULL;
    loom_p2p_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto err_nomem;
    p->rank = args->rank;
    p->nranks = args->nranks;
    p->args = *args;
    p->peers = calloc((size_t)args->nranks, sizeof(*p->peers));
    p->conns = calloc((size_t)args->nranks, sizeof(*p->conns));
    all = calloc((size_t)args->nranks, sizeof(*all));
    if (p->peers == NULL || p->conns == NULL || all == NULL)
        goto err_nomem;
    memcpy(p->peers, args->peers, (size_t)args->nranks * sizeof(*p->peers));
    p->args.peers = p->peers;
    LOOM_CHECK_GOTO(pick_transports(p, net_list), res, err_free);

    handles_t mine;
    memset(&mine, 0, sizeof(mine));
    for (int t = 0; t < p->ntp; t++) {
        LOOM_CHECK_GOTO(p->tps[t]->init(&p->args, &p->ctx[t]), res, err_close);
        LOOM_CHECK_GOTO(p->tps[t]->listen(p->ctx[t], mine.handle[t], &p->listen[t]), res,
                        err_close);
        mine.present[t] = 1;
    }
    LOOM_CHECK_GOTO(loom_bootstrap_allgather(bs, &mine, sizeof(mine), all), res, err_close);

    const loom_peer_info_t *self = &p->peers[p->rank];
    for (int r = 0; r < p->nranks; r++) {
        p->conns[r].tp = -1;
        if (r == p->rank)
            continue;
        for (int t = 0; t < p->ntp && p->conns[r].tp < 0; t++) {
            int ok = 0;
            if (!all[r].present[t])
                continue;
            LOOM_CHECK_GOTO(p->tps[t]->can_connect(p->ctx[t], self, &p->peers[r], &ok), res,
                            err_close);
            if (ok)
                p->conns[r].tp = t;
        }
        if (p->conns[r].tp < 0) {
            LOOM_WARN("rank %d: no transport reaches rank %d (host %s); LOOM_NET allows %d "
                      "transport(s)",
                      p->rank, r, p->peers[r].host_id, p->ntp);
            res = loomSystemError;
            goto err_close;
        }
        LOOM_INFO(LOOM_LOG_TRANSPORT, "rank %d -> rank %d via %s", p->rank, r,
                  p->tps[p->conns[r].tp]->name);
    }
    LOOM_CHECK_GOTO(connect_all(p, all), res, err_close);
    free(all);
    *p2p_p = p;
    return loomSuccess;

err_nomem:
    LOOM_WARN("out of memory creating the point-to-point layer for %d ranks", args->nranks);
    res = loomSystemError;
    if (p == NULL)
        return res;
    goto err_free;
err_close:
    (void)loom_p2p_destroy(p);
    free(all);
    return res;
err_free:
    free(all);
    free(p->peers);
    free(p->conns);
    free(p);
    return res;
}

loomResult_t loom_p2p_destroy(loom_p2p_t *p)
{
    if (p == NULL)
        return loomSuccess;
    loomResult_t res = loomSuccess;
    for (int r = 0; r < p->nranks; r++) {
        peer_conn_t *c = &p->conns[r];
        if (c->tp < 0)
            continue;
        if (c->send)
            LOOM_CHECK_IGNORE(p->tps[c->tp]->close_send(c->send), res);
        if (c->recv)
            LOOM_CHECK_IGNORE(p->tps[c->tp]->close_recv(c->recv), res);
    }
    for (int t = 0; t < p->ntp; t++) {
        if (p->listen[t])
            LOOM_CHECK_IGNORE(p->tps[t]->close_listen(p->listen[t]), res);
        if (p->ctx[t])
            LOOM_CHECK_IGNORE(p->tps[t]->finalize(p->ctx[t]), res);
    }
    free(p->self_sends);
    free(p->self_bufs);
    free(p->self_recvs);
    free(p->self_rbufs);
    free(p->peers);
    free(p->conns);
    free(p);
    return res;
}

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

// ---- posting and waiting ------------------------------------------------------

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
    return req->tp->isend(c->send, buf, nbytes, tag, &req->tp_req);
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
    return req->tp->irecv(c->recv, buf, nbytes, tag, &req->tp_req);
}

/* One pass over the requests; *progress_p counts completions. */
static loomResult_t test_pass(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int *all_done_p,
                              int *progress_p)
{
    int all = 1;
    for (int i = 0; i < n; i++) {
        loom_p2p_req_t *r = &reqs[i];
        if (r->done)
            continue;
        if (r->tp_req == NULL) { /* self message still waiting for its match */
            all = 0;
            continue;
        }
        int done = 0;
        size_t nb = 0;
        loomResult_t res = r->tp->test(r->tp_req, &done, &nb);
        if (res != loomSuccess) {
            r->tp_req = NULL;
            p->broken = 1;
            char cause[512]; /* the transport's WARN, which this one would overwrite */
            snprintf(cause, sizeof(cause), "%s", loom_last_error());
            LOOM_WARN("rank %d: %s rank %d (host %s, pid %d) failed during %s seq %llu: %s (%s)",
                      p->rank, r->is_send ? "send to" : "receive from", r->peer,
                      p->peers[r->peer].host_id, p->peers[r->peer].pid, p->what,
                      (unsigned long long)p->seq, loomGetErrorString(res), cause);
            return res;
        }
        if (done) {
            r->tp_req = NULL;
            r->done = 1;
            r->done_bytes = nb;
            (*progress_p)++;
        } else {
            all = 0;
        }
    }
    *all_done_p = all;
    return loomSuccess;
}

loomResult_t loom_p2p_test_all(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int *all_done_p)
{
    int progress = 0;
    return test_pass(p, reqs, n, all_done_p, &progress);
}

/* Same-machine peers with a pending request whose process is gone. */
static loomResult_t check_liveness(loom_p2p_t *p, loom_p2p_req_t *reqs, int n)
{
    const loom_peer_info_t *self = &p->peers[p->rank];
    for (int i = 0; i < n; i++) {
        if (reqs[i].done || reqs[i].peer == p->rank)
            continue;
        const loom_peer_info_t *peer = &p->peers[reqs[i].peer];
        if (peer->machine_hash != self->machine_hash)
            continue;
        if (kill(peer->pid, 0) == -1 && errno == ESRCH) {
            p->broken = 1;
            LOOM_WARN("rank %d: rank %d (host %s, pid %d) died during %s seq %llu", p->rank,
                      reqs[i].peer, peer->host_id, peer->pid, p->what, (unsigned long long)p->seq);
            return loomRemoteError;
        }
    }
    return loomSuccess;
}

static void report_timeout(loom_p2p_t *p, loom_p2p_req_t *reqs, int n)
{
    char msg[512];
    int o = 0;
    for (int i = 0; i < n && o < 400; i++) {
        if (reqs[i].done)
            continue;
        o += snprintf(msg + o, sizeof(msg) - (size_t)o, " %s rank %d (%zu bytes, tag 0x%x);",
                      reqs[i].is_send ? "send to" : "receive from", reqs[i].peer, reqs[i].nbytes,
                      reqs[i].tag);
    }
    msg[o] = '\0';
    p->broken = 1;
    LOOM_WARN("rank %d: %s seq %llu made no progress for %lld ms; still waiting for:%s", p->rank,
              p->what, (unsigned long long)p->seq, (long long)p->args.timeout_ms, msg);
}

static void block_in_transports(loom_p2p_t *p, loom_p2p_req_t *reqs, int n)
{
    int used[MAX_TP] = {0}, nused = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i].done || reqs[i].tp == NULL)
            continue;
        for (int t = 0; t < p->ntp; t++)
            if (p->tps[t] == reqs[i].tp && !used[t]) {
                used[t] = 1;
                nused++;
            }
    }
    if (nused == 0) {
        sched_yield();
        return;
    }
    /* With one transport pending we can sleep in it; with several, take turns briefly. */
    int us = nused == 1 ? 10000 : 200;
    for (int t = 0; t < p->ntp; t++)
        if (used[t] && p->tps[t]->wait)
            (void)p->tps[t]->wait(p->ctx[t], us);
}

loomResult_t loom_p2p_wait_all(loom_p2p_t *p, loom_p2p_req_t *reqs, int n)
{
    uint64_t start = loom_now_ns();
    uint64_t spin_until = start + (uint64_t)loom_param_SPIN_US() * 1000ull;
    uint64_t last_progress = start, last_liveness = start;
    uint64_t timeout_ns = (uint64_t)p->args.timeout_ms * 1000000ull;
    for (;;) {
        int all = 0, progress = 0;
        LOOM_CHECK(test_pass(p, reqs, n, &all, &progress));
        if (all)
            return loomSuccess;
        if (p->args.abort_flag && *p->args.abort_flag) {
            p->broken = 1;
            LOOM_WARN("rank %d: %s seq %llu stopped by loomCommAbort", p->rank, p->what,
                      (unsigned long long)p->seq);
            return loomRemoteError;
        }
        uint64_t now = loom_now_ns();
        if (progress) {
            last_progress = now;
            continue;
        }
        if (now - last_progress > timeout_ns) {
            report_timeout(p, reqs, n);
            return loomTimeout;
        }
        if (now - last_liveness > LIVENESS_PERIOD_NS) {
            last_liveness = now;
            LOOM_CHECK(check_liveness(p, reqs, n));
        }
        if (now < spin_until)
            continue;
        block_in_transports(p, reqs, n);
    }
}

void loom_p2p_set_context(loom_p2p_t *p, const char *what, uint64_t seq)
{
    snprintf(p->what, sizeof(p->what), "%s", what);
    p->seq = seq;
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

/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p.c - a communicator's point-to-point layer over the transport tables:
 * it chooses a transport per peer (first can_connect in LOOM_NET order,
 * among those both ranks started: loom's own choice of ucx across hosts is
 * started only on the ranks that offer it, so a pair uses it only where both
 * did),
 * connects every peer in both directions through the bootstrap-exchanged
 * listen handles, loops messages to self, and runs every wait with the
 * communicator's bounds: abort flag, timeout without progress, and a
 * liveness check of same-machine peers. It also owns the failure protocol
 * (notices, described in p2p_impl.h): how a broken communicator tells its
 * peers why, so that a failure anywhere ends every rank's wait quickly and
 * names its cause; p2p_report.c words the messages and the timeout dump.
 * It does not retry or recover: a failed wait breaks the layer for good.
 * Callers: api/ (create, destroy, send/recv) and the collective algorithms.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "p2p_impl.h"
#include "param.h"
#include "timer.h"

static int aborted(const loom_p2p_t *p)
{
    return p->abort_flag != NULL && __atomic_load_n(p->abort_flag, __ATOMIC_ACQUIRE) != 0;
}

/* 1 if pid no longer runs: gone, or a zombie its parent has not reaped yet. */
static int pid_gone(int pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the command name may contain anything */
    return rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static int same_machine(const loom_p2p_t *p, int peer)
{
    return p->peers[peer].machine_hash == p->peers[p->rank].machine_hash;
}

// ---- setup ------------------------------------------------------------------

/* 1 if the comma list names exactly name ("^cp" must not exclude tcp). */
static int list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncasecmp(p, name, n) == 0)
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* LOOM_NET named a transport that is not in the registry. */
static loomResult_t unknown_transport(const char *tok, const loom_tp_t *const *reg, int n)
{
    char known[128];
    int o = 0;
    for (int i = 0; i < n && o < (int)sizeof(known); i++)
        o += snprintf(known + o, sizeof(known) - (size_t)o, "%s%s", i ? ", " : "", reg[i]->name);
    if (strcasecmp(tok, "ucx") == 0)
        LOOM_WARN("LOOM_NET names transport 'ucx', but this build of loom has no UCX support "
                  "(configure with libucx-dev installed, meson -Ducx=enabled); available: %s",
                  known);
    else
        LOOM_WARN("LOOM_NET names unknown transport '%s' (known: %s)", tok, known);
    return loomInvalidArgument;
}

/* Parses LOOM_NET-style lists ("shm,tcp", "tcp", "^shm") into transports in order.
 * Without a list of names (empty or "^..."), opt-in transports (ucx) stay out, except
 * that an empty list takes them as loom's own choice when ucx_auto says they are
 * candidates (every rank then lists them, so transport indices agree everywhere). */
static loomResult_t pick_transports(loom_p2p_t *p, const char *list, loom_p2p_ucx_auto_t ucx_auto)
{
    int n = 0;
    const loom_tp_t *const *reg = loom_tp_registry(&n);
    int negate = list && list[0] == '^';
    int open_choice = list == NULL || list[0] == '\0';
    if (open_choice || negate) {
        for (int i = 0; i < n && p->ntp < MAX_TP; i++) {
            if (negate && list_has(list + 1, reg[i]->name))
                continue;
            if (loom_tp_opt_in(reg[i])) {
                if (!open_choice || ucx_auto == LOOM_P2P_UCX_AUTO_NONE)
                    continue;
                p->tp_auto[p->ntp] = 1;
            }
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
            if (!found)
                return unknown_transport(tok, reg, n);
        }
    }
    if (p->ntp == 0) {
        LOOM_WARN("LOOM_NET '%s' leaves no transport to use", list);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* A same-machine peer that is not fully connected yet and whose process is gone. */
static loomResult_t connect_check_peers(loom_p2p_t *p)
{
    for (int r = 0; r < p->nranks; r++) {
        const peer_conn_t *c = &p->conns[r];
        if (r == p->rank || (c->send != NULL && c->recv != NULL) || !same_machine(p, r))
            continue;
        if (pid_gone(p->peers[r].pid)) {
            LOOM_WARN("rank %d: rank %d (host %s, pid %d) died while the communicator was being "
                      "created (connection %s)",
                      p->rank, r, p->peers[r].hostname, p->peers[r].pid,
                      c->send == NULL ? "to it not established" : "from it not accepted");
            return loomRemoteError;
        }
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
    uint64_t next_check = loom_now_ns() + LIVENESS_PERIOD_NS;
    while (pending_send > 0 || pending_recv > 0) {
        if (aborted(p)) {
            p->tp_abort = 1;
            LOOM_WARN("rank %d: communicator aborted while connecting", p->rank);
            return loomRemoteError;
        }
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
            while (p->listen[t] != NULL) {
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
        uint64_t now = loom_now_ns();
        if (now > deadline) {
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
        if (now > next_check) {
            next_check = now + LIVENESS_PERIOD_NS;
            LOOM_CHECK(connect_check_peers(p));
        }
        usleep(50);
    }
    return loomSuccess;
}

/* Starts transport t and its listener, filling mine's handle. A transport loom chose by
 * itself (tp_auto) is started only where this rank offers it, and failing to start it is not
 * fatal: mine says it is absent, and every peer reaches this rank another way. */
static loomResult_t start_transport(loom_p2p_t *p, int t, loom_p2p_ucx_auto_t ucx_auto,
                                    handles_t *mine)
{
    if (p->tp_auto[t] && ucx_auto != LOOM_P2P_UCX_AUTO_OFFER)
        return loomSuccess;
    loomResult_t res = p->tps[t]->init(&p->args, &p->ctx[t]);
    if (res == loomSuccess)
        res = p->tps[t]->listen(p->ctx[t], mine->handle[t], &p->listen[t]);
    if (res == loomSuccess) {
        mine->present[t] = 1;
        return loomSuccess;
    }
    if (!p->tp_auto[t])
        return res;
    LOOM_WARN("rank %d: %s did not start (%s); tcp carries this rank's links between hosts",
              p->rank, p->tps[t]->name, loom_last_error());
    if (p->listen[t] != NULL)
        (void)p->tps[t]->close_listen(p->listen[t]);
    if (p->ctx[t] != NULL)
        (void)p->tps[t]->finalize(p->ctx[t]);
    p->listen[t] = NULL;
    p->ctx[t] = NULL;
    return loomSuccess;
}

loomResult_t loom_p2p_create(struct loom_bootstrap *bs, const loom_tp_init_args_t *args,
                             const char *net_list, loom_p2p_ucx_auto_t ucx_auto, loom_p2p_t **p2p_p)
{
    loomResult_t res = loomSuccess;
    handles_t *all = NULL;
    loom_p2p_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto err_nomem;
    p->rank = args->rank;
    p->nranks = args->nranks;
    p->what = "communicator creation";
    p->args = *args;
    p->abort_flag = args->abort_flag;
    p->args.abort_flag = &p->tp_abort;
    p->args.quiet_flag = &p->tp_quiet;
    p->peers = calloc((size_t)args->nranks, sizeof(*p->peers));
    p->conns = calloc((size_t)args->nranks, sizeof(*p->conns));
    p->flush = calloc((size_t)args->nranks, sizeof(*p->flush));
    p->probes = calloc((size_t)args->nranks, sizeof(*p->probes));
    all = calloc((size_t)args->nranks, sizeof(*all));
    if (p->peers == NULL || p->conns == NULL || p->flush == NULL || p->probes == NULL ||
        all == NULL)
        goto err_nomem;
    loom_p2p_stamp_init(p);
    memcpy(p->peers, args->peers, (size_t)args->nranks * sizeof(*p->peers));
    p->args.peers = p->peers;
    for (int r = 0; r < p->nranks; r++)
        p->conns[r].tp = -1;
    LOOM_CHECK_GOTO(pick_transports(p, net_list, ucx_auto), res, err_free);

    handles_t mine;
    memset(&mine, 0, sizeof(mine));
    for (int t = 0; t < p->ntp; t++)
        LOOM_CHECK_GOTO(start_transport(p, t, ucx_auto, &mine), res, err_close);
    LOOM_CHECK_GOTO(loom_bootstrap_allgather(bs, &mine, sizeof(mine), all), res, err_close);

    const loom_peer_info_t *self = &p->peers[p->rank];
    for (int r = 0; r < p->nranks; r++) {
        if (r == p->rank)
            continue;
        for (int t = 0; t < p->ntp && p->conns[r].tp < 0; t++) {
            int ok = 0;
            if (!mine.present[t] || !all[r].present[t])
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
    LOOM_CHECK_GOTO(loom_p2p_notice_recvs_post(p), res, err_close);
    LOOM_CHECK_GOTO(loom_shm_arena_create(p, &p->args, p->abort_flag, &p->arena), res, err_close);
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
    /* Peers that finished connecting learn of this failure from the notice. */
    p->broken = 1;
    p->cause = (cause_t){.kind = N_ERROR, .rank = p->rank, .via = -1, .code = (uint32_t)res};
    p->tp_abort = 1;
    {
        char keep[1024]; /* closing must not replace the message of the failure */
        snprintf(keep, sizeof(keep), "%s", loom_last_error());
        (void)loom_p2p_destroy(p);
        loom_set_last_error("%s", keep);
    }
    free(all);
    return res;
err_free:
    free(all);
    free(p->peers);
    free(p->conns);
    free(p->flush);
    free(p->probes);
    free(p);
    return res;
}

/* Closes every connection: peers see the end of the stream at once. Requests
 * still queued on them are freed with them. */
static loomResult_t close_all(loom_p2p_t *p)
{
    loomResult_t res = loomSuccess;
    for (int r = 0; r < p->nranks; r++) {
        peer_conn_t *c = &p->conns[r];
        if (c->tp < 0)
            continue;
        if (c->send)
            LOOM_CHECK_IGNORE(p->tps[c->tp]->close_send(c->send), res);
        if (c->recv)
            LOOM_CHECK_IGNORE(p->tps[c->tp]->close_recv(c->recv), res);
        c->send = c->recv = c->notice_req = NULL;
        p->flush[r] = p->probes[r] = NULL;
    }
    p->closed = 1;
    return res;
}

/* Breaks the layer (once): every peer gets the cause, then every connection closes. */
static void p2p_break(loom_p2p_t *p, const cause_t *cause, loom_p2p_req_t *reqs, int n)
{
    for (int i = 0; i < n; i++)
        reqs[i].tp_req = NULL; /* freed with their connections */
    if (p->closed)
        return;
    p->broken = 1;
    p->cause = *cause;
    p->tp_abort = 1; /* from now on shm closes its rings hard: writers fail at once */
    p->tp_quiet = 1; /* the cause is reported; peers that already left need no WARN */
    int skip = cause->kind == N_DEAD && cause->via < 0 ? cause->rank : -1;
    loom_p2p_notices_send(p, cause->kind, cause, skip);
    loom_shm_arena_break(p->arena, p->seq); /* after the notices: arena waiters read them at once */
    (void)close_all(p);
}

loomResult_t loom_p2p_destroy(loom_p2p_t *p)
{
    if (p == NULL)
        return loomSuccess;
    loomResult_t res = loomSuccess;
    if (!p->closed && p->conns != NULL) {
        p->tp_quiet = 1; /* best-effort goodbyes: a peer that already left is no failure */
        if (p->broken) {
            loom_p2p_notices_send(p, p->cause.kind, &p->cause, -1);
        } else if (aborted(p)) {
            p->tp_abort = 1;
            cause_t c = {.kind = N_ABORT, .rank = p->rank, .via = -1};
            loom_p2p_notices_send(p, N_ABORT, &c, -1);
        } else {
            loom_p2p_notices_send(p, N_BYE, NULL, -1);
        }
        LOOM_CHECK_IGNORE(close_all(p), res);
    }
    LOOM_CHECK_IGNORE(loom_shm_arena_destroy(p->arena), res);
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
    free(p->flush);
    free(p->probes);
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

/* Sleeps until deadline_ns or an abort, in slices. */
static void hold_until(const loom_p2p_t *p, uint64_t deadline_ns)
{
    for (uint64_t now = loom_now_ns(); now < deadline_ns && !aborted(p); now = loom_now_ns()) {
        uint64_t left = deadline_ns - now;
        if (left > 10000000ull)
            left = 10000000ull;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)left};
        nanosleep(&ts, NULL);
    }
}

/* Ends a failed wait: break (notices, close), then the message as the last WARN.
 * A timeout learned from a peer is returned no earlier than this wait's own. */
static loomResult_t fail(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, const cause_t *cause,
                         loomResult_t res, uint64_t start_ns, const char *direct)
{
    if (p->found.set && !p->closed) {
        /* What this rank found in a peer's message came first, whatever the wait saw next. */
        cause = &p->found.cause;
        res = p->found.res;
        direct = p->found.detail;
    }
    p2p_break(p, cause, reqs, n);
    if (res == loomTimeout && start_ns != 0)
        hold_until(p, start_ns + (uint64_t)p->args.timeout_ms * 1000000ull);
    char pend[640], msg[1024];
    loom_p2p_pending_list(p, reqs, n, pend, sizeof(pend));
    loom_p2p_describe(p, cause, direct ? direct : "", pend, msg, sizeof(msg));
    if (res == loomTimeout)
        loom_p2p_dump_timeout(p, reqs, n, cause, start_ns ? loom_now_ns() - start_ns : 0);
    LOOM_WARN("%s", msg);
    return res;
}

/* How a peer's connection ended: with a failure notice (its cause travels on),
 * after a BYE, or silently (then a same-machine peer is given a moment to exit,
 * so that a killed process is reported as dead). Returns what to return. */
static loomResult_t classify_lost_peer(loom_p2p_t *p, int peer, cause_t *c)
{
    peer_conn_t *pc = &p->conns[peer];
    if (p->found.set) { /* the stream ended because this rank stopped reading it */
        *c = p->found.cause;
        return p->found.res;
    }
    loom_p2p_notice_poll(p, peer);
    if (pc->notice_state == NS_GOT && pc->got.kind != N_BYE) {
        *c = pc->got;
        if (c->kind == N_MISMATCH) /* every rank of mismatched calls returns InvalidUsage */
            return loomInvalidUsage;
        /* A peer found this rank at fault (a buffer it could not read). */
        if (c->kind == N_ERROR && c->rank == p->rank && c->code == (uint32_t)loomInvalidUsage)
            return loomInvalidUsage;
        return c->kind == N_TIMEOUT ? loomTimeout : loomRemoteError;
    }
    *c = (cause_t){.kind = N_LOST, .rank = peer, .via = -1};
    if (pc->notice_state == NS_GOT) {
        c->kind = N_CLOSED;
    } else if (same_machine(p, peer)) {
        uint64_t until = loom_now_ns() + EXIT_GRACE_NS;
        while (!pid_gone(p->peers[peer].pid) && loom_now_ns() < until)
            usleep(2000);
        if (pid_gone(p->peers[peer].pid))
            c->kind = N_DEAD;
    }
    return loomRemoteError;
}

/* A transport call for a request to or from peer failed with res. */
static loomResult_t request_failed(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int peer,
                                   int is_send, loomResult_t res, uint64_t start_ns)
{
    char direct[640], a[160];
    /* The transport's WARN (the first detection) becomes part of this one. */
    snprintf(direct, sizeof(direct), "%s %s failed: %s (%s)", is_send ? "send to" : "receive from",
             loom_p2p_who(p, peer, a, sizeof(a)), loomGetErrorString(res), loom_last_error());
    cause_t c = {.kind = N_ERROR, .rank = p->rank, .via = -1, .code = (uint32_t)res};
    loomResult_t ret = res;
    if (res == loomRemoteError)
        ret = classify_lost_peer(p, peer, &c);
    return fail(p, reqs, n, &c, ret, start_ns, direct);
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
    return res == loomSuccess ? res : request_failed(p, NULL, 0, peer, 1, res, 0);
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
    return res == loomSuccess ? res : request_failed(p, NULL, 0, peer, 0, res, 0);
}

// ---- waiting ------------------------------------------------------------------

/* One pass over the requests; *progress_p counts completions. On a transport
 * error *failed_p is the failed request (its transport request is gone). */
static loomResult_t test_pass(loom_p2p_req_t *reqs, int n, int *all_done_p, int *progress_p,
                              int *failed_p)
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
            *failed_p = i;
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
    if (p->broken) {
        LOOM_WARN("rank %d: communicator is broken by an earlier failure; destroy it", p->rank);
        return loomInvalidUsage;
    }
    int progress = 0, failed = -1;
    loomResult_t res = test_pass(reqs, n, all_done_p, &progress, &failed);
    if (res != loomSuccess)
        return request_failed(p, reqs, n, reqs[failed].peer, reqs[failed].is_send, res, 0);
    if (p->found.set)
        return fail(p, reqs, n, &p->found.cause, p->found.res, 0, NULL);
    return loomSuccess;
}

/* A same-machine peer with a pending request (any of the n ranks if reqs is NULL)
 * whose process is gone: its rank, or -1. Without requests, a peer that said
 * goodbye (destroyed its communicator cleanly) and then exited is not dead:
 * whoever still needs it learns that it left from its stream or its arena
 * state. Its goodbye is looked for once more after its pid is gone, since
 * everything it wrote before exiting is there by then. */
static int find_dead_peer(loom_p2p_t *p, const loom_p2p_req_t *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        const int r = reqs ? reqs[i].peer : i;
        if ((reqs && reqs[i].done) || r == p->rank || !same_machine(p, r))
            continue;
        if (!pid_gone(p->peers[r].pid))
            continue;
        if (reqs == NULL) {
            loom_p2p_notice_poll(p, r);
            const peer_conn_t *c = &p->conns[r];
            if (c->notice_state == NS_GOT && c->got.kind == N_BYE)
                continue;
        }
        return r;
    }
    return -1;
}

/* Sleeps in the transports that have pending requests (in either array); returns
 * the time asked for (ns). */
static uint64_t block_in_transports(loom_p2p_t *p, loom_p2p_req_t *reqs, int n,
                                    loom_p2p_req_t *also, int nalso)
{
    int used[MAX_TP] = {0}, nused = 0;
    for (int i = 0; i < n + nalso; i++) {
        const loom_p2p_req_t *r = i < n ? &reqs[i] : &also[i - n];
        if (r->done || r->tp == NULL)
            continue;
        for (int t = 0; t < p->ntp; t++)
            if (p->tps[t] == r->tp && !used[t]) {
                used[t] = 1;
                nused++;
            }
    }
    if (nused == 0) {
        sched_yield();
        return 0;
    }
    /* With one transport pending we can sleep in it; with several, take turns briefly. */
    int us = nused == 1 ? 10000 : 200;
    for (int t = 0; t < p->ntp; t++)
        if (used[t] && p->tps[t]->wait)
            (void)p->tps[t]->wait(p->ctx[t], us);
    return (uint64_t)us * 1000ull;
}

/* The first peer this wait still needs (the one a timeout names), or self. */
static int first_pending(const loom_p2p_t *p, const loom_p2p_req_t *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (!reqs[i].done)
            return reqs[i].peer;
    return p->rank;
}

/* A peer's failure notice (or the end of its stream) ends this wait: its cause
 * travels on. A peer that timed out waiting on this rank says nothing about the
 * culprit: this rank then reports what it waits for itself. */
static loomResult_t notice_failed(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int peer,
                                  uint64_t start_ns)
{
    cause_t c;
    loomResult_t res = classify_lost_peer(p, peer, &c);
    if (c.kind == N_TIMEOUT && c.rank == p->rank)
        c = (cause_t){.kind = N_TIMEOUT, .rank = first_pending(p, reqs, n), .via = -1};
    return fail(p, reqs, n, &c, res, start_ns, NULL);
}

uint64_t loom_p2p_bytes_sent(const loom_p2p_t *p)
{
    return __atomic_load_n(&p->bytes_sent, __ATOMIC_RELAXED);
}

loomResult_t loom_p2p_wait_all(loom_p2p_t *p, loom_p2p_req_t *reqs, int n)
{
    return loom_p2p_wait_for(p, reqs, n, NULL, 0);
}

loomResult_t loom_p2p_wait_for(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, loom_p2p_req_t *also,
                               int nalso)
{
    if (p->broken) {
        LOOM_WARN("rank %d: communicator is broken by an earlier failure; destroy it", p->rank);
        return loomInvalidUsage;
    }
    uint64_t start = loom_now_ns();
    uint64_t spin_until = start + (uint64_t)loom_param_SPIN_US() * 1000ull;
    uint64_t last_progress = start, last_liveness = start;
    uint64_t timeout_ns = (uint64_t)p->args.timeout_ms * 1000000ull;
    int early = 0;
    for (;;) {
        int all = 0, progress = 0, failed = -1, also_all = 0;
        loomResult_t res = test_pass(reqs, n, &all, &progress, &failed);
        if (res != loomSuccess)
            return request_failed(p, reqs, n, reqs[failed].peer, reqs[failed].is_send, res, start);
        if (nalso > 0 &&
            (res = test_pass(also, nalso, &also_all, &progress, &failed)) != loomSuccess)
            return request_failed(p, also, nalso, also[failed].peer, also[failed].is_send, res,
                                  start);
        if (p->found.set) /* a stamp or probe that arrived on a connection outside this wait */
            return fail(p, reqs, n, &p->found.cause, p->found.res, start, NULL);
        if (all)
            return loomSuccess;
        if (aborted(p)) {
            cause_t c = {.kind = N_ABORT, .rank = p->rank, .via = -1};
            return fail(p, reqs, n, &c, loomRemoteError, start, NULL);
        }
        uint64_t now = loom_now_ns();
        if (progress) {
            last_progress = now;
            continue;
        }
        if (now - last_progress > timeout_ns) {
            int from =
                loom_p2p_notices_poll_all(p); /* a peer may have timed out on the culprit first */
            if (from >= 0)
                return notice_failed(p, reqs, n, from, start);
            cause_t c = {.kind = N_TIMEOUT, .rank = first_pending(p, reqs, n), .via = -1};
            return fail(p, reqs, n, &c, loomTimeout, start, NULL);
        }
        /* Woken early without progress: a connection outside this wait has news (a
         * notice, a frame of a later call, an end); reading it stops the wake-ups. */
        if (early || now - last_liveness > LIVENESS_PERIOD_NS) {
            int from = loom_p2p_notices_poll_all(p);
            if (from >= 0)
                return notice_failed(p, reqs, n, from, start);
        }
        if (now - last_liveness > LIVENESS_PERIOD_NS) {
            last_liveness = now;
            int dead = find_dead_peer(p, reqs, n);
            if (dead >= 0) {
                cause_t c = {.kind = N_DEAD, .rank = dead, .via = -1};
                return fail(p, reqs, n, &c, loomRemoteError, start, NULL);
            }
            /* Stalled: the peers waited on compare their calls with this one. */
            if (now - last_progress > LIVENESS_PERIOD_NS)
                loom_p2p_probe_peers(p, reqs, n);
        }
        if (now < spin_until)
            continue;
        uint64_t asked = block_in_transports(p, reqs, n, also, nalso);
        early = asked > 0 && loom_now_ns() - now < asked / 2;
    }
}

loomResult_t loom_p2p_wait_event(loom_p2p_t *p, int ev, int peer, int waited, unsigned step,
                                 loomResult_t res, uint64_t start_ns, const char *detail)
{
    if (p->broken) {
        LOOM_WARN("rank %d: communicator is broken by an earlier failure; destroy it", p->rank);
        return loomInvalidUsage;
    }
    /* What was awaited, as a pending receive, for messages and the dump. */
    loom_p2p_req_t w = {.peer = waited, .tag = loom_tag_coll(p->seq, step)};
    const int nw = waited >= 0 && waited < p->nranks && waited != p->rank;
    if (nw)
        w.tp = p->tps[p->conns[waited].tp];
    if (p->found.set)
        return fail(p, &w, nw, &p->found.cause, p->found.res, start_ns, NULL);
    cause_t c = {.kind = N_ERROR, .rank = p->rank, .via = -1, .code = (uint32_t)res};
    const int found = ev == LOOM_P2P_EV_ERROR || ev == LOOM_P2P_EV_BLAME; /* the cause is known */
    int from = ev == LOOM_P2P_EV_LEFT ? peer : found ? -1 : loom_p2p_notices_poll_all(p);
    int dead = -1;
    if (ev == LOOM_P2P_EV_BLAME)
        c = (cause_t){.kind = N_ERROR, .rank = peer, .via = -1, .code = (uint32_t)res};
    else if (!found && aborted(p))
        c = (cause_t){.kind = N_ABORT, .rank = p->rank, .via = -1};
    else if (from >= 0)
        return notice_failed(p, &w, nw, from, start_ns);
    else if (!found && (dead = find_dead_peer(p, NULL, p->nranks)) >= 0)
        c = (cause_t){.kind = N_DEAD, .rank = dead, .via = -1};
    else if (ev == LOOM_P2P_EV_TIMEOUT)
        c = (cause_t){.kind = N_TIMEOUT, .rank = waited, .via = -1};
    else if (!found)
        return loomSuccess;
    res = c.kind == N_ERROR && c.rank == p->rank ? res
          : c.kind == N_TIMEOUT                  ? loomTimeout
                                                 : loomRemoteError;
    return fail(p, &w, nw, &c, res, start_ns, detail);
}

int loom_p2p_failure_seen(loom_p2p_t *p)
{
    return p->broken || p->found.set || aborted(p) || loom_p2p_notices_poll_all(p) >= 0 ||
           find_dead_peer(p, NULL, p->nranks) >= 0;
}

loom_arena_t *loom_p2p_arena(loom_p2p_t *p)
{
    return p->broken ? NULL : p->arena;
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

/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_setup.c - the point-to-point layer's life: it chooses a transport per
 * peer (first can_connect in LOOM_NET order, among those both ranks started:
 * loom's own choice of ucx across hosts is started only on the ranks that
 * offer it, so a pair uses it only where both did), connects every peer in
 * both directions through the bootstrap-exchanged listen handles, and ends
 * the layer: a break (the first failure: notices, the break hook, then every
 * connection closed; loom_p2p_fail for a failure found outside the layer) or
 * a destroy. It does not post or wait (p2p.c, p2p_wait.c) and holds nothing
 * of the collectives: the shm collectives' arena is theirs, told of a break
 * through the hook. Callers: api/ (create, fail, destroy), the collectives
 * (the hook) and p2p_wait.c (break).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "p2p_impl.h"
#include "timer.h"

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
static loomResult_t pick_transports(loom_p2p_t *p, const char *list, loom_tp_ucx_auto_t ucx_auto)
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
                if (!open_choice || ucx_auto == LOOM_TP_UCX_AUTO_NONE)
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
        if (r == p->rank || (c->send != NULL && c->recv != NULL) || !loom_p2p_same_machine(p, r))
            continue;
        if (loom_p2p_pid_gone(p->peers[r].pid)) {
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
        if (loom_p2p_aborted(p)) {
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
static loomResult_t start_transport(loom_p2p_t *p, int t, loom_tp_ucx_auto_t ucx_auto,
                                    handles_t *mine)
{
    if (p->tp_auto[t] && ucx_auto != LOOM_TP_UCX_AUTO_OFFER)
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

/* Frees the layer's memory (its connections and transports are closed already). */
static void p2p_free(loom_p2p_t *p)
{
    free(p->self_sends);
    free(p->self_bufs);
    free(p->self_recvs);
    free(p->self_rbufs);
    free(p->peers);
    free(p->conns);
    free(p->flush);
    free(p->probes);
    free(p);
}

loomResult_t loom_p2p_create(struct loom_bootstrap *bs, const loom_tp_init_args_t *args,
                             const char *net_list, loom_tp_ucx_auto_t ucx_auto, loom_p2p_t **p2p_p)
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
    loom_p2p_spin_setup(p);
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
    loom_p2p_fail(p, res);
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
    p2p_free(p);
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

void loom_p2p_break(loom_p2p_t *p, const cause_t *cause, loom_p2p_req_t *reqs, int n)
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
    if (p->on_break != NULL) /* after the notices: whoever it wakes reads them at once */
        p->on_break(p->on_break_arg, p->seq);
    (void)close_all(p);
}

void loom_p2p_on_break(loom_p2p_t *p, loom_p2p_break_fn_t fn, void *arg)
{
    p->on_break = fn;
    p->on_break_arg = arg;
    if (p->broken && fn != NULL)
        fn(arg, p->seq);
}

int loom_p2p_lost_rank(const loom_p2p_t *p)
{
    if (!p->broken || (p->cause.kind != N_DEAD && p->cause.kind != N_LOST))
        return -1;
    return p->cause.rank;
}

void loom_p2p_fail(loom_p2p_t *p, loomResult_t res)
{
    const cause_t c = {.kind = N_ERROR, .rank = p->rank, .via = -1, .code = (uint32_t)res};
    char keep[1024]; /* the notices must not replace the message of the failure */
    snprintf(keep, sizeof(keep), "%s", loom_last_error());
    loom_p2p_break(p, &c, NULL, 0);
    loom_set_last_error("%s", keep);
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
        } else if (loom_p2p_aborted(p)) {
            p->tp_abort = 1;
            cause_t c = {.kind = N_ABORT, .rank = p->rank, .via = -1};
            loom_p2p_notices_send(p, N_ABORT, &c, -1);
        } else {
            loom_p2p_notices_send(p, N_BYE, NULL, -1);
        }
        LOOM_CHECK_IGNORE(close_all(p), res);
    }
    for (int t = 0; t < p->ntp; t++) {
        if (p->listen[t])
            LOOM_CHECK_IGNORE(p->tps[t]->close_listen(p->listen[t]), res);
        if (p->ctx[t])
            LOOM_CHECK_IGNORE(p->tps[t]->finalize(p->ctx[t]), res);
    }
    p2p_free(p);
    return res;
}

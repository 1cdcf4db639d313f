/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_wait.c - every wait of the point-to-point layer, with the
 * communicator's bounds: abort flag, timeout without progress, and a
 * liveness check of same-machine peers; and how a failed wait ends: it finds
 * the cause (a peer's notice, a lost or dead peer, a timeout, an abort, a
 * difference found in a peer's call), breaks the layer (p2p_setup.c) and
 * WARNs the message that p2p_report.c words. Waits that are not on requests
 * (the shm arena's flags) come here through loom_p2p_wait_event.
 * It does not retry or recover: a failed wait breaks the layer for good.
 * Callers: the collective algorithms, api/ and the arena (shm/shm_arena*.c).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cpus.h"
#include "p2p_impl.h"
#include "param.h"
#include "timer.h"

/* 1 if pid no longer runs: gone, or a zombie its parent has not reaped yet. */
int loom_p2p_pid_gone(int pid)
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

void loom_p2p_spin_setup(loom_p2p_t *p)
{
    int here = 0;
    for (int r = 0; r < p->nranks; r++)
        here += loom_p2p_same_machine(p, r);
    const int64_t us = loom_param_SPIN_US();
    p->spin_ns = us > 0 ? (uint64_t)us * 1000ull : 0;
    /* A pure spin would hold a CPU that a rank it waits for needs until the
     * scheduler's slice ends; yielding hands it over at once, and still spins
     * where that rank runs elsewhere. */
    p->spin_yields = loom_cpus_crowded(here);
    LOOM_INFO(LOOM_LOG_P2P, "rank %d: waits spin %llu us%s (%d ranks on this machine, %ld CPUs)",
              p->rank, (unsigned long long)(p->spin_ns / 1000),
              p->spin_yields ? ", yielding the CPU each pass" : "", here,
              sysconf(_SC_NPROCESSORS_ONLN));
}

/* Sleeps until deadline_ns or an abort, in slices. */
static void hold_until(const loom_p2p_t *p, uint64_t deadline_ns)
{
    for (uint64_t now = loom_now_ns(); now < deadline_ns && !loom_p2p_aborted(p);
         now = loom_now_ns()) {
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
    loom_p2p_break(p, cause, reqs, n);
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
    } else if (loom_p2p_same_machine(p, peer)) {
        uint64_t until = loom_now_ns() + EXIT_GRACE_NS;
        while (!loom_p2p_pid_gone(p->peers[peer].pid) && loom_now_ns() < until)
            usleep(2000);
        if (loom_p2p_pid_gone(p->peers[peer].pid))
            c->kind = N_DEAD;
    }
    return loomRemoteError;
}

loomResult_t loom_p2p_request_failed(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int peer,
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
        return loom_p2p_request_failed(p, reqs, n, reqs[failed].peer, reqs[failed].is_send, res, 0);
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
        if ((reqs && reqs[i].done) || r == p->rank || !loom_p2p_same_machine(p, r))
            continue;
        if (!loom_p2p_pid_gone(p->peers[r].pid))
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
    uint64_t spin_until = start + p->spin_ns;
    uint64_t last_progress = start, last_liveness = start;
    uint64_t timeout_ns = (uint64_t)p->args.timeout_ms * 1000000ull;
    int early = 0;
    for (;;) {
        int all = 0, progress = 0, failed = -1, also_all = 0;
        loomResult_t res = test_pass(reqs, n, &all, &progress, &failed);
        if (res != loomSuccess)
            return loom_p2p_request_failed(p, reqs, n, reqs[failed].peer, reqs[failed].is_send, res,
                                           start);
        if (nalso > 0 &&
            (res = test_pass(also, nalso, &also_all, &progress, &failed)) != loomSuccess)
            return loom_p2p_request_failed(p, also, nalso, also[failed].peer, also[failed].is_send,
                                           res, start);
        if (p->found.set) /* a stamp or probe that arrived on a connection outside this wait */
            return fail(p, reqs, n, &p->found.cause, p->found.res, start, NULL);
        if (all)
            return loomSuccess;
        if (loom_p2p_aborted(p)) {
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
                /* A peer that broke, told every peer why and exited since the look above: its
                 * notice, already here, names the first cause, which its death would hide. */
                int from = loom_p2p_notices_poll_all(p);
                if (from >= 0)
                    return notice_failed(p, reqs, n, from, start);
                cause_t c = {.kind = N_DEAD, .rank = dead, .via = -1};
                return fail(p, reqs, n, &c, loomRemoteError, start, NULL);
            }
            /* Stalled: the peers waited on compare their calls with this one. */
            if (now - last_progress > LIVENESS_PERIOD_NS)
                loom_p2p_probe_peers(p, reqs, n);
        }
        if (now < spin_until) {
            if (p->spin_yields)
                sched_yield();
            continue;
        }
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
    else if (!found && loom_p2p_aborted(p))
        c = (cause_t){.kind = N_ABORT, .rank = p->rank, .via = -1};
    else if (from >= 0)
        return notice_failed(p, &w, nw, from, start_ns);
    else if (!found && (dead = find_dead_peer(p, NULL, p->nranks)) >= 0) {
        /* As in a wait on requests: a notice that arrived before the death names the cause. */
        if ((from = loom_p2p_notices_poll_all(p)) >= 0)
            return notice_failed(p, &w, nw, from, start_ns);
        c = (cause_t){.kind = N_DEAD, .rank = dead, .via = -1};
    } else if (ev == LOOM_P2P_EV_TIMEOUT)
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
    return p->broken || p->found.set || loom_p2p_aborted(p) || loom_p2p_notices_poll_all(p) >= 0 ||
           find_dead_peer(p, NULL, p->nranks) >= 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_comm.c - a communicator's device state (dev_comm.h): made at
 * creation, when the process has a device runtime, by opening the device
 * transports in the order of devtp.h (ipc, nccl, staged); released on abort,
 * revoke and timeout; torn down with the communicator. Also the choice of a
 * transport per call and the reasons the trace gives for it.
 *
 * Creation is collective and every rank ends with the same transports: the
 * ranks first agree on which transports to try (a rank's build or
 * LOOM_DEVICE_TRANSPORTS may lack one, and a transport's open is itself
 * collective, so all must try the same ones), then open each, then agree on
 * the results: a transport is used where its open succeeded on every rank,
 * else the first failing rank's reason is kept for the trace and loom_info.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dev_state.h"
#include "dtype.h"
#include "param.h"
#include "timer.h"

/* The implementations this build has (meson defines these when their files exist). */
static const loom_devtp_t *const built[LOOM_DEVTP_NUM] = {
#ifdef LOOM_HAVE_DEVTP_IPC
    [LOOM_DEVTP_IPC] = &loom_devtp_ipc,
#endif
#ifdef LOOM_HAVE_DEVTP_NCCL
    [LOOM_DEVTP_NCCL] = &loom_devtp_nccl,
#endif
    [LOOM_DEVTP_STAGED] = &loom_devtp_staged,
};
static const char *const tp_names[LOOM_DEVTP_NUM] = {"ipc", "nccl", "staged"};

/* What a rank says in each agreement. */
typedef struct {
    int32_t ok[LOOM_DEVTP_NUM];
    char why[LOOM_DEVTP_NUM][LOOM_DEV_WHY_BYTES];
} agree_t;

/* 1 if LOOM_DEVICE_TRANSPORTS (a comma list; empty: all) names tp. */
static int allowed(const char *list, const char *tp)
{
    if (list == NULL || *list == '\0')
        return 1;
    const size_t n = strlen(tp);
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, tp, n) == 0)
            return 1;
        p += len;
        p += *p == ',';
    }
    return 0;
}

/* Every rank's `mine` gathered; for each transport, ok on every rank or the
 * first failing rank's reason in why. */
static loomResult_t agree(struct loomComm *c, const agree_t *mine, agree_t *out)
{
    agree_t *all = calloc((size_t)c->nranks, sizeof(*all));
    if (all == NULL) {
        LOOM_WARN("rank %d: out of memory agreeing on device transports", c->rank);
        return loomSystemError;
    }
    loomResult_t res = loomAllGather(mine, all, sizeof(*mine), loomUint8, c, NULL);
    if (res == loomSuccess) {
        for (int i = 0; i < LOOM_DEVTP_NUM; i++) {
            out->ok[i] = 1;
            out->why[i][0] = '\0';
            for (int r = 0; r < c->nranks && out->ok[i]; r++) {
                if (all[r].ok[i])
                    continue;
                out->ok[i] = 0;
                all[r].why[i][LOOM_DEV_WHY_BYTES - 1] = '\0';
                /* A transport's own agreement may have named the rank already. */
                if (r == c->rank || strncmp(all[r].why[i], "rank ", 5) == 0)
                    snprintf(out->why[i], LOOM_DEV_WHY_BYTES, "%s", all[r].why[i]);
                else
                    snprintf(out->why[i], LOOM_DEV_WHY_BYTES, "rank %d: %.*s", r,
                             LOOM_DEV_WHY_BYTES - 20, all[r].why[i]);
            }
        }
    }
    free(all);
    return res;
}

static void state_free(loom_dev_state_t *d)
{
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->qlock);
    pthread_mutex_destroy(&d->start_lock);
    pthread_mutex_destroy(&d->evlock);
    pthread_cond_destroy(&d->work);
    pthread_cond_destroy(&d->wd);
    free(d->evs);
    free(d->graveyard);
    free(d);
}

static loom_dev_state_t *state_new(struct loomComm *c, const loom_devrt_t *rt)
{
    loom_dev_state_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->qlock, NULL);
    pthread_mutex_init(&d->start_lock, NULL);
    pthread_mutex_init(&d->evlock, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the watchdog's naps */
    pthread_cond_init(&d->wd, &ca);
    pthread_condattr_destroy(&ca);
    d->comm = c;
    d->rt = rt;
    d->trace = loom_param_COLL_TRACE() != 0;
    loom_dev_comm_t *dc = &d->dc;
    dc->comm = c;
    dc->rt = rt;
    dc->rank = c->rank;
    dc->nranks = c->nranks;
    dc->local_rank = c->local_rank;
    dc->local_size = c->local_size;
    dc->all_local = c->local_size == c->nranks;
    dc->timeout_ms = c->timeout_ms;
    dc->abort_flag = &c->abort_flag;
    if (rt->current_device(&dc->device) != loomSuccess)
        dc->device = -1;
    for (int i = 0; i < LOOM_DEVTP_NUM; i++)
        d->tps[i] = built[i];
    return d;
}

/* Closes the transports open here, last opened first. */
static void close_all(loom_dev_state_t *d)
{
    for (int i = LOOM_DEVTP_NUM - 1; i >= 0; i--) {
        if (d->dc.tp_state[i] != NULL || d->dc.tp_open[i])
            d->tps[i]->close(&d->dc, d->dc.tp_state[i]);
        d->dc.tp_state[i] = NULL;
        d->dc.tp_open[i] = 0;
    }
}

static loomResult_t open_all(loom_dev_state_t *d)
{
    struct loomComm *c = d->comm;
    loom_dev_comm_t *dc = &d->dc;
    const char *list = loom_param_DEVICE_TRANSPORTS();
    for (const char *p = list ? list : ""; *p;) {
        const size_t n = strcspn(p, ",");
        if (n > 0 && !(n == 3 && strncmp(p, "ipc", 3) == 0) &&
            !(n == 4 && strncmp(p, "nccl", 4) == 0) && !(n == 6 && strncmp(p, "staged", 6) == 0))
            LOOM_WARN("LOOM_DEVICE_TRANSPORTS: unknown transport '%.*s' ignored (known: ipc, "
                      "nccl, staged)",
                      (int)n, p);
        p += n;
        p += *p == ',';
    }
    agree_t mine, all;
    memset(&mine, 0, sizeof(mine));
    for (int i = 0; i < LOOM_DEVTP_NUM; i++) {
        mine.ok[i] = d->tps[i] != NULL && allowed(list, tp_names[i]);
        snprintf(mine.why[i], LOOM_DEV_WHY_BYTES, "%s",
                 d->tps[i] == NULL ? "not in this build" : "not in LOOM_DEVICE_TRANSPORTS");
    }
    LOOM_CHECK(agree(c, &mine, &all)); /* which ones every rank tries */
    for (int i = 0; i < LOOM_DEVTP_NUM; i++) {
        if (!all.ok[i]) {
            snprintf(dc->tp_why[i], sizeof(dc->tp_why[i]), "%s", all.why[i]);
            mine.ok[i] = 0;
            continue;
        }
        char why[LOOM_DEV_WHY_BYTES] = "";
        loomResult_t r = d->tps[i]->open(dc, &dc->tp_state[i], why, sizeof(why));
        mine.ok[i] = r == loomSuccess;
        dc->tp_open[i] = mine.ok[i];
        snprintf(mine.why[i], LOOM_DEV_WHY_BYTES, "%s", why[0] ? why : loomGetErrorString(r));
        if (r != loomSuccess)
            dc->tp_state[i] = NULL;
    }
    loomResult_t res = agree(c, &mine, &all); /* which ones opened on every rank */
    if (res != loomSuccess) {
        close_all(d);
        return res;
    }
    for (int i = 0; i < LOOM_DEVTP_NUM; i++) {
        if (all.ok[i] || dc->tp_why[i][0] != '\0')
            continue;
        snprintf(dc->tp_why[i], sizeof(dc->tp_why[i]), "%s", all.why[i]);
        if (dc->tp_open[i]) { /* open here, not everywhere: nobody uses it */
            d->tps[i]->close(dc, dc->tp_state[i]);
            dc->tp_state[i] = NULL;
            dc->tp_open[i] = 0;
        }
    }
    return loomSuccess;
}

loomResult_t loom_dev_comm_create(struct loomComm *c)
{
    const loom_devrt_t *rt = c->dev_rt;
    if (rt == NULL)
        return loomSuccess;
    if (c->dev_rt_absent >= 0) { /* known alike on every rank from the identities */
        LOOM_INFO(LOOM_LOG_DEVICE,
                  "comm %s rank %d: no device state: rank %d has no device runtime (LOOM_DEVICE, "
                  "or CUDA not loaded when it joined)",
                  c->name, c->rank, c->dev_rt_absent);
        return loomSuccess;
    }
    loom_dev_state_t *d = state_new(c, rt);
    if (d == NULL) {
        LOOM_WARN("rank %d: out of memory for the device state of communicator %s", c->rank,
                  c->name);
        return loomSystemError;
    }
    loomResult_t res = open_all(d);
    if (res != loomSuccess) {
        state_free(d);
        return res;
    }
    /* The communicator's own stream now rather than at its first call: on CUDA, making a
     * stream loads loom's kernels (devrt_cuda.c), which must not happen lazily once streams
     * wait on flags. A failure here leaves it to the first call, which reports it. */
    loom_dev_stream_t own;
    if (loom_dev_own_stream(d, &own) != loomSuccess)
        LOOM_INFO(LOOM_LOG_DEVICE,
                  "comm %s rank %d: the device stream will be made at the first call", c->name,
                  c->rank);
    char list[3 * (LOOM_DEV_WHY_BYTES + 16)] = "";
    size_t len = 0;
    for (int i = 0; i < LOOM_DEVTP_NUM && len < sizeof(list); i++)
        len +=
            (size_t)snprintf(list + len, sizeof(list) - len, "%s%s %s%s%s", i ? ", " : "",
                             tp_names[i], d->dc.tp_open[i] ? "open" : "not available (",
                             d->dc.tp_open[i] ? "" : d->dc.tp_why[i], d->dc.tp_open[i] ? "" : ")");
    LOOM_INFO(LOOM_LOG_DEVICE, "comm %s rank %d: device runtime %s, device %d; transports: %s",
              c->name, c->rank, rt->name, d->dc.device, list);
    __atomic_store_n(&c->dev, d, __ATOMIC_RELEASE);
    return loomSuccess;
}

// ---- failure and release ------------------------------------------------------

void loom_dev_call_abort_words(loom_dev_call_t *c)
{
    if (c->fl.host == NULL)
        return;
    if (c->mode == LOOM_DEV_GATED)
        loom_dev_flag_store(&c->fl, LOOM_DEV_F_GATE, LOOM_DEV_FLAG_ABORT);
    if (c->tp == LOOM_DEVTP_STAGED)
        loom_dev_flag_store(&c->fl, LOOM_DEV_F_DONE, LOOM_DEV_FLAG_ABORT);
    loom_dev_flag_store(&c->fl, LOOM_DEV_F_FREED, LOOM_DEV_FLAG_ABORT);
}

/* Every open transport's release, and every word of the live calls a wait may be on (the
 * staged transport's release covers its own calls' words as well). */
static void release_all(loom_dev_state_t *d)
{
    for (int i = 0; i < LOOM_DEVTP_NUM; i++)
        if (d->dc.tp_open[i])
            d->tps[i]->release(&d->dc, d->dc.tp_state[i]);
    pthread_mutex_lock(&d->qlock);
    for (loom_dev_call_t *c = d->live_head; c != NULL; c = c->live_next)
        loom_dev_call_abort_words(c);
    pthread_mutex_unlock(&d->qlock);
}

/* Marks d failed; 1 if this call did (the first reason is kept). */
static int mark_failed(loom_dev_state_t *d, loomResult_t res, const char *msg)
{
    pthread_mutex_lock(&d->qlock);
    const int first = !d->failed;
    if (first) {
        d->fail_res = res;
        snprintf(d->fail_msg, sizeof(d->fail_msg), "%s", msg);
        __atomic_store_n(&d->failed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&d->qlock);
    return first;
}

void loom_dev_fail(loom_dev_state_t *d, loomResult_t res, const char *msg)
{
    if (mark_failed(d, res, msg))
        loom_comm_set_async_error(d->comm, res, msg);
    release_all(d);
}

void loom_dev_comm_release(struct loomComm *c)
{
    loom_dev_state_t *d = c->dev; /* c->lock held: the teardown cannot free it meanwhile */
    if (d == NULL)
        return;
    char msg[160];
    snprintf(msg, sizeof(msg), "communicator %s was %s", c->name,
             __atomic_load_n(&c->revoked, __ATOMIC_ACQUIRE) ? "revoked" : "aborted");
    (void)mark_failed(d, loomRemoteError, msg); /* not an asynchronous error: the user did it */
    release_all(d);
}

void loom_dev_grave(loom_dev_state_t *d, void *pinned)
{
    pthread_mutex_lock(&d->evlock);
    if (d->ngrave == d->cap_grave) {
        int cap = d->cap_grave ? 2 * d->cap_grave : 8;
        void **g = realloc(d->graveyard, (size_t)cap * sizeof(*g));
        if (g != NULL) {
            d->graveyard = g;
            d->cap_grave = cap;
        }
    }
    if (d->ngrave < d->cap_grave)
        d->graveyard[d->ngrave++] = pinned; /* else leaked: never freed under a stream */
    pthread_mutex_unlock(&d->evlock);
}

// ---- teardown -----------------------------------------------------------------

/* Waits until the watchdog saw every live call complete, up to ms; 1 if it did. */
static int drain(loom_dev_state_t *d, int64_t ms)
{
    const uint64_t until = loom_now_ns() + (uint64_t)ms * 1000000ull;
    unsigned step = 0;
    for (;;) {
        pthread_mutex_lock(&d->qlock);
        const int empty = d->live_head == NULL;
        pthread_mutex_unlock(&d->qlock);
        if (empty)
            return 1;
        if (loom_now_ns() > until)
            return 0;
        loom_dev_backoff(&step);
    }
}

void loom_dev_comm_destroy(struct loomComm *c)
{
    loom_dev_state_t *d = c->dev;
    if (d == NULL)
        return;
    /* An abort released every wait already: what does not pass soon is held by other work of
     * its stream, which an abort does not wait for. */
    const int64_t bound = loom_dev_aborted(d) ? 2000 : d->dc.timeout_ms;
    if (d->threads && !drain(d, bound)) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "rank %d: communicator %s: device calls still queued at its teardown did not "
                 "complete within %lld ms",
                 c->rank, c->name, (long long)bound);
        loom_dev_fail(d, loomTimeout, msg);
        if (!drain(d, 2000)) {
            LOOM_WARN("rank %d: communicator %s: a device stream never passed its released "
                      "waits; the staging and flags it may touch are left allocated",
                      c->rank, c->name);
            d->leak = 1;
        }
    }
    loom_dev_threads_stop(d);
    loom_dev_call_release(d->last_direct);
    d->last_direct = NULL;
    close_all(d);
    if (!d->leak) {
        for (int i = 0; i < d->ngrave; i++)
            (void)d->rt->host_free(d->graveyard[i]);
        for (int i = 0; i < d->nev; i++)
            (void)d->rt->event_destroy(d->evs[i]);
        if (d->own_made)
            (void)d->rt->stream_destroy(d->own);
    }
    pthread_mutex_lock(&c->lock); /* an abort's release holds it while it uses d */
    c->dev = NULL;
    pthread_mutex_unlock(&c->lock);
    state_free(d);
}

// ---- the choice ---------------------------------------------------------------

/* The transport for one collective call a (index into tps), or -1; why says why. */
static int choose_coll(const loom_dev_state_t *d, const loom_coll_args_t *a, char *why,
                       size_t why_len)
{
    const loom_dev_comm_t *dc = &d->dc;
    char others[3 * (LOOM_DEV_WHY_BYTES + 48)] = "";
    size_t len = 0;
    why[0] = '\0';
    for (int i = 0; i < LOOM_DEVTP_NUM; i++) {
        if (!dc->tp_open[i]) {
            len += (size_t)snprintf(others + len, len < sizeof(others) ? sizeof(others) - len : 0,
                                    "%s%s not available: %s", len ? "; " : "", tp_names[i],
                                    dc->tp_why[i]);
        } else if (!d->tps[i]->handles(dc, dc->tp_state[i], a)) {
            len += (size_t)snprintf(others + len, len < sizeof(others) ? sizeof(others) - len : 0,
                                    "%s%s does not run %s of %s", len ? "; " : "", tp_names[i],
                                    loom_coll_name(a->kind), loom_dtype_name(a->dt));
        } else {
            if (i == LOOM_DEVTP_IPC)
                snprintf(why, why_len, "ipc: every rank on this host");
            else if (i == LOOM_DEVTP_NCCL)
                snprintf(why, why_len, "nccl: a real NCCL communicator moves the bytes%s%s",
                         len ? "; " : "", others);
            else
                snprintf(why, why_len, "staged: %s", len ? others : "the first transport");
            return i;
        }
    }
    snprintf(why, why_len, "%s", others);
    return -1;
}

int loom_dev_choose(loom_dev_state_t *d, const loom_task_t *t, char *why, size_t why_len)
{
    const loom_dev_comm_t *dc = &d->dc;
    if (t->nops == 1 && t->ops[0].kind == LOOM_OP_COLL)
        return choose_coll(d, &t->ops[0].coll, why, why_len);
    if (dc->tp_open[LOOM_DEVTP_STAGED]) {
        snprintf(why, why_len, "staged: a group, Send/Recv or Echo runs host-staged%s",
                 t->nops == 1 && t->ops[0].kind == LOOM_OP_ECHO
                     ? " (the 4-bit codec runs on the CPU)"
                     : "");
        return LOOM_DEVTP_STAGED;
    }
    snprintf(why, why_len, "a group, Send/Recv or Echo needs the staged transport: %s",
             dc->tp_why[LOOM_DEVTP_STAGED]);
    return -1;
}

const char *loom_dev_comm_plan(struct loomComm *c, const loom_coll_args_t *a, int *capturable,
                               char *why, size_t why_len)
{
    char buf[LOOM_DEV_WHY_BYTES * 4];
    if (why == NULL || why_len == 0) {
        why = buf;
        why_len = sizeof(buf);
    }
    *capturable = 0;
    const loom_dev_state_t *d = __atomic_load_n(&c->dev, __ATOMIC_ACQUIRE);
    if (d == NULL) {
        snprintf(why, why_len, "communicator %s has no device path: %s", c->name,
                 loom_dev_comm_why_none(c));
        return NULL;
    }
    const int i = choose_coll(d, a, why, why_len);
    if (i < 0)
        return NULL;
    *capturable = d->tps[i]->capturable;
    return tp_names[i];
}

const char *loom_dev_comm_why_none(struct loomComm *c)
{
    if (__atomic_load_n(&c->dev, __ATOMIC_ACQUIRE) != NULL)
        return "";
    if (c->dev_rt != NULL && c->dev_rt_absent >= 0) {
        static __thread char peer_why[96];
        snprintf(peer_why, sizeof(peer_why), "rank %d had no device runtime when it joined",
                 c->dev_rt_absent);
        return peer_why;
    }
    const char *why = loom_devrt_why_none();
    return why[0] != '\0' ? why
                          : "the process found its device runtime only after the communicator "
                            "was created";
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_staged.c - the host-staged device transport (devtp.h): any placement
 * of ranks, any task (every collective, the V collectives, groups of
 * Send/Recv, Echo, whose codec then runs on the CPU). Per call, on its stream s:
 *
 *   wait_u32(s, prev.freed)      only while the slot's previous user may still copy out
 *   memcpy_async  device inputs -> pinned staging
 *   write_u32(s, ready)          the stream reached the call: staging holds the inputs
 *   wait_u32(s, done)            the proxy ran the host collective on the staging
 *   memcpy_async  staging -> device outputs
 *   write_u32(s, freed)          the slot may be reused
 *
 * Host buffers of the call are not staged (the host collective uses them
 * where they are), so a call on host buffers given a device stream is
 * ordered on that stream with no copies. The flags are the call's own block
 * (dev_flags.h): every wait is "word >= 1" and release() stores
 * LOOM_DEV_FLAG_ABORT in the done and freed words of every live call, so no
 * wait of a stream outlasts an abort or a timeout.
 *
 * The proxy (dev_proxy.c, one thread per communicator) takes the calls in
 * ticket order, waits for a call's ready word (backing off, ending at an
 * abort or failure of the communicator's device path), runs
 * loom_task_execute on the staging pointers and stores done: 1, or
 * LOOM_DEV_FLAG_ABORT with the communicator's asynchronous error set when the
 * host collective failed. Never a host function on the stream: a host
 * function that blocks serialises the process's streams and can deadlock two
 * communicators issued in opposite orders.
 *
 * Staging: a ring of STAGED_SLOTS pinned buffers, grown to the largest call
 * that used them, so that consecutive calls pipeline (a call's copy-in
 * overlaps its predecessor's host collective). A slot is reused only after
 * its previous user's freed word: the next call's stream waits for it (on
 * the device, the issuing thread never blocks), so a copy-in can never
 * overwrite staging still being copied out. A buffer a call outgrows is
 * freed by the teardown (slots only double, so there are few): freeing
 * pinned memory waits for every stream of the device, which an issue must
 * never do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dev_state.h"
#include "staged_plan.h"
#include "timer.h"

#define STAGED_SLOTS    4
#define STAGED_MIN_SLOT (64u << 10) /* the smallest staging buffer allocated */

typedef struct {
    void *buf;
    size_t bytes;
    loom_dev_call_t *last; /* the slot's last user (a reference), NULL once it completed */
} staged_slot_t;

typedef struct {
    staged_slot_t slot[STAGED_SLOTS];
    unsigned next;
} staged_state_t;

static loom_dev_state_t *state_of(loom_dev_comm_t *dc)
{
    return (loom_dev_state_t *)dc; /* dc is the first member of the state */
}

static staged_state_t *staged_of(loom_dev_state_t *d)
{
    return d->dc.tp_state[LOOM_DEVTP_STAGED];
}

// ---- issue ------------------------------------------------------------------

loomResult_t loom_staged_prepare(loom_dev_state_t *d, loom_dev_call_t *call)
{
    LOOM_CHECK(loom_staged_plan(d->rt, &call->task, d->dc.rank, d->dc.nranks, &call->plan));
    call->xops = malloc((size_t)call->task.nops * sizeof(*call->xops));
    if (call->xops == NULL) {
        LOOM_WARN("rank %d: out of memory staging %d operations", d->dc.rank, call->task.nops);
        return loomSystemError;
    }
    return loomSuccess;
}

static int call_done(loom_dev_call_t *c)
{
    return __atomic_load_n(&c->completed, __ATOMIC_ACQUIRE) != 0;
}

loomResult_t loom_staged_reserve(loom_dev_state_t *d, loom_dev_call_t *call)
{
    if (call->plan == NULL) { /* host buffers only: flags, no staging */
        loom_staged_translate(NULL, &call->task, NULL, call->xops);
        return loomSuccess;
    }
    staged_state_t *st = staged_of(d);
    staged_slot_t *s = &st->slot[st->next % STAGED_SLOTS];
    const size_t need = call->plan->bytes;
    if (s->bytes < need) {
        size_t bytes = s->bytes < STAGED_MIN_SLOT ? STAGED_MIN_SLOT : s->bytes;
        while (bytes < need)
            bytes = bytes > SIZE_MAX / 2 ? need : 2 * bytes;
        void *buf = NULL;
        loomResult_t res = d->rt->host_alloc(&buf, bytes);
        if (res != loomSuccess) {
            LOOM_WARN("rank %d: cannot allocate %zu bytes of pinned staging for %s", d->dc.rank,
                      bytes, call->name);
            return res;
        }
        /* Not freed here: a free of pinned memory waits for every stream (it synchronizes
         * the device), which must never happen under the issue lock, nor hold up an issue. */
        if (s->buf != NULL)
            loom_dev_grave(d, s->buf);
        s->buf = buf;
        s->bytes = bytes;
    }
    st->next++;
    /* The slot's reference on its last user moves to this call while it may still copy out. */
    if (s->last != NULL && call_done(s->last)) {
        loom_dev_call_release(s->last);
        s->last = NULL;
    }
    call->slot_prev = s->last;
    __atomic_add_fetch(&call->refs, 1, __ATOMIC_ACQ_REL);
    s->last = call;
    call->stage = s->buf;
    loom_staged_translate(call->plan, &call->task, call->stage, call->xops);
    return loomSuccess;
}

loomResult_t loom_staged_queue(loom_dev_state_t *d, loom_dev_call_t *call, loom_dev_stream_t ds)
{
    const loom_devrt_t *rt = d->rt;
    const loom_staged_plan_t *plan = call->plan;
    char *stage = call->stage;
    uint32_t *fl = call->fl.dev;
    if (call->slot_prev != NULL)
        LOOM_CHECK(rt->wait_u32(ds, call->slot_prev->fl.dev + LOOM_DEV_F_FREED, 1));
    for (int i = 0; plan != NULL && i < plan->n; i++)
        if (plan->ext[i].in)
            LOOM_CHECK(rt->memcpy_async(stage + plan->ext[i].off, (void *)plan->ext[i].base,
                                        plan->ext[i].len, ds));
    LOOM_CHECK(rt->write_u32(ds, fl + LOOM_DEV_F_READY, 1));
    LOOM_CHECK(rt->wait_u32(ds, fl + LOOM_DEV_F_DONE, 1));
    for (int i = 0; plan != NULL && i < plan->n; i++)
        if (plan->ext[i].out)
            LOOM_CHECK(rt->memcpy_async((void *)plan->ext[i].base, stage + plan->ext[i].off,
                                        plan->ext[i].len, ds));
    if (plan != NULL)
        LOOM_CHECK(rt->write_u32(ds, fl + LOOM_DEV_F_FREED, 1));
    return loomSuccess;
}

void loom_staged_call_free(loom_dev_state_t *d, loom_dev_call_t *call)
{
    free(call->xops);
    call->xops = NULL;
    free(call->plan);
    call->plan = NULL;
    (void)d;
}

// ---- the proxy's part ---------------------------------------------------------

/* Waits for the stream to reach the call; 0 if the device path failed or the
 * communicator aborted first. */
static int wait_ready(loom_dev_state_t *d, loom_dev_call_t *call)
{
    unsigned step = 0;
    while (loom_dev_flag_load(&call->fl, LOOM_DEV_F_READY) == 0) {
        if (loom_dev_aborted(d) || loom_dev_failed(d))
            return 0;
        loom_dev_backoff(&step);
    }
    return !loom_dev_failed(d);
}

void loom_staged_proxy(loom_dev_state_t *d, loom_dev_call_t *call)
{
    loomResult_t res;
    loom_clear_last_error();
    if (wait_ready(d, call)) {
        __atomic_store_n(&call->phase_ns, loom_now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&call->phase, LOOM_DEV_PH_EXECUTING, __ATOMIC_RELEASE);
        loom_task_t xt = call->task; /* the same task on the staging pointers */
        xt.ops = call->xops;
        res = loom_task_execute(&xt);
    } else if (loom_dev_aborted(d)) {
        res = loom_task_execute(&call->task); /* runs nothing: gives the abort's result */
    } else {
        /* The device path failed (a timeout, a device error): the call is not run, but its
         * turn passes so that the communicator's later work is not held up. */
        pthread_mutex_lock(&d->qlock);
        res = d->fail_res;
        loom_set_last_error("%s: not run: %s", call->name, d->fail_msg);
        pthread_mutex_unlock(&d->qlock);
        loom_task_skip(&call->task);
    }
    call->result = res;
    if (res != loomSuccess) {
        snprintf(call->msg, sizeof(call->msg), "%s", loom_last_error());
        if (!loom_dev_aborted(d))
            loom_comm_set_async_error(d->comm, res, call->msg);
        if (call->wrap != NULL)
            loom_dev_wrap_note_error(call->wrap, res, call->msg);
    }
    __atomic_store_n(&call->proxied, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&call->phase_ns, loom_now_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&call->phase, LOOM_DEV_PH_RELEASED, __ATOMIC_RELEASE);
    loom_dev_flag_store(&call->fl, LOOM_DEV_F_DONE, res == loomSuccess ? 1u : LOOM_DEV_FLAG_ABORT);
}

void loom_staged_release_calls(loom_dev_state_t *d)
{
    pthread_mutex_lock(&d->qlock);
    for (loom_dev_call_t *c = d->live_head; c != NULL; c = c->live_next) {
        if (c->tp != LOOM_DEVTP_STAGED || c->fl.host == NULL)
            continue;
        loom_dev_flag_store(&c->fl, LOOM_DEV_F_DONE, LOOM_DEV_FLAG_ABORT);
        loom_dev_flag_store(&c->fl, LOOM_DEV_F_FREED, LOOM_DEV_FLAG_ABORT);
    }
    pthread_mutex_unlock(&d->qlock);
}

// ---- the table --------------------------------------------------------------

static loomResult_t staged_open(loom_dev_comm_t *dc, void **state, char *why, size_t why_len)
{
    if (!dc->rt->memops_ok(why, why_len))
        return loomUnhandledDeviceError; /* the stream cannot meet the proxy on flag words */
    staged_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        snprintf(why, why_len, "out of memory");
        return loomSystemError;
    }
    *state = st;
    return loomSuccess;
}

static void staged_close(loom_dev_comm_t *dc, void *state)
{
    loom_dev_state_t *d = state_of(dc);
    staged_state_t *st = state;
    for (int i = 0; st != NULL && i < STAGED_SLOTS; i++) {
        if (st->slot[i].last != NULL)
            loom_dev_call_release(st->slot[i].last);
        if (st->slot[i].buf != NULL && !d->leak)
            (void)d->rt->host_free(st->slot[i].buf);
    }
    free(st);
}

static int staged_handles(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call)
{
    (void)dc;
    (void)state;
    return call->kind >= 0 && call->kind < LOOM_COLL_NUM; /* loom's host path runs them all */
}

/* Copies the arrays a V collective points at into one allocation the operation
 * owns, as coll_api.c records them (the caller's may go once this returns). */
static loomResult_t own_arrays(loom_coll_args_t *a, int n)
{
    const int all4 = a->kind == LOOM_COLL_ALLTOALLV;
    if (!all4 && a->kind != LOOM_COLL_ALLGATHERV && a->kind != LOOM_COLL_REDUCE_SCATTERV)
        return loomSuccess;
    const size_t un = (size_t)n, k = all4 ? 4 : 2;
    size_t *v = malloc(k * un * sizeof(size_t));
    if (v == NULL) {
        LOOM_WARN("out of memory copying %d counts of a device call", n);
        return loomSystemError;
    }
    if (all4) {
        memcpy(v, a->sendcounts, un * sizeof(size_t));
        memcpy(v + un, a->sdispls, un * sizeof(size_t));
        a->sendcounts = v;
        a->sdispls = v + un;
        v += 2 * un;
    }
    memcpy(v, a->recvcounts, un * sizeof(size_t));
    memcpy(v + un, a->rdispls, un * sizeof(size_t));
    a->recvcounts = v;
    a->rdispls = v + un;
    return loomSuccess;
}

/* The table's run: one collective queued on the device stream s as the
 * communicator's next device call (it takes the next ticket). */
static loomResult_t staged_run(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                               loom_dev_stream_t s)
{
    (void)state;
    loom_dev_state_t *d = state_of(dc);
    loom_task_t t;
    memset(&t, 0, sizeof(t));
    t.comm = d->comm;
    t.first.kind = LOOM_OP_COLL;
    t.first.coll = *call;
    t.ops = &t.first;
    t.nops = t.cap = 1;
    LOOM_CHECK(own_arrays(&t.first.coll, dc->nranks));
    __atomic_add_fetch(&d->comm->refs, 1, __ATOMIC_SEQ_CST); /* the call's, as a queued task's */
    loom_dev_call_t *c = NULL;
    LOOM_CHECK(loom_dev_issue(d, &t, LOOM_DEV_RAW, NULL, s, &c));
    loom_dev_call_release(c);
    return loomSuccess;
}

static void staged_release(loom_dev_comm_t *dc, void *state)
{
    (void)state;
    loom_staged_release_calls(state_of(dc));
}

const loom_devtp_t loom_devtp_staged = {
    .name = "staged",
    .capturable = 0,
    .open = staged_open,
    .close = staged_close,
    .handles = staged_handles,
    .run = staged_run,
    .release = staged_release,
};

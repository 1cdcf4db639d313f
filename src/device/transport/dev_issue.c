/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_issue.c - how a device task is issued (dev_comm.h): the test that
 * makes a task a device task, the call that carries it, and the issue
 * itself. Everything that can fail without a trace on the other ranks (no
 * transport, a capture the choice refuses, memory, flags, staging) is done
 * before the ticket is taken; from the ticket on, the call is the
 * communicator's and reaches the proxy whatever happens, so its turn always
 * passes. A failure to queue device work after the ticket fails the device
 * path (dev_comm.c: the asynchronous error, every wait released).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dev_state.h"
#include "dtype.h"
#include "timer.h"

// ---- which tasks are device tasks ----------------------------------------------

int loom_dev_op_on_device(const loom_dev_state_t *d, const loom_op_t *op)
{
    return loom_dev_op_on_device_rt(d->rt, op);
}

int loom_dev_op_on_device_rt(const loom_devrt_t *rt, const loom_op_t *op)
{
    int (*const dev)(const void *) = rt->ptr_device; /* -1 for host memory and NULL */
    switch (op->kind) {
    case LOOM_OP_COLL:
        return dev(op->coll.sendbuff) >= 0 || dev(op->coll.recvbuff) >= 0;
    case LOOM_OP_SEND:
        return dev(op->sendbuff) >= 0;
    case LOOM_OP_RECV:
        return dev(op->recvbuff) >= 0;
    case LOOM_OP_ECHO:
        return dev(op->echo.sendbuff) >= 0 || dev(op->echo.recvbuff) >= 0;
    }
    return 0;
}

loomResult_t loom_dev_refuse_op(struct loomComm *c)
{
    LOOM_WARN("rank %d: device memory given to communicator %s, which has no device path: %s; "
              "create communicators after CUDA has started on every rank (docs/gpu.md)",
              c->rank, c->name, loom_dev_comm_why_none(c));
    return loomInvalidUsage;
}

int loom_dev_task_on_device(const loom_dev_state_t *d, const loom_task_t *t)
{
    for (int i = 0; i < t->nops; i++)
        if (loom_dev_op_on_device(d, &t->ops[i]))
            return 1;
    return 0;
}

// ---- calls ------------------------------------------------------------------

/* A new call holding t's operations and t's reference on its communicator (t
 * is left empty); NULL if out of memory (t untouched). */
static loom_dev_call_t *call_new(loom_dev_state_t *d, loom_task_t *t)
{
    loom_dev_call_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("rank %d: out of memory issuing a device call", d->dc.rank);
        return NULL;
    }
    c->d = d;
    c->refs = 1;
    c->task = *t;
    if (t->ops == &t->first)
        c->task.ops = &c->task.first;
    c->task.next = NULL;
    c->task.stream = NULL;
    c->task.dev_call = NULL;
    t->ops = NULL;
    t->nops = t->cap = 0;
    return c;
}

static void event_put(loom_dev_state_t *d, loom_dev_event_t ev)
{
    pthread_mutex_lock(&d->evlock);
    if (d->nev == d->cap_ev) {
        int cap = d->cap_ev ? 2 * d->cap_ev : 16;
        loom_dev_event_t *evs = realloc(d->evs, (size_t)cap * sizeof(*evs));
        if (evs != NULL) {
            d->evs = evs;
            d->cap_ev = cap;
        }
    }
    const int kept = d->nev < d->cap_ev;
    if (kept)
        d->evs[d->nev++] = ev;
    pthread_mutex_unlock(&d->evlock);
    if (!kept)
        (void)d->rt->event_destroy(ev);
}

static loomResult_t event_get(loom_dev_state_t *d, loom_dev_event_t *ev)
{
    pthread_mutex_lock(&d->evlock);
    *ev = d->nev > 0 ? d->evs[--d->nev] : NULL;
    pthread_mutex_unlock(&d->evlock);
    return *ev != NULL ? loomSuccess : d->rt->event_create(ev);
}

static void call_free(loom_dev_call_t *c)
{
    loom_dev_state_t *d = c->d;
    if (!c->task_gone)
        loom_task_release(&c->task);
    if (c->tp == LOOM_DEVTP_STAGED)
        loom_staged_call_free(d, c);
    if (c->slot_prev != NULL)
        loom_dev_call_release(c->slot_prev);
    if (!d->leak) /* a stream that never finished may still touch them */
        loom_dev_flags_put(&c->fl);
    if (c->ev != NULL && !d->leak)
        event_put(d, c->ev);
    if (c->stream != NULL)
        loom_stream_release(c->stream);
    free(c);
}

void loom_dev_call_release(loom_dev_call_t *c)
{
    if (c != NULL && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        call_free(c);
}

void loom_dev_call_completed(loom_dev_call_t *c)
{
    __atomic_store_n(&c->completed, 1, __ATOMIC_RELEASE);
    loom_dev_call_t *prev = c->slot_prev; /* its wait on prev's freed word has passed */
    c->slot_prev = NULL;
    loom_dev_call_release(prev);
}

loomResult_t loom_dev_own_stream(loom_dev_state_t *d, loom_dev_stream_t *s)
{
    if (!d->own_made) {
        LOOM_CHECK(d->rt->stream_create(&d->own));
        d->own_made = 1;
    }
    *s = d->own;
    return loomSuccess;
}

// ---- naming -------------------------------------------------------------------

/* "allreduce", "echo", "group of 4 operations": what the call is, for messages (the
 * collectives by loom_coll_name, as loom's other traces name them). */
static void task_kind(const loom_task_t *t, char *buf, size_t len)
{
    if (t->nops == 1 && t->ops[0].kind == LOOM_OP_COLL)
        snprintf(buf, len, "%s", loom_coll_name(t->ops[0].coll.kind));
    else if (t->nops == 1 && t->ops[0].kind == LOOM_OP_ECHO)
        snprintf(buf, len, "echo");
    else if (t->nops == 1)
        snprintf(buf, len, "%s", t->ops[0].kind == LOOM_OP_SEND ? "send" : "recv");
    else
        snprintf(buf, len, "group of %d operations", t->nops);
}

/* Bytes this rank sends or receives at most, for the trace. */
static size_t task_bytes(const loom_task_t *t, int nranks)
{
    size_t b = 0;
    for (int i = 0; i < t->nops; i++) {
        const loom_op_t *op = &t->ops[i];
        if (op->kind == LOOM_OP_COLL)
            b += loom_coll_bytes(&op->coll, nranks);
        else if (op->kind == LOOM_OP_ECHO)
            b += op->echo.count * loom_dtype_size(op->echo.dt);
        else
            b += op->nbytes;
    }
    return b;
}

static const char *mode_name(loom_dev_mode_t m)
{
    switch (m) {
    case LOOM_DEV_WAIT:
        return "the communicator's stream (NULL stream)";
    case LOOM_DEV_GATED:
        return "the communicator's stream (a loom stream's turn)";
    case LOOM_DEV_WRAPPED:
        return "a wrapped device stream";
    default:
        return "a device stream";
    }
}

// ---- issue --------------------------------------------------------------------

/* Why a call is refused once the device path failed. */
static loomResult_t refused(loom_dev_state_t *d, const char *kind)
{
    pthread_mutex_lock(&d->qlock);
    const loomResult_t res = d->fail_res != loomSuccess ? d->fail_res : loomRemoteError;
    LOOM_WARN("rank %d: %s on communicator %s refused: the communicator's device path "
              "failed earlier: %s",
              d->dc.rank, kind, d->comm->name, d->fail_msg);
    pthread_mutex_unlock(&d->qlock);
    return res;
}

/* The part of an issue before the ticket: transport, capture, resources. */
static loomResult_t issue_prepare(loom_dev_state_t *d, loom_dev_call_t *c, loom_dev_mode_t mode,
                                  loom_dev_stream_t ds, char *why, size_t why_len, const char *kind)
{
    const loom_devrt_t *rt = d->rt;
    if (loom_dev_failed(d))
        return refused(d, kind);
    c->tp = loom_dev_choose(d, &c->task, why, why_len);
    if (c->tp < 0) {
        LOOM_WARN("rank %d: no device transport runs %s on communicator %s: %s", d->dc.rank, kind,
                  d->comm->name, why);
        return loomInvalidUsage;
    }
    int capturing = 0;
    if (mode == LOOM_DEV_WRAPPED || mode == LOOM_DEV_RAW)
        LOOM_CHECK(rt->stream_capturing(ds, &capturing));
    if (capturing && !d->tps[c->tp]->capturable) {
        LOOM_WARN("host-staged device calls cannot be captured into a CUDA graph: %s on "
                  "communicator %s (rank %d) would run on the %s transport (%s); issue it "
                  "outside the capture, or let a capturable transport (ipc, nccl) run it",
                  kind, d->comm->name, d->dc.rank, d->tps[c->tp]->name, why);
        return loomInvalidUsage;
    }
    if (!capturing) /* a graph would replay writes to words that serve other calls by then */
        LOOM_CHECK(loom_dev_flags_get(rt, &c->fl));
    if (!capturing)
        LOOM_CHECK(event_get(d, &c->ev));
    if (c->tp == LOOM_DEVTP_STAGED)
        LOOM_CHECK(loom_staged_prepare(d, c));
    return loom_dev_threads_start(d);
}

/* A call of a transport other than staged waits for the previous such call of the
 * communicator when that one is on another stream and may still run: their device work
 * (the ipc transport's flags, say) must not interleave, as the calls of one NCCL
 * communicator do not (under d->lock). */
static void order_direct(loom_dev_state_t *d, loom_dev_call_t *c, loom_dev_stream_t ds)
{
    loom_dev_call_t *prev = d->last_direct;
    d->last_direct = NULL;
    if (prev != NULL && d->last_direct_stream != ds &&
        !__atomic_load_n(&prev->completed, __ATOMIC_ACQUIRE) && c->fl.host != NULL)
        c->slot_prev = prev; /* the reference moves to the call */
    else
        loom_dev_call_release(prev);
    if (c->fl.host != NULL) { /* not while capturing: the graph orders its own work */
        __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
        d->last_direct = c;
        d->last_direct_stream = ds;
    }
}

/* Queues the call's device work on ds (under d->lock, ticket taken). */
static loomResult_t issue_queue(loom_dev_state_t *d, loom_dev_call_t *c, loom_dev_stream_t ds)
{
    const loom_devrt_t *rt = d->rt;
    if (c->mode == LOOM_DEV_GATED)
        LOOM_CHECK(rt->wait_u32(ds, c->fl.dev + LOOM_DEV_F_GATE, 1));
    if (c->tp == LOOM_DEVTP_STAGED) {
        LOOM_CHECK(loom_staged_queue(d, c, ds));
    } else {
        order_direct(d, c, ds);
        if (c->slot_prev != NULL)
            LOOM_CHECK(rt->wait_u32(ds, c->slot_prev->fl.dev + LOOM_DEV_F_FREED, 1));
        LOOM_CHECK(d->tps[c->tp]->run(&d->dc, d->dc.tp_state[c->tp], &c->task.ops[0].coll, ds));
        if (c->fl.host != NULL)
            LOOM_CHECK(rt->write_u32(ds, c->fl.dev + LOOM_DEV_F_FREED, 1));
    }
    if (c->ev != NULL)
        LOOM_CHECK(rt->event_record(c->ev, ds));
    if (c->wrap != NULL)
        LOOM_CHECK(loom_dev_wrap_mark(c->wrap));
    return loomSuccess;
}

loomResult_t loom_dev_issue(loom_dev_state_t *d, loom_task_t *t, loom_dev_mode_t mode,
                            loomStream_t ls, loom_dev_stream_t ds, loom_dev_call_t **call_p)
{
    *call_p = NULL;
    loom_dev_call_t *c = call_new(d, t);
    if (c == NULL) {
        loom_task_release(t);
        return loomSystemError;
    }
    c->mode = mode;
    c->tp = -1;
    if (ls != NULL) {
        loom_stream_retain(ls);
        c->stream = ls;
        c->wrap = loom_stream_wrap(ls);
    }
    char kind[48], why[3 * LOOM_DEV_WHY_BYTES] = "";
    task_kind(&c->task, kind, sizeof(kind));
    /* Now: once queued, the proxy may let go of the operations at any time. */
    const size_t bytes = d->trace ? task_bytes(&c->task, d->dc.nranks) : 0;
    loomResult_t res = issue_prepare(d, c, mode, ds, why, sizeof(why), kind);
    if (res != loomSuccess)
        goto fail;
    pthread_mutex_lock(&d->lock);
    if (loom_dev_failed(d)) {
        pthread_mutex_unlock(&d->lock);
        res = refused(d, kind);
        goto fail;
    }
    if (mode == LOOM_DEV_WAIT || mode == LOOM_DEV_GATED)
        res = loom_dev_own_stream(d, &ds);
    if (res == loomSuccess && c->tp == LOOM_DEVTP_STAGED)
        res = loom_staged_reserve(d, c);
    if (res != loomSuccess) {
        pthread_mutex_unlock(&d->lock);
        goto fail;
    }
    /* From here on the call is the communicator's: its ticket, in issue order. */
    c->task.ticket = __atomic_fetch_add(&d->comm->next_ticket, 1, __ATOMIC_SEQ_CST);
    c->seq = ++d->next_seq;
    snprintf(c->name, sizeof(c->name), "%s #%llu", kind, (unsigned long long)c->seq);
    const loomResult_t qres = issue_queue(d, c, ds);
    char qmsg[256] = "";
    if (qres != loomSuccess)
        snprintf(qmsg, sizeof(qmsg), "%s", loom_last_error());
    c->phase = LOOM_DEV_PH_QUEUED;
    c->phase_ns = loom_now_ns();
    __atomic_add_fetch(&c->refs, c->ev != NULL ? 2 : 1, __ATOMIC_ACQ_REL); /* proxy, watchdog */
    pthread_mutex_lock(&d->qlock);
    if (d->fifo_tail)
        d->fifo_tail->fifo_next = c;
    else
        d->fifo_head = c;
    d->fifo_tail = c;
    if (c->ev != NULL) {
        if (d->live_tail)
            d->live_tail->live_next = c;
        else
            d->live_head = c;
        d->live_tail = c;
    }
    /* A release that ran while this call was queued did not see it in the live list. */
    if (loom_dev_failed(d))
        loom_dev_call_abort_words(c);
    pthread_cond_signal(&d->work);
    pthread_cond_signal(&d->wd);
    pthread_mutex_unlock(&d->qlock);
    pthread_mutex_unlock(&d->lock);
    if (qres != loomSuccess) {
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "rank %d: %s on communicator %s could not be queued on its device stream: %s",
                 d->dc.rank, c->name, d->comm->name, qmsg);
        loom_dev_fail(d, qres, msg);
    }
    if (d->trace)
        LOOM_INFO(LOOM_LOG_COLL | LOOM_LOG_DEVICE, "device %s: %zu bytes on %s, transport %s",
                  c->name, bytes, mode_name(mode), why);
    *call_p = c;
    return loomSuccess;
fail:
    loom_dev_call_release(c);
    return res;
}

// ---- the entry points ----------------------------------------------------------

static loomResult_t no_state(struct loomComm *c)
{
    LOOM_WARN("rank %d: communicator %s has no device state (it was made when this process "
              "had no device runtime: %s), so it cannot run calls on device memory or a device "
              "stream",
              c->rank, c->name, loom_devrt_why_none());
    return loomInvalidUsage;
}

loomResult_t loom_dev_submit_op(struct loomComm *c, loom_op_t *op, loomStream_t s)
{
    if (c->dev == NULL) {
        loom_op_release(op);
        return no_state(c);
    }
    loom_task_t t;
    memset(&t, 0, sizeof(t));
    t.comm = c;
    t.first = *op;
    t.ops = &t.first;
    t.nops = t.cap = 1;
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_SEQ_CST); /* the call's, as a queued task's */
    loom_dev_call_t *call;
    const loom_dev_mode_t mode = s != NULL ? LOOM_DEV_WRAPPED : LOOM_DEV_WAIT;
    loom_dev_stream_t ds = s != NULL ? loom_dev_wrap_stream(loom_stream_wrap(s)) : NULL;
    LOOM_CHECK(loom_dev_issue(c->dev, &t, mode, s, ds, &call));
    if (mode == LOOM_DEV_WAIT)
        return loom_dev_call_wait(call);
    loom_dev_call_release(call);
    return loomSuccess;
}

loomResult_t loom_dev_submit_task(loom_task_t *t, loomStream_t s, loom_dev_call_t **wait_p)
{
    struct loomComm *c = t->comm;
    if (c->dev == NULL) {
        loom_task_free(t);
        return no_state(c);
    }
    loom_dev_call_t *call;
    const loom_dev_mode_t mode = s != NULL ? LOOM_DEV_WRAPPED : LOOM_DEV_WAIT;
    loom_dev_stream_t ds = s != NULL ? loom_dev_wrap_stream(loom_stream_wrap(s)) : NULL;
    loomResult_t res = loom_dev_issue(c->dev, t, mode, s, ds, &call);
    free(t); /* emptied by the issue */
    if (res != loomSuccess)
        return res;
    if (mode == LOOM_DEV_WAIT)
        *wait_p = call;
    else
        loom_dev_call_release(call);
    return loomSuccess;
}

loomResult_t loom_dev_call_wait(loom_dev_call_t *call)
{
    loomResult_t res = loom_dev_poll_complete(call->d, call);
    loom_dev_call_release(call);
    return res;
}

loomResult_t loom_dev_issue_gated(loom_task_t *t)
{
    struct loomComm *c = t->comm;
    loom_task_t m = *t;
    if (t->ops == &t->first)
        m.ops = &m.first;
    t->ops = NULL;
    t->nops = t->cap = 0;
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_SEQ_CST); /* the call's; t keeps its own */
    if (c->dev == NULL) {
        loom_task_release(&m);
        return no_state(c);
    }
    loom_dev_call_t *call;
    LOOM_CHECK(loom_dev_issue(c->dev, &m, LOOM_DEV_GATED, NULL, NULL, &call));
    t->dev_call = call;
    return loomSuccess;
}

loomResult_t loom_dev_gate_run(loom_task_t *t)
{
    loom_dev_call_t *call = t->dev_call;
    t->dev_call = NULL;
    loom_dev_flag_store(&call->fl, LOOM_DEV_F_GATE, 1);
    return loom_dev_call_wait(call);
}

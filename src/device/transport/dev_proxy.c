/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_proxy.c - the two threads of a communicator's device state, started
 * with its first device call, and the waits for a call's completion.
 *
 * The proxy takes the issued calls in ticket order: a staged call's host
 * side (devtp_staged.c); for a call of another transport only the passing of
 * its turn, so that the communicator's host tasks after it keep their order.
 * It then lets go of the call's operations and of the communicator, which is
 * what a destroy waits for.
 *
 * The watchdog polls the event recorded after each live call. A call seen
 * complete leaves the list (what waited on it lets go); the oldest live call
 * not in the proxy's hands (its host collective has timeouts of its own)
 * that made no progress for the communicator's timeout fails the device
 * path: loomTimeout naming the call as the asynchronous error, and every
 * transport's release(), so that no stream stays blocked on it. Its clock
 * for a call starts when the call entered its phase or the previous call
 * completed, whichever is later, so a long queue of calls is not one timeout.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dev_state.h"
#include "timer.h"

#define NAP_MIN_US    100
#define NAP_MAX_US    5000
#define WAIT_GRACE_NS 1000000000ull /* a waiter's patience once the call was released */

void loom_dev_backoff(unsigned *step)
{
    const unsigned s = (*step)++;
    if (s < 64) {
        sched_yield();
        return;
    }
    const unsigned shift = (s - 64) / 16;
    const long us = 1L << (shift < 10 ? shift : 10); /* 1 us doubling every 16 steps to 1 ms */
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

// ---- the proxy ----------------------------------------------------------------

static void *proxy_main(void *arg)
{
    loom_dev_state_t *d = arg;
    loom_debug_set_rank(d->dc.rank);
    pthread_mutex_lock(&d->qlock);
    for (;;) {
        while (d->fifo_head == NULL && !d->stop)
            pthread_cond_wait(&d->work, &d->qlock);
        loom_dev_call_t *c = d->fifo_head;
        if (c == NULL)
            break;
        d->fifo_head = c->fifo_next;
        if (d->fifo_head == NULL)
            d->fifo_tail = NULL;
        pthread_mutex_unlock(&d->qlock);
        if (c->tp == LOOM_DEVTP_STAGED) {
            loom_staged_proxy(d, c);
        } else {
            loom_task_skip(&c->task); /* its turn passes: the work is on the device */
            __atomic_store_n(&c->proxied, 1, __ATOMIC_RELEASE);
        }
        loom_task_release(&c->task); /* the operations and the communicator */
        c->task_gone = 1;
        loom_dev_call_release(c);
        pthread_mutex_lock(&d->qlock);
    }
    pthread_mutex_unlock(&d->qlock);
    return NULL;
}

// ---- the watchdog ---------------------------------------------------------------

/* Sleeps up to us microseconds on d->wd (d->qlock held), woken by an issue or the stop. */
static void nap(loom_dev_state_t *d, unsigned us)
{
    const struct timespec until = loom_clock_in_us(CLOCK_MONOTONIC, (long)us);
    pthread_cond_timedwait(&d->wd, &d->qlock, &until);
}

typedef struct {
    loom_dev_call_t *done; /* completed calls taken off the live list */
    loom_dev_call_t *late; /* the oldest call, timed out (a reference), or NULL */
    loomResult_t dev_err;  /* an event's error */
    char dev_name[64];
} sweep_t;

/* One look at the live calls (d->qlock held). */
static void sweep(loom_dev_state_t *d, sweep_t *w)
{
    loom_dev_call_t *prev = NULL, *c = d->live_head;
    while (c != NULL) {
        loom_dev_call_t *next = c->live_next;
        const loomResult_t q = d->rt->event_query(c->ev);
        if (q == loomInProgress) {
            prev = c;
        } else {
            if (prev)
                prev->live_next = next;
            else
                d->live_head = next;
            if (d->live_tail == c)
                d->live_tail = prev;
            c->live_next = w->done;
            w->done = c;
            if (q != loomSuccess && w->dev_err == loomSuccess) {
                w->dev_err = q;
                snprintf(w->dev_name, sizeof(w->dev_name), "%s", c->name);
            }
        }
        c = next;
    }
    const uint64_t now = loom_now_ns();
    if (w->done != NULL)
        d->last_done_ns = now;
    loom_dev_call_t *old = d->live_head;
    if (old == NULL || loom_dev_failed(d) ||
        __atomic_load_n(&old->phase, __ATOMIC_ACQUIRE) == LOOM_DEV_PH_EXECUTING)
        return;
    uint64_t since = __atomic_load_n(&old->phase_ns, __ATOMIC_RELAXED);
    if (d->last_done_ns > since)
        since = d->last_done_ns;
    /* since may be later than now: the proxy moves a call's phase while this looks. */
    if (now > since && now - since > (uint64_t)d->dc.timeout_ms * 1000000ull) {
        __atomic_add_fetch(&old->refs, 1, __ATOMIC_ACQ_REL);
        w->late = old;
    }
}

static void *watchdog_main(void *arg)
{
    loom_dev_state_t *d = arg;
    loom_debug_set_rank(d->dc.rank);
    unsigned us = NAP_MIN_US;
    pthread_mutex_lock(&d->qlock);
    while (!d->stop) {
        if (d->live_head == NULL) {
            pthread_cond_wait(&d->wd, &d->qlock);
            us = NAP_MIN_US;
            continue;
        }
        sweep_t w = {.done = NULL, .late = NULL, .dev_err = loomSuccess};
        sweep(d, &w);
        pthread_mutex_unlock(&d->qlock);
        us = w.done != NULL ? NAP_MIN_US : (us * 2 > NAP_MAX_US ? NAP_MAX_US : us * 2);
        while (w.done != NULL) {
            loom_dev_call_t *c = w.done;
            w.done = c->live_next;
            loom_dev_call_completed(c);
            loom_dev_call_release(c); /* the watchdog's */
        }
        char msg[512];
        if (w.dev_err != loomSuccess) {
            snprintf(msg, sizeof(msg),
                     "rank %d: device call %s on communicator %s failed on its "
                     "stream: %s",
                     d->dc.rank, w.dev_name, d->comm->name, loom_last_error());
            loom_dev_fail(d, w.dev_err, msg);
        }
        if (w.late != NULL) {
            snprintf(msg, sizeof(msg),
                     "rank %d: device call %s on communicator %s made no progress for %lld ms "
                     "(its stream did not reach it, or its peers did not take part): timed out; "
                     "the communicator's device streams are released",
                     d->dc.rank, w.late->name, d->comm->name, (long long)d->dc.timeout_ms);
            LOOM_WARN("%s", msg);
            loom_dev_fail(d, loomTimeout, msg);
            if (w.late->wrap != NULL)
                loom_dev_wrap_note_error(w.late->wrap, loomTimeout, msg);
            loom_dev_call_release(w.late);
        }
        pthread_mutex_lock(&d->qlock);
        if (!d->stop)
            nap(d, us);
    }
    pthread_mutex_unlock(&d->qlock);
    return NULL;
}

// ---- start and stop -----------------------------------------------------------

loomResult_t loom_dev_threads_start(loom_dev_state_t *d)
{
    if (__atomic_load_n(&d->threads, __ATOMIC_ACQUIRE))
        return loomSuccess;
    loomResult_t res = loomSuccess;
    pthread_mutex_lock(&d->start_lock);
    if (!d->threads) {
        int err = pthread_create(&d->proxy, NULL, proxy_main, d);
        if (err == 0 && (err = pthread_create(&d->watchdog, NULL, watchdog_main, d)) != 0) {
            pthread_mutex_lock(&d->qlock);
            d->stop = 1;
            pthread_cond_broadcast(&d->work);
            pthread_mutex_unlock(&d->qlock);
            pthread_join(d->proxy, NULL);
            d->stop = 0;
        }
        if (err != 0) {
            LOOM_WARN("rank %d: cannot start the device threads of communicator %s: %s", d->dc.rank,
                      d->comm->name, strerror(err));
            res = loomSystemError;
        } else {
            __atomic_store_n(&d->threads, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&d->start_lock);
    return res;
}

void loom_dev_threads_stop(loom_dev_state_t *d)
{
    if (!d->threads)
        return;
    pthread_mutex_lock(&d->qlock);
    d->stop = 1;
    pthread_cond_broadcast(&d->work);
    pthread_cond_broadcast(&d->wd);
    pthread_mutex_unlock(&d->qlock);
    pthread_join(d->proxy, NULL);
    pthread_join(d->watchdog, NULL);
    d->threads = 0;
}

// ---- waits --------------------------------------------------------------------

loomResult_t loom_dev_poll_complete(loom_dev_state_t *d, loom_dev_call_t *c)
{
    const uint64_t t0 = loom_now_ns();
    const uint64_t limit = (uint64_t)d->dc.timeout_ms * 1000000ull + WAIT_GRACE_NS;
    uint64_t t_released = 0;
    unsigned step = 0;
    loomResult_t q = loomInProgress;
    for (;;) {
        if (__atomic_load_n(&c->completed, __ATOMIC_ACQUIRE)) {
            q = loomSuccess;
            break;
        }
        if ((q = d->rt->event_query(c->ev)) != loomInProgress)
            break;
        const uint64_t now = loom_now_ns();
        if (loom_dev_aborted(d) || loom_dev_failed(d)) {
            /* Released: the stream passes its waits at once; if it does not (its own earlier
             * work hangs), give up on it after a grace. */
            if (t_released == 0)
                t_released = now;
            else if (now - t_released > WAIT_GRACE_NS)
                break;
        } else if (now - t0 > limit) {
            break; /* the watchdog fails the device path first; this is the backstop */
        }
        loom_dev_backoff(&step);
    }
    if (q != loomSuccess && q != loomInProgress)
        return q; /* the stream failed: the runtime's error is the last error */
    /* The proxy stores done after the result; a stream that passed done without it was
     * released (an abort or a failure, reported below). */
    if (c->tp == LOOM_DEVTP_STAGED && q == loomSuccess &&
        __atomic_load_n(&c->proxied, __ATOMIC_ACQUIRE)) {
        if (c->result != loomSuccess)
            loom_set_last_error("%s", c->msg);
        return c->result;
    }
    if (loom_dev_aborted(d)) {
        loom_set_last_error("rank %d: %s on communicator %s: the communicator was aborted",
                            d->dc.rank, c->name, d->comm->name);
        return loomRemoteError;
    }
    if (loom_dev_failed(d) || q == loomInProgress) {
        pthread_mutex_lock(&d->qlock);
        loomResult_t res = d->fail_res != loomSuccess ? d->fail_res : loomTimeout;
        loom_set_last_error("rank %d: %s on communicator %s: %s", d->dc.rank, c->name,
                            d->comm->name,
                            d->fail_msg[0] ? d->fail_msg : "did not complete within the timeout");
        pthread_mutex_unlock(&d->qlock);
        return res;
    }
    return loomSuccess;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_wrap.c - a loom stream that wraps a device stream
 * (loomStreamCreateFromCuda): its calls are queued on the device stream by
 * the issuing thread (dev_issue.c), and it has no worker. What it keeps:
 * an event re-recorded after each loom call (loomStreamSynchronize and
 * loomStreamQuery cover the device stream's work up to the last loom call),
 * the failures its calls report (the proxy and the watchdog note them here
 * before they release the stream, so a synchronize that returns sees them),
 * and its host functions.
 *
 * A host function is queued as a pair of flag words: the stream writes
 * ready and waits for done; a helper thread of the stream (started by the
 * first host function) waits for ready, runs the function with the failure
 * noted since the previous one, and stores done. So the function runs after
 * everything queued before it and holds up what is queued after it, as
 * loom.h says, without a device-side host function (which must not block,
 * and which serialises the process's streams).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dev_state.h"

typedef struct host_fn {
    loomHostFn_t fn;
    void *arg;
    loom_dev_flags_t fl; /* ready, done */
    loom_dev_event_t ev; /* after its done wait: its flags are free once passed */
    struct host_fn *next;
} host_fn_t;

struct loom_dev_wrap {
    const loom_devrt_t *rt;
    loom_dev_stream_t ds;
    pthread_mutex_t lock;
    loom_dev_event_t last; /* after the last loom call; NULL until there was one */
    loomResult_t error;    /* the first failure since the last synchronize */
    char msg[512];
    loomResult_t fn_error; /* the first failure since the last host function */
    char fn_msg[512];
    pthread_mutex_t elock;  /* the two failures: apart from lock, which is held across runtime
                               calls that a full device queue may block, so that the proxy that
                               reports a failure never waits for them */
    pthread_cond_t cond;    /* the helper sleeps here */
    host_fn_t *head, *tail; /* queued, not run */
    host_fn_t *ran;         /* run, their flags in use until their event passes */
    int helper_started, stop;
    pthread_t helper;
};

loomResult_t loom_dev_wrap_create(void *dev_stream, loom_dev_wrap_t **w_p)
{
    const loom_devrt_t *rt = loom_devrt();
    if (rt == NULL) {
        LOOM_WARN("loomStreamCreateFromCuda: this process has no device runtime: %s",
                  loom_devrt_why_none());
        return loomInvalidUsage;
    }
    loom_dev_wrap_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        LOOM_WARN("loomStreamCreateFromCuda: out of memory");
        return loomSystemError;
    }
    w->rt = rt;
    w->ds = dev_stream;
    pthread_mutex_init(&w->lock, NULL);
    pthread_mutex_init(&w->elock, NULL);
    pthread_cond_init(&w->cond, NULL);
    *w_p = w;
    return loomSuccess;
}

void *loom_dev_wrap_stream(const loom_dev_wrap_t *w)
{
    return w->ds;
}

loomResult_t loom_dev_wrap_mark(loom_dev_wrap_t *w)
{
    pthread_mutex_lock(&w->lock);
    loomResult_t res = w->last != NULL ? loomSuccess : w->rt->event_create(&w->last);
    if (res == loomSuccess)
        res = w->rt->event_record(w->last, w->ds);
    pthread_mutex_unlock(&w->lock);
    return res;
}

void loom_dev_wrap_note_error(loom_dev_wrap_t *w, loomResult_t res, const char *msg)
{
    pthread_mutex_lock(&w->elock);
    if (w->error == loomSuccess) {
        w->error = res;
        snprintf(w->msg, sizeof(w->msg), "%s", msg);
    }
    if (w->fn_error == loomSuccess) {
        w->fn_error = res;
        snprintf(w->fn_msg, sizeof(w->fn_msg), "%s", msg);
    }
    pthread_mutex_unlock(&w->elock);
}

/* Waits for the last mark; the stream's error if it failed. */
static loomResult_t wait_last(loom_dev_wrap_t *w)
{
    pthread_mutex_lock(&w->lock);
    loom_dev_event_t ev = w->last;
    pthread_mutex_unlock(&w->lock);
    if (ev == NULL)
        return loomSuccess;
    unsigned step = 0;
    loomResult_t q;
    /* No timeout of its own: every wait a loom call queued ends at its communicator's
     * timeout or abort (the watchdog releases it). */
    while ((q = w->rt->event_query(ev)) == loomInProgress)
        loom_dev_backoff(&step);
    return q;
}

/* The failure kept since the last synchronize, handed to the caller's last error. */
static loomResult_t take_error(loom_dev_wrap_t *w, loomResult_t q, int clear)
{
    pthread_mutex_lock(&w->elock);
    loomResult_t res = w->error;
    if (res != loomSuccess) {
        loom_set_last_error("%s", w->msg);
        if (clear)
            w->error = loomSuccess;
    } else if (q != loomSuccess && q != loomInProgress) {
        res = q; /* the runtime set the last error */
    }
    pthread_mutex_unlock(&w->elock);
    return res;
}

loomResult_t loom_dev_wrap_sync(loom_dev_wrap_t *w)
{
    return take_error(w, wait_last(w), 1);
}

loomResult_t loom_dev_wrap_query(loom_dev_wrap_t *w)
{
    pthread_mutex_lock(&w->lock);
    loomResult_t q = w->last != NULL ? w->rt->event_query(w->last) : loomSuccess;
    pthread_mutex_unlock(&w->lock);
    if (q == loomInProgress)
        return q;
    return take_error(w, q, 0); /* Query reports the error; Synchronize clears it */
}

// ---- host functions ---------------------------------------------------------------

static void host_fn_free(loom_dev_wrap_t *w, host_fn_t *h)
{
    loom_dev_flags_put(&h->fl);
    if (h->ev != NULL)
        (void)w->rt->event_destroy(h->ev);
    free(h);
}

/* Frees the flags of host functions whose stream has passed them (w->lock held). */
static void reap(loom_dev_wrap_t *w)
{
    host_fn_t **p = &w->ran;
    while (*p != NULL) {
        host_fn_t *h = *p;
        if (w->rt->event_query(h->ev) == loomInProgress) {
            p = &h->next;
            continue;
        }
        *p = h->next;
        host_fn_free(w, h);
    }
}

static void *helper_main(void *arg)
{
    loom_dev_wrap_t *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        reap(w);
        if (w->head == NULL) {
            if (w->stop && w->ran == NULL)
                break;
            if (w->ran == NULL && !w->stop) {
                pthread_cond_wait(&w->cond, &w->lock);
            } else {
                pthread_mutex_unlock(&w->lock);
                unsigned step = 64; /* sleeps: only flags to reclaim */
                loom_dev_backoff(&step);
                pthread_mutex_lock(&w->lock);
            }
            continue;
        }
        host_fn_t *h = w->head;
        w->head = h->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&w->lock);
        unsigned step = 0;
        while (loom_dev_flag_load(&h->fl, LOOM_DEV_F_READY) == 0)
            loom_dev_backoff(&step);
        pthread_mutex_lock(&w->elock);
        const loomResult_t status = w->fn_error;
        if (status != loomSuccess)
            loom_set_last_error("%s", w->fn_msg);
        w->fn_error = loomSuccess;
        pthread_mutex_unlock(&w->elock);
        h->fn(h->arg, status);
        loom_clear_last_error();
        loom_dev_flag_store(&h->fl, LOOM_DEV_F_DONE, 1);
        pthread_mutex_lock(&w->lock);
        h->next = w->ran;
        w->ran = h;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

loomResult_t loom_dev_wrap_host_fn(loom_dev_wrap_t *w, loomHostFn_t fn, void *arg)
{
    const loom_devrt_t *rt = w->rt;
    int capturing = 0;
    LOOM_CHECK(rt->stream_capturing(w->ds, &capturing));
    if (capturing) {
        LOOM_WARN("loomStreamLaunchHostFunc: the wrapped device stream is capturing a CUDA "
                  "graph, and loom's host functions cannot be captured: launch it outside the "
                  "capture");
        return loomInvalidUsage;
    }
    host_fn_t *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        LOOM_WARN("loomStreamLaunchHostFunc: out of memory");
        return loomSystemError;
    }
    h->fn = fn;
    h->arg = arg;
    loomResult_t res = loom_dev_flags_get(rt, &h->fl);
    if (res == loomSuccess)
        res = rt->event_create(&h->ev);
    pthread_mutex_lock(&w->lock);
    if (res == loomSuccess && !w->helper_started) {
        int err = pthread_create(&w->helper, NULL, helper_main, w);
        if (err != 0) {
            LOOM_WARN("loomStreamLaunchHostFunc: cannot start the stream's host-function "
                      "thread: %s",
                      strerror(err));
            res = loomSystemError;
        }
        w->helper_started = err == 0;
    }
    if (res != loomSuccess) {
        pthread_mutex_unlock(&w->lock);
        host_fn_free(w, h);
        return res;
    }
    /* Queued under the lock, so that the host functions of the stream run in queue order. */
    res = rt->write_u32(w->ds, h->fl.dev + LOOM_DEV_F_READY, 1);
    if (res == loomSuccess)
        res = rt->wait_u32(w->ds, h->fl.dev + LOOM_DEV_F_DONE, 1);
    if (res == loomSuccess)
        res = rt->event_record(h->ev, w->ds);
    if (res == loomSuccess && w->last == NULL)
        res = rt->event_create(&w->last);
    if (res == loomSuccess)
        res = rt->event_record(w->last, w->ds);
    /* Queued even on a failure: the wait (if queued) needs its done, which the helper stores. */
    h->next = NULL;
    if (w->tail)
        w->tail->next = h;
    else
        w->head = h;
    w->tail = h;
    if (res != loomSuccess) /* the ready write may be missing: the helper must not wait for it */
        loom_dev_flag_store(&h->fl, LOOM_DEV_F_READY, 1);
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return res;
}

loomResult_t loom_dev_wrap_finish(loom_dev_wrap_t *w)
{
    const loomResult_t q = wait_last(w);
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->cond);
    const int started = w->helper_started;
    pthread_mutex_unlock(&w->lock);
    if (started)
        pthread_join(w->helper, NULL);
    w->helper_started = 0;
    return take_error(w, q, 1);
}

void loom_dev_wrap_free(loom_dev_wrap_t *w)
{
    if (w == NULL)
        return;
    if (w->last != NULL)
        (void)w->rt->event_destroy(w->last);
    pthread_mutex_destroy(&w->lock);
    pthread_mutex_destroy(&w->elock);
    pthread_cond_destroy(&w->cond);
    free(w);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_util.c - the exchange, the agreement and the tracking of queued work
 * that the ipc and nccl device transports share (devtp_util.h).
 */
#include "devtp_util.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "debug.h"

void loom_devtp_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (why == NULL || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

int64_t loom_devtp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

loomResult_t loom_devtp_allgather(loom_dev_comm_t *dc, const void *mine, void *all, size_t bytes,
                                  char *why, size_t why_len)
{
    loomResult_t r = loomAllGather(mine, all, bytes, loomUint8, dc->comm, NULL);
    if (r != loomSuccess)
        loom_devtp_why(why, why_len, "the exchange over the host communicator failed: %s",
                       loomGetLastError(dc->comm));
    return r;
}

typedef struct {
    int32_t result;
    char why[LOOM_DEVTP_WHY_BYTES];
} agree_rec_t;

loomResult_t loom_devtp_agree(loom_dev_comm_t *dc, loomResult_t mine, const char *my_why, char *why,
                              size_t why_len)
{
    agree_rec_t me;
    memset(&me, 0, sizeof(me));
    me.result = (int32_t)mine;
    if (mine != loomSuccess)
        snprintf(me.why, sizeof(me.why), "%s", my_why && *my_why ? my_why : "no reason given");
    agree_rec_t *all = calloc((size_t)dc->nranks, sizeof(*all));
    if (all == NULL) {
        loom_devtp_why(why, why_len, "out of memory for the agreement of %d ranks", dc->nranks);
        return loomSystemError;
    }
    loomResult_t r = loom_devtp_allgather(dc, &me, all, sizeof(me), why, why_len);
    if (r == loomSuccess) {
        for (int i = 0; i < dc->nranks; i++) {
            if (all[i].result != loomSuccess) {
                all[i].why[sizeof(all[i].why) - 1] = '\0';
                loom_devtp_why(why, why_len, "rank %d: %s", i, all[i].why);
                r = all[i].result > loomSuccess && all[i].result < loomNumResults
                        ? (loomResult_t)all[i].result
                        : loomInternalError;
                break;
            }
        }
    }
    free(all);
    return r;
}

// ---- tracking of queued work --------------------------------------------------

void loom_devtp_track_init(loom_devtp_track_t *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
}

static int push(loom_dev_event_t **v, size_t *n, size_t *cap, loom_dev_event_t e)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        loom_dev_event_t *nv = realloc(*v, c * sizeof(*nv));
        if (nv == NULL)
            return -1;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = e;
    return 0;
}

/* Moves the passed events to the spares (lock held). */
static void prune(loom_devtp_track_t *t, const loom_devrt_t *rt)
{
    size_t keep = 0;
    for (size_t i = 0; i < t->npending; i++) {
        loom_dev_event_t e = t->pending[i];
        loomResult_t q = rt->event_query(e);
        if (q == loomInProgress) {
            t->pending[keep++] = e;
        } else if (q != loomSuccess || push(&t->spare, &t->nspare, &t->cap_spare, e) != 0) {
            rt->event_destroy(e); /* failed streams' events are not reused */
        }
    }
    t->npending = keep;
}

loomResult_t loom_devtp_track(loom_devtp_track_t *t, const loom_devrt_t *rt, loom_dev_stream_t s)
{
    int capturing = 0;
    if (rt->stream_capturing(s, &capturing) != loomSuccess || capturing)
        return loomSuccess;
    loomResult_t r = loomSuccess;
    pthread_mutex_lock(&t->lock);
    prune(t, rt);
    loom_dev_event_t e = NULL;
    if (t->nspare > 0)
        e = t->spare[--t->nspare];
    else
        r = rt->event_create(&e);
    if (r == loomSuccess) {
        r = rt->event_record(e, s);
        if (r == loomSuccess && push(&t->pending, &t->npending, &t->cap_pending, e) != 0) {
            LOOM_WARN("device transport: out of memory tracking queued work");
            r = loomSystemError;
        }
        if (r != loomSuccess)
            rt->event_destroy(e);
    }
    pthread_mutex_unlock(&t->lock);
    return r;
}

int loom_devtp_track_wait(loom_devtp_track_t *t, const loom_devrt_t *rt, int64_t timeout_ms)
{
    int64_t end = loom_devtp_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        pthread_mutex_lock(&t->lock);
        prune(t, rt);
        size_t left = t->npending;
        pthread_mutex_unlock(&t->lock);
        if (left == 0)
            return 1;
        if (loom_devtp_now_ms() >= end)
            return 0;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

void loom_devtp_track_fini(loom_devtp_track_t *t, const loom_devrt_t *rt)
{
    for (size_t i = 0; i < t->npending; i++)
        rt->event_destroy(t->pending[i]);
    for (size_t i = 0; i < t->nspare; i++)
        rt->event_destroy(t->spare[i]);
    free(t->pending);
    free(t->spare);
    pthread_mutex_destroy(&t->lock);
    memset(t, 0, sizeof(*t));
}

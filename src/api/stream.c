/* SPDX-License-Identifier: Apache-2.0
 *
 * stream.c - loomStream_t: an ordered asynchronous queue with one worker
 * thread. Calls given a stream return after queueing; the worker runs tasks in
 * order (each in its communicator's ticket order). A failure is kept for
 * loomStreamSynchronize/Query, which also hand its message to the caller's
 * loomGetLastError, and is recorded on the communicator for
 * loomCommGetAsyncError.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "debug.h"

#define LOOM_STREAM_MAGIC 0x7374726du /* "strm" */

struct loomStream {
    uint32_t magic;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    loom_task_t *head, *tail;
    int pending; /* queued or running tasks */
    int stop;
    loomResult_t error;
    char error_msg[512];
};

static void *stream_main(void *arg)
{
    struct loomStream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->head == NULL && s->stop)
            break;
        loom_task_t *t = s->head;
        s->head = t->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);

        loom_clear_last_error();
        loomResult_t res = loom_task_execute(t);
        if (res != loomSuccess)
            loom_comm_set_async_error(t->comm, res, loom_last_error());
        loom_task_free(t);

        pthread_mutex_lock(&s->lock);
        if (res != loomSuccess && s->error == loomSuccess) {
            s->error = res;
            snprintf(s->error_msg, sizeof(s->error_msg), "%s", loom_last_error());
        }
        s->pending--;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static loomResult_t stream_check(loomStream_t s, const char *fn)
{
    if (s == NULL || s->magic != LOOM_STREAM_MAGIC) {
        LOOM_WARN("%s: invalid stream %p (NULL, destroyed or not made by loomStreamCreate)", fn,
                  (void *)s);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomStreamCreate(loomStream_t *stream)
{
    if (stream == NULL) {
        LOOM_WARN("loomStreamCreate: stream pointer is NULL");
        return loomInvalidArgument;
    }
    struct loomStream *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        LOOM_WARN("loomStreamCreate: out of memory");
        return loomSystemError;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->magic = LOOM_STREAM_MAGIC;
    int ret = pthread_create(&s->thread, NULL, stream_main, s);
    if (ret != 0) {
        LOOM_WARN("loomStreamCreate: pthread_create failed: %s", strerror(ret));
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        free(s);
        return loomSystemError;
    }
    *stream = s;
    return loomSuccess;
}

loomResult_t loom_stream_push(loomStream_t s, loom_task_t *t)
{
    t->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->pending++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return loomSuccess;
}

/* Takes and clears the stream's error, passing its text to the caller's last error. */
static loomResult_t stream_take_error(struct loomStream *s)
{
    loomResult_t res = s->error;
    if (res != loomSuccess) {
        loom_set_last_error("%s", s->error_msg);
        s->error = loomSuccess;
    }
    return res;
}

LOOM_API loomResult_t loomStreamSynchronize(loomStream_t s)
{
    LOOM_CHECK(stream_check(s, "loomStreamSynchronize"));
    pthread_mutex_lock(&s->lock);
    while (s->pending > 0)
        pthread_cond_wait(&s->cond, &s->lock);
    loomResult_t res = stream_take_error(s);
    pthread_mutex_unlock(&s->lock);
    return res;
}

LOOM_API loomResult_t loomStreamQuery(loomStream_t s)
{
    LOOM_CHECK(stream_check(s, "loomStreamQuery"));
    pthread_mutex_lock(&s->lock);
    /* Query reports the error but leaves it for Synchronize, which clears it. */
    loomResult_t res = s->pending > 0 ? loomInProgress : s->error;
    if (res != loomSuccess && res != loomInProgress)
        loom_set_last_error("%s", s->error_msg);
    pthread_mutex_unlock(&s->lock);
    return res;
}

LOOM_API loomResult_t loomStreamDestroy(loomStream_t s)
{
    if (s == NULL)
        return loomSuccess;
    LOOM_CHECK(stream_check(s, "loomStreamDestroy"));
    loomResult_t res = loomStreamSynchronize(s);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    s->magic = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    return res;
}

loomResult_t loom_stream_validate(loomStream_t s)
{
    return s == NULL ? loomSuccess : stream_check(s, "stream argument");
}

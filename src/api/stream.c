/* SPDX-License-Identifier: Apache-2.0
 *
 * stream.c - loomStream_t: an ordered asynchronous queue with one worker
 * thread. Calls given a stream return after queueing; the worker runs tasks in
 * order (each in its communicator's ticket order). A failure is kept for
 * loomStreamSynchronize/Query, which also hand its message to the caller's
 * loomGetLastError, and is recorded on the communicator for
 * loomCommGetAsyncError, and handed to the next host function
 * (loomStreamLaunchHostFunc: a task with no communicator). A handle is used only under a reference
 * taken from the registry of live streams (registry.h); loomStreamDestroy takes it out of the
 * registry, refuses further tasks, lets the worker run what is queued and drops the user's
 * reference; the last reference frees the stream.
 *
 * A stream made by loomStreamCreateFromCuda wraps a device stream instead: it has no worker,
 * its calls are queued on the device stream by the device path (src/device/transport,
 * dev_comm.h), which also answers its synchronize, query, host functions and destroy. On a
 * worker stream, a task on device memory is queued on its communicator's device stream when
 * it is issued and waited for by the worker in its turn (loom_dev_gate_run).
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "debug.h"
#include "dev_comm.h"
#include "registry.h"
#include "timer.h"

static loom_registry_t streams =
    LOOM_REGISTRY_INITIALIZER("stream", "destroyed, or not made by loomStreamCreate");

/* Wake-ups go only to threads that sleep: the worker is signalled when a push
 * finds it asleep, and synchronizers when the last pending task completes (or
 * a long one, see stream_main), so a queue of many small calls costs no futex
 * call per task. Both yield for a while before they sleep (comm.h spin_ns), so
 * that a call followed by a synchronize costs no wake-up either when the call
 * is short. */
struct loomStream {
    int refs; /* 1 for the user + 1 per call using the stream and per group task recorded for it */
    loom_dev_wrap_t *wrap; /* the device stream it wraps (no worker then), or NULL */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work; /* the worker sleeps here while the queue is empty */
    pthread_cond_t idle; /* synchronizers sleep here while tasks are pending */
    pthread_cond_t room; /* callers sleep here while the queue is full */
    loom_task_t *head, *tail;
    int pending;        /* queued or running tasks (read without the lock by yield_for) */
    int worker_sleeps;  /* the worker waits on `work` */
    int sync_sleeps;    /* threads waiting on `idle` */
    int push_sleeps;    /* threads waiting on `room` */
    int64_t spin_ns;    /* yield before sleeping: the last task's communicator's spin_ns */
    loom_task_t *spare; /* tasks run and released, for loom_stream_task_alloc */
    int nspare;
    int stop; /* the destroy has begun: tasks are refused, the worker leaves once none is queued */
    loomResult_t error;
    char error_msg[512];
    loomResult_t fn_error; /* the first failure since the last host function ran */
    char fn_msg[512];
};

/* Before sleeping: yields the CPU in a loop, for up to the stream's spin time,
 * until work arrives (want_work) or every task has completed; returns 1 if it
 * did. Yielding, not spinning on `pause`: on loaded cores a spinning thread
 * keeps the one it waits for off the CPU. */
static int yield_for(struct loomStream *s, int want_work)
{
    const uint64_t spin_ns = (uint64_t)__atomic_load_n(&s->spin_ns, __ATOMIC_RELAXED);
    const uint64_t start = spin_ns ? loom_now_ns() : 0;
    while (spin_ns > 0) {
        if (want_work ? __atomic_load_n(&s->head, __ATOMIC_ACQUIRE) != NULL ||
                            __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)
                      : __atomic_load_n(&s->pending, __ATOMIC_ACQUIRE) == 0)
            return 1;
        if (loom_now_ns() - start >= spin_ns)
            break;
        sched_yield();
    }
    return 0;
}

/* The worker runs one task at a time. A synchronizer asleep is woken when
 * nothing is pending any more, and also after every long task (one wake-up
 * per LONG_TASK_NS is noise there): measured on two loaded cores, a 4 MiB
 * AllReduce queued 100 times ran 2-3 times slower when the synchronizer slept
 * through the whole queue (the two ranks' workers stayed on one CPU), while for
 * 8-byte calls the wake-up per task was the largest cost of the stream. */
#define LONG_TASK_NS 50000
/* At most this many tasks are queued or running; a caller queueing more waits
 * (as a CUDA stream's launch queue makes its host thread wait) until half of
 * them ran. That bounds the stream's memory, and lets every task come from
 * the spares of earlier ones: a task allocated by the caller's thread and
 * freed by the worker cost more in malloc than a small collective. */
#define QUEUE_MAX 256

/* Runs a host function's task with the failure recorded since the previous
 * one (then forgotten), its text as the thread's last error. */
static void run_host_fn(struct loomStream *s, loom_task_t *t)
{
    pthread_mutex_lock(&s->lock);
    const loomResult_t status = s->fn_error;
    if (status != loomSuccess)
        loom_set_last_error("%s", s->fn_msg);
    s->fn_error = loomSuccess;
    pthread_mutex_unlock(&s->lock);
    t->host_fn(t->host_arg, status);
    loom_clear_last_error();
}

static void *stream_main(void *arg)
{
    struct loomStream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (s->head == NULL && !s->stop) {
            pthread_mutex_unlock(&s->lock);
            (void)yield_for(s, 1);
            pthread_mutex_lock(&s->lock);
        }
        while (s->head == NULL && !s->stop) {
            s->worker_sleeps = 1;
            pthread_cond_wait(&s->work, &s->lock);
            s->worker_sleeps = 0;
        }
        if (s->head == NULL && s->stop)
            break;
        loom_task_t *t = s->head;
        __atomic_store_n(&s->head, t->next, __ATOMIC_RELAXED);
        if (t->next == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);

        loom_clear_last_error();
        /* The clock only matters to a synchronizer asleep (one that falls asleep
         * meanwhile is woken when the queue drains). */
        const int timed = __atomic_load_n(&s->sync_sleeps, __ATOMIC_RELAXED) > 0;
        const uint64_t t0 = timed ? loom_now_ns() : 0;
        loomResult_t res = loomSuccess;
        if (t->comm == NULL) {
            run_host_fn(s, t);
        } else {
            __atomic_store_n(&s->spin_ns, t->comm->spin_ns, __ATOMIC_RELAXED);
            res = t->dev_call != NULL ? loom_dev_gate_run(t) : loom_task_execute(t);
            if (res != loomSuccess)
                loom_comm_set_async_error(t->comm, res, loom_last_error());
            loom_task_release(t);
        }
        const int long_task = timed && loom_now_ns() - t0 >= LONG_TASK_NS;

        pthread_mutex_lock(&s->lock);
        if (s->nspare < QUEUE_MAX) {
            t->next = s->spare;
            s->spare = t;
            s->nspare++;
            t = NULL;
        }
        if (res != loomSuccess && s->error == loomSuccess) {
            s->error = res;
            snprintf(s->error_msg, sizeof(s->error_msg), "%s", loom_last_error());
        }
        if (res != loomSuccess && s->fn_error == loomSuccess) {
            s->fn_error = res;
            snprintf(s->fn_msg, sizeof(s->fn_msg), "%s", loom_last_error());
        }
        const int left = __atomic_sub_fetch(&s->pending, 1, __ATOMIC_RELEASE);
        if ((left == 0 || long_task) && s->sync_sleeps > 0)
            pthread_cond_broadcast(&s->idle);
        if (left <= QUEUE_MAX / 2 && s->push_sleeps > 0)
            pthread_cond_broadcast(&s->room);
        if (t != NULL) {
            pthread_mutex_unlock(&s->lock);
            free(t);
            pthread_mutex_lock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Once the last reference is gone: the worker was joined by the destroy. */
static void stream_free(struct loomStream *s)
{
    loom_dev_wrap_free(s->wrap);
    while (s->spare != NULL) {
        loom_task_t *t = s->spare;
        s->spare = t->next;
        free(t);
    }
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->room);
    free(s);
}

void loom_stream_release(loomStream_t s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        stream_free(s);
}

loomResult_t loom_stream_hold(loomStream_t s, const char *fn)
{
    return loom_registry_acquire(&streams, s, fn);
}

/* Refuses further tasks, lets the worker run the queued ones, and joins it. */
static void stream_stop(struct loomStream *s)
{
    pthread_mutex_lock(&s->lock);
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->work);
    pthread_cond_broadcast(&s->room); /* callers waiting for room give up */
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
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
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    pthread_cond_init(&s->room, NULL);
    s->refs = 1;
    int ret = pthread_create(&s->thread, NULL, stream_main, s);
    if (ret != 0) {
        LOOM_WARN("loomStreamCreate: pthread_create failed: %s", strerror(ret));
        stream_free(s);
        return loomSystemError;
    }
    loomResult_t res = loom_registry_add(&streams, s, &s->refs);
    if (res != loomSuccess) {
        stream_stop(s);
        stream_free(s);
        return res;
    }
    *stream = s;
    return loomSuccess;
}

/* Appends t; the caller holds the lock. */
static void append_locked(struct loomStream *s, loom_task_t *t)
{
    t->next = NULL;
    if (s->tail)
        s->tail->next = t;
    else
        __atomic_store_n(&s->head, t, __ATOMIC_RELEASE); /* a spinning worker looks */
    s->tail = t;
    __atomic_add_fetch(&s->pending, 1, __ATOMIC_RELAXED);
    if (s->worker_sleeps)
        pthread_cond_signal(&s->work);
}

/* Waits (holding the lock) until the queue has room; 0 if the stream's
 * destroy has begun instead (the task must not be queued). */
static int wait_room_locked(struct loomStream *s)
{
    while (__atomic_load_n(&s->pending, __ATOMIC_RELAXED) >= QUEUE_MAX && !s->stop) {
        s->push_sleeps++;
        pthread_cond_wait(&s->room, &s->lock);
        s->push_sleeps--;
    }
    return !s->stop;
}

static void warn_stopped(struct loomStream *s)
{
    LOOM_WARN("stream %p was destroyed before the operation was queued on it: it is not run",
              (void *)s);
}

/* For a caller holding a reference on s: takes its lock, waits for room and gives a zeroed
 * task (a spare or a new one) with the lock held; on failure the lock and the reference are
 * dropped. */
static loomResult_t task_alloc_held(struct loomStream *s, loom_task_t **t_p)
{
    pthread_mutex_lock(&s->lock);
    if (!wait_room_locked(s)) {
        pthread_mutex_unlock(&s->lock);
        warn_stopped(s);
        loom_stream_release(s);
        return loomInvalidArgument;
    }
    loom_task_t *t = s->spare;
    if (t != NULL) {
        s->spare = t->next;
        s->nspare--;
        memset(t, 0, sizeof(*t));
    } else if ((t = calloc(1, sizeof(*t))) == NULL) {
        pthread_mutex_unlock(&s->lock);
        LOOM_WARN("out of memory queueing an operation on stream %p", (void *)s);
        loom_stream_release(s);
        return loomSystemError;
    }
    *t_p = t;
    return loomSuccess;
}

LOOM_API loomResult_t loomStreamLaunchHostFunc(loomStream_t s, loomHostFn_t fn, void *userData)
{
    if (fn == NULL) {
        LOOM_WARN("loomStreamLaunchHostFunc: fn is NULL");
        return loomInvalidArgument;
    }
    if (s == NULL) {
        LOOM_WARN("loomStreamLaunchHostFunc: stream is NULL (a host function needs a stream)");
        return loomInvalidArgument;
    }
    if (loom_group_is_open()) {
        LOOM_WARN("loomStreamLaunchHostFunc: called inside a group, whose operations are queued "
                  "only at loomGroupEnd: call it after loomGroupEnd");
        return loomInvalidUsage;
    }
    LOOM_CHECK(loom_registry_acquire(&streams, s, "loomStreamLaunchHostFunc"));
    if (s->wrap != NULL) {
        loomResult_t res = loom_dev_wrap_host_fn(s->wrap, fn, userData);
        loom_stream_release(s);
        return res;
    }
    loom_task_t *t;
    LOOM_CHECK(task_alloc_held(s, &t));
    t->stream = s;
    t->host_fn = fn;
    t->host_arg = userData;
    append_locked(s, t);
    pthread_mutex_unlock(&s->lock);
    loom_stream_release(s);
    return loomSuccess;
}

/* A task of a worker stream whose operations go to the device path: issued now, under the
 * stream's lock (its ticket keeps queue order), waited for by the worker in its turn. On
 * failure t is freed and the lock dropped. */
static loomResult_t push_gated_locked(struct loomStream *s, loom_task_t *t)
{
    loomResult_t res = loom_dev_issue_gated(t);
    if (res != loomSuccess) {
        pthread_mutex_unlock(&s->lock);
        loom_task_free(t);
        return res;
    }
    append_locked(s, t);
    pthread_mutex_unlock(&s->lock);
    return loomSuccess;
}

loomResult_t loom_stream_push_op(loomStream_t s, struct loomComm *comm, loom_op_t *op,
                                 int on_device)
{
    loomResult_t res = loom_registry_acquire(&streams, s, "stream argument");
    if (res != loomSuccess) {
        loom_op_release(op);
        return res;
    }
    if (s->wrap != NULL) {
        res = loom_dev_submit_op(comm, op, s);
        loom_stream_release(s);
        return res;
    }
    loom_task_t *t;
    if ((res = task_alloc_held(s, &t)) != loomSuccess) {
        loom_op_release(op);
        return res;
    }
    t->comm = comm;
    t->stream = s;
    t->first = *op;
    t->ops = &t->first;
    t->nops = t->cap = 1;
    __atomic_add_fetch(&comm->refs, 1, __ATOMIC_SEQ_CST);
    if (on_device) {
        res = push_gated_locked(s, t);
        loom_stream_release(s);
        return res;
    }
    /* Under the lock, so that tasks queue in ticket order. */
    t->ticket = __atomic_fetch_add(&comm->next_ticket, 1, __ATOMIC_SEQ_CST);
    append_locked(s, t);
    pthread_mutex_unlock(&s->lock);
    loom_stream_release(s);
    return loomSuccess;
}

loomResult_t loom_stream_push(loomStream_t s, loom_task_t *t, int on_device)
{
    if (s->wrap != NULL)
        return loom_dev_submit_task(t, s, NULL);
    pthread_mutex_lock(&s->lock);
    if (!wait_room_locked(s)) {
        pthread_mutex_unlock(&s->lock);
        warn_stopped(s);
        loom_task_free(t);
        return loomInvalidArgument;
    }
    if (on_device)
        return push_gated_locked(s, t);
    t->ticket = __atomic_fetch_add(&t->comm->next_ticket, 1, __ATOMIC_SEQ_CST);
    append_locked(s, t);
    pthread_mutex_unlock(&s->lock);
    return loomSuccess;
}

struct loom_dev_wrap *loom_stream_wrap(loomStream_t s)
{
    return s->wrap;
}

void loom_stream_retain(loomStream_t s)
{
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
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

static loomResult_t stream_synchronize(struct loomStream *s)
{
    (void)yield_for(s, 0);
    pthread_mutex_lock(&s->lock);
    while (s->pending > 0) {
        __atomic_add_fetch(&s->sync_sleeps, 1, __ATOMIC_RELAXED); /* read unlocked by the worker */
        pthread_cond_wait(&s->idle, &s->lock);
        __atomic_sub_fetch(&s->sync_sleeps, 1, __ATOMIC_RELAXED);
    }
    loomResult_t res = stream_take_error(s);
    pthread_mutex_unlock(&s->lock);
    return res;
}

static loomResult_t stream_query(struct loomStream *s)
{
    pthread_mutex_lock(&s->lock);
    /* Query reports the error but leaves it for Synchronize, which clears it. */
    loomResult_t res = s->pending > 0 ? loomInProgress : s->error;
    if (res != loomSuccess && res != loomInProgress)
        loom_set_last_error("%s", s->error_msg);
    pthread_mutex_unlock(&s->lock);
    return res;
}

/* Runs `call` holding a reference on the stream s. */
#define WITH_STREAM(s, fn, call)                                                                   \
    LOOM_WITH_REF(loom_registry_acquire(&streams, (s), (fn)), loom_stream_release(s), call)

LOOM_API loomResult_t loomStreamSynchronize(loomStream_t s)
{
    WITH_STREAM(s, "loomStreamSynchronize",
                s->wrap != NULL ? loom_dev_wrap_sync(s->wrap) : stream_synchronize(s));
}

LOOM_API loomResult_t loomStreamQuery(loomStream_t s)
{
    WITH_STREAM(s, "loomStreamQuery",
                s->wrap != NULL ? loom_dev_wrap_query(s->wrap) : stream_query(s));
}

LOOM_API loomResult_t loomStreamIsLive(const void *handle, int *live)
{
    if (live == NULL) {
        LOOM_WARN("loomStreamIsLive: live is NULL");
        return loomInvalidArgument;
    }
    *live = loom_registry_is_live(&streams, handle);
    return loomSuccess;
}

LOOM_API loomResult_t loomStreamDestroy(loomStream_t s)
{
    if (s == NULL)
        return loomSuccess;
    /* Out of the registry first: no call can take a new reference from here on, and of two
     * racing destroys only one gets past this. */
    LOOM_CHECK(loom_registry_remove(&streams, s, "loomStreamDestroy"));
    loomResult_t res;
    if (s->wrap != NULL) {
        res = loom_dev_wrap_finish(s->wrap); /* the device stream itself is the caller's */
    } else {
        stream_stop(s);
        pthread_mutex_lock(&s->lock);
        res = stream_take_error(s);
        pthread_mutex_unlock(&s->lock);
    }
    loom_stream_release(s); /* a call still holding the stream frees it when it lets go */
    return res;
}

LOOM_API loomResult_t loomStreamCreateFromCuda(loomStream_t *stream, void *cudaStream)
{
    if (stream == NULL) {
        LOOM_WARN("loomStreamCreateFromCuda: stream pointer is NULL");
        return loomInvalidArgument;
    }
    *stream = NULL;
    struct loomStream *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        LOOM_WARN("loomStreamCreateFromCuda: out of memory");
        return loomSystemError;
    }
    loomResult_t res = loom_dev_wrap_create(cudaStream, &s->wrap);
    if (res != loomSuccess) {
        free(s);
        return res;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    pthread_cond_init(&s->room, NULL);
    s->refs = 1;
    if ((res = loom_registry_add(&streams, s, &s->refs)) != loomSuccess) {
        stream_free(s);
        return res;
    }
    *stream = s;
    return loomSuccess;
}

loomResult_t loom_stream_validate(loomStream_t s)
{
    return s == NULL ? loomSuccess : loom_registry_check(&streams, s, "stream argument");
}

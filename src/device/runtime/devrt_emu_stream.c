/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu_stream.c - streams of the emulated device: each is a queue and a
 * worker thread that runs the queued operations in order (copies, flag
 * writes and waits, kernels as dev_kernels.h's host loops, event records).
 * The default (NULL) stream is one such stream per process, made at first
 * use. Streams of stream_create are blocking streams, kept in order with the
 * default stream as CUDA keeps its legacy default stream: an operation
 * queued on either kind first waits for the operations of the other kind
 * queued before it (see deps below). stream_destroy returns at once; the
 * worker runs what is queued, then the stream is freed. Building operations
 * from the table's arguments is devrt_emu.c's; events are devrt_emu_event.c's.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "debug.h"
#include "devrt_emu.h"
#include "devrt_emu_int.h"
#include "timer.h"

#define STREAM_MAGIC 0x4c4d5354u /* "LMST" */

/* A queued operation and what must have run, on other streams, before it:
 * on a blocking stream, the default stream's operations up to on_default;
 * on the default stream, each listed stream's operations up to its target
 * (the list holds a reference to each). Counts are taken before the
 * operation is published, so every dependency points at operations issued
 * earlier and the waits cannot form a cycle. */
typedef struct {
    struct loom_dev_stream *s;
    uint64_t target;
} emu_dep_t;

typedef struct {
    emu_op_t op;
    emu_dep_t on_default; /* .s NULL: none (the default stream is never freed: no reference) */
    emu_dep_t *deps;
    int ndeps;
} emu_qop_t;

struct loom_dev_stream {
    uint32_t magic;
    unsigned fork_gen;
    int is_default;
    int refs; /* the user's (not for the default stream), the worker's, waiters' (atomic) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the worker sleeps here while the queue is empty */
    pthread_cond_t done_cv; /* waiters for done sleep here */
    emu_qop_t *ring;
    size_t cap, head, count;
    uint64_t issued; /* operations ever queued (atomic: read without mu by other streams) */
    uint64_t done;   /* operations completed (atomic; written under mu) */
    int worker_sleeps, done_waiters;
    int closing; /* destroyed: nothing more is queued, the worker leaves when idle */
    int capturing;
    loomResult_t error;                  /* the first failure of a queued operation, kept */
    struct loom_dev_stream *next, *prev; /* the live list: streams whose worker runs */
    pthread_t worker;
};

static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static struct loom_dev_stream *live;           /* under list_mu */
static struct loom_dev_stream *default_stream; /* under list_mu; made at first use */
static unsigned fork_gen;                      /* atomic */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void list_prefork(void)
{
    pthread_mutex_lock(&list_mu);
}

static void list_parent(void)
{
    pthread_mutex_unlock(&list_mu);
}

/* The child has none of the workers: it forgets every stream (leaking their
 * memory, as their locks may be held by threads that do not exist here). */
static void list_child(void)
{
    live = NULL;
    default_stream = NULL;
    __atomic_add_fetch(&fork_gen, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&list_mu, NULL);
}

static void fork_init(void)
{
    pthread_atfork(list_prefork, list_parent, list_child);
}

unsigned loom_emu_fork_gen(void)
{
    return __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
}

static void stream_unref(struct loom_dev_stream *s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    free(s->ring);
    free(s);
}

// ---- running operations -----------------------------------------------------

/* CU_STREAM_WAIT_VALUE_GEQ's test, cyclic (devrt.h): a protocol whose values
 * leave [0, 2^31) fails here as it would on a GPU. */
static int reached(const uint32_t *addr, uint32_t v)
{
    return (int32_t)(__atomic_load_n(addr, __ATOMIC_ACQUIRE) - v) >= 0;
}

/* Until the word reaches v: yield for a short while (a release usually
 * comes soon), then sleep, doubling from 1 us to 64 us, so a long wait costs
 * little CPU and ends at most 64 us late. */
static void wait_word(const uint32_t *addr, uint32_t v)
{
    if (reached(addr, v))
        return;
    const uint64_t start = loom_now_ns();
    while (loom_now_ns() - start < 20000) {
        if (reached(addr, v))
            return;
        sched_yield();
    }
    long sleep_ns = 1000;
    while (!reached(addr, v)) {
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 64000)
            sleep_ns *= 2;
    }
}

/* Until t completed `target` operations. */
static void wait_done(struct loom_dev_stream *t, uint64_t target)
{
    if (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE) >= target)
        return;
    pthread_mutex_lock(&t->mu);
    t->done_waiters++;
    while (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE) < target)
        pthread_cond_wait(&t->done_cv, &t->mu);
    t->done_waiters--;
    pthread_mutex_unlock(&t->mu);
}

/* Runs one operation; -1 if a kernel refused its arguments (checked when
 * queued, so only a disagreement with dev_kernels_host.c gets here). */
static int run_op(emu_op_t *op)
{
    switch (op->kind) {
    case EMU_OP_COPY:
        memmove(op->dst, op->src, op->n);
        return 0;
    case EMU_OP_WRITE:
        /* Everything the stream did before is visible to whoever sees the
         * flag (a release; seq_cst is a full barrier on x86-64 too). */
        __atomic_store_n(op->addr, op->value, __ATOMIC_SEQ_CST);
        return 0;
    case EMU_OP_WAIT:
        wait_word(op->addr, op->value);
        return 0;
    case EMU_OP_EVENT:
        loom_emu_event_reached(op->event, op->event_gen);
        return 0;
    case EMU_OP_REDUCE:
        return loom_dk_host_reduce(op->dt, op->op, op->dst, op->srcs, op->nsrc, op->n, op->nranks);
    case EMU_OP_Q4_ENCODE:
        return loom_dk_host_q4_encode(op->src, op->dt, op->err_in, op->err_out, op->n, op->dst);
    case EMU_OP_Q4_DECODE:
        return loom_dk_host_q4_decode(op->src, op->n, op->dst, op->dt);
    case EMU_OP_Q4_DECODE_ACC:
        return loom_dk_host_q4_decode_acc(op->src, op->n, op->dst);
    case EMU_OP_CAST:
        return loom_dk_host_cast(op->dst, op->dt, op->src, op->dt2, op->n);
    }
    return -1;
}

static const char *op_name(emu_op_kind_t kind)
{
    static const char *names[] = {"memcpy",       "write_u32",     "wait_u32",
                                  "event_record", "reduce",        "q4_encode",
                                  "q4_decode",    "q4_decode_acc", "cast"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "?";
}

static void *worker_main(void *arg)
{
    struct loom_dev_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->closing) {
            s->worker_sleeps = 1;
            pthread_cond_wait(&s->work_cv, &s->mu);
            s->worker_sleeps = 0;
        }
        if (s->count == 0)
            break;                        /* closing and idle */
        emu_qop_t *q = &s->ring[s->head]; /* stays put: the ring grows only by copying... */
        emu_qop_t qop = *q;               /* ...so run a copy */
        pthread_mutex_unlock(&s->mu);

        if (qop.on_default.s != NULL)
            wait_done(qop.on_default.s, qop.on_default.target);
        for (int i = 0; i < qop.ndeps; i++) {
            wait_done(qop.deps[i].s, qop.deps[i].target);
            stream_unref(qop.deps[i].s);
        }
        free(qop.deps);
        int rc = run_op(&qop.op);

        pthread_mutex_lock(&s->mu);
        if (rc != 0 && s->error == loomSuccess) {
            s->error = loomUnhandledDeviceError;
            LOOM_WARN("emulated device: the queued %s refused its arguments (%zu elements)",
                      op_name(qop.op.kind), qop.op.n);
        }
        s->head = (s->head + 1) % s->cap;
        s->count--;
        __atomic_store_n(&s->done, s->done + 1, __ATOMIC_RELEASE);
        if (s->done_waiters > 0)
            pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&list_mu);
    if (s->prev != NULL)
        s->prev->next = s->next;
    else if (live == s)
        live = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&list_mu);
    stream_unref(s);
    return NULL;
}

// ---- streams ----------------------------------------------------------------

/* Makes a stream and starts its worker; the caller links it into `live`. */
static loomResult_t stream_new(int is_default, struct loom_dev_stream **out)
{
    pthread_once(&fork_once, fork_init);
    struct loom_dev_stream *s = calloc(1, sizeof(*s));
    emu_qop_t *ring = malloc(16 * sizeof(*ring));
    if (s == NULL || ring == NULL) {
        LOOM_WARN("emulated device: no memory for a stream");
        free(s);
        free(ring);
        return loomSystemError;
    }
    s->magic = STREAM_MAGIC;
    s->fork_gen = loom_emu_fork_gen();
    s->is_default = is_default;
    s->refs = is_default ? 1 << 30 : 2; /* the default stream is never freed */
    s->ring = ring;
    s->cap = 16;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    /* The worker takes no signals: they belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int ret = pthread_create(&s->worker, NULL, worker_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ret != 0) {
        LOOM_WARN("emulated device: starting a stream's worker thread failed: %s", strerror(ret));
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->done_cv);
        free(ring);
        free(s);
        return loomSystemError;
    }
    pthread_detach(s->worker);
    *out = s;
    return loomSuccess;
}

static void live_link(struct loom_dev_stream *s)
{
    s->prev = NULL;
    s->next = live;
    if (live != NULL)
        live->prev = s;
    live = s;
}

static loomResult_t get_default(struct loom_dev_stream **out)
{
    struct loom_dev_stream *d = __atomic_load_n(&default_stream, __ATOMIC_ACQUIRE);
    if (d != NULL) {
        *out = d;
        return loomSuccess;
    }
    loomResult_t res = loomSuccess;
    pthread_once(&fork_once, fork_init);
    pthread_mutex_lock(&list_mu);
    if (default_stream == NULL && (res = stream_new(1, &d)) == loomSuccess) {
        live_link(d);
        __atomic_store_n(&default_stream, d, __ATOMIC_RELEASE);
    }
    *out = default_stream;
    pthread_mutex_unlock(&list_mu);
    return res;
}

/* The stream a table call names (NULL: the default stream). */
static loomResult_t resolve(loom_dev_stream_t s, const char *call, struct loom_dev_stream **out)
{
    if (s == NULL)
        return get_default(out);
    if (s->magic != STREAM_MAGIC) {
        LOOM_WARN("emulated device: %s: %p is not a stream of the emulated device runtime", call,
                  (void *)s);
        return loomInvalidArgument;
    }
    if (s->fork_gen != loom_emu_fork_gen()) {
        LOOM_WARN("emulated device: %s: the stream was made before fork(); its worker thread is "
                  "the parent's",
                  call);
        return loomInvalidUsage;
    }
    *out = s;
    return loomSuccess;
}

/* The other streams' operations an operation on the default stream must
 * follow: each live blocking stream that has work pending, with a reference. */
static loomResult_t default_deps(emu_qop_t *q)
{
    pthread_mutex_lock(&list_mu);
    /* Room for every blocking stream, since which have work pending may change
     * while this runs; nothing allocated when none has (the common case). */
    int n = 0, pending = 0;
    for (struct loom_dev_stream *u = live; u != NULL; u = u->next) {
        n += !u->is_default;
        pending += !u->is_default && __atomic_load_n(&u->done, __ATOMIC_ACQUIRE) <
                                         __atomic_load_n(&u->issued, __ATOMIC_ACQUIRE);
    }
    if (pending == 0) {
        pthread_mutex_unlock(&list_mu);
        return loomSuccess;
    }
    if ((q->deps = malloc((size_t)n * sizeof(*q->deps))) == NULL) {
        pthread_mutex_unlock(&list_mu);
        LOOM_WARN("emulated device: no memory to order the default stream after %d streams", n);
        return loomSystemError;
    }
    for (struct loom_dev_stream *u = live; u != NULL && q->ndeps < n; u = u->next) {
        uint64_t issued = __atomic_load_n(&u->issued, __ATOMIC_ACQUIRE);
        if (u->is_default || __atomic_load_n(&u->done, __ATOMIC_ACQUIRE) >= issued)
            continue;
        __atomic_add_fetch(&u->refs, 1, __ATOMIC_RELAXED);
        q->deps[q->ndeps++] = (emu_dep_t){u, issued};
    }
    pthread_mutex_unlock(&list_mu);
    return loomSuccess;
}

static void drop_deps(emu_qop_t *q)
{
    for (int i = 0; i < q->ndeps; i++)
        stream_unref(q->deps[i].s);
    free(q->deps);
}

static loomResult_t ring_grow(struct loom_dev_stream *s)
{
    emu_qop_t *ring = malloc(2 * s->cap * sizeof(*ring));
    if (ring == NULL) {
        LOOM_WARN("emulated device: no memory to queue more than %zu operations", s->cap);
        return loomSystemError;
    }
    for (size_t i = 0; i < s->count; i++)
        ring[i] = s->ring[(s->head + i) % s->cap];
    free(s->ring);
    s->ring = ring;
    s->head = 0;
    s->cap *= 2;
    return loomSuccess;
}

loomResult_t loom_emu_enqueue(loom_dev_stream_t stream, const emu_op_t *op)
{
    struct loom_dev_stream *s;
    LOOM_CHECK(resolve(stream, op_name(op->kind), &s));
    emu_qop_t q = {.op = *op};
    if (s->is_default) {
        LOOM_CHECK(default_deps(&q));
    } else {
        struct loom_dev_stream *d = __atomic_load_n(&default_stream, __ATOMIC_ACQUIRE);
        uint64_t issued = d != NULL ? __atomic_load_n(&d->issued, __ATOMIC_ACQUIRE) : 0;
        if (d != NULL && __atomic_load_n(&d->done, __ATOMIC_ACQUIRE) < issued)
            q.on_default = (emu_dep_t){d, issued};
    }
    loomResult_t res = loomSuccess;
    pthread_mutex_lock(&s->mu);
    if (s->closing) {
        LOOM_WARN("emulated device: %s on a destroyed stream", op_name(op->kind));
        res = loomInvalidArgument;
    } else if (s->count == s->cap) {
        res = ring_grow(s);
    }
    if (res == loomSuccess) {
        s->ring[(s->head + s->count) % s->cap] = q;
        s->count++;
        __atomic_store_n(&s->issued, s->issued + 1, __ATOMIC_RELEASE);
        if (s->worker_sleeps)
            pthread_cond_signal(&s->work_cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (res != loomSuccess)
        drop_deps(&q);
    return res;
}

loomResult_t loom_emu_stream_create(loom_dev_stream_t *out)
{
    struct loom_dev_stream *s;
    if (out == NULL) {
        LOOM_WARN("emulated device: stream_create given a NULL output");
        return loomInvalidArgument;
    }
    LOOM_CHECK(stream_new(0, &s));
    pthread_mutex_lock(&list_mu);
    live_link(s);
    pthread_mutex_unlock(&list_mu);
    *out = s;
    return loomSuccess;
}

loomResult_t loom_emu_stream_destroy(loom_dev_stream_t stream)
{
    struct loom_dev_stream *s;
    if (stream == NULL) {
        LOOM_WARN("emulated device: stream_destroy: the default stream cannot be destroyed");
        return loomInvalidArgument;
    }
    LOOM_CHECK(resolve(stream, "stream_destroy", &s));
    pthread_mutex_lock(&s->mu);
    int again = s->closing;
    s->closing = 1;
    if (!again && s->worker_sleeps)
        pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    if (again) {
        LOOM_WARN("emulated device: stream_destroy: stream %p was destroyed already", (void *)s);
        return loomInvalidArgument;
    }
    stream_unref(s); /* the worker's reference keeps it until the queue is run */
    return loomSuccess;
}

loomResult_t loom_emu_stream_query(loom_dev_stream_t stream)
{
    struct loom_dev_stream *s;
    LOOM_CHECK(resolve(stream, "stream_query", &s));
    uint64_t issued = __atomic_load_n(&s->issued, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&s->mu);
    loomResult_t err = s->error;
    pthread_mutex_unlock(&s->mu);
    if (err != loomSuccess) {
        loom_set_last_error("emulated device: an operation queued on stream %p failed (its "
                            "arguments were refused when it ran)",
                            (void *)s);
        return err;
    }
    return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) >= issued ? loomSuccess : loomInProgress;
}

loomResult_t loom_emu_stream_capturing(loom_dev_stream_t stream, int *capturing)
{
    struct loom_dev_stream *s;
    if (capturing == NULL) {
        LOOM_WARN("emulated device: stream_capturing given a NULL output");
        return loomInvalidArgument;
    }
    LOOM_CHECK(resolve(stream, "stream_capturing", &s));
    *capturing = __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE);
    return loomSuccess;
}

loomResult_t loom_devrt_emu_set_capturing(loom_dev_stream_t stream, int capturing)
{
    struct loom_dev_stream *s;
    LOOM_CHECK(resolve(stream, "set_capturing", &s));
    __atomic_store_n(&s->capturing, capturing != 0, __ATOMIC_RELEASE);
    return loomSuccess;
}

int loom_devrt_emu_live_streams(void)
{
    int n = 0;
    pthread_mutex_lock(&list_mu);
    for (struct loom_dev_stream *u = live; u != NULL; u = u->next)
        n++;
    pthread_mutex_unlock(&list_mu);
    return n;
}

void loom_emu_sync_all(void)
{
    emu_dep_t local[64], *snap = local;
    size_t n = 0, cap = 64;
    pthread_mutex_lock(&list_mu);
    for (struct loom_dev_stream *u = live; u != NULL; u = u->next) {
        if (n == cap) {
            emu_dep_t *grown = malloc(2 * cap * sizeof(*grown));
            if (grown == NULL) {
                /* Unlikely; the streams past these are then not waited for. */
                LOOM_WARN("emulated device: no memory to wait for more than %zu streams", n);
                break;
            }
            memcpy(grown, snap, n * sizeof(*snap));
            if (snap != local)
                free(snap);
            snap = grown;
            cap *= 2;
        }
        __atomic_add_fetch(&u->refs, 1, __ATOMIC_RELAXED);
        snap[n++] = (emu_dep_t){u, __atomic_load_n(&u->issued, __ATOMIC_ACQUIRE)};
    }
    pthread_mutex_unlock(&list_mu);
    for (size_t i = 0; i < n; i++) {
        wait_done(snap[i].s, snap[i].target);
        stream_unref(snap[i].s);
    }
    if (snap != local)
        free(snap);
}

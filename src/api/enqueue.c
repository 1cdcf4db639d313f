/* SPDX-License-Identifier: Apache-2.0
 *
 * enqueue.c - how a recorded operation reaches execution: groups (per
 * thread), tickets (per communicator, so tasks run in issue order whatever
 * thread or stream runs them), and the execution of a task: post every
 * send/receive, run the collectives in order, then wait for the sends and
 * receives. Posting all point-to-point operations first is what lets any mix
 * of Send/Recv and collectives inside a group complete in whatever order
 * ranks posted them.
 *
 * A group's tasks keep their communicator and stream alive until
 * loomGroupEnd but do not hold them in use: a destroy or abort meanwhile
 * (from any thread, also the group's own) does not wait for them, and
 * loomGroupEnd then fails those tasks without running them.
 *
 * A task of a communicator with a device state (src/device/transport,
 * dev_comm.h) that names device memory, or whose stream wraps a device
 * stream, goes to the device path instead, taking its ticket the same way
 * when it is issued; everything else stays as it is here, one pointer test
 * per buffer the dearer (none without a device state).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm.h"
#include "debug.h"
#include "dev_comm.h"
#include "devrt.h"
#include "timer.h"

typedef struct {
    int depth;
    loom_task_t *tasks; /* one per communicator touched by the group */
} group_state_t;

static __thread group_state_t group;

// ---- tasks ------------------------------------------------------------------

/* A task recorded in a group: on the heap, holding a parked reference on
 * comm (one the teardown does not wait for) until group_task_claim. The
 * caller holds a reference itself, so the communicator is not torn down
 * meanwhile. */
static loomResult_t task_park(struct loomComm *comm, loom_task_t **t_p)
{
    loom_task_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        LOOM_WARN("rank %d: out of memory recording an operation of a group", comm->rank);
        return loomSystemError;
    }
    t->comm = comm;
    pthread_mutex_lock(&comm->lock); /* the teardown reads refs and parked together */
    __atomic_add_fetch(&comm->refs, 1, __ATOMIC_SEQ_CST);
    comm->parked++;
    pthread_mutex_unlock(&comm->lock);
    *t_p = t;
    return loomSuccess;
}

static loomResult_t task_add(loom_task_t *t, const loom_op_t *op)
{
    if (t->cap == 0) {
        t->ops = &t->first;
        t->cap = 1;
    } else if (t->nops == t->cap) {
        int cap = 2 * t->cap < 4 ? 4 : 2 * t->cap;
        loom_op_t *ops = t->ops == &t->first ? malloc((size_t)cap * sizeof(*ops))
                                             : realloc(t->ops, (size_t)cap * sizeof(*ops));
        if (ops == NULL) {
            LOOM_WARN("out of memory recording operation %d of a group", t->nops + 1);
            return loomSystemError;
        }
        if (t->ops == &t->first)
            ops[0] = t->first;
        t->ops = ops;
        t->cap = cap;
    }
    t->ops[t->nops++] = *op;
    return loomSuccess;
}

static void op_free(loom_op_t *op)
{
    if (op->kind == LOOM_OP_COLL && op->coll.kind == LOOM_COLL_ALLTOALLV)
        free((void *)op->coll.sendcounts); /* one allocation holds all four arrays */
    if (op->kind == LOOM_OP_COLL &&
        (op->coll.kind == LOOM_COLL_ALLGATHERV || op->coll.kind == LOOM_COLL_REDUCE_SCATTERV))
        free((void *)op->coll.recvcounts); /* one allocation holds counts and displacements */
    if (op->kind == LOOM_OP_ECHO && op->echo.state)
        loom_echo_state_release(op->echo.state);
}

void loom_op_release(loom_op_t *op)
{
    op_free(op);
}

static int op_is_p2p(const loom_op_t *op)
{
    return op->kind == LOOM_OP_SEND || op->kind == LOOM_OP_RECV;
}

/* A collective in its turn: the next sequence number, then its engine. */
static loomResult_t run_collective(struct loomComm *comm, loom_op_t *op)
{
    comm->coll.seq++;
    if (op->kind == LOOM_OP_COLL)
        return loom_coll_run(&comm->coll, &op->coll, NULL);
    loom_echo_ctx_t *echo;
    LOOM_CHECK(loom_comm_echo(comm, &echo));
    return loom_echo_run(echo, comm->p2p, comm->coll.seq, &op->echo);
}

/* Frees what the task's operations own, not the task. */
static void task_clear_ops(loom_task_t *t)
{
    for (int i = 0; i < t->nops; i++)
        op_free(&t->ops[i]);
    if (t->ops != &t->first)
        free(t->ops);
}

void loom_task_release(loom_task_t *t)
{
    task_clear_ops(t);
    loom_comm_release(t->comm);
}

void loom_task_free(loom_task_t *t)
{
    if (t == NULL)
        return;
    loom_task_release(t);
    free(t);
}

/* Tickets need only be unique and in issue order: an atomic counter. */
static void task_take_ticket(loom_task_t *t)
{
    t->ticket = __atomic_fetch_add(&t->comm->next_ticket, 1, __ATOMIC_SEQ_CST);
}

// ---- execution --------------------------------------------------------------

static loomResult_t task_run_ops(loom_task_t *t)
{
    struct loomComm *comm = t->comm;
    loomResult_t res = loomSuccess;
    int np2p = 0;
    for (int i = 0; i < t->nops; i++)
        np2p += op_is_p2p(&t->ops[i]);
    loom_p2p_req_t reqs_small[4]; /* a Send, a Recv or a small exchange: no allocation */
    loom_p2p_req_t *reqs = reqs_small;
    if (np2p > 4 && (reqs = calloc((size_t)np2p, sizeof(*reqs))) == NULL) {
        LOOM_WARN("out of memory for %d send/receive requests", np2p);
        return loomSystemError;
    }
    if (reqs == reqs_small && np2p > 0) /* a collective alone needs none */
        memset(reqs_small, 0, sizeof(reqs_small));
    int nreq = 0;
    if (np2p > 0) /* collectives set their own context */
        loom_p2p_set_context(comm->p2p, "send/recv", comm->coll.seq);
    for (int i = 0; i < t->nops && np2p > 0; i++) {
        loom_op_t *op = &t->ops[i];
        if (op->kind == LOOM_OP_SEND)
            LOOM_CHECK_GOTO(loom_p2p_isend(comm->p2p, op->peer, op->sendbuff, op->nbytes,
                                           LOOM_TAG_P2P, &reqs[nreq++]),
                            res, out);
        else if (op->kind == LOOM_OP_RECV)
            LOOM_CHECK_GOTO(loom_p2p_irecv(comm->p2p, op->peer, op->recvbuff, op->nbytes,
                                           LOOM_TAG_P2P, &reqs[nreq++]),
                            res, out);
    }
    for (int i = 0; i < t->nops; i++)
        if (!op_is_p2p(&t->ops[i]))
            LOOM_CHECK_GOTO(run_collective(comm, &t->ops[i]), res, out);
    if (nreq > 0) {
        loom_p2p_set_context(comm->p2p, "send/recv", comm->coll.seq);
        LOOM_CHECK_GOTO(loom_p2p_wait_all(comm->p2p, reqs, nreq), res, out);
        for (int i = 0; i < nreq; i++) {
            if (!reqs[i].is_send && reqs[i].done_bytes != reqs[i].nbytes) {
                LOOM_WARN("rank %d: rank %d sent %zu bytes to a receive of %zu bytes", comm->rank,
                          reqs[i].peer, reqs[i].done_bytes, reqs[i].nbytes);
                res = loomInvalidUsage;
            }
        }
    }
out:
    if (reqs != reqs_small)
        free(reqs);
    return res;
}

/* Passes the turn on. Whoever serves next reads `waiters` after this store and a sleeper reads
 * now_serving after counting itself in it: with membarrier the sleeper's loom_call_fence orders
 * both, and this store needs no barrier of its own (the locked instruction it took cost the
 * 8-byte calls about 5 ns); without, the store is the barrier. */
static void serve_next(struct loomComm *comm, uint64_t ticket)
{
    if (loom_call_fence_ready()) {
        __atomic_store_n(&comm->now_serving, ticket + 1, __ATOMIC_RELEASE);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(&comm->now_serving, ticket + 1, __ATOMIC_SEQ_CST);
    }
}

/* Waits for the task's turn; returns 1 if the communicator was aborted first.
 * The task whose turn it is takes no lock (the common case: one thread issuing). */
static int ticket_wait(struct loomComm *comm, uint64_t ticket)
{
    if (__atomic_load_n(&comm->now_serving, __ATOMIC_ACQUIRE) == ticket &&
        !__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&comm->lock);
    __atomic_add_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
    /* The other half of serve_next's light store. Should it fail, a wake-up may be lost:
     * then look again every millisecond rather than sleep for good. */
    const int fenced = loom_call_fence();
    while (__atomic_load_n(&comm->now_serving, __ATOMIC_SEQ_CST) != ticket &&
           !__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        if (fenced) {
            pthread_cond_wait(&comm->cond, &comm->lock);
            continue;
        }
        const struct timespec until = loom_clock_in_us(CLOCK_REALTIME, 1000);
        pthread_cond_timedwait(&comm->cond, &comm->lock, &until);
    }
    __atomic_sub_fetch(&comm->waiters, 1, __ATOMIC_SEQ_CST);
    int aborted = __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&comm->lock);
    return aborted;
}

loomResult_t loom_task_execute(loom_task_t *t)
{
    struct loomComm *comm = t->comm;
    loomResult_t res;
    int aborted = ticket_wait(comm, t->ticket);
    if (aborted) {
        /* One WARN came from the abort itself; queued work must not flood the log. */
        loom_set_last_error("rank %d: operation on communicator %s not run: the communicator "
                            "was %s",
                            comm->rank, comm->name,
                            __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)
                                ? "revoked (loomCommRevoke)"
                                : "aborted");
        res = loomRemoteError;
    } else {
        loom_debug_set_rank(comm->rank);
        res = task_run_ops(t);
        serve_next(comm, t->ticket);
    }
    loom_comm_wake(comm);
    return res;
}

void loom_task_skip(loom_task_t *t)
{
    struct loomComm *comm = t->comm;
    if (!ticket_wait(comm, t->ticket))
        serve_next(comm, t->ticket);
    loom_comm_wake(comm);
}

// ---- entry from the API -------------------------------------------------------

/* Adds op to the group's task for comm, the first operation on comm making
 * it; the task runs on the first stream any of its operations named. */
static loomResult_t group_record(struct loomComm *comm, const loom_op_t *op, loomStream_t stream)
{
    loom_task_t *t = group.tasks;
    while (t && t->comm != comm)
        t = t->next;
    if (t == NULL) {
        LOOM_CHECK(task_park(comm, &t));
        t->next = group.tasks;
        group.tasks = t;
    }
    if (t->stream == NULL && stream != NULL) {
        LOOM_CHECK(loom_stream_hold(stream, "stream argument"));
        t->stream = stream;
    }
    return task_add(t, op);
}

loomResult_t loom_enqueue(loomComm_t comm, loom_op_t *op, loomStream_t stream)
{
    if (__builtin_expect(comm->dev == NULL, 1)) {
        /* Device memory on a communicator without a device path fails here, on this rank,
         * before it takes a ticket: the host path would read it as host memory. */
        const loom_devrt_t *rt = loom_devrt_found();
        if (__builtin_expect(rt != NULL, 0) && loom_dev_op_on_device_rt(rt, op)) {
            op_free(op);
            return loom_dev_refuse_op(comm);
        }
    }
    if (group.depth == 0 && stream == NULL) {
        if (__builtin_expect(comm->dev != NULL, 0) && loom_dev_op_on_device(comm->dev, op))
            return loom_dev_submit_op(comm, op, NULL); /* consumes op */
        /* Runs before returning, under the caller's reference: a task on the stack that
         * runs the caller's op where it is (a copy of a just-written op costs stalled
         * loads on the 8-byte path). */
        loom_task_t t; /* `first` stays unset: ops points at the caller's op */
        t.comm = comm;
        t.ops = op;
        t.nops = t.cap = 1;
        t.stream = NULL;
        t.next = NULL;
        task_take_ticket(&t);
        loomResult_t res = loom_task_execute(&t);
        op_free(op);
        return res;
    }
    if (group.depth == 0) /* consumes op */
        return loom_stream_push_op(stream, comm, op,
                                   comm->dev != NULL && loom_dev_op_on_device(comm->dev, op));
    loomResult_t res = group_record(comm, op, stream);
    if (res != loomSuccess)
        op_free(op);
    return res;
}

int loom_group_is_open(void)
{
    return group.depth > 0;
}

LOOM_API loomResult_t loomGroupStart(void)
{
    group.depth++;
    return loomSuccess;
}

static void *group_thread(void *arg)
{
    loom_task_t *t = arg;
    loomResult_t res = loom_task_execute(t);
    return (void *)(intptr_t)res;
}

/* Makes a task recorded in the group one that may run: its parked reference
 * becomes one that a teardown waits for, taken from the registry, so that a
 * communicator destroyed or aborted since the recording is not used. If it
 * was, the task is freed without running: InvalidArgument. */
static loomResult_t group_task_claim(loom_task_t *t)
{
    struct loomComm *comm = t->comm;
    loomResult_t res = loom_comm_acquire(comm, NULL);
    pthread_mutex_lock(&comm->lock);
    comm->parked--;
    pthread_mutex_unlock(&comm->lock);
    if (res == loomSuccess) {
        loom_comm_release(comm); /* the parked reference; the task keeps the one just taken */
        return loomSuccess;
    }
    /* The parked reference kept the memory, so the communicator's fields are still there. */
    LOOM_WARN("loomGroupEnd: rank %d: communicator %s was destroyed or aborted after %d "
              "operation(s) were recorded on it in this group; they are not run",
              comm->rank, comm->name, t->nops);
    loom_task_free(t);
    return loomInvalidArgument;
}

/* Runs the tasks without a stream: inline for one communicator; one thread per
 * communicator when the group spans several, since each may wait on peers
 * that are themselves waiting on another of the group's communicators. */
static loomResult_t group_run_blocking(loom_task_t **tasks, int n)
{
    loomResult_t res = loomSuccess;
    pthread_t *threads = n > 1 ? calloc((size_t)n, sizeof(*threads)) : NULL;
    int *started = n > 1 ? calloc((size_t)n, sizeof(*started)) : NULL;
    for (int i = 1; i < n; i++) {
        if (threads && started && pthread_create(&threads[i], NULL, group_thread, tasks[i]) == 0) {
            started[i] = 1;
        } else {
            LOOM_WARN("cannot start a thread for communicator %d of a group", i);
            res = loomSystemError;
        }
    }
    if (n > 0)
        LOOM_CHECK_IGNORE(loom_task_execute(tasks[0]), res);
    for (int i = 1; i < n; i++) {
        if (started && started[i]) {
            void *ret = NULL;
            pthread_join(threads[i], &ret);
            LOOM_CHECK_IGNORE((loomResult_t)(intptr_t)ret, res);
        } else {
            /* Not started: its ticket must still be consumed so later tasks can run. */
            LOOM_CHECK_IGNORE(loom_task_execute(tasks[i]), res);
        }
    }
    free(threads);
    free(started);
    return res;
}

LOOM_API loomResult_t loomGroupEnd(void)
{
    if (group.depth == 0) {
        LOOM_WARN("loomGroupEnd without a matching loomGroupStart");
        return loomInvalidUsage;
    }
    if (--group.depth > 0)
        return loomSuccess;
    int n = 0;
    for (loom_task_t *t = group.tasks; t; t = t->next)
        n++;
    loom_task_t **blocking = calloc((size_t)n + 1, sizeof(*blocking));
    loom_dev_call_t **waits = NULL; /* device tasks without a stream, waited for last */
    int nw = 0;
    loom_task_t *t = group.tasks, *next;
    group.tasks = NULL;
    loomResult_t res = loomSuccess;
    int nb = 0;
    /* The list was built by prepending: take tickets in first-touched order. */
    loom_task_t *rev = NULL;
    for (; t; t = next) {
        next = t->next;
        t->next = rev;
        rev = t;
    }
    for (t = rev; t; t = next) {
        next = t->next;
        t->next = NULL;
        loomStream_t stream = t->stream;
        loomResult_t claimed = group_task_claim(t);
        const int dev = claimed == loomSuccess && t->comm->dev != NULL &&
                        loom_dev_task_on_device(t->comm->dev, t);
        if (claimed == loomSuccess && stream != NULL)
            claimed = loom_stream_push(stream, t, dev); /* consumes t on failure */
        if (stream != NULL)
            loom_stream_release(stream); /* the group's: a queued task needs none */
        LOOM_CHECK_IGNORE(claimed, res);
        if (claimed != loomSuccess || stream != NULL)
            continue;
        if (dev) { /* issued now, in ticket order; waited for once the others are under way */
            loom_dev_call_t *w = NULL;
            if (waits == NULL)
                waits = calloc((size_t)n, sizeof(*waits));
            LOOM_CHECK_IGNORE(loom_dev_submit_task(t, NULL, &w), res);
            if (w != NULL && waits != NULL)
                waits[nw++] = w;
            else if (w != NULL)
                LOOM_CHECK_IGNORE(loom_dev_call_wait(w), res);
            continue;
        }
        task_take_ticket(t);
        if (blocking != NULL) {
            blocking[nb++] = t;
        } else {
            LOOM_CHECK_IGNORE(loom_task_execute(t), res);
            loom_task_free(t);
        }
    }
    if (blocking != NULL) {
        LOOM_CHECK_IGNORE(group_run_blocking(blocking, nb), res);
        for (int i = 0; i < nb; i++)
            loom_task_free(blocking[i]);
        free(blocking);
    }
    for (int i = 0; i < nw; i++)
        LOOM_CHECK_IGNORE(loom_dev_call_wait(waits[i]), res);
    free(waits);
    return res;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * lifecycle.c - what happens to a communicator after creation: split,
 * destroy, abort, and the queries. Destroy waits for this rank's queued
 * work; abort stops it (every wait checks the abort flag) and never waits
 * for peers. Both tear down once every call in progress and every issued task
 * has let go of the communicator, but neither waits for operations recorded
 * in a group that is still open: loomGroupEnd, which may never come (or come
 * from the very thread tearing down), finds the communicator gone and fails
 * them. Neither touches a handle that is no longer live: a second call on a
 * freed handle gets InvalidArgument from the registry.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "comm.h"
#include "dev_comm.h"
#include "init.h"
#include "timer.h"

/* The flag stops host waits; the device path's release ends every wait its streams queued
 * (under the lock, which a teardown takes before it frees the device state). */
static void set_abort_flag(struct loomComm *c)
{
    pthread_mutex_lock(&c->lock);
    __atomic_store_n(&c->abort_flag, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->cond);
    loom_dev_comm_release(c);
    pthread_mutex_unlock(&c->lock);
}

/* Whether a reference other than the caller's `mine` is in use, or a thread's slot holds the
 * communicator (call_guard.h; a revoke's own thread's aside, its call being one of them): held
 * by a call in progress or an issued task. Those end by themselves within the timeout, and at
 * once after an abort. The references of tasks recorded in open groups (parked) only keep the
 * memory: they are not waited for. Under c->lock, which `parked` changes under together with
 * its references, so the two counts read here agree. */
static int comm_in_use(struct loomComm *c, int mine, int closing)
{
    if (loom_call_slots_hold(c, !closing)) /* first: see call_guard.h */
        return 1;
    return __atomic_load_n(&c->refs, __ATOMIC_SEQ_CST) - c->parked > mine;
}

/* Waits until no reference but the caller's `mine` and the parked ones is in use. closing:
 * mark the communicator closing first (a teardown). */
static void wait_idle(struct loomComm *c, int mine, int closing)
{
    pthread_mutex_lock(&c->lock);
    if (closing)
        __atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
    /* The registry closed the handle (a teardown) or the abort flag is up (a revoke): calls
     * that entered before are visible in their slots from here on, later ones are refused.
     * Should the barrier fail, a slot store still in flight has long landed a millisecond on. */
    if (!loom_call_fence()) {
        const struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    __atomic_add_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
    while (comm_in_use(c, mine, closing)) {
        /* A release that read `closing` before it was set wakes nobody: look again
         * every millisecond (loom_comm_release). */
        const struct timespec until = loom_clock_in_us(CLOCK_REALTIME, 1000);
        pthread_cond_timedwait(&c->cond, &c->lock, &until);
    }
    __atomic_sub_fetch(&c->waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->lock);
}

/* Waits until no reference but the caller's and the parked ones is in use,
 * frees the connections, takes the communicator out of the registry and
 * drops the caller's reference (the last reference frees the memory). */
static loomResult_t comm_teardown(struct loomComm *c)
{
    wait_idle(c, 1, 1);
    loom_dev_comm_destroy(c); /* its queued device work, threads and transports */
    loomResult_t res = loom_p2p_destroy(c->p2p);
    c->p2p = NULL;
    /* The arena after the layer: peers read why this rank left from its notices, and no
     * wait of this rank can touch the arena any more. */
    LOOM_CHECK_IGNORE(loom_coll_ctx_close(&c->coll), res);
    LOOM_INFO(LOOM_LOG_INIT, "comm %s rank %d nranks %d - %s COMPLETE", c->name, c->rank, c->nranks,
              __atomic_load_n(&c->abort_flag, __ATOMIC_ACQUIRE) ? "Abort" : "Destroy");
    (void)loom_registry_remove(&loom_comms, c, "loomCommDestroy");
    loom_comm_release(c);
    return res;
}

LOOM_API loomResult_t loomCommDestroy(loomComm_t comm)
{
    if (comm == NULL)
        return loomSuccess;
    /* Closing it in the registry stops new calls; a destroy or abort already under way owns
     * the teardown, and this one is a second call on the handle. */
    loom_registry_state_t was = loom_registry_close(&loom_comms, comm, 0, "loomCommDestroy");
    if (was == LOOM_REGISTRY_CLOSING)
        LOOM_WARN("loomCommDestroy: communicator %p is already being destroyed or aborted",
                  (void *)comm);
    if (was != LOOM_REGISTRY_LIVE)
        return loomInvalidArgument;
    return comm_teardown(comm);
}

LOOM_API loomResult_t loomCommAbort(loomComm_t comm)
{
    if (comm == NULL)
        return loomSuccess;
    /* With a reference of its own, the abort may set the flag also on a communicator whose
     * destroy waits for blocked work: the flag stops that work. */
    loom_registry_state_t was = loom_registry_close(&loom_comms, comm, 1, "loomCommAbort");
    if (was == LOOM_REGISTRY_ABSENT)
        return loomInvalidArgument;
    set_abort_flag(comm);
    loom_comm_release(comm);
    if (was == LOOM_REGISTRY_CLOSING)
        return loomSuccess;    /* the destroy or abort under way now stops its pending work */
    (void)comm_teardown(comm); /* errors of closing broken connections are expected here */
    return loomSuccess;
}

/* The abort flag stops what is pending (every wait checks it) and refuses what comes (a
 * task's turn checks it); once this rank's calls have let go, breaking the layer tells every
 * peer, whose waits on this rank then fail too. Without a release that wakes it (only a
 * teardown's releases do), the wait for the calls looks again every millisecond. */
void loom_comm_revoke(struct loomComm *c)
{
    if (__atomic_exchange_n(&c->revoked, 1, __ATOMIC_SEQ_CST))
        return;
    set_abort_flag(c);
    /* The user's reference and the calls of this thread (this one among them) aside. */
    wait_idle(c, 1 + loom_call_own_refs(c), 0);
    loom_p2p_fail(c->p2p, loomRemoteError);
    LOOM_INFO(LOOM_LOG_INIT, "comm %s rank %d nranks %d - Revoke COMPLETE", c->name, c->rank,
              c->nranks);
}

static loomResult_t revoke(loomComm_t comm, int flags)
{
    if (flags != LOOM_REVOKE_DEFAULT) {
        LOOM_WARN("loomCommRevoke: flags %d: only LOOM_REVOKE_DEFAULT (0) is defined", flags);
        return loomInvalidArgument;
    }
    loom_comm_revoke(comm);
    return loomSuccess;
}

LOOM_API loomResult_t loomCommRevoke(loomComm_t comm, int flags)
{
    LOOM_WITH_COMM(comm, "loomCommRevoke", revoke(comm, flags));
}

static loomResult_t get_async_error(loomComm_t comm, loomResult_t *asyncError)
{
    if (asyncError == NULL) {
        LOOM_WARN("loomCommGetAsyncError: asyncError is NULL");
        return loomInvalidArgument;
    }
    pthread_mutex_lock(&comm->lock);
    *asyncError = comm->async_error;
    if (comm->async_error != loomSuccess)
        loom_set_last_error("%s", comm->async_msg);
    pthread_mutex_unlock(&comm->lock);
    return loomSuccess;
}

LOOM_API loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t *asyncError)
{
    LOOM_WITH_COMM(comm, "loomCommGetAsyncError", get_async_error(comm, asyncError));
}

static loomResult_t count_ranks(const loomComm_t comm, int *count)
{
    if (count == NULL) {
        LOOM_WARN("loomCommCount: count is NULL");
        return loomInvalidArgument;
    }
    *count = comm->nranks;
    return loomSuccess;
}

LOOM_API loomResult_t loomCommCount(const loomComm_t comm, int *count)
{
    LOOM_WITH_COMM(comm, "loomCommCount", count_ranks(comm, count));
}

static loomResult_t user_rank(const loomComm_t comm, int *rank)
{
    if (rank == NULL) {
        LOOM_WARN("loomCommUserRank: rank is NULL");
        return loomInvalidArgument;
    }
    *rank = comm->rank;
    return loomSuccess;
}

LOOM_API loomResult_t loomCommUserRank(const loomComm_t comm, int *rank)
{
    LOOM_WITH_COMM(comm, "loomCommUserRank", user_rank(comm, rank));
}

typedef struct {
    int32_t color;
    int32_t key;
    int32_t rank;
} split_entry_t;

static int split_cmp(const void *a, const void *b)
{
    const split_entry_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

/* Split: (1) all-gather color and key over the parent; (2) the first member of
 * each color makes a unique id; (3) all-gather the ids; (4) init the child. */
static loomResult_t split(loomComm_t comm, int color, int key, loomComm_t *newcomm,
                          loomConfig_t *config)
{
    if (newcomm == NULL) {
        LOOM_WARN("loomCommSplit: newcomm is NULL");
        return loomInvalidArgument;
    }
    const int n = comm->nranks;
    loomResult_t res = loomSuccess;
    split_entry_t mine = {.color = color < 0 ? -1 : color, .key = key, .rank = comm->rank};
    split_entry_t *all = calloc((size_t)n, sizeof(*all));
    loomUniqueId *ids = calloc((size_t)n, sizeof(*ids));
    if (all == NULL || ids == NULL) {
        LOOM_WARN("loomCommSplit: out of memory for %d ranks", n);
        res = loomSystemError;
        goto out;
    }
    LOOM_CHECK_GOTO(loomAllGather(&mine, all, sizeof(mine), loomUint8, comm, NULL), res, out);
    int members = 0, first = -1;
    for (int r = 0; r < n; r++) {
        if (all[r].color == mine.color && mine.color >= 0) {
            if (first < 0)
                first = r;
            all[members++] = all[r];
        }
    }
    loomUniqueId my_id;
    memset(&my_id, 0, sizeof(my_id));
    if (first == comm->rank)
        LOOM_CHECK_GOTO(loomGetUniqueId(&my_id), res, out);
    LOOM_CHECK_GOTO(loomAllGather(&my_id, ids, sizeof(my_id), loomUint8, comm, NULL), res, out);
    if (mine.color < 0) {
        *newcomm = NULL;
        goto out;
    }
    qsort(all, (size_t)members, sizeof(*all), split_cmp);
    int newrank = 0;
    while (all[newrank].rank != comm->rank)
        newrank++;
    loomConfig_t inherited = LOOM_CONFIG_INITIALIZER;
    inherited.timeout_ms = (int)comm->timeout_ms;
    inherited.net = comm->net;
    res = loom_comm_init_checked(newcomm, members, ids[first], newrank,
                                 config ? config : &inherited, 0);
out:
    free(all);
    free(ids);
    return res;
}

LOOM_API loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t *newcomm,
                                    loomConfig_t *config)
{
    LOOM_WITH_COMM(comm, "loomCommSplit", split(comm, color, key, newcomm, config));
}

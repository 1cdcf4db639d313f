/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_state.h - what the files of the device path's entry share: a
 * communicator's device state (dev_comm.c), an issued call (dev_issue.c),
 * the proxy and watchdog threads (dev_proxy.c) and the staged transport's
 * own entry points (devtp_staged.c, staged_plan.c).
 *
 * A call's life: issued under the state's lock (ticket, queued device work,
 * appended to the proxy's queue and to the list of live calls); the proxy
 * runs its host side in ticket order and lets go of its operations and of
 * the communicator; the watchdog sees its event pass (or times it out) and
 * takes it off the live list. A call is freed with its last reference: the
 * issuer's or waiter's, the proxy's and the watchdog's.
 */
#ifndef LOOM_DEV_STATE_H
#define LOOM_DEV_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "comm.h"
#include "dev_comm.h"
#include "dev_flags.h"
#include "devtp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a call was issued. */
typedef enum {
    LOOM_DEV_WAIT,    /* the NULL stream: the communicator's own stream, the issuer waits */
    LOOM_DEV_GATED,   /* a worker stream: the own stream behind a gate the worker opens */
    LOOM_DEV_WRAPPED, /* a wrapping loom stream: its device stream, returns once queued */
    LOOM_DEV_RAW      /* a device stream given directly (the staged table's run) */
} loom_dev_mode_t;

/* Where a call is. */
enum { LOOM_DEV_PH_QUEUED, LOOM_DEV_PH_EXECUTING, LOOM_DEV_PH_RELEASED };

struct loom_dev_call {
    int refs; /* atomic */
    loom_dev_state_t *d;
    loom_task_t task; /* the operations (owned), the ticket, a reference on the communicator
                         until the proxy lets go */
    loom_op_t *xops;  /* staged: task's operations on staging pointers ([task.nops]) */
    int tp;           /* the transport's index */
    loom_dev_mode_t mode;
    uint64_t seq;        /* the communicator's device call number, from 1 */
    char name[64];       /* "AllReduce #12": messages name the call */
    loom_dev_flags_t fl; /* ready, done, freed, gate (other transports: freed only) */
    loom_dev_event_t ev; /* recorded after the call; NULL while the stream captures */
    loomStream_t stream; /* the wrapping loom stream (a reference), or NULL */
    loom_dev_wrap_t *wrap;
    /* What this call's stream waits for before the call (its freed word), while it may still
     * run (a reference, dropped once this call completed): for a staged call its staging
     * slot's previous user; for another transport's call the communicator's previous one of
     * those when that one is on another stream (their device work must not interleave). */
    struct loom_staged_plan *plan; /* where its device memory goes in the staging */
    void *stage;                   /* the staging buffer its plan lives in */
    struct loom_dev_call *slot_prev;
    int phase;           /* LOOM_DEV_PH_* (atomic) */
    uint64_t phase_ns;   /* when it entered the phase (atomic) */
    loomResult_t result; /* the host side's result, valid once proxied */
    char msg[256];
    int proxied;   /* the proxy is done with it (atomic) */
    int task_gone; /* the task's operations and reference were let go */
    int completed; /* its event passed (atomic) */
    struct loom_dev_call *live_next, *fifo_next;
};

#define LOOM_DEV_WHY_BYTES 160

struct loom_dev_state {
    loom_dev_comm_t dc;                      /* first: what the transports see */
    const loom_devtp_t *tps[LOOM_DEVTP_NUM]; /* NULL: not in this build */
    struct loomComm *comm;
    const loom_devrt_t *rt;
    /* lock: the issue order (tickets, staging slots, the order of direct calls), held across
     * the queueing of a call's device work, which a full device queue may block. qlock: the
     * proxy's queue, the live list, the failure and the threads' stop, held briefly (the
     * watchdog's event queries at most), so that a release, the proxy and the watchdog never
     * wait for an issue blocked on its stream. Order: c->lock, lock, qlock. */
    pthread_mutex_t lock;
    pthread_mutex_t qlock;
    pthread_mutex_t start_lock; /* the threads' start */
    pthread_mutex_t evlock;     /* the spare events and the graveyard */
    pthread_cond_t work;        /* the proxy sleeps here while its queue is empty */
    pthread_cond_t wd;          /* the watchdog sleeps here while nothing is live */
    loom_dev_stream_t own;      /* the communicator's own stream, made on first use */
    int own_made;
    uint64_t next_seq;
    loom_dev_call_t *fifo_head, *fifo_tail; /* the proxy's queue, in ticket order */
    loom_dev_call_t *live_head, *live_tail; /* issued, not yet seen complete, in issue order */
    int threads;                            /* the proxy and watchdog run */
    pthread_t proxy, watchdog;
    int stop;              /* the threads leave (under qlock) */
    int failed;            /* released: calls are refused, the proxy skips (atomic) */
    loomResult_t fail_res; /* why (under qlock) */
    char fail_msg[256];
    uint64_t last_done_ns; /* the watchdog's last completion (its clock for the oldest call) */
    loom_dev_call_t *last_direct;         /* the last call of another transport than staged (a
                                             reference), NULL once it completed or captured */
    loom_dev_stream_t last_direct_stream; /* its stream */
    loom_dev_event_t *evs;                /* spare events */
    int nev, cap_ev;
    void **graveyard; /* staging outgrown: freed by the teardown */
    int ngrave, cap_grave;
    int trace; /* LOOM_COLL_TRACE */
    int leak;  /* the teardown could not see every call complete: keep what they touch */
};

/* dev_comm.c */
/* Marks the state failed (the first reason is kept), sets the communicator's
 * asynchronous error and calls every open transport's release(). */
void loom_dev_fail(loom_dev_state_t *d, loomResult_t res, const char *msg);
/* The transport for a call (index into tps), and why it and not another, for
 * the trace; -1 with why when none runs it. */
int loom_dev_choose(loom_dev_state_t *d, const loom_task_t *t, char *why, size_t why_len);
/* Stores LOOM_DEV_FLAG_ABORT in every word of the call a wait of its stream may
 * be on (gate, done, freed), so that its stream passes the call. */
void loom_dev_call_abort_words(loom_dev_call_t *c);
/* Pinned staging no longer used for new calls: freed by the teardown once
 * every call completed (a free of pinned memory waits for every stream). */
void loom_dev_grave(loom_dev_state_t *d, void *pinned);

/* dev_issue.c */
void loom_dev_call_release(loom_dev_call_t *call);
/* The call's event passed (or its stream failed): what waited on its completion
 * lets go (its staging slot's previous user). Once per call. */
void loom_dev_call_completed(loom_dev_call_t *call);
/* Issues t (moved in) in mode on device stream ds. On success *call_p holds a
 * reference for the caller. */
loomResult_t loom_dev_issue(loom_dev_state_t *d, loom_task_t *t, loom_dev_mode_t mode,
                            loomStream_t ls, loom_dev_stream_t ds, loom_dev_call_t **call_p);
/* The communicator's own stream, made on first use (under d->lock). */
loomResult_t loom_dev_own_stream(loom_dev_state_t *d, loom_dev_stream_t *s);

/* dev_proxy.c */
/* Starts the proxy and the watchdog once (not under d->lock). */
loomResult_t loom_dev_threads_start(loom_dev_state_t *d);
void loom_dev_threads_stop(loom_dev_state_t *d);
/* Waits until call's event passed: polls with backoff; bounded by the timeout
 * and by the abort or failure of the communicator. */
loomResult_t loom_dev_poll_complete(loom_dev_state_t *d, loom_dev_call_t *call);
/* A backoff step of a polling loop: yields, then sleeps longer and longer (up to 1 ms). */
void loom_dev_backoff(unsigned *step);

/* devtp_staged.c: the staged transport's part of an issue and of the proxy. */
/* Before the lock: the staging plan of the call (its extents of device memory). */
loomResult_t loom_staged_prepare(loom_dev_state_t *d, loom_dev_call_t *call);
/* Under the lock, before the ticket is taken: a staging slot large enough. */
loomResult_t loom_staged_reserve(loom_dev_state_t *d, loom_dev_call_t *call);
/* Under the lock, after the ticket: the call's work queued on ds. */
loomResult_t loom_staged_queue(loom_dev_state_t *d, loom_dev_call_t *call, loom_dev_stream_t ds);
/* The proxy's part: waits for the ready flag, runs the host side, stores done. */
void loom_staged_proxy(loom_dev_state_t *d, loom_dev_call_t *call);
/* Frees what a call held of the staging (the call is complete, or never ran). */
void loom_staged_call_free(loom_dev_state_t *d, loom_dev_call_t *call);
/* The table's release for the staged calls of d (under no lock). */
void loom_staged_release_calls(loom_dev_state_t *d);

static inline int loom_dev_aborted(const loom_dev_state_t *d)
{
    return __atomic_load_n(d->dc.abort_flag, __ATOMIC_ACQUIRE) != 0;
}
static inline int loom_dev_failed(const loom_dev_state_t *d)
{
    return __atomic_load_n(&d->failed, __ATOMIC_ACQUIRE) != 0;
}

#ifdef __cplusplus
}
#endif

#endif

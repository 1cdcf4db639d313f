/* SPDX-License-Identifier: Apache-2.0
 *
 * comm.h - the communicator, the recorded operation and the task (a group of
 * operations on one communicator that executes as a unit), shared by the
 * public entry points in this folder.
 *
 * Ordering: each task takes a ticket from its communicator when it is issued;
 * tasks execute in ticket order whatever thread or stream runs them, so every
 * rank sees the same order of collectives as long as it issues them in the
 * same order (NCCL's rule).
 */
#ifndef LOOM_API_COMM_H
#define LOOM_API_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "call_guard.h"
#include "check.h"
#include "coll.h"
#include "echo.h"
#include "loom.h"
#include "p2p.h"
#include "registry.h"
#include "secret.h"
#include "socket.h"

struct loomComm {
    int rank;
    int nranks;
    int local_rank; /* rank among ranks with the same host id */
    int local_size;
    int64_t timeout_ms;
    int64_t spin_ns; /* a stream's worker and synchronizer yield this long before sleeping */
    char name[64];
    loom_peer_info_t *peers; /* [nranks] */
    loom_p2p_t *p2p;
    loom_coll_ctx_t coll;
    loom_echo_ctx_t *echo;   /* Echo's engine, made at first use (atomic pointer) */
    volatile int abort_flag; /* set by loomCommAbort; every wait checks it */
    char net[64];            /* transports allowed (config or LOOM_NET) */

    /* The counters are atomics, so that a call whose turn it is takes no lock;
     * a thread that must wait for one to change sleeps on cond under lock, counted
     * in waiters, and whoever changes it broadcasts only when waiters is non-zero
     * (loom_comm_wake). */
    pthread_mutex_t lock;     /* protects the sleeps on cond and the async error */
    pthread_cond_t cond;      /* now_serving moved, refs dropped or the communicator aborted */
    uint64_t next_ticket;     /* next ticket to hand out */
    uint64_t now_serving;     /* ticket allowed to execute */
    int refs;                 /* 1 for the user + 1 per call in progress, per queued task and
                                 per task recorded in an open group; the last one frees */
    int parked;               /* of refs, those of tasks recorded in open groups (under lock) */
    int waiters;              /* threads asleep (or about to sleep) on cond */
    int closing;              /* teardown waits for refs: releases take the lock from then on */
    loomResult_t async_error; /* first failure of a stream task */
    char async_msg[256];

    /* Shrink and revoke (shrink.c, lifecycle.c). Each rank listens from creation on, so that
     * survivors of a failure can meet without this communicator's connections; nobody
     * accepts on it until a shrink makes this rank the leader of their rendezvous. */
    int shrink_fd;                     /* this rank's listener, -1 if none */
    loom_sockaddr_t *shrink_addrs;     /* [nranks]: every rank's listener */
    uint8_t secret[LOOM_SECRET_BYTES]; /* the job secret a shrink derives its own from */
    uint32_t shrinks;                  /* shrinks made of this communicator */
    int revoked;                       /* loomCommRevoke ran (atomic) */

    /* The device path (src/device/transport/dev_comm.h): set at creation when the process has
     * a device runtime, NULL otherwise; a task goes there when it names device memory or its
     * stream wraps a device stream. Host tasks of a communicator without it pay one load. */
    struct loom_dev_state *dev;
    const struct loom_devrt *dev_rt; /* loom_devrt() when this rank joined (init.c) */
    int dev_rt_absent;               /* the first rank that joined without one, -1: none */
};

typedef enum { LOOM_OP_COLL, LOOM_OP_SEND, LOOM_OP_RECV, LOOM_OP_ECHO } loom_op_kind_t;

/* One recorded operation; only the member of its kind is set (a smaller op is
 * cheaper to build on the 8-byte path). */
typedef struct {
    loom_op_kind_t kind;
    union {
        loom_coll_args_t coll; /* LOOM_OP_COLL (V collectives: owned arrays) */
        loom_echo_args_t echo; /* LOOM_OP_ECHO (holds a reference on its state) */
        struct {               /* LOOM_OP_SEND, LOOM_OP_RECV */
            const void *sendbuff;
            void *recvbuff;
            size_t nbytes;
            int peer;
        };
    };
} loom_op_t;

typedef struct loom_task {
    struct loomComm *comm;
    loom_op_t *ops; /* &first, or a heap array once the task has more than one */
    int nops;
    int cap;
    uint64_t ticket;
    loomStream_t stream;    /* NULL: run by the issuing thread */
    struct loom_task *next; /* stream queue / group list */
    loomHostFn_t host_fn;   /* a host function's task (comm NULL, no ops) */
    void *host_arg;
    struct loom_dev_call *dev_call; /* a device task's turn on a worker stream (dev_comm.h):
                                       its operations went to the device path */
    loom_op_t first;                /* storage of a one-operation task (no second allocation) */
} loom_task_t;

/* The live communicators (init.c). */
extern loom_registry_t loom_comms;
/* Every entry point that touches a communicator holds a reference on it for
 * the whole call: InvalidArgument (with a message naming fn, unless fn is
 * NULL) unless comm is live; on success the caller owes one
 * loom_comm_release. */
loomResult_t loom_comm_acquire(loomComm_t comm, const char *fn);
/* Runs `call` (an expression of type loomResult_t) holding comm (call_guard.h: the thread's
 * slot, or a reference). */
#define LOOM_WITH_COMM(comm, fn, call)                                                             \
    do {                                                                                           \
        loom_guard_t with_comm_guard_;                                                             \
        LOOM_CHECK(loom_call_enter((comm), (fn), &with_comm_guard_));                              \
        loomResult_t with_comm_res_ = (call);                                                      \
        loom_call_leave((comm), with_comm_guard_);                                                 \
        return with_comm_res_;                                                                     \
    } while (0)
/* Records an operation: into the thread's open group, or as a task of its own
 * that runs now (stream NULL) or is queued on the stream. Takes ownership of
 * op's owned arrays. */
loomResult_t loom_enqueue(loomComm_t comm, loom_op_t *op, loomStream_t stream);
/* Whether the calling thread has a group open (loomGroupStart not yet ended). */
int loom_group_is_open(void);
/* Executes a task on the calling thread in its turn; frees nothing. */
loomResult_t loom_task_execute(loom_task_t *task);
/* Lets the task's turn pass without running it (the device path: a call whose work is on
 * the device, or one that cannot run); returns at once if the communicator was aborted. */
void loom_task_skip(loom_task_t *task);
/* Frees what an operation owns (its V arrays, its Echo state reference). */
void loom_op_release(loom_op_t *op);
void loom_task_free(loom_task_t *task);
/* What loom_task_free does short of freeing the task itself: its operations'
 * arrays and its reference on the communicator (for tasks kept for reuse). */
void loom_task_release(loom_task_t *task);
/* Drops a reference to the communicator; frees it at zero. */
void loom_comm_release(struct loomComm *comm);
/* Wakes every thread asleep on comm->cond; costs no lock when none is. Call it
 * after changing what they wait for (seq_cst store), so that a waiter either
 * sees the change or is counted in comm->waiters before this looks. */
void loom_comm_wake(struct loomComm *comm);
/* Streams (stream.c). A stream is freed when its last reference goes: the
 * user's (until loomStreamDestroy), those of calls in progress on it and
 * those of group tasks recorded for it; queued tasks hold none, since the
 * destroy lets its worker run them all. */
/* A reference for a task recorded in a group: InvalidArgument (WARN naming
 * fn) unless the stream is live. */
loomResult_t loom_stream_hold(loomStream_t stream, const char *fn);
void loom_stream_release(loomStream_t stream);
/* Queues a group's task on a stream whose reference the caller holds,
 * waiting while the queue is full (256 tasks), and takes the task's ticket in
 * queue order; a wrapping stream, or on_device (the task names device
 * memory), hands it to the device path (dev_comm.h), which then owns it.
 * InvalidArgument (WARN) once the stream's destroy has begun: then nothing is
 * queued and no ticket taken, and the task is still the caller's. */
loomResult_t loom_stream_push(loomStream_t stream, loom_task_t *task, int on_device);
/* The device stream a loom stream wraps (loomStreamCreateFromCuda), NULL for a worker stream. */
struct loom_dev_wrap *loom_stream_wrap(loomStream_t stream);
/* Another reference on a stream the caller holds one on. */
void loom_stream_retain(loomStream_t stream);
/* Queues one operation as a task of its own, taking its ticket and a
 * reference on comm (a task reused from the stream's spares, or a new one).
 * on_device: the operation names device memory (comm->dev set). A stream
 * that wraps a device stream hands the operation to the device path, as does
 * a worker stream when on_device (dev_comm.h). InvalidArgument unless the
 * stream is live (also once its destroy has begun), InvalidUsage for a
 * wrapping stream and a communicator without device state, SystemError if
 * out of memory; the operation is consumed either way. */
loomResult_t loom_stream_push_op(loomStream_t stream, struct loomComm *comm, loom_op_t *op,
                                 int on_device);
/* InvalidArgument unless stream is NULL or a live stream (an early check:
 * the calls that use the stream take their reference later). */
loomResult_t loom_stream_validate(loomStream_t stream);
/* Argument checks shared by the entry points (coll_api.c); each gives
 * InvalidArgument with a message naming fn. check_common: a valid stream and
 * datatype, and count * size * mult fits (*bytes_p = count * size).
 * check_buf: p may be NULL only when bytes is 0. check_overlap: send
 * [s, s+sn) and recv [r, r+rn) are disjoint unless s == inplace_at. */
loomResult_t loom_check_common(loomStream_t stream, loomDataType_t dt, size_t count, size_t mult,
                               const char *fn, size_t *bytes_p);
loomResult_t loom_check_buf(const void *p, size_t bytes, const char *what, const char *fn);
loomResult_t loom_check_overlap(const void *s, size_t sn, const void *r, size_t rn,
                                const void *inplace_at, const char *fn);
/* The communicator's Echo engine, made on first use; SystemError if out of memory. */
loomResult_t loom_comm_echo(struct loomComm *comm, loom_echo_ctx_t **ctx_p);
/* Drops a reference on an Echo state; frees it at zero (echo_api.c). */
void loom_echo_state_release(struct loomEchoState *state);
/* loomCommRevoke's work on a communicator the caller holds a reference on
 * (lifecycle.c): the abort flag, the wait for calls in progress, the notice
 * to every peer. Idempotent. */
void loom_comm_revoke(struct loomComm *comm);
/* Records an asynchronous failure on the communicator. */
void loom_comm_set_async_error(struct loomComm *comm, loomResult_t res, const char *msg);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_comm.h - the entry of loom's device path, as src/api sees it: each
 * communicator's device state (made at creation when the process has a
 * device runtime), the test that sends a task there, the ways a task is
 * issued (the NULL stream, a worker stream, a stream that wraps a device
 * stream) and the wrapped streams themselves.
 *
 * Order: a device task takes its communicator's ticket when it is issued,
 * as a host task does, and its host-side work (the staged transport's host
 * collective, or for the other transports the mere passing of its turn) runs
 * in ticket order on the communicator's proxy thread. Tasks are issued to
 * the device under one lock per communicator, so the calls of a
 * communicator reach its transports in ticket order on every rank.
 *
 * Streams: a wrapped stream's calls are queued on its device stream and
 * return; a NULL-stream call runs on the communicator's own device stream
 * and waits for it; a worker stream's call is queued on the communicator's
 * own device stream behind a gate that the worker opens when the call's turn
 * in the worker's queue comes, and the worker then waits for it. Every wait
 * is bounded by the communicator's timeout and ends at its abort.
 */
#ifndef LOOM_DEV_COMM_H
#define LOOM_DEV_COMM_H

#include "comm.h"
#include "devrt.h"
#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_dev_state loom_dev_state_t; /* dev_state.h */
typedef struct loom_dev_call loom_dev_call_t;   /* one device task issued */
typedef struct loom_dev_wrap loom_dev_wrap_t;   /* what a wrapping loom stream holds */

/* ---- communicators (dev_comm.c) ------------------------------------------ */

/* Called once c is listed in the registry, before anyone else has the handle:
 * when loom_devrt() gives a runtime, opens the device transports (ipc, nccl,
 * staged, collective: their exchanges run on c's host collectives) and sets
 * c->dev; without a runtime c->dev stays NULL and nothing happens.
 * LOOM_DEVICE_TRANSPORTS restricts the transports tried. Every rank returns
 * alike: a failure here (a peer gone) fails the creation. */
loomResult_t loom_dev_comm_create(struct loomComm *c);
/* The abort or revoke of c (any thread, any time, c->lock held): every
 * transport's release(), so that no queued wait of c's blocks any more;
 * later device calls fail. */
void loom_dev_comm_release(struct loomComm *c);
/* The teardown: after every task of c let go of it, before its point-to-point
 * layer goes. Waits (bounded by the timeout, then released) for c's queued
 * device work, stops its threads and closes the transports; an abort
 * meanwhile still releases it (the state goes under c->lock). */
void loom_dev_comm_destroy(struct loomComm *c);

/* loomCommDevicePlan's answer (dev_comm.c): the name of the transport c's
 * device path would run the collective call a on ("ipc", "nccl", "staged"),
 * with *capturable set, or NULL when none would (c has no device path, or no
 * transport of it runs the call); why (may be NULL) gets the reason either
 * way. Logs nothing. The caller holds a reference on c. */
const char *loom_dev_comm_plan(struct loomComm *c, const loom_coll_args_t *a, int *capturable,
                               char *why, size_t why_len);
/* Why c has no device path ("" when it has one): the process's reason for
 * having no device runtime, or that it found one only after c was created. */
const char *loom_dev_comm_why_none(struct loomComm *c);

/* ---- which tasks are device tasks (dev_issue.c) -------------------------- */

/* 1 if op names device memory: its send or receive buffer (for the V
 * collectives their base pointers) as the runtime's ptr_device sees it. One
 * pointer test per buffer. */
int loom_dev_op_on_device(const loom_dev_state_t *d, const loom_op_t *op);
/* The same for a communicator without a device state in a process that has a runtime (it
 * found one after c was made, or a peer had none): such memory cannot go the host way. */
int loom_dev_op_on_device_rt(const loom_devrt_t *rt, const loom_op_t *op);
/* InvalidUsage, with a WARN saying why c has no device path. */
loomResult_t loom_dev_refuse_op(struct loomComm *c);
int loom_dev_task_on_device(const loom_dev_state_t *d, const loom_task_t *t);

/* ---- issuing (dev_issue.c) ----------------------------------------------- */

/* One operation of c (moved in: its arrays are the device path's from here,
 * even on failure) on stream s: NULL (runs on c's own device stream; returns
 * when it completed, with its result) or a wrapping stream the caller holds
 * a reference on (returns once queued). InvalidUsage when c has no device
 * state. */
loomResult_t loom_dev_submit_op(struct loomComm *c, loom_op_t *op, loomStream_t s);
/* A group's task (a heap task holding its reference on its communicator;
 * freed here even on failure), without a stream or on a wrapping one. For
 * the NULL stream *wait_p (non-NULL then) gets the call to pass to
 * loom_dev_call_wait once the group's other tasks are issued. */
loomResult_t loom_dev_submit_task(loom_task_t *t, loomStream_t s, loom_dev_call_t **wait_p);
/* Waits for a NULL-stream call to complete and drops it; its result. */
loomResult_t loom_dev_call_wait(loom_dev_call_t *call);
/* A worker stream's device task, called by stream.c under the stream's lock
 * in place of taking the ticket: moves t's operations into a call queued on
 * the communicator's own device stream behind a gate and sets t->dev_call;
 * t keeps its reference on the communicator and is queued on the worker as
 * usual. On failure t has no operations left and no ticket. */
loomResult_t loom_dev_issue_gated(loom_task_t *t);
/* The worker's turn of such a task: opens the gate and waits for the call. */
loomResult_t loom_dev_gate_run(loom_task_t *t);

/* ---- wrapped device streams (dev_wrap.c) --------------------------------- */

/* What loomStreamCreateFromCuda's stream holds: the runtime's stream
 * dev_stream (NULL: its default stream). InvalidUsage without a runtime. */
loomResult_t loom_dev_wrap_create(void *dev_stream, loom_dev_wrap_t **w_p);
/* The device stream it wraps. */
void *loom_dev_wrap_stream(const loom_dev_wrap_t *w);
/* loomStreamSynchronize / loomStreamQuery / loomStreamLaunchHostFunc of the
 * wrapping stream (loom.h's semantics). */
loomResult_t loom_dev_wrap_sync(loom_dev_wrap_t *w);
loomResult_t loom_dev_wrap_query(loom_dev_wrap_t *w);
loomResult_t loom_dev_wrap_host_fn(loom_dev_wrap_t *w, loomHostFn_t fn, void *arg);
/* loomStreamDestroy's wait: everything queued so far completed, the host
 * functions ran and their thread ended; the first error not yet reported. */
loomResult_t loom_dev_wrap_finish(loom_dev_wrap_t *w);
/* After loom_dev_wrap_finish, once no call holds the stream. */
void loom_dev_wrap_free(loom_dev_wrap_t *w);
/* A failure of a call queued on the wrapped stream (the proxy and watchdog
 * report them here): kept for sync, query and the next host function. */
void loom_dev_wrap_note_error(loom_dev_wrap_t *w, loomResult_t res, const char *msg);
/* Marks the point after the work just queued on the wrapped stream (sync and
 * query wait for the last one); no-op while the stream captures. */
loomResult_t loom_dev_wrap_mark(loom_dev_wrap_t *w);

#ifdef __cplusplus
}
#endif

#endif

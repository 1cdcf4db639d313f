/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_comm.h - the shim's communicator object and the table of handles it
 * made, shared by the route and loom implementations (shim_impl_*.c).
 *
 * A handle the caller holds is looked up by value in the table before
 * anything touches it: in loom mode the handle is the address of the object
 * itself, in route mode it is the paired real NCCL communicator, which the
 * caller may pass to other tools (ProcessGroupNCCL._comm_ptr()). A value not
 * in the table is never dereferenced: route mode passes it to the real
 * library (a communicator someone else made, or the real library calling its
 * own API), loom mode refuses it.
 *
 * Lifetime: the table holds one reference, every call working on the object
 * one more; destroy and abort take the object out of the table (so no new
 * call finds it) and drop the table's reference; the last reference frees it.
 * An abort from another thread therefore never frees memory a blocked call
 * still uses; loomCommAbort unblocks that call.
 */
#ifndef LOOM_NCCL_SHIM_COMM_H
#define LOOM_NCCL_SHIM_COMM_H

#include <pthread.h>

#include "shim.h"

typedef struct shim_job shim_job_t;       /* a pending init or split (shim_init.h) */
typedef struct shim_premul shim_premul_t; /* PreMulSum ops (shim_premul.h) */
typedef struct shim_token shim_token_t;   /* a registration (shim_impl_misc.c) */
typedef struct shim_wrap shim_wrap_t;     /* a wrapped CUDA stream (shim_streams.h) */

typedef struct shim_comm {
    int refs;          /* atomic: the table's and one per call using the object */
    ncclComm_t handle; /* the caller's handle: real (route) or this object (loom) */
    ncclComm_t real;   /* the paired real communicator; NULL in loom mode */
    int rank, nranks;
    int hosts;    /* hosts the communicator spans, measured at init (routing rules) */
    int cudev;    /* ncclCommCuDevice in loom mode */
    int blocking; /* config->blocking (splits without config inherit it) */
    char name[128];
    int named; /* config->commName was given */

    pthread_mutex_t lock;
    pthread_cond_t cond; /* state left InProgress */
    /* Under lock. */
    loomComm_t loom;    /* loom's communicator once made; NULL after destroy/abort */
    ncclResult_t state; /* InProgress while the loom part is made (or a split from this
                           one runs), then Success or the failure of the init */
    char state_msg[256];
    shim_job_t *job; /* the init or split job that makes this object, until collected */
    int closing;     /* destroy or abort began: calls get InvalidArgument */
    shim_premul_t *premul;
    shim_token_t *tokens;
    /* Loom's device path (shim_streams.h): asked at the first call on device buffers. */
    int dev_known;
    const char *dev_runtime; /* "cuda", "emulated", or NULL: none (dev_why says why) */
    char dev_why[256];
    shim_wrap_t *wraps; /* [SHIM_WRAPS_MAX] once a call named a stream, NULL before */
    int nwraps;
    unsigned long long wrap_clock; /* stamps for the least recently used wrapper */
} shim_comm_t;

/* ---- modes ---------------------------------------------------------------- */

/* 1 in route mode with a real library; 0 in loom mode, and in route mode
 * without one (logged at INFO once, naming shim_real_why()). */
int shim_paired(void);

/* ---- the table ------------------------------------------------------------ */

/* A new object (one reference, the caller's), state InProgress, not listed. */
shim_comm_t *shim_comm_new(int rank, int nranks, int blocking, const char *name);
/* Lists c under c->handle (which must be set); takes one more reference for the table. */
ncclResult_t shim_comm_list(shim_comm_t *c);
/* The object listed under handle with a reference for the caller, or NULL. */
shim_comm_t *shim_comm_find(ncclComm_t handle);
/* Takes the object out of the table (its reference passes to the caller), or NULL. */
shim_comm_t *shim_comm_unlist(ncclComm_t handle);
void shim_comm_hold(shim_comm_t *c);
void shim_comm_release(shim_comm_t *c);

/* The loom communicator for a call, or an error: InvalidUsage while the
 * object is InProgress ("use before the previous operation returned
 * ncclSuccess", as NCCL), its init's failure, InvalidArgument once it is
 * being destroyed. fn names the call in the message. */
ncclResult_t shim_comm_ready(shim_comm_t *c, const char *fn, loomComm_t *loom);

/* ---- results -------------------------------------------------------------- */

/* shim_warn(fmt, ...) and returns res; the calling thread's last failure is
 * then the shim's (ncclGetLastError answers with its text). */
ncclResult_t shim_fail(ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* shim_from_loom(res), marking a failure as the shim's. */
ncclResult_t shim_loom(loomResult_t res);
/* A result of the real library: a failure marks the last failure as the real
 * library's (ncclGetLastError then asks it). Returns res. */
ncclResult_t shim_real_result(ncclResult_t res);
/* InvalidUsage: the real library does not export nccl<name> (an older NCCL). */
ncclResult_t shim_real_missing(const char *name);
/* Calls the real library's ncclResult_t function `name` with `args` (route
 * mode: shim_real() is not NULL), or fails if it lacks it. */
#define SHIM_REAL(name, args)                                                                      \
    (shim_real()->name != NULL ? shim_real_result(shim_real()->name args)                          \
                               : shim_real_missing(#name))
/* ncclCommAbort on a real communicator, for cleanup (its result is not the caller's). */
void shim_real_abort(ncclComm_t comm);
/* Whether the calling thread's last failure came from the real library. */
int shim_last_failure_real(void);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_init.h - making the loom side of a communicator: a job that runs
 * loomCommInitRankConfig (or loomCommSplit) and measures how many hosts the
 * new communicator spans, then publishes the result on the shim's object.
 *
 * A job runs inline (blocking init), on a detached thread of its own
 * (non-blocking init or split: the caller polls ncclCommGetAsyncError), or
 * with others at once (ncclCommInitAll, and the inits deferred to the
 * outermost ncclGroupEnd: one thread creating several communicators must not
 * wait for the first before starting the second). While it runs, the object
 * it makes (and a split's parent) is InProgress and owner->job points to it.
 * A job whose object was aborted meanwhile finishes by itself, aborts what it
 * made and frees everything: ncclCommAbort never waits for loom's rendezvous,
 * which no flag can interrupt, and nothing leaks once the job ends (within
 * loom's timeout at worst).
 */
#ifndef LOOM_NCCL_SHIM_INIT_H
#define LOOM_NCCL_SHIM_INIT_H

#include "shim_comm.h"

typedef enum { SHIM_JOB_INIT, SHIM_JOB_SPLIT } shim_job_kind_t;

struct shim_job {
    shim_job_kind_t kind;
    shim_comm_t *owner; /* owner->job == this job: init: the new object; split: the parent */
    shim_comm_t *child; /* the object made (init: == owner; split: NULL for no color) */
    loomUniqueId id;    /* init: loom's id */
    int color, key;     /* split */
    /* Route-mode non-blocking split: where the real library writes the child's
     * handle, perhaps only once its parent has left InProgress. */
    ncclComm_t *real_child;
    int started;
};

/* A job making c (whose rank, size and name are set) from loom's id. Holds a
 * reference on c and sets c->job. NULL if out of memory. */
shim_job_t *shim_job_new_init(shim_comm_t *c, const loomUniqueId *id);
/* A split of parent into child (NULL: no color). Holds references on both. */
shim_job_t *shim_job_new_split(shim_comm_t *parent, shim_comm_t *child, int color, int key);

/* Runs jobs[0..n) to their end: one inline, the others on threads of their
 * own, all at once. Returns the first failure (jobs are freed). */
ncclResult_t shim_jobs_run(shim_job_t **jobs, int n);
/* Starts job on a detached thread and returns at once. */
ncclResult_t shim_job_start(shim_job_t *job);
/* Frees a job that will not run (its object was aborted before its group ended). */
void shim_job_drop(shim_job_t *job);
/* Waits until owner has no job. */
void shim_job_wait(shim_comm_t *owner);

/* The loom config for an NCCL config's name (NULL: none). */
void shim_loom_config(loomConfig_t *lc, const shim_comm_t *c);

#endif

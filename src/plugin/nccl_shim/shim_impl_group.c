/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_impl_group.c - ncclGroupStart/End/SimulateEnd in route and loom modes,
 * and the per-thread group state (shim_group.h).
 *
 * The shim keeps its own depth per thread. Inits issued inside a group are
 * deferred to the outermost GroupEnd and then run all at once, so that one
 * thread creating several communicators in one group (as nccl-tests does)
 * does not wait on the first for peers that are waiting on the second.
 *
 * Loom mode: the calls inside a group are recorded and issued at the
 * outermost GroupEnd inside one loomGroupStart/End, after the deferred inits
 * (so a group may create a communicator and use it); GroupSimulateEnd drops
 * them instead, estimating their time from loomCommPlan where every call is
 * one it models.
 * Route mode: GroupStart/End go to the real library as well; every call
 * inside a group goes to NCCL (shim_route_decide), which also defers the
 * real halves of grouped inits; the loom halves run after the real GroupEnd.
 */
#include <stdlib.h>

#include "shim_group.h"

typedef struct {
    shim_job_t *job;
    int blocking;
} deferred_t;

static _Thread_local struct {
    int depth;
    deferred_t *jobs;
    int njobs, jcap;
    shim_op_t *ops;
    int nops, ocap;
} g;

int shim_group_depth(void)
{
    return g.depth;
}

ncclResult_t shim_group_defer(shim_job_t *job, int blocking)
{
    if (g.njobs == g.jcap) {
        int cap = g.jcap ? 2 * g.jcap : 8;
        deferred_t *j = realloc(g.jobs, (size_t)cap * sizeof(*j));
        if (j == NULL) {
            shim_job_drop(job);
            return shim_fail(ncclSystemError, "out of memory deferring an init to ncclGroupEnd");
        }
        g.jobs = j;
        g.jcap = cap;
    }
    g.jobs[g.njobs++] = (deferred_t){job, blocking};
    return ncclSuccess;
}

ncclResult_t shim_group_record(const shim_op_t *op)
{
    if (g.nops == g.ocap) {
        int cap = g.ocap ? 2 * g.ocap : 16;
        shim_op_t *o = realloc(g.ops, (size_t)cap * sizeof(*o));
        if (o == NULL)
            return shim_fail(ncclSystemError, "%s: out of memory recording a call of a group",
                             op->fn);
        g.ops = o;
        g.ocap = cap;
    }
    g.ops[g.nops++] = *op;
    return ncclSuccess;
}

/* Whether a deferred job may still run: neither the object it makes nor its
 * owner was destroyed or aborted meanwhile (then it is dropped). */
static int closing(shim_comm_t *c)
{
    pthread_mutex_lock(&c->lock);
    const int is = c->closing;
    pthread_mutex_unlock(&c->lock);
    return is;
}

static int claim(shim_job_t *job)
{
    if ((job->child != NULL && closing(job->child)) || closing(job->owner)) {
        shim_job_drop(job);
        return 0;
    }
    return 1;
}

/* Runs the deferred inits: the blocking ones all at once, waited for; the
 * others on threads of their own (then InProgress). */
static ncclResult_t run_deferred(deferred_t *jobs, int n)
{
    ncclResult_t res = ncclSuccess;
    int started_async = 0;
    shim_job_t **now = n > 0 ? calloc((size_t)n, sizeof(*now)) : NULL;
    int nnow = 0;
    for (int i = 0; i < n; i++) {
        if (!claim(jobs[i].job))
            continue;
        if (jobs[i].blocking && now != NULL) {
            now[nnow++] = jobs[i].job;
            continue;
        }
        ncclResult_t r =
            jobs[i].blocking ? shim_jobs_run(&jobs[i].job, 1) : shim_job_start(jobs[i].job);
        started_async |= !jobs[i].blocking && r == ncclSuccess;
        if (res == ncclSuccess)
            res = r;
    }
    ncclResult_t r = shim_jobs_run(now, nnow);
    if (res == ncclSuccess)
        res = r;
    free(now);
    return res == ncclSuccess && started_async ? ncclInProgress : res;
}

/* Takes the thread's deferred inits and recorded calls (the group is over). */
static void take(deferred_t **jobs, int *njobs, shim_op_t **ops, int *nops)
{
    *jobs = g.jobs;
    *njobs = g.njobs;
    *ops = g.ops;
    *nops = g.nops;
    g.jobs = NULL;
    g.ops = NULL;
    g.njobs = g.jcap = g.nops = g.ocap = 0;
}

ncclResult_t shim_impl_GroupStart(void)
{
    if (shim_paired()) {
        ncclResult_t r = SHIM_REAL(GroupStart, ());
        if (r != ncclSuccess)
            return r;
    }
    g.depth++;
    return ncclSuccess;
}

/* The end of a group: simulate (sim != NULL) drops the recorded calls. */
static ncclResult_t group_end(ncclSimInfo_t *sim, const char *fn)
{
    const int paired = shim_paired();
    if (paired) {
        ncclResult_t r = sim ? SHIM_REAL(GroupSimulateEnd, (sim)) : SHIM_REAL(GroupEnd, ());
        if (g.depth == 0)
            return r; /* not a group of the shim's: the real library's own answer */
        if (r != ncclSuccess && r != ncclInProgress)
            return r;
        if (--g.depth > 0)
            return r;
        deferred_t *jobs;
        shim_op_t *ops;
        int njobs, nops;
        take(&jobs, &njobs, &ops, &nops);
        ncclResult_t rj = run_deferred(jobs, njobs);
        free(jobs);
        free(ops); /* none: in route mode every call of a group went to NCCL */
        return rj != ncclSuccess ? rj : r;
    }
    if (g.depth == 0)
        return shim_fail(ncclInvalidUsage,
                         "%s: no group is open on this thread (ncclGroupStart "
                         "was not called, or its group ended already)",
                         fn);
    if (--g.depth > 0)
        return ncclSuccess;
    deferred_t *jobs;
    shim_op_t *ops;
    int njobs, nops;
    take(&jobs, &njobs, &ops, &nops);
    ncclResult_t res = run_deferred(jobs, njobs);
    free(jobs);
    if (sim != NULL) {
        shim_ops_discard(ops, nops, sim);
    } else if (nops > 0) {
        ncclResult_t r = shim_ops_replay(ops, nops);
        if (res == ncclSuccess || res == ncclInProgress)
            res = r != ncclSuccess ? r : res;
    }
    free(ops);
    return res;
}

ncclResult_t shim_impl_GroupEnd(void)
{
    return group_end(NULL, "ncclGroupEnd");
}

#define SIM_INFO_MAGIC 0x74685283u /* NCCL_SIM_INFO_INITIALIZER's */

ncclResult_t shim_impl_GroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (!shim_paired()) {
        if (simInfo == NULL)
            return shim_fail(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo is NULL");
        if (simInfo->magic != SIM_INFO_MAGIC)
            return shim_fail(ncclInvalidArgument,
                             "ncclGroupSimulateEnd: simInfo was not initialized with "
                             "NCCL_SIM_INFO_INITIALIZER");
    }
    return group_end(simInfo, "ncclGroupSimulateEnd");
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_impl_init.c - unique ids, the init variants, split, shrink, finalize,
 * destroy, abort, revoke, the asynchronous error and the queries, in route
 * and loom modes.
 *
 * Unique id layout (one for both modes): bytes [0, 64) hold the real
 * library's id in route mode (NCCL fills only its front 40 or so), bytes
 * [64, 128) loom's (52 bytes: magic, version, secret, root address). An id
 * without loom's half was made by something else: route mode then makes an
 * NCCL-only communicator (not the shim's: its calls pass through), loom mode
 * refuses it.
 *
 * Route mode creates the real communicator first with the caller's
 * arguments (non-blocking too), then loom's; the caller gets the real handle.
 * A real failure is returned as is, its last error standing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "shim_buffers.h"
#include "shim_comm.h"
#include "shim_group.h"
#include "shim_init.h"
#include "shim_streams.h"

#define ID_HALF 64

_Static_assert(sizeof(ncclUniqueId) == 128 && NCCL_UNIQUE_ID_BYTES == 128,
               "ncclUniqueId is NCCL's 128 bytes");
_Static_assert(sizeof(loomUniqueId) == LOOM_UNIQUE_ID_BYTES && LOOM_UNIQUE_ID_BYTES >= ID_HALF,
               "loomUniqueId holds at least the half the shim copies");
_Static_assert(sizeof(loom_id_t) <= ID_HALF, "loom's id payload fits in half an ncclUniqueId");

/* loom's half of an id; 0 if it holds none. */
static int loom_half(const ncclUniqueId *id, loomUniqueId *lid)
{
    memset(lid, 0, sizeof(*lid));
    memcpy(lid->internal, id->internal + ID_HALF, ID_HALF);
    loom_id_t hdr;
    memcpy(&hdr, lid->internal, sizeof(hdr));
    return hdr.magic == LOOM_ID_MAGIC;
}

ncclResult_t shim_impl_GetUniqueId(ncclUniqueId *uniqueId)
{
    if (uniqueId == NULL)
        return shim_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    ncclUniqueId out;
    memset(&out, 0, sizeof(out));
    if (shim_paired()) {
        ncclResult_t r = SHIM_REAL(GetUniqueId, (&out));
        if (r != ncclSuccess)
            return r;
        for (int i = ID_HALF; i < NCCL_UNIQUE_ID_BYTES; i++)
            if (out.internal[i] != 0)
                return shim_fail(ncclInternalError,
                                 "ncclGetUniqueId: the real library's id uses more than %d "
                                 "bytes, leaving no room for loom's",
                                 ID_HALF);
    }
    loomUniqueId lid;
    ncclResult_t r = shim_loom(loomGetUniqueId(&lid));
    if (r != ncclSuccess)
        return r;
    memcpy(out.internal + ID_HALF, lid.internal, ID_HALF);
    *uniqueId = out;
    return ncclSuccess;
}

/* ---- config ------------------------------------------------------------------ */

typedef struct {
    int blocking;
    const char *name;
} shim_cfg_t;

/* What the shim honours of an NCCL config: blocking (from 2.14 headers on)
 * and commName. Copied as NCCL copies it: at most the caller's size. */
static ncclResult_t parse_config(const ncclConfig_t *config, int inherit, const char *fn,
                                 shim_cfg_t *out)
{
    out->blocking = inherit;
    out->name = NULL;
    if (config == NULL)
        return ncclSuccess;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.magic = 0;
    size_t size;
    memcpy(&size, config, sizeof(size));
    memcpy(&cfg, config, size < sizeof(cfg) ? size : sizeof(cfg));
    if (cfg.magic != 0xcafebeef)
        return shim_fail(ncclInvalidArgument,
                         "%s: ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER",
                         fn);
    if (cfg.version < NCCL_VERSION(2, 14, 0))
        cfg.blocking = NCCL_CONFIG_UNDEF_INT;
    if (cfg.blocking != NCCL_CONFIG_UNDEF_INT && cfg.blocking != 0 && cfg.blocking != 1)
        return shim_fail(ncclInvalidArgument, "%s: invalid config blocking attribute value %d", fn,
                         cfg.blocking);
    if (cfg.blocking != NCCL_CONFIG_UNDEF_INT)
        out->blocking = cfg.blocking;
    out->name = cfg.commName;
    return ncclSuccess;
}

/* ---- init ---------------------------------------------------------------------- */

typedef enum { REAL_INIT_RANK, REAL_INIT_CONFIG, REAL_INIT_SCALABLE } real_init_t;

typedef struct {
    real_init_t how;
    int nId;
    ncclUniqueId *commIds;
    ncclConfig_t *config;
} init_args_t;

/* Runs a job as the caller's mode asks: deferred to the group, on its own
 * thread (non-blocking) or now. Consumes the caller's reference on c. On a
 * blocking failure c (the object the job made) is unlisted and freed, and its
 * real half aborted; c == NULL: the job made nothing (a split without color). */
static ncclResult_t launch(shim_comm_t *c, shim_job_t *job, int blocking)
{
    ncclResult_t r;
    if (shim_group_depth() > 0)
        r = shim_group_defer(job, blocking);
    else if (!blocking)
        r = shim_job_start(job);
    else
        r = shim_jobs_run(&job, 1);
    if (r == ncclSuccess && !blocking && shim_group_depth() == 0)
        r = ncclInProgress;
    if (c == NULL)
        return r;
    if (r != ncclSuccess && r != ncclInProgress && blocking) {
        shim_comm_t *listed = c->handle != NULL ? shim_comm_unlist(c->handle) : NULL;
        if (c->real != NULL)
            shim_real_abort(c->real);
        shim_comm_release(listed);
    }
    shim_comm_release(c);
    return r;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                              const init_args_t *a, const char *fn)
{
    if (comm == NULL)
        return shim_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (nranks < 1)
        return shim_fail(ncclInvalidArgument, "%s: nranks %d is below 1", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return shim_fail(ncclInvalidArgument, "%s: rank %d out of range [0, %d)", fn, rank, nranks);
    shim_cfg_t cfg;
    ncclResult_t r = parse_config(a->config, 1, fn, &cfg);
    if (r != ncclSuccess)
        return r;
    loomUniqueId lid;
    const int has_loom = loom_half(&id, &lid);
    const int paired = shim_paired();
    ncclComm_t real = NULL;
    ncclResult_t real_res = ncclSuccess;
    if (paired) {
        switch (a->how) {
        case REAL_INIT_RANK:
            real_res = SHIM_REAL(CommInitRank, (&real, nranks, id, rank));
            break;
        case REAL_INIT_CONFIG:
            real_res = SHIM_REAL(CommInitRankConfig, (&real, nranks, id, rank, a->config));
            break;
        case REAL_INIT_SCALABLE:
            real_res = SHIM_REAL(CommInitRankScalable,
                                 (&real, nranks, rank, a->nId, a->commIds, a->config));
            break;
        }
        if (real_res != ncclSuccess && real_res != ncclInProgress) {
            *comm = real;
            return real_res;
        }
        if (!has_loom) {
            shim_log(SHIM_LOG_INFO,
                     "%s: the unique id holds no loom id (made by another library): "
                     "communicator %p is the real library's alone",
                     fn, (void *)real);
            *comm = real;
            return real_res;
        }
    } else if (!has_loom) {
        return shim_fail(ncclInvalidArgument,
                         "%s: the unique id holds no loom id: it was not made by this library's "
                         "ncclGetUniqueId, or not passed unchanged",
                         fn);
    }
    shim_comm_t *c = shim_comm_new(rank, nranks, cfg.blocking, cfg.name);
    if (c == NULL) {
        if (real != NULL)
            shim_real_abort(real);
        return shim_fail(ncclSystemError, "%s: out of memory", fn);
    }
    c->real = real;
    c->handle = paired ? real : (ncclComm_t)c;
    c->cudev = shim_cuda_device();
    shim_job_t *job = NULL;
    r = shim_comm_list(c);
    if (r == ncclSuccess && (job = shim_job_new_init(c, &lid)) == NULL)
        r = shim_fail(ncclSystemError, "%s: out of memory", fn);
    if (r != ncclSuccess) {
        shim_comm_release(shim_comm_unlist(c->handle));
        shim_comm_release(c);
        if (real != NULL)
            shim_real_abort(real);
        return r;
    }
    *comm = c->handle;
    r = launch(c, job, cfg.blocking);
    if (r != ncclSuccess && r != ncclInProgress)
        *comm = NULL;
    else if (paired && r == ncclSuccess)
        r = real_res;
    return r;
}

ncclResult_t shim_impl_CommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    const init_args_t a = {REAL_INIT_RANK, 1, NULL, NULL};
    return init_rank(comm, nranks, commId, rank, &a, "ncclCommInitRank");
}

ncclResult_t shim_impl_CommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                          int rank, ncclConfig_t *config)
{
    const init_args_t a = {REAL_INIT_CONFIG, 1, NULL, config};
    return init_rank(comm, nranks, commId, rank, &a, "ncclCommInitRankConfig");
}

ncclResult_t shim_impl_CommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                            ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (nId < 1 || commIds == NULL)
        return shim_fail(ncclInvalidArgument,
                         "ncclCommInitRankScalable: %d ids at %p: at least one is needed", nId,
                         (void *)commIds);
    /* loom's rendezvous needs one root: the first id's. */
    const init_args_t a = {REAL_INIT_SCALABLE, nId, commIds, config};
    return init_rank(newcomm, nranks, commIds[0], myrank, &a, "ncclCommInitRankScalable");
}

ncclResult_t shim_impl_CommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (comms == NULL)
        return shim_fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    if (ndev < 1)
        return shim_fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d is below 1", ndev);
    const int paired = shim_paired();
    if (paired) {
        ncclResult_t r = SHIM_REAL(CommInitAll, (comms, ndev, devlist));
        if (r != ncclSuccess)
            return r;
    }
    loomUniqueId lid;
    ncclResult_t res = shim_loom(loomGetUniqueId(&lid));
    shim_comm_t **cs = calloc((size_t)ndev, sizeof(*cs));
    shim_job_t **jobs = calloc((size_t)ndev, sizeof(*jobs));
    if (res == ncclSuccess && (cs == NULL || jobs == NULL))
        res = shim_fail(ncclSystemError, "ncclCommInitAll: out of memory");
    int made = 0;
    for (; res == ncclSuccess && made < ndev; made++) {
        int rank = made;
        if (paired && SHIM_REAL(CommUserRank, (comms[made], &rank)) != ncclSuccess)
            rank = made;
        shim_comm_t *c = shim_comm_new(rank, ndev, 1, NULL);
        if (c == NULL) {
            res = shim_fail(ncclSystemError, "ncclCommInitAll: out of memory");
            break;
        }
        c->real = paired ? comms[made] : NULL;
        c->handle = paired ? comms[made] : (ncclComm_t)c;
        c->cudev = devlist != NULL ? devlist[made] : made;
        cs[made] = c;
        res = shim_comm_list(c);
        if (res == ncclSuccess && (jobs[made] = shim_job_new_init(c, &lid)) == NULL)
            res = shim_fail(ncclSystemError, "ncclCommInitAll: out of memory");
        if (res != ncclSuccess) {
            made++;
            break;
        }
    }
    if (res == ncclSuccess)
        res = shim_jobs_run(jobs, ndev);
    else
        for (int i = 0; i < made; i++)
            if (jobs[i] != NULL)
                shim_job_drop(jobs[i]);
    for (int i = 0; i < made; i++) {
        if (res != ncclSuccess) {
            shim_comm_t *listed = shim_comm_unlist(cs[i]->handle);
            pthread_mutex_lock(&cs[i]->lock);
            loomComm_t l = cs[i]->loom;
            cs[i]->loom = NULL;
            cs[i]->closing = 1;
            pthread_mutex_unlock(&cs[i]->lock);
            if (l != NULL)
                (void)loomCommAbort(l);
            shim_comm_release(listed);
        } else {
            comms[i] = cs[i]->handle;
        }
        shim_comm_release(cs[i]);
    }
    if (res != ncclSuccess && paired)
        for (int i = 0; i < ndev; i++)
            shim_real_abort(comms[i]);
    free(cs);
    free(jobs);
    return res;
}

/* ---- split and shrink --------------------------------------------------------- */

static ncclResult_t not_ours(ncclComm_t comm, const char *fn)
{
    return shim_fail(ncclInvalidArgument,
                     "%s: %p is not a communicator of this library (destroyed, never created, "
                     "or made by another library)",
                     fn, (void *)comm);
}

ncclResult_t shim_impl_CommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                 ncclConfig_t *config)
{
    static const char fn[] = "ncclCommSplit";
    const int paired = shim_paired();
    shim_comm_t *p = shim_comm_find(comm);
    if (p == NULL)
        return paired ? SHIM_REAL(CommSplit, (comm, color, key, newcomm, config))
                      : not_ours(comm, fn);
    ncclResult_t r = ncclSuccess;
    loomComm_t pl = NULL;
    shim_cfg_t cfg;
    if (newcomm == NULL)
        r = shim_fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    else if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        r = shim_fail(ncclInvalidArgument, "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR",
                      fn, color);
    if (r == ncclSuccess)
        r = shim_comm_ready(p, fn, &pl);
    if (r == ncclSuccess)
        r = parse_config(config, p->blocking, fn, &cfg);
    if (r != ncclSuccess) {
        shim_comm_release(p);
        return r;
    }
    ncclResult_t real_res = ncclSuccess;
    if (paired) {
        *newcomm = NULL; /* the real library may write it only later (non-blocking) */
        real_res = SHIM_REAL(CommSplit, (p->real, color, key, newcomm, config));
        if (real_res != ncclSuccess && real_res != ncclInProgress) {
            shim_comm_release(p);
            return real_res;
        }
    }
    shim_comm_t *child = NULL;
    if (color != NCCL_SPLIT_NOCOLOR) {
        /* The name is the config's, else the parent's. */
        const char *name = cfg.name != NULL ? cfg.name : p->named ? p->name : NULL;
        child = shim_comm_new(-1, 0, cfg.blocking, name);
        if (child == NULL) {
            shim_comm_release(p);
            return shim_fail(ncclSystemError, "%s: out of memory", fn);
        }
        child->cudev = p->cudev;
    }
    shim_job_t *job = NULL;
    if (child != NULL) {
        ncclComm_t rc = paired ? __atomic_load_n(newcomm, __ATOMIC_ACQUIRE) : NULL;
        child->real = rc;
        child->handle = paired ? rc : (ncclComm_t)child;
        if (!paired || rc != NULL)
            r = shim_comm_list(child);
    }
    if (r == ncclSuccess && (job = shim_job_new_split(p, child, color, key)) == NULL)
        r = shim_fail(ncclSystemError, "%s: out of memory", fn);
    if (r != ncclSuccess) {
        if (child != NULL) {
            shim_comm_release(shim_comm_unlist(child->handle));
            shim_comm_release(child);
        }
        shim_comm_release(p);
        return r;
    }
    if (paired && child != NULL && child->handle == NULL)
        job->real_child = newcomm;
    if (!paired)
        *newcomm = child != NULL ? child->handle : NULL;
    if (child == NULL) {
        r = launch(NULL, job, cfg.blocking);
    } else {
        shim_comm_hold(child);
        r = launch(child, job, cfg.blocking);
        if (r != ncclSuccess && r != ncclInProgress && !paired)
            *newcomm = NULL;
    }
    if (child != NULL)
        shim_comm_release(child);
    shim_comm_release(p);
    if (paired && r == ncclSuccess)
        r = real_res;
    return r;
}

/* Loom mode: loomCommShrink, run to the end before returning (a non-blocking config gets a
 * child that is ready at once). NCCL_SHRINK_ABORT is loom's default (the parent is revoked
 * first, as NCCL aborts its work); NCCL_SHRINK_DEFAULT is a planned removal. */
static ncclResult_t loom_shrink(shim_comm_t *p, int *excl, int nexcl, ncclComm_t *newcomm,
                                ncclConfig_t *config, int flags)
{
    static const char fn[] = "ncclCommShrink";
    loomComm_t pl = NULL, made = NULL;
    shim_cfg_t cfg;
    ncclResult_t r = ncclSuccess;
    if (newcomm == NULL)
        r = shim_fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    else if (nexcl <= 0)
        r = shim_fail(ncclInvalidArgument, "%s: excludeRanksCount %d must be > 0", fn, nexcl);
    else if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT)
        r = shim_fail(ncclInvalidArgument,
                      "%s: shrinkFlags %d: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT", fn, flags);
    if (r == ncclSuccess)
        r = shim_comm_ready(p, fn, &pl);
    if (r == ncclSuccess)
        r = parse_config(config, p->blocking, fn, &cfg);
    if (r != ncclSuccess)
        return r;
    const char *name = cfg.name != NULL ? cfg.name : p->named ? p->name : NULL;
    shim_comm_t *child = shim_comm_new(-1, 0, cfg.blocking, name);
    if (child == NULL)
        return shim_fail(ncclSystemError, "%s: out of memory", fn);
    r = shim_loom(
        loomCommShrink(pl, excl, nexcl, &made, NULL,
                       flags == NCCL_SHRINK_ABORT ? LOOM_SHRINK_DEFAULT : LOOM_SHRINK_PLANNED));
    if (r == ncclSuccess) {
        child->loom = made;
        child->cudev = p->cudev;
        child->hosts = p->hosts; /* at most the parent's: only route mode's rules read it */
        (void)loomCommUserRank(made, &child->rank);
        (void)loomCommCount(made, &child->nranks);
        child->state = ncclSuccess;
        child->handle = (ncclComm_t)child;
        r = shim_comm_list(child);
        if (r != ncclSuccess)
            child->loom = NULL, (void)loomCommAbort(made);
    }
    if (r == ncclSuccess)
        *newcomm = child->handle;
    shim_comm_release(child);
    return r;
}

ncclResult_t shim_impl_CommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                  ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    if (shim_paired())
        /* The child is the real library's alone: not in the table, its calls pass through. */
        return SHIM_REAL(CommShrink,
                         (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags));
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return not_ours(comm, "ncclCommShrink");
    ncclResult_t r =
        loom_shrink(c, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
    shim_comm_release(c);
    return r;
}

ncclResult_t shim_impl_CommRevoke(ncclComm_t comm, int revokeFlags)
{
    if (shim_paired())
        return SHIM_REAL(CommRevoke, (comm, revokeFlags));
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return not_ours(comm, "ncclCommRevoke");
    loomComm_t l = NULL;
    ncclResult_t r = shim_comm_ready(c, "ncclCommRevoke", &l);
    if (r == ncclSuccess && revokeFlags != NCCL_REVOKE_DEFAULT)
        r = shim_fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags %d must be 0", revokeFlags);
    if (r == ncclSuccess)
        r = shim_loom(loomCommRevoke(l, LOOM_REVOKE_DEFAULT));
    shim_comm_release(c);
    return r;
}

/* ---- teardown ------------------------------------------------------------------- */

/* Whether c's job is deferred to a group not yet ended (it cannot be waited for). */
static int job_deferred(shim_comm_t *c)
{
    pthread_mutex_lock(&c->lock);
    const int deferred = c->job != NULL && !c->job->started;
    pthread_mutex_unlock(&c->lock);
    return deferred;
}

/* Marks c closing and takes its loom communicator. */
static loomComm_t close_obj(shim_comm_t *c)
{
    pthread_mutex_lock(&c->lock);
    c->closing = 1;
    loomComm_t l = c->loom;
    c->loom = NULL;
    pthread_mutex_unlock(&c->lock);
    return l;
}

ncclResult_t shim_impl_CommFinalize(ncclComm_t comm)
{
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(CommFinalize, (comm)) : not_ours(comm, "ncclCommFinalize");
    ncclResult_t r = ncclSuccess;
    if (job_deferred(c))
        r = shim_fail(ncclInvalidUsage,
                      "ncclCommFinalize: communicator %p is still waiting for its group's "
                      "ncclGroupEnd",
                      (void *)comm);
    else
        shim_job_wait(c); /* loom's calls without a stream are over when they return */
    /* Calls queued on CUDA streams: flushed, as NCCL's finalize flushes its operations. */
    if (r == ncclSuccess)
        r = shim_wraps_finish(c, "ncclCommFinalize");
    if (r == ncclSuccess && paired)
        r = SHIM_REAL(CommFinalize, (c->real));
    shim_comm_release(c);
    return r;
}

ncclResult_t shim_impl_CommDestroy(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_unlist(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(CommDestroy, (comm)) : not_ours(comm, "ncclCommDestroy");
    if (!job_deferred(c))
        shim_job_wait(c);
    loomComm_t l = close_obj(c);
    ncclResult_t r = l != NULL ? shim_loom(loomCommDestroy(l)) : ncclSuccess;
    if (paired) {
        ncclResult_t rr = SHIM_REAL(CommDestroy, (c->real));
        if (r == ncclSuccess)
            r = rr;
    }
    shim_comm_release(c);
    return r;
}

ncclResult_t shim_impl_CommAbort(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_unlist(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(CommAbort, (comm)) : not_ours(comm, "ncclCommAbort");
    /* A pending init is not waited for: its job sees `closing` and aborts what it makes. */
    loomComm_t l = close_obj(c);
    if (l != NULL)
        (void)loomCommAbort(l); /* unblocks this communicator's calls on other threads */
    if (paired)
        (void)SHIM_REAL(CommAbort, (c->real));
    shim_comm_release(c);
    return ncclSuccess;
}

/* ---- state and queries ---------------------------------------------------------- */

ncclResult_t shim_impl_CommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(CommGetAsyncError, (comm, asyncError))
                      : not_ours(comm, "ncclCommGetAsyncError");
    ncclResult_t r = ncclSuccess;
    if (asyncError == NULL) {
        r = shim_fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
        shim_comm_release(c);
        return r;
    }
    pthread_mutex_lock(&c->lock);
    const ncclResult_t state = c->state;
    loomComm_t l = c->loom;
    char msg[sizeof(c->state_msg)];
    snprintf(msg, sizeof(msg), "%s", c->state_msg);
    pthread_mutex_unlock(&c->lock);
    if (state != ncclSuccess) {
        *asyncError = state;
        if (state != ncclInProgress)
            (void)shim_fail(state, "communicator %p failed to initialize: %s", (void *)comm, msg);
    } else {
        loomResult_t le = loomSuccess;
        if (l != NULL && loomCommGetAsyncError(l, &le) == loomSuccess && le != loomSuccess)
            *asyncError = shim_loom(le);
        else
            *asyncError = ncclSuccess;
        if (*asyncError == ncclSuccess && paired)
            r = SHIM_REAL(CommGetAsyncError, (c->real, asyncError));
    }
    shim_comm_release(c);
    return r;
}

typedef enum { Q_COUNT, Q_RANK, Q_DEVICE } query_t;

static ncclResult_t query(ncclComm_t comm, int *out, query_t q, const char *fn)
{
    const int paired = shim_paired();
    shim_comm_t *c = paired ? NULL : shim_comm_find(comm);
    if (paired)
        return q == Q_COUNT  ? SHIM_REAL(CommCount, (comm, out))
               : q == Q_RANK ? SHIM_REAL(CommUserRank, (comm, out))
                             : SHIM_REAL(CommCuDevice, (comm, out));
    if (c == NULL)
        return not_ours(comm, fn);
    loomComm_t l;
    ncclResult_t r = out == NULL ? shim_fail(ncclInvalidArgument, "%s: output is NULL", fn)
                                 : shim_comm_ready(c, fn, &l);
    if (r == ncclSuccess)
        *out = q == Q_COUNT ? c->nranks : q == Q_RANK ? c->rank : c->cudev;
    shim_comm_release(c);
    return r;
}

ncclResult_t shim_impl_CommCount(const ncclComm_t comm, int *count)
{
    return query(comm, count, Q_COUNT, "ncclCommCount");
}

ncclResult_t shim_impl_CommUserRank(const ncclComm_t comm, int *rank)
{
    return query(comm, rank, Q_RANK, "ncclCommUserRank");
}

ncclResult_t shim_impl_CommCuDevice(const ncclComm_t comm, int *device)
{
    return query(comm, device, Q_DEVICE, "ncclCommCuDevice");
}

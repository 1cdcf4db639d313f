/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_job.c - the jobs that make loom's side of a communicator
 * (shim_init.h): loom's init or split, the host count, and publishing the
 * result on the shim's objects, inline or on threads.
 *
 * The host count feeds the routing rules, which must decide alike on every
 * rank, so it is measured once, collectively: one loomAllGather of a hash of
 * each rank's host identity, counted. The identity is loom's own notion of a
 * host: the machine (host name and boot id), or LOOM_HOST_ID scoped to the
 * machine where that variable models several hosts on one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim_init.h"

/* ---- the host count --------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t host_hash(void)
{
    char host[256] = "", boot[64] = "";
    gethostname(host, sizeof(host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    uint64_t h = 0xcbf29ce484222325ull;
    const char *modelled = getenv("LOOM_HOST_ID");
    if (modelled != NULL && *modelled) {
        h = fnv1a(h, modelled);
        h = fnv1a(h, "@");
    }
    h = fnv1a(h, host);
    h = fnv1a(h, "/");
    return fnv1a(h, boot);
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static loomResult_t measure_hosts(loomComm_t l, int *hosts)
{
    int n = 0;
    loomResult_t r = loomCommCount(l, &n);
    if (r != loomSuccess)
        return r;
    uint64_t mine = host_hash();
    uint64_t *all = malloc((size_t)n * sizeof(*all));
    if (all == NULL)
        return loomSystemError;
    r = loomAllGather(&mine, all, 1, loomUint64, l, NULL);
    if (r == loomSuccess) {
        qsort(all, (size_t)n, sizeof(*all), cmp_u64);
        int distinct = n > 0;
        for (int i = 1; i < n; i++)
            distinct += all[i] != all[i - 1];
        *hosts = distinct;
    }
    free(all);
    return r;
}

/* ---- jobs ------------------------------------------------------------------- */

void shim_loom_config(loomConfig_t *lc, const shim_comm_t *c)
{
    const loomConfig_t init = LOOM_CONFIG_INITIALIZER;
    *lc = init;
    /* loom's init blocks; the shim's own thread gives NCCL's non-blocking behaviour. */
    lc->blocking = 1;
    lc->commName = c->named ? c->name : NULL;
}

shim_job_t *shim_job_new_init(shim_comm_t *c, const loomUniqueId *id)
{
    shim_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->kind = SHIM_JOB_INIT;
    j->owner = j->child = c;
    j->id = *id;
    shim_comm_hold(c);
    pthread_mutex_lock(&c->lock);
    c->job = j;
    c->state = ncclInProgress;
    pthread_mutex_unlock(&c->lock);
    return j;
}

shim_job_t *shim_job_new_split(shim_comm_t *parent, shim_comm_t *child, int color, int key)
{
    shim_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->kind = SHIM_JOB_SPLIT;
    j->owner = parent;
    j->child = child;
    j->color = color;
    j->key = key;
    shim_comm_hold(parent);
    if (child != NULL)
        shim_comm_hold(child);
    pthread_mutex_lock(&parent->lock);
    parent->job = j;
    parent->state = ncclInProgress;
    pthread_mutex_unlock(&parent->lock);
    return j;
}

/* Publishes the outcome and frees the job: the child gets loom's communicator
 * (or is aborted with it, if the child was aborted meanwhile), the owner
 * forgets its job and leaves InProgress. */
static void job_finish(shim_job_t *j, ncclResult_t res, const char *msg, loomComm_t made, int hosts)
{
    loomComm_t orphan = NULL;
    shim_comm_t *child = j->child;
    if (child != NULL) {
        pthread_mutex_lock(&child->lock);
        if (child->closing) {
            orphan = made;
        } else {
            child->loom = made;
            child->hosts = hosts;
            if (made != NULL) {
                (void)loomCommUserRank(made, &child->rank);
                (void)loomCommCount(made, &child->nranks);
            }
            child->state = res;
            snprintf(child->state_msg, sizeof(child->state_msg), "%s", msg);
        }
        if (child != j->owner)
            pthread_cond_broadcast(&child->cond);
        pthread_mutex_unlock(&child->lock);
    } else {
        orphan = made;
    }
    shim_comm_t *owner = j->owner;
    pthread_mutex_lock(&owner->lock);
    owner->job = NULL;
    if (j->kind == SHIM_JOB_SPLIT)
        owner->state = ncclSuccess; /* the parent is usable again; the child has the outcome */
    pthread_cond_broadcast(&owner->cond);
    pthread_mutex_unlock(&owner->lock);
    if (orphan != NULL)
        (void)loomCommAbort(orphan);
    if (child != NULL && child != owner)
        shim_comm_release(child);
    shim_comm_release(owner);
    free(j);
}

/* Route mode, non-blocking split: the real library may write the child's
 * handle only once the parent leaves InProgress; list the child under it. */
static ncclResult_t adopt_real_child(shim_job_t *j, char *msg, size_t msglen)
{
    ncclResult_t st = ncclInProgress;
    while (SHIM_REAL(CommGetAsyncError, (j->owner->real, &st)) == ncclSuccess &&
           st == ncclInProgress) {
        const struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    ncclComm_t h = __atomic_load_n(j->real_child, __ATOMIC_ACQUIRE);
    if (st != ncclSuccess || h == NULL) {
        snprintf(msg, msglen, "the real library's split failed (%s)", shim_error_string(st));
        return st != ncclSuccess ? st : ncclInternalError;
    }
    j->child->handle = h;
    j->child->real = h;
    return shim_comm_list(j->child);
}

/* Runs one job to its end on the calling thread. */
static ncclResult_t job_exec(shim_job_t *j)
{
    loomComm_t made = NULL;
    int hosts = 1;
    char msg[256] = "";
    ncclResult_t res = ncclSuccess;
    loomResult_t lr;
    if (j->kind == SHIM_JOB_INIT) {
        loomConfig_t lc;
        shim_loom_config(&lc, j->child);
        lr = loomCommInitRankConfig(&made, j->child->nranks, j->id, j->child->rank, &lc);
    } else {
        pthread_mutex_lock(&j->owner->lock);
        loomComm_t parent = j->owner->loom;
        pthread_mutex_unlock(&j->owner->lock);
        loomConfig_t lc;
        if (j->child != NULL)
            shim_loom_config(&lc, j->child);
        lr = loomCommSplit(parent, j->color < 0 ? LOOM_SPLIT_NOCOLOR : j->color, j->key, &made,
                           j->child != NULL && j->child->named ? &lc : NULL);
    }
    if (lr == loomSuccess && made != NULL) {
        lr = measure_hosts(made, &hosts);
        if (lr != loomSuccess) {
            res = shim_loom(lr);
            snprintf(msg, sizeof(msg), "%s", shim_last_error());
            (void)loomCommAbort(made);
            made = NULL;
        }
    } else if (lr != loomSuccess) {
        res = shim_loom(lr);
        snprintf(msg, sizeof(msg), "%s", shim_last_error());
    }
    if (res == ncclSuccess && j->real_child != NULL && j->child != NULL) {
        res = adopt_real_child(j, msg, sizeof(msg));
        if (res != ncclSuccess && made != NULL) {
            (void)loomCommAbort(made);
            made = NULL;
        }
    }
    job_finish(j, res, msg, made, hosts);
    return res;
}

static void *job_thread(void *arg)
{
    return (void *)(intptr_t)job_exec(arg);
}

static void job_mark_started(shim_job_t *j)
{
    pthread_mutex_lock(&j->owner->lock);
    j->started = 1;
    pthread_mutex_unlock(&j->owner->lock);
}

ncclResult_t shim_jobs_run(shim_job_t **jobs, int n)
{
    if (n <= 0)
        return ncclSuccess;
    pthread_t *threads = n > 1 ? calloc((size_t)n, sizeof(*threads)) : NULL;
    ncclResult_t res = ncclSuccess;
    int *started = n > 1 ? calloc((size_t)n, sizeof(*started)) : NULL;
    for (int i = 1; i < n; i++) {
        job_mark_started(jobs[i]);
        if (threads != NULL && started != NULL &&
            pthread_create(&threads[i], NULL, job_thread, jobs[i]) == 0) {
            started[i] = 1;
        } else {
            ncclResult_t r = shim_fail(ncclSystemError,
                                       "cannot start a thread to create "
                                       "communicator %d of %d at once",
                                       i, n);
            job_finish(jobs[i], r, shim_last_error(), NULL, 1);
            if (res == ncclSuccess)
                res = r;
        }
    }
    job_mark_started(jobs[0]);
    ncclResult_t r0 = job_exec(jobs[0]);
    if (res == ncclSuccess)
        res = r0;
    for (int i = 1; i < n; i++) {
        if (started == NULL || !started[i])
            continue;
        void *ret = NULL;
        pthread_join(threads[i], &ret);
        if (res == ncclSuccess)
            res = (ncclResult_t)(intptr_t)ret;
    }
    free(threads);
    free(started);
    return res;
}

ncclResult_t shim_job_start(shim_job_t *job)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    job_mark_started(job);
    const int err = pthread_create(&t, &attr, job_thread, job);
    pthread_attr_destroy(&attr);
    if (err == 0)
        return ncclSuccess;
    ncclResult_t r = shim_fail(ncclSystemError,
                               "cannot start the thread of a non-blocking init: %s", strerror(err));
    job_finish(job, r, shim_last_error(), NULL, 1);
    return r;
}

void shim_job_drop(shim_job_t *job)
{
    job_finish(job, ncclInvalidArgument, "aborted before its group ended", NULL, 1);
}

void shim_job_wait(shim_comm_t *owner)
{
    pthread_mutex_lock(&owner->lock);
    while (owner->job != NULL)
        pthread_cond_wait(&owner->cond, &owner->lock);
    pthread_mutex_unlock(&owner->lock);
}

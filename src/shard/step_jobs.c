/* SPDX-License-Identifier: Apache-2.0
 *
 * step_jobs.c - runs the Muon jobs of a step (step_jobs.h): each job is momentum (or the
 * assembly of the gathered update), loomNewtonSchulz in place on a private buffer, then the
 * decay and scaled update of the rank's rows. With cfg->threads > 1 the calling thread and
 * threads - 1 more take jobs in turn from a shared counter; BLAS is left as the caller set it
 * (one thread inside is what keeps the bits those of one thread, docs/shard.md).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard_kernels.h"
#include "step_jobs.h"
#include "timer.h"

typedef struct {
    const shard_job_t *jobs;
    int njobs, nranks;
    const loomMuonConfig_t *cfg;
    size_t work_floats;
    int next; /* the next job to take (atomic) */
    pthread_mutex_t lock;
    loomResult_t res;
    double ns_seconds;
} pool_t;

static loomResult_t run_one(const shard_job_t *j, const loomMuonConfig_t *cfg, int nranks, float *u,
                            float *ws, double *ns_seconds)
{
    const size_t n = j->rows * j->cols;
    if (j->gathered == NULL) {
        loom_muon_momentum(u, j->grad, j->momentum, n, cfg);
    } else {
        for (int q = 0; q < nranks; q++) {
            size_t lo = j->chunk * (size_t)q, hi = lo + j->chunk;
            lo = lo < j->rows ? lo : j->rows;
            hi = hi < j->rows ? hi : j->rows;
            memcpy(u + lo * j->cols, j->gathered + (size_t)q * j->stride,
                   (hi - lo) * j->cols * sizeof(float));
        }
    }
    const uint64_t t0 = loom_now_ns();
    LOOM_CHECK(
        loomNewtonSchulz(u, u, j->rows, j->cols, cfg->ns_steps, cfg->ns_coeffs, cfg->ns_eps, ws));
    *ns_seconds += (double)(loom_now_ns() - t0) * 1e-9;
    const float step = loom_muon_step_size(j->rows, j->cols, cfg);
    if (j->gathered == NULL)
        loom_muon_apply(j->param, u, n, step, cfg);
    else
        loom_muon_apply(j->param, u + j->row0 * j->cols, j->nrows * j->cols, step, cfg);
    return loomSuccess;
}

static void *worker(void *arg)
{
    pool_t *pl = arg;
    float *u = malloc(pl->work_floats * sizeof(float));
    double ns = 0;
    loomResult_t res = loomSuccess;
    if (u == NULL) {
        LOOM_WARN("loomShardStep: out of memory for %zu floats of Newton-Schulz work",
                  pl->work_floats);
        res = loomSystemError;
    }
    for (;;) {
        const int k = __atomic_fetch_add(&pl->next, 1, __ATOMIC_RELAXED);
        if (k >= pl->njobs || res != loomSuccess)
            break;
        const shard_job_t *j = &pl->jobs[k];
        res = run_one(j, pl->cfg, pl->nranks, u, u + j->rows * j->cols, &ns);
    }
    free(u);
    pthread_mutex_lock(&pl->lock);
    if (res != loomSuccess && pl->res == loomSuccess)
        pl->res = res;
    pl->ns_seconds += ns;
    pthread_mutex_unlock(&pl->lock);
    return NULL;
}

loomResult_t shard_run_jobs(const shard_job_t *jobs, int njobs, const loomMuonConfig_t *cfg,
                            int nranks, double *ns_seconds)
{
    pool_t pl = {jobs, njobs, nranks, cfg, 1, 0, PTHREAD_MUTEX_INITIALIZER, loomSuccess, 0};
    for (int k = 0; k < njobs; k++) {
        const size_t need =
            jobs[k].rows * jobs[k].cols + loomNewtonSchulzWorkspace(jobs[k].rows, jobs[k].cols);
        pl.work_floats = need > pl.work_floats ? need : pl.work_floats;
    }
    int extra = cfg->threads - 1 < njobs - 1 ? cfg->threads - 1 : njobs - 1;
    pthread_t *tids = extra > 0 ? malloc((size_t)extra * sizeof(pthread_t)) : NULL;
    int started = 0;
    for (; tids != NULL && started < extra; started++)
        if (pthread_create(&tids[started], NULL, worker, &pl) != 0)
            break; /* the threads that did start, and this one, take every job */
    worker(&pl);
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    pthread_mutex_destroy(&pl.lock);
    *ns_seconds += pl.ns_seconds;
    return pl.res;
}

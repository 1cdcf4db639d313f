/* SPDX-License-Identifier: Apache-2.0
 *
 * step_jobs.h - one Muon update of one matrix as a job, and the pool that runs a bucket's jobs
 * on cfg->threads threads (step_jobs.c). A job's bits depend on its inputs alone, never on
 * which thread runs it or on the other jobs, so the step's results do not depend on the thread
 * count.
 */
#ifndef LOOM_SHARD_STEP_JOBS_H
#define LOOM_SHARD_STEP_JOBS_H

#include <stddef.h>

#include "loom_shard.h"

typedef struct {
    size_t rows, cols;
    float *param; /* the whole matrix, or (gathered) the first of the rank's rows */
    /* Whole matrix (Owner, Replicated): momentum from grad, then Newton-Schulz. */
    const float *grad;
    float *momentum;
    /* Gathered (Rows): rank q's rows of the update sit at gathered + q * stride; the rank's own
     * rows are [row0, row0 + nrows). */
    const float *gathered;
    size_t stride, chunk, row0, nrows;
} shard_job_t;

/* Runs every job; *ns_seconds gets the time spent in Newton-Schulz, summed over threads. */
loomResult_t shard_run_jobs(const shard_job_t *jobs, int njobs, const loomMuonConfig_t *cfg,
                            int nranks, double *ns_seconds);

#endif

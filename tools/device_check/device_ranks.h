/* SPDX-License-Identifier: Apache-2.0
 *
 * device_ranks.h - what the two files of device_ranks share: one rank's state
 * (device_ranks.c makes it, as a thread or as the process of a launcher's job)
 * and the cases every rank runs (device_ranks_cases.c).
 */
#ifndef LOOM_DEVICE_RANKS_H
#define LOOM_DEVICE_RANKS_H

#include <stddef.h>

#include "loom.h"

typedef struct dr_rank {
    int rank, nranks;
    loomComm_t comm;
    loomStream_t stream; /* wraps the CUDA stream of this rank (see device_ranks.c) */
    void *cuda_stream;   /* that CUDA stream; NULL under the emulation */
    int cases, failed;   /* cases run, and those that failed */
    char first[320];     /* the first failure, one line */
} dr_rank_t;

/* Copies n bytes between host memory and device memory from loomMemAlloc (to_device: src on
 * the host), complete on return: on the rank's own CUDA stream and waiting for that stream only
 * (a device-wide wait could wait for another thread's rank, which waits for this one), or
 * memcpy under the emulation. 0, or -1 with the reason in why. */
int dr_copy(const dr_rank_t *r, void *dst, const void *src, size_t n, int to_device, char *why,
            size_t why_len);

/* Runs every case on r: each collective and Echo on device buffers queued on r->stream, the
 * result compared bit for bit with the same call on host buffers (NULL stream), and for the
 * results every rank shares, their hashes compared across ranks. Counts into r; returns 0, or
 * -1 when a loom call failed so that the communicator cannot go on. */
int dr_run_cases(dr_rank_t *r, size_t count);

#endif

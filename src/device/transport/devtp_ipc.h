/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_ipc.h - the state of the ipc device transport, shared by its set-up
 * and teardown (devtp_ipc.c, which also states the protocol and why it is
 * race free) and its per-call protocol (devtp_ipc_run.c).
 */
#ifndef LOOM_DEVTP_IPC_H
#define LOOM_DEVTP_IPC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dev_kernels.h"
#include "devtp.h"
#include "devtp_util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The flags segment: a 64-byte header, then from IPC_FLAGS_OFF one block of
 * flag words per rank: ready[LOOM_DK_MAX_SRCS], then done[LOOM_DK_MAX_SRCS].
 * Word [slot] of rank r's block is written by rank `slot` (and reset by r);
 * only rank r's stream waits on its block. */
#define IPC_FLAGS_OFF   256u
#define IPC_BLOCK_WORDS (2u * LOOM_DK_MAX_SRCS)
#define IPC_READY       0u
#define IPC_DONE        1u
/* Where a reduction whose output is host memory is computed first (kernels
 * write device memory only), at most this much at a time. */
#define IPC_OUT_MAX_BYTES (4u << 20)

typedef struct {
    const loom_devrt_t *rt;
    int rank, nranks;
    size_t chunk_bytes; /* every rank's scratch holds this much (agreed minimum) */
    void *scratch;      /* this rank's, from mem_alloc */
    void *out;          /* device staging of host outputs of reductions */
    size_t out_bytes;
    void *peer[LOOM_DK_MAX_SRCS];     /* each rank's scratch as this rank reads it */
    void *peer_map[LOOM_DK_MAX_SRCS]; /* what ipc_open gave (NULL: a pointer of this process) */
    void *seg;                        /* this process's mapping of the flags segment */
    size_t seg_bytes;
    uint32_t *seg_dev; /* the mapping as streams address it (host_map), NULL until mapped */
    int seg_shared;    /* seg is listed in devtp_ipc_share.c (one mapping per process) */
    char seg_name[64];
    int seg_owner; /* this rank created the name (rank 0) and removes it */
    int64_t timeout_ms;
    volatile int *abort_flag;
    /* release */
    int released;    /* __atomic: set by release */
    int stop_keeper; /* __atomic: set by close */
    pthread_mutex_t keeper_lock;
    pthread_t keeper;
    int keeper_started;
    loom_devtp_track_t track;
} ipc_state_t;

/* Word `slot` of kind IPC_READY/IPC_DONE in rank owner's block: the host
 * address (this process's mapping) and the device address of the same word. */
static inline uint32_t *ipc_flag_host(const ipc_state_t *st, int owner, unsigned kind, int slot)
{
    return (uint32_t *)((char *)st->seg + IPC_FLAGS_OFF) + (size_t)owner * IPC_BLOCK_WORDS +
           kind * LOOM_DK_MAX_SRCS + (size_t)slot;
}
static inline uint32_t *ipc_flag_dev(const ipc_state_t *st, int owner, unsigned kind, int slot)
{
    return (uint32_t *)((char *)st->seg_dev + IPC_FLAGS_OFF) + (size_t)owner * IPC_BLOCK_WORDS +
           kind * LOOM_DK_MAX_SRCS + (size_t)slot;
}

/* devtp_ipc_run.c: the table's handles and run. */
int loom_devtp_ipc_handles(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call);
loomResult_t loom_devtp_ipc_run(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                                loom_dev_stream_t s);
/* devtp_ipc_share.c: one mapping of a flags segment per process, shared by the ranks that
 * are its threads. find: 1 and the mapping (a reference taken) if this process has the
 * segment `name` of `bytes` mapped; add: lists a new mapping with one reference (0 if out
 * of memory: it then stays the caller's alone); drop: lets go of one reference, 1 when it
 * was the last, and the caller then unmaps it. */
int loom_ipc_share_find(const char *name, size_t bytes, void **base, void **dev);
int loom_ipc_share_add(const char *name, void *base, size_t bytes, void *dev);
int loom_ipc_share_drop(void *base);
/* devtp_ipc.c: release, for run's failures half way through a call. */
void loom_devtp_ipc_release(loom_dev_comm_t *dc, void *state);

#ifdef __cplusplus
}
#endif

#endif

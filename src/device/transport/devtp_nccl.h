/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_nccl.h - the nccl device transport's view of the real NCCL library
 * (the few calls it makes, declared here so that loom builds without nccl.h:
 * NCCL's C ABI, stable across 2.x), its state, shared by its set-up
 * (devtp_nccl.c) and its calls (devtp_nccl_run.c), and the one seam through
 * which a test runs it without a GPU.
 */
#ifndef LOOM_DEVTP_NCCL_H
#define LOOM_DEVTP_NCCL_H

#include <pthread.h>
#include <stddef.h>

#include "devtp.h"
#include "devtp_util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- NCCL's ABI, as far as this transport uses it --------------------------- */
typedef int loom_nccl_result_t; /* ncclResult_t: 0 success, 7 in progress */
#define LOOM_NCCL_SUCCESS  0
#define LOOM_NCCL_UINT8    1 /* ncclUint8: every byte this transport moves */
#define LOOM_NCCL_ID_BYTES 128
typedef struct loom_nccl_comm *loom_nccl_comm_t;
typedef struct {
    char internal[LOOM_NCCL_ID_BYTES];
} loom_nccl_id_t; /* ncclUniqueId */

/* The functions taken from the library by their nccl names; all required
 * but GetLastError (NCCL 2.13 on). Streams are cudaStream_t (void *). */
typedef struct {
    loom_nccl_result_t (*GetVersion)(int *version);
    const char *(*GetErrorString)(loom_nccl_result_t result);
    const char *(*GetLastError)(loom_nccl_comm_t comm);
    loom_nccl_result_t (*GetUniqueId)(loom_nccl_id_t *id);
    loom_nccl_result_t (*CommInitRank)(loom_nccl_comm_t *comm, int nranks, loom_nccl_id_t id,
                                       int rank);
    loom_nccl_result_t (*CommDestroy)(loom_nccl_comm_t comm);
    loom_nccl_result_t (*CommAbort)(loom_nccl_comm_t comm);
    loom_nccl_result_t (*GroupStart)(void);
    loom_nccl_result_t (*GroupEnd)(void);
    loom_nccl_result_t (*Send)(const void *buf, size_t count, int datatype, int peer,
                               loom_nccl_comm_t comm, void *stream);
    loom_nccl_result_t (*Recv)(void *buf, size_t count, int datatype, int peer,
                               loom_nccl_comm_t comm, void *stream);
    loom_nccl_result_t (*AllGather)(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    int datatype, loom_nccl_comm_t comm, void *stream);
    loom_nccl_result_t (*Broadcast)(const void *sendbuf, void *recvbuf, size_t count, int datatype,
                                    int root, loom_nccl_comm_t comm, void *stream);
    int version;
    char path[512];
} loom_nccl_lib_t;

/* ---- the test seam ----------------------------------------------------------------
 * For tests only (it is not part of libloom's exports; tests that link loom's
 * internals set it before open and clear it after). any_runtime: accept a
 * runtime other than CUDA, for an NCCL stand-in that works on that runtime's
 * memory and streams; gpu_id: this rank's GPU identity, in place of the PCI
 * bus id of dc->device, so that ranks sharing the emulated device pass the
 * "distinct GPU" check (return 0, or -1 with why set). NULL/0 members keep
 * the production behaviour. */
typedef struct {
    int any_runtime;
    int (*gpu_id)(const loom_dev_comm_t *dc, char *id, size_t id_len, char *why, size_t why_len);
} loom_devtp_nccl_seam_t;
void loom_devtp_nccl_set_seam(const loom_devtp_nccl_seam_t *seam); /* NULL: none */

/* ---- state ------------------------------------------------------------------------ */
typedef struct {
    const loom_devrt_t *rt;
    const loom_nccl_lib_t *lib;
    loom_nccl_comm_t comm;
    int rank, nranks;
    void *scratch; /* chunk_bytes of device memory */
    size_t chunk_bytes;
    /* run and release never use comm at once: release aborts it under lock */
    pthread_mutex_t lock;
    int aborted;  /* under lock */
    int released; /* __atomic: set by release */
    loom_devtp_track_t track;
} nccl_state_t;

/* devtp_nccl_run.c */
int loom_devtp_nccl_handles(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call);
loomResult_t loom_devtp_nccl_run(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                                 loom_dev_stream_t s);
/* devtp_nccl.c: an NCCL failure as loom's last error ("what: NCCL's text"). */
loomResult_t loom_devtp_nccl_fail(const nccl_state_t *st, loom_nccl_result_t res, const char *what);

#ifdef __cplusplus
}
#endif

#endif

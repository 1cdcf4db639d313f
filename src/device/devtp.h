/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp.h - the device transports: how one operation on device buffers runs,
 * queued on a device stream of the runtime (devrt.h). One table, three
 * implementations, tried in this order for each call:
 *   ipc     every rank on this host: the ranks map one another's device
 *           memory (CUDA IPC; the same pointers between threads), order
 *           themselves with flag words in shared host memory, and reduce
 *           with dev_kernels.h's kernels reading the peers' buffers;
 *   nccl    a real NCCL communicator paired with the loom one (dlopen'd
 *           libnccl.so.2, ranks on distinct GPUs): NCCL moves the bytes,
 *           loom's kernels do every reduction in rank order;
 *   staged  any placement: the stream copies device buffers to pinned host
 *           staging, a proxy thread of the communicator runs loom's host
 *           collective on them, the stream waits for it and copies back.
 * Every implementation runs on either runtime (CUDA or the emulation), so
 * CPU-only CI runs ipc and staged as they run on a GPU.
 *
 * Rules every implementation keeps:
 *  - results are the bits loom's host collectives give (include/loom.h):
 *    reductions in rank order with one rounding;
 *  - the choice of transport is the same on every rank (it depends on the
 *    call's collective, datatype, op and on what open agreed);
 *  - nothing waits forever: every wait_u32 a transport queues is on a flag
 *    word that release() can set to LOOM_DEV_FLAG_ABORT, and the
 *    communicator's watchdog (dev_comm.c) calls release on abort, revoke and
 *    timeout;
 *  - open and close are collective over the communicator's ranks and are
 *    called in the same order on every rank; open returns the same answer
 *    on every rank (an agreement over the host communicator ends it).
 */
#ifndef LOOM_DEVTP_H
#define LOOM_DEVTP_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "devrt.h"
#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The value release() stores in flag words: larger than any a protocol waits
 * for. wait_u32 compares cyclically, as CUDA does (devrt.h), so flag values
 * stay below 2^31 and the abort value is the largest of them. */
#define LOOM_DEV_FLAG_ABORT 0x7fffffffu

struct loomComm;

/* What the transports see of a communicator's device state (dev_comm.c makes it). */
typedef struct loom_dev_comm {
    struct loomComm *comm;  /* the host communicator: open's exchanges run on it */
    const loom_devrt_t *rt; /* never NULL */
    int rank, nranks;
    int local_rank, local_size; /* among the ranks of this host */
    int all_local;              /* every rank on this host */
    int device;                 /* this rank's current device at creation */
    int64_t timeout_ms;
    volatile int *abort_flag; /* the communicator's: set by abort and revoke */
    void *tp_state[3];        /* each transport's, by its index in loom_devtps */
    int tp_open[3];           /* open succeeded on every rank */
    char tp_why[3][160];      /* why not, when it did not */
} loom_dev_comm_t;

typedef struct loom_devtp {
    const char *name; /* "ipc", "nccl", "staged" */
    int capturable;   /* its calls may be captured into a CUDA graph */
    /* Collective: sets the transport up for dc, or says why it cannot
     * (why, one line) and returns an error; every rank returns alike. */
    loomResult_t (*open)(loom_dev_comm_t *dc, void **state, char *why, size_t why_len);
    /* Frees what open made (after release, when the communicator aborts). */
    void (*close)(loom_dev_comm_t *dc, void *state);
    /* 1 if this transport runs this collective (kind, datatype, op). */
    int (*handles)(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call);
    /* Queues the call on s; returns once queued. Host and device buffers may
     * mix (any pointer the runtime's ptr_device calls host memory is host
     * memory). */
    loomResult_t (*run)(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                        loom_dev_stream_t s);
    /* Stores LOOM_DEV_FLAG_ABORT in every flag word a queued wait of this
     * transport may be waiting on. Any thread, any time after open. */
    void (*release)(loom_dev_comm_t *dc, void *state);
} loom_devtp_t;

enum { LOOM_DEVTP_IPC = 0, LOOM_DEVTP_NCCL = 1, LOOM_DEVTP_STAGED = 2, LOOM_DEVTP_NUM = 3 };
/* The implementations, by index (devtp_ipc.c, devtp_nccl.c, devtp_staged.c). */
extern const loom_devtp_t loom_devtp_ipc, loom_devtp_nccl, loom_devtp_staged;

#ifdef __cplusplus
}
#endif

#endif

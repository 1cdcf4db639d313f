/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt.h - the device runtime under loom's device path: one table of the
 * calls the device transports (devtp.h) make - memory, streams, copies,
 * events, 32-bit stream memory operations on flag words, IPC handles and the
 * kernels of dev_kernels.h - with two implementations:
 *   cuda      devrt_cuda.c, in builds with the cuda feature: the CUDA
 *             runtime (static cudart) and, for the stream memory operations,
 *             the driver's entry points obtained through the runtime;
 *   emulated  devrt_emu.c, always built: "device memory" is host memory in
 *             shared-memory files (so another process can open its IPC
 *             handle), a stream is a worker thread running its operations
 *             in order, a kernel is dev_kernels_host.c's loop on that thread.
 * The transports are written once against this table, so CPU-only CI runs
 * the very protocol code a GPU runs; only the table's bottom differs.
 *
 * Semantics both implementations keep (the transports rely on them):
 *  - a NULL loom_dev_stream_t is the default stream (CUDA's legacy default
 *    stream; the emulation keeps one of its own);
 *  - operations on one stream run in issue order; memcpy_async copies any
 *    direction (host, device, IPC-mapped peer memory);
 *  - write_u32 stores v at addr after all earlier work of the stream has
 *    completed and is visible (a full memory barrier first);
 *  - wait_u32 holds every later operation of the stream until
 *    (int32_t)(*addr - v) >= 0, CUDA's cyclic "greater or equal"
 *    (CU_STREAM_WAIT_VALUE_GEQ), which is *addr >= v while both are below
 *    2^31: flag protocols keep their values in [0, 2^31 - 1] (above, the
 *    comparison wraps: 0xffffffff does not release a wait for 1). It has no
 *    timeout of its own: the host side releases a wait that must end by
 *    storing a larger value (the transports' abort value,
 *    LOOM_DEV_FLAG_ABORT = 2^31 - 1, the largest);
 *  - addr of write_u32/wait_u32 is the device address of a flag word:
 *    device memory, or host memory mapped with host_map (shared-memory
 *    segments included, so flags can live where every process and the host
 *    side can write them);
 *  - an event records the point of the stream's work at event_record;
 *    event_query says whether that point was passed;
 *  - every call returns loomSuccess or an error with loomGetLastError's text
 *    set (UnhandledDeviceError for a failing CUDA call, naming it).
 */
#ifndef LOOM_DEVRT_H
#define LOOM_DEVRT_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_dev_stream *loom_dev_stream_t; /* a cudaStream_t, or an emulated stream */
typedef struct loom_dev_event *loom_dev_event_t;   /* a cudaEvent_t, or an emulated event */

#define LOOM_DEV_IPC_BYTES 64 /* the size of cudaIpcMemHandle_t */
typedef struct {
    unsigned char bytes[LOOM_DEV_IPC_BYTES];
} loom_dev_ipc_t;

#define LOOM_DEV_NAME_BYTES 96
typedef struct {
    char name[LOOM_DEV_NAME_BYTES]; /* "NVIDIA H200", "emulated" */
    char pci_bus_id[16];            /* "0000:19:00.0"; "" when there is none */
    int cc_major, cc_minor;         /* compute capability; 0.0 emulated */
    size_t mem_bytes;               /* global memory */
    int sm_count;
} loom_dev_props_t;

typedef struct loom_devrt {
    const char *name; /* "cuda" or "emulated" */

    /* Devices. */
    int (*device_count)(void);
    loomResult_t (*device_props)(int dev, loom_dev_props_t *props);
    /* The calling thread's current device. */
    loomResult_t (*current_device)(int *dev);

    /* Pointers. ptr_device: the device ordinal of device (or managed) memory,
     * -1 for host memory and NULL; never fails, never logs. ptr_base: the
     * allocation holding p (its base and size), what ipc_export needs. */
    int (*ptr_device)(const void *p);
    loomResult_t (*ptr_base)(const void *p, void **base, size_t *size);

    /* Memory on the current device; size 0 gives NULL. */
    loomResult_t (*mem_alloc)(void **p, size_t size);
    loomResult_t (*mem_free)(void *p);
    /* Pinned host memory the device copies at full speed. */
    loomResult_t (*host_alloc)(void **p, size_t size);
    loomResult_t (*host_free)(void *p);
    /* Makes [p, p+size) of host memory (page aligned, e.g. a shared-memory
     * segment) usable by the device: *dev_p is the address stream operations
     * and kernels use for p. host_unmap undoes it (p as given to host_map). */
    loomResult_t (*host_map)(void *p, size_t size, void **dev_p);
    loomResult_t (*host_unmap)(void *p);

    /* Streams. stream_create makes a stream of loom's own; stream_query:
     * Success when all its work completed, InProgress, or the stream's
     * error. stream_capturing: *capturing = 1 while a CUDA graph capture is
     * open on s. */
    loomResult_t (*stream_create)(loom_dev_stream_t *s);
    loomResult_t (*stream_destroy)(loom_dev_stream_t s);
    loomResult_t (*stream_query)(loom_dev_stream_t s);
    loomResult_t (*stream_capturing)(loom_dev_stream_t s, int *capturing);
    loomResult_t (*memcpy_async)(void *dst, const void *src, size_t n, loom_dev_stream_t s);
    loomResult_t (*write_u32)(loom_dev_stream_t s, uint32_t *addr, uint32_t v);
    loomResult_t (*wait_u32)(loom_dev_stream_t s, uint32_t *addr, uint32_t v);

    /* Events (no timing). */
    loomResult_t (*event_create)(loom_dev_event_t *e);
    loomResult_t (*event_destroy)(loom_dev_event_t e);
    loomResult_t (*event_record)(loom_dev_event_t e, loom_dev_stream_t s);
    /* Success when passed, InProgress when not yet, or an error. */
    loomResult_t (*event_query)(loom_dev_event_t e);

    /* IPC between processes of one host. ipc_export takes an allocation's
     * base (ptr_base); ipc_open maps a handle another process exported (it
     * fails for one this process exported: threads share pointers
     * directly); ipc_close unmaps it. */
    loomResult_t (*ipc_export)(void *base, loom_dev_ipc_t *handle);
    loomResult_t (*ipc_open)(const loom_dev_ipc_t *handle, void **p);
    loomResult_t (*ipc_close)(void *p);

    /* The kernels of dev_kernels.h, queued on s (same arguments). */
    loomResult_t (*reduce)(loom_dev_stream_t s, loomDataType_t dt, loomRedOp_t op, void *dst,
                           const void *const *srcs, int nsrc, size_t n, int nranks);
    loomResult_t (*q4_encode)(loom_dev_stream_t s, const void *src, loomDataType_t dt,
                              const float *err_in, float *err_out, size_t n, uint8_t *dst);
    loomResult_t (*q4_decode)(loom_dev_stream_t s, const uint8_t *src, size_t n, void *dst,
                              loomDataType_t dt);
    loomResult_t (*q4_decode_acc)(loom_dev_stream_t s, const uint8_t *src, size_t n, float *acc);
    loomResult_t (*cast)(loom_dev_stream_t s, void *dst, loomDataType_t ddt, const void *src,
                         loomDataType_t sdt, size_t n);

    /* 1 if write_u32 and wait_u32 work here; 0 with the reason in why (one
     * line) when they do not (a CUDA driver without the stream memory
     * operations: both then fail with UnhandledDeviceError). Never fails. */
    int (*memops_ok)(char *why, size_t why_len);
} loom_devrt_t;

/* The process's device runtime. LOOM_DEVICE=emulated gives the emulation;
 * otherwise (LOOM_DEVICE=auto, the default) the CUDA runtime when
 * this build has it, the CUDA driver is already loaded in the process (the
 * application uses CUDA; loom never initializes CUDA itself for a process
 * that does not) and it reports a device; LOOM_DEVICE=none gives none.
 * NULL when there is none; loom_devrt_why_none says why, e.g. "built without
 * the cuda feature", "the CUDA driver is not loaded in this process". A
 * runtime once found stays the process's; until one is, every call looks
 * again (communicator creation calls it, so an application that starts CUDA
 * after loading loom still gets the device path). Thread safe.
 * loom_devrt_why_none looks too: "" when there is a runtime, else the reason
 * (the calling thread's text, valid until its next call). */
const loom_devrt_t *loom_devrt(void);
const char *loom_devrt_why_none(void);
/* The runtime loom_devrt has found so far, NULL if none yet: one atomic load,
 * never a look (what a call on a communicator without a device state asks). */
const loom_devrt_t *loom_devrt_found(void);
/* The implementations, for loom_info and the tests: NULL when this build or
 * machine lacks one (why gets the reason). */
const loom_devrt_t *loom_devrt_cuda(char *why, size_t why_len);
const loom_devrt_t *loom_devrt_emulated(void);

#ifdef __cplusplus
}
#endif

#endif

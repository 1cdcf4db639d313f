/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_buffers.h - what a call's buffers and stream are, without linking
 * CUDA: the driver (libcuda.so.1) is asked only when something else already
 * loaded it into the process (dlopen with RTLD_NOLOAD); without it no device
 * memory and no CUDA stream can exist. Used by shim_impl_coll.c and, for
 * ncclCommCuDevice, shim_impl_init.c.
 */
#ifndef LOOM_NCCL_SHIM_BUFFERS_H
#define LOOM_NCCL_SHIM_BUFFERS_H

#include "shim.h"

/* 1 if a or b is CUDA device (or managed) memory; 0 for host memory, NULL,
 * or when the driver is not loaded or not initialized. */
int shim_any_device_ptr(const void *a, const void *b);

typedef enum {
    SHIM_STREAM_NONE, /* NULL (or CUDA's default streams with no driver loaded): run blocking */
    SHIM_STREAM_LOOM, /* a loomStream_t passed as a cudaStream_t: queue on it */
    SHIM_STREAM_CUDA  /* a CUDA stream: synchronize it, then run blocking */
} shim_stream_kind_t;

typedef struct {
    shim_stream_kind_t kind;
    int capturing; /* a CUDA stream being captured into a graph */
    loomStream_t loom;
} shim_stream_t;

/* Says which kind stream is. InvalidArgument (named by fn) for a value that
 * is neither loom's nor a CUDA stream the driver knows. */
ncclResult_t shim_stream_classify(cudaStream_t stream, const char *fn, shim_stream_t *out);
/* cuStreamSynchronize on a CUDA stream (the runtime's streams are the
 * driver's); UnhandledCudaError if it fails. */
ncclResult_t shim_stream_sync(cudaStream_t stream, const char *fn);
/* The device of the calling thread's current CUDA context, or 0 when there is
 * none or the driver is not loaded. */
int shim_cuda_device(void);
/* Whether the process has loaded the CUDA driver (the application uses CUDA). */
int shim_cuda_loaded(void);

#endif

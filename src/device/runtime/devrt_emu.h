/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu.h - what the host emulation of the device runtime offers beyond
 * the devrt.h table, for tests: marking a stream as capturing (the emulation
 * cannot capture a CUDA graph, but the transports' rules about capture can
 * then be checked on a CPU) and counting what it holds (leak checks).
 *
 * Semantics of the emulation the table's contract leaves open (the CUDA
 * runtime's, where it has them):
 *  - streams made by stream_create are blocking streams: an operation on one
 *    runs after the default (NULL) stream's operations queued before it, and
 *    an operation on the default stream after every other stream's
 *    operations queued before it (CUDA's legacy default stream);
 *  - mem_free, host_free and ipc_close first wait for the work queued on
 *    every stream so far (cudaFree synchronizes the device);
 *  - write_u32, wait_u32 and the kernels need device memory, memory of
 *    host_alloc or host memory mapped with host_map (InvalidArgument for other
 *    host memory, which a GPU cannot reach); memcpy_async takes any memory;
 *  - streams and events do not survive fork(): in the child they fail with
 *    InvalidUsage (the workers are the parent's threads); memory does, and a
 *    child may ipc_open what its parent exported.
 */
#ifndef LOOM_DEVRT_EMU_H
#define LOOM_DEVRT_EMU_H

#include <stddef.h>

#include "devrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes stream_capturing answer `capturing` for s (NULL: the default
 * stream) from now on. Errors: InvalidArgument (not a live stream of the
 * emulation), InvalidUsage (a stream of the parent process). */
loomResult_t loom_devrt_emu_set_capturing(loom_dev_stream_t s, int capturing);

/* Streams whose worker thread is running (the default stream's included,
 * once used; a destroyed stream counts until its queued work is done). */
int loom_devrt_emu_live_streams(void);

/* Live memory ranges the emulation knows, by kind: device allocations, IPC
 * mappings, host_alloc buffers and host_map registrations. */
typedef struct {
    size_t dev, ipc, host, mapped;
} loom_devrt_emu_counts_t;
void loom_devrt_emu_counts(loom_devrt_emu_counts_t *counts);

#ifdef __cplusplus
}
#endif

#endif

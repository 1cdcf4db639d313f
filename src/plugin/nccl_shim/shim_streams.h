/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_streams.h - what loom's device path needs of a communicator for a call
 * on device buffers (shim_streams.c): whether loom's side has a device path
 * (asked once), and the loom stream that wraps the CUDA stream the call
 * names (loomStreamCreateFromCuda), kept per communicator so that a call
 * costs no creation.
 *
 * Lifetime. NCCL tells a library nothing when the application destroys a
 * CUDA stream, so a wrapper is kept until its communicator goes, in a cache
 * of at most SHIM_WRAPS_MAX streams (the least recently used one leaves when
 * a new stream comes). A wrapper holds the stream's handle value only: it
 * never touches a destroyed stream, and a stream made later at the same
 * address is served by it correctly. ncclCommFinalize waits for the
 * wrappers' work and destroys them; when the communicator's object is freed
 * (after its destroy or abort, once no call uses it) the rest go. A wrapper
 * that still has work queued then (after an abort, or when evicted) is
 * destroyed later, when a look finds its work done: the process's list of
 * such wrappers is looked at whenever a wrapper is made or a communicator
 * freed, never waited for.
 */
#ifndef LOOM_NCCL_SHIM_STREAMS_H
#define LOOM_NCCL_SHIM_STREAMS_H

#include "shim_comm.h"

#define SHIM_WRAPS_MAX 32

/* Whether loom's side l of c runs calls on device memory: 1, or 0 with the
 * reason in *why (the communicator's text, valid while c lives). *runtime
 * gets the runtime's name ("cuda", "emulated") or NULL. Asked once per
 * communicator: the answer is fixed at its creation. */
int shim_comm_device(shim_comm_t *c, loomComm_t l, const char **runtime, const char **why);

/* The loom stream wrapping CUDA stream s (NULL: CUDA's default stream) for
 * calls on c, once shim_comm_device said c has a device path: made at the
 * first call that names s, then reused. in_group: the caller is inside a
 * loom group (then no wrapper is destroyed now). Errors:
 * loomStreamCreateFromCuda's (its text as the last error). */
ncclResult_t shim_wrap_stream(shim_comm_t *c, cudaStream_t s, const char *fn, int in_group,
                              loomStream_t *out);

/* ncclCommFinalize: waits for the work of c's wrappers (loomStreamSynchronize,
 * which covers each CUDA stream up to c's last call on it) and destroys them.
 * The first failure among them, named by fn. */
ncclResult_t shim_wraps_finish(shim_comm_t *c, const char *fn);

/* When c's object is freed: destroys its wrappers whose work is done, and
 * passes the others to the process's list of wrappers destroyed later. */
void shim_wraps_free(shim_comm_t *c);

#endif

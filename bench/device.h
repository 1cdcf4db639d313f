/* SPDX-License-Identifier: Apache-2.0
 *
 * device.h - the device buffers of the *_perf programs (-G 1): memory from
 * loomMemAlloc, calls queued on a loom stream that wraps a CUDA stream
 * (loomStreamCreateFromCuda), and the copies between that memory and the host
 * memory where the driver writes inputs and checks results.
 *
 * The runtime is the one loom itself picks (LOOM_DEVICE, docs/gpu.md):
 *   emulated  LOOM_DEVICE=emulated: device memory is host memory, a copy is
 *             memcpy and the stream is the emulation's default stream;
 *   cuda      otherwise, in programs built with the CUDA runtime
 *             (LOOM_HAVE_CUDA): the program starts CUDA on its GPU before
 *             the communicator exists, as an application does, and copies
 *             with cudaMemcpy;
 *   none      neither: loomMemAlloc then fails and says why.
 * Only include/loom.h of libloom is used; the CUDA runtime is called
 * directly, never through loom.
 */
#ifndef LOOM_BENCH_DEVICE_H
#define LOOM_BENCH_DEVICE_H

#include <stddef.h>

#include "loom.h"

typedef enum { BENCH_DEV_NONE, BENCH_DEV_EMULATED, BENCH_DEV_CUDA } bench_dev_kind_t;

/* Picks the runtime and, for CUDA, makes the rank's GPU (its local rank modulo the
 * GPUs) current. Call before the communicator is created. *why: NULL, or why CUDA
 * could not start (the hint to print when loomMemAlloc then fails). */
bench_dev_kind_t bench_dev_start(const char **why);
/* "cuda", "emulated" or "none". */
const char *bench_dev_kind_name(bench_dev_kind_t kind);

/* The device this process uses, for the header: its ordinal, PCI bus id ("emulated"
 * under the emulation) and name. */
void bench_dev_describe(int *ordinal, char *bus, size_t bus_len, char *name, size_t name_len);

/* The stream of -z 0: a new CUDA stream wrapped by loomStreamCreateFromCuda, or the
 * emulation's default stream. bench_dev_stream_destroy destroys both. */
loomResult_t bench_dev_stream_create(loomStream_t *stream);
loomResult_t bench_dev_stream_destroy(loomStream_t stream);

/* n bytes between host and device memory (to_device: host src, device dst), complete on
 * return. UnhandledDeviceError when the CUDA runtime fails; bench_dev_error says how. */
loomResult_t bench_dev_copy(void *dst, const void *src, size_t n, int to_device);
/* The last failure of this file's CUDA calls ("" if none). */
const char *bench_dev_error(void);

/* The driver's send and receive buffers: where the calls read and write (host memory, or
 * device memory with -G 1) and, for device memory, host mirrors of the same layout that
 * inputs are written to and results checked in. */
typedef struct bench_bufs {
    int device;                  /* send and recv come from loomMemAlloc */
    size_t bytes;                /* of each */
    char *send, *recv;           /* what the calls get */
    char *send_host, *recv_host; /* the host mirrors; send and recv themselves without -G */
} bench_bufs_t;

/* Two buffers of bytes each, zeroed. Host memory that cannot be had exits (bench_die);
 * loomMemAlloc's failure is returned with loom's last error set. */
loomResult_t bench_bufs_alloc(bench_bufs_t *b, size_t bytes, int device);
/* The host memory that stands for p, an address inside send or recv. */
char *bench_bufs_host(const bench_bufs_t *b, const char *p);
/* Copies n bytes at p (inside send or recv) from its host mirror to the device (put) or
 * back (get); nothing to do for host buffers. */
loomResult_t bench_bufs_put(const bench_bufs_t *b, const char *p, size_t n);
loomResult_t bench_bufs_get(const bench_bufs_t *b, const char *p, size_t n);
/* Frees what bench_bufs_alloc made (device memory with loomMemFree). */
loomResult_t bench_bufs_free(bench_bufs_t *b);

#endif /* LOOM_BENCH_DEVICE_H */

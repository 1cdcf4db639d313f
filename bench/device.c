/* SPDX-License-Identifier: Apache-2.0
 *
 * device.c - the device runtime side of the benchmarks' -G 1 (device.h): which
 * runtime gives the memory, starting CUDA on the rank's GPU, the -z 0 stream and
 * the copies to and from device memory. With LOOM_HAVE_CUDA (builds with the
 * cuda feature) it calls the CUDA runtime; without, only the emulation's memory
 * can be copied, and that is host memory.
 */
#include "device.h"

#include "options.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static bench_dev_kind_t g_kind = BENCH_DEV_NONE;
static int g_ordinal;
static char g_error[256];

const char *bench_dev_kind_name(bench_dev_kind_t kind)
{
    return kind == BENCH_DEV_CUDA ? "cuda" : kind == BENCH_DEV_EMULATED ? "emulated" : "none";
}

const char *bench_dev_error(void)
{
    return g_error;
}

#ifdef LOOM_HAVE_CUDA
static cudaStream_t g_cuda_stream;

/* This process's rank among those of its host, from the launcher's environment (loomrun,
 * torchrun, Open MPI, MPICH, Slurm); 0 without one. */
static int local_rank(void)
{
    static const char *const vars[] = {"LOOM_LOCAL_RANK", "LOCAL_RANK",
                                       "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v) > 0 ? atoi(v) : 0;
    }
    return 0;
}

/* Notes a failed CUDA call in g_error; returns UnhandledDeviceError. */
static loomResult_t cuda_failed(const char *call, cudaError_t err)
{
    snprintf(g_error, sizeof(g_error), "%s: %s (CUDA error %d)", call, cudaGetErrorString(err),
             (int)err);
    return loomUnhandledDeviceError;
}

/* Makes GPU local_rank % count current, which also loads the driver that loom's device
 * runtime looks for. */
static int start_cuda(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cuda_failed("cudaGetDeviceCount", err);
        return -1;
    }
    if (count == 0) {
        snprintf(g_error, sizeof(g_error), "cudaGetDeviceCount: no CUDA device");
        return -1;
    }
    g_ordinal = local_rank() % count;
    if ((err = cudaSetDevice(g_ordinal)) != cudaSuccess || (err = cudaFree(NULL)) != cudaSuccess) {
        cuda_failed("cudaSetDevice", err);
        return -1;
    }
    return 0;
}
#endif

bench_dev_kind_t bench_dev_start(const char **why)
{
    const char *dev = getenv("LOOM_DEVICE");
    *why = NULL;
    g_error[0] = '\0';
    if (dev && strcmp(dev, "emulated") == 0) {
        g_kind = BENCH_DEV_EMULATED;
        g_ordinal = 0;
        return g_kind;
    }
    g_kind = BENCH_DEV_NONE;
    if (dev && strcmp(dev, "none") == 0) {
        *why = "LOOM_DEVICE=none turns loom's device runtime off; LOOM_DEVICE=emulated runs -G 1 "
               "on the host emulation";
        return g_kind;
    }
#ifdef LOOM_HAVE_CUDA
    g_kind = BENCH_DEV_CUDA;
    if (start_cuda() != 0) {
        static char hint[384];
        snprintf(hint, sizeof(hint),
                 "CUDA did not start (%s); LOOM_DEVICE=emulated runs -G 1 on the host emulation",
                 g_error);
        *why = hint;
    }
#else
    *why = "this program was built without the CUDA runtime; LOOM_DEVICE=emulated runs -G 1 "
           "on the host emulation";
#endif
    return g_kind;
}

void bench_dev_describe(int *ordinal, char *bus, size_t bus_len, char *name, size_t name_len)
{
    *ordinal = g_ordinal;
    snprintf(bus, bus_len, "%s", bench_dev_kind_name(g_kind));
    snprintf(name, name_len, "%s device memory", bench_dev_kind_name(g_kind));
#ifdef LOOM_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (g_kind == BENCH_DEV_CUDA && cudaGetDeviceProperties(&prop, g_ordinal) == cudaSuccess) {
        snprintf(name, name_len, "%s", prop.name);
        char id[32];
        if (cudaDeviceGetPCIBusId(id, (int)sizeof(id), g_ordinal) == cudaSuccess)
            snprintf(bus, bus_len, "%s", id);
    }
#endif
}

loomResult_t bench_dev_stream_create(loomStream_t *stream)
{
#ifdef LOOM_HAVE_CUDA
    if (g_kind == BENCH_DEV_CUDA) {
        cudaError_t err = cudaStreamCreateWithFlags(&g_cuda_stream, cudaStreamNonBlocking);
        if (err != cudaSuccess)
            return cuda_failed("cudaStreamCreateWithFlags", err);
        loomResult_t res = loomStreamCreateFromCuda(stream, g_cuda_stream);
        if (res != loomSuccess) {
            cudaStreamDestroy(g_cuda_stream);
            g_cuda_stream = NULL;
        }
        return res;
    }
#endif
    return loomStreamCreateFromCuda(stream, NULL);
}

loomResult_t bench_dev_stream_destroy(loomStream_t stream)
{
    loomResult_t res = loomStreamDestroy(stream);
#ifdef LOOM_HAVE_CUDA
    if (g_cuda_stream) {
        cudaError_t err = cudaStreamDestroy(g_cuda_stream);
        g_cuda_stream = NULL;
        if (err != cudaSuccess && res == loomSuccess)
            res = cuda_failed("cudaStreamDestroy", err);
    }
#endif
    return res;
}

loomResult_t bench_dev_copy(void *dst, const void *src, size_t n, int to_device)
{
    if (n == 0)
        return loomSuccess;
#ifdef LOOM_HAVE_CUDA
    if (g_kind == BENCH_DEV_CUDA) {
        /* cudaMemcpy from pageable memory may return before the device has the bytes; the
         * synchronize makes them visible to the calls on the program's own stream. */
        cudaError_t err =
            cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
        if (err != cudaSuccess)
            return cuda_failed(
                to_device ? "cudaMemcpy to the device" : "cudaMemcpy from the device", err);
        if ((err = cudaDeviceSynchronize()) != cudaSuccess)
            return cuda_failed("cudaDeviceSynchronize", err);
        return loomSuccess;
    }
#endif
    (void)to_device;
    if (g_kind != BENCH_DEV_EMULATED) {
        snprintf(g_error, sizeof(g_error),
                 "device memory of the %s runtime cannot be copied by this program",
                 bench_dev_kind_name(g_kind));
        return loomUnhandledDeviceError;
    }
    memcpy(dst, src, n); /* the emulation's device memory is this process's host memory */
    return loomSuccess;
}

// ---- The driver's buffers ------------------------------------------------------

static char *host_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1))
        bench_die("lower -e (each rank holds three buffers of maxBytes)",
                  "cannot allocate %zu bytes", bytes);
    memset(p, 0, bytes);
    return p;
}

loomResult_t bench_bufs_alloc(bench_bufs_t *b, size_t bytes, int device)
{
    *b = (bench_bufs_t){.device = device, .bytes = bytes};
    b->send_host = host_alloc(bytes);
    b->recv_host = host_alloc(bytes);
    if (!device) {
        b->send = b->send_host;
        b->recv = b->recv_host;
        return loomSuccess;
    }
    loomResult_t res = loomMemAlloc((void **)&b->send, bytes ? bytes : 1);
    if (res == loomSuccess)
        res = loomMemAlloc((void **)&b->recv, bytes ? bytes : 1);
    if (res == loomSuccess)
        res = bench_bufs_put(b, b->send, bytes);
    if (res == loomSuccess)
        res = bench_bufs_put(b, b->recv, bytes);
    return res;
}

char *bench_bufs_host(const bench_bufs_t *b, const char *p)
{
    if (!b->device)
        return (char *)p;
    const uintptr_t at = (uintptr_t)p, send = (uintptr_t)b->send;
    if (at >= send && at <= send + b->bytes)
        return b->send_host + (at - send);
    return b->recv_host + (at - (uintptr_t)b->recv);
}

loomResult_t bench_bufs_put(const bench_bufs_t *b, const char *p, size_t n)
{
    return b->device ? bench_dev_copy((void *)p, bench_bufs_host(b, p), n, 1) : loomSuccess;
}

loomResult_t bench_bufs_get(const bench_bufs_t *b, const char *p, size_t n)
{
    return b->device ? bench_dev_copy(bench_bufs_host(b, p), p, n, 0) : loomSuccess;
}

loomResult_t bench_bufs_free(bench_bufs_t *b)
{
    loomResult_t res = loomSuccess;
    if (b->device) {
        res = loomMemFree(b->send);
        loomResult_t r2 = loomMemFree(b->recv);
        res = res != loomSuccess ? res : r2;
    }
    free(b->send_host);
    free(b->recv_host);
    *b = (bench_bufs_t){0};
    return res;
}

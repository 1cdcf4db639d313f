/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_device_prog.c - a program written against NCCL's nccl.h that runs
 * the drop-in library's calls on device buffers and CUDA streams, under
 * loom's emulated device runtime (LOOM_DEVICE=emulated): what a GPU program
 * linked with -lnccl does, with libfake-cuda-emu.so standing for the CUDA
 * driver and runtime (it is dlopen'd first, as a CUDA program has its driver
 * loaded; its dependency exports the emulation's streams, reached with
 * dlsym as a program calls cudaStreamCreate and the like). Emulated device
 * memory is host memory: the program fills and reads it directly, after
 * synchronizing the stream, where a GPU program would copy.
 *
 *   loom_device_prog MODE NRANKS FAKE_CUDA [FAKE_NCCL]
 *
 * Forks NRANKS ranks; rank 0 makes the unique id and hands it on through
 * pipes. MODE (the environment is set by the caller, test_shim_device.cc):
 *   loom    LOOM_NCCL_MODE=loom, LOOM_NCCL_ECHO=1: every case on host
 *           buffers with stream NULL, then on ncclMemAlloc buffers on a
 *           stream of the emulation and on CUDA's default stream (NULL),
 *           bitwise equal to the host run; then the device path's edges: a
 *           call is queued on its stream and returns before it runs, a
 *           captured stream passes through to a capturable transport and a
 *           captured group (host-staged) is refused with loom's text,
 *           PreMulSum is refused, more streams than the library keeps
 *           wrappers for, streams destroyed and made again, host buffers on
 *           a CUDA stream, ncclCommFinalize flushing queued calls;
 *   staged  as loom with LOOM_DEVICE_TRANSPORTS=staged: the cases again,
 *           then a captured AllReduce refused (ncclInvalidUsage, loom's
 *           text in ncclGetLastError);
 *   route   LOOM_NCCL_MODE=route paired with libfake-nccl.so (FAKE_NCCL):
 *           with the built-in rules every call on device buffers goes to
 *           NCCL (the fake's call counts tell); with a LOOM_NCCL_ROUTE rule
 *           that takes a 1 MiB bf16 sum AllReduce to loom, that call goes to
 *           loom and an AllGather to NCCL, a captured one to loom where its
 *           transport may be captured, and to NCCL under
 *           LOOM_DEVICE_TRANSPORTS=staged (MODE route-staged).
 * Prints one line per rank and exits 0 when every rank passed.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_util.h"

static int g_rank = -1;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (last error: %s)\n", ncclGetLastError(NULL));
    _exit(1);
}

#define CHECK_RES(call, want)                                                                      \
    do {                                                                                           \
        const ncclResult_t r_ = (call);                                                            \
        if (r_ != (want))                                                                          \
            die("%s:%d: %s returned %d (%s), expected %d", __FILE__, __LINE__, #call, (int)r_,     \
                ncclGetErrorString(r_), (int)(want));                                              \
    } while (0)
#define CHECK(call) CHECK_RES(call, ncclSuccess)
/* The call fails with want and the last error holds words. */
#define REFUSED(call, want, words)                                                                 \
    do {                                                                                           \
        CHECK_RES(call, want);                                                                     \
        if (strstr(ncclGetLastError(NULL), (words)) == NULL)                                       \
            die("%s:%d: the last error of %s does not say \"%s\"", __FILE__, __LINE__, #call,      \
                (words));                                                                          \
    } while (0)

/* ---- the CUDA stand-in ------------------------------------------------------------------ */

static struct {
    int (*stream_create)(void **);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*set_capturing)(void *, int);
    int (*wait_word)(void *, unsigned *, unsigned);
    int (*ptr_device)(const void *);
    int (*mem_alloc)(void **, size_t); /* loomMemAlloc: cudaMalloc's stand-in */
    int (*mem_free)(void *);
} cu;

static void load_cuda(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL)
        die("dlopen(%s): %s", path, dlerror());
    *(void **)&cu.stream_create = dlsym(h, "emuTestStreamCreate");
    *(void **)&cu.stream_destroy = dlsym(h, "emuTestStreamDestroy");
    *(void **)&cu.stream_sync = dlsym(h, "emuTestStreamSynchronize");
    *(void **)&cu.set_capturing = dlsym(h, "emuTestStreamSetCapturing");
    *(void **)&cu.wait_word = dlsym(h, "emuTestStreamWaitWord");
    *(void **)&cu.ptr_device = dlsym(h, "emuTestPtrDevice");
    *(void **)&cu.mem_alloc = dlsym(h, "loomMemAlloc");
    *(void **)&cu.mem_free = dlsym(h, "loomMemFree");
    if (!cu.stream_create || !cu.stream_destroy || !cu.stream_sync || !cu.set_capturing ||
        !cu.wait_word || !cu.ptr_device || !cu.mem_alloc || !cu.mem_free)
        die("%s lacks the emulation's functions", path);
}

static cudaStream_t new_stream(void)
{
    void *s = NULL;
    if (cu.stream_create(&s) != 0 || s == NULL)
        die("emuTestStreamCreate failed");
    return (cudaStream_t)s;
}

static void sync_stream(cudaStream_t s)
{
    if (cu.stream_sync((void *)s) != 0)
        die("synchronizing stream %p failed", (void *)s);
}

static void set_capturing(cudaStream_t s, int on)
{
    if (cu.set_capturing((void *)s, on) != 0)
        die("marking stream %p as capturing failed", (void *)s);
}

/* ---- inputs ------------------------------------------------------------------------------ */

typedef enum { AR, AG, RS, BC, BCAST, RED, A2A, GATHER, SCATTER, SENDRECV } kind_t;
static const char *const kind_names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                         "Bcast",     "Reduce",    "AlltoAll",      "Gather",
                                         "Scatter",   "Send/Recv"};

typedef struct {
    kind_t kind;
    ncclDataType_t dt;
    ncclRedOp_t op;
    size_t count;
    int inplace;
    int root;
} case_t;

static size_t send_elems(const case_t *c, int n)
{
    switch (c->kind) {
    case RS:
    case A2A:
        return c->count * (size_t)n;
    case SCATTER:
        return c->count * (size_t)n;
    default:
        return c->count;
    }
}

static size_t recv_elems(const case_t *c, int n)
{
    switch (c->kind) {
    case AG:
    case A2A:
    case GATHER:
        return c->count * (size_t)n;
    default:
        return c->count;
    }
}

static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float from_bf16(uint16_t b)
{
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Element i of the input of case idx on rank: small values every datatype holds. */
static float value(int idx, int rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)idx * 5) % 23) - 11) * 0.375f;
}

static void fill(void *buf, const case_t *c, size_t elems, int idx, int rank)
{
    for (size_t i = 0; i < elems; i++) {
        const float v = value(idx, rank, i);
        switch (c->dt) {
        case ncclFloat32:
            ((float *)buf)[i] = v;
            break;
        case ncclBfloat16:
            ((uint16_t *)buf)[i] = to_bf16(v);
            break;
        case ncclFloat16: { /* v is a multiple of 1/8 below 5: exact in half */
            const float a = fabsf(v);
            uint16_t h = v < 0 ? 0x8000 : 0;
            if (a != 0) {
                int e = 0;
                const float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
                h |= (uint16_t)((e - 1 + 15) << 10);
                h |= (uint16_t)((m * 2 - 1) * 1024);
            }
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case ncclInt8:
            ((int8_t *)buf)[i] = (int8_t)(v * 8);
            break;
        default:
            ((int32_t *)buf)[i] = (int32_t)(v * 8);
            break;
        }
    }
}

/* ---- one call ------------------------------------------------------------------------------ */

typedef struct {
    char *send, *recv; /* recv may lie inside send (in place) */
    size_t send_bytes, recv_bytes;
    int device;
} bufs_t;

static void *alloc_dev(size_t bytes)
{
    void *p = NULL;
    CHECK(ncclMemAlloc(&p, bytes));
    if (p == NULL || cu.ptr_device(p) < 0)
        die("ncclMemAlloc(%zu) did not give device memory", bytes);
    return p;
}

static bufs_t make_bufs(const case_t *c, int n, int rank, int idx, int device)
{
    const size_t es = prog_type_size(c->dt);
    bufs_t b = {NULL, NULL, send_elems(c, n) * es, recv_elems(c, n) * es, device};
    /* In place: the output inside one buffer of the larger size. */
    const size_t big = b.send_bytes > b.recv_bytes ? b.send_bytes : b.recv_bytes;
    const size_t alloc_send = c->inplace ? big : b.send_bytes;
    b.send = device ? alloc_dev(alloc_send + 1) : malloc(alloc_send + 1);
    b.recv = c->inplace ? NULL : device ? alloc_dev(b.recv_bytes + 1) : malloc(b.recv_bytes + 1);
    if (b.send == NULL || (!c->inplace && b.recv == NULL))
        die("out of memory");
    memset(b.send, 0x5a, alloc_send + 1);
    if (b.recv)
        memset(b.recv, 0x5a, b.recv_bytes + 1);
    if (c->inplace) {
        b.recv = b.send;
        if (c->kind == AG) /* sendbuff = recvbuff + rank * count */
            fill(b.send + (size_t)rank * c->count * es, c, c->count, idx, rank);
        else
            fill(b.send, c, send_elems(c, n), idx, rank);
        if (c->kind == RS) /* recvbuff = sendbuff + rank * count */
            b.recv = b.send + (size_t)rank * c->count * es;
    } else {
        fill(b.send, c, send_elems(c, n), idx, rank);
    }
    return b;
}

static void free_bufs(bufs_t *b, int inplace)
{
    if (b->device) {
        CHECK(ncclMemFree(b->send));
        if (!inplace)
            CHECK(ncclMemFree(b->recv));
    } else {
        free(b->send);
        if (!inplace)
            free(b->recv);
    }
}

static void issue(const case_t *c, bufs_t *b, ncclComm_t comm, int rank, int n, cudaStream_t s)
{
    const size_t es = prog_type_size(c->dt);
    switch (c->kind) {
    case AR:
        CHECK(ncclAllReduce(b->send, b->recv, c->count, c->dt, c->op, comm, s));
        break;
    case AG:
        CHECK(ncclAllGather(c->inplace ? b->recv + (size_t)rank * c->count * es : b->send, b->recv,
                            c->count, c->dt, comm, s));
        break;
    case RS:
        CHECK(ncclReduceScatter(b->send, b->recv, c->count, c->dt, c->op, comm, s));
        break;
    case BC:
        CHECK(ncclBroadcast(b->send, b->recv, c->count, c->dt, c->root, comm, s));
        break;
    case BCAST:
        CHECK(ncclBcast(b->send, c->count, c->dt, c->root, comm, s));
        break;
    case RED:
        CHECK(ncclReduce(b->send, b->recv, c->count, c->dt, c->op, c->root, comm, s));
        break;
    case A2A:
        CHECK(ncclAlltoAll(b->send, b->recv, c->count, c->dt, comm, s));
        break;
    case GATHER:
        CHECK(ncclGather(b->send, b->recv, c->count, c->dt, c->root, comm, s));
        break;
    case SCATTER:
        CHECK(ncclScatter(b->send, b->recv, c->count, c->dt, c->root, comm, s));
        break;
    case SENDRECV:
        CHECK(ncclGroupStart());
        CHECK(ncclSend(b->send, c->count, c->dt, (rank + 1) % n, comm, s));
        CHECK(ncclRecv(b->recv, c->count, c->dt, (rank + n - 1) % n, comm, s));
        CHECK(ncclGroupEnd());
        break;
    }
}

/* The bytes a case defines on this rank (Reduce and Gather: the root's only). */
static size_t out_bytes(const case_t *c, const bufs_t *b, int rank)
{
    if ((c->kind == RED || c->kind == GATHER) && rank != c->root)
        return 0;
    return c->kind == BCAST ? b->send_bytes : b->recv_bytes;
}

/* Runs case idx on host buffers with stream NULL and on device buffers on each stream; every
 * output must equal the host run's bit for bit. */
static void run_case(const case_t *c, int idx, ncclComm_t comm, int rank, int n,
                     const cudaStream_t *streams, int nstreams)
{
    bufs_t h = make_bufs(c, n, rank, idx, 0);
    issue(c, &h, comm, rank, n, NULL);
    const size_t nb = out_bytes(c, &h, rank);
    for (int k = 0; k < nstreams; k++) {
        bufs_t d = make_bufs(c, n, rank, idx, 1);
        issue(c, &d, comm, rank, n, streams[k]);
        sync_stream(streams[k]);
        if (memcmp(h.recv, d.recv, nb) != 0) {
            size_t at = 0;
            while (at < nb && h.recv[at] == d.recv[at])
                at++;
            die("%s dtype %d count %zu%s on device buffers, stream %p: byte %zu is %d, the host "
                "run gives %d",
                kind_names[c->kind], (int)c->dt, c->count, c->inplace ? " in place" : "",
                (void *)streams[k], at, d.recv[at], h.recv[at]);
        }
        free_bufs(&d, c->inplace);
    }
    free_bufs(&h, c->inplace);
}

static const case_t cases[] = {
    {AR, ncclFloat32, ncclSum, 1000, 0, 0},
    {AR, ncclBfloat16, ncclSum, 4099, 0, 0},
    {AR, ncclFloat16, ncclMax, 513, 1, 0},
    {AR, ncclFloat32, ncclAvg, 77, 0, 0},
    {AR, ncclInt32, ncclProd, 65, 0, 0},
    {AR, ncclFloat32, ncclSum, 0, 0, 0},
    {AG, ncclFloat32, ncclSum, 1000, 0, 0},
    {AG, ncclBfloat16, ncclSum, 33, 1, 0},
    {RS, ncclFloat32, ncclSum, 1000, 0, 0},
    {RS, ncclBfloat16, ncclMin, 257, 1, 0},
    {BC, ncclFloat32, ncclSum, 1000, 0, 1},
    {BCAST, ncclInt8, ncclSum, 100, 1, 0},
    {RED, ncclFloat32, ncclSum, 300, 0, 1},
    {A2A, ncclFloat32, ncclSum, 100, 0, 0},
    {GATHER, ncclFloat32, ncclSum, 50, 0, 1},
    {SCATTER, ncclFloat32, ncclSum, 50, 0, 0},
    {SENDRECV, ncclFloat32, ncclSum, 1000, 0, 0},
    /* 1.2 MiB of bf16 sum: Echo under the default rules with LOOM_NCCL_ECHO=1 */
    {AR, ncclBfloat16, ncclSum, 600000, 0, 0},
};
#define NCASES ((int)(sizeof(cases) / sizeof(cases[0])))

/* ---- the checks ----------------------------------------------------------------------------- */

/* A float32 sum AllReduce of count elements on device buffers on s, checked after sync. */
static void sum_on(ncclComm_t comm, int rank, int n, cudaStream_t s, size_t count, int sync)
{
    float *in = alloc_dev(count * 4), *out = alloc_dev(count * 4);
    for (size_t i = 0; i < count; i++)
        in[i] = (float)((rank + 1) * (int)(i % 1000 + 1));
    CHECK(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, s));
    if (sync)
        sync_stream(s);
    for (size_t i = 0; i < count; i++)
        if (out[i] != (float)(n * (n + 1) / 2 * (int)(i % 1000 + 1)))
            die("sum on stream %p: element %zu is %g", (void *)s, i, (double)out[i]);
    CHECK(ncclMemFree(in));
    CHECK(ncclMemFree(out));
}

/* Echo ran on the big bf16 case: its output is not the exact sum everywhere. */
static void check_echo_ran(ncclComm_t comm, int rank, int n, cudaStream_t s)
{
    const case_t *c = &cases[NCASES - 1];
    bufs_t d = make_bufs(c, n, rank, NCASES - 1, 1);
    issue(c, &d, comm, rank, n, s);
    sync_stream(s);
    size_t inexact = 0;
    for (size_t i = 0; i < c->count; i++) {
        float exact = 0;
        for (int r = 0; r < n; r++)
            exact += from_bf16(to_bf16(value(NCASES - 1, r, i)));
        if (((uint16_t *)d.recv)[i] != to_bf16(exact))
            inexact++;
    }
    if (inexact == 0)
        die("the 1.2 MiB bf16 AllReduce is exact: Echo did not run it");
    free_bufs(&d, 0);
}

/* A call on a CUDA stream is queued on that stream and returns: with the stream held behind a
 * wait it cannot pass yet, the call has not run when it returned, nor 50 ms later, and runs once
 * released; with another stream held, it runs (a call put on CUDA's default stream, which follows
 * every other stream, would wait). */
static void check_queued_on_stream(ncclComm_t comm, int rank, int n, cudaStream_t s)
{
    cudaStream_t other = new_stream();
    unsigned *word = alloc_dev(sizeof(unsigned));
    float *in = alloc_dev(1024 * 4), *out = alloc_dev(1024 * 4);
    for (int held_self = 1; held_self >= 0; held_self--) {
        *word = 0;
        if (cu.wait_word((void *)(held_self ? s : other), word, 1) != 0)
            die("queueing a wait on a stream failed");
        for (int i = 0; i < 1024; i++) {
            in[i] = (float)(rank + 1);
            out[i] = -1;
        }
        CHECK(ncclAllReduce(in, out, 1024, ncclFloat32, ncclSum, comm, s));
        if (held_self) {
            usleep(50000);
            for (int i = 0; i < 1024; i++)
                if (out[i] != -1)
                    die("the AllReduce on stream %p ran before the stream reached it", (void *)s);
            __atomic_store_n(word, 1, __ATOMIC_SEQ_CST);
        }
        sync_stream(s);
        for (int i = 0; i < 1024; i++)
            if (out[i] != (float)(n * (n + 1) / 2))
                die("the AllReduce on stream %p with %s held: element %d is %g", (void *)s,
                    held_self ? "it" : "another stream", i, (double)out[i]);
        __atomic_store_n(word, 1, __ATOMIC_SEQ_CST);
        sync_stream(other);
    }
    CHECK(ncclMemFree(in));
    CHECK(ncclMemFree(out));
    CHECK(ncclMemFree(word));
    if (cu.stream_destroy((void *)other) != 0)
        die("destroying a stream failed");
}

static void check_loom_edges(ncclComm_t comm, int rank, int n, cudaStream_t s)
{
    check_queued_on_stream(comm, rank, n, s);

    /* ncclMemFree hands device memory to loom, which refuses what it did not give */
    int host = 0;
    REFUSED(ncclMemFree(&host), ncclInvalidArgument, "loomMemAlloc");

    /* a captured stream passes through: ipc may be captured */
    cudaStream_t cap = new_stream();
    set_capturing(cap, 1);
    sum_on(comm, rank, n, cap, 4096, 1);
    /* a captured group runs host-staged: loom refuses it, with its reason */
    float *a = alloc_dev(64 * 4), *b = alloc_dev(64 * 4);
    CHECK(ncclGroupStart());
    CHECK(ncclSend(a, 64, ncclFloat32, (rank + 1) % n, comm, cap));
    CHECK(ncclRecv(b, 64, ncclFloat32, (rank + n - 1) % n, comm, cap));
    REFUSED(ncclGroupEnd(), ncclInvalidUsage, "cannot be captured into a CUDA graph");
    set_capturing(cap, 0);
    sync_stream(cap);

    /* PreMulSum scales on the host: refused on device buffers */
    float scalar = 2.0f;
    ncclRedOp_t pm;
    CHECK(ncclRedOpCreatePreMulSum(&pm, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
    REFUSED(ncclAllReduce(a, b, 64, ncclFloat32, pm, comm, s), ncclInvalidUsage,
            "PreMulSum op on device buffers");
    CHECK(ncclRedOpDestroy(pm, comm));
    CHECK(ncclMemFree(a));
    CHECK(ncclMemFree(b));

    /* more streams than the library keeps wrappers for, then destroyed and made anew (their
     * addresses may come back) */
    for (int round = 0; round < 2; round++) {
        cudaStream_t many[40];
        for (int i = 0; i < 40; i++)
            many[i] = new_stream();
        for (int i = 0; i < 40; i++)
            sum_on(comm, rank, n, many[i], 257, 1);
        for (int i = 0; i < 40; i++)
            if (cu.stream_destroy((void *)many[i]) != 0)
                die("destroying a stream failed");
    }
    if (cu.stream_destroy((void *)cap) != 0)
        die("destroying a stream failed");

    /* host buffers on a CUDA stream: the stream is synchronized, the call runs at once */
    float hin[16], hout[16];
    for (int i = 0; i < 16; i++)
        hin[i] = (float)(rank + 1);
    CHECK(ncclAllReduce(hin, hout, 16, ncclFloat32, ncclSum, comm, s));
    for (int i = 0; i < 16; i++)
        if (hout[i] != (float)(n * (n + 1) / 2))
            die("host buffers on a CUDA stream: element %d is %g", i, (double)hout[i]);
}

/* ---- one rank ---------------------------------------------------------------------------- */

static void read_all(int fd, void *buf, size_t len)
{
    if (prog_read_all(fd, buf, len) != 0)
        die("pipe read failed");
}

static void write_all(int fd, const void *buf, size_t len)
{
    if (prog_write_all(fd, buf, len) != 0)
        die("pipe write failed");
}

static long fake_count(void *fake, const char *name)
{
    long (*count)(const char *) = NULL;
    *(void **)&count = dlsym(fake, "fakeNcclCallCount");
    if (count == NULL)
        die("the fake NCCL has no fakeNcclCallCount");
    return count(name);
}

/* Route mode: a LOOM_NCCL_ROUTE rule takes a 1 MiB bf16 sum AllReduce on device buffers
 * (loom, or NCCL where a capture needs it), everything else goes to NCCL; the built-in rules
 * keep device buffers on NCCL. */
static void run_route(ncclComm_t comm, int rank, int n, cudaStream_t s, const char *fake_path,
                      int staged_only)
{
    void *fake = dlopen(fake_path, RTLD_NOW | RTLD_NOLOAD);
    if (fake == NULL)
        die("the fake NCCL %s is not loaded: %s", fake_path, dlerror());
    const size_t count = (1u << 20) / 2;
    void *in = NULL, *out = NULL;
    if (cu.mem_alloc(&in, count * 2) != 0 || cu.mem_alloc(&out, count * 2) != 0)
        die("loomMemAlloc failed");
    for (size_t i = 0; i < count; i++)
        ((uint16_t *)in)[i] = to_bf16((float)(rank + 1));
    const uint16_t want = to_bf16((float)(n * (n + 1) / 2));
    for (int capture = 0; capture < 2; capture++) {
        const long before = fake_count(fake, "AllReduce");
        set_capturing(s, capture);
        CHECK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, comm, s));
        set_capturing(s, 0);
        sync_stream(s);
        for (size_t i = 0; i < count; i++)
            if (((uint16_t *)out)[i] != want)
                die("route: bf16 AllReduce element %zu is wrong", i);
        const char *rules = getenv("LOOM_NCCL_ROUTE");
        const int to_nccl = rules == NULL || *rules == '\0' || (capture && staged_only);
        if (fake_count(fake, "AllReduce") != before + to_nccl)
            die("route: the%s bf16 AllReduce went to %s, expected %s", capture ? " captured" : "",
                to_nccl ? "loom" : "NCCL", to_nccl ? "NCCL" : "loom");
    }
    const long before = fake_count(fake, "AllGather");
    float *g_in = NULL, *g_out = NULL;
    if (cu.mem_alloc((void **)&g_in, 64 * 4) != 0 ||
        cu.mem_alloc((void **)&g_out, 64 * 4 * (size_t)n) != 0)
        die("loomMemAlloc failed");
    for (int i = 0; i < 64; i++)
        g_in[i] = (float)rank;
    CHECK(ncclAllGather(g_in, g_out, 64, ncclFloat32, comm, s));
    sync_stream(s);
    for (int i = 0; i < 64 * n; i++)
        if (g_out[i] != (float)(i / 64))
            die("route: AllGather element %d is %g", i, (double)g_out[i]);
    if (fake_count(fake, "AllGather") != before + 1)
        die("route: the AllGather did not go to NCCL");
    cu.mem_free(in);
    cu.mem_free(out);
    cu.mem_free(g_in);
    cu.mem_free(g_out);
}

static int run_rank(const char *mode, int rank, int n, int id_rd, const int *id_wr,
                    const char *fake_nccl)
{
    g_rank = rank;
    ncclUniqueId id;
    if (rank == 0) {
        CHECK(ncclGetUniqueId(&id));
        for (int r = 1; r < n; r++)
            write_all(id_wr[r], &id, sizeof(id));
    } else {
        read_all(id_rd, &id, sizeof(id));
    }
    ncclComm_t comm = NULL;
    CHECK(ncclCommInitRank(&comm, n, id, rank));
    cudaStream_t s = new_stream();
    const int route = strncmp(mode, "route", 5) == 0;
    if (route) {
        run_route(comm, rank, n, s, fake_nccl, strcmp(mode, "route-staged") == 0);
    } else {
        const cudaStream_t streams[2] = {s, NULL};
        for (int i = 0; i < NCASES; i++)
            run_case(&cases[i], i, comm, rank, n, streams, 2);
        check_echo_ran(comm, rank, n, s);
        if (strcmp(mode, "staged") == 0) {
            set_capturing(s, 1);
            float *a = alloc_dev(64 * 4);
            REFUSED(ncclAllReduce(a, a, 64, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage,
                    "host-staged device calls cannot be captured into a CUDA graph");
            set_capturing(s, 0);
            CHECK(ncclMemFree(a));
        } else {
            check_loom_edges(comm, rank, n, s);
        }
        /* ncclCommFinalize flushes what is queued: no synchronize before reading */
        float *in = alloc_dev(100000 * 4), *out = alloc_dev(100000 * 4);
        for (int i = 0; i < 100000; i++)
            in[i] = (float)(rank + i % 7);
        CHECK(ncclAllReduce(in, out, 100000, ncclFloat32, ncclSum, comm, s));
        CHECK(ncclCommFinalize(comm));
        for (int i = 0; i < 100000; i++)
            if (out[i] != (float)(n * (n - 1) / 2 + n * (i % 7)))
                die("after ncclCommFinalize: element %d is %g", i, (double)out[i]);
        CHECK(ncclMemFree(in));
        CHECK(ncclMemFree(out));
    }
    CHECK(ncclCommDestroy(comm));
    sync_stream(s);
    if (cu.stream_destroy((void *)s) != 0)
        die("destroying a stream failed");
    printf("rank %d: %s mode passed\n", rank, mode);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || atoi(argv[2]) < 2 || atoi(argv[2]) > 8) {
        fprintf(stderr, "usage: %s loom|staged|route|route-staged NRANKS FAKE_CUDA [FAKE_NCCL]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    const int n = atoi(argv[2]);
    if (strncmp(mode, "route", 5) == 0 && argc < 5) {
        fprintf(stderr, "%s: route mode needs FAKE_NCCL\n", argv[0]);
        return 2;
    }
    /* The driver is loaded before anything else, as in a CUDA program. */
    load_cuda(argv[3]);
    int id_pipe[8][2];
    for (int r = 0; r < n; r++)
        if (pipe(id_pipe[r]) != 0)
            return 2;
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            return 2;
        if (pids[r] == 0) {
            int wr[8];
            for (int i = 0; i < n; i++)
                wr[i] = id_pipe[i][1];
            _exit(run_rank(mode, r, n, id_pipe[r][0], wr, argc > 4 ? argv[4] : NULL));
        }
    }
    int failed = 0;
    for (int left = n; left > 0; left--) {
        int status = 0;
        const pid_t p = wait(&status);
        if (p < 0)
            return 2;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed = 1;
            /* A rank that failed leaves the others waiting for it: stop them. */
            for (int r = 0; r < n; r++)
                if (pids[r] != p)
                    kill(pids[r], SIGKILL);
        }
    }
    return failed;
}

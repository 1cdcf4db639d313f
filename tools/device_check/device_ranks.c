/* SPDX-License-Identifier: Apache-2.0
 *
 * device_ranks.c - loom's collectives and Echo on device buffers with several
 * ranks sharing GPU 0, for tools/device_check.sh's S2_ranks (docs/gpu.md):
 *
 *   device_ranks --threads N [-c COUNT]   N ranks as threads of this process
 *   loomrun -n N device_ranks [-c COUNT]  one rank per process (CUDA IPC between them)
 *
 * Every rank runs the cases of device_ranks_cases.c: each collective (every op
 * and float32, float16, bfloat16, int32 for AllReduce; in place; past the
 * transports' chunk size) and Echo on loomMemAlloc buffers queued on a CUDA
 * stream wrapped by loomStreamCreateFromCuda, bit for bit equal to the same call
 * on host buffers, and identical on every rank where the ranks share a result.
 * The runtime is the one loom picks (LOOM_DEVICE): on a GPU the program starts
 * CUDA on device 0 itself, as an application does; under LOOM_DEVICE=emulated it
 * runs on the host emulation (CI). Only loom.h and loom_echo.h of libloom are used.
 *
 * Each rank prints one line; rank 0 then "PASS ..." or "FAIL ...". Exit status: 0
 * every case passed on every rank, 1 one failed, 2 bad usage, 77 no device
 * runtime (the reason printed).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ranks.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define EXIT_WRONG  1
#define EXIT_USAGE  2
#define EXIT_NO_DEV 77
#define MAX_THREADS 64

static int g_emulated; /* LOOM_DEVICE=emulated: device memory is host memory */

/* The device every rank uses, for the verdict line. */
static const char *where(void)
{
    return g_emulated ? "the emulated device" : "GPU 0";
}

int dr_copy(const dr_rank_t *r, void *dst, const void *src, size_t n, int to_device, char *why,
            size_t why_len)
{
    if (n == 0)
        return 0;
    if (g_emulated) {
        memcpy(dst, src, n);
        return 0;
    }
#ifdef LOOM_HAVE_CUDA
    cudaStream_t s = (cudaStream_t)r->cuda_stream;
    cudaError_t e = cudaMemcpyAsync(dst, src, n,
                                    to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e == cudaSuccess)
        return 0;
    snprintf(why, why_len, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
#else
    (void)r;
    (void)to_device;
    snprintf(why, why_len, "built without the CUDA runtime: only the emulation's memory copies");
#endif
    return -1;
}

/* Makes GPU 0 current for the calling thread (every rank shares it); "" or why not. */
static void use_gpu0(char *why, size_t len)
{
    why[0] = '\0';
    if (g_emulated)
        return;
#ifdef LOOM_HAVE_CUDA
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess)
        e = cudaFree(NULL); /* the context, so that loom finds the driver loaded */
    if (e != cudaSuccess)
        snprintf(why, len, "CUDA on device 0: %s", cudaGetErrorString(e));
#else
    snprintf(why, len, "built without the CUDA runtime");
#endif
}

/* The rank's stream: a CUDA stream of its own, wrapped by loomStreamCreateFromCuda. Under the
 * emulation, processes wrap its default stream; threads, which share one default stream (as
 * they would share CUDA's legacy one) and must not queue their ranks' waits on it, take loom
 * worker streams. */
static loomResult_t make_stream(dr_rank_t *r, int threads)
{
    r->cuda_stream = NULL;
    if (g_emulated && threads)
        return loomStreamCreate(&r->stream);
#ifdef LOOM_HAVE_CUDA
    if (!g_emulated && cudaStreamCreateWithFlags((cudaStream_t *)&r->cuda_stream,
                                                 cudaStreamNonBlocking) != cudaSuccess)
        return loomUnhandledDeviceError;
#else
    (void)threads;
#endif
    return loomStreamCreateFromCuda(&r->stream, r->cuda_stream);
}

static void drop_stream(dr_rank_t *r)
{
    if (r->stream)
        loomStreamDestroy(r->stream);
#ifdef LOOM_HAVE_CUDA
    if (r->cuda_stream)
        cudaStreamDestroy((cudaStream_t)r->cuda_stream);
#endif
    r->stream = NULL;
    r->cuda_stream = NULL;
}

/* One rank on comm: its stream, the cases, its line. 0 when all passed, 1 when a result was
 * wrong, -1 when a call failed and the communicator was aborted (so that the other ranks' next
 * call fails rather than waits). */
static int run_rank(dr_rank_t *r, size_t count, const char *mode)
{
    int rc = 0;
    loomResult_t res = make_stream(r, strcmp(mode, "threads") == 0);
    if (res != loomSuccess) {
        snprintf(r->first, sizeof(r->first), "the rank's stream: %s (%s)", loomGetErrorString(res),
                 loomGetLastError(r->comm));
        r->failed++;
        rc = -1;
    } else if (dr_run_cases(r, count) != 0) {
        rc = -1;
    }
    if (rc != 0)
        loomCommAbort(r->comm);
    drop_stream(r);
    printf("device_ranks: rank %d of %d (%s): %d cases, %d failed%s%s\n", r->rank, r->nranks, mode,
           r->cases, r->failed, r->failed ? ": first " : "", r->failed ? r->first : "");
    fflush(stdout);
    return rc != 0 ? rc : r->failed ? 1 : 0;
}

// ---- Ranks as threads ----------------------------------------------------------------

typedef struct {
    dr_rank_t r;
    loomUniqueId id;
    size_t count;
    int rc;
} thread_arg_t;

static void *thread_main(void *p)
{
    thread_arg_t *a = p;
    char why[160];
    use_gpu0(why, sizeof(why)); /* each thread's current device */
    loomResult_t res = loomCommInitRank(&a->r.comm, a->r.nranks, a->id, a->r.rank);
    if (res != loomSuccess) {
        snprintf(a->r.first, sizeof(a->r.first), "loomCommInitRank: %s (%s)",
                 loomGetErrorString(res), loomGetLastError(NULL));
        a->r.failed++;
        a->rc = -1;
        return NULL;
    }
    a->rc = run_rank(&a->r, a->count, "threads");
    loomCommDestroy(a->r.comm);
    return NULL;
}

static int run_threads(int n, size_t count)
{
    thread_arg_t *args = calloc((size_t)n, sizeof(*args));
    pthread_t *tids = calloc((size_t)n, sizeof(*tids));
    loomUniqueId id;
    if (!args || !tids || loomGetUniqueId(&id) != loomSuccess) {
        fprintf(stderr, "device_ranks: cannot set %d ranks up\n", n);
        return EXIT_WRONG;
    }
    for (int i = 0; i < n; i++) {
        args[i] = (thread_arg_t){.r = {.rank = i, .nranks = n}, .id = id, .count = count};
        if (pthread_create(&tids[i], NULL, thread_main, &args[i]) != 0) {
            fprintf(stderr, "device_ranks: cannot start thread %d\n", i);
            return EXIT_WRONG; /* the started ones are blocked in init: exiting ends them */
        }
    }
    int failed = 0, cases = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(tids[i], NULL);
        failed += args[i].r.failed;
        cases += args[i].r.cases;
        if (args[i].rc != 0 && args[i].r.cases == 0)
            printf("device_ranks: rank %d of %d (threads): %s\n", i, n, args[i].r.first);
    }
    if (failed)
        printf("FAIL %d ranks as threads on %s: %d of %d cases failed; first: %s\n", n, where(),
               failed, cases + failed, args[0].r.failed ? args[0].r.first : "see the ranks' lines");
    else
        printf("PASS %d ranks as threads on %s: %d cases on device buffers equal to host "
               "buffers and across ranks\n",
               n, where(), cases);
    free(args);
    free(tids);
    return failed ? EXIT_WRONG : 0;
}

// ---- One rank per process -----------------------------------------------------------------

static int run_process(size_t count)
{
    dr_rank_t r = {0};
    loomResult_t res = loomCommInitFromEnv(&r.comm);
    if (res != loomSuccess) {
        fprintf(stderr,
                "device_ranks: loomCommInitFromEnv: %s (%s)\nHINT: start it with loomrun "
                "-n N, or use --threads N\n",
                loomGetErrorString(res), loomGetLastError(NULL));
        return EXIT_WRONG;
    }
    loomCommUserRank(r.comm, &r.rank);
    loomCommCount(r.comm, &r.nranks);
    const int rc = run_rank(&r, count, "processes");
    /* Every rank learns how many cases failed anywhere (not after an abort: a peer's failed
     * call, and this one, say enough). */
    int64_t t[2] = {r.cases, r.failed};
    if (rc >= 0 && loomAllReduce(t, t, 2, loomInt64, loomSum, r.comm, NULL) != loomSuccess)
        t[1] += 1;
    if (r.rank == 0 && t[1] == 0)
        printf("PASS %d ranks as processes on %s: %lld cases on device buffers equal to host "
               "buffers and across ranks\n",
               r.nranks, where(), (long long)t[0]);
    else if (r.rank == 0 || r.failed)
        printf("FAIL %d ranks as processes on %s: %lld case(s) failed%s%s\n", r.nranks, where(),
               (long long)t[1], r.failed ? "; first: " : "", r.failed ? r.first : "");
    loomCommDestroy(r.comm);
    return t[1] ? EXIT_WRONG : 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: device_ranks [--threads N] [-c COUNT]\n"
               "  --threads N  N ranks as threads of this process (else one rank of loomrun's "
               "job)\n"
               "  -c COUNT     elements per rank and call (default 1001; the large cases take "
               "COUNT * 9216 + 3)\n");
}

int main(int argc, char **argv)
{
    int threads = 0;
    size_t count = 1001;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = (int)strtol(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > MAX_THREADS) {
                fprintf(stderr, "device_ranks: --threads takes 1 to %d\n", MAX_THREADS);
                return EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            count = (size_t)strtoull(argv[++i], &end, 10);
            if (*end || count == 0 || count > (1u << 24)) {
                fprintf(stderr, "device_ranks: -c takes 1 to %u\n", 1u << 24);
                return EXIT_USAGE;
            }
        } else {
            usage(strcmp(argv[i], "-h") == 0 ? stdout : stderr);
            return strcmp(argv[i], "-h") == 0 ? 0 : EXIT_USAGE;
        }
    }
    setlinebuf(stdout);
    const char *dev = getenv("LOOM_DEVICE");
    g_emulated = dev != NULL && strcmp(dev, "emulated") == 0;
    /* CUDA first, before any communicator: loom takes it only where the process uses it. */
    char why[160];
    use_gpu0(why, sizeof(why));
    void *probe = NULL;
    if (loomMemAlloc(&probe, 4) != loomSuccess) {
        /* CUDA's own reason first: loom's then only says the driver is not loaded */
        const int off = dev != NULL && strcmp(dev, "none") == 0;
        printf("device_ranks: no device runtime: %s\n",
               why[0] && !off ? why : loomGetLastError(NULL));
        return EXIT_NO_DEV;
    }
    loomMemFree(probe);
    return threads ? run_threads(threads, count) : run_process(count);
}

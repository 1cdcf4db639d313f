/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_device_smoke.c - one rank of NCCL on GPU 0 through the libnccl.so.2 named on the command
 * line (loom's drop-in library in forward mode, or the real one): AllReduce (out of place and in
 * place), Broadcast, AllGather and ReduceScatter on device buffers, every element checked, then
 * one AllReduce captured in a CUDA graph and replayed 10 times, each time on new input. The
 * library is opened with dlopen so that one binary runs against either; the function types come
 * from nccl.h. tools/device_check.sh runs it (stage S4_shim_c, docs/nccl-plugins.md).
 *
 *   nccl_device_smoke LIBRARY   the checks; exit 0 all correct, 1 a failed call or wrong value,
 *                               77 no CUDA device
 *   nccl_device_smoke --probe   prints the nccl.h version it was built with and touches neither
 *                               CUDA nor NCCL (does this binary run here at all?)
 * Bad usage exits 2.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_WRONG    1
#define EXIT_USAGE    2
#define EXIT_NO_GPU   77
#define GRAPH_REPLAYS 10

/* The NCCL functions used, each typed by its declaration in nccl.h. */
#define NCCL_FUNCS(X)                                                                              \
    X(ncclGetVersion)                                                                              \
    X(ncclGetErrorString)                                                                          \
    X(ncclGetUniqueId)                                                                             \
    X(ncclCommInitRank)                                                                            \
    X(ncclCommDestroy)                                                                             \
    X(ncclAllReduce)                                                                               \
    X(ncclBroadcast)                                                                               \
    X(ncclAllGather)                                                                               \
    X(ncclReduceScatter)

static struct {
#define FIELD(f) __typeof__(f) *f;
    NCCL_FUNCS(FIELD)
#undef FIELD
} nccl;

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FAIL line %d: %s: %s\n", __LINE__, #call, cudaGetErrorString(e_));    \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

#define NCCL_OK(call)                                                                              \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "FAIL line %d: %s: %d (%s)\n", __LINE__, #call, (int)r_,               \
                    nccl.ncclGetErrorString(r_));                                                  \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int load(const char *path)
{
    /* RTLD_GLOBAL, as when the library satisfies a program's NEEDED libnccl.so.2 */
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "FAIL cannot open %s: %s\n", path, dlerror());
        return -1;
    }
#define SYM(f)                                                                                     \
    if (!(nccl.f = (__typeof__(nccl.f))dlsym(lib, #f))) {                                          \
        fprintf(stderr, "FAIL %s does not export %s\n", path, #f);                                 \
        return -1;                                                                                 \
    }
    NCCL_FUNCS(SYM)
#undef SYM
    return 0;
}

/* The element of a buffer the checks write: distinct, exactly representable floats, shifted by
 * salt so that every replay of the graph has other input. */
static float value(size_t i, int salt)
{
    return (float)(i % 1000003) * 0.5f - 1000.0f + (float)salt * 4096.0f;
}

static int expect_equal(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fprintf(stderr, "FAIL %s: element %zu of %zu is %.9g, want %.9g\n", what, i, n,
                    (double)got[i], (double)want[i]);
            return -1;
        }
    printf("ok %s (%zu floats)\n", what, n);
    return 0;
}

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    size_t n;
    float *dsend, *drecv; /* device, n floats each */
    float *hin, *hout;    /* host */
} ctx_t;

/* Fills the device input with value(i, salt), poisons the output, runs op, reads the output. */
typedef int (*op_fn)(ctx_t *c, float *out);

static int run(ctx_t *c, const char *what, int salt, op_fn op)
{
    for (size_t i = 0; i < c->n; i++)
        c->hin[i] = value(i, salt);
    CUDA_OK(cudaMemcpy(c->dsend, c->hin, c->n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(c->drecv, 0xff, c->n * sizeof(float))); /* NaN everywhere */
    float *out = c->drecv;
    if (op(c, out))
        return -1;
    CUDA_OK(cudaStreamSynchronize(c->stream));
    CUDA_OK(cudaMemcpy(c->hout, out, c->n * sizeof(float), cudaMemcpyDeviceToHost));
    return expect_equal(what, c->hout, c->hin, c->n);
}

/* With one rank every collective hands the input back unchanged. */
static int op_allreduce(ctx_t *c, float *out)
{
    NCCL_OK(nccl.ncclAllReduce(c->dsend, out, c->n, ncclFloat, ncclSum, c->comm, c->stream));
    return 0;
}

static int op_allreduce_inplace(ctx_t *c, float *out)
{
    CUDA_OK(
        cudaMemcpyAsync(out, c->dsend, c->n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    NCCL_OK(nccl.ncclAllReduce(out, out, c->n, ncclFloat, ncclMax, c->comm, c->stream));
    return 0;
}

static int op_broadcast(ctx_t *c, float *out)
{
    NCCL_OK(nccl.ncclBroadcast(c->dsend, out, c->n, ncclFloat, 0, c->comm, c->stream));
    return 0;
}

static int op_allgather(ctx_t *c, float *out)
{
    NCCL_OK(nccl.ncclAllGather(c->dsend, out, c->n, ncclFloat, c->comm, c->stream));
    return 0;
}

static int op_reducescatter(ctx_t *c, float *out)
{
    NCCL_OK(nccl.ncclReduceScatter(c->dsend, out, c->n, ncclFloat, ncclSum, c->comm, c->stream));
    return 0;
}

/* One AllReduce captured into a graph, replayed on new input each time. */
static int graph_replays(ctx_t *c)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    size_t nodes = 0;
    CUDA_OK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    ncclResult_t r =
        nccl.ncclAllReduce(c->dsend, c->drecv, c->n, ncclFloat, ncclSum, c->comm, c->stream);
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    NCCL_OK(r);
    CUDA_OK(e);
    CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
    if (nodes == 0) {
        fprintf(stderr, "FAIL the captured AllReduce left an empty graph\n");
        cudaGraphDestroy(graph);
        return -1;
    }
    CUDA_OK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    for (int rep = 0; rep < GRAPH_REPLAYS; rep++) {
        for (size_t i = 0; i < c->n; i++)
            c->hin[i] = value(i, 100 + rep);
        CUDA_OK(cudaMemcpyAsync(c->dsend, c->hin, c->n * sizeof(float), cudaMemcpyHostToDevice,
                                c->stream));
        CUDA_OK(cudaMemsetAsync(c->drecv, 0xff, c->n * sizeof(float), c->stream));
        CUDA_OK(cudaGraphLaunch(exec, c->stream));
        CUDA_OK(cudaMemcpyAsync(c->hout, c->drecv, c->n * sizeof(float), cudaMemcpyDeviceToHost,
                                c->stream));
        CUDA_OK(cudaStreamSynchronize(c->stream));
        char what[64];
        snprintf(what, sizeof(what), "graph replay %d of %d", rep + 1, GRAPH_REPLAYS);
        if (expect_equal(what, c->hout, c->hin, c->n))
            return -1;
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    printf("ok graph of %zu nodes replayed %d times\n", nodes, GRAPH_REPLAYS);
    return 0;
}

static int checks(ctx_t *c)
{
    static const struct {
        const char *name;
        op_fn op;
    } ops[] = {
        {"AllReduce sum", op_allreduce},     {"AllReduce max in place", op_allreduce_inplace},
        {"Broadcast", op_broadcast},         {"AllGather", op_allgather},
        {"ReduceScatter", op_reducescatter},
    };
    /* an odd count (not a multiple of any vector width) and a tiny one */
    const size_t counts[] = {(size_t)1 << 20 | 3, 7};
    const size_t full = c->n;
    for (size_t k = 0; k < sizeof(counts) / sizeof(*counts); k++) {
        c->n = counts[k];
        for (size_t i = 0; i < sizeof(ops) / sizeof(*ops); i++)
            if (run(c, ops[i].name, (int)(k * 10 + i), ops[i].op))
                return -1;
    }
    c->n = full;
    return graph_replays(c);
}

int main(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: nccl_device_smoke LIBRARY | --probe\n");
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--probe")) {
        printf("nccl_device_smoke: built with nccl.h %d.%d.%d\n", NCCL_MAJOR, NCCL_MINOR,
               NCCL_PATCH);
        return 0;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        fprintf(stderr, "no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0");
        return EXIT_NO_GPU;
    }
    if (load(argv[1]))
        return EXIT_WRONG;
    int version = 0;
    if (nccl.ncclGetVersion(&version) != ncclSuccess) {
        fprintf(stderr, "FAIL ncclGetVersion\n");
        return EXIT_WRONG;
    }
    printf("library %s, ncclGetVersion %d\n", argv[1], version);

    ctx_t c = {.n = (size_t)1 << 20 | 3};
    ncclUniqueId id;
    int rc = EXIT_WRONG;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&c.stream) != cudaSuccess ||
        cudaMalloc((void **)&c.dsend, c.n * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&c.drecv, c.n * sizeof(float)) != cudaSuccess ||
        !(c.hin = malloc(c.n * sizeof(float))) || !(c.hout = malloc(c.n * sizeof(float)))) {
        fprintf(stderr, "FAIL cannot set up device 0 and %zu-float buffers: %s\n", c.n,
                cudaGetErrorString(cudaGetLastError()));
        return EXIT_WRONG;
    }
    ncclResult_t r = nccl.ncclGetUniqueId(&id);
    if (r == ncclSuccess)
        r = nccl.ncclCommInitRank(&c.comm, 1, id, 0);
    if (r != ncclSuccess) {
        fprintf(stderr, "FAIL one-rank communicator: %d (%s)\n", (int)r,
                nccl.ncclGetErrorString(r));
        return EXIT_WRONG;
    }
    if (checks(&c) == 0)
        rc = 0;
    if (nccl.ncclCommDestroy(c.comm) != ncclSuccess) {
        fprintf(stderr, "FAIL ncclCommDestroy\n");
        rc = EXIT_WRONG;
    }
    cudaFree(c.dsend);
    cudaFree(c.drecv);
    cudaStreamDestroy(c.stream);
    free(c.hin);
    free(c.hout);
    if (rc == 0)
        printf("PASS %s\n", argv[1]);
    return rc;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * gpu_kernels_perf.c - speed of the device kernels (dev_kernels.h) on the
 * first GPU against the copy bandwidth measured in the same run: for each
 * array size, the copy ceiling (cudaMemcpyAsync device to device, and the
 * kernels' own 16-byte copy kernel, loom_dk_cast to the same type), then
 * reduce of 2, 4 and 8 inputs (float32, bfloat16; sum), q4 encode (with and
 * without the residual), decode, decode_acc and the float32 <-> bfloat16
 * casts. Each row: the median of >= 20 launches timed with CUDA events after
 * a warm-up, GB/s = (bytes read + bytes written) / time, and that as % of the
 * size's ceiling (the better of the two copies). The size is the bytes of one
 * input array of values (sources, and dst, have that size; the codec's
 * stream is 9/64 of the float32 bytes). -J writes the rows as JSON.
 *
 * Without a usable GPU it prints why and exits 0 (or the -x status, which
 * the meson benchmark sets to 77 so it reports a skip) having timed nothing.
 * Like kernels_perf it reads library internals and links them statically.
 * It does not check results: tests/device does, bit for bit.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "dev_elem.h"
#include "dev_kernels.h"
#include "dtype.h"

#define MAX_SIZES 16
#define MAX_ITERS 1000

struct options {
    size_t sizes[MAX_SIZES];
    int nsizes;
    int iters, warmup;
    const char *json;
    int no_gpu_status;
};

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: gpu_kernels_perf [-s sizes] [-n iters] [-w warmup] [-J file] [-q] [-x status] "
        "[-h]\n"
        "  -s  comma list of array sizes in bytes, K/M/G suffix (default 1M,4M,16M,64M,256M,1G)\n"
        "  -n  timed launches per row, the median reported (default 20, at least 20)\n"
        "  -w  warm-up launches per row (default 3)\n"
        "  -J  write the rows to this JSON file\n"
        "  -q  quick: 1M and 64M\n"
        "  -x  exit status when there is no usable GPU (default 0)\n");
}

static _Noreturn void die(const char *what)
{
    fprintf(stderr, "gpu_kernels_perf: %s\n", what);
    exit(2);
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    size_t mul = *end == 'K' ? 1u << 10 : *end == 'M' ? 1u << 20 : *end == 'G' ? 1u << 30 : 1;
    if (end == s || (mul > 1 && end[1] != '\0') || (mul == 1 && *end != '\0') || v == 0)
        die("sizes are numbers of bytes with an optional K, M or G suffix, e.g. 64M");
    return (size_t)v * mul;
}

static void parse(int argc, char **argv, struct options *o)
{
    static const size_t defaults[] = {1u << 20,  4u << 20,   16u << 20,
                                      64u << 20, 256u << 20, 1u << 30};
    memset(o, 0, sizeof(*o));
    o->iters = 20;
    o->warmup = 3;
    int opt;
    while ((opt = getopt(argc, argv, "s:n:w:J:qx:h")) != -1) {
        switch (opt) {
        case 's':
            for (char *t = strtok(optarg, ","); t != NULL; t = strtok(NULL, ","))
                if (o->nsizes < MAX_SIZES)
                    o->sizes[o->nsizes++] = parse_size(t);
            break;
        case 'n':
            o->iters = atoi(optarg);
            if (o->iters < 20 || o->iters > MAX_ITERS)
                die("-n: between 20 and 1000 timed launches");
            break;
        case 'w':
            o->warmup = atoi(optarg);
            if (o->warmup < 1)
                die("-w: at least one warm-up launch");
            break;
        case 'J':
            o->json = optarg;
            break;
        case 'q':
            o->sizes[0] = 1u << 20;
            o->sizes[1] = 64u << 20;
            o->nsizes = 2;
            break;
        case 'x':
            o->no_gpu_status = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (o->nsizes == 0) {
        memcpy(o->sizes, defaults, sizeof(defaults));
        o->nsizes = (int)(sizeof(defaults) / sizeof(defaults[0]));
    }
}

/* ---- One row: a launch timed with events, median of iters --------------------- */

enum kind { K_MEMCPY, K_COPY, K_REDUCE, K_ENCODE, K_ENCODE_RES, K_DECODE, K_DECODE_ACC, K_CAST };

struct row {
    enum kind kind;
    const char *name;
    loomDataType_t dt, dt2; /* dt2: the cast's destination */
    int nsrc;
};

struct bufs {
    void *src[8], *dst, *codes;
    float *err;
};

static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

static int launch(const struct row *r, struct bufs *b, size_t bytes)
{
    const size_t n = bytes / loom_dtype_size(r->dt);
    switch (r->kind) {
    case K_MEMCPY:
        return (int)cudaMemcpyAsync(b->dst, b->src[0], bytes, cudaMemcpyDeviceToDevice, stream);
    case K_COPY:
        return loom_dk_cast(stream, b->dst, r->dt, b->src[0], r->dt, n);
    case K_REDUCE:
        return loom_dk_reduce(stream, r->dt, loomSum, b->dst, (const void *const *)b->src, r->nsrc,
                              n, r->nsrc);
    case K_ENCODE:
        return loom_dk_q4_encode(stream, b->src[0], r->dt, NULL, NULL, n, b->codes);
    case K_ENCODE_RES:
        return loom_dk_q4_encode(stream, b->src[0], r->dt, b->err, b->err, n, b->codes);
    case K_DECODE:
        return loom_dk_q4_decode(stream, b->codes, n, b->dst, r->dt);
    case K_DECODE_ACC:
        return loom_dk_q4_decode_acc(stream, b->codes, n, (float *)b->dst);
    default:
        return loom_dk_cast(stream, b->dst, r->dt2, b->src[0], r->dt, n);
    }
}

/* Bytes read + written by one launch. */
static double moved(const struct row *r, size_t bytes)
{
    const size_t n = bytes / loom_dtype_size(r->dt);
    const double q = (double)loom_de_q4_bytes(n), v = (double)bytes;
    switch (r->kind) {
    case K_MEMCPY:
    case K_COPY:
        return 2 * v;
    case K_REDUCE:
        return (r->nsrc + 1) * v;
    case K_ENCODE:
        return v + q;
    case K_ENCODE_RES:
        return v + q + 8.0 * n; /* residual read and written */
    case K_DECODE:
        return q + v;
    case K_DECODE_ACC:
        return q + 2 * v;
    default:
        return v + (double)n * loom_dtype_size(r->dt2);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "gpu_kernels_perf: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* Median microseconds of one launch. */
static double time_row(const struct row *r, struct bufs *b, size_t bytes, const struct options *o)
{
    double us[MAX_ITERS];
    for (int i = 0; i < o->warmup; i++)
        check((cudaError_t)launch(r, b, bytes), r->name);
    check(cudaStreamSynchronize(stream), r->name);
    for (int i = 0; i < o->iters; i++) {
        float ms = 0;
        check(cudaEventRecord(ev0, stream), "cudaEventRecord");
        check((cudaError_t)launch(r, b, bytes), r->name);
        check(cudaEventRecord(ev1, stream), "cudaEventRecord");
        check(cudaEventSynchronize(ev1), r->name);
        check(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime");
        us[i] = 1000.0 * ms;
    }
    qsort(us, (size_t)o->iters, sizeof(us[0]), cmp_double);
    return o->iters % 2 ? us[o->iters / 2] : 0.5 * (us[o->iters / 2 - 1] + us[o->iters / 2]);
}

static const struct row rows[] = {
    {K_MEMCPY, "memcpy_d2d", loomFloat32, loomFloat32, 1},
    {K_COPY, "copy_kernel", loomFloat32, loomFloat32, 1},
    {K_REDUCE, "reduce", loomFloat32, loomFloat32, 2},
    {K_REDUCE, "reduce", loomFloat32, loomFloat32, 4},
    {K_REDUCE, "reduce", loomFloat32, loomFloat32, 8},
    {K_REDUCE, "reduce", loomBfloat16, loomBfloat16, 2},
    {K_REDUCE, "reduce", loomBfloat16, loomBfloat16, 4},
    {K_REDUCE, "reduce", loomBfloat16, loomBfloat16, 8},
    {K_ENCODE, "q4_encode", loomFloat32, loomFloat32, 1},
    {K_ENCODE_RES, "q4_encode+res", loomFloat32, loomFloat32, 1},
    {K_ENCODE, "q4_encode", loomBfloat16, loomBfloat16, 1},
    {K_DECODE, "q4_decode", loomFloat32, loomFloat32, 1},
    {K_DECODE, "q4_decode", loomBfloat16, loomBfloat16, 1},
    {K_DECODE_ACC, "q4_decode_acc", loomFloat32, loomFloat32, 1},
    {K_CAST, "cast", loomFloat32, loomBfloat16, 1},
    {K_CAST, "cast", loomBfloat16, loomFloat32, 1},
};

int main(int argc, char **argv)
{
    struct options o;
    parse(argc, argv, &o);
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("gpu_kernels_perf: no usable CUDA device (cudaGetDeviceCount: %s); nothing "
               "measured\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return o.no_gpu_status;
    }
    struct cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
    check(cudaEventCreate(&ev0), "cudaEventCreate");
    check(cudaEventCreate(&ev1), "cudaEventCreate");
    check((cudaError_t)loom_dk_preload(stream), "loom_dk_preload");

    FILE *json = NULL;
    if (o.json != NULL && (json = fopen(o.json, "w")) == NULL)
        die("cannot write the -J file");
    if (json != NULL) {
        fprintf(json, "{\"program\": \"gpu_kernels_perf\", \"device\": ");
        bench_json_str(json, prop.name);
        fprintf(json, ", \"date\": ");
        bench_json_now(json);
        fprintf(json, ", \"iters\": %d, \"rows\": [", o.iters);
    }
    printf("# gpu_kernels_perf on %s: GB/s = (bytes read + written) / median of %d launches "
           "(CUDA events)\n# %% ceiling: against the better of memcpy_d2d and copy_kernel at the "
           "same size, this run\n",
           prop.name, o.iters);
    printf("# %-14s %-15s %4s %12s %11s %9s %9s\n", "kernel", "type", "nsrc", "bytes", "time_us",
           "GB/s", "%ceiling");
    int first = 1;
    for (int s = 0; s < o.nsizes; s++) {
        const size_t bytes = o.sizes[s];
        /* Eight sources, dst, residuals (2x the bfloat16 bytes at most) and codes. */
        size_t need = 11 * bytes + loom_de_q4_bytes(bytes / 2), free_b = 0, total_b = 0;
        check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        if (need + (256u << 20) > free_b) {
            printf("# %zu bytes: needs %zu MiB, %zu MiB free: skipped\n", bytes, need >> 20,
                   free_b >> 20);
            continue;
        }
        struct bufs b;
        for (int k = 0; k < 8; k++) {
            check(cudaMalloc(&b.src[k], bytes), "cudaMalloc");
            check(cudaMemset(b.src[k], 0x3c, bytes), "cudaMemset"); /* ordinary values */
        }
        check(cudaMalloc(&b.dst, 2 * bytes), "cudaMalloc");
        check(cudaMalloc((void **)&b.err, 2 * bytes), "cudaMalloc");
        check(cudaMalloc(&b.codes, loom_de_q4_bytes(bytes / 2)), "cudaMalloc");
        check(cudaMemset(b.dst, 0, 2 * bytes), "cudaMemset");
        check(cudaMemset(b.err, 0, 2 * bytes), "cudaMemset");
        check((cudaError_t)loom_dk_q4_encode(stream, b.src[0], loomBfloat16, NULL, NULL, bytes / 2,
                                             b.codes),
              "encode");
        double ceiling = 0;
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
            const struct row *r = &rows[i];
            double us = time_row(r, &b, bytes, &o);
            double gbps = moved(r, bytes) / (us * 1e3);
            if (r->kind == K_MEMCPY || r->kind == K_COPY)
                ceiling = gbps > ceiling ? gbps : ceiling;
            char type[32];
            snprintf(type, sizeof(type), "%s%s%s", loom_dtype_name(r->dt),
                     r->kind == K_CAST ? ">" : "",
                     r->kind == K_CAST ? loom_dtype_name(r->dt2) : "");
            printf("  %-14s %-15s %4d %12zu %11.1f %9.1f %8.1f%%\n", r->name, type, r->nsrc, bytes,
                   us, gbps, 100.0 * gbps / ceiling);
            if (json != NULL) {
                fprintf(json, "%s\n  {\"kernel\": ", first ? "" : ",");
                bench_json_str(json, r->name);
                fprintf(json, ", \"type\": ");
                bench_json_str(json, type);
                fprintf(json, ", \"nsrc\": %d, \"bytes\": %zu, \"moved_bytes\": ", r->nsrc, bytes);
                bench_json_double(json, moved(r, bytes));
                fprintf(json, ", \"time_us\": ");
                bench_json_double(json, us);
                fprintf(json, ", \"gbps\": ");
                bench_json_double(json, gbps);
                fprintf(json, ", \"ceiling_gbps\": ");
                bench_json_double(json, ceiling);
                fprintf(json, ", \"pct_of_ceiling\": ");
                bench_json_double(json, 100.0 * gbps / ceiling);
                fputc('}', json);
                first = 0;
            }
        }
        for (int k = 0; k < 8; k++)
            cudaFree(b.src[k]);
        cudaFree(b.dst);
        cudaFree(b.err);
        cudaFree(b.codes);
    }
    if (json != NULL) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    return 0;
}

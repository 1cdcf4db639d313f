/* SPDX-License-Identifier: Apache-2.0
 *
 * copy_bw.c - the bandwidth of copies between pinned host memory and GPU 0, in
 * both directions, for tools/device_check.sh's S3_timings: the host-staged
 * transport's cost model (docs/gpu.md) is N / B_d2h + the host collective +
 * N / B_h2d, and these are B_d2h and B_h2d as measured, not assumed.
 *
 *   copy_bw [-s BYTES] [-n ITERS]
 *
 * Prints "h2d_gbps X" and "d2h_gbps Y": bytes / median time of ITERS copies
 * (default 20) of BYTES (default 64 MiB, K/M/G suffixes), timed with CUDA
 * events after a warm-up. Exit status: 0, 1 a CUDA call failed, 2 bad usage,
 * 77 no CUDA device (the reason printed).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITERS 1000

static int failed(const char *what, cudaError_t e)
{
    printf("copy_bw: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of iters copies of n bytes (after 2 untimed ones); -1 on failure. */
static float time_copies(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, int iters,
                         cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1)
{
    float ms[MAX_ITERS];
    for (int i = -2; i < iters; i++) {
        if (cudaEventRecord(e0, s) != cudaSuccess ||
            cudaMemcpyAsync(dst, src, n, kind, s) != cudaSuccess ||
            cudaEventRecord(e1, s) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess)
            return -1;
        if (i >= 0 && cudaEventElapsedTime(&ms[i], e0, e1) != cudaSuccess)
            return -1;
    }
    qsort(ms, (size_t)iters, sizeof(ms[0]), cmp_float);
    return iters % 2 ? ms[iters / 2] : 0.5f * (ms[iters / 2 - 1] + ms[iters / 2]);
}

int main(int argc, char **argv)
{
    size_t bytes = 64u << 20;
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            unsigned long long v = strtoull(argv[++i], &end, 10);
            size_t mul = *end == 'K'   ? 1u << 10
                         : *end == 'M' ? 1u << 20
                         : *end == 'G' ? 1u << 30
                                       : 1;
            if (end == argv[i] || v == 0 || (mul > 1 ? end[1] != '\0' : *end != '\0')) {
                fprintf(stderr, "copy_bw: -s takes bytes with an optional K, M or G suffix\n");
                return 2;
            }
            bytes = (size_t)v * mul;
        } else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            iters = (int)strtol(argv[++i], &end, 10);
            if (*end || iters < 1 || iters > MAX_ITERS) {
                fprintf(stderr, "copy_bw: -n takes 1 to %d\n", MAX_ITERS);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: copy_bw [-s BYTES] [-n ITERS]\n");
            return 2;
        }
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("copy_bw: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0");
        return 77;
    }
    void *host = NULL, *dev = NULL;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    if ((e = cudaSetDevice(0)) != cudaSuccess)
        return failed("cudaSetDevice", e);
    if ((e = cudaMallocHost(&host, bytes)) != cudaSuccess)
        return failed("cudaMallocHost", e);
    if ((e = cudaMalloc(&dev, bytes)) != cudaSuccess)
        return failed("cudaMalloc", e);
    memset(host, 0x3c, bytes);
    if ((e = cudaStreamCreate(&s)) != cudaSuccess || (e = cudaEventCreate(&e0)) != cudaSuccess ||
        (e = cudaEventCreate(&e1)) != cudaSuccess)
        return failed("stream and events", e);
    float h2d = time_copies(dev, host, bytes, cudaMemcpyHostToDevice, iters, s, e0, e1);
    float d2h = time_copies(host, dev, bytes, cudaMemcpyDeviceToHost, iters, s, e0, e1);
    if (h2d <= 0 || d2h <= 0)
        return failed("timed copies", cudaGetLastError());
    printf("h2d_gbps %.2f\nd2h_gbps %.2f\n", (double)bytes / (h2d * 1e6),
           (double)bytes / (d2h * 1e6));
    cudaFreeHost(host);
    cudaFree(dev);
    return 0;
}

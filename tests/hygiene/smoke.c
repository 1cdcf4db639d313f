/* SPDX-License-Identifier: Apache-2.0
 *
 * smoke.c - a small C program that touches each kind of library resource once, for memory
 * checkers: the world communicator from the launcher's environment, a stream (worker thread), a
 * group of Send/Recv, an AllToAllv, an AllGatherV and a ReduceScatterV queued on a stream whose
 * count arrays are freed before they run (the library's copies), one split destroyed and one
 * aborted. Every result is
 * checked; exit 0 on success. Coverage is the coll suite's job, not this one's. Run as
 * `loomrun -n 2 [valgrind ...] loom_smoke`: by meson's 'hygiene' suite, under valgrind by .ci/run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        loomResult_t r_ = (call);                                                                  \
        if (r_ != loomSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                     \
                    loomGetErrorString(r_), loomGetLastError(NULL));                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { N = 4096 };

static void stream_allreduce(loomComm_t comm, int rank, int n)
{
    static float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)(rank + i % 7);
    loomStream_t s;
    CHECK(loomStreamCreate(&s));
    CHECK(loomAllReduce(in, out, N, loomFloat32, loomSum, comm, s));
    CHECK(loomStreamSynchronize(s));
    CHECK(loomStreamDestroy(s));
    for (int i = 0; i < N; i++)
        EXPECT(out[i] == (float)(n * (n - 1) / 2 + n * (i % 7)));
}

static void group_ring(loomComm_t comm, int rank, int n)
{
    int64_t out[N], in[N];
    for (int i = 0; i < N; i++)
        out[i] = (int64_t)rank * 1000000 + i;
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    CHECK(loomGroupStart());
    CHECK(loomRecv(in, N, loomInt64, left, comm, NULL));
    CHECK(loomSend(out, N, loomInt64, right, comm, NULL));
    CHECK(loomGroupEnd());
    for (int i = 0; i < N; i++)
        EXPECT(in[i] == (int64_t)left * 1000000 + i);
}

/* Rank a sends a + 2b + 1 bytes to rank b, each byte (a * 16 + b). */
static void alltoallv(loomComm_t comm, int rank, int n)
{
    size_t *v = calloc(4 * (size_t)n, sizeof(size_t));
    EXPECT(v != NULL);
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n, st = 0, rt = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(rank + 2 * p + 1);
        sd[p] = st;
        st += sc[p];
        rc[p] = (size_t)(p + 2 * rank + 1);
        rd[p] = rt;
        rt += rc[p];
    }
    unsigned char *send = malloc(st), *recv = malloc(rt);
    EXPECT(send != NULL && recv != NULL);
    for (int p = 0; p < n; p++)
        memset(send + sd[p], rank * 16 + p, sc[p]);
    CHECK(loomAllToAllv(send, sc, sd, recv, rc, rd, loomUint8, comm, NULL));
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < rc[p]; i++)
            EXPECT(recv[rd[p] + i] == (unsigned char)(p * 16 + rank));
    free(send);
    free(recv);
    free(v);
}

/* Rank r's block r + 1 elements; the caller's counts freed while the calls are queued. */
static void stream_v(loomComm_t comm, int rank, int n)
{
    size_t *v = malloc(2 * (size_t)n * sizeof(size_t)), total = 0;
    EXPECT(v != NULL);
    for (int p = 0; p < n; p++) {
        v[p] = (size_t)p + 1;
        v[n + p] = total;
        total += v[p];
    }
    const size_t mine = v[rank], at = v[n + rank];
    float *all = malloc(total * sizeof(float)), *in = malloc(total * sizeof(float));
    float *part = malloc(mine * sizeof(float)), block[64];
    EXPECT(all != NULL && in != NULL && part != NULL && mine <= 64);
    for (size_t i = 0; i < total; i++)
        in[i] = (float)(rank + 1) * (float)i;
    for (size_t i = 0; i < mine; i++)
        block[i] = (float)(rank * 100) + (float)i;
    loomStream_t s;
    CHECK(loomStreamCreate(&s));
    CHECK(loomAllGatherV(block, mine, all, v, v + n, loomFloat32, comm, s));
    CHECK(loomReduceScatterV(in, part, v, loomFloat32, loomSum, comm, s));
    free(v);
    CHECK(loomStreamSynchronize(s));
    CHECK(loomStreamDestroy(s));
    for (int p = 0, k = 0; p < n; p++)
        for (int i = 0; i <= p; i++, k++)
            EXPECT(all[k] == (float)(p * 100 + i));
    for (size_t i = 0; i < mine; i++)
        EXPECT(part[i] == (float)(n * (n + 1) / 2) * (float)(at + i));
    free(all);
    free(in);
    free(part);
}

int main(void)
{
    loomComm_t world, sub;
    CHECK(loomCommInitFromEnv(&world));
    int rank, n;
    CHECK(loomCommUserRank(world, &rank));
    CHECK(loomCommCount(world, &n));
    stream_allreduce(world, rank, n);
    group_ring(world, rank, n);
    alltoallv(world, rank, n);
    stream_v(world, rank, n);

    CHECK(loomCommSplit(world, 0, -rank, &sub, NULL));
    int subrank;
    CHECK(loomCommUserRank(sub, &subrank));
    EXPECT(subrank == n - 1 - rank);
    group_ring(sub, subrank, n);
    CHECK(loomCommDestroy(sub));

    /* Abort is local: every rank aborts its own handle after a completed barrier. */
    CHECK(loomCommSplit(world, rank % 2, rank, &sub, NULL));
    CHECK(loomBarrier(sub, NULL));
    CHECK(loomCommAbort(sub));

    CHECK(loomBarrier(world, NULL));
    CHECK(loomCommDestroy(world));
    if (rank == 0)
        printf("smoke: %d ranks OK\n", n);
    return 0;
}

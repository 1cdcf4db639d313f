/* SPDX-License-Identifier: Apache-2.0
 *
 * 04_echo_gradient_bucket.c - Echo in data parallelism: one gradient bucket
 * is all-reduced every step and its sum drives the weights, which add up the
 * steps' updates. One feedback state per bucket, kept across steps (as in
 * error-feedback SGD), makes the weights see the exact sum of all gradients
 * up to one step's rounding error; without it the errors of every step add.
 * Run: loomrun -n 4 build/examples/04_echo_gradient_bucket
 */
#include <math.h>
#include <stdio.h>

#include "loom.h"
#include "loom_echo.h"

#define BUCKET 16384
#define STEPS  100

static void gradient(float *g, int rank, int step)
{
    unsigned s = 2246822519u * (unsigned)(rank + 1) + 3266489917u * (unsigned)step;
    for (int i = 0; i < BUCKET; i++) {
        s = s * 1664525u + 1013904223u;
        /* a steady direction plus noise, as gradients have */
        g[i] = 0.01f * (float)(i % 7) + ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
}

/* Relative error of the weights' total update after STEPS steps. */
static double train(loomComm_t comm, int rank, int feedback)
{
    static float g[BUCKET], sum[BUCKET], exact[BUCKET];
    static double w[BUCKET], w_exact[BUCKET];
    loomEchoState_t bucket = NULL;
    if (feedback && loomEchoCreate(comm, BUCKET, loomFloat32, &bucket) != loomSuccess)
        return -1;
    for (int i = 0; i < BUCKET; i++)
        w[i] = w_exact[i] = 0;
    for (int step = 0; step < STEPS; step++) {
        gradient(g, rank, step);
        if (loomEchoAllReduce(g, sum, BUCKET, loomFloat32, comm, bucket, NULL) != loomSuccess ||
            loomAllReduce(g, exact, BUCKET, loomFloat32, loomSum, comm, NULL) != loomSuccess)
            return -1;
        for (int i = 0; i < BUCKET; i++) {
            w[i] -= sum[i];
            w_exact[i] -= exact[i];
        }
    }
    loomEchoDestroy(bucket);
    double d = 0, n = 0;
    for (int i = 0; i < BUCKET; i++) {
        d += (w[i] - w_exact[i]) * (w[i] - w_exact[i]);
        n += w_exact[i] * w_exact[i];
    }
    return sqrt(d / n);
}

int main(void)
{
    loomComm_t comm;
    if (loomCommInitFromEnv(&comm) != loomSuccess) {
        fprintf(stderr, "init failed: %s\nHINT: start it with loomrun -n N\n",
                loomGetLastError(NULL));
        return 1;
    }
    int rank;
    loomCommUserRank(comm, &rank);
    const double with = train(comm, rank, 1), without = train(comm, rank, 0);
    if (with < 0 || without < 0)
        fprintf(stderr, "a call failed: %s\n", loomGetLastError(comm));
    else if (rank == 0)
        printf("weights after %d steps: relative error %.5f with a feedback state per bucket, "
               "%.5f without\n",
               STEPS, with, without);
    loomCommDestroy(comm);
    return with < 0 || without < 0;
}

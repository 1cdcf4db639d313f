/* SPDX-License-Identifier: Apache-2.0
 *
 * 03_echo_residual_stream.c - Echo in tensor parallelism: every layer's
 * row-parallel output is all-reduced and added into the residual stream
 * h += AllReduce(x_l). One feedback state follows the stream through all
 * layers of a forward pass, so the rounding error a layer injects is paid
 * back by the next layer's call and the stream's error stays at one call's
 * worth however deep the model is. A new forward pass (new tokens) resets it.
 * Run: loomrun -n 4 build/examples/03_echo_residual_stream
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom.h"
#include "loom_echo.h"

#define HIDDEN 8192
#define LAYERS 64

/* A layer's partial output on this rank: deterministic pseudo-random values. */
static void layer_output(float *x, int rank, int layer)
{
    unsigned s = 2654435761u * (unsigned)(rank + 1) + 40503u * (unsigned)layer;
    for (int i = 0; i < HIDDEN; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 256 == 0 ? 40.0f : 1.0f);
    }
}

/* The stream's relative error after LAYERS layers, with or without a state. */
static double run_stream(loomComm_t comm, int rank, int feedback)
{
    static float x[HIDDEN], y[HIDDEN], exact[HIDDEN];
    static double h[HIDDEN], h_exact[HIDDEN];
    loomEchoState_t stream = NULL;
    if (feedback && loomEchoCreate(comm, HIDDEN, loomFloat32, &stream) != loomSuccess)
        return -1;
    for (int i = 0; i < HIDDEN; i++)
        h[i] = h_exact[i] = 0;
    for (int layer = 0; layer < LAYERS; layer++) {
        layer_output(x, rank, layer);
        if (loomEchoAllReduce(x, y, HIDDEN, loomFloat32, comm, stream, NULL) != loomSuccess ||
            loomAllReduce(x, exact, HIDDEN, loomFloat32, loomSum, comm, NULL) != loomSuccess)
            return -1;
        for (int i = 0; i < HIDDEN; i++) {
            h[i] += y[i];
            h_exact[i] += exact[i];
        }
    }
    loomEchoDestroy(stream);
    double d = 0, n = 0;
    for (int i = 0; i < HIDDEN; i++) {
        d += (h[i] - h_exact[i]) * (h[i] - h_exact[i]);
        n += h_exact[i] * h_exact[i];
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
    const double with = run_stream(comm, rank, 1), without = run_stream(comm, rank, 0);
    if (with < 0 || without < 0)
        fprintf(stderr, "a call failed: %s\n", loomGetLastError(comm));
    else if (rank == 0)
        printf("residual stream after %d layers: relative error %.3f with one feedback state, "
               "%.3f without\n",
               LAYERS, with, without);
    loomCommDestroy(comm);
    return with < 0 || without < 0;
}

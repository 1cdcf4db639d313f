/* SPDX-License-Identifier: Apache-2.0
 *
 * 01_init_allreduce.c - the smallest loom program: every rank joins the world
 * communicator from its launcher's environment and sums a vector.
 * Run: loomrun -n 4 build/examples/01_init_allreduce
 */
#include <stdio.h>

#include "loom.h"

int main(void)
{
    loomComm_t comm;
    if (loomCommInitFromEnv(&comm) != loomSuccess) {
        fprintf(stderr, "init failed: %s\nHINT: start it with loomrun -n N\n",
                loomGetLastError(NULL));
        return 1;
    }
    int rank, nranks;
    loomCommUserRank(comm, &rank);
    loomCommCount(comm, &nranks);
    float x[4] = {1.0f * rank, 1, 2, 3};
    loomResult_t res = loomAllReduce(x, x, 4, loomFloat32, loomSum, comm, NULL);
    if (res != loomSuccess)
        fprintf(stderr, "allreduce failed: %s: %s\n", loomGetErrorString(res),
                loomGetLastError(comm));
    else if (rank == 0)
        printf("sum over %d ranks: %g %g %g %g\n", nranks, x[0], x[1], x[2], x[3]);
    loomCommDestroy(comm);
    return res == loomSuccess ? 0 : 1;
}

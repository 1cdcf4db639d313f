/* SPDX-License-Identifier: Apache-2.0
 *
 * 02_sendrecv_ring.c - point-to-point in a group: each rank passes a value to
 * its right neighbour. Grouping the Send and the Recv is what keeps the ring
 * from deadlocking (as with NCCL). Run: loomrun -n 4 build/examples/02_sendrecv_ring
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
    int rank, n;
    loomCommUserRank(comm, &rank);
    loomCommCount(comm, &n);
    int out = rank * 10, in = -1;
    loomGroupStart();
    loomSend(&out, 1, loomInt32, (rank + 1) % n, comm, NULL);
    loomRecv(&in, 1, loomInt32, (rank + n - 1) % n, comm, NULL);
    loomResult_t res = loomGroupEnd();
    printf("rank %d received %d from rank %d\n", rank, in, (rank + n - 1) % n);
    loomCommDestroy(comm);
    return res == loomSuccess && in == ((rank + n - 1) % n) * 10 ? 0 : 1;
}

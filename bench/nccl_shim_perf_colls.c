/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_shim_perf_colls.c - the collectives nccl_shim_perf measures, each spelled twice with
 * the same arguments: through nccl.h (the drop-in library, stream NULL: the call completes
 * before it returns) and through loom.h (stream NULL likewise). float32, sum for the
 * reductions, Broadcast from rank 0, Send/Recv as a ring inside one group.
 */
#include "nccl_shim_perf.h"

static size_t one(size_t count, int nranks)
{
    (void)nranks;
    return count;
}

static size_t all(size_t count, int nranks)
{
    return count * (size_t)nranks;
}

static ncclResult_t allreduce_shim(const float *s, float *r, size_t n, ncclComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return ncclAllReduce(s, r, n, ncclFloat32, ncclSum, comm, NULL);
}

static loomResult_t allreduce_loom(const float *s, float *r, size_t n, loomComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return loomAllReduce(s, r, n, loomFloat32, loomSum, comm, NULL);
}

static ncclResult_t allgather_shim(const float *s, float *r, size_t n, ncclComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return ncclAllGather(s, r, n, ncclFloat32, comm, NULL);
}

static loomResult_t allgather_loom(const float *s, float *r, size_t n, loomComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return loomAllGather(s, r, n, loomFloat32, comm, NULL);
}

static ncclResult_t reducescatter_shim(const float *s, float *r, size_t n, ncclComm_t comm,
                                       int rank, int nranks)
{
    (void)rank;
    (void)nranks;
    return ncclReduceScatter(s, r, n, ncclFloat32, ncclSum, comm, NULL);
}

static loomResult_t reducescatter_loom(const float *s, float *r, size_t n, loomComm_t comm,
                                       int rank, int nranks)
{
    (void)rank;
    (void)nranks;
    return loomReduceScatter(s, r, n, loomFloat32, loomSum, comm, NULL);
}

static ncclResult_t broadcast_shim(const float *s, float *r, size_t n, ncclComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return ncclBroadcast(s, r, n, ncclFloat32, 0, comm, NULL);
}

static loomResult_t broadcast_loom(const float *s, float *r, size_t n, loomComm_t comm, int rank,
                                   int nranks)
{
    (void)rank;
    (void)nranks;
    return loomBroadcast(s, r, n, loomFloat32, 0, comm, NULL);
}

static ncclResult_t alltoall_shim(const float *s, float *r, size_t n, ncclComm_t comm, int rank,
                                  int nranks)
{
    (void)rank;
    (void)nranks;
    return ncclAlltoAll(s, r, n, ncclFloat32, comm, NULL);
}

static loomResult_t alltoall_loom(const float *s, float *r, size_t n, loomComm_t comm, int rank,
                                  int nranks)
{
    (void)rank;
    (void)nranks;
    return loomAllToAll(s, r, n, loomFloat32, comm, NULL);
}

/* The ring's group: a failed Send or Recv still ends the group, so that the thread is left
 * outside one whatever happened; the first failure is the result. */
static ncclResult_t sendrecv_shim(const float *s, float *r, size_t n, ncclComm_t comm, int rank,
                                  int nranks)
{
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess)
        return res;
    res = ncclSend(s, n, ncclFloat32, (rank + 1) % nranks, comm, NULL);
    if (res == ncclSuccess)
        res = ncclRecv(r, n, ncclFloat32, (rank + nranks - 1) % nranks, comm, NULL);
    const ncclResult_t end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

static loomResult_t sendrecv_loom(const float *s, float *r, size_t n, loomComm_t comm, int rank,
                                  int nranks)
{
    loomResult_t res = loomGroupStart();
    if (res != loomSuccess)
        return res;
    res = loomSend(s, n, loomFloat32, (rank + 1) % nranks, comm, NULL);
    if (res == loomSuccess)
        res = loomRecv(r, n, loomFloat32, (rank + nranks - 1) % nranks, comm, NULL);
    const loomResult_t end = loomGroupEnd();
    return res != loomSuccess ? res : end;
}

const nsp_coll_t nsp_colls[] = {
    {"AllReduce", "allreduce", "sum", -1, one, one, allreduce_shim, allreduce_loom},
    {"AllGather", "allgather", "none", -1, one, all, allgather_shim, allgather_loom},
    {"ReduceScatter", "reducescatter", "sum", -1, all, one, reducescatter_shim, reducescatter_loom},
    {"Broadcast", "broadcast", "none", 0, one, one, broadcast_shim, broadcast_loom},
    {"AllToAll", "alltoall", "none", -1, all, all, alltoall_shim, alltoall_loom},
    {"SendRecv", "sendrecv", "none", -1, one, one, sendrecv_shim, sendrecv_loom},
};
const int nsp_ncolls = (int)(sizeof(nsp_colls) / sizeof(nsp_colls[0]));

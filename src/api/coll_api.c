/* SPDX-License-Identifier: Apache-2.0
 *
 * coll_api.c - the public collective and point-to-point entry points. Each
 * validates its arguments (a bad one gives InvalidArgument and a message
 * naming it, and leaves the communicator usable), records one operation and
 * hands it to enqueue.c. No data moves here.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "dtype.h"

/* The most bytes one buffer may span: 2^56, the user address space of a
 * 64-bit Linux process with 57-bit virtual addresses (5-level paging on
 * x86-64, Sv57 on RISC-V); every other configuration gives less (2^47 with
 * 4-level paging, 2^52 on arm64). A count that fits size_t but not this bound
 * cannot describe real memory, and the copies would run past the buffer. A
 * constant rather than this machine's limit, so that every rank of a job,
 * whatever machine it runs on, refuses the same counts and none is left
 * waiting for a peer that refused. include/loom.h documents it. */
#define MAX_BUFFER_BYTES (1ull << 56)

static size_t max_elems(size_t es)
{
    return (size_t)(MAX_BUFFER_BYTES < SIZE_MAX ? MAX_BUFFER_BYTES : SIZE_MAX) / es;
}

/* Common checks: stream, datatype, and count*esize*mult within the limit. */
loomResult_t loom_check_common(loomStream_t stream, loomDataType_t dt, size_t count, size_t mult,
                               const char *fn, size_t *bytes_p)
{
    LOOM_CHECK(loom_stream_validate(stream));
    if (!loom_dtype_valid(dt)) {
        LOOM_WARN("%s: invalid datatype %d", fn, (int)dt);
        return loomInvalidArgument;
    }
    size_t es = loom_dtype_size(dt);
    if (count > max_elems(es) / mult) {
        char blocks[48] = "";
        if (mult > 1)
            snprintf(blocks, sizeof(blocks), " times %zu ranks", mult);
        LOOM_WARN("%s: count %zu of %s (%zu bytes each)%s is more than the %zu bytes a buffer "
                  "may span (2^56, the largest address space of a 64-bit process)",
                  fn, count, loom_dtype_name(dt), es, blocks, max_elems(1));
        return loomInvalidArgument;
    }
    *bytes_p = count * es;
    return loomSuccess;
}

static loomResult_t check_op(loomRedOp_t op, const char *fn)
{
    if (!loom_redop_valid(op)) {
        LOOM_WARN("%s: invalid reduction op %d", fn, (int)op);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

loomResult_t loom_check_buf(const void *p, size_t bytes, const char *what, const char *fn)
{
    if (p == NULL && bytes > 0) {
        LOOM_WARN("%s: %s is NULL with %zu bytes to move", fn, what, bytes);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static loomResult_t check_root(loomComm_t comm, int root, const char *fn)
{
    if (root < 0 || root >= comm->nranks) {
        LOOM_WARN("%s: root %d out of range [0, %d)", fn, root, comm->nranks);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* send [s, s+sn) and recv [r, r+rn) must be disjoint unless s == inplace_at. */
loomResult_t loom_check_overlap(const void *s, size_t sn, const void *r, size_t rn,
                                const void *inplace_at, const char *fn)
{
    uintptr_t a = (uintptr_t)s, b = (uintptr_t)r;
    if (sn == 0 || rn == 0 || s == NULL || r == NULL)
        return loomSuccess;
    if (inplace_at != NULL && s == inplace_at)
        return loomSuccess;
    if (a < b + rn && b < a + sn) {
        LOOM_WARN("%s: send buffer %p (%zu bytes) and receive buffer %p (%zu bytes) overlap "
                  "without being the in-place layout",
                  fn, s, sn, r, rn);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* Inlined so that each entry point builds the operation in place: copying a
 * just-written argument block costs stalled loads on the 8-byte path. */
static inline __attribute__((always_inline)) loomResult_t
enqueue_coll(loomComm_t comm, loomStream_t stream, const loom_coll_args_t *args)
{
    loom_op_t op = {.kind = LOOM_OP_COLL, .coll = *args};
    LOOM_INFO(LOOM_LOG_CALL, "%s: count %zu datatype %d op %d root %d comm %s",
              loom_coll_name(args->kind), args->count, (int)args->dt, (int)args->op, args->root,
              comm->name);
    return loom_enqueue(comm, &op, stream);
}

static loomResult_t all_reduce(const void *sendbuff, void *recvbuff, size_t count,
                               loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                               loomStream_t stream)
{
    const char *fn = "loomAllReduce";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, count, 1, fn, &bytes));
    LOOM_CHECK(check_op(op, fn));
    LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff", fn));
    LOOM_CHECK(loom_check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_ALLREDUCE,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = count,
                          .dt = datatype,
                          .op = op};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t all_gather(const void *sendbuff, void *recvbuff, size_t sendcount,
                               loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    const char *fn = "loomAllGather";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, sendcount, (size_t)comm->nranks, fn, &bytes));
    LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff", fn));
    const void *inplace = recvbuff ? (const uint8_t *)recvbuff + (size_t)comm->rank * bytes : NULL;
    LOOM_CHECK(
        loom_check_overlap(sendbuff, bytes, recvbuff, bytes * (size_t)comm->nranks, inplace, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_ALLGATHER,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = sendcount,
                          .dt = datatype};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t reduce_scatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                   loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                   loomStream_t stream)
{
    const char *fn = "loomReduceScatter";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, recvcount, (size_t)comm->nranks, fn, &bytes));
    LOOM_CHECK(check_op(op, fn));
    LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff", fn));
    /* In place: recvbuff == sendbuff + rank*recvcount; check_overlap compares the
     * send pointer, so swap roles: the receive block sits inside the send range. */
    const void *inplace = sendbuff ? (const uint8_t *)sendbuff + (size_t)comm->rank * bytes : NULL;
    LOOM_CHECK(
        loom_check_overlap(recvbuff, bytes, sendbuff, bytes * (size_t)comm->nranks, inplace, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_REDUCE_SCATTER,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = recvcount,
                          .dt = datatype,
                          .op = op};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t broadcast(const void *sendbuff, void *recvbuff, size_t count,
                              loomDataType_t datatype, int root, loomComm_t comm,
                              loomStream_t stream)
{
    const char *fn = "loomBroadcast";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, count, 1, fn, &bytes));
    LOOM_CHECK(check_root(comm, root, fn));
    if (comm->rank == root) {
        LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff (on the root)", fn));
        LOOM_CHECK(loom_check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn));
    }
    LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff", fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_BCAST,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = count,
                          .dt = datatype,
                          .root = root};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t reduce(const void *sendbuff, void *recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, int root, loomComm_t comm,
                           loomStream_t stream)
{
    const char *fn = "loomReduce";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, count, 1, fn, &bytes));
    LOOM_CHECK(check_op(op, fn));
    LOOM_CHECK(check_root(comm, root, fn));
    LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff", fn));
    if (comm->rank == root) {
        LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff (on the root)", fn));
        LOOM_CHECK(loom_check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn));
    }
    loom_coll_args_t a = {.kind = LOOM_COLL_REDUCE,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = count,
                          .dt = datatype,
                          .op = op,
                          .root = root};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t all_to_all(const void *sendbuff, void *recvbuff, size_t count,
                               loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    const char *fn = "loomAllToAll";
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, count, (size_t)comm->nranks, fn, &bytes));
    size_t total = bytes * (size_t)comm->nranks;
    LOOM_CHECK(loom_check_buf(sendbuff, total, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, total, "recvbuff", fn));
    LOOM_CHECK(loom_check_overlap(sendbuff, total, recvbuff, total, NULL, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_ALLTOALL,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = count,
                          .dt = datatype};
    return enqueue_coll(comm, stream, &a);
}

/* Extent in bytes of counts[i] at displs[i]; each end within the limit. */
static loomResult_t v_extent(const size_t *counts, const size_t *displs, int n, size_t es,
                             const char *what, const char *fn, size_t *bytes_p)
{
    size_t max = 0, cap = max_elems(es);
    for (int i = 0; i < n; i++) {
        if (counts[i] > cap || displs[i] > cap - counts[i]) {
            LOOM_WARN("%s: %s entry %d (count %zu at displacement %zu, %zu bytes "
                      "each) ends past the %zu bytes a buffer may span (2^56, the largest "
                      "address space of a 64-bit process)",
                      fn, what, i, counts[i], displs[i], es, max_elems(1));
            return loomInvalidArgument;
        }
        if (counts[i] > 0 && counts[i] + displs[i] > max)
            max = counts[i] + displs[i];
    }
    *bytes_p = max * es;
    return loomSuccess;
}

static loomResult_t all_to_allv(const void *sendbuff, const size_t sendcounts[],
                                const size_t sdispls[], void *recvbuff, const size_t recvcounts[],
                                const size_t rdispls[], loomDataType_t datatype, loomComm_t comm,
                                loomStream_t stream)
{
    const char *fn = "loomAllToAllv";
    size_t es_bytes;
    LOOM_CHECK(loom_check_common(stream, datatype, 1, 1, fn, &es_bytes));
    if (!sendcounts || !sdispls || !recvcounts || !rdispls) {
        LOOM_WARN("%s: counts and displacements must not be NULL", fn);
        return loomInvalidArgument;
    }
    const int n = comm->nranks;
    size_t sbytes, rbytes;
    LOOM_CHECK(v_extent(sendcounts, sdispls, n, es_bytes, "send", fn, &sbytes));
    LOOM_CHECK(v_extent(recvcounts, rdispls, n, es_bytes, "receive", fn, &rbytes));
    LOOM_CHECK(loom_check_buf(sendbuff, sbytes, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, rbytes, "recvbuff", fn));
    LOOM_CHECK(loom_check_overlap(sendbuff, sbytes, recvbuff, rbytes, NULL, fn));
    size_t *v = malloc(4 * (size_t)n * sizeof(size_t));
    if (v == NULL) {
        LOOM_WARN("%s: out of memory copying %d counts", fn, n);
        return loomSystemError;
    }
    memcpy(v, sendcounts, (size_t)n * sizeof(size_t));
    memcpy(v + n, sdispls, (size_t)n * sizeof(size_t));
    memcpy(v + 2 * n, recvcounts, (size_t)n * sizeof(size_t));
    memcpy(v + 3 * n, rdispls, (size_t)n * sizeof(size_t));
    loom_coll_args_t a = {.kind = LOOM_COLL_ALLTOALLV,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .dt = datatype,
                          .sendcounts = v,
                          .sdispls = v + n,
                          .recvcounts = v + 2 * n,
                          .rdispls = v + 3 * n};
    return enqueue_coll(comm, stream, &a); /* the op owns v from here, even on failure */
}

/* The sum of counts[0..n) in elements of es bytes, refused past the 2^56-byte bound, and
 * (before_p, may be NULL) the sum of counts[0..me). */
static loomResult_t v_total(const size_t *counts, int n, int me, size_t es, const char *fn,
                            size_t *total_p, size_t *before_p)
{
    size_t total = 0, cap = max_elems(es);
    for (int i = 0; i < n; i++) {
        if (i == me && before_p)
            *before_p = total;
        if (counts[i] > cap - total) {
            LOOM_WARN("%s: recvcounts add up to more than the %zu bytes a buffer may span (2^56, "
                      "the largest address space of a 64-bit process) at entry %d (count %zu, "
                      "%zu bytes each)",
                      fn, max_elems(1), i, counts[i], es);
            return loomInvalidArgument;
        }
        total += counts[i];
    }
    *total_p = total;
    return loomSuccess;
}

static int cmp_block(const void *x, const void *y, void *displs)
{
    const size_t *d = displs;
    size_t a = d[*(const int *)x], b = d[*(const int *)y];
    return a < b ? -1 : a > b;
}

/* InvalidArgument if two non-empty blocks counts[i] at displs[i] overlap. */
static loomResult_t v_disjoint(const size_t *counts, const size_t *displs, int n, const char *fn)
{
    int *idx = malloc(sizeof(int) * (size_t)n);
    if (idx == NULL) {
        LOOM_WARN("%s: out of memory checking %d blocks", fn, n);
        return loomSystemError;
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0)
            idx[m++] = i;
    qsort_r(idx, (size_t)m, sizeof(int), cmp_block, (void *)displs);
    loomResult_t res = loomSuccess;
    for (int k = 1; k < m && res == loomSuccess; k++) {
        int p = idx[k - 1], q = idx[k];
        if (displs[p] + counts[p] > displs[q]) {
            LOOM_WARN("%s: the blocks of rank %d (count %zu at displacement %zu) and rank %d "
                      "(count %zu at displacement %zu) overlap in recvbuff",
                      fn, p, counts[p], displs[p], q, counts[q], displs[q]);
            res = loomInvalidArgument;
        }
    }
    free(idx);
    return res;
}

/* Records a V collective: its counts and displacements (NULL: the prefix sums of the
 * counts) copied into one allocation that the operation owns, since the call may run after
 * the caller freed its arrays (a group, a stream). */
static loomResult_t enqueue_v(loomComm_t comm, loomStream_t stream, loom_coll_args_t *a,
                              const size_t *counts, const size_t *displs, const char *fn)
{
    const int n = comm->nranks;
    size_t *v = malloc(2 * (size_t)n * sizeof(size_t));
    if (v == NULL) {
        LOOM_WARN("%s: out of memory copying %d counts", fn, n);
        return loomSystemError;
    }
    memcpy(v, counts, (size_t)n * sizeof(size_t));
    if (displs) {
        memcpy(v + n, displs, (size_t)n * sizeof(size_t));
    } else {
        for (int i = 0; i < n; i++)
            v[n + i] = i ? v[n + i - 1] + v[i - 1] : 0;
    }
    a->recvcounts = v;
    a->rdispls = v + n;
    return enqueue_coll(comm, stream, a); /* the op owns v from here, even on failure */
}

static loomResult_t all_gather_v(const void *sendbuff, size_t sendcount, void *recvbuff,
                                 const size_t recvcounts[], const size_t displs[],
                                 loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    const char *fn = "loomAllGatherV";
    const int n = comm->nranks, me = comm->rank;
    size_t es, total, rbytes;
    LOOM_CHECK(loom_check_common(stream, datatype, 1, 1, fn, &es));
    if (recvcounts == NULL || displs == NULL) {
        LOOM_WARN("%s: recvcounts and displs must not be NULL", fn);
        return loomInvalidArgument;
    }
    if (sendcount != recvcounts[me]) {
        LOOM_WARN("%s: rank %d sends %zu elements but recvcounts[%d] is %zu", fn, me, sendcount, me,
                  recvcounts[me]);
        return loomInvalidArgument;
    }
    LOOM_CHECK(v_extent(recvcounts, displs, n, es, "receive", fn, &rbytes));
    LOOM_CHECK(v_total(recvcounts, n, me, es, fn, &total, NULL));
    LOOM_CHECK(loom_check_buf(sendbuff, sendcount * es, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, rbytes, "recvbuff", fn));
    LOOM_CHECK(v_disjoint(recvcounts, displs, n, fn));
    const void *inplace = recvbuff ? (const uint8_t *)recvbuff + displs[me] * es : NULL;
    LOOM_CHECK(loom_check_overlap(sendbuff, sendcount * es, recvbuff, rbytes, inplace, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_ALLGATHERV,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = total,
                          .dt = datatype};
    return enqueue_v(comm, stream, &a, recvcounts, displs, fn);
}

static loomResult_t reduce_scatter_v(const void *sendbuff, void *recvbuff,
                                     const size_t recvcounts[], loomDataType_t datatype,
                                     loomRedOp_t op, loomComm_t comm, loomStream_t stream)
{
    const char *fn = "loomReduceScatterV";
    const int n = comm->nranks, me = comm->rank;
    size_t es, total, before = 0;
    LOOM_CHECK(loom_check_common(stream, datatype, 1, 1, fn, &es));
    LOOM_CHECK(check_op(op, fn));
    if (recvcounts == NULL) {
        LOOM_WARN("%s: recvcounts must not be NULL", fn);
        return loomInvalidArgument;
    }
    LOOM_CHECK(v_total(recvcounts, n, me, es, fn, &total, &before));
    const size_t mine = recvcounts[me] * es;
    LOOM_CHECK(loom_check_buf(sendbuff, total * es, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, mine, "recvbuff", fn));
    /* In place: recvbuff == sendbuff + the prefix sum; the receive block within the send range
     * (roles swapped, as in reduce_scatter). */
    const void *inplace = sendbuff ? (const uint8_t *)sendbuff + before * es : NULL;
    LOOM_CHECK(loom_check_overlap(recvbuff, mine, sendbuff, total * es, inplace, fn));
    loom_coll_args_t a = {.kind = LOOM_COLL_REDUCE_SCATTERV,
                          .sendbuff = sendbuff,
                          .recvbuff = recvbuff,
                          .count = total,
                          .dt = datatype,
                          .op = op};
    return enqueue_v(comm, stream, &a, recvcounts, NULL, fn);
}

static loomResult_t barrier(loomComm_t comm, loomStream_t stream)
{
    LOOM_CHECK(loom_stream_validate(stream));
    loom_coll_args_t a = {.kind = LOOM_COLL_BARRIER, .dt = loomUint8};
    return enqueue_coll(comm, stream, &a);
}

static loomResult_t p2p_enqueue(loom_op_kind_t kind, const void *sbuf, void *rbuf, size_t count,
                                loomDataType_t dt, int peer, loomComm_t comm, loomStream_t stream,
                                const char *fn)
{
    size_t bytes;
    LOOM_CHECK(loom_check_common(stream, dt, count, 1, fn, &bytes));
    if (peer < 0 || peer >= comm->nranks) {
        LOOM_WARN("%s: peer %d out of range [0, %d)", fn, peer, comm->nranks);
        return loomInvalidArgument;
    }
    LOOM_CHECK(loom_check_buf(kind == LOOM_OP_SEND ? sbuf : rbuf, bytes, "buffer", fn));
    loom_op_t op;
    memset(&op, 0, sizeof(op));
    op.kind = kind;
    op.sendbuff = sbuf;
    op.recvbuff = rbuf;
    op.nbytes = bytes;
    op.peer = peer;
    return loom_enqueue(comm, &op, stream);
}

// ---- public entry points: each holds a reference on comm for the whole call ----

LOOM_API loomResult_t loomAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                    loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomAllReduce",
                   all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}

LOOM_API loomResult_t loomAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomAllGather",
                   all_gather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}

LOOM_API loomResult_t loomReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                        loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomReduceScatter",
                   reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}

LOOM_API loomResult_t loomBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t datatype, int root, loomComm_t comm,
                                    loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomBroadcast",
                   broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}

LOOM_API loomResult_t loomReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 loomDataType_t datatype, loomRedOp_t op, int root, loomComm_t comm,
                                 loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomReduce",
                   reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}

LOOM_API loomResult_t loomAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                                   loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomAllToAll",
                   all_to_all(sendbuff, recvbuff, count, datatype, comm, stream));
}

LOOM_API loomResult_t loomAllToAllv(const void *sendbuff, const size_t sendcounts[],
                                    const size_t sdispls[], void *recvbuff,
                                    const size_t recvcounts[], const size_t rdispls[],
                                    loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomAllToAllv",
                   all_to_allv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls,
                               datatype, comm, stream));
}

LOOM_API loomResult_t loomAllGatherV(const void *sendbuff, size_t sendcount, void *recvbuff,
                                     const size_t recvcounts[], const size_t displs[],
                                     loomDataType_t datatype, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(
        comm, "loomAllGatherV",
        all_gather_v(sendbuff, sendcount, recvbuff, recvcounts, displs, datatype, comm, stream));
}

LOOM_API loomResult_t loomReduceScatterV(const void *sendbuff, void *recvbuff,
                                         const size_t recvcounts[], loomDataType_t datatype,
                                         loomRedOp_t op, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomReduceScatterV",
                   reduce_scatter_v(sendbuff, recvbuff, recvcounts, datatype, op, comm, stream));
}

LOOM_API loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomBarrier", barrier(comm, stream));
}

LOOM_API loomResult_t loomSend(const void *sendbuff, size_t count, loomDataType_t datatype,
                               int peer, loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(
        comm, "loomSend",
        p2p_enqueue(LOOM_OP_SEND, sendbuff, NULL, count, datatype, peer, comm, stream, "loomSend"));
}

LOOM_API loomResult_t loomRecv(void *recvbuff, size_t count, loomDataType_t datatype, int peer,
                               loomComm_t comm, loomStream_t stream)
{
    LOOM_WITH_COMM(
        comm, "loomRecv",
        p2p_enqueue(LOOM_OP_RECV, NULL, recvbuff, count, datatype, peer, comm, stream, "loomRecv"));
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_nccl.c - libfake-nccl.so, a stand-in for the real libnccl.so.2 in the drop-in library's
 * route-mode tests on machines without a GPU: the shim opens it through LOOM_NCCL_LIBRARY and
 * takes its functions by their pnccl names, as it would NCCL's. It runs on host memory over a
 * copy of loom linked into it (its symbols kept local, so that it is a library of its own, as
 * the real NCCL is), every call to completion on the calling thread (the stream is ignored;
 * inside a group, at the outermost GroupEnd). It reports version 22809 and counts the calls
 * made to each function, which a test reads with fakeNcclCallCount after dlopen of the same
 * path (the loader returns the object the shim opened) to tell which backend ran a call.
 * Test-only: never installed.
 */
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- call counters ------------------------------------------------------------------------ */

#define FAKE_FUNCTIONS(X)                                                                          \
    X(GetVersion)                                                                                  \
    X(GetErrorString)                                                                              \
    X(GetLastError)                                                                                \
    X(GetUniqueId)                                                                                 \
    X(CommInitRank)                                                                                \
    X(CommInitRankConfig)                                                                          \
    X(CommDestroy)                                                                                 \
    X(CommAbort)                                                                                   \
    X(CommFinalize)                                                                                \
    X(CommGetAsyncError)                                                                           \
    X(CommCount)                                                                                   \
    X(CommUserRank)                                                                                \
    X(CommCuDevice)                                                                                \
    X(CommSplit)                                                                                   \
    X(GroupStart)                                                                                  \
    X(GroupEnd)                                                                                    \
    X(AllReduce)                                                                                   \
    X(AllGather)                                                                                   \
    X(ReduceScatter)                                                                               \
    X(Broadcast)                                                                                   \
    X(Bcast)                                                                                       \
    X(Reduce)                                                                                      \
    X(AlltoAll)                                                                                    \
    X(Gather)                                                                                      \
    X(Scatter)                                                                                     \
    X(Send)                                                                                        \
    X(Recv)                                                                                        \
    X(MemAlloc)                                                                                    \
    X(MemFree)

enum {
#define FAKE_ENUM(name) FAKE_##name,
    FAKE_FUNCTIONS(FAKE_ENUM)
#undef FAKE_ENUM
        FAKE_NUM
};
static const char *const fake_names[FAKE_NUM] = {
#define FAKE_NAME(name) #name,
    FAKE_FUNCTIONS(FAKE_NAME)
#undef FAKE_NAME
};
static long fake_counts[FAKE_NUM];

#define COUNT(name) __atomic_add_fetch(&fake_counts[FAKE_##name], 1, __ATOMIC_RELAXED)

/* Calls made so far to the function `name` ("AllReduce", "ncclAllReduce" or "pncclAllReduce");
 * -1 for a name this library does not have. */
EXPORT long fakeNcclCallCount(const char *name)
{
    if (name == NULL)
        return -1;
    if (strncmp(name, "pnccl", 5) == 0)
        name += 5;
    else if (strncmp(name, "nccl", 4) == 0)
        name += 4;
    for (int i = 0; i < FAKE_NUM; i++)
        if (strcmp(name, fake_names[i]) == 0)
            return __atomic_load_n(&fake_counts[i], __ATOMIC_RELAXED);
    return -1;
}

/* Sets every counter to zero. */
EXPORT void fakeNcclResetCallCounts(void)
{
    for (int i = 0; i < FAKE_NUM; i++)
        __atomic_store_n(&fake_counts[i], 0, __ATOMIC_RELAXED);
}

/* ---- errors ------------------------------------------------------------------------------- */

static __thread char last_error[1024];

__attribute__((format(printf, 2, 3))) static ncclResult_t fail(ncclResult_t rc, const char *fmt,
                                                               ...)
{
    int n = snprintf(last_error, sizeof(last_error), "fake NCCL: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof(last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

/* loom's results are NCCL's, but for loomTimeout, which NCCL reports as a remote error. */
static ncclResult_t from_loom(loomResult_t r, const char *what)
{
    if (r == loomSuccess)
        return ncclSuccess;
    return fail(r == loomTimeout ? ncclRemoteError : (ncclResult_t)r, "%s: %s", what,
                loomGetLastError(NULL));
}

/* ---- communicators ------------------------------------------------------------------------ */

#define FAKE_COMM_MAGIC 0x66616b65u /* "fake" */

struct ncclComm {
    uint32_t magic;
    loomComm_t loom;
};

static ncclResult_t check_comm(ncclComm_t comm, const char *what)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    if (comm->magic != FAKE_COMM_MAGIC)
        return fail(ncclInvalidArgument, "%s: comm %p is not a communicator of this library", what,
                    (void *)comm);
    return ncclSuccess;
}

static ncclResult_t wrap(loomComm_t lc, ncclComm_t *out)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        loomCommDestroy(lc);
        return fail(ncclSystemError, "out of memory");
    }
    c->magic = FAKE_COMM_MAGIC;
    c->loom = lc;
    *out = c;
    return ncclSuccess;
}

static void unwrap_free(ncclComm_t comm)
{
    comm->magic = 0;
    free(comm);
}

/* The fake's id is loom's, whose content (loom_id_t: 52 bytes) fits in the first 64 bytes of the
 * 128; the rest stays zero here, since the drop-in library keeps its own loom id in bytes 64 to
 * 127 of the id it hands out. */
#define FAKE_ID_BYTES 64

EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
    COUNT(GetUniqueId);
    if (uniqueId == NULL)
        return fail(ncclInvalidArgument, "GetUniqueId: uniqueId is NULL");
    loomUniqueId id;
    loomResult_t r = loomGetUniqueId(&id);
    if (r != loomSuccess)
        return from_loom(r, "GetUniqueId");
    for (int i = FAKE_ID_BYTES; i < LOOM_UNIQUE_ID_BYTES; i++)
        if (id.internal[i] != 0)
            return fail(ncclInternalError, "GetUniqueId: loom's id uses more than %d bytes",
                        FAKE_ID_BYTES);
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, id.internal, FAKE_ID_BYTES);
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *commId, int rank,
                              const ncclConfig_t *config, const char *what)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "%s: comm is NULL", what);
    *comm = NULL;
    loomUniqueId id;
    memset(&id, 0, sizeof(id));
    memcpy(id.internal, commId->internal, FAKE_ID_BYTES);
    loomConfig_t lcfg = LOOM_CONFIG_INITIALIZER;
    if (config && config->commName)
        lcfg.commName = config->commName;
    loomComm_t lc = NULL;
    loomResult_t r = loomCommInitRankConfig(&lc, nranks, id, rank, &lcfg);
    if (r != loomSuccess)
        return from_loom(r, what);
    return wrap(lc, comm);
}

EXPORT ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    COUNT(CommInitRank);
    return init_rank(comm, nranks, &commId, rank, NULL, "CommInitRank");
}

/* Non-blocking communicators (config->blocking = 0) are created before the call returns, which
 * NCCL allows: CommGetAsyncError then reports success at once. */
EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                            int rank, ncclConfig_t *config)
{
    COUNT(CommInitRankConfig);
    return init_rank(comm, nranks, &commId, rank, config, "CommInitRankConfig");
}

EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                   ncclConfig_t *config)
{
    COUNT(CommSplit);
    (void)config;
    ncclResult_t rc = check_comm(comm, "CommSplit");
    if (rc != ncclSuccess)
        return rc;
    if (newcomm == NULL)
        return fail(ncclInvalidArgument, "CommSplit: newcomm is NULL");
    *newcomm = NULL;
    loomComm_t lc = NULL;
    loomResult_t r = loomCommSplit(comm->loom, color, key, &lc, NULL);
    if (r != loomSuccess)
        return from_loom(r, "CommSplit");
    return lc ? wrap(lc, newcomm) : ncclSuccess;
}

EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    COUNT(CommFinalize);
    return check_comm(comm, "CommFinalize"); /* nothing is ever pending past a call */
}

EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    COUNT(CommDestroy);
    if (comm == NULL)
        return ncclSuccess;
    ncclResult_t rc = check_comm(comm, "CommDestroy");
    if (rc != ncclSuccess)
        return rc;
    loomResult_t r = loomCommDestroy(comm->loom);
    unwrap_free(comm);
    return from_loom(r, "CommDestroy");
}

EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    COUNT(CommAbort);
    if (comm == NULL)
        return ncclSuccess;
    ncclResult_t rc = check_comm(comm, "CommAbort");
    if (rc != ncclSuccess)
        return rc;
    loomResult_t r = loomCommAbort(comm->loom);
    unwrap_free(comm);
    return from_loom(r, "CommAbort");
}

EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    COUNT(CommGetAsyncError);
    ncclResult_t rc = check_comm(comm, "CommGetAsyncError");
    if (rc != ncclSuccess)
        return rc;
    if (asyncError == NULL)
        return fail(ncclInvalidArgument, "CommGetAsyncError: asyncError is NULL");
    loomResult_t a = loomSuccess;
    loomResult_t r = loomCommGetAsyncError(comm->loom, &a);
    if (r != loomSuccess)
        return from_loom(r, "CommGetAsyncError");
    *asyncError = a == loomTimeout ? ncclRemoteError : (ncclResult_t)a;
    return ncclSuccess;
}

EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
    COUNT(CommCount);
    ncclResult_t rc = check_comm(comm, "CommCount");
    return rc != ncclSuccess ? rc : from_loom(loomCommCount(comm->loom, count), "CommCount");
}

EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
    COUNT(CommUserRank);
    ncclResult_t rc = check_comm(comm, "CommUserRank");
    return rc != ncclSuccess ? rc : from_loom(loomCommUserRank(comm->loom, rank), "CommUserRank");
}

/* Host memory has no device: 0, as for a process that never chose one. */
EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
    COUNT(CommCuDevice);
    ncclResult_t rc = check_comm(comm, "CommCuDevice");
    if (rc != ncclSuccess)
        return rc;
    if (device == NULL)
        return fail(ncclInvalidArgument, "CommCuDevice: device is NULL");
    *device = 0;
    return ncclSuccess;
}

/* ---- version, texts, memory --------------------------------------------------------------- */

EXPORT ncclResult_t pncclGetVersion(int *version)
{
    COUNT(GetVersion);
    if (version == NULL)
        return fail(ncclInvalidArgument, "GetVersion: version is NULL");
    *version = 22809;
    return ncclSuccess;
}

/* Texts of the fake's own, so that a test can tell them from the drop-in library's. */
EXPORT const char *pncclGetErrorString(ncclResult_t result)
{
    COUNT(GetErrorString);
    switch (result) {
    case ncclSuccess:
        return "fake NCCL: no error";
    case ncclUnhandledCudaError:
        return "fake NCCL: unhandled cuda error";
    case ncclSystemError:
        return "fake NCCL: system error";
    case ncclInternalError:
        return "fake NCCL: internal error";
    case ncclInvalidArgument:
        return "fake NCCL: invalid argument";
    case ncclInvalidUsage:
        return "fake NCCL: invalid usage";
    case ncclRemoteError:
        return "fake NCCL: remote error";
    case ncclInProgress:
        return "fake NCCL: in progress";
    default:
        return "fake NCCL: unknown result code";
    }
}

EXPORT const char *pncclGetLastError(ncclComm_t comm)
{
    COUNT(GetLastError);
    (void)comm;
    return last_error;
}

EXPORT ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    COUNT(MemAlloc);
    if (ptr == NULL)
        return fail(ncclInvalidArgument, "MemAlloc: ptr is NULL");
    *ptr = NULL;
    if (posix_memalign(ptr, 4096, size ? size : 1) != 0)
        return fail(ncclSystemError, "MemAlloc: cannot allocate %zu bytes", size);
    return ncclSuccess;
}

EXPORT ncclResult_t pncclMemFree(void *ptr)
{
    COUNT(MemFree);
    free(ptr);
    return ncclSuccess;
}

/* ---- groups and collectives --------------------------------------------------------------- */

EXPORT ncclResult_t pncclGroupStart(void)
{
    COUNT(GroupStart);
    return from_loom(loomGroupStart(), "GroupStart");
}

EXPORT ncclResult_t pncclGroupEnd(void)
{
    COUNT(GroupEnd);
    return from_loom(loomGroupEnd(), "GroupEnd");
}

/* loom numbers datatypes and the built-in ops as NCCL does; created ops (PreMulSum) are not
 * supported by the fake. */
static ncclResult_t check_op(ncclRedOp_t op, const char *what)
{
    if ((int)op < 0 || op >= ncclNumOps)
        return fail(ncclInvalidArgument, "%s: op %d is not supported", what, (int)op);
    return ncclSuccess;
}

#define CALL(name, comm, expr)                                                                     \
    do {                                                                                           \
        COUNT(name);                                                                               \
        ncclResult_t rc_ = check_comm((comm), #name);                                              \
        if (rc_ != ncclSuccess)                                                                    \
            return rc_;                                                                            \
        return from_loom((expr), #name);                                                           \
    } while (0)

EXPORT ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    (void)stream;
    if (check_op(op, "AllReduce") != ncclSuccess) {
        COUNT(AllReduce);
        return ncclInvalidArgument;
    }
    CALL(AllReduce, comm,
         loomAllReduce(sendbuff, recvbuff, count, (loomDataType_t)datatype, (loomRedOp_t)op,
                       comm->loom, NULL));
}

EXPORT ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    CALL(AllGather, comm,
         loomAllGather(sendbuff, recvbuff, sendcount, (loomDataType_t)datatype, comm->loom, NULL));
}

EXPORT ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream)
{
    (void)stream;
    if (check_op(op, "ReduceScatter") != ncclSuccess) {
        COUNT(ReduceScatter);
        return ncclInvalidArgument;
    }
    CALL(ReduceScatter, comm,
         loomReduceScatter(sendbuff, recvbuff, recvcount, (loomDataType_t)datatype, (loomRedOp_t)op,
                           comm->loom, NULL));
}

EXPORT ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream)
{
    (void)stream;
    CALL(
        Broadcast, comm,
        loomBroadcast(sendbuff, recvbuff, count, (loomDataType_t)datatype, root, comm->loom, NULL));
}

EXPORT ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    CALL(Bcast, comm,
         loomBroadcast(buff, buff, count, (loomDataType_t)datatype, root, comm->loom, NULL));
}

EXPORT ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    (void)stream;
    if (check_op(op, "Reduce") != ncclSuccess) {
        COUNT(Reduce);
        return ncclInvalidArgument;
    }
    CALL(Reduce, comm,
         loomReduce(sendbuff, recvbuff, count, (loomDataType_t)datatype, (loomRedOp_t)op, root,
                    comm->loom, NULL));
}

EXPORT ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    CALL(AlltoAll, comm,
         loomAllToAll(sendbuff, recvbuff, count, (loomDataType_t)datatype, comm->loom, NULL));
}

/* loom has no Gather or Scatter: point to point with the root, in a loom group (nested in the
 * caller's, if one is open), the root copying its own block. */
static size_t type_size(ncclDataType_t dt)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (int)dt >= 0 && (int)dt < (int)(sizeof(sizes) / sizeof(sizes[0])) ? sizes[dt] : 0;
}

static loomResult_t rooted(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, loomComm_t lc, int gather)
{
    int rank = 0, nranks = 0;
    loomResult_t r = loomCommUserRank(lc, &rank);
    if (r == loomSuccess)
        r = loomCommCount(lc, &nranks);
    if (r != loomSuccess)
        return r;
    const size_t bytes = count * type_size(datatype);
    const loomDataType_t dt = (loomDataType_t)datatype;
    if ((r = loomGroupStart()) != loomSuccess)
        return r;
    if (rank != root) {
        r = gather ? loomSend(sendbuff, count, dt, root, lc, NULL)
                   : loomRecv(recvbuff, count, dt, root, lc, NULL);
    } else {
        for (int peer = 0; peer < nranks && r == loomSuccess; peer++) {
            char *block =
                (char *)(gather ? recvbuff : (void *)(uintptr_t)sendbuff) + (size_t)peer * bytes;
            if (peer == root) {
                const void *from = gather ? sendbuff : block;
                void *to = gather ? block : recvbuff;
                if (from != to && bytes)
                    memmove(to, from, bytes);
            } else {
                r = gather ? loomRecv(block, count, dt, peer, lc, NULL)
                           : loomSend(block, count, dt, peer, lc, NULL);
            }
        }
    }
    loomResult_t e = loomGroupEnd();
    return r != loomSuccess ? r : e;
}

EXPORT ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    (void)stream;
    COUNT(Gather);
    ncclResult_t rc = check_comm(comm, "Gather");
    if (rc != ncclSuccess)
        return rc;
    int nranks = 0;
    loomCommCount(comm->loom, &nranks);
    if (type_size(datatype) == 0 || root < 0 || root >= nranks)
        return fail(ncclInvalidArgument, "Gather: datatype %d or root %d is not valid",
                    (int)datatype, root);
    return from_loom(rooted(sendbuff, recvbuff, count, datatype, root, comm->loom, 1), "Gather");
}

EXPORT ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    (void)stream;
    COUNT(Scatter);
    ncclResult_t rc = check_comm(comm, "Scatter");
    if (rc != ncclSuccess)
        return rc;
    int nranks = 0;
    loomCommCount(comm->loom, &nranks);
    if (type_size(datatype) == 0 || root < 0 || root >= nranks)
        return fail(ncclInvalidArgument, "Scatter: datatype %d or root %d is not valid",
                    (int)datatype, root);
    return from_loom(rooted(sendbuff, recvbuff, count, datatype, root, comm->loom, 0), "Scatter");
}

EXPORT ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    CALL(Send, comm, loomSend(sendbuff, count, (loomDataType_t)datatype, peer, comm->loom, NULL));
}

EXPORT ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    CALL(Recv, comm, loomRecv(recvbuff, count, (loomDataType_t)datatype, peer, comm->loom, NULL));
}

/* NCCL exports every function under both names; so does the fake. */
#define ALIAS(name)                                                                                \
    EXPORT extern __typeof__(pnccl##name) nccl##name __attribute__((alias("pnccl" #name)));
FAKE_FUNCTIONS(ALIAS)

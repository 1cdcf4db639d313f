/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_nccl_dev.c - libfake-nccl-dev.so, the stand-in for libnccl.so.2 that the nccl device
 * transport (src/device/transport/devtp_nccl*.c) is tested against without a GPU, under the
 * emulated device runtime. It has exactly the calls the transport takes from NCCL (nothing
 * that reduces), declared with the transport's own view of NCCL's ABI (devtp_nccl.h; when
 * nccl.h is there, nccl_abi_check.c checks that view against it). It runs on host memory over
 * a private copy of loom (its symbols kept local, as tests/nccl_shim/fake_nccl.c does), each
 * call to completion on the calling thread, a group's at its outermost GroupEnd.
 *
 * Streams: the real NCCL queues its work on the caller's stream; this fake cannot, so before
 * each call it lets the test wait until the stream has run everything queued before
 * (fakeNcclDevSetStreamSync), then does the call at once: the transport's order on the stream
 * (copies and kernels before and after each NCCL call) is kept. It counts its calls
 * (fakeNcclDevCount). Test-only: never installed.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devtp_nccl.h"
#include "loom.h"

#define EXPORT __attribute__((visibility("default")))

#define FAKE_FUNCTIONS(X)                                                                          \
    X(GetVersion)                                                                                  \
    X(GetUniqueId)                                                                                 \
    X(CommInitRank)                                                                                \
    X(CommDestroy)                                                                                 \
    X(CommAbort)                                                                                   \
    X(GroupStart)                                                                                  \
    X(GroupEnd)                                                                                    \
    X(Send)                                                                                        \
    X(Recv)                                                                                        \
    X(AllGather)                                                                                   \
    X(Broadcast)

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

/* Calls made so far to ncclNAME; -1 for a name the fake does not have. */
EXPORT long fakeNcclDevCount(const char *name)
{
    for (int i = 0; i < FAKE_NUM; i++)
        if (name != NULL && strcmp(name, fake_names[i]) == 0)
            return __atomic_load_n(&fake_counts[i], __ATOMIC_RELAXED);
    return -1;
}

typedef int (*stream_sync_fn)(void *stream);
static stream_sync_fn stream_sync;

/* fn(stream) returns once the stream ran all the work queued on it (0), or failed (-1). */
EXPORT void fakeNcclDevSetStreamSync(stream_sync_fn fn)
{
    __atomic_store_n(&stream_sync, fn, __ATOMIC_RELEASE);
}

static __thread char last_error[512];

__attribute__((format(printf, 2, 3))) static loom_nccl_result_t fail(loom_nccl_result_t rc,
                                                                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return rc;
}

static loom_nccl_result_t from_loom(loomResult_t r, const char *what)
{
    if (r == loomSuccess)
        return LOOM_NCCL_SUCCESS;
    return fail(r == loomTimeout ? loomRemoteError : (loom_nccl_result_t)r, "%s: %s", what,
                loomGetLastError(NULL));
}

static loom_nccl_result_t sync_stream(void *stream, const char *what)
{
    stream_sync_fn fn = __atomic_load_n(&stream_sync, __ATOMIC_ACQUIRE);
    if (fn == NULL)
        return fail(5, "%s: no stream synchronizer was set (fakeNcclDevSetStreamSync)", what);
    return fn(stream) == 0 ? LOOM_NCCL_SUCCESS : fail(1, "%s: the stream failed", what);
}

struct loom_nccl_comm {
    uint32_t magic;
    loomComm_t loom;
    int rank, nranks;
};
#define COMM_MAGIC 0x6e646576u

static loom_nccl_result_t check_comm(loom_nccl_comm_t c, const char *what)
{
    if (c == NULL || c->magic != COMM_MAGIC)
        return fail(4, "%s: not a communicator of this library", what);
    return LOOM_NCCL_SUCCESS;
}

EXPORT loom_nccl_result_t ncclGetVersion(int *version)
{
    COUNT(GetVersion);
    *version = 22809;
    return LOOM_NCCL_SUCCESS;
}

EXPORT const char *ncclGetErrorString(loom_nccl_result_t r)
{
    static const char *texts[] = {"fake NCCL: no error",         "fake NCCL: unhandled cuda error",
                                  "fake NCCL: system error",     "fake NCCL: internal error",
                                  "fake NCCL: invalid argument", "fake NCCL: invalid usage",
                                  "fake NCCL: remote error",     "fake NCCL: in progress"};
    return r >= 0 && r < (int)(sizeof(texts) / sizeof(texts[0])) ? texts[r] : "fake NCCL: ?";
}

EXPORT const char *ncclGetLastError(loom_nccl_comm_t comm)
{
    (void)comm;
    return last_error;
}

/* loom's id (its content fits the first 64 bytes) inside NCCL's 128. */
EXPORT loom_nccl_result_t ncclGetUniqueId(loom_nccl_id_t *id)
{
    COUNT(GetUniqueId);
    loomUniqueId lid;
    loomResult_t r = loomGetUniqueId(&lid);
    if (r != loomSuccess)
        return from_loom(r, "GetUniqueId");
    memcpy(id->internal, lid.internal, sizeof(id->internal));
    return LOOM_NCCL_SUCCESS;
}

EXPORT loom_nccl_result_t ncclCommInitRank(loom_nccl_comm_t *comm, int nranks, loom_nccl_id_t id,
                                           int rank)
{
    COUNT(CommInitRank);
    *comm = NULL;
    loomUniqueId lid;
    memcpy(lid.internal, id.internal, sizeof(lid.internal));
    loomComm_t lc = NULL;
    loomResult_t r = loomCommInitRank(&lc, nranks, lid, rank);
    if (r != loomSuccess)
        return from_loom(r, "CommInitRank");
    struct loom_nccl_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        loomCommDestroy(lc);
        return fail(2, "CommInitRank: out of memory");
    }
    c->magic = COMM_MAGIC;
    c->loom = lc;
    c->rank = rank;
    c->nranks = nranks;
    *comm = c;
    return LOOM_NCCL_SUCCESS;
}

static loom_nccl_result_t finish(loom_nccl_comm_t comm, int abort, const char *what)
{
    loom_nccl_result_t rc = check_comm(comm, what);
    if (rc != LOOM_NCCL_SUCCESS)
        return rc;
    loomResult_t r = abort ? loomCommAbort(comm->loom) : loomCommDestroy(comm->loom);
    comm->magic = 0;
    free(comm);
    return from_loom(r, what);
}

EXPORT loom_nccl_result_t ncclCommDestroy(loom_nccl_comm_t comm)
{
    COUNT(CommDestroy);
    return finish(comm, 0, "CommDestroy");
}

EXPORT loom_nccl_result_t ncclCommAbort(loom_nccl_comm_t comm)
{
    COUNT(CommAbort);
    return finish(comm, 1, "CommAbort");
}

EXPORT loom_nccl_result_t ncclGroupStart(void)
{
    COUNT(GroupStart);
    return from_loom(loomGroupStart(), "GroupStart");
}

EXPORT loom_nccl_result_t ncclGroupEnd(void)
{
    COUNT(GroupEnd);
    return from_loom(loomGroupEnd(), "GroupEnd");
}

/* Every byte the transport moves is ncclUint8. */
#define CALL(name, comm, stream, dt, expr)                                                         \
    do {                                                                                           \
        COUNT(name);                                                                               \
        loom_nccl_result_t rc_ = check_comm((comm), #name);                                        \
        if (rc_ == LOOM_NCCL_SUCCESS && (dt) != LOOM_NCCL_UINT8)                                   \
            rc_ = fail(4, #name ": datatype %d (the transport moves ncclUint8)", (dt));            \
        if (rc_ == LOOM_NCCL_SUCCESS)                                                              \
            rc_ = sync_stream((stream), #name);                                                    \
        return rc_ != LOOM_NCCL_SUCCESS ? rc_ : from_loom((expr), #name);                          \
    } while (0)

EXPORT loom_nccl_result_t ncclSend(const void *buf, size_t count, int dt, int peer,
                                   loom_nccl_comm_t comm, void *stream)
{
    CALL(Send, comm, stream, dt, loomSend(buf, count, loomUint8, peer, comm->loom, NULL));
}

EXPORT loom_nccl_result_t ncclRecv(void *buf, size_t count, int dt, int peer, loom_nccl_comm_t comm,
                                   void *stream)
{
    CALL(Recv, comm, stream, dt, loomRecv(buf, count, loomUint8, peer, comm->loom, NULL));
}

EXPORT loom_nccl_result_t ncclAllGather(const void *sendbuf, void *recvbuf, size_t count, int dt,
                                        loom_nccl_comm_t comm, void *stream)
{
    CALL(AllGather, comm, stream, dt,
         loomAllGather(sendbuf, recvbuf, count, loomUint8, comm->loom, NULL));
}

EXPORT loom_nccl_result_t ncclBroadcast(const void *sendbuf, void *recvbuf, size_t count, int dt,
                                        int root, loom_nccl_comm_t comm, void *stream)
{
    CALL(Broadcast, comm, stream, dt,
         loomBroadcast(sendbuf, recvbuf, count, loomUint8, root, comm->loom, NULL));
}

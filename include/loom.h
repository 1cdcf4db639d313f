/* SPDX-License-Identifier: Apache-2.0
 *
 * loom.h - the public API of loom, a collective-communication library.
 *
 * The calls mirror NCCL's one for one (same argument order, same in-place
 * conventions, same result codes), so that code written for NCCL ports by
 * renaming. Buffers are host memory, or device memory where loom has a
 * device runtime (CUDA, docs/gpu.md): every call takes either, in any mix. A
 * NULL stream means "complete before returning"; a loomStream_t is an
 * ordered asynchronous queue, its own or a CUDA stream it wraps.
 *
 * Thread safety: a communicator may be used from several threads; calls on it
 * execute in the order they were issued (the order the library observes), and
 * every rank must issue collectives on a communicator in the same order, as
 * with NCCL. loomCommAbort may be called from any thread at any time.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAJOR            0
#define LOOM_MINOR            1
#define LOOM_PATCH            0
#define LOOM_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define LOOM_VERSION_CODE     LOOM_VERSION(LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH)

#if defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

/* Result codes: NCCL's values and order, plus loomTimeout.
 * loomTimeout's value, 8, is ncclNumResults in NCCL's enum (NCCL has no
 * timeout code), so a layer that turns loom results into NCCL's must map it
 * deliberately rather than cast it: loom recommends ncclRemoteError, since a
 * wait times out when a peer stops making progress, the case NCCL reports as
 * a remote error. loomNumResults (9) is past the end of both enums. */
typedef enum {
    loomSuccess = 0,              /* no error */
    loomUnhandledDeviceError = 1, /* a device (CUDA) call failed */
    loomSystemError = 2,          /* a system call failed (errno text in the last error) */
    loomInternalError = 3,        /* a bug in loom: please report it */
    loomInvalidArgument = 4,      /* an argument is wrong (the last error names it) */
    loomInvalidUsage = 5,         /* the calls are used in a wrong order or combination */
    loomRemoteError = 6,          /* a peer died, closed its connection or broke protocol */
    loomInProgress = 7,           /* an asynchronous operation has not finished yet */
    loomTimeout = 8,              /* a wait exceeded the communicator's timeout */
    loomNumResults = 9
} loomResult_t;

/* Datatypes: NCCL's numbering. */
typedef enum {
    loomInt8 = 0,
    loomChar = 0,
    loomUint8 = 1,
    loomInt32 = 2,
    loomInt = 2,
    loomUint32 = 3,
    loomInt64 = 4,
    loomUint64 = 5,
    loomFloat16 = 6,
    loomHalf = 6,
    loomFloat32 = 7,
    loomFloat = 7,
    loomFloat64 = 8,
    loomDouble = 8,
    loomBfloat16 = 9,
    loomFloat8e4m3 = 10, /* OCP FP8 E4M3 (no infinities, max 448); conversions saturate */
    loomFloat8e5m2 = 11, /* OCP FP8 E5M2 (max 57344); conversions saturate to finite */
    loomNumTypes = 12
} loomDataType_t;

/* Reduction operations: NCCL's numbering. Avg sums, then divides once by the rank count. */
typedef enum {
    loomSum = 0,
    loomProd = 1,
    loomMax = 2,
    loomMin = 3,
    loomAvg = 4,
    loomNumOps = 5
} loomRedOp_t;

#define LOOM_UNIQUE_ID_BYTES 128
/* Opaque rendezvous handle: the root's address, port and a random 128-bit job
 * secret. Create it on one rank and pass it to every rank out of band. */
typedef struct {
    char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

typedef struct loomComm *loomComm_t;
typedef struct loomStream *loomStream_t;
#define LOOM_COMM_NULL     ((loomComm_t)NULL)
#define LOOM_SPLIT_NOCOLOR (-1)

#define LOOM_CONFIG_MAGIC     0x100f100fu
#define LOOM_CONFIG_UNDEF_INT (-2147483647 - 1)

/* Communicator options. Always start from LOOM_CONFIG_INITIALIZER: the size,
 * magic and version header lets newer libraries accept older structs. A field
 * left undefined takes its environment variable, then its default. */
typedef struct loomConfig_v1 {
    size_t size;          /* sizeof(loomConfig_t), set by the initializer */
    unsigned int magic;   /* LOOM_CONFIG_MAGIC */
    unsigned int version; /* LOOM_VERSION_CODE of the headers the caller built with */
    int blocking;         /* 1 (default): init blocks. 0 is accepted and behaves as 1 */
    int timeout_ms;       /* bound on every wait; default LOOM_TIMEOUT_MS (300000 ms) */
    const char *net;      /* "shm,tcp" style list of allowed transports; NULL = LOOM_NET */
    const char *commName; /* name used in log lines; NULL = none */
} loomConfig_t;

#define LOOM_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, LOOM_CONFIG_UNDEF_INT,         \
            LOOM_CONFIG_UNDEF_INT, NULL, NULL                                                      \
    }

/* ---- Version and errors ------------------------------------------------ */

/* Stores LOOM_VERSION_CODE of the library in *version. Errors: InvalidArgument (NULL). */
LOOM_API loomResult_t loomGetVersion(int *version);
/* The fixed text of a result code; never NULL. Thread safe. */
LOOM_API const char *loomGetErrorString(loomResult_t result);
/* The message of the last failure seen by the calling thread (comm may be NULL),
 * naming what was wrong: rank, sizes, errno text. Empty string if none. */
LOOM_API const char *loomGetLastError(loomComm_t comm);

/* ---- Communicators ----------------------------------------------------- */

/* Creates a unique id and starts, in the calling process, the rendezvous
 * service that the ranks of one communicator will contact. Call it once per
 * communicator, on one process that stays alive until init completes.
 * Non-blocking. Errors: InvalidArgument, SystemError (no usable interface). */
LOOM_API loomResult_t loomGetUniqueId(loomUniqueId *uniqueId);

/* Creates this rank's handle of a communicator of nranks ranks. Blocks until
 * every rank has joined and connections are up, or the timeout passes
 * (Timeout, naming the ranks that never arrived). Collective over all ranks.
 * Errors: InvalidArgument (nranks < 1, rank out of range, bad id),
 * SystemError, RemoteError, Timeout. */
LOOM_API loomResult_t loomCommInitRank(loomComm_t *comm, int nranks, loomUniqueId commId, int rank);
/* As loomCommInitRank with options; config may be NULL. */
LOOM_API loomResult_t loomCommInitRankConfig(loomComm_t *comm, int nranks, loomUniqueId commId,
                                             int rank, loomConfig_t *config);
/* Creates the world communicator from the launcher's environment. Tried in
 * order: LOOM_RANK/LOOM_WORLD_SIZE/LOOM_LOCAL_RANK/LOOM_COMM_ID (host:port);
 * torchrun's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; Slurm's
 * SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; Open MPI's OMPI_COMM_WORLD_RANK/
 * _SIZE/_LOCAL_RANK (the last two take the address from LOOM_COMM_ID or
 * MASTER_ADDR/MASTER_PORT). Rank 0 serves the rendezvous at that address. The
 * job secret comes from LOOM_SECRET (32 hex digits) when set, else from the
 * file LOOM_SECRET_FILE names (docs/security.md); without either it is derived
 * from the address, which does not keep out whoever can reach it. Blocking,
 * collective. Errors: InvalidArgument (no or inconsistent variables, named; a
 * secret file that is not the user's own, private, regular file). */
LOOM_API loomResult_t loomCommInitFromEnv(loomComm_t *comm);

/* Splits comm as MPI_Comm_split: ranks with the same color form a new
 * communicator, ordered by key then by rank in comm. color < 0
 * (LOOM_SPLIT_NOCOLOR) gives *newcomm = NULL. Collective over comm; blocking.
 * config may be NULL (inherits comm's). */
LOOM_API loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t *newcomm,
                                    loomConfig_t *config);
/* Waits for this rank's pending operations, then frees the communicator.
 * Not collective: peers may destroy at different times. NULL is a no-op.
 * Operations recorded in a group that is still open are not pending (they
 * are not waited for; see loomGroupEnd). Every later call with the handle,
 * this one included, returns InvalidArgument. */
LOOM_API loomResult_t loomCommDestroy(loomComm_t comm);
/* Stops every pending operation on comm (they return RemoteError or the
 * error that stopped them), then frees it. Callable from any thread, also
 * one with an open group that recorded operations on comm; never waits for
 * peers, nor for such a group. NULL is a no-op. Later calls with the handle
 * return InvalidArgument. */
LOOM_API loomResult_t loomCommAbort(loomComm_t comm);
/* Revokes comm after a failure is known: every operation pending on it (on
 * any thread or stream) fails at once with RemoteError, every later one with
 * RemoteError without running, and each peer's operations waiting on this
 * rank fail with RemoteError naming it, so that the whole job learns of the
 * failure within its detection time instead of a timeout. Returns once no
 * operation of this rank is in progress on comm. Afterwards only
 * loomCommShrink, loomCommDestroy, loomCommAbort and the queries are useful.
 * flags must be LOOM_REVOKE_DEFAULT. Not collective; calling it again is a
 * no-op. Errors: InvalidArgument (dead handle, flags). */
#define LOOM_REVOKE_DEFAULT 0
LOOM_API loomResult_t loomCommRevoke(loomComm_t comm, int flags);

/* Makes *newcomm from the ranks of comm that are not excluded, renumbered in
 * their order in comm (as loomCommSplit with one color would), without the
 * excluded ranks and without comm's connections: the survivors meet at a
 * rendezvous that each rank opened when comm was created, led by the lowest
 * surviving rank. Collective over the survivors only.
 *
 * flags LOOM_SHRINK_DEFAULT, after a failure: comm is revoked first
 * (loomCommRevoke), and the excluded ranks may be dead or hung. With
 * nExclude 0 (excludeRanks may be NULL) loom finds the dead ranks itself:
 * a rank is dead when its process no longer holds its rendezvous (a
 * connection to it is refused), which every survivor sees alike once the
 * process is gone. flags LOOM_SHRINK_PLANNED, a planned removal: comm stays
 * usable and nExclude must be > 0.
 *
 * Every survivor must pass the same set (and make as many shrinks of comm as
 * the others): survivors that disagree cannot authenticate to one another's
 * rendezvous, and fail (InvalidUsage or Timeout) instead of building
 * different communicators. The excluded ranks' resources (connections,
 * shared memory) go with comm, which the caller still destroys or aborts;
 * call loomCommShrink before that. config NULL inherits comm's timeout and
 * transports. Errors: InvalidArgument (dead handle, NULL newcomm, a rank out
 * of range or listed twice, this rank in the list, bad flags), InvalidUsage,
 * SystemError, RemoteError, Timeout; *newcomm is NULL on error. */
#define LOOM_SHRINK_DEFAULT 0
#define LOOM_SHRINK_PLANNED 1
LOOM_API loomResult_t loomCommShrink(loomComm_t comm, const int *excludeRanks, int nExclude,
                                     loomComm_t *newcomm, loomConfig_t *config, int flags);
/* The first asynchronous failure of an operation queued on a stream for this
 * communicator (Success if none). Non-blocking; thread safe. */
LOOM_API loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t *asyncError);
LOOM_API loomResult_t loomCommCount(const loomComm_t comm, int *count);
LOOM_API loomResult_t loomCommUserRank(const loomComm_t comm, int *rank);

/* ---- Streams ----------------------------------------------------------- */

/* An ordered asynchronous queue: operations given a stream return at once and
 * run in order on a worker thread. Errors: SystemError. */
LOOM_API loomResult_t loomStreamCreate(loomStream_t *stream);
/* Refuses further operations, waits for the queued ones, then frees the
 * stream. Returns the first error among them. Later calls with the handle,
 * and calls that find the stream being destroyed, return InvalidArgument. */
LOOM_API loomResult_t loomStreamDestroy(loomStream_t stream);
/* Blocks until every operation queued so far has finished. Returns the first
 * error among them since the last synchronize (then clears it). */
LOOM_API loomResult_t loomStreamSynchronize(loomStream_t stream);
/* Non-blocking: Success if the stream is idle, InProgress if it still has
 * work, or the error of a failed operation. */
LOOM_API loomResult_t loomStreamQuery(loomStream_t stream);
/* A host function queued on a stream (loomStreamLaunchHostFunc). status is
 * Success, or the first error among the operations queued on the stream
 * since the previous host function; inside fn, loomGetLastError(NULL) has
 * its text. */
typedef void (*loomHostFn_t)(void *userData, loomResult_t status);
/* Queues fn(userData, status) after everything queued on the stream so far,
 * as cudaLaunchHostFunc does: it runs on the stream's worker thread, and what
 * is queued after it waits for it. It is how a caller learns that one batch
 * of operations finished, and with what result, without synchronizing the
 * whole stream. fn must not synchronize, destroy or queue on this stream.
 * Errors: InvalidArgument (fn or stream not valid), InvalidUsage (inside an
 * open group, whose operations are queued only at loomGroupEnd), SystemError
 * (out of memory). */
LOOM_API loomResult_t loomStreamLaunchHostFunc(loomStream_t stream, loomHostFn_t fn,
                                               void *userData);
/* Whether handle is a live loom stream (made by loomStreamCreate and not yet
 * destroyed): *live = 1 or 0. Compares the address only, never dereferences
 * it, and logs nothing, so that a layer handed an opaque stream (a CUDA
 * stream, say) can ask whose it is. The answer may be stale as soon as it is
 * given if another thread destroys the stream. Errors: InvalidArgument (live
 * is NULL). */
LOOM_API loomResult_t loomStreamIsLive(const void *handle, int *live);

/* ---- Device buffers (docs/gpu.md) --------------------------------------
 * Where loom has a device runtime - built with the cuda feature and the
 * application's process uses CUDA (the driver is loaded when the
 * communicator is created), or LOOM_DEVICE=emulated, CI's stand-in - every
 * call accepts device memory for any buffer, told apart from host memory by
 * its address. Results are the same bits as with host buffers.
 * loomCommDeviceRuntime and loomCommDevicePlan (Introspection, below) say
 * whether a communicator has this path and which transport runs a call. */

/* Wraps a CUDA stream (a cudaStream_t; NULL is CUDA's default stream) in a
 * loom stream: a call given it runs after the work queued on cudaStream
 * before the call and before the work queued there after it, and returns
 * once queued, as an NCCL call does. loomStreamSynchronize and
 * loomStreamQuery cover the CUDA stream's work up to the last loom call;
 * loomStreamDestroy leaves the CUDA stream alone, which must outlive the
 * loom stream. With LOOM_DEVICE=emulated, cudaStream is a stream of the
 * emulation (NULL: its default stream). Errors: InvalidArgument (stream
 * NULL), InvalidUsage (no device runtime; the last error says why),
 * SystemError. */
LOOM_API loomResult_t loomStreamCreateFromCuda(loomStream_t *stream, void *cudaStream);
/* size bytes of device memory on the calling thread's current device
 * (cudaMalloc; the emulation's device memory with LOOM_DEVICE=emulated). size
 * 0 gives *ptr = NULL. Errors: InvalidArgument (ptr NULL), InvalidUsage (no
 * device runtime), UnhandledDeviceError, SystemError. */
LOOM_API loomResult_t loomMemAlloc(void **ptr, size_t size);
/* Frees what loomMemAlloc gave; NULL is a no-op. Errors: InvalidArgument (a
 * pointer loomMemAlloc did not give), UnhandledDeviceError. */
LOOM_API loomResult_t loomMemFree(void *ptr);

/* ---- Collectives (NCCL argument order) ---------------------------------
 * Every call: blocking when stream is NULL, otherwise queued on the stream.
 * count == 0 is valid. sendbuff is never written (out-of-place). Results are
 * bitwise identical on every rank and from run to run; reductions combine the
 * ranks' contributions in rank order 0, 1, ..., n-1 in the accumulator type
 * (float32 for float16/bfloat16/fp8, the datatype itself otherwise) and round
 * once per output element, so their bits depend on the inputs, datatype, op
 * and rank count alone, not on the transport, the hosts, the size or the
 * algorithm. LOOM_DETERMINISTIC=0 lets algorithms with an order of their own
 * run where faster (docs/ALGORITHMS.md, Determinism): results then stay
 * identical on every rank and run to run, but may change with the algorithm
 * chosen. Errors: InvalidArgument (NULL buffer with count > 0, bad
 * datatype/op/root, partially overlapping buffers, a buffer larger than 2^56
 * bytes), InvalidUsage, RemoteError, Timeout, SystemError.
 * Buffer sizes (here and for Send/Recv): no buffer may span more than 2^56
 * bytes, the user address space of a 64-bit process with 57-bit virtual
 * addresses (others have less), so a count that fits size_t but no real
 * memory is refused, on every rank alike, before any byte is touched. The
 * size is count x datatype size; times nranks for AllGather's recvbuff,
 * ReduceScatter's sendbuff and both buffers of AllToAll; (displacement +
 * count) x datatype size for each AllToAllv entry. */

/* recvbuff[i] = op over ranks of sendbuff[i], i < count. In place if equal. */
LOOM_API loomResult_t loomAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                    loomStream_t stream);
/* recvbuff[r*sendcount + i] = sendbuff of rank r [i]. In place if
 * sendbuff == recvbuff + rank*sendcount (in elements). */
LOOM_API loomResult_t loomAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
/* recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i]. In place if
 * recvbuff == sendbuff + rank*recvcount (in elements). */
LOOM_API loomResult_t loomReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                                        loomStream_t stream);
/* Uneven AllGather, as MPI_Allgatherv: rank r's sendcount (which must equal
 * recvcounts[r]; zero is allowed) elements land at recvbuff + displs[r] on
 * every rank. recvcounts and displs ([nranks], in elements) must be the same
 * on every rank; the blocks must not overlap. In place if
 * sendbuff == recvbuff + displs[rank]. */
LOOM_API loomResult_t loomAllGatherV(const void *sendbuff, size_t sendcount, void *recvbuff,
                                     const size_t recvcounts[], const size_t displs[],
                                     loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
/* Uneven ReduceScatter, as MPI_Reduce_scatter: sendbuff holds
 * sum(recvcounts) elements, rank r's block starting at the prefix sum
 * recvcounts[0] + ... + recvcounts[r-1]; recvbuff[i] = op over ranks of
 * their block `rank`[i], i < recvcounts[rank] (zero is allowed). recvcounts
 * ([nranks]) must be the same on every rank. In place if recvbuff ==
 * sendbuff + that prefix sum for rank. */
LOOM_API loomResult_t loomReduceScatterV(const void *sendbuff, void *recvbuff,
                                         const size_t recvcounts[], loomDataType_t datatype,
                                         loomRedOp_t op, loomComm_t comm, loomStream_t stream);
/* Copies root's sendbuff to every rank's recvbuff; sendbuff is read on root only. */
LOOM_API loomResult_t loomBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t datatype, int root, loomComm_t comm,
                                    loomStream_t stream);
/* On root, recvbuff[i] = op over ranks of sendbuff[i]; recvbuff is ignored elsewhere. */
LOOM_API loomResult_t loomReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 loomDataType_t datatype, loomRedOp_t op, int root, loomComm_t comm,
                                 loomStream_t stream);
/* Block j of sendbuff (count elements) goes to rank j's block `rank` of recvbuff. */
LOOM_API loomResult_t loomAllToAll(const void *sendbuff, void *recvbuff, size_t count,
                                   loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
/* Per-peer counts and displacements (in elements), as MPI_Alltoallv: sendcounts[j]
 * elements from sendbuff + sdispls[j] go to rank j, which receives them at
 * recvbuff + rdispls[rank]; recvcounts[j] must equal rank j's sendcounts[rank]. */
LOOM_API loomResult_t loomAllToAllv(const void *sendbuff, const size_t sendcounts[],
                                    const size_t sdispls[], void *recvbuff,
                                    const size_t recvcounts[], const size_t rdispls[],
                                    loomDataType_t datatype, loomComm_t comm, loomStream_t stream);
/* Point to point. Sends to and receives from the same peer match in order;
 * count and datatype must agree. Outside a group, Send may block until the
 * peer receives: pair Sends and Recvs in a group to avoid deadlock. */
LOOM_API loomResult_t loomSend(const void *sendbuff, size_t count, loomDataType_t datatype,
                               int peer, loomComm_t comm, loomStream_t stream);
LOOM_API loomResult_t loomRecv(void *recvbuff, size_t count, loomDataType_t datatype, int peer,
                               loomComm_t comm, loomStream_t stream);
/* Returns once every rank has entered the barrier. */
LOOM_API loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream);

/* Groups: calls between GroupStart and GroupEnd are only recorded; GroupEnd
 * starts them together, so any mix of Send/Recv and collectives completes
 * whatever order the ranks posted them in (collectives must still be in the
 * same order on every rank). Groups nest; the outermost GroupEnd runs them.
 * Per thread. Errors from GroupEnd are those of the recorded calls, and
 * InvalidArgument for the calls recorded on a communicator or for a stream
 * that was destroyed or aborted before GroupEnd: those are not run (the
 * group's other calls are). */
LOOM_API loomResult_t loomGroupStart(void);
LOOM_API loomResult_t loomGroupEnd(void);

/* ---- Introspection ------------------------------------------------------ */

/* The collectives that loomCommPlan describes. */
typedef enum {
    loomCollAllReduce = 0,
    loomCollAllGather = 1,
    loomCollReduceScatter = 2,
    loomCollBroadcast = 3,
    loomCollReduce = 4,
    loomCollAllToAll = 5,
    loomNumCollectives = 6
} loomCollective_t;

/* What a call of `collective` with this count (the call's own count argument)
 * and datatype would run on comm now: *algorithm (may be NULL) gets the
 * algorithm's name as LOOM_ALGO spells it (static storage; LOOM_ALGO is
 * honoured), *predicted_us (may be NULL) the cost model's predicted time (for
 * the shared-memory family, of the variant it picks for this size), or -1
 * where nothing is predicted (one rank). Local: no communication. Errors:
 * InvalidArgument. */
LOOM_API loomResult_t loomCommPlan(loomComm_t comm, loomCollective_t collective, size_t count,
                                   loomDataType_t datatype, const char **algorithm,
                                   double *predicted_us);

/* The device runtime under comm's device path, "cuda" or "emulated" (static
 * storage), or NULL when comm has none: it was created while this process,
 * or another of its ranks, had no device runtime, so its calls take host
 * memory only. comm NULL: the
 * process's device runtime, which a communicator created now would use
 * (looked for again while there is none, as creation does). why (may be
 * NULL; whyLen bytes) gets "" with a runtime, else the reason, e.g.
 * "LOOM_DEVICE=none" or "built without the cuda feature". Local; logs
 * nothing; for a communicator the same on every rank. Errors:
 * InvalidArgument (dead handle, runtime NULL). */
LOOM_API loomResult_t loomCommDeviceRuntime(loomComm_t comm, const char **runtime, char *why,
                                            size_t whyLen);
/* Which transport of comm's device path would run a call of `collective`
 * (datatype; op for the reductions, ignored by the others) on device
 * memory: *transport (may be NULL) "ipc", "nccl" or "staged" (static
 * storage), or NULL when none would (comm has no device path, or none of
 * its transports runs the call); *capturable (may be NULL) 1 when a CUDA
 * graph may capture the call there (ipc and nccl; staged cannot be
 * captured), else 0; why (may be NULL; whyLen bytes) the reason of the
 * choice, or why there is none. Groups, Send/Recv and Echo on device memory
 * always run on the staged transport. Local; logs nothing; the same on
 * every rank. Errors: InvalidArgument (dead handle, collective, datatype or
 * op out of range). */
LOOM_API loomResult_t loomCommDevicePlan(loomComm_t comm, loomCollective_t collective,
                                         loomDataType_t datatype, loomRedOp_t op,
                                         const char **transport, int *capturable, char *why,
                                         size_t whyLen);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */

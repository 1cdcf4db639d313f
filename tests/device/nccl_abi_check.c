/* SPDX-License-Identifier: Apache-2.0
 *
 * nccl_abi_check.c - compiled only where nccl.h is found: the nccl device transport declares
 * the part of NCCL's C ABI it uses itself (src/device/transport/devtp_nccl.h, so that loom
 * builds without nccl.h); this file fails to compile if that view disagrees with the real
 * header. Linked into the device tests, it has nothing to run.
 */
#include <nccl.h>

#include "devtp_nccl.h"
#include "loom.h"

_Static_assert(sizeof(loom_nccl_id_t) == sizeof(ncclUniqueId), "ncclUniqueId's size");
_Static_assert(_Alignof(loom_nccl_id_t) == _Alignof(ncclUniqueId), "ncclUniqueId's alignment");
_Static_assert(sizeof(loom_nccl_result_t) == sizeof(ncclResult_t), "ncclResult_t's size");
_Static_assert(sizeof(int) == sizeof(ncclDataType_t), "ncclDataType_t's size");
_Static_assert(LOOM_NCCL_SUCCESS == ncclSuccess, "ncclSuccess");
_Static_assert(LOOM_NCCL_UINT8 == ncclUint8, "ncclUint8");
_Static_assert(sizeof(void *) == sizeof(cudaStream_t), "cudaStream_t");
/* loom_devtp_nccl_fail turns NCCL's results into loom's by number. */
_Static_assert((int)ncclUnhandledCudaError == (int)loomUnhandledDeviceError &&
                   (int)ncclSystemError == (int)loomSystemError &&
                   (int)ncclInternalError == (int)loomInternalError &&
                   (int)ncclInvalidArgument == (int)loomInvalidArgument &&
                   (int)ncclInvalidUsage == (int)loomInvalidUsage &&
                   (int)ncclRemoteError == (int)loomRemoteError &&
                   (int)ncclInProgress == (int)loomInProgress,
               "NCCL's and loom's result numbers");

/* Each function the transport takes has the parameter list it declares, up to the handle,
 * enum and stream types checked above. */
#define SAME(fn, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn)
SAME(ncclGetVersion, ncclResult_t (*)(int *));
SAME(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId *));
SAME(ncclCommInitRank, ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int));
SAME(ncclCommAbort, ncclResult_t (*)(ncclComm_t));
SAME(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
SAME(ncclGroupStart, ncclResult_t (*)(void));
SAME(ncclGroupEnd, ncclResult_t (*)(void));
SAME(ncclSend,
     ncclResult_t (*)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
SAME(ncclRecv, ncclResult_t (*)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
SAME(ncclAllGather,
     ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
SAME(ncclBroadcast,
     ncclResult_t (*)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
SAME(ncclGetErrorString, const char *(*)(ncclResult_t));
SAME(ncclGetLastError, const char *(*)(ncclComm_t));

int loom_test_nccl_abi_checked(void);
int loom_test_nccl_abi_checked(void)
{
    return 1;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_cuda_emu.c - libfake-cuda-emu.so, SONAME libcuda.so.1: the four CUDA
 * driver functions the drop-in NCCL library asks a loaded driver for,
 * answered from loom's emulated device runtime (LOOM_DEVICE=emulated) as a
 * real driver answers for a GPU, so that the library's device path is tested
 * on machines without one. Device memory is the emulation's (what
 * loomMemAlloc, and so ncclMemAlloc, gives); a stream is a stream of the
 * emulation, CUDA's two default streams being its default stream; a handle
 * the emulation does not know is an invalid handle, as the driver says; the
 * current device is the emulation's. It is linked against
 * tests/nccl_shim/emu's libloom.so.0, which exports the emulation
 * (emu_hooks.h), and must share that libloom with the library: the test puts
 * that directory first on LD_LIBRARY_PATH. A program reaches the emulation's
 * streams through this library's handle (dlsym of emuTestStreamCreate and
 * the others, from its dependency), as a CUDA program calls the runtime.
 * Test-only: never installed.
 */
#include <stddef.h>
#include <stdint.h>

#include "emu_hooks.h"

#define EXPORT __attribute__((visibility("default")))

enum { FAKE_SUCCESS = 0, FAKE_INVALID_VALUE = 1, FAKE_INVALID_HANDLE = 400 };

/* cudaStreamLegacy and cudaStreamPerThread: the emulation has one default stream. */
static void *stream_of(void *s)
{
    return (uintptr_t)s == 0x1 || (uintptr_t)s == 0x2 ? NULL : s;
}

EXPORT int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (attribute != 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */)
        return FAKE_INVALID_VALUE;
    if (emuTestPtrDevice((const void *)(uintptr_t)ptr) < 0)
        return FAKE_INVALID_VALUE; /* what the driver says of host memory it never saw */
    *(unsigned int *)data = 2;     /* CU_MEMORYTYPE_DEVICE */
    return FAKE_SUCCESS;
}

EXPORT int cuStreamIsCapturing(void *stream, int *status)
{
    int capturing = 0;
    if (emuTestStreamCapturing(stream_of(stream), &capturing) != 0)
        return FAKE_INVALID_HANDLE;
    *status = capturing ? 1 /* ACTIVE */ : 0 /* NONE */;
    return FAKE_SUCCESS;
}

EXPORT int cuStreamSynchronize(void *stream)
{
    return emuTestStreamSynchronize(stream_of(stream)) == 0 ? FAKE_SUCCESS : FAKE_INVALID_HANDLE;
}

EXPORT int cuCtxGetDevice(int *device)
{
    return emuTestCurrentDevice(device) == 0 ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

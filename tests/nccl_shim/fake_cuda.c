/* SPDX-License-Identifier: Apache-2.0
 *
 * fake_cuda.c - libfake-cuda.so, SONAME libcuda.so.1: the four CUDA driver
 * functions the drop-in NCCL library asks a loaded driver for, so that its
 * handling of device buffers, CUDA streams and stream capture is tested on
 * machines without a GPU. A rank process loads it (dlopen by path); the
 * library then finds it as libcuda.so.1 already loaded. Memory is "device
 * memory" inside the range fakeCudaSetDeviceRange names; stream 0x1000 is
 * being captured, 0x2000 is an idle stream, CUDA's two default streams exist,
 * every other value is an invalid handle; the current device is 3.
 * cuStreamSynchronize calls are counted. Test-only: never installed.
 */
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

enum { FAKE_SUCCESS = 0, FAKE_INVALID_VALUE = 1, FAKE_INVALID_HANDLE = 400 };

static uintptr_t dev_lo, dev_hi;
static int syncs;

EXPORT void fakeCudaSetDeviceRange(const void *p, size_t n)
{
    dev_lo = (uintptr_t)p;
    dev_hi = dev_lo + n;
}

EXPORT int fakeCudaSyncCount(void)
{
    return __atomic_load_n(&syncs, __ATOMIC_RELAXED);
}

EXPORT int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (attribute != 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */)
        return FAKE_INVALID_VALUE;
    if (ptr < dev_lo || ptr >= dev_hi)
        return FAKE_INVALID_VALUE; /* what the driver says of host memory it never saw */
    *(unsigned int *)data = 2;     /* CU_MEMORYTYPE_DEVICE */
    return FAKE_SUCCESS;
}

static int known(uintptr_t s)
{
    return s == 0x1 || s == 0x2 || s == 0x1000 || s == 0x2000;
}

EXPORT int cuStreamIsCapturing(void *stream, int *status)
{
    if (!known((uintptr_t)stream))
        return FAKE_INVALID_HANDLE;
    *status = (uintptr_t)stream == 0x1000 ? 1 /* ACTIVE */ : 0 /* NONE */;
    return FAKE_SUCCESS;
}

EXPORT int cuStreamSynchronize(void *stream)
{
    if (!known((uintptr_t)stream))
        return FAKE_INVALID_HANDLE;
    __atomic_add_fetch(&syncs, 1, __ATOMIC_RELAXED);
    return FAKE_SUCCESS;
}

EXPORT int cuCtxGetDevice(int *device)
{
    *device = 3;
    return FAKE_SUCCESS;
}

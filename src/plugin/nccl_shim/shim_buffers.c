/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_buffers.c - device pointers, streams and the current device through
 * the CUDA driver, found only if the process already loaded it (shim_buffers.h).
 * The few prototypes and constants of the driver API are declared here: the
 * library must load and run where CUDA is not installed at all.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "shim_buffers.h"
#include "shim_comm.h"

/* The driver API's types and values (cuda.h), spelled here. */
typedef int cu_result_t;             /* CUresult; 0 is CUDA_SUCCESS */
typedef unsigned long long cu_ptr_t; /* CUdeviceptr on 64-bit targets */
typedef void *cu_stream_t;           /* CUstream */
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE             2
#define CU_MEMORYTYPE_UNIFIED            4
#define CU_STREAM_CAPTURE_STATUS_NONE    0
/* CUDA's special stream handles (runtime and driver agree). */
#define CU_STREAM_LEGACY     ((uintptr_t)0x1)
#define CU_STREAM_PER_THREAD ((uintptr_t)0x2)

typedef struct {
    cu_result_t (*pointer_get_attribute)(void *data, int attribute, cu_ptr_t ptr);
    cu_result_t (*stream_synchronize)(cu_stream_t stream);
    cu_result_t (*stream_is_capturing)(cu_stream_t stream, int *status);
    cu_result_t (*ctx_get_device)(int *device);
} cuda_api_t;

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static cuda_api_t cuda_api;
static int cuda_found; /* atomic: set once every function was found */

/* The loader's count of objects loaded so far (0 if it does not say). */
static int adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    const size_t need = offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds);
    *(unsigned long long *)data = size >= need ? info->dlpi_adds : 0;
    return 1; /* the first object says it */
}

static unsigned long long load_count(void)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_cb, &adds);
    return adds;
}

static unsigned long long looked_at; /* load_count() when the driver was last looked for */

/* The driver's functions if the process has loaded it. Looked for again
 * whenever something was loaded since the last look: CUDA is loaded lazily,
 * often after a framework's first collective. (A dlopen with RTLD_NOLOAD of a
 * bare name searches the library path, a dozen failed opens, so it is not
 * made per call.) The handle taken once found is kept for the life of the
 * process: the driver is never unloaded under a running program. */
static const cuda_api_t *cuda(void)
{
    if (__atomic_load_n(&cuda_found, __ATOMIC_ACQUIRE))
        return &cuda_api;
    const unsigned long long adds = load_count();
    if (adds != 0 && adds == __atomic_load_n(&looked_at, __ATOMIC_ACQUIRE))
        return NULL;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    __atomic_store_n(&looked_at, adds, __ATOMIC_RELEASE);
    if (h == NULL)
        return NULL;
    pthread_mutex_lock(&cuda_lock);
    if (!cuda_found) {
        cuda_api_t a;
        *(void **)&a.pointer_get_attribute = dlsym(h, "cuPointerGetAttribute");
        *(void **)&a.stream_synchronize = dlsym(h, "cuStreamSynchronize");
        *(void **)&a.stream_is_capturing = dlsym(h, "cuStreamIsCapturing");
        *(void **)&a.ctx_get_device = dlsym(h, "cuCtxGetDevice");
        if (a.pointer_get_attribute && a.stream_synchronize && a.stream_is_capturing &&
            a.ctx_get_device) {
            cuda_api = a;
            __atomic_store_n(&cuda_found, 1, __ATOMIC_RELEASE);
            h = NULL; /* kept */
        } else {
            shim_log(SHIM_LOG_WARN, "libcuda.so.1 is loaded but lacks the driver functions the "
                                    "shim needs: its buffers are taken for host memory");
        }
    }
    pthread_mutex_unlock(&cuda_lock);
    if (h != NULL)
        dlclose(h);
    return __atomic_load_n(&cuda_found, __ATOMIC_ACQUIRE) ? &cuda_api : NULL;
}

static int is_device_ptr(const cuda_api_t *c, const void *p)
{
    if (p == NULL)
        return 0;
    unsigned int type = 0;
    /* Host memory CUDA never saw gives an error: that is the host case. */
    if (c->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (cu_ptr_t)(uintptr_t)p) !=
        0)
        return 0;
    return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED;
}

int shim_any_device_ptr(const void *a, const void *b)
{
    if (a == NULL && b == NULL)
        return 0;
    /* One look for the driver per call: it walks the loader's list of objects. */
    const cuda_api_t *c = cuda();
    if (c == NULL)
        return 0;
    return is_device_ptr(c, a) || (b != a && is_device_ptr(c, b));
}

ncclResult_t shim_stream_classify(cudaStream_t stream, const char *fn, shim_stream_t *out)
{
    *out = (shim_stream_t){.kind = SHIM_STREAM_NONE, .capturing = 0, .loom = NULL};
    if (stream == NULL)
        return ncclSuccess;
    int live = 0;
    if (loomStreamIsLive((const void *)stream, &live) == loomSuccess && live) {
        out->kind = SHIM_STREAM_LOOM;
        out->loom = (loomStream_t)(void *)stream;
        return ncclSuccess;
    }
    const cuda_api_t *c = cuda();
    if (c == NULL) {
        /* CUDA's own default streams can be named without the driver; no work can be on them. */
        if ((uintptr_t)stream == CU_STREAM_LEGACY || (uintptr_t)stream == CU_STREAM_PER_THREAD)
            return ncclSuccess;
        return shim_fail(ncclInvalidArgument,
                         "%s: stream %p is neither a live loom stream nor a CUDA stream (the CUDA "
                         "driver is not loaded in this process)",
                         fn, (void *)stream);
    }
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    cu_result_t r = c->stream_is_capturing((cu_stream_t)stream, &status);
    if (r != 0)
        return shim_fail(ncclInvalidArgument,
                         "%s: stream %p is neither a live loom stream nor a stream the CUDA driver "
                         "knows (cuStreamIsCapturing: error %d)",
                         fn, (void *)stream, r);
    out->kind = SHIM_STREAM_CUDA;
    out->capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
    return ncclSuccess;
}

ncclResult_t shim_stream_sync(cudaStream_t stream, const char *fn)
{
    const cuda_api_t *c = cuda();
    if (c == NULL)
        return ncclSuccess;
    cu_result_t r = c->stream_synchronize((cu_stream_t)stream);
    if (r != 0)
        return shim_fail(ncclUnhandledCudaError, "%s: cuStreamSynchronize(%p) failed: error %d", fn,
                         (void *)stream, r);
    return ncclSuccess;
}

int shim_cuda_device(void)
{
    const cuda_api_t *c = cuda();
    int dev = 0;
    if (c == NULL || c->ctx_get_device(&dev) != 0)
        return 0;
    return dev;
}

int shim_cuda_loaded(void)
{
    return cuda() != NULL;
}

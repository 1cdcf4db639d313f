/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_cuda.c - the device runtime table (devrt.h) over the CUDA runtime
 * (static cudart), built with the cuda feature. The stream memory operations
 * (cuStreamWriteValue32 / cuStreamWaitValue32) and cuMemGetAddressRange are
 * driver calls: they are taken once from the driver through
 * cudaGetDriverEntryPointByVersion (cuda.h only gives their types), and where
 * the driver lacks one the table says so (memops_ok) and the calls needing it
 * fail. Every failing CUDA call gives UnhandledDeviceError with a WARN naming
 * the call and CUDA's text; pointers the runtime does not know give
 * InvalidArgument. loom_devrt_cuda offers the table only when the process
 * already loaded the CUDA driver and a device answers. Callers: devrt.c,
 * loom_info, the device tests.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "debug.h"
#include "dev_kernels.h"
#include "devrt.h"

/* The ABI version of the driver entry points asked for: CUDA 12.0's. */
#define DRV_ABI 12000

static loomResult_t cuda_fail(const char *call, cudaError_t e)
{
    (void)cudaGetLastError(); /* ours, not the application's: do not leave it behind */
    LOOM_WARN("CUDA: %s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
    return loomUnhandledDeviceError;
}

#define CUDA_TRY(_call, _name)                                                                     \
    do {                                                                                           \
        cudaError_t _e = (_call);                                                                  \
        if (_e != cudaSuccess)                                                                     \
            return cuda_fail((_name), _e);                                                         \
    } while (0)

static cudaStream_t cu_stream(loom_dev_stream_t s)
{
    return (cudaStream_t)s; /* NULL: the legacy default stream */
}

// ---- driver entry points ----------------------------------------------------

static struct {
    PFN_cuStreamWriteValue32_v11070 write_value32;
    PFN_cuStreamWaitValue32_v11070 wait_value32;
    PFN_cuMemGetAddressRange_v3020 get_address_range;
    PFN_cuGetErrorString_v6000 get_error_string;
    char memops_why[192]; /* why the stream memory operations are missing, "" if not */
    char range_why[192];  /* why cuMemGetAddressRange is missing, "" if not */
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *entry_point(const char *name, char *why, size_t why_len)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, DRV_ABI, cudaEnableDefault, &q);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "%s: cudaGetDriverEntryPointByVersion failed: %s", name,
                 cudaGetErrorString(e));
        return NULL;
    }
    if (q != cudaDriverEntryPointSuccess || fn == NULL) {
        snprintf(why, why_len, "%s: %s", name,
                 q == cudaDriverEntryPointVersionNotSufficent
                     ? "the driver is older than the version this build asks for"
                     : "the driver does not have it");
        return NULL;
    }
    return fn;
}

static void drv_load(void)
{
    char why[192] = "";
    drv.write_value32 =
        (PFN_cuStreamWriteValue32_v11070)entry_point("cuStreamWriteValue32", why, sizeof(why));
    if (drv.write_value32 != NULL)
        drv.wait_value32 =
            (PFN_cuStreamWaitValue32_v11070)entry_point("cuStreamWaitValue32", why, sizeof(why));
    if (drv.wait_value32 == NULL)
        snprintf(drv.memops_why, sizeof(drv.memops_why), "no stream memory operations (%s)", why);
    drv.get_address_range = (PFN_cuMemGetAddressRange_v3020)entry_point(
        "cuMemGetAddressRange", drv.range_why, sizeof(drv.range_why));
    char ignored[64];
    drv.get_error_string =
        (PFN_cuGetErrorString_v6000)entry_point("cuGetErrorString", ignored, sizeof(ignored));
    if (drv.memops_why[0] != '\0')
        LOOM_INFO(LOOM_LOG_INIT, "CUDA: %s: write_u32/wait_u32 will fail", drv.memops_why);
}

static loomResult_t drv_fail(const char *call, CUresult r)
{
    const char *text = NULL;
    if (drv.get_error_string == NULL || drv.get_error_string(r, &text) != CUDA_SUCCESS ||
        text == NULL)
        text = "unknown error";
    LOOM_WARN("CUDA: %s failed: %s (CUresult %d)", call, text, (int)r);
    return loomUnhandledDeviceError;
}

static int cuda_memops_ok(char *why, size_t why_len)
{
    pthread_once(&drv_once, drv_load);
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s", drv.memops_why);
    return drv.memops_why[0] == '\0';
}

// ---- devices and pointers -----------------------------------------------------

static int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static loomResult_t cuda_device_props(int dev, loom_dev_props_t *props)
{
    struct cudaDeviceProp p;
    if (props == NULL) {
        LOOM_WARN("CUDA: device_props given a NULL output");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    loom_dev_props_t out;
    memset(&out, 0, sizeof(out));
    snprintf(out.name, sizeof(out.name), "%.*s", (int)sizeof(out.name) - 1, p.name);
    CUDA_TRY(cudaDeviceGetPCIBusId(out.pci_bus_id, (int)sizeof(out.pci_bus_id), dev),
             "cudaDeviceGetPCIBusId");
    out.cc_major = p.major;
    out.cc_minor = p.minor;
    out.mem_bytes = p.totalGlobalMem;
    out.sm_count = p.multiProcessorCount;
    *props = out;
    return loomSuccess;
}

static loomResult_t cuda_current_device(int *dev)
{
    if (dev == NULL) {
        LOOM_WARN("CUDA: current_device given a NULL output");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaGetDevice(dev), "cudaGetDevice");
    return loomSuccess;
}

static int cuda_ptr_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (p == NULL)
        return -1;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

static loomResult_t cuda_ptr_base(const void *p, void **base, size_t *size)
{
    if (base == NULL || size == NULL) {
        LOOM_WARN("CUDA: ptr_base given a NULL output");
        return loomInvalidArgument;
    }
    if (cuda_ptr_device(p) < 0) {
        LOOM_WARN("CUDA: ptr_base: %p is not device memory", p);
        return loomInvalidArgument;
    }
    pthread_once(&drv_once, drv_load);
    if (drv.get_address_range == NULL) {
        LOOM_WARN("CUDA: ptr_base: %s", drv.range_why);
        return loomUnhandledDeviceError;
    }
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = drv.get_address_range(&b, &n, (CUdeviceptr)(uintptr_t)p);
    if (r != CUDA_SUCCESS)
        return drv_fail("cuMemGetAddressRange", r);
    *base = (void *)(uintptr_t)b;
    *size = n;
    return loomSuccess;
}

// ---- memory ---------------------------------------------------------------------

static loomResult_t cuda_mem_alloc(void **p, size_t size)
{
    if (p == NULL) {
        LOOM_WARN("CUDA: mem_alloc given a NULL output");
        return loomInvalidArgument;
    }
    if (size == 0) {
        *p = NULL;
        return loomSuccess;
    }
    void *q = NULL;
    CUDA_TRY(cudaMalloc(&q, size), "cudaMalloc");
    *p = q;
    return loomSuccess;
}

/* p must start device memory: cudaFree of anything else is refused here,
 * with a message, rather than reported as a device error. */
static loomResult_t check_base(const char *call, void *p)
{
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cuda_ptr_device(p) < 0) {
        LOOM_WARN("CUDA: %s(%p): not device memory", call, p);
        return loomInvalidArgument;
    }
    pthread_once(&drv_once, drv_load);
    if (drv.get_address_range == NULL)
        return loomSuccess; /* the CUDA call will judge */
    if (drv.get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
        base != (CUdeviceptr)(uintptr_t)p) {
        LOOM_WARN("CUDA: %s(%p): a pointer inside the allocation at %p (%zu bytes), not its "
                  "start",
                  call, p, (void *)(uintptr_t)base, size);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static loomResult_t cuda_mem_free(void *p)
{
    if (p == NULL)
        return loomSuccess;
    LOOM_CHECK(check_base("mem_free", p));
    CUDA_TRY(cudaFree(p), "cudaFree");
    return loomSuccess;
}

static loomResult_t cuda_host_alloc(void **p, size_t size)
{
    if (p == NULL) {
        LOOM_WARN("CUDA: host_alloc given a NULL output");
        return loomInvalidArgument;
    }
    if (size == 0) {
        *p = NULL;
        return loomSuccess;
    }
    void *q = NULL;
    /* Mapped: flag words there work with the stream memory operations. */
    CUDA_TRY(cudaHostAlloc(&q, size, cudaHostAllocPortable | cudaHostAllocMapped), "cudaHostAlloc");
    *p = q;
    return loomSuccess;
}

static loomResult_t cuda_host_free(void *p)
{
    struct cudaPointerAttributes a;
    if (p == NULL)
        return loomSuccess;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeHost) {
        (void)cudaGetLastError();
        LOOM_WARN("CUDA: host_free(%p): not pinned host memory of host_alloc", p);
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaFreeHost(p), "cudaFreeHost");
    return loomSuccess;
}

static loomResult_t cuda_host_map(void *p, size_t size, void **dev_p)
{
    if (p == NULL || size == 0 || dev_p == NULL) {
        LOOM_WARN("CUDA: host_map(%p, %zu bytes): %s", p, size,
                  dev_p == NULL ? "NULL output" : "no memory given");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaHostRegister(p, size, cudaHostRegisterMapped | cudaHostRegisterPortable),
             "cudaHostRegister");
    void *d = NULL;
    cudaError_t e = cudaHostGetDevicePointer(&d, p, 0);
    if (e != cudaSuccess) {
        loomResult_t res = cuda_fail("cudaHostGetDevicePointer", e);
        if (cudaHostUnregister(p) != cudaSuccess)
            (void)cudaGetLastError();
        return res;
    }
    *dev_p = d;
    return loomSuccess;
}

static loomResult_t cuda_host_unmap(void *p)
{
    if (p == NULL) {
        LOOM_WARN("CUDA: host_unmap(NULL)");
        return loomInvalidArgument;
    }
    cudaError_t e = cudaHostUnregister(p);
    if (e == cudaErrorHostMemoryNotRegistered) {
        (void)cudaGetLastError();
        LOOM_WARN("CUDA: host_unmap(%p): not memory of host_map", p);
        return loomInvalidArgument;
    }
    CUDA_TRY(e, "cudaHostUnregister");
    return loomSuccess;
}

// ---- streams and events -----------------------------------------------------------

static loomResult_t cuda_stream_create(loom_dev_stream_t *s)
{
    cudaStream_t cs = NULL;
    if (s == NULL) {
        LOOM_WARN("CUDA: stream_create given a NULL output");
        return loomInvalidArgument;
    }
    /* A blocking stream: it follows what the application queued on the legacy default stream. */
    CUDA_TRY(cudaStreamCreate(&cs), "cudaStreamCreate");
    *s = (loom_dev_stream_t)cs;
    return loomSuccess;
}

static loomResult_t cuda_stream_destroy(loom_dev_stream_t s)
{
    if (s == NULL) {
        LOOM_WARN("CUDA: stream_destroy: the default stream cannot be destroyed");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaStreamDestroy(cu_stream(s)), "cudaStreamDestroy");
    return loomSuccess;
}

/* cudaErrorNotReady is an answer, not a failure; it is still cleared. */
static loomResult_t ready_or(cudaError_t e, const char *call)
{
    if (e == cudaSuccess)
        return loomSuccess;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return loomInProgress;
    }
    return cuda_fail(call, e);
}

static loomResult_t cuda_stream_query(loom_dev_stream_t s)
{
    return ready_or(cudaStreamQuery(cu_stream(s)), "cudaStreamQuery");
}

static loomResult_t cuda_stream_capturing(loom_dev_stream_t s, int *capturing)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (capturing == NULL) {
        LOOM_WARN("CUDA: stream_capturing given a NULL output");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaStreamIsCapturing(cu_stream(s), &st), "cudaStreamIsCapturing");
    /* Invalidated is still a capture: work queued now would not run. */
    *capturing = st != cudaStreamCaptureStatusNone;
    return loomSuccess;
}

static loomResult_t cuda_memcpy_async(void *dst, const void *src, size_t n, loom_dev_stream_t s)
{
    if (n == 0)
        return loomSuccess;
    CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, cu_stream(s)), "cudaMemcpyAsync");
    return loomSuccess;
}

static loomResult_t cuda_write_u32(loom_dev_stream_t s, uint32_t *addr, uint32_t v)
{
    pthread_once(&drv_once, drv_load);
    if (drv.write_value32 == NULL) {
        LOOM_WARN("CUDA: write_u32: %s", drv.memops_why);
        return loomUnhandledDeviceError;
    }
    /* The default flags put a memory barrier before the write. */
    CUresult r = drv.write_value32((CUstream)cu_stream(s), (CUdeviceptr)(uintptr_t)addr, v,
                                   CU_STREAM_WRITE_VALUE_DEFAULT);
    return r == CUDA_SUCCESS ? loomSuccess : drv_fail("cuStreamWriteValue32", r);
}

static loomResult_t cuda_wait_u32(loom_dev_stream_t s, uint32_t *addr, uint32_t v)
{
    pthread_once(&drv_once, drv_load);
    if (drv.wait_value32 == NULL) {
        LOOM_WARN("CUDA: wait_u32: %s", drv.memops_why);
        return loomUnhandledDeviceError;
    }
    CUresult r = drv.wait_value32((CUstream)cu_stream(s), (CUdeviceptr)(uintptr_t)addr, v,
                                  CU_STREAM_WAIT_VALUE_GEQ);
    return r == CUDA_SUCCESS ? loomSuccess : drv_fail("cuStreamWaitValue32", r);
}

static loomResult_t cuda_event_create(loom_dev_event_t *e)
{
    cudaEvent_t ev = NULL;
    if (e == NULL) {
        LOOM_WARN("CUDA: event_create given a NULL output");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    *e = (loom_dev_event_t)ev;
    return loomSuccess;
}

static loomResult_t cuda_event_destroy(loom_dev_event_t e)
{
    if (e == NULL) {
        LOOM_WARN("CUDA: event_destroy(NULL)");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaEventDestroy((cudaEvent_t)e), "cudaEventDestroy");
    return loomSuccess;
}

static loomResult_t cuda_event_record(loom_dev_event_t e, loom_dev_stream_t s)
{
    if (e == NULL) {
        LOOM_WARN("CUDA: event_record of a NULL event");
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaEventRecord((cudaEvent_t)e, cu_stream(s)), "cudaEventRecord");
    return loomSuccess;
}

static loomResult_t cuda_event_query(loom_dev_event_t e)
{
    if (e == NULL) {
        LOOM_WARN("CUDA: event_query of a NULL event");
        return loomInvalidArgument;
    }
    return ready_or(cudaEventQuery((cudaEvent_t)e), "cudaEventQuery");
}

// ---- IPC ------------------------------------------------------------------------------

_Static_assert(sizeof(cudaIpcMemHandle_t) == LOOM_DEV_IPC_BYTES, "an IPC handle is 64 bytes");

static loomResult_t cuda_ipc_export(void *base, loom_dev_ipc_t *handle)
{
    cudaIpcMemHandle_t h;
    if (handle == NULL) {
        LOOM_WARN("CUDA: ipc_export given a NULL handle");
        return loomInvalidArgument;
    }
    LOOM_CHECK(check_base("ipc_export", base));
    CUDA_TRY(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle");
    memcpy(handle->bytes, &h, sizeof(h));
    return loomSuccess;
}

static loomResult_t cuda_ipc_open(const loom_dev_ipc_t *handle, void **p)
{
    cudaIpcMemHandle_t h;
    if (handle == NULL || p == NULL) {
        LOOM_WARN("CUDA: ipc_open given a NULL %s", handle == NULL ? "handle" : "output");
        return loomInvalidArgument;
    }
    memcpy(&h, handle->bytes, sizeof(h));
    void *q = NULL;
    CUDA_TRY(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    *p = q;
    return loomSuccess;
}

static loomResult_t cuda_ipc_close(void *p)
{
    if (cuda_ptr_device(p) < 0) {
        LOOM_WARN("CUDA: ipc_close(%p): not device memory", p);
        return loomInvalidArgument;
    }
    CUDA_TRY(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle");
    return loomSuccess;
}

// ---- kernels (dev_kernels.cu's launchers) ---------------------------------------------

/* A launcher's answer: 0 launched, -1 arguments refused, else a cudaError_t. */
static loomResult_t launched(int rc, const char *kernel)
{
    if (rc == 0)
        return loomSuccess;
    if (rc == -1) {
        LOOM_WARN("CUDA: the %s kernel refused its arguments (datatype, op or source count)",
                  kernel);
        return loomInvalidArgument;
    }
    char call[64];
    snprintf(call, sizeof(call), "launching the %s kernel", kernel);
    return cuda_fail(call, (cudaError_t)rc);
}

static loomResult_t cuda_reduce(loom_dev_stream_t s, loomDataType_t dt, loomRedOp_t op, void *dst,
                                const void *const *srcs, int nsrc, size_t n, int nranks)
{
    return launched(loom_dk_reduce(cu_stream(s), dt, op, dst, srcs, nsrc, n, nranks), "reduce");
}

static loomResult_t cuda_q4_encode(loom_dev_stream_t s, const void *src, loomDataType_t dt,
                                   const float *err_in, float *err_out, size_t n, uint8_t *dst)
{
    return launched(loom_dk_q4_encode(cu_stream(s), src, dt, err_in, err_out, n, dst), "q4_encode");
}

static loomResult_t cuda_q4_decode(loom_dev_stream_t s, const uint8_t *src, size_t n, void *dst,
                                   loomDataType_t dt)
{
    return launched(loom_dk_q4_decode(cu_stream(s), src, n, dst, dt), "q4_decode");
}

static loomResult_t cuda_q4_decode_acc(loom_dev_stream_t s, const uint8_t *src, size_t n,
                                       float *acc)
{
    return launched(loom_dk_q4_decode_acc(cu_stream(s), src, n, acc), "q4_decode_acc");
}

static loomResult_t cuda_cast(loom_dev_stream_t s, void *dst, loomDataType_t ddt, const void *src,
                              loomDataType_t sdt, size_t n)
{
    return launched(loom_dk_cast(cu_stream(s), dst, ddt, src, sdt, n), "cast");
}

static const loom_devrt_t cuda_table = {
    .name = "cuda",
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
    .current_device = cuda_current_device,
    .ptr_device = cuda_ptr_device,
    .ptr_base = cuda_ptr_base,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_map = cuda_host_map,
    .host_unmap = cuda_host_unmap,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_query = cuda_stream_query,
    .stream_capturing = cuda_stream_capturing,
    .memcpy_async = cuda_memcpy_async,
    .write_u32 = cuda_write_u32,
    .wait_u32 = cuda_wait_u32,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .reduce = cuda_reduce,
    .q4_encode = cuda_q4_encode,
    .q4_decode = cuda_q4_decode,
    .q4_decode_acc = cuda_q4_decode_acc,
    .cast = cuda_cast,
    .memops_ok = cuda_memops_ok,
};

const loom_devrt_t *loom_devrt_cuda(char *why, size_t why_len)
{
    char buf[256];
    if (why == NULL || why_len == 0) {
        why = buf;
        why_len = sizeof(buf);
    }
    /* Only a process that uses CUDA already: loom never loads the driver (and
     * never creates a context) for one that does not. */
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (h == NULL) {
        snprintf(why, why_len,
                 "the CUDA driver (libcuda.so.1) is not loaded in this process (loom uses CUDA "
                 "only where the application does)");
        return NULL;
    }
    dlclose(h);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return NULL;
    }
    if (n == 0) {
        snprintf(why, why_len, "no CUDA device");
        return NULL;
    }
    why[0] = '\0';
    return &cuda_table;
}

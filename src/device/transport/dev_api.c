/* SPDX-License-Identifier: Apache-2.0
 *
 * dev_api.c - loomMemAlloc and loomMemFree (include/loom.h, "Device
 * buffers"): device memory through the process's device runtime.
 */
#include <stdint.h>

#include "check.h"
#include "devrt.h"
#include "loom.h"

LOOM_API loomResult_t loomMemAlloc(void **ptr, size_t size)
{
    if (ptr == NULL) {
        LOOM_WARN("loomMemAlloc: ptr is NULL");
        return loomInvalidArgument;
    }
    *ptr = NULL;
    const loom_devrt_t *rt = loom_devrt();
    if (rt == NULL) {
        LOOM_WARN("loomMemAlloc: this process has no device runtime: %s", loom_devrt_why_none());
        return loomInvalidUsage;
    }
    if (size == 0)
        return loomSuccess;
    return rt->mem_alloc(ptr, size);
}

LOOM_API loomResult_t loomMemFree(void *ptr)
{
    if (ptr == NULL)
        return loomSuccess;
    const loom_devrt_t *rt = loom_devrt();
    if (rt == NULL || rt->ptr_device(ptr) < 0) {
        LOOM_WARN("loomMemFree: %p is not device memory that loomMemAlloc gave%s%s", ptr,
                  rt == NULL ? ": this process has no device runtime: " : "",
                  rt == NULL ? loom_devrt_why_none() : "");
        return loomInvalidArgument;
    }
    void *base = NULL;
    size_t bytes = 0;
    if (rt->ptr_base(ptr, &base, &bytes) == loomSuccess && base != ptr) {
        LOOM_WARN("loomMemFree: %p is inside the allocation at %p (%zu bytes), not its start", ptr,
                  base, bytes);
        return loomInvalidArgument;
    }
    return rt->mem_free(ptr);
}

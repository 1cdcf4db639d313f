/* SPDX-License-Identifier: Apache-2.0
 *
 * emu_hooks.c - the emulated device runtime's streams and pointers, exported
 * from tests/nccl_shim/emu's build of libloom.so.0 (emu_hooks.h). Compiled
 * into that library, so it reaches the very emulation loom's calls use (the
 * runtime's functions are hidden in libloom: they cannot be reached from
 * another object).
 */
#include "emu_hooks.h"

#include <string.h>
#include <time.h>

#include "devrt.h"
#include "devrt_emu.h"

#define EXPORT __attribute__((visibility("default")))

/* The emulation, when it is the process's runtime. */
static const loom_devrt_t *emu(void)
{
    const loom_devrt_t *rt = loom_devrt();
    return rt != NULL && strcmp(rt->name, "emulated") == 0 ? rt : NULL;
}

EXPORT int emuTestPtrDevice(const void *p)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? rt->ptr_device(p) : -1;
}

EXPORT int emuTestStreamCreate(void **stream)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? (int)rt->stream_create((loom_dev_stream_t *)stream) : loomInvalidUsage;
}

EXPORT int emuTestStreamDestroy(void *stream)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? (int)rt->stream_destroy(stream) : loomInvalidUsage;
}

EXPORT int emuTestStreamSynchronize(void *stream)
{
    const loom_devrt_t *rt = emu();
    if (rt == NULL)
        return loomInvalidUsage;
    loomResult_t r;
    while ((r = rt->stream_query(stream)) == loomInProgress) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return (int)r;
}

EXPORT int emuTestStreamCapturing(void *stream, int *capturing)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? (int)rt->stream_capturing(stream, capturing) : loomInvalidUsage;
}

EXPORT int emuTestStreamSetCapturing(void *stream, int capturing)
{
    return emu() != NULL ? (int)loom_devrt_emu_set_capturing(stream, capturing) : loomInvalidUsage;
}

EXPORT int emuTestStreamWaitWord(void *stream, unsigned *word, unsigned value)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? (int)rt->wait_u32(stream, word, value) : loomInvalidUsage;
}

EXPORT int emuTestCurrentDevice(int *device)
{
    const loom_devrt_t *rt = emu();
    return rt != NULL ? (int)rt->current_device(device) : loomInvalidUsage;
}

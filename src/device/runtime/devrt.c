/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt.c - which device runtime the process uses (devrt.h, LOOM_DEVICE):
 * the emulation when asked for, the CUDA runtime when this build has it and
 * the application already loaded the CUDA driver, or none, with the reason.
 * The first runtime found is kept for the life of the process, so the common
 * call is one atomic load; until then every call looks again (CUDA may be
 * started after loom is loaded). The runtimes themselves are in
 * devrt_emu*.c and devrt_cuda.c. Callers: the device transports, the public
 * device calls, loom_info.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "debug.h"
#include "devrt.h"
#include "param.h"

#define WHY_BYTES 256

static const loom_devrt_t *chosen; /* atomic: set once */
static pthread_mutex_t choose_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread char why_none[WHY_BYTES];

/* The runtime LOOM_DEVICE asks for, or NULL with the reason in why. */
static const loom_devrt_t *look(char *why, size_t why_len)
{
    const char *mode = loom_param_DEVICE();
    if (strcmp(mode, "none") == 0) {
        snprintf(why, why_len, "LOOM_DEVICE=none");
        return NULL;
    }
    if (strcmp(mode, "emulated") == 0)
        return loom_devrt_emulated();
    if (strcmp(mode, "auto") != 0 && mode[0] != '\0') {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            LOOM_WARN("LOOM_DEVICE=%s is none of auto, emulated, none: using auto", mode);
    }
    return loom_devrt_cuda(why, why_len);
}

const loom_devrt_t *loom_devrt(void)
{
    const loom_devrt_t *rt = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (rt != NULL)
        return rt;
    char why[WHY_BYTES] = "";
    /* One thread at a time: the CUDA probe is not cheap, and two threads
     * must not settle on different runtimes. */
    pthread_mutex_lock(&choose_mu);
    rt = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (rt == NULL && (rt = look(why, sizeof(why))) != NULL) {
        __atomic_store_n(&chosen, rt, __ATOMIC_RELEASE);
        LOOM_INFO(LOOM_LOG_INIT, "device runtime: %s (LOOM_DEVICE=%s)", rt->name,
                  loom_param_DEVICE());
    }
    pthread_mutex_unlock(&choose_mu);
    snprintf(why_none, sizeof(why_none), "%s", rt != NULL ? "" : why);
    return rt;
}

const loom_devrt_t *loom_devrt_found(void)
{
    return __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
}

const char *loom_devrt_why_none(void)
{
    if (loom_devrt() != NULL)
        return "";
    return why_none;
}

#ifndef LOOM_HAVE_CUDA
const loom_devrt_t *loom_devrt_cuda(char *why, size_t why_len)
{
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "built without the cuda feature");
    return NULL;
}
#endif

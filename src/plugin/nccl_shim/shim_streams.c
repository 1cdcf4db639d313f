/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_streams.c - loom's device path as a communicator's calls on device
 * buffers see it (shim_streams.h): whether it exists, and the cache of loom
 * streams wrapping the CUDA streams the calls name. The cache is a small
 * array per communicator searched under the communicator's lock: a program
 * names one or a few streams per communicator, and a search of a few entries
 * costs less than the lock. Wrappers are destroyed outside that lock, and
 * never waited for unless the caller asked for it (ncclCommFinalize).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_streams.h"

struct shim_wrap {
    cudaStream_t cuda; /* the CUDA stream's handle value (NULL: the default stream) */
    loomStream_t loom;
    unsigned long long used; /* the communicator's wrap_clock at its last call */
};

/* CUDA's special stream handles (the runtime and the driver agree). */
#define CUDA_STREAM_LEGACY     ((uintptr_t)0x1)
#define CUDA_STREAM_PER_THREAD ((uintptr_t)0x2)

/* ---- wrappers destroyed later ------------------------------------------------ */

static pthread_mutex_t later_lock = PTHREAD_MUTEX_INITIALIZER;
static loomStream_t *later;
static int later_n, later_cap;

/* Destroys s if its work is done (and look is set); else keeps it for a later look. */
static void retire(loomStream_t s, int look)
{
    if (look && loomStreamQuery(s) != loomInProgress) {
        (void)loomStreamDestroy(s); /* its failures reached the communicator's async error */
        return;
    }
    pthread_mutex_lock(&later_lock);
    if (later_n == later_cap) {
        int cap = later_cap ? 2 * later_cap : 8;
        loomStream_t *l = realloc(later, (size_t)cap * sizeof(*l));
        if (l == NULL) {
            pthread_mutex_unlock(&later_lock);
            /* Leaked rather than waited for: a wait here could block on the application's
             * work. A stream is a few hundred bytes. */
            shim_log(SHIM_LOG_WARN, "out of memory keeping a stream wrapper for later: leaked");
            return;
        }
        later = l;
        later_cap = cap;
    }
    later[later_n++] = s;
    pthread_mutex_unlock(&later_lock);
}

/* Destroys the kept wrappers whose work is done by now. */
static void reap(void)
{
    loomStream_t done[16];
    int n = 0;
    pthread_mutex_lock(&later_lock);
    for (int i = 0; i < later_n && n < (int)(sizeof(done) / sizeof(done[0]));) {
        if (loomStreamQuery(later[i]) != loomInProgress) {
            done[n++] = later[i];
            later[i] = later[--later_n];
        } else {
            i++;
        }
    }
    if (later_n == 0) {
        free(later);
        later = NULL;
        later_cap = 0;
    }
    pthread_mutex_unlock(&later_lock);
    for (int i = 0; i < n; i++)
        (void)loomStreamDestroy(done[i]);
}

/* ---- the device path ----------------------------------------------------------- */

int shim_comm_device(shim_comm_t *c, loomComm_t l, const char **runtime, const char **why)
{
    pthread_mutex_lock(&c->lock);
    if (!c->dev_known) {
        const char *rt = NULL;
        char text[sizeof(c->dev_why)] = "";
        if (loomCommDeviceRuntime(l, &rt, text, sizeof(text)) != loomSuccess) {
            rt = NULL;
            snprintf(text, sizeof(text), "%s", loomGetLastError(NULL));
        }
        c->dev_runtime = rt;
        snprintf(c->dev_why, sizeof(c->dev_why), "%s", text);
        c->dev_known = 1;
    }
    const char *rt = c->dev_runtime;
    pthread_mutex_unlock(&c->lock);
    if (runtime != NULL)
        *runtime = rt;
    if (why != NULL)
        *why = c->dev_why; /* written once, before dev_known */
    return rt != NULL;
}

/* ---- the cache ------------------------------------------------------------------- */

ncclResult_t shim_wrap_stream(shim_comm_t *c, cudaStream_t s, const char *fn, int in_group,
                              loomStream_t *out)
{
    pthread_mutex_lock(&c->lock);
    /* The emulated runtime has one default stream and no per-thread ones. */
    if (c->dev_runtime != NULL && strcmp(c->dev_runtime, "emulated") == 0 &&
        ((uintptr_t)s == CUDA_STREAM_LEGACY || (uintptr_t)s == CUDA_STREAM_PER_THREAD))
        s = NULL;
    const unsigned long long now = ++c->wrap_clock;
    for (int i = 0; i < c->nwraps; i++) {
        if (c->wraps[i].cuda == s) {
            c->wraps[i].used = now;
            *out = c->wraps[i].loom;
            pthread_mutex_unlock(&c->lock);
            return ncclSuccess;
        }
    }
    if (c->wraps == NULL && (c->wraps = calloc(SHIM_WRAPS_MAX, sizeof(*c->wraps))) == NULL) {
        pthread_mutex_unlock(&c->lock);
        return shim_fail(ncclSystemError, "%s: out of memory for a stream wrapper", fn);
    }
    loomStream_t made = NULL;
    const loomResult_t lr = loomStreamCreateFromCuda(&made, (void *)s);
    if (lr != loomSuccess) {
        pthread_mutex_unlock(&c->lock);
        return shim_loom(lr);
    }
    loomStream_t evicted = NULL;
    int slot = c->nwraps;
    if (slot == SHIM_WRAPS_MAX) {
        slot = 0;
        for (int i = 1; i < c->nwraps; i++)
            if (c->wraps[i].used < c->wraps[slot].used)
                slot = i;
        evicted = c->wraps[slot].loom;
    } else {
        c->nwraps++;
    }
    c->wraps[slot] = (shim_wrap_t){s, made, now};
    pthread_mutex_unlock(&c->lock);
    /* Inside a loom group a wrapper may hold calls recorded for its GroupEnd: looked at later. */
    if (evicted != NULL)
        retire(evicted, !in_group);
    if (!in_group)
        reap();
    *out = made;
    return ncclSuccess;
}

/* Takes c's wrappers out of it; *n gets their number. */
static shim_wrap_t *take_all(shim_comm_t *c, int *n)
{
    pthread_mutex_lock(&c->lock);
    shim_wrap_t *w = c->wraps;
    *n = c->nwraps;
    c->wraps = NULL;
    c->nwraps = 0;
    pthread_mutex_unlock(&c->lock);
    return w;
}

ncclResult_t shim_wraps_finish(shim_comm_t *c, const char *fn)
{
    int n = 0;
    shim_wrap_t *w = take_all(c, &n);
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < n; i++) {
        const loomResult_t lr = loomStreamSynchronize(w[i].loom);
        if (lr != loomSuccess && res == ncclSuccess) {
            res = shim_loom(lr);
            shim_warn("%s: work queued on CUDA stream %p failed: %s", fn, (void *)w[i].cuda,
                      loomGetLastError(NULL));
        }
        (void)loomStreamDestroy(w[i].loom);
    }
    free(w);
    return res;
}

void shim_wraps_free(shim_comm_t *c)
{
    int n = 0;
    shim_wrap_t *w = take_all(c, &n);
    for (int i = 0; i < n; i++)
        retire(w[i].loom, 1);
    free(w);
    reap();
}

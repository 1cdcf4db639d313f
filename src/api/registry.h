/* SPDX-License-Identifier: Apache-2.0
 *
 * registry.h - the live handles of one kind (communicators, streams, Echo
 * states). An entry point looks its handle up and raises the object's
 * reference count in one step under the registry's lock, so that it never
 * dereferences a handle that was destroyed: either the destroy took the
 * handle out of the registry first (the call gets InvalidArgument) or the
 * call's reference keeps the object alive until the call drops it. Handles
 * are compared by address only; nothing here reads the objects, and what a
 * reference means (and who frees the object) is the owner's business.
 * Used by init.c and lifecycle.c (communicators), stream.c and echo_api.c.
 */
#ifndef LOOM_API_REGISTRY_H
#define LOOM_API_REGISTRY_H

#include <pthread.h>
#include <stdint.h>

#include "check.h"
#include "loom.h"

typedef struct {
    const void *handle;
    int *refs;   /* the object's reference count; acquire raises it */
    int closing; /* being torn down: acquire fails, loom_registry_close still finds it */
} loom_registry_entry_t;

typedef struct {
    pthread_mutex_t lock;
    const char *kind;    /* "communicator", "stream", ...: for messages */
    const char *invalid; /* why a handle may not be listed, e.g. "destroyed or never created" */
    loom_registry_entry_t *entries;
    int n, cap;
    uint64_t epoch; /* raised (under the lock) by every add, close and remove */
} loom_registry_t;

#define LOOM_REGISTRY_INITIALIZER(_kind, _invalid)                                                 \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, (_kind), (_invalid), NULL, 0, 0, 0                              \
    }

/* Lists a new handle; SystemError (WARN) if out of memory. */
loomResult_t loom_registry_add(loom_registry_t *r, const void *handle, int *refs);
/* Raises the handle's reference count if it is listed and not closing;
 * otherwise InvalidArgument, with a WARN naming fn unless fn is NULL. */
loomResult_t loom_registry_acquire(loom_registry_t *r, const void *handle, const char *fn);
/* InvalidArgument (WARN naming fn unless fn is NULL) unless the handle is listed and not
 * closing; takes no reference, so the answer is only good for an early
 * argument check. */
loomResult_t loom_registry_check(loom_registry_t *r, const void *handle, const char *fn);
/* As loom_registry_check, and *epoch is the registry's epoch while it held: the answer stays
 * true as long as the epoch has not moved (call_guard.h). */
loomResult_t loom_registry_check_at(loom_registry_t *r, const void *handle, const char *fn,
                                    uint64_t *epoch);
/* The registry's epoch now; inline, as every call on a communicator reads it (call_guard.c). */
static inline uint64_t loom_registry_epoch(const loom_registry_t *r)
{
    return __atomic_load_n(&r->epoch, __ATOMIC_ACQUIRE);
}
/* 1 if the handle is listed and not closing, else 0; logs nothing and takes no
 * reference (for callers that ask whose handle a value is, like loomStreamIsLive). */
int loom_registry_is_live(loom_registry_t *r, const void *handle);

typedef enum {
    LOOM_REGISTRY_ABSENT,  /* not listed */
    LOOM_REGISTRY_LIVE,    /* listed and usable: the caller of close now owns the teardown */
    LOOM_REGISTRY_CLOSING, /* listed, and someone else's teardown is under way */
} loom_registry_state_t;
/* Marks the handle closing, so that acquire fails from now on, and returns
 * what it was before (a WARN naming fn when it is not listed). hold: also
 * raise its reference count when it is listed (live or closing), so that the
 * caller may touch the object. */
loom_registry_state_t loom_registry_close(loom_registry_t *r, const void *handle, int hold,
                                          const char *fn);
/* Forgets the handle; InvalidArgument (WARN naming fn) if it was not listed,
 * so that of two racing destroys exactly one succeeds. */
loomResult_t loom_registry_remove(loom_registry_t *r, const void *handle, const char *fn);

/* The body of an entry point on a handle: returns `_call` (an expression of
 * type loomResult_t) run between `_acquire` (a loomResult_t expression that
 * takes a reference) and `_release` (which drops it). */
#define LOOM_WITH_REF(_acquire, _release, _call)                                                   \
    do {                                                                                           \
        LOOM_CHECK(_acquire);                                                                      \
        loomResult_t with_ref_res_ = (_call);                                                      \
        _release;                                                                                  \
        return with_ref_res_;                                                                      \
    } while (0)

#endif

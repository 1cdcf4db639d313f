/* SPDX-License-Identifier: Apache-2.0
 *
 * registry.c - the registries of live handles (registry.h): a small array
 * per kind, searched under its lock. A process holds a handful of
 * communicators and streams and one Echo state per gradient bucket, so a
 * linear search costs less than the lock around it.
 */
#include <stdlib.h>

#include "check.h"
#include "registry.h"

/* Under the lock. */
static loom_registry_entry_t *find(loom_registry_t *r, const void *handle)
{
    for (int i = 0; i < r->n; i++)
        if (r->entries[i].handle == handle)
            return &r->entries[i];
    return NULL;
}

/* Under the lock. */
static void bump(loom_registry_t *r)
{
    __atomic_store_n(&r->epoch, r->epoch + 1, __ATOMIC_RELAXED);
}

static void warn_invalid(const loom_registry_t *r, const void *handle, const char *fn)
{
    if (handle == NULL)
        LOOM_WARN("%s: %s is NULL", fn, r->kind);
    else
        LOOM_WARN("%s: %s %p is not valid (%s)", fn, r->kind, handle, r->invalid);
}

loomResult_t loom_registry_add(loom_registry_t *r, const void *handle, int *refs)
{
    pthread_mutex_lock(&r->lock);
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        loom_registry_entry_t *e = realloc(r->entries, (size_t)cap * sizeof(*e));
        if (e == NULL) {
            pthread_mutex_unlock(&r->lock);
            LOOM_WARN("out of memory registering a %s (%d listed)", r->kind, r->n);
            return loomSystemError;
        }
        r->entries = e;
        r->cap = cap;
    }
    r->entries[r->n++] = (loom_registry_entry_t){.handle = handle, .refs = refs, .closing = 0};
    bump(r);
    pthread_mutex_unlock(&r->lock);
    return loomSuccess;
}

/* Whoever takes a handle out of service (close, remove) does so under the
 * same lock, so once it has, no new reference can appear. */
loomResult_t loom_registry_acquire(loom_registry_t *r, const void *handle, const char *fn)
{
    pthread_mutex_lock(&r->lock);
    loom_registry_entry_t *e = handle ? find(r, handle) : NULL;
    const int ok = e != NULL && !e->closing;
    if (ok)
        __atomic_add_fetch(e->refs, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&r->lock);
    if (ok)
        return loomSuccess;
    if (fn != NULL)
        warn_invalid(r, handle, fn);
    return loomInvalidArgument;
}

loomResult_t loom_registry_check(loom_registry_t *r, const void *handle, const char *fn)
{
    uint64_t epoch;
    return loom_registry_check_at(r, handle, fn, &epoch);
}

loomResult_t loom_registry_check_at(loom_registry_t *r, const void *handle, const char *fn,
                                    uint64_t *epoch)
{
    pthread_mutex_lock(&r->lock);
    loom_registry_entry_t *e = handle ? find(r, handle) : NULL;
    const int ok = e != NULL && !e->closing;
    *epoch = __atomic_load_n(&r->epoch, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&r->lock);
    if (ok)
        return loomSuccess;
    if (fn != NULL)
        warn_invalid(r, handle, fn);
    return loomInvalidArgument;
}

int loom_registry_is_live(loom_registry_t *r, const void *handle)
{
    pthread_mutex_lock(&r->lock);
    loom_registry_entry_t *e = handle ? find(r, handle) : NULL;
    const int live = e != NULL && !e->closing;
    pthread_mutex_unlock(&r->lock);
    return live;
}

loom_registry_state_t loom_registry_close(loom_registry_t *r, const void *handle, int hold,
                                          const char *fn)
{
    pthread_mutex_lock(&r->lock);
    loom_registry_entry_t *e = handle ? find(r, handle) : NULL;
    loom_registry_state_t was = LOOM_REGISTRY_ABSENT;
    if (e != NULL) {
        was = e->closing ? LOOM_REGISTRY_CLOSING : LOOM_REGISTRY_LIVE;
        e->closing = 1;
        bump(r);
        if (hold)
            __atomic_add_fetch(e->refs, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&r->lock);
    if (was == LOOM_REGISTRY_ABSENT)
        warn_invalid(r, handle, fn);
    return was;
}

loomResult_t loom_registry_remove(loom_registry_t *r, const void *handle, const char *fn)
{
    pthread_mutex_lock(&r->lock);
    loom_registry_entry_t *e = handle ? find(r, handle) : NULL;
    if (e != NULL) {
        *e = r->entries[--r->n];
        bump(r);
    }
    if (r->n == 0) {
        /* With no handle of this kind left the process holds nothing of loom's for it (leak
         * checkers and the hygiene tests compare against the state before the first one). */
        free(r->entries);
        r->entries = NULL;
        r->cap = 0;
    }
    pthread_mutex_unlock(&r->lock);
    if (e != NULL)
        return loomSuccess;
    warn_invalid(r, handle, fn);
    return loomInvalidArgument;
}

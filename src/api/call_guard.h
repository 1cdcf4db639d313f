/* SPDX-License-Identifier: Apache-2.0
 *
 * call_guard.h - how an entry point holds its communicator for the length of a call without a
 * locked instruction. A reference (registry.h) costs four: the registry's lock and unlock and
 * the count's increment and decrement, each of which also waits for the stores before it (a
 * Broadcast root's cell for the reader) to leave the core. An 8-byte call on shared memory
 * takes under 100 ns, and those four were a quarter of it.
 *
 * Instead each thread owns a slot that names the communicator it is calling on (a hazard
 * pointer), and remembers the last few handles the registry vouched for together with the
 * registry's epoch, which every add, close and remove of a communicator raises. A call stores
 * its handle in the slot and then reads the epoch: unchanged, the handle is still live and was
 * not closed, and the slot keeps it so. A teardown closes the handle (raising the epoch), then
 * makes every thread of the process pass a memory barrier (membarrier), and from then on waits
 * for the slots as it waits for references: a call that read the old epoch has its slot seen,
 * and a call that stores later reads the new epoch and asks the registry, which refuses the
 * closed handle. Without membarrier, with every slot taken, or in a call nested on one thread
 * in a call on another communicator, the guard is a reference as before.
 */
#ifndef LOOM_API_CALL_GUARD_H
#define LOOM_API_CALL_GUARD_H

#include "loom.h"

/* How a call holds its communicator (the token loom_call_leave takes back). */
typedef enum {
    LOOM_GUARD_SLOT = 1,   /* the thread's slot names it */
    LOOM_GUARD_NESTED = 2, /* an outer call of the thread holds it already */
    LOOM_GUARD_REF = 3,    /* a reference (loom_comm_acquire) */
} loom_guard_kind_t;

typedef struct {
    loom_guard_kind_t kind;
    void *slot; /* LOOM_GUARD_SLOT: the slot, so that leaving reads no thread-local state */
} loom_guard_t;

/* Holds comm for a call: loomSuccess with *guard set, or InvalidArgument (with a WARN naming
 * fn) if comm is not live, as loom_comm_acquire. */
loomResult_t loom_call_enter(loomComm_t comm, const char *fn, loom_guard_t *guard);
/* Lets go of what loom_call_enter took. */
void loom_call_leave(loomComm_t comm, loom_guard_t guard);

/* Whether a thread's slot holds comm (not_mine: other than the caller's). Read before the
 * reference count: a call takes any reference of its own (a stream's task) before it lets go
 * of the slot, so a teardown that sees the slot empty then sees that reference. */
int loom_call_slots_hold(const void *comm, int not_mine);
/* References the calling thread's calls in progress hold on comm (LOOM_GUARD_REF). */
int loom_call_own_refs(const void *comm);
/* After a handle was closed (or a communicator aborted): every call that entered without
 * seeing it is visible to loom_call_slots_hold from now on. A barrier on every thread of the
 * process, for whoever pairs a store and a later load of its own with a compiler barrier.
 * 1 if it was that barrier (or none was needed: no slots), 0 if membarrier failed (WARN). */
int loom_call_fence(void);
/* Registers membarrier, once; called before a communicator exists. */
void loom_call_guard_init(void);
/* 1 if loom_call_fence is that barrier (membarrier registered at loom_call_guard_init). */
int loom_call_fence_ready(void);

#endif

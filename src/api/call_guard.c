/* SPDX-License-Identifier: Apache-2.0
 *
 * call_guard.c - the per-thread slots through which entry points hold their communicator
 * (call_guard.h). The slots are a fixed array in static memory, so that a teardown can read
 * every one of them at any time; a thread claims one at its first call and gives it back when
 * it exits. The one heavy instruction is the teardown's membarrier, which stands for the
 * barrier every call would otherwise pay between its slot store and its epoch load.
 */
#include "call_guard.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "comm.h"
#include "debug.h"

/* More threads than this calling into loom at once take references, as before. */
#define SLOTS 256
/* Calls held by reference and nested on one thread deeper than this are refused. */
#define NEST_MAX 8
/* Handles a thread remembers as vouched for: a thread that alternates between a few
 * communicators (data and tensor parallel groups) asks the registry only when the epoch moves. */
#define VOUCHED 4

typedef struct {
    _Atomic(const void *) comm; /* the communicator a call of the owner is in, or NULL */
    atomic_int owned;           /* a thread holds this slot */
    char pad[64 - sizeof(void *) - sizeof(int)]; /* one line per slot: only its owner writes */
} slot_t;

static slot_t slots[SLOTS];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int light;         /* membarrier registered: slots in use (set once) */
static pthread_key_t exit_key;   /* gives the slot back when its thread exits */
static atomic_int slots_claimed; /* how many slots were ever handed out (bounds the scans) */

/* The calling thread: its slot, the handles the registry last vouched for and at what epoch,
 * and the communicators its calls in progress hold by reference (for loom_call_own_refs). */
static __thread struct {
    slot_t *slot;
    int no_slot; /* none could be had: references from now on */
    const void *vouched[VOUCHED];
    unsigned next_vouched; /* the entry the next vouched handle replaces */
    uint64_t epoch;
    int nrefs;
    const void *refs[NEST_MAX];
} me;

static void give_back(void *slot)
{
    slot_t *s = slot;
    atomic_store_explicit(&s->comm, NULL, memory_order_release);
    atomic_store_explicit(&s->owned, 0, memory_order_release);
}

/* The child of a fork has one thread: the others' slots are nobody's, and a call they were
 * in will not end there. */
static void after_fork_child(void)
{
    for (int i = 0; i < SLOTS; i++) {
        if (&slots[i] == me.slot)
            continue;
        atomic_store_explicit(&slots[i].comm, NULL, memory_order_relaxed);
        atomic_store_explicit(&slots[i].owned, 0, memory_order_relaxed);
    }
}

/* A library unloaded with threads still running must not leave them a destructor to call. */
__attribute__((destructor)) static void unload(void)
{
    if (atomic_load_explicit(&light, memory_order_relaxed))
        pthread_key_delete(exit_key);
}

static void init_once(void)
{
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) ||
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) != 0) {
        LOOM_INFO(LOOM_LOG_INIT, "membarrier(PRIVATE_EXPEDITED) unavailable: every call takes a "
                                 "reference on its communicator");
        return;
    }
    if (pthread_key_create(&exit_key, give_back) != 0)
        return;
    if (pthread_atfork(NULL, NULL, after_fork_child) != 0) {
        pthread_key_delete(exit_key);
        return;
    }
    atomic_store_explicit(&light, 1, memory_order_relaxed);
}

static slot_t *claim(void)
{
    pthread_once(&once, init_once);
    if (!atomic_load_explicit(&light, memory_order_relaxed)) {
        me.no_slot = 1;
        return NULL;
    }
    for (int i = 0; i < SLOTS; i++) {
        int free_ = 0;
        if (atomic_load_explicit(&slots[i].owned, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&slots[i].owned, &free_, 1)) {
            if (pthread_setspecific(exit_key, &slots[i]) != 0) {
                atomic_store(&slots[i].owned, 0);
                break;
            }
            int seen = atomic_load(&slots_claimed);
            while (seen < i + 1 && !atomic_compare_exchange_weak(&slots_claimed, &seen, i + 1))
                ;
            me.slot = &slots[i];
            return me.slot;
        }
    }
    me.no_slot = 1;
    return NULL;
}

/* The registry's word on comm, with the slot already naming it: a teardown that closes comm
 * after this looked either finds the slot or is found by the next look at the epoch. */
static loomResult_t vouch(loomComm_t comm, const char *fn)
{
    uint64_t epoch;
    loomResult_t res = loom_registry_check_at(&loom_comms, comm, fn, &epoch);
    if (res != loomSuccess)
        return res;
    if (epoch != me.epoch) { /* what was vouched for at another epoch may be gone */
        memset(me.vouched, 0, sizeof(me.vouched));
        me.epoch = epoch;
    }
    me.vouched[me.next_vouched++ % VOUCHED] = comm;
    return loomSuccess;
}

/* Whether the registry vouched for comm at the epoch it is at now. */
static int vouched(loomComm_t comm)
{
    if (loom_registry_epoch(&loom_comms) != me.epoch)
        return 0;
    for (int i = 0; i < VOUCHED; i++)
        if (me.vouched[i] == comm)
            return 1;
    return 0;
}

loomResult_t loom_call_enter(loomComm_t comm, const char *fn, loom_guard_t *guard)
{
    slot_t *s = me.slot;
    if (s == NULL && !me.no_slot)
        s = claim();
    const void *held = s ? atomic_load_explicit(&s->comm, memory_order_relaxed) : NULL;
    if (s != NULL && held == NULL && comm != NULL) {
        atomic_store_explicit(&s->comm, comm, memory_order_relaxed);
        /* The slot store before the epoch load: the teardown's membarrier is the other half. */
        atomic_signal_fence(memory_order_seq_cst);
        if (!vouched(comm)) {
            loomResult_t res = vouch(comm, fn);
            if (res != loomSuccess) {
                atomic_store_explicit(&s->comm, NULL, memory_order_release);
                return res;
            }
        }
        *guard = (loom_guard_t){LOOM_GUARD_SLOT, s};
        return loomSuccess;
    }
    if (s != NULL && held == comm && comm != NULL) {
        *guard = (loom_guard_t){LOOM_GUARD_NESTED, NULL};
        return loomSuccess;
    }
    if (me.nrefs == NEST_MAX) {
        LOOM_WARN("%s: loom calls nested more than %d deep on one thread", fn, NEST_MAX);
        return loomInvalidUsage;
    }
    LOOM_CHECK(loom_comm_acquire(comm, fn));
    me.refs[me.nrefs++] = comm;
    *guard = (loom_guard_t){LOOM_GUARD_REF, NULL};
    return loomSuccess;
}

void loom_call_leave(loomComm_t comm, loom_guard_t guard)
{
    if (guard.kind == LOOM_GUARD_SLOT) {
        atomic_store_explicit(&((slot_t *)guard.slot)->comm, NULL, memory_order_release);
    } else if (guard.kind == LOOM_GUARD_REF) {
        me.nrefs--; /* calls on one thread end in the reverse order they began */
        loom_comm_release(comm);
    }
}

int loom_call_slots_hold(const void *comm, int not_mine)
{
    const int n = atomic_load(&slots_claimed);
    for (int i = 0; i < n; i++)
        if ((!not_mine || &slots[i] != me.slot) &&
            atomic_load_explicit(&slots[i].comm, memory_order_acquire) == comm)
            return 1;
    return 0;
}

int loom_call_own_refs(const void *comm)
{
    int n = 0;
    for (int i = 0; i < me.nrefs; i++)
        n += me.refs[i] == comm;
    return n;
}

void loom_call_guard_init(void)
{
    pthread_once(&once, init_once);
}

int loom_call_fence_ready(void)
{
    return atomic_load_explicit(&light, memory_order_relaxed);
}

int loom_call_fence(void)
{
    /* No slot was ever handed out without the registration, and light is set before the
     * first: a teardown that reads it unset has no slot to look at. */
    pthread_once(&once, init_once);
    if (!atomic_load_explicit(&light, memory_order_relaxed) ||
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
        return 1;
    LOOM_WARN("membarrier(PRIVATE_EXPEDITED) failed after it was registered: %s", strerror(errno));
    return 0;
}

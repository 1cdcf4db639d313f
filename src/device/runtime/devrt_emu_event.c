/* SPDX-License-Identifier: Apache-2.0
 *
 * devrt_emu_event.c - events of the emulated device. event_record queues an
 * operation carrying a new generation number; the stream's worker, reaching
 * it, raises the event's `reached` to that number; event_query compares it
 * with the generation of the latest record. As with CUDA, an event never
 * recorded counts as passed, a new record replaces the old one, and
 * event_destroy may come while a record is queued (the queued operation
 * holds a reference). Caller: devrt_emu.c's table.
 */
#include <stdlib.h>

#include "check.h"
#include "debug.h"
#include "devrt_emu_int.h"

#define EVENT_MAGIC 0x4c4d4556u /* "LMEV" */

struct loom_dev_event {
    uint32_t magic;
    unsigned fork_gen;
    int refs;          /* the user's and one per queued record (atomic) */
    int destroyed;     /* event_destroy was called (atomic) */
    uint64_t next_gen; /* generations handed out (atomic) */
    uint64_t recorded; /* the latest record's generation (atomic) */
    uint64_t reached;  /* the highest generation a stream passed (atomic) */
};

static void event_unref(struct loom_dev_event *e)
{
    if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        e->magic = 0;
        free(e);
    }
}

static void raise_to(uint64_t *word, uint64_t v)
{
    uint64_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    while (cur < v &&
           !__atomic_compare_exchange_n(word, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
}

static loomResult_t check_event(loom_dev_event_t e, const char *call)
{
    if (e == NULL || e->magic != EVENT_MAGIC || __atomic_load_n(&e->destroyed, __ATOMIC_ACQUIRE)) {
        LOOM_WARN("emulated device: %s: %p is not a live event of the emulated device runtime",
                  call, (void *)e);
        return loomInvalidArgument;
    }
    if (e->fork_gen != loom_emu_fork_gen()) {
        LOOM_WARN("emulated device: %s: the event was made before fork(); the streams that "
                  "record it are the parent's",
                  call);
        return loomInvalidUsage;
    }
    return loomSuccess;
}

void loom_emu_event_reached(struct loom_dev_event *e, uint64_t gen)
{
    raise_to(&e->reached, gen);
    event_unref(e);
}

loomResult_t loom_emu_event_create(loom_dev_event_t *out)
{
    if (out == NULL) {
        LOOM_WARN("emulated device: event_create given a NULL output");
        return loomInvalidArgument;
    }
    struct loom_dev_event *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        LOOM_WARN("emulated device: no memory for an event");
        return loomSystemError;
    }
    e->magic = EVENT_MAGIC;
    e->fork_gen = loom_emu_fork_gen();
    e->refs = 1;
    *out = e;
    return loomSuccess;
}

loomResult_t loom_emu_event_destroy(loom_dev_event_t e)
{
    LOOM_CHECK(check_event(e, "event_destroy"));
    if (__atomic_exchange_n(&e->destroyed, 1, __ATOMIC_ACQ_REL)) {
        LOOM_WARN("emulated device: event_destroy: event %p was destroyed already", (void *)e);
        return loomInvalidArgument;
    }
    event_unref(e);
    return loomSuccess;
}

loomResult_t loom_emu_event_record(loom_dev_event_t e, loom_dev_stream_t s)
{
    LOOM_CHECK(check_event(e, "event_record"));
    uint64_t gen = __atomic_add_fetch(&e->next_gen, 1, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&e->refs, 1, __ATOMIC_ACQ_REL);
    emu_op_t op = {.kind = EMU_OP_EVENT, .event = e, .event_gen = gen};
    loomResult_t res = loom_emu_enqueue(s, &op);
    if (res != loomSuccess) {
        event_unref(e);
        return res;
    }
    /* Published after queueing: a failed record leaves the event as it was. */
    raise_to(&e->recorded, gen);
    return loomSuccess;
}

loomResult_t loom_emu_event_query(loom_dev_event_t e)
{
    LOOM_CHECK(check_event(e, "event_query"));
    uint64_t recorded = __atomic_load_n(&e->recorded, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&e->reached, __ATOMIC_ACQUIRE) >= recorded ? loomSuccess
                                                                      : loomInProgress;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_arena.c - where the shm collectives' arena (arena.h) meets the
 * point-to-point layer: the comparison of the calls the arena's descriptors
 * and cells show with this rank's call (set_call), so that a difference fails
 * every rank as a difference found in a message does (p2p_stamp.c). The
 * arena's memory, flags and waits are shm/'s.
 * Callers: the shm collectives, and the arena's waits (shm_arena_sync.c).
 */
#include "check.h"
#include "p2p_impl.h"
#include "shm/shm_arena.h"
#include "timer.h"

/* An arena descriptor as a call of the shape of this rank's call of its
 * number, *m_p (the current or the previous one; the arena writes 0 where a
 * field does not apply, and this rank's call says which ones); returns the
 * fields in which the two differ (0 if this rank has no call of that number). */
static unsigned arena_diff(const loom_p2p_t *p, const loom_arena_desc_t *d, call_state_t *t,
                           const call_state_t **m_p)
{
    const call_state_t *m = d->seq == p->call.seq ? &p->call : &p->call_prev;
    *m_p = m;
    *t = (call_state_t){.seq = d->seq,
                        .c = {.kind = (int32_t)d->kind,
                              .dt = d->dt,
                              .op = d->op,
                              .root = d->root,
                              .count = (int64_t)d->count}};
    const int same_kind = t->c.kind == m->c.kind;
    if (!same_kind || m->c.dt < 0)
        t->c.dt = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.op < 0)
        t->c.op = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.root < 0)
        t->c.root = LOOM_P2P_CALL_ANY;
    if (!same_kind || m->c.count < 0)
        t->c.count = LOOM_P2P_CALL_ANY;
    /* Only calls of the collectives have descriptors (creation's number is 0). */
    return t->seq == m->seq && m->c.kind >= 0 && m->seq != 0 ? loom_p2p_call_diff(t, m) : 0u;
}

/* Records the difference of rank's call t from this rank's m and fails the call with it. */
static loomResult_t arena_failed(loom_p2p_t *p, int rank, unsigned diff, const call_state_t *t,
                                 const call_state_t *m)
{
    (void)loom_p2p_mismatch(p, rank, diff, t, m, 0);
    return loom_p2p_wait_event(p, LOOM_P2P_EV_ERROR, p->rank, -1, 0, loomInvalidUsage,
                               loom_now_ns(), NULL);
}

/* rank's call of seq as the arena shows it, from its descriptor or its
 * tiny-call cell: 1 and *d. */
static int arena_call_of(const loom_arena_t *a, int rank, uint64_t seq, loom_arena_desc_t *d)
{
    uint64_t packed;
    if (loom_arena_peer_desc_of(a, rank, seq, d))
        return 1;
    if (!loom_arena_peer_cell(a, rank, seq, &packed))
        return 0;
    /* the inverse of loom_arena_tiny_desc */
    *d = (loom_arena_desc_t){.seq = seq,
                             .kind = (uint32_t)(packed & 0xffu),
                             .dt = (int32_t)((packed >> 8) & 0xffu),
                             .op = (int32_t)((packed >> 16) & 0xffu),
                             .count = (packed >> 24) & 0xffu,
                             .root = (int32_t)(uint32_t)(packed >> 32)};
    return 1;
}

/* The first peer, from `first` on, whose call of this rank's current or
 * previous number (as the arena shows it) differs from this rank's in a
 * field fails the call; without one, loom_arena_fail with detail. */
static loomResult_t arena_search(loom_arena_t *a, int first, const char *detail)
{
    loom_p2p_t *p = a->p2p;
    for (int k = 0; k < p->nranks; k++) {
        const int r = (first + k) % p->nranks;
        for (int prev = 0; prev < 2 && r != p->rank; prev++) {
            loom_arena_desc_t d;
            call_state_t t;
            const call_state_t *m;
            const uint64_t seq = prev ? p->call_prev.seq : p->call.seq;
            if (!arena_call_of(a, r, seq, &d))
                continue;
            const unsigned diff = arena_diff(p, &d, &t, &m);
            if (diff != 0)
                return arena_failed(p, r, diff, &t, m);
        }
    }
    return loom_arena_fail(a, loomInvalidUsage, detail);
}

/* The shm collectives compare descriptors in their arena instead of stamps;
 * a difference in the fields of a call fails every rank the same way. A
 * descriptor of another call number (the arena's own state told apart the
 * calls of ranks whose previous calls differed) leads to the calls that do
 * differ. */
loomResult_t loom_arena_mismatch(loom_arena_t *a, int rank, const loom_arena_desc_t *theirs,
                                 const char *detail)
{
    call_state_t t;
    const call_state_t *m;
    const unsigned diff = arena_diff(a->p2p, theirs, &t, &m);
    return diff != 0 ? arena_failed(a->p2p, rank, diff, &t, m) : arena_search(a, rank, detail);
}

loomResult_t loom_arena_mismatch_any(loom_arena_t *a, const char *detail)
{
    return arena_search(a, a->p2p->rank + 1, detail);
}

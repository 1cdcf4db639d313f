/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_arena_calls.c - the calls the arena shows (arena.h: mismatch,
 * mismatch_any): a peer's descriptor or tiny-call cell read as its call and
 * compared with this rank's call through the point-to-point layer
 * (loom_p2p_call_seen), so that a difference fails every rank as a
 * difference found in a message does. It waits for nothing (shm_arena_sync.c)
 * and knows no algorithm. Callers: the shm collectives.
 */
#include "check.h"
#include "shm_arena.h"

/* A descriptor's call in the terms of loom_p2p_set_call (the arena writes 0
 * where a field does not apply; the comparison knows which ones do). */
static loom_p2p_call_t desc_call(const loom_arena_desc_t *d)
{
    return (loom_p2p_call_t){.kind = (int32_t)d->kind,
                             .dt = d->dt,
                             .op = d->op,
                             .root = d->root,
                             .count = (int64_t)d->count};
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
    uint64_t seqs[2];
    loom_p2p_call_seqs(a->p2p, &seqs[0], &seqs[1]);
    for (int k = 0; k < a->nranks; k++) {
        const int r = (first + k) % a->nranks;
        for (int prev = 0; prev < 2 && r != a->rank; prev++) {
            loom_arena_desc_t d;
            if (!arena_call_of(a, r, seqs[prev], &d))
                continue;
            const loom_p2p_call_t c = desc_call(&d);
            LOOM_CHECK(loom_p2p_call_seen(a->p2p, r, d.seq, &c));
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
    const loom_p2p_call_t c = desc_call(theirs);
    LOOM_CHECK(loom_p2p_call_seen(a->p2p, rank, theirs->seq, &c));
    return arena_search(a, rank, detail);
}

loomResult_t loom_arena_mismatch_any(loom_arena_t *a, const char *detail)
{
    return arena_search(a, a->rank + 1, detail);
}

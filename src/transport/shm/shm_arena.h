/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_arena.h - the communicator-wide shared-memory arena of the shm
 * collectives: the state every arena operation shares (shm_arena.c creates,
 * maps, breaks and unmaps, shm_arena_sync.c waits, publishes and copies,
 * shm_arena_calls.c compares calls). Every operation, its life included, is
 * declared in arena.h; this header is for the transport layer only.
 */
#ifndef LOOM_SHM_ARENA_H
#define LOOM_SHM_ARENA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "loom.h"
#include "shm_seg.h"

#define LOOM_ARENA_NAME_MAX 64

/* State word of a rank's control block (only its rank writes it). */
#define LOOM_ARENA_ACTIVE 0u
#define LOOM_ARENA_BROKEN 1u /* its communicator broke or was aborted */
#define LOOM_ARENA_LEFT   2u /* it destroyed its communicator */

/* One rank's control block: five cache lines, all written by the rank only
 * except the bell (rung by whoever wakes it). The flag has a line of its own:
 * it changes at every post, and a peer that reads the state at the end of
 * every call or the doorbell at every post must not miss in its cache for
 * that. */
typedef union {
    loom_arena_desc_t d;
    uint8_t line[64];
} loom_arena_desc_line_t;

typedef struct {
    _Atomic uint64_t flag; /* monotonic progress counter, (seq << 24) | step */
    uint8_t pad0[56];
    _Atomic uint32_t state; /* LOOM_ARENA_* */
    _Atomic uint32_t
        cma_ok; /* creation vote: its LOOM_SHM_COLL_CMA, 0 if it could not read a peer */
    _Atomic uint32_t light_ok;  /* creation vote: its posts may skip the fence (membarrier) */
    _Atomic uint32_t copy_fast; /* creation vote: loom_arena_kernel_copy_fast() */
    uint64_t pid;               /* getpid() of the rank, for single-copy reads */
    uint64_t probe_addr;        /* address of a word in its memory, for the probe */
    uint64_t probe_value;       /* what that word holds */
    /* While the rank sleeps: the rank it waits for (-1: any) and the flag it
     * needs from it, so that posts that cannot satisfy it do not wake it. */
    _Atomic uint64_t wait_flag;
    _Atomic int32_t wait_rank;
    uint8_t pad2[4];
    /* Set before state becomes BROKEN: the seq of the call the rank failed in
     * (or would run next). A rank in a later call finished every earlier one,
     * so its break concerns only calls from this seq on. */
    _Atomic uint64_t broke_seq;
    loom_seg_bell_t bell;           /* the futex word the rank sleeps on */
    loom_arena_desc_line_t desc[2]; /* the call descriptor, by call parity */
} loom_arena_ctl_t;

/* A cell of a rank's ring for tiny calls (arena.h): one cache line, so that a
 * peer spinning on seq gets the descriptor and the data with it. */
typedef struct {
    _Atomic uint64_t seq; /* the call whose data the cell holds; stored last */
    uint64_t desc;        /* the call's packed descriptor (loom_arena_tiny_desc) */
    uint8_t data[LOOM_ARENA_CELL_BYTES];
} loom_arena_cell_t;

/* Cells per rank: a rank that does not wait for its peers (a broadcast root,
 * a reduce's non-root) runs up to this many calls minus one ahead, as deep as
 * an MPI's eager buffers, so that a rank that runs ahead does not stall on a
 * slower one each call (docs/PERFORMANCE.md, *Defaults of the shm collectives
 * and the tcp transport*). 16 KiB per rank. */
#define LOOM_ARENA_CELLS 256u

struct loom_arena {
    loom_p2p_t *p2p;
    int rank;
    int nranks;
    volatile const int *abort_flag; /* the communicator's (loomCommAbort) */
    int64_t timeout_ms;
    int64_t spin_ns; /* spin before yielding, from LOOM_SPIN_US (less when oversubscribed) */
    int yields;      /* then sched_yield this often before sleeping on the futex */
    /* Every rank registered for membarrier(GLOBAL_EXPEDITED): posts store
     * their flag without a fence, and a rank about to sleep issues the
     * barrier on every CPU instead (shm_arena_sync.c). */
    int light;
    int oversubscribed; /* more ranks than online CPUs (the same answer on every rank) */
    int broken;         /* loom_arena_break ran (the layer broke): calls stay away */
    char name[LOOM_ARENA_NAME_MAX];
    char dir[256];
    void *base;
    size_t bytes;
    int counted;              /* this rank counted itself as mapped */
    loom_arena_ctl_t *ctl;    /* [nranks] */
    loom_arena_cell_t *cells; /* [nranks][LOOM_ARENA_CELLS] */
    uint8_t *slots;           /* [nranks] x slot_bytes, half a page past page alignment */
    size_t slot_bytes;
    int cma;        /* the smallest vote: 0 no single copy, else the agreed LOOM_SHM_COLL_CMA */
    int copy_fast;  /* every rank's kernel copy beat two memcpys */
    int *pids;      /* [nranks] pids for process_vm_readv */
    uint64_t probe; /* the word peers read in the probe */
    /* Collectives' bookkeeping (identical on every rank while calls match). */
    uint64_t calls;                       /* calls begun */
    uint64_t rounds;                      /* slot halves handed out */
    uint64_t seq;                         /* sequence number of the call under way */
    uint64_t desc_need[2];                /* peers' flag before this rank rewrites descriptor [p] */
    uint64_t half_need[2];                /* peers' flag before this rank rewrites slot half [h] */
    uint64_t cells_free;                  /* every peer's flag is known to be at least this */
    uint64_t cell_last[LOOM_ARENA_CELLS]; /* the call that last wrote each cell (0: none) */
};

/* shm_arena_sync.c: waking the sleepers after a publish. */
void loom_arena_wake_all(loom_arena_t *a);

#endif

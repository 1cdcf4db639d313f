/* SPDX-License-Identifier: Apache-2.0
 *
 * arena.h - the seam between the shared-memory collectives and the shm
 * transport: the memory and flag primitives of a communicator's arena
 * (implemented in shm/shm_arena*.c). The shm collectives
 * (src/collectives/shm/) are its only users; everything else reaches
 * peers through p2p.h.
 *
 * The contract. When every rank of the communicator reaches every other
 * over shm and every rank wants it (LOOM_SHM_COLL), the communicator has one
 * arena mapped by all of its ranks (docs/shm-collectives.md). It gives:
 *   flags        per rank one 64-bit progress counter that only the rank
 *                writes, always upwards ((seq << 24) | step), with release
 *                semantics for what was written before it; peers compare
 *                it with >= (post, flag, wait);
 *   descriptors  per rank one call descriptor, double-buffered by call
 *                (begin, peer_desc, peer_desc_of);
 *   slot halves  per rank one data slot of LOOM_SHM_COLL_BYTES in two
 *                halves, double-buffered by round (next_half, half,
 *                half_acquire, half_release);
 *   cells        per rank a ring of one-line cells for calls whose data
 *                fits 48 bytes (tiny_begin, cell_publish, cell_wait,
 *                tiny_end, peer_cell);
 *   single copy  reads straight from a peer's memory, where the ranks agreed
 *                at creation that process_vm_readv works between them (read);
 *   failure      every wait is bounded as loom_p2p_wait_all's (timeout
 *                without progress, abort, a peer's notice or death, a peer's
 *                broken or left arena state) and a failure breaks the
 *                communicator's point-to-point layer, so that every rank
 *                fails (fail, mismatch, mismatch_any, check_peers).
 * What the arena does not do: it chooses no algorithm, copies no user data
 * into the halves and reduces nothing; those are the collectives'.
 *
 * What a descriptor means to the arena: seq and round are the arena's own
 * (ordering and a consistency check of the rounds); kind, dt, op, root and
 * count are the call's fields in the terms of loom_p2p_set_call (kind is an
 * index into the names given there), compared with this rank's call only to
 * name a difference as every rank's InvalidUsage (mismatch); algo is the
 * collectives' own word and opaque here: they compare it themselves; send and
 * recv are addresses in the rank's process, for single copy.
 *
 * Its life. The shm collectives own it (src/collectives/shm/shm_open.c): they
 * create it as the communicator's collective context is set up, once the
 * point-to-point layer is up (loom_arena_create: collective, and every rank
 * comes to the same answer on whether there is one), and make loom_arena_break
 * the layer's break hook (loom_p2p_on_break), so that the arena breaks
 * whenever the layer does: after the layer's notices, which its waiters then
 * read at once, and before its connections close. A rank that fails to
 * create it fails the communicator's creation, which breaks the layer with
 * that result (loom_p2p_fail), so peers still creating it fail too instead of
 * waiting for it. They destroy it after the layer (loom_p2p_destroy), once no
 * wait on it can run.
 *
 * One call at a time per communicator, like every collective.
 */
#ifndef LOOM_ARENA_H
#define LOOM_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "p2p.h"

typedef struct loom_arena loom_arena_t;

// ---- life -------------------------------------------------------------------------
/* Creates and maps the arena of the communicator whose point-to-point layer
 * is p2p when the communicator qualifies (nranks > 1, LOOM_SHM_COLL in every
 * process, every peer over shm), and agrees on single copy; else *arena_p =
 * NULL. args: what the layer was created with (ranks, peers, secret, timeout,
 * the communicator's abort flag). Collective over the communicator's ranks,
 * bounded like every wait (a failed wait breaks the layer); a failure of its
 * own (memory, a full /dev/shm) is only returned. */
loomResult_t loom_arena_create(loom_p2p_t *p2p, const loom_tp_init_args_t *args,
                               loom_arena_t **arena_p);
/* Marks this rank broken in call `seq` and wakes every sleeper, so that peers
 * waiting on its flag look at its notice at once; from then on
 * loom_arena_broken. The layer's break hook calls it. NULL is allowed. */
void loom_arena_break(loom_arena_t *a, uint64_t seq);
/* 1 once loom_arena_break ran: no call may use the arena any more. */
int loom_arena_broken(const loom_arena_t *a);
/* Marks this rank gone (unless it broke), unmaps and frees. Removes the name
 * if not every rank mapped it (a peer died during creation). NULL is allowed. */
loomResult_t loom_arena_destroy(loom_arena_t *a);

/* A flag value: the call's sequence number and a step within it (< 2^24).
 * Creation uses seq 0; a later call's flags exceed every flag of an earlier one. */
#define LOOM_ARENA_STEP_MAX 0xFFFFFFu
static inline uint64_t loom_arena_mkflag(uint64_t seq, uint64_t step)
{
    return (seq << 24) | step;
}

/* What a rank says about its call; peers compare it with theirs (see the
 * top of this file for which fields mean what to the arena). */
typedef struct {
    uint64_t seq;  /* collective sequence number */
    uint32_t kind; /* the call's kind, as loom_p2p_call_t.kind */
    uint32_t algo; /* opaque to the arena: the collectives' algorithm id */
    int32_t dt, op, root;
    uint32_t round; /* rounds handed out before this call (a consistency check) */
    uint64_t count;
    uint64_t send, recv; /* buffer addresses in the rank's process (single copy) */
} loom_arena_desc_t;

/* Bytes of one slot half. */
size_t loom_arena_half_bytes(const loom_arena_t *a);
/* Starts call seq: waits until every peer is past the call that last used
 * this rank's descriptor buffer, then publishes d (its round is filled in).
 * The first flag a rank posts in a call must come after this. */
loomResult_t loom_arena_begin(loom_arena_t *a, loom_arena_desc_t *d);
/* Copy of rank's descriptor of the current call (valid once its flag shows
 * it began the call). */
void loom_arena_peer_desc(const loom_arena_t *a, int rank, loom_arena_desc_t *d);
/* Publishes this rank's flag (release) and wakes sleeping peers. */
void loom_arena_post(loom_arena_t *a, uint64_t flag);
uint64_t loom_arena_flag(const loom_arena_t *a, int rank);
/* Waits until rank's flag (every other rank's if rank < 0) is >= flag. */
loomResult_t loom_arena_wait(loom_arena_t *a, int rank, uint64_t flag);
/* The half of the next round (every rank takes one per round, writers or not). */
unsigned loom_arena_next_half(loom_arena_t *a);
/* Rank's slot half h. */
uint8_t *loom_arena_half(loom_arena_t *a, int rank, unsigned h);
/* Before writing half h: waits until every peer posted the flag given at its
 * last release (they finished reading it). */
loomResult_t loom_arena_half_acquire(loom_arena_t *a, unsigned h);
/* After the round that wrote half h: peers are done with it once they post a
 * flag >= need (a later call's flags always are). */
void loom_arena_half_release(loom_arena_t *a, unsigned h, uint64_t need);

// ---- tiny calls -------------------------------------------------------------------
// Each rank also owns a ring of LOOM_ARENA_CELLS one-line cells, indexed by
// sequence number, that carry a packed descriptor and up to
// LOOM_ARENA_CELL_BYTES of data; a peer waiting for a cell gets all of it with
// one cache miss, and a rank that does not wait for its peers runs ahead by
// up to LOOM_ARENA_CELLS - 1 calls. Tiny calls take no descriptor buffer and
// no slot half, so they do not count in the rounds and calls above.
#define LOOM_ARENA_CELL_BYTES 48u

/* x86 load/store disambiguation compares the low 12 address bits: a copy whose destination lies
 * less than LOOM_ARENA_ALIAS_NEAR bytes past its source modulo LOOM_ARENA_ALIAS_SPAN can have
 * its loads wait on its own recent stores, so loom_shm_copy runs such copies backwards where that
 * measured faster (the copy-direction probe, shm_common.c). The slots sit half a span past a
 * page boundary (shm_arena.c), where neither a page-aligned user buffer nor one 16 bytes past
 * it comes that near, in either direction. */
#define LOOM_ARENA_ALIAS_SPAN 4096u
#define LOOM_ARENA_ALIAS_NEAR 1024u
/* The packed descriptor of a tiny call: what loom_arena_desc_t says minus
 * the buffers and rounds (count < 256 because the data fits a cell). */
static inline uint64_t loom_arena_tiny_desc(uint32_t kind, int32_t dt, int32_t op, uint64_t count,
                                            int32_t root)
{
    return (uint64_t)(kind & 0xffu) | (uint64_t)(dt & 0xff) << 8 | (uint64_t)(op & 0xff) << 16 |
           (uint64_t)(count & 0xffu) << 24 | (uint64_t)(uint32_t)root << 32;
}
/* Starts tiny call seq. Every rank ends it with loom_arena_tiny_end. */
void loom_arena_tiny_begin(loom_arena_t *a, uint64_t seq);
/* Writes this rank's cell of the current call (desc and bytes <= 48 of
 * data), then posts the call's flag (seq, 1). Waits first (rarely) until
 * every peer ended the call that last wrote the cell. */
loomResult_t loom_arena_cell_publish(loom_arena_t *a, uint64_t desc, const void *data,
                                     size_t bytes);
/* Posts the call's flag (seq, 2): this rank reads no more cells of the call. */
void loom_arena_tiny_end(loom_arena_t *a);
/* Waits for rank's cell of the current call; *data_p points at its data (valid
 * until this rank posts a flag of a later call) and *desc_p is its packed
 * descriptor. InvalidUsage if rank posted the call without a cell (it runs
 * another collective or size: mismatched calls). */
loomResult_t loom_arena_cell_wait(loom_arena_t *a, int rank, const uint8_t **data_p,
                                  uint64_t *desc_p);
/* 1 and *desc_p if rank's cell of call seq holds that call (for messages about
 * mismatched calls). */
int loom_arena_peer_cell(const loom_arena_t *a, int rank, uint64_t seq, uint64_t *desc_p);

// ---- single copy and failures -------------------------------------------------------
/* 0 unless every rank can read every other's memory (process_vm_readv); then
 * the smallest LOOM_SHM_COLL_CMA among the ranks (1 or 2), agreed at creation. */
int loom_arena_single_copy(const loom_arena_t *a);
/* 1 if every rank's kernel copied faster than two memcpys of the same bytes
 * (loom_arena_kernel_copy_fast), agreed at creation; asked only where single
 * copy is LOOM_SHM_COLL_CMA=1. */
int loom_arena_copy_fast(const loom_arena_t *a);
/* 1 if this process's process_vm_readv copies a buffer in less time than two
 * memcpys of it (shm_copy_probe.c): single copy replaces two copies through
 * the arena with one kernel copy. Measured once per process, about 1 ms. */
int loom_arena_kernel_copy_fast(void);
/* The same probe's kernel copy in ns per byte (the best of its copies of 1 MiB), measured on
 * first use; 0 where process_vm_readv failed. The cost model prices single copy with it. */
double loom_arena_kernel_copy_ns(void);
/* Single copy: nbytes from address addr of rank's process into dst. */
loomResult_t loom_arena_read(loom_arena_t *a, int rank, void *dst, uint64_t addr, size_t nbytes);
/* Fails the call (and breaks the layer) with res; the message is detail. */
loomResult_t loom_arena_fail(loom_arena_t *a, loomResult_t res, const char *detail);
/* rank's descriptor `theirs` of the current call differs from this rank's:
 * where it differs in a field every rank must pass alike (loom_p2p_set_call),
 * fails the call as a difference found in a message does (InvalidUsage on
 * every rank, naming the field); otherwise (the algorithm, the rounds) as
 * loom_arena_fail(a, InvalidUsage, detail). */
loomResult_t loom_arena_mismatch(loom_arena_t *a, int rank, const loom_arena_desc_t *theirs,
                                 const char *detail);
/* A peer ran the current call without the cell this rank waited for: the
 * first peer whose descriptor or cell of the call shows a field that differs
 * from this rank's call fails it as loom_arena_mismatch does; if none does,
 * loom_arena_fail(a, InvalidUsage, detail). */
loomResult_t loom_arena_mismatch_any(loom_arena_t *a, const char *detail);
/* rank's descriptor of call seq, if it published one (it runs that call
 * without a tiny-call cell): 1 and *d. */
int loom_arena_peer_desc_of(const loom_arena_t *a, int rank, uint64_t seq, loom_arena_desc_t *d);
/* RemoteError (through the layer) if a peer broke during the call; used after
 * the last single-copy read, so a peer that failed and may have released its
 * buffers is never read from silently. */
loomResult_t loom_arena_check_peers(loom_arena_t *a);

#endif

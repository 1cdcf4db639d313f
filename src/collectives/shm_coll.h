/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_coll.h - the shared-memory collectives: algorithms over the
 * communicator's arena (p2p.h) for communicators whose ranks all share one
 * host over shm. Three families, all with the reduction order of kernels.h
 * (rank 0..n-1 by a single owner per element, so results are bitwise equal to
 * the point-to-point algorithms'):
 *   tiny  calls whose input per rank fits one 48-byte cell (shm_tiny.c);
 *   flat  (AllReduce, Reduce): copy in, one flag, every rank (the root)
 *         reduces the whole vector from the slots; for vectors that fit a
 *         slot half;
 *   cico  copy-in/copy-out through the slots, in rounds of one slot half,
 *         double-buffered so that round k+1's copy-in overlaps round k's reads;
 *   cma   single copy: ranks read their part of each peer's buffer with
 *         process_vm_readv and only stage results in the slots.
 * The "shm" entry of each collective picks tiny, then flat for small
 * all-reduces and reduces, else
 * cico (cma only with LOOM_SHM_COLL_CMA=2: measured slower, see the doc).
 * Files: shm_common.c (call start, checks, the reduce loop, selection),
 * shm_reduce.c (AllReduce, ReduceScatter, Reduce), shm_move.c (AllGather,
 * Broadcast, AllToAll, Barrier). docs/shm-collectives.md has the protocols.
 */
#ifndef LOOM_SHM_COLL_H
#define LOOM_SHM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "coll.h"
#include "p2p.h"

/* Algorithm ids, carried in the call descriptor: ranks that run different
 * algorithms on one call fail instead of misreading each other's slots. */
enum { SHM_ALGO_FLAT = 1, SHM_ALGO_CICO, SHM_ALGO_CMA, SHM_ALGO_BARRIER, SHM_ALGO_TINY };

/* Entry points for algo_select.c's table. "shm" picks by size; the others
 * force one family (LOOM_ALGO=allreduce:shm_cico). */
loomResult_t loom_allreduce_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_shm_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_shm_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_barrier_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* Largest AllReduce and Reduce for flat: one flag and n S of reduction beat
 * cico's two flags per round below it. */
#define SHM_FLAT_MAX_BYTES 16384u
/* Reduce stays flat while the root's n S of reduction is at most this: its
 * non-roots copy in and leave, where cico makes every rank wait for every
 * round (2 ranks, interleaved: 64 KiB 12.1 -> 9.8 us, 256 KiB 27 -> 16 us;
 * 8 ranks on 2 CPUs 256 KiB 59 -> 75 us, past the limit). */
#define SHM_REDUCE_FLAT_MAX_WORK (1u << 20)
/* The variant (SHM_ALGO_*) the "shm" entry of collective kind runs for a call
 * whose loom_coll_bytes is `bytes` on n ranks: tiny where a rank's input fits
 * a cell, flat for small AllReduce and Reduce (SHM_FLAT_MAX_BYTES;
 * Reduce while n S <= SHM_REDUCE_FLAT_MAX_WORK), else cma or cico (Barrier:
 * SHM_ALGO_BARRIER). cma_mode (the agreed LOOM_SHM_COLL_CMA, loom_shm_pick): 0 never cma; 1 cma
 * where it measured faster (AllGather, AllToAll, Broadcast and ReduceScatter in size windows,
 * narrow ones unless kernel_fast (loom_arena_copy_fast), never when crowded: more ranks than CPUs);
 * 2 always. Pure, so that loom_info's decision table shows what runs; equal on every rank of a
 * call. */
uint32_t loom_shm_variant(loom_coll_kind_t kind, size_t bytes, int n, int cma_mode, int crowded,
                          int kernel_fast);
/* 1 if n ranks on this machine are more than its online CPUs. */
int loom_shm_crowded(int n);
/* "shm_tiny", "shm_flat", ... for an SHM_ALGO_* id. */
const char *loom_shm_algo_name(uint32_t algo);

/* loom_shm_variant for this call on ctx's communicator (the same answer on
 * every rank for matching calls). */
uint32_t loom_shm_pick(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
/* Runs the variant loom_shm_pick chooses: tiny, flat (NULL where the
 * collective has none), cma or cico. The "shm" entries are this. */
loomResult_t loom_shm_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, loom_algo_fn_t flat,
                          loom_algo_fn_t cico, loom_algo_fn_t cma);
/* The tiny family (shm_tiny.c): calls whose input per rank fits one arena cell
 * (48 bytes) of AllReduce, ReduceScatter, Reduce, AllGather, Broadcast and
 * AllToAll; the "shm" entries run it where loom_shm_pick says SHM_ALGO_TINY. */
loomResult_t loom_shm_tiny(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* 1 if the algorithm called name can run on ctx's communicator now: any
 * non-shm algorithm; a shm_* one needs the arena, and a *_cma one single
 * copy too. algo_select.c skips the others (a forced one included). */
int loom_shm_algo_usable(loom_coll_ctx_t *ctx, const char *name);

// ---- shared by shm_*.c ------------------------------------------------------------------

/* 1 if every rank agreed at creation that process_vm_readv works. */
int loom_shm_single_copy_agreed(loom_coll_ctx_t *ctx);

/* One call on the arena. */
typedef struct {
    loom_coll_ctx_t *ctx;
    const loom_coll_args_t *a;
    loom_arena_t *ar;
    int n, me;
    uint64_t seq;
    size_t es;              /* element bytes */
    int stream;             /* copies into recvbuff bypass the cache (loom_shm_copy) */
    int stream_in;          /* copies into the arena bypass the cache (shm_stream_in_if) */
    loom_arena_desc_t desc; /* this rank's, as published */
} shm_call_t;

static inline uint64_t shm_flag(const shm_call_t *c, uint64_t step)
{
    return loom_arena_mkflag(c->seq, step);
}

#define SHM_STEP_ARRIVE 1u
#define SHM_STEP_DONE   LOOM_ARENA_STEP_MAX /* after every other step of a call */

/* 1 if a call of `rounds` rounds posting `per_round` steps each stays below
 * SHM_STEP_DONE; callers fall back to the point-to-point algorithm otherwise
 * (tiny slots and huge calls), which every rank decides alike. */
static inline int shm_rounds_fit(size_t rounds, unsigned per_round)
{
    return rounds < (SHM_STEP_DONE - 4) / per_round;
}

/* Fills c's call fields (not its descriptor); InternalError without an arena. */
loomResult_t loom_shm_call_init(shm_call_t *c, loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
/* Fills c->desc for algorithm algo (fields a collective does not use are 0). */
void loom_shm_describe(shm_call_t *c, uint32_t algo);
/* The descriptor a tiny call packed into its cell (p2p.h), as a full one. */
void loom_shm_tiny_unpack(uint64_t packed, uint64_t seq, loom_arena_desc_t *d);
/* Fails the call with InvalidUsage naming both calls (and breaks the layer). */
loomResult_t loom_shm_mismatch(shm_call_t *c, int rank, const loom_arena_desc_t *theirs);
/* Starts a call: fills c, publishes the descriptor (no flag yet). */
loomResult_t loom_shm_begin(shm_call_t *c, loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                            uint32_t algo);
/* InvalidUsage (breaking the communicator) unless rank's descriptor equals
 * this rank's; rank < 0: every peer's. Call after waiting for its first flag. */
loomResult_t loom_shm_check(shm_call_t *c, int rank);
/* Ends a call: RemoteError if a peer broke meanwhile (an aborted peer may have
 * left its slot half-written, or released buffers this rank read), so that
 * no call succeeds alongside a peer's failure it depended on. */
static inline loomResult_t loom_shm_end(shm_call_t *c)
{
    return loom_arena_check_peers(c->ar);
}
/* Ends a single-copy call: posts DONE, waits for every peer's DONE (nobody
 * reads this rank's buffers any more), then fails if a peer broke meanwhile. */
loomResult_t loom_shm_finish_single_copy(shm_call_t *c);

/* Smallest output (bytes one call writes into recvbuff) that the copies out
 * of the arena write with non-temporal stores: a larger output does not stay
 * in cache anyway, and streaming it skips reading each destination line
 * before overwriting it (a third of the memory traffic of a copy). */
#define SHM_STREAM_MIN_BYTES (4u << 20)
/* Sets c->stream for a call that writes out_bytes into recvbuff; cached: 1
 * if the destination was read just before (in place), where a normal store
 * is cheaper. */
static inline void shm_stream_if(shm_call_t *c, size_t out_bytes, int cached)
{
    c->stream = !cached && out_bytes >= SHM_STREAM_MIN_BYTES;
}
/* Smallest Broadcast that copies into the arena past the cache (below),
 * with a CPU per rank and with more ranks than CPUs. */
#define SHM_STREAM_IN_BCAST_MIN         SHM_STREAM_MIN_BYTES
#define SHM_STREAM_IN_BCAST_CROWDED_MIN (256u << 10)
/* Sets c->stream_in for a call that copies in_bytes into the arena: while a
 * rank finds its copies to or from the halves slow (loom_arena_copies_slow),
 * from LOOM_ARENA_SLOW_COPY_MIN on, and from `from` bytes on (0: never; a
 * Broadcast passes SHM_STREAM_IN_BCAST_MIN or _CROWDED_MIN), copies in use
 * non-temporal stores: the lines go to memory instead of staying in the
 * writer's cache, where the readers' cores must fetch them and the writer
 * must win them back. Moving lines between cores is where this machine's
 * virtual CPUs are slowest and least steady: in the phases where it crawls,
 * 2-rank Broadcast 1 MiB 380-457 -> 59-94 us and 16 MiB 7.2-8.0 -> 0.85-0.9 ms;
 * 4-rank AllGather 1 MiB 327-357 -> 111-163 us. LOOM_SHM_STREAM_IN=1 or -1
 * overrides. Otherwise only Broadcast gains: with a CPU per rank from 4 MiB
 * (366-410 -> 247-260 us, 16 MiB 1.55-1.66 -> 1.0 ms; 1 MiB lost, 60-72 ->
 * 77-104 us), with 4 ranks on 2 CPUs from 256 KiB (55-57 -> 40-46 us, 1 MiB
 * 150 -> 100-105, 16 MiB 2.8-3.1 -> 1.8-2.2 ms; 8 ranks 1 MiB 240-287 ->
 * 171-175 us). AllToAll, ReduceScatter and AllReduce lost 15-50 % at 1 and
 * 16 MiB, with 2 ranks and with 4; AllGather went either way. */
static inline void shm_stream_in_if(shm_call_t *c, size_t in_bytes, size_t from)
{
    const int mode = loom_arena_stream_in_mode(c->ar); /* LOOM_SHM_STREAM_IN */
    c->stream_in =
        mode > 0 ||
        (mode == 0 && ((from > 0 && in_bytes >= from) ||
                       (in_bytes >= LOOM_ARENA_SLOW_COPY_MIN && loom_arena_copies_slow(c->ar))));
}
/* Copies of bytes into this rank's half (c->stream_in applies) and out of a
 * peer's half into recvbuff (c->stream applies); long ones are timed for
 * loom_arena_note_copy. */
void loom_shm_copy_in(const shm_call_t *c, void *dst, const void *src, size_t bytes);
void loom_shm_copy_out(const shm_call_t *c, void *dst, const void *src, size_t bytes);
/* memcpy, with non-temporal stores if stream (x86-64; fenced before it
 * returns, so a flag posted next orders after the data). Every copy into or
 * out of the arena goes through it: where the destination lies just past the
 * source modulo 4 KiB it copies backwards itself (see shm_common.c). */
void loom_shm_copy(void *dst, const void *src, size_t bytes, int stream);

/* Elements per reduction block: 128 KiB of data or accumulators, so that a
 * block's accumulators and the block being added stay in L2. */
size_t loom_shm_block_elems(loomDataType_t dt);
/* dst[0..len) (and a copy in dst2, if not NULL) = the reduction over ranks
 * 0..n-1 of srcs[r][0..len), in rank order: in dst itself when the datatype is
 * its own accumulator and no source overlaps dst (srcs[0] may equal it), else
 * through acc (len accumulators). dst2 must not overlap anything. */
void loom_shm_reduce(const shm_call_t *c, const void *const *srcs, size_t len, void *acc, void *dst,
                     void *dst2);
/* Scratch for the accumulators and one block from a peer. */
loomResult_t loom_shm_scratch(shm_call_t *c, uint8_t **acc_p, uint8_t **tmp_p);

#endif

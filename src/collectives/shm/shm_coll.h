/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_coll.h - the shared-memory collectives: algorithms over the
 * communicator's arena (arena.h) for communicators whose ranks all share one
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
 * The "shm" entry of each collective runs the variant that shm_plan.c's rules
 * choose from the machine's measured properties (shm_plan.h).
 * Files: shm_open.c (the arena's life in the collective context),
 * shm_common.c (call start, checks, the reduce loop, copies), shm_tiny.c,
 * shm_reduce.c (AllReduce, ReduceScatter, Reduce), shm_move.c (AllGather,
 * Broadcast, AllToAll, Barrier), shm_plan.c and shm_machine.c (the plan).
 * docs/shm-collectives.md has the protocols.
 */
#ifndef LOOM_SHM_COLL_H
#define LOOM_SHM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "coll.h"
#include "p2p.h"
#include "shm_plan.h"

/* The arena's life (shm_open.c). open: creates ctx's arena where the
 * communicator qualifies (arena.h: loom_arena_create, collective; args are
 * what its point-to-point layer was created with) and makes its break the
 * layer's break hook; ctx->p2p and the ranks must be set. close: destroys it,
 * after loom_p2p_destroy of ctx's layer. */
loomResult_t loom_shm_open(loom_coll_ctx_t *ctx, const loom_tp_init_args_t *args);
loomResult_t loom_shm_close(loom_coll_ctx_t *ctx);
/* ctx's arena, or NULL when its communicator has none or its layer broke. */
loom_arena_t *loom_shm_arena(const loom_coll_ctx_t *ctx);

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

/* What the plan knows of ctx's machine: the caches, the CPUs, and what its
 * arena's ranks agreed at creation (the same on every rank); loom_coll_ctx_init
 * keeps it in ctx->shm. */
void loom_shm_machine(loom_coll_ctx_t *ctx, loom_shm_machine_t *m);
/* m for this process's CPUs, page and caches (loom_shm_caches) and the given arena facts;
 * loom_info fills one for an arena it assumes. */
void loom_shm_machine_fill(loom_shm_machine_t *m, size_t half, int single_copy, int kernel_fast);
/* What the arena probe measured on this rank, ns: a flag round, a byte copied from lines this
 * core wrote, a byte copied from lines another core wrote while it copies the other way, and
 * while it does not (0 on rank 0, which measures no reader's time); and the median time of
 * each probed call (loom_shm_probe_slot; 0 for rank 0's Broadcast, its copy in alone). */
typedef struct {
    double flag_ns, local_ns, cross_ns, cross1_ns;
    double call_ns[LOOM_SHM_PROBE_TIERS][LOOM_SHM_PROBE_CALLS];
} loom_shm_probe_t;
/* The arena probe (shm_probe.c): the calls it times run ctx's next collective sequence
 * numbers. Every rank of ctx must call it. */
loomResult_t loom_shm_probe(loom_coll_ctx_t *ctx, loom_shm_probe_t *out);
/* The probe's block at footprint tier (0: the n blocks within a quarter of the L2, 1: within
 * the L2) on machine m with n ranks. */
size_t loom_shm_probe_block(const loom_shm_machine_t *m, int n, int tier);
/* loom_shm_plan for this call on ctx's communicator (the same answer on
 * every rank for matching calls). */
void loom_shm_plan_call(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, loom_shm_plan_t *p);
/* The variant loom_shm_plan_call chooses. */
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
    loom_shm_plan_t plan;   /* this call's store thresholds and block (loom_shm_begin) */
    int nt_out;             /* copies into recvbuff stream past the cache (shm_nt_out_if) */
    int nt_in;              /* copies into the arena stream past the cache (shm_nt_in_if) */
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

/* Fills c's call fields (not its descriptor nor its plan); InternalError without an arena. */
loomResult_t loom_shm_call_init(shm_call_t *c, loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
/* Fills c->desc for algorithm algo (fields a collective does not use are 0). */
void loom_shm_describe(shm_call_t *c, uint32_t algo);
/* The descriptor a tiny call packed into its cell (p2p.h), as a full one. */
void loom_shm_tiny_unpack(uint64_t packed, uint64_t seq, loom_arena_desc_t *d);
/* Fails the call with InvalidUsage naming both calls (and breaks the layer). */
loomResult_t loom_shm_mismatch(shm_call_t *c, int rank, const loom_arena_desc_t *theirs);
/* Starts a call: fills c and its plan, publishes the descriptor (no flag yet). */
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

/* Sets c->nt_out for a call that writes out_bytes into recvbuff; cached: 1
 * if the destination was read just before (in place), where it sits in cache
 * and a plain store is cheaper (unless LOOM_SHM_NT_STORES=1). */
static inline void shm_nt_out_if(shm_call_t *c, size_t out_bytes, int cached)
{
    c->nt_out = out_bytes >= c->plan.nt_out_min && (!cached || c->plan.nt_out_min == 0);
}
/* Sets c->nt_in for a call that copies in_bytes into the arena. */
static inline void shm_nt_in_if(shm_call_t *c, size_t in_bytes)
{
    c->nt_in = in_bytes >= c->plan.nt_in_min;
}
/* Copies of bytes into this rank's half (c->nt_in applies) and out of a
 * peer's half into recvbuff (c->nt_out applies). */
void loom_shm_copy_in(const shm_call_t *c, void *dst, const void *src, size_t bytes);
void loom_shm_copy_out(const shm_call_t *c, void *dst, const void *src, size_t bytes);
/* memcpy, with non-temporal stores if nt (x86-64; fenced before it
 * returns, so a flag posted next orders after the data). Every copy into or
 * out of the arena goes through it: where the destination lies just past the
 * source modulo 4 KiB it copies backwards itself if the copy-direction probe
 * found that faster (see shm_common.c). */
void loom_shm_copy(void *dst, const void *src, size_t bytes, int nt);
/* 1 if loom_shm_copy runs near pairs (arena.h) backwards: LOOM_SHM_COPY_BACKWARD, or where it is
 * -1 the copy-direction probe (once per process, about 0.1 ms): forward copies of near pairs
 * against a backward one, whichever was faster. */
int loom_shm_copy_backward_near(void);
/* What the probe measured: ns of a 32 KiB forward copy at the slowest near distance, and of a
 * backward one (runs the probe if it has not run). */
void loom_shm_copy_probe_result(double *forward_ns, double *backward_ns);
/* Tests: 1 or 0 forces the direction of near pairs over the parameter and the probe; -1 ends
 * that. */
void loom_shm_copy_force_backward(int mode);

/* Elements per reduction block of c's plan (data or accumulators, whichever
 * is wider), so that a block's accumulators and the block being added stay
 * in L2. */
size_t loom_shm_block_elems(const shm_call_t *c);
/* Room for the n source pointers of a reduction: small (SHM_SRCS_SMALL entries, the caller's)
 * where n fits it, else allocated; NULL, WARNed as rank's, when out of memory. Release with
 * loom_shm_srcs_free. */
#define SHM_SRCS_SMALL 16
const void **loom_shm_srcs(int n, int rank, const void **small);
void loom_shm_srcs_free(const void **srcs, const void **small);
/* dst[0..len) (and a copy in dst2, if not NULL) = the reduction over ranks
 * 0..n-1 of srcs[r][0..len), in rank order: in dst itself when the datatype is
 * its own accumulator and no source overlaps dst (srcs[0] may equal it), else
 * through acc (len accumulators). dst2 must not overlap anything. */
void loom_shm_reduce(const shm_call_t *c, const void *const *srcs, size_t len, void *acc, void *dst,
                     void *dst2);
/* Scratch for the accumulators and one block from a peer. */
loomResult_t loom_shm_scratch(shm_call_t *c, uint8_t **acc_p, uint8_t **tmp_p);

#endif

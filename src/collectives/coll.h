/* SPDX-License-Identifier: Apache-2.0
 *
 * coll.h - what a collective algorithm receives and the registry of
 * algorithms per collective. Every algorithm is a plain function with the
 * same signature plus a cost function (cost_model.h); algo_select.c picks one
 * per call from data (LOOM_ALGO, then the cheapest under the communicator's
 * link constants), never from if-chains spread through the code.
 * Algorithms talk to peers only through p2p.h and reduce only through kernels.h.
 *
 * Adding an algorithm is one row in the table of algo_select.c:
 *   {LOOM_COLL_ALLREDUCE, "ring", loom_allreduce_ring, loom_cost_allreduce_ring},
 * The name is the LOOM_ALGO spelling, the function has the loom_algo_fn_t
 * signature, and the cost function returns LOOM_COST_NA wherever the algorithm
 * cannot run (e.g. `link->cls != LOOM_LINK_SHM` for a shared-arena algorithm), so
 * the model never picks it there. Ties go to the earlier row. Rules every entry
 * keeps: the same bits on every rank and run to run (docs/ALGORITHMS.md), any
 * rank count, count 0, in place, every datatype and op. A reducing entry
 * states its order (loom_order_t): with LOOM_DETERMINISTIC=1 only entries that
 * add in rank order compete.
 */
#ifndef LOOM_COLL_H
#define LOOM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "cost_model.h"
#include "loom.h"
#include "p2p.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LOOM_COLL_ALLREDUCE,
    LOOM_COLL_ALLGATHER,
    LOOM_COLL_REDUCE_SCATTER,
    LOOM_COLL_BCAST,
    LOOM_COLL_REDUCE,
    LOOM_COLL_ALLTOALL,
    LOOM_COLL_ALLTOALLV,
    LOOM_COLL_BARRIER,
    LOOM_COLL_ALLGATHERV,
    LOOM_COLL_REDUCE_SCATTERV,
    LOOM_COLL_NUM
} loom_coll_kind_t;

/* One call's arguments, exactly as the public API received them (validated). */
typedef struct {
    loom_coll_kind_t kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count; /* the API's count: per rank for allgather/reduce_scatter/alltoall; the sum of
                     recvcounts for the V collectives */
    loomDataType_t dt;
    loomRedOp_t op;
    int root;
    /* [nranks], owned copies: all four for alltoallv; recvcounts and rdispls (each block's
     * first element in recvbuff, or in sendbuff for reducescatterv) for the V collectives. */
    const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
} loom_coll_args_t;

struct loom_algo;

/* The order in which an algorithm combines the ranks' contributions to an
 * element (docs/ALGORITHMS.md, Determinism). */
typedef enum {
    LOOM_ORDER_RANK, /* rank order 0, 1, ..., n-1 (include/loom.h), or no reduction */
    LOOM_ORDER_PAIR, /* an order of its own from 3 ranks; rank order for 1 or 2 */
    LOOM_ORDER_OWN   /* an order of its own: the same bits on every rank and run to run */
} loom_order_t;

/* The last algorithm chosen for one collective (algo_select.c), reused while
 * the inputs of the choice are unchanged: the datatype, the bytes of the call,
 * the largest block of a V call, the arena and the parameters (param_gen); the link constants
 * are fixed at
 * creation. */
typedef struct {
    const struct loom_algo *algo; /* NULL: empty */
    const void *arena;            /* loom_shm_arena() when chosen (NULL once broken) */
    double predicted_ns;          /* the model's time for it */
    size_t nbytes;                /* loom_cost_call_t.nbytes of the call */
    size_t max_block;             /* loom_cost_call_t.max_block of the call */
    loomDataType_t dt;
    unsigned param_gen; /* loom_param_generation() when chosen */
} loom_algo_memo_t;

/* Where the communicator's ranks live: hosts from the peers' host hashes,
 * numbered by their first rank, and local indices in rank order. The
 * hierarchical algorithms (algo_hier.c) run when there are several hosts with
 * the same number (ppn > 1) of ranks on each. */
typedef struct {
    int nhosts;     /* distinct hosts */
    int ppn;        /* ranks per host when every host has the same number, else 0 */
    int host;       /* this rank's host */
    int lrank;      /* this rank's index among its host's ranks */
    int *host_of;   /* [nranks]: host of each rank */
    int *rank_of;   /* [nhosts * ppn] when ppn > 0: the rank of local index l on host h at
                       h * ppn + l; NULL otherwise */
    int *rail;      /* [nhosts] when ppn > 0: the rank with this rank's local index on each host */
    int contiguous; /* every host's ranks are consecutive (order[i] == i) */
    int *order;     /* [nranks]: the ranks host by host (hosts in order, ranks in order) */
    int pos;        /* this rank's index in order */
} loom_hosts_t;

/* Calls the arena probe times, one per collective and variant (shm_probe.c), each at
 * LOOM_SHM_PROBE_TIERS footprints: within a quarter of the L2, and filling it. */
#define LOOM_SHM_PROBE_CALLS 8
#define LOOM_SHM_PROBE_TIERS 2

/* What the shared-memory plan (shm_plan.h) knows of the machine, fixed when the communicator
 * is made. Caches in bytes, 0 where unknown. */
typedef struct {
    int cpus;           /* online CPUs */
    size_t l1d, l2, l3; /* one core's L1 data cache and L2; one package's L3 */
    size_t half;        /* bytes of an arena slot half (one round of cico) */
    size_t page;        /* the memory page */
    int single_copy;    /* agreed at creation: 0 none, 1 where the rules say, 2 always */
    int kernel_fast;    /* every rank's kernel copy beat two memcpys (creation probe) */
    /* Only the prediction reads these (shm_cost.c), never a choice; 0 unknown. */
    double kernel_ns; /* this process's kernel copy, ns per byte (the kernel-copy probe) */
    /* Copies of near pairs run backwards (loom_shm_copy_backward_near), and what the
     * copy-direction probe measured (ns of 32 KiB forwards at the worst distance, backwards;
     * 0 where LOOM_SHM_COPY_BACKWARD decided). */
    int copy_backward;
    double copy_forward_ns, copy_backward_ns;
    /* The arena probe (shm_probe.c), agreed at creation: a flag round, a byte copied from
     * lines this core wrote, from lines another core wrote while it copies the other way
     * (both ways), and while it does not (one way). */
    double flag_ns, local_ns, cross_ns, cross1_ns;
    /* The probe's own time of one call of each collective and variant it times at each of its
     * footprints (tier 0 in cache, tier 1 filling the L2; the slots are shm_probe.c's), and the
     * ranks that ran them: a call's time holds for as many. */
    double call_ns[LOOM_SHM_PROBE_TIERS][LOOM_SHM_PROBE_CALLS];
    int probe_ranks;
    /* ns per byte of memcpy from memory to memory with every CPU copying (LOOM_SHM_MEMORY_MBPS;
     * 0 unknown). */
    double memory_ns;
} loom_shm_machine_t;

/* Per-communicator state shared by all algorithms. An algorithm may run on a
 * part of the communicator (a host's ranks, or one rank per host): its
 * context then numbers that part's ranks 0..nranks-1 and `group` maps them to
 * the communicator's ranks; every send and receive goes through
 * loom_coll_isend / loom_coll_irecv, which apply the map. */
typedef struct {
    loom_p2p_t *p2p;
    int rank;
    int nranks;
    const int *group;       /* [nranks] communicator rank of each rank; NULL: the identity */
    loom_hosts_t hosts;     /* the whole communicator's layout (unused in a part's context) */
    loom_link_cost_t intra; /* constants of the links inside a host (hierarchical costs) */
    uint8_t *hier_buf;      /* the hierarchical algorithms' partials, grown on demand */
    size_t hier_bytes;
    uint64_t seq;     /* sequence number of the running collective (tags, messages) */
    uint8_t *scratch; /* grows on demand up to scratch_limit */
    size_t scratch_bytes;
    size_t chunk_bytes;    /* pipeline chunk per peer (LOOM_CHUNK_BYTES) */
    loom_link_cost_t link; /* the communicator's link class and its constants, equal on all
                              ranks (loom_coll_ctx_init) */
    int ring_depth;        /* ring segments in flight per step, equal on all ranks */
    loom_algo_memo_t memo[LOOM_COLL_NUM]; /* last choice per collective */
    loom_shm_machine_t shm;               /* with an arena: what its plan reads */
    double cache_bytes; /* the L2 the cost model reads (loom_cost_call_t), equal on all ranks */
    struct loom_arena *arena; /* the shm collectives' arena (arena.h), NULL if none; owned here
                                 (shm/shm_open.c), read through loom_shm_arena */
} loom_coll_ctx_t;

/* Point-to-point within the context's group (peer is a rank of the context). */
static inline int loom_coll_peer(const loom_coll_ctx_t *ctx, int peer)
{
    return ctx->group ? ctx->group[peer] : peer;
}
static inline loomResult_t loom_coll_isend(loom_coll_ctx_t *ctx, int peer, const void *buf,
                                           size_t nbytes, uint32_t tag, loom_p2p_req_t *req)
{
    return loom_p2p_isend(ctx->p2p, loom_coll_peer(ctx, peer), buf, nbytes, tag, req);
}
static inline loomResult_t loom_coll_irecv(loom_coll_ctx_t *ctx, int peer, void *buf, size_t nbytes,
                                           uint32_t tag, loom_p2p_req_t *req)
{
    return loom_p2p_irecv(ctx->p2p, loom_coll_peer(ctx, peer), buf, nbytes, tag, req);
}

typedef loomResult_t (*loom_algo_fn_t)(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* One row of the algorithm table. Contract of the members:
 *  kind: the collective it implements;
 *  name: its LOOM_ALGO spelling, unique within the collective;
 *  fn:   runs one call on every rank (all ranks run the same entry);
 *  cost: predicted time of a call on a link class, pure, LOOM_COST_NA where fn
 *        cannot run; the cheapest entry wins and ties go to the earlier row;
 *  order: how fn orders a reduction (LOOM_ORDER_RANK where it reduces nothing). */
typedef struct loom_algo {
    loom_coll_kind_t kind;
    const char *name;
    loom_algo_fn_t fn;
    loom_algo_cost_fn_t cost;
    loom_order_t order;
} loom_algo_t;

/* 1 when algo adds in rank order on a call of c->nranks ranks. */
static inline int loom_algo_rank_order(const loom_algo_t *algo, const loom_cost_call_t *c)
{
    return algo->order == LOOM_ORDER_RANK || (algo->order == LOOM_ORDER_PAIR && c->nranks <= 2);
}

/* Algorithms. The direct ones live in <collective>.c, the others in algo_*.c. */
loomResult_t loom_allreduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_reduce_bcast(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_rhd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_rd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_rhd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_rd(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_binomial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_scatter_allgather(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_binomial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_chain(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_bruck(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoallv_pairwise(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgatherv_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgatherv_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatterv_direct(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatterv_ring(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_barrier_dissemination(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allreduce_hier_chain(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_reduce_scatter_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_allgather_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_bcast_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoall_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
loomResult_t loom_alltoallv_hier(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* The algorithm a call would run now (LOOM_ALGO, then the model; NULL if
 * none can) and its predicted time in ns (LOOM_COST_NA where none is: one
 * rank). Reads ctx only. */
const char *loom_coll_plan(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, double *predicted_ns);
/* Runs one collective with the selected algorithm; *algo_name_p (may be NULL)
 * receives the algorithm's name. */
loomResult_t loom_coll_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                           const char **algo_name_p);
const char *loom_coll_name(loom_coll_kind_t kind);
/* The algorithm table, in tie-break order. */
const loom_algo_t *loom_algo_table(int *n_p);
/* Bytes one rank sends or receives at most (for traces and benchmarks). */
size_t loom_coll_bytes(const loom_coll_args_t *a, int nranks);
/* The cheapest entry of table[n] for kind (ties: the earlier entry), or NULL if
 * none can run; with call->rank_order, only entries that add in rank order
 * (loom_algo_rank_order) compete. *cost_p (may be NULL) gets its predicted
 * time in ns. Pure. */
const loom_algo_t *loom_algo_pick(const loom_algo_t *table, int n, loom_coll_kind_t kind,
                                  const loom_cost_call_t *call, const loom_link_cost_t *link,
                                  double *cost_p);
/* The cost model's view of a call, equal on every rank: for AllToAllv, whose
 * counts differ per rank, nbytes is 0 and its rows choose by the layout. */
loom_cost_call_t loom_coll_cost_call(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* Fills ctx for a new communicator whose point-to-point layer p2p was
 * created with args: rank, size, chunk, the host layout from args->peers,
 * the shm collectives' arena (loom_shm_open, collective; loom_coll_ctx_close
 * ends it), the link class (slowest link) and the constants of that class
 * and of the links inside a host: measured and agreed by every rank
 * unless LOOM_CALIBRATE=0 (calibrate.c), the built-in defaults otherwise,
 * LOOM_COST_<CLASS> over both. Across hosts the ranks agree on the class,
 * and beta follows the slowest rank's rate for it (loom_link_cost_with_rate):
 * tcp_mbps, the speed of the interface its TCP uses, or rdma_mbps, the rate
 * of its RDMA port (<= 0 unknown). Collective when measuring or across
 * hosts. */
loomResult_t loom_coll_ctx_init(loom_coll_ctx_t *ctx, loom_p2p_t *p2p,
                                const loom_tp_init_args_t *args, int tcp_mbps, int rdma_mbps);
/* Ends what ctx shares with its peers (the arena): after loom_p2p_destroy of
 * its layer, once no collective can run on it; also after a failed
 * loom_coll_ctx_init, and again does nothing. loom_coll_ctx_free frees the
 * rest. */
loomResult_t loom_coll_ctx_close(loom_coll_ctx_t *ctx);
/* The layout of nranks ranks with the given host hashes, seen from rank
 * (host_layout.c); SystemError if out of memory. loom_hosts_free frees it. */
loomResult_t loom_hosts_init(loom_hosts_t *h, const uint64_t *host_hash, int nranks, int rank);
void loom_hosts_free(loom_hosts_t *h);

/* The network algorithm the model picks for a call on ctx, ignoring the
 * shared-memory and hierarchical rows (a part of a communicator has no arena
 * and no hosts of its own); NULL if none can run. */
const loom_algo_t *loom_algo_pick_flat(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a);

/* Grows *buf (64-byte aligned, *bytes long, contents not kept) to at least need
 * bytes; what names it in messages. */
loomResult_t loom_coll_grow(uint8_t **buf, size_t *bytes, size_t need, int rank, const char *what);
/* Scratch of at least nbytes, kept for later calls. */
loomResult_t loom_coll_scratch(loom_coll_ctx_t *ctx, size_t nbytes, uint8_t **buf_p);
void loom_coll_ctx_free(loom_coll_ctx_t *ctx);

/* A contiguous range of elements. */
typedef struct {
    size_t off;
    size_t len;
} loom_span_t;

/* The reduce step shared by allreduce, reduce-scatter and reduce: every rank
 * sends sendbuff[spans[o]] to each owner o with spans[o].len > 0 (spans are
 * equal on all ranks); an owner receives its span from every rank and writes
 * the reduction, in rank order, to dst. Bounded scratch: (n-1) spans. */
loomResult_t loom_coll_reduce_to_owners(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                        const loom_span_t *spans, void *dst, unsigned step);

/* As loom_coll_reduce_to_owners, but each owner writes its reduction to
 * acc_dst unfinished, in the accumulator type (loom_acc_size per element, avg
 * still a sum): a later step combines it further and finishes it. */
loomResult_t loom_coll_reduce_to_owners_partial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                                const loom_span_t *spans, void *acc_dst,
                                                unsigned step);

/* Even split of count elements over n parts: part r is [off, off+len). */
static inline void loom_split(size_t count, int n, int r, size_t *off_p, size_t *len_p)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    size_t ur = (size_t)r;
    *len_p = base + (ur < rem ? 1 : 0);
    *off_p = ur * base + (ur < rem ? ur : rem);
}

#ifdef __cplusplus
}
#endif

#endif

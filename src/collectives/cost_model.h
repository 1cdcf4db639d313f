/* SPDX-License-Identifier: Apache-2.0
 *
 * cost_model.h - the alpha-beta-gamma model that chooses collective
 * algorithms: link classes with their constants (measured at communicator
 * creation by calibrate.c, the link's rate from the topology, built-in
 * defaults where neither is known, LOOM_COST_<CLASS> overrides over all of
 * them; each constant records where it came from), the description of a call that cost
 * functions see, and the cost function of every algorithm in the table of
 * algo_select.c. Pure arithmetic: nothing here talks to peers (calibrate.c
 * does). Callers: algo_select.c, calibrate.c, tools/loom_info, unit tests.
 *
 * The model: T = steps * alpha + msgs * o + bytes * beta + one_way * beta_one
 * + reduced * gamma, where bytes go both ways at once and one_way bytes one way only.
 * Hockney's alpha is split in two, as LogP does: alpha is paid once per step
 * (a round whose messages depend on the previous round's), o once per message
 * it sends or receives. Thakur's single-ported counting is close to alpha = 0;
 * a rank that exchanges with n-1 peers at once pays one alpha and 2(n-1) o.
 */
#ifndef LOOM_COST_MODEL_H
#define LOOM_COST_MODEL_H

#include <math.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Link classes, fastest first. A communicator's class is its slowest link: a
 * communicator that spans hosts (or runs TCP between local ranks) is tcp, or
 * ucx where UCX carries every link that is not shared memory. */
typedef enum { LOOM_LINK_SHM, LOOM_LINK_UCX, LOOM_LINK_TCP, LOOM_LINK_NUM } loom_link_class_t;

/* Where a constant came from, weakest first: a later source replaces an
 * earlier one (the topology's rate only as its rule says, see
 * loom_link_cost_with_rate). */
typedef enum {
    LOOM_COST_SRC_BUILTIN,  /* the built-in default */
    LOOM_COST_SRC_MEASURED, /* measured at communicator creation, agreed, rounded */
    LOOM_COST_SRC_TOPOLOGY, /* the interface's speed or the RDMA port's rate */
    LOOM_COST_SRC_ENV,      /* LOOM_COST_<CLASS> */
    LOOM_COST_SRC_NUM
} loom_cost_src_t;

/* The constants in the order of loom_link_cost_t.src. */
enum {
    LOOM_COST_ALPHA,
    LOOM_COST_BETA,
    LOOM_COST_GAMMA,
    LOOM_COST_O,
    LOOM_COST_BETA_ONE,
    LOOM_COST_COLD,
    LOOM_COST_NCONST
};

/* The model's constants for one link class. */
typedef struct {
    loom_link_class_t cls;
    double alpha_ns; /* per step (a round of messages that waits for the previous one), ns */
    double beta_ns;  /* per byte the busiest rank sends while it receives as many, ns */
    double gamma_ns; /* per byte it reduces or copies locally, ns */
    double o_ns;     /* per message it sends or receives, ns */
    /* Per byte a rank sends (or receives) while nothing comes the other way, ns: at most beta.
     * A full-duplex link moves bytes each way at once for the price of one way (beta_one =
     * beta); a link that is a CPU's copies, as loopback TCP and shared memory are, pays for
     * both ways in turn (beta_one near beta / 2). */
    double beta_one_ns;
    /* What one copy costs more per byte once its buffers no longer fit the cache, ns: memory's
     * rate against the L2's (loom_link_cost_for_call). 0: no such cost known. */
    double cold_ns;
    unsigned char src[LOOM_COST_NCONST]; /* loom_cost_src_t of alpha ... cold, in enum order */
} loom_link_cost_t;

/* One call as a cost function sees it. Every field is equal on every rank of
 * the communicator, so every rank picks the same algorithm. */
typedef struct {
    int nranks;
    double nbytes;      /* loom_coll_bytes: the vector (AllReduce, Bcast, Reduce) or the
                           whole gathered/scattered vector (AllGather, ReduceScatter, AllToAll) */
    double acc_ratio;   /* accumulator bytes per datatype byte: 1, or 2/4 for 16/8-bit floats,
                           whose partial sums travel as float32 */
    size_t chunk_bytes; /* LOOM_CHUNK_BYTES: pipeline segment per peer and step */
    int ring_depth;     /* segments the ring keeps in flight per step (loom_ring_depth) */
    int nhosts;         /* hosts the ranks span (0 or 1: one) */
    int ppn;            /* ranks per host when every host has the same number, else 0 */
    int contiguous;     /* every host's ranks are consecutive (or one host) */
    int rank_order;     /* only algorithms that add in rank order may run (LOOM_DETERMINISTIC) */
    loom_link_cost_t intra; /* the links inside a host (the hierarchical algorithms' costs) */
    double cache_bytes;     /* the L2 of one core (loom_shm_caches); 0: unknown, no cold bytes */
    double max_block; /* AllGatherV, ReduceScatterV: the largest rank's block in bytes (equal on
                         every rank, as the counts are); 0 elsewhere, where blocks are nbytes/n */
} loom_cost_call_t;

/* Predicted time of one algorithm for one call, in nanoseconds; LOOM_COST_NA
 * when the algorithm cannot run the call on this link class (for instance an
 * shm-only algorithm on a tcp communicator). Must be a pure function of its
 * arguments. */
typedef double (*loom_algo_cost_fn_t)(const loom_cost_call_t *call, const loom_link_cost_t *link);
#define LOOM_COST_NA INFINITY

static inline double loom_cost_eval(const loom_link_cost_t *l, double steps, double msgs,
                                    double bytes, double reduced)
{
    return steps * l->alpha_ns + msgs * l->o_ns + bytes * l->beta_ns + reduced * l->gamma_ns;
}

/* As loom_cost_eval, for a call whose busiest rank also moves one_way bytes in one direction
 * only (a root that sends what nobody sends back, in turn with `bytes` both ways). */
static inline double loom_cost_eval_one_way(const loom_link_cost_t *l, double steps, double msgs,
                                            double bytes, double one_way, double reduced)
{
    return loom_cost_eval(l, steps, msgs, bytes, reduced) + one_way * l->beta_one_ns;
}

const char *loom_link_class_name(loom_link_class_t cls);
/* "shm", "ucx" or "tcp" (case-insensitive): 0 and *cls_p set; -1 otherwise. */
int loom_link_class_parse(const char *name, loom_link_class_t *cls_p);
/* The constants of cls before calibration: the built-in defaults, or
 * LOOM_COST_SHM / LOOM_COST_UCX / LOOM_COST_TCP
 * ("alpha_us,beta_ns,gamma_ns[,o_us[,beta_one_ns[,cold_ns]]]")
 * when set and valid (an invalid value is WARNed once and ignored). */
loom_link_cost_t loom_link_cost_default(loom_link_class_t cls);
/* 1 when LOOM_COST_<cls> sets the class's constants (the user's word then
 * stands: no link rate replaces them). */
int loom_link_cost_is_set(loom_link_class_t cls);
/* The default constants of cls with the rate of the link that carries it,
 * in ns per byte (<= 0: unknown, the defaults stand). tcp: beta is at least
 * that (the built-in beta is what the kernel's TCP reaches on a fast link, so
 * a slower interface raises it, a faster one does not lower it). ucx: beta is
 * that (RDMA moves bytes at the port's rate without the CPU). shm: unchanged.
 * Where LOOM_COST_<cls> is set, its constants stand unchanged. */
loom_link_cost_t loom_link_cost_at_rate(loom_link_class_t cls, double ns_per_byte);
/* As loom_link_cost_at_rate, on constants l that may have been measured:
 * beta (source TOPOLOGY where the rate changes it) unless LOOM_COST_<cls>
 * set it. */
loom_link_cost_t loom_link_cost_with_rate(loom_link_cost_t l, double ns_per_byte);
/* v rounded to the nearest power of 2^(1/4) (a step of 19 %, so within 9 %
 * of v); 0 (and anything not positive) gives 0. Measured constants vary from
 * run to run by more than that step only rarely, so on one machine reruns
 * mostly get the same constants, hence the same algorithms. */
double loom_cost_round(double v);
/* The constants of cls from an agreed measurement v[LOOM_COST_NCONST]
 * (alpha, beta, gamma, o, beta_one, cold in ns; a value < 0: not measured, the
 * default stands), each rounded (loom_cost_round), source MEASURED; beta_one
 * is at most beta (one way never costs more than both), and is beta where
 * only beta was measured; where LOOM_COST_<cls> is set, its constants win. */
loom_link_cost_t loom_link_cost_measured(loom_link_class_t cls, const double *v);
/* "builtin", "measured", "topology" or "env". */
const char *loom_cost_src_name(loom_cost_src_t src);
/* Writes "alpha 1.2 us (measured), o ..., beta ..., gamma ..." into buf. */
void loom_link_cost_describe(const loom_link_cost_t *l, char *buf, size_t len);
/* l as a call of c->nbytes sees it: where a rank's send and receive buffers (about twice
 * nbytes) outgrow the cache, the share of bytes beyond it costs cold_ns more per copy: a byte
 * both ways is two copies on the rank's CPU, one way one, a reduced byte one. Smooth in the
 * size, so the choice of algorithm stays monotone. */
loom_link_cost_t loom_link_cost_for_call(const loom_link_cost_t *l, const loom_cost_call_t *c);
/* l as each of `flows` flows that share it at once sees it: every byte takes `flows` times as
 * long, both ways and one way. */
loom_link_cost_t loom_link_cost_shared(const loom_link_cost_t *l, double flows);
/* Predicted time of one message of nbytes on l: one step, a send and a
 * receive, the bytes. */
double loom_link_message_ns(const loom_link_cost_t *l, double nbytes);
/* The built-in defaults alone (tests, loom_info). */
loom_link_cost_t loom_link_cost_builtin(loom_link_class_t cls);
/* Parses "alpha_us,beta_ns,gamma_ns[,o_us[,beta_one_ns[,cold_ns]]]" (non-negative numbers)
 * into *l_p, keeping l_p->cls (and l_p->o_ns when o is not given); beta_one is beta when not
 * given (a link described by one rate is full duplex) and never above it; cold is 0 when not
 * given (rates alone: no cost past the cache). 0 on success, -1 (nothing written) otherwise. */
int loom_link_cost_parse(const char *text, loom_link_cost_t *l_p);

/* Segments the ring algorithms keep in flight per step: 4, or 1 on a shm
 * communicator (one machine) with more ranks than online CPUs, where deeper
 * pipelines only queue behind ranks waiting for a core. Equal on every rank:
 * a shm communicator's ranks share the machine and its CPU count. */
int loom_ring_depth(loom_link_class_t cls, int nranks);

/* ceil(log2 n) and floor(log2 n) for n >= 1. */
int loom_ceil_log2(int n);
int loom_floor_log2(int n);

/* Cost functions, one per algorithm (formulas and references in cost_model.c
 * and docs/ALGORITHMS.md). */
double loom_cost_allreduce_rd(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allreduce_rhd(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allreduce_ring(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allreduce_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allreduce_reduce_bcast(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allgather_rd(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allgather_ring(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allgather_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatter_rhd(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatter_ring(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatter_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* The uneven collectives: as their even kin, with the largest block (max_block) where the
 * busiest rank's share or the rounds of a pipeline depend on it. Equal to the even costs when
 * the blocks are equal. */
double loom_cost_allgatherv_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allgatherv_ring(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatterv_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatterv_ring(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_bcast_binomial(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_bcast_scatter_allgather(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_bcast_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_binomial(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_direct(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_chain(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* Segments of a chain of nranks that moves acc_bytes (Reduce chain): at least
 * acc_bytes / chunk, and otherwise the number that minimises the pipeline's
 * time (m + n - 1)(alpha + 2 o) + m o + (1 + (n - 1) / m) acc_bytes beta,
 * about sqrt(acc_bytes (n - 1) beta / (alpha + 3 o)): a function of agreed
 * constants, so equal on every rank. */
size_t loom_chain_segments(const loom_link_cost_t *l, double acc_bytes, int nranks, size_t chunk);
double loom_cost_alltoall_bruck(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_alltoall_pairwise(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* Hierarchical algorithms (cost_hier.c): inside each host, between hosts by
 * one rank per host and local index (every local rank's path at once), inside
 * each host again; LOOM_COST_NA unless nhosts > 1 and ppn > 1. */
double loom_cost_allreduce_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* LOOM_COST_NA also where a host's ranks are not consecutive. */
double loom_cost_allreduce_hier_chain(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_reduce_scatter_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_allgather_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_bcast_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_alltoall_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* AllToAllv's counts differ per rank, so its costs cannot see them (a choice
 * that followed them could differ between ranks): they price what the layout
 * decides, the messages and dependent steps, with small blocks of T/2. hier
 * (LOOM_COST_NA without a hierarchy) then wins where the messages it saves
 * between hosts outweigh its second step and its copies (cost_hier.c). */
double loom_cost_alltoallv_hier(const loom_cost_call_t *c, const loom_link_cost_t *l);
double loom_cost_alltoallv_pairwise(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* T, the largest block (bytes) hierarchical AllToAllv aggregates on H hosts of P ranks:
 * 2 o / (beta + 3 gamma), o of link and beta, gamma of intra (a regrouped block crosses the
 * host once more and is copied three times to save a message between hosts, o at each end),
 * at most A2AV_SMALL_MAX and at most what keeps its buffer, about 4 H P (T + 8) bytes, within
 * LOOM_HIER_ROUND_BYTES. A function of agreed constants, so equal on every rank. */
#define A2AV_SMALL_MAX ((size_t)64 << 10)
size_t loom_a2av_small_bytes(const loom_link_cost_t *link, const loom_link_cost_t *intra, size_t H,
                             size_t P);
/* Vector bytes per round of the hierarchical algorithms (bounds their buffers). */
#define LOOM_HIER_ROUND_BYTES ((size_t)8 << 20)

/* The shared-memory family ("shm" rows): 0 on the shm link class, so it is chosen
 * whenever it can run (its own size rules pick flat, cico or cma; the model does
 * not price it), LOOM_COST_NA elsewhere. */
double loom_cost_shm_family(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* One forced shm variant (shm_flat, shm_cico, shm_cma): LOOM_COST_NA, never chosen by the
 * model; LOOM_ALGO runs it. */
double loom_cost_shm_forced(const loom_cost_call_t *c, const loom_link_cost_t *l);
/* Collectives with a single algorithm (Barrier): always 0. */
double loom_cost_only(const loom_cost_call_t *c, const loom_link_cost_t *l);

#ifdef __cplusplus
}
#endif

#endif

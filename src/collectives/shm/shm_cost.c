/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_cost.c - the predicted time of a shared-memory collective (shm_plan.h): the plan's variant
 * priced with what the machine measured at creation, so that LOOM_COLL_TRACE, `*_perf -M 1`,
 * loom_info and bench/compare show a prediction beside each shm call as they do for the network
 * algorithms. It prices, it does not choose: on a communicator with an arena the arena runs
 * every call (algo_select.c), and the plan picks the variant by its own rules.
 *
 * The units are the arena probe's (shm_probe.c): a flag round; a byte copied from lines the
 * copying core wrote itself (into the arena, or its own block); and a byte copied from lines
 * another core wrote (out of the arena, or read by a reduction), the handover between cores
 * that sets the arena's speed in cache, both while that core copies the other way (AllGather,
 * AllToAll, the reductions' inputs) and while it does not (a Broadcast's readers, a Reduce's
 * root). The probe runs the communicator's own ranks on their CPUs, so ranks that outnumber the
 * CPUs are in its handover. A reduced byte costs the link's gamma, a byte the kernel copies
 * (single copy) the kernel-copy probe's rate, both stretched by the ranks sharing a CPU; past the
 * plan's streaming threshold every byte pays the link's cold cost more. The counts per variant
 * are those of docs/shm-collectives.md (*Algorithms*), for the busiest rank (the root of a
 * Reduce, a reader of a Broadcast) of a call out of place: in place an AllGather or AllToAll
 * rank leaves its own block where it is. Where the probe timed the variant itself on as many
 * ranks, the call's bytes cost what they cost there, in place of the sum of the rates: the
 * count then gives the flags and the cold cost alone. The probe times each call at two
 * footprints, in cache and filling the L2: a call between them pays a rate between theirs, in
 * proportion to its bytes, and a larger one the second's. Without the probe (LOOM_CALIBRATE=0) a
 * flag costs the link's alpha, either copy half its beta (an exchange copies every byte in
 * and out), and a one-way handover its beta_one.
 *
 * Where the ranks' buffers and the arena together outgrow the L3, a call that walks them in a
 * loop finds none of its lines still cached (a cache that keeps the lines used last holds none
 * of a cycle longer than itself), and every byte a rank reads from or writes to its buffers
 * goes to memory, which all the ranks share. Given the memory's copy rate
 * (LOOM_SHM_MEMORY_MBPS), the call then costs no less than moving those bytes at it.
 */
#include <math.h>

#include "shm_plan.h"

/* What one flag round, and one byte of each kind of work, costs: a copy from lines this core
 * wrote (L), from lines another core wrote both ways (X) and one way (X1), a kernel copy (K),
 * a reduction (G). */
typedef struct {
    double f, L, X, X1, K, G;
} units_t;

/* The bytes all ranks read from and write to their buffers in one call of S bytes, out of place;
 * for a Broadcast, the root's read and the readers' writes (the readers are priced, and an
 * out-of-place root's own copy runs beside theirs). */
static double buffer_bytes(loom_coll_kind_t kind, int n, double S)
{
    switch (kind) {
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_REDUCE_SCATTERV: /* a block and the whole vector each */
    case LOOM_COLL_REDUCE:          /* every input, and the root's result */
        return (n + 1.0) * S;
    case LOOM_COLL_BCAST:
        return n * S;
    default: /* AllReduce, AllToAll: a whole vector in and out each */
        return 2.0 * n * S;
    }
}

/* The least time of a call of S bytes whose buffers and arena outgrow the L3: its buffers'
 * bytes moved at the memory's copy rate (a copied byte is read once and written once); 0 where
 * they fit or the rate is unknown. */
static double memory_floor(loom_coll_kind_t kind, int n, double S, const loom_shm_machine_t *m)
{
    if (!(m->memory_ns > 0) || m->l3 == 0)
        return 0.0;
    const double bytes = buffer_bytes(kind, n, S);
    if (bytes + 2.0 * n * (double)m->half <= (double)m->l3)
        return 0.0;
    return bytes / 2 * m->memory_ns;
}

/* The variant's count of flags and bytes for the busiest rank, priced with u. */
static double count(loom_coll_kind_t kind, uint32_t variant, int n, double S, double H,
                    const units_t *u)
{
    const double f = u->f, L = u->L, X = u->X, X1 = u->X1, K = u->K, G = u->G;
    const double q = (n - 1.0) / n, B = S / n;
    const double r = S > H ? ceil(S / H) : 1.0; /* rounds of the cico reductions and Broadcast */
    switch (variant) {
    case SHM_ALGO_TINY:
    case SHM_ALGO_BARRIER:
        return f;
    case SHM_ALGO_FLAT: /* the others' copies read and every input reduced; an AllReduce rank
                           copies in as it reads (both ways), a Reduce's root only reads */
        if (kind == LOOM_COLL_ALLREDUCE)
            return f + S * L + (n - 1) * S * X + n * S * G;
        return f + (n - 1) * S * X1 + n * S * G;
    case SHM_ALGO_CMA:
        switch (kind) {
        case LOOM_COLL_BCAST:
            return 2 * f + S * K;
        case LOOM_COLL_ALLGATHER:
        case LOOM_COLL_ALLGATHERV:
        case LOOM_COLL_ALLTOALL: /* and the own block, copied locally */
            return 2 * f + q * S * K + B * L;
        case LOOM_COLL_ALLREDUCE: /* the own span from every peer, then the others' spans */
            return 3 * f + 2 * q * S * K + S * G;
        case LOOM_COLL_REDUCE: /* as ReduceScatter, then the root copies the others' results */
            return (2 + r) * f + q * S * (K + X1) + S * G;
        default: /* ReduceScatter */
            return 2 * f + q * S * K + S * G;
        }
    default: /* SHM_ALGO_CICO */
        switch (kind) {
        case LOOM_COLL_BCAST: /* a reader copies out what the root copied in, piece by piece */
            return r * f + S * X1;
        case LOOM_COLL_ALLGATHER:
        case LOOM_COLL_ALLGATHERV: /* the own block in and into recvbuff, n - 1 blocks out */
            return (B > H ? ceil(B / H) : 1.0) * f + 2 * B * L + q * S * X;
        case LOOM_COLL_ALLTOALL: /* the blocks for the others in, theirs out, the own one */
            return (q * S > H ? ceil(q * S / H) : 1.0) * f + (q * S + B) * L + q * S * X;
        case LOOM_COLL_ALLREDUCE: /* the others' parts in; the own part's copies read where */
            return 2 * r * f + q * S * (L + 2 * X) + S * G; /* reduced; the others' results out */
        case LOOM_COLL_REDUCE: /* the same, but only the root copies the results out: one way */
            return 2 * r * f + q * S * (L + X + X1) + S * G;
        default: /* ReduceScatter: each owner keeps its result */
            return r * f + q * S * (L + X) + S * G;
        }
    }
}

double loom_shm_predict(loom_coll_kind_t kind, uint32_t variant, const loom_cost_call_t *c,
                        const loom_shm_machine_t *m, const loom_link_cost_t *link)
{
    const int n = c->nranks;
    if (n <= 1 || kind == LOOM_COLL_ALLTOALLV)
        return LOOM_COST_NA; /* one rank copies locally; AllToAllv runs point to point */
    /* Past the plan's streaming threshold the arena's copies go to memory: from there a byte
     * pays the link's cold cost more, as loom_link_cost_for_call charges it past half the L2.
     * Below it the calls stay in the caches, where the copies between the two cores are
     * pipelined and the L3 keeps up with them. */
    const double crowd = m->cpus > 0 && n > m->cpus ? (double)n / m->cpus : 1.0;
    /* An uneven ReduceScatter goes at the pace of the owner of the largest block, which reduces
     * n of them: it costs what the even call of such blocks costs. Where the ranks share CPUs,
     * the CPUs' work sets the pace instead, and that is the even call's. */
    double S = c->nbytes;
    if (kind == LOOM_COLL_REDUCE_SCATTERV && crowd == 1.0 && c->max_block * n > S)
        S = c->max_block * n;
    const double t = (double)loom_shm_nt_threshold(m, n), H = (double)m->half;
    const double cold = link->cold_ns > 0 && S > t ? link->cold_ns * (1.0 - t / S) : 0.0;
    const int probed = m->cross_ns > 0;
    /* A copy from lines this core wrote, one from lines another core wrote (the probe's AllGather
     * ran on the shared CPUs, so that one has the crowding in it), a kernel copy, a reduction. */
    const units_t warm = {
        .f = probed ? m->flag_ns : link->alpha_ns,
        .L = (probed ? m->local_ns : link->beta_ns / 2) * crowd,
        .X = probed ? m->cross_ns : link->beta_ns / 2,
        .X1 = probed && m->cross1_ns > 0 ? m->cross1_ns : link->beta_one_ns,
        .K = (m->kernel_ns > 0 ? m->kernel_ns : link->beta_ns) * crowd,
        .G = link->gamma_ns * crowd,
    };
    const units_t all = {.f = warm.f,
                         .L = warm.L + cold * crowd,
                         .X = warm.X + cold * crowd,
                         .X1 = warm.X1 + cold * crowd,
                         .K = warm.K + cold * crowd,
                         .G = warm.G + cold * crowd};
    const double sum = count(kind, variant, n, S, H, &all);
    /* Where the probe timed this very call (on these ranks, at its two footprints), its time per
     * byte stands for the sum of the copy and reduction rates, which adds work that overlaps in
     * the real call; the flags and the cold cost stay the count's. */
    const double floor_ns = memory_floor(kind, n, c->nbytes, m);
    const int slot = probed && m->probe_ranks == n ? loom_shm_probe_slot(kind, variant) : -1;
    if (slot < 0 || m->call_ns[0][slot] <= 0)
        return fmax(sum, floor_ns);
    const units_t flags = {.f = warm.f};
    double at[LOOM_SHM_PROBE_TIERS], rate[LOOM_SHM_PROBE_TIERS]; /* bytes, ns per byte */
    int tiers = 0;
    for (; tiers < LOOM_SHM_PROBE_TIERS && m->call_ns[tiers][slot] > 0; tiers++) {
        const double b = (double)loom_shm_probe_bytes(m, n, slot, tiers);
        at[tiers] = b;
        rate[tiers] = fmax((m->call_ns[tiers][slot] - count(kind, variant, n, b, H, &flags)) / b,
                           1e-3); /* noise never makes bytes free */
    }
    double per_byte = rate[0];
    for (int k = 1; k < tiers; k++)
        if (S > at[k - 1] && at[k] > at[k - 1])
            per_byte = S >= at[k] ? rate[k]
                                  : rate[k - 1] + (rate[k] - rate[k - 1]) * (S - at[k - 1]) /
                                                      (at[k] - at[k - 1]);
    return fmax(count(kind, variant, n, S, H, &flags) + S * per_byte +
                    (sum - count(kind, variant, n, S, H, &warm)),
                floor_ns);
}

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
 * rank leaves its own block where it is. Without the probe (LOOM_CALIBRATE=0) a flag costs the
 * link's alpha, either copy half its beta (an exchange copies every byte in and out), and a
 * one-way handover its beta_one.
 */
#include <math.h>

#include "shm_plan.h"

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
    const double t = (double)loom_shm_nt_threshold(m, n), S = c->nbytes;
    const double cold = link->cold_ns > 0 && S > t ? link->cold_ns * (1.0 - t / S) : 0.0;
    const double crowd = m->cpus > 0 && n > m->cpus ? (double)n / m->cpus : 1.0;
    const int probed = m->cross_ns > 0;
    const double f = probed ? m->flag_ns : link->alpha_ns;
    /* A copy from lines this core wrote, one from lines another core wrote (the probe's AllGather
     * ran on the shared CPUs, so that one has the crowding in it), a kernel copy, a reduction. */
    const double L = ((probed ? m->local_ns : link->beta_ns / 2) + cold) * crowd;
    const double X = (probed ? m->cross_ns : link->beta_ns / 2) + cold * crowd;
    const double X1 =
        (probed && m->cross1_ns > 0 ? m->cross1_ns : link->beta_one_ns) + cold * crowd;
    const double K = ((m->kernel_ns > 0 ? m->kernel_ns : link->beta_ns) + cold) * crowd;
    const double G = (link->gamma_ns + cold) * crowd;
    const double q = (n - 1.0) / n, B = S / n, H = (double)m->half;
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

/* SPDX-License-Identifier: Apache-2.0
 *
 * cost_hier.c - the cost functions of the hierarchical algorithms
 * (algo_hier.c). A call costs its three phases in turn: a direct exchange
 * among the ppn ranks of each host on the intra-host constants, the
 * cheapest flat algorithm among the nhosts ranks that share a local index on
 * the call's link constants, and a direct exchange inside the host again.
 * The ranks of a host share its way out: while each of them moves b bytes to
 * other hosts the host's link carries ppn * b, so the middle phase pays
 * beta * ppn per byte. The flat algorithms, which run with one rank per
 * host in the middle phase, are priced by their own functions (cost_model.c).
 * AllToAllv (algo_hier_a2av.c) is priced by its messages and steps alone.
 */
#include <math.h>
#include <stddef.h>

#include "cost_model.h"

static int usable(const loom_cost_call_t *c)
{
    return c->nhosts > 1 && c->ppn > 1;
}

/* The middle phase: the cheapest of fns[n] for nbytes among the hosts. */
static double inter(const loom_cost_call_t *c, const loom_link_cost_t *l, double nbytes,
                    double acc_ratio, loom_algo_cost_fn_t const *fns, int n)
{
    loom_cost_call_t sub = *c;
    sub.nranks = c->nhosts;
    sub.nbytes = nbytes;
    sub.acc_ratio = acc_ratio;
    sub.nhosts = 1;
    sub.ppn = 0;
    sub.ring_depth = loom_ring_depth(l->cls, c->nhosts);
    const loom_link_cost_t shared = loom_link_cost_shared(l, (double)c->ppn);
    double best = LOOM_COST_NA;
    for (int i = 0; i < n; i++) {
        double t = fns[i](&sub, &shared);
        if (t < best)
            best = t;
    }
    return best;
}

/* A direct exchange inside each host: every rank sends `bytes` in all to the
 * ppn - 1 others and receives as much, combining or copying `local` bytes. */
static double intra(const loom_cost_call_t *c, double bytes, double local, double msgs)
{
    return loom_cost_eval(&c->intra, 1, msgs, bytes, local);
}

/* Rounds of at most LOOM_HIER_ROUND_BYTES of the vector (at least one). */
static double hier_rounds(double vec_bytes)
{
    double r = ceil(vec_bytes / (double)LOOM_HIER_ROUND_BYTES);
    return r < 1 ? 1 : r;
}

double loom_cost_allreduce_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    static loom_algo_cost_fn_t const fns[] = {loom_cost_allreduce_rd, loom_cost_allreduce_direct,
                                              loom_cost_allreduce_rhd, loom_cost_allreduce_ring};
    if (!usable(c))
        return LOOM_COST_NA;
    const double L = c->ppn, k = hier_rounds(c->nbytes), s = c->nbytes / k;
    const double out = s * (L - 1) / L;
    double t = intra(c, out, out * c->acc_ratio, 2 * (L - 1)) +
               inter(c, l, s / L * c->acc_ratio, 1.0, fns, 4) + intra(c, out, 0, 2 * (L - 1));
    return k * t;
}

/* The raw slices to their owners inside the host (who add them up), the
 * partials up the rail and the results down it in m segments
 * (loom_chain_segments: 2(H-1) hops to fill, one step per further segment,
 * each moving a segment), the slices all-gathered inside the host. A host in
 * the middle sends the slice up and down through its link, the first and the
 * last one of the two. */
double loom_cost_allreduce_hier_chain(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (!usable(c) || !c->contiguous)
        return LOOM_COST_NA;
    const double L = c->ppn, H = c->nhosts, ar = c->acc_ratio;
    const double k = hier_rounds(c->nbytes), s = c->nbytes / k, out = s * (L - 1) / L;
    const double slice = s / L;
    const loom_link_cost_t shared = loom_link_cost_shared(l, L);
    const double m =
        (double)loom_chain_segments(&shared, slice * ar, 2 * c->nhosts - 1, c->chunk_bytes);
    const double hops = 2 * (H - 1) + m - 1, per_seg = slice * (H > 2 ? ar + 1 : ar) / m;
    const double rail = loom_cost_eval(&shared, hops, 4 * m, per_seg * hops, 0.0);
    return k * (intra(c, out, s * ar, 2 * (L - 1)) + rail + intra(c, out, 0, 2 * (L - 1)));
}

double loom_cost_reduce_scatter_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    static loom_algo_cost_fn_t const fns[] = {loom_cost_reduce_scatter_direct,
                                              loom_cost_reduce_scatter_rhd,
                                              loom_cost_reduce_scatter_ring};
    if (!usable(c))
        return LOOM_COST_NA;
    const double L = c->ppn, k = hier_rounds(c->nbytes), s = c->nbytes / k;
    const double out = s * (L - 1) / L;
    /* Packing the blocks by local index copies the vector once. */
    double t = intra(c, out, s + out * c->acc_ratio, 2 * (L - 1)) +
               inter(c, l, s / L * c->acc_ratio, 1.0, fns, 3);
    return k * t;
}

double loom_cost_allgather_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    static loom_algo_cost_fn_t const fns[] = {loom_cost_allgather_direct, loom_cost_allgather_rd,
                                              loom_cost_allgather_ring};
    if (!usable(c))
        return LOOM_COST_NA;
    const double L = c->ppn, H = c->nhosts, s = c->nbytes;
    /* Between hosts each local index gathers its hosts' blocks; inside a host
     * every rank sends those H blocks to each of the others, one message each. */
    return inter(c, l, s / L, c->acc_ratio, fns, 3) +
           intra(c, s * (L - 1) / L, s / L, 2 * (L - 1) * H);
}

double loom_cost_bcast_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    static loom_algo_cost_fn_t const fns[] = {loom_cost_bcast_direct, loom_cost_bcast_binomial,
                                              loom_cost_bcast_scatter_allgather};
    if (!usable(c))
        return LOOM_COST_NA;
    const double L = c->ppn, s = c->nbytes, out = s * (L - 1) / L;
    /* The root hands each local rank a piece, the pieces cross between hosts
     * side by side, and each host's ranks swap them. */
    return intra(c, out, 0, L - 1) + inter(c, l, s / L, c->acc_ratio, fns, 3) +
           intra(c, out, 0, 2 * (L - 1));
}

double loom_cost_alltoall_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (!usable(c) || c->nbytes > (double)LOOM_HIER_ROUND_BYTES)
        return LOOM_COST_NA;
    const double L = c->ppn, H = c->nhosts, s = c->nbytes;
    const loom_link_cost_t shared = loom_link_cost_shared(l, L);
    /* Two exchanges, each posted at once; every byte is regrouped twice. */
    return intra(c, s * (L - 1) / L, 2 * s, 2 * (L - 1)) +
           loom_cost_eval(&shared, 1, 2 * (H - 1), s * (H - 1) / H, s);
}

size_t loom_a2av_small_bytes(const loom_link_cost_t *link, const loom_link_cost_t *intra, size_t H,
                             size_t P)
{
    const double per_byte = intra->beta_ns + 3 * intra->gamma_ns;
    double t = per_byte > 0 ? 2 * link->o_ns / per_byte : (double)A2AV_SMALL_MAX;
    if (!(t >= 0)) /* NaN */
        t = 0;
    size_t T = t < (double)A2AV_SMALL_MAX ? (size_t)t : A2AV_SMALL_MAX;
    const size_t fit = LOOM_HIER_ROUND_BYTES / (4 * H * P);
    if (T + 8 > fit)
        T = fit > 8 ? fit - 8 : 0;
    return T;
}

/* AllToAllv's counts differ per rank, so its costs see only what the layout
 * decides (cost_model.h). The hierarchy: the small blocks' P - 1 + H - 1
 * messages each way in two dependent steps, and the n - P blocks for other
 * hosts moved once more inside the host and copied three times, priced at
 * half of T each (blocks between 0 and T). Against pairwise's n - 1 messages
 * in one step, it wins where (H - 1)(P - 2) o > alpha, since a block of T/2
 * costs about o to regroup. */
double loom_cost_alltoallv_hier(const loom_cost_call_t *c, const loom_link_cost_t *l)
{
    if (!usable(c))
        return LOOM_COST_NA;
    const double H = c->nhosts, P = c->ppn;
    const double T = (double)loom_a2av_small_bytes(l, &c->intra, (size_t)H, (size_t)P);
    return loom_cost_eval(l, 2, 2 * (P - 1 + H - 1), 0, 0) +
           loom_cost_eval(&c->intra, 0, 0, (H * P - P) * T / 2, 3 * (H * P - P) * T / 2);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_select.c - the table of collective algorithms and the choice per call.
 * Selection is data: LOOM_ALGO ("ring", or "allreduce:ring,broadcast:binomial")
 * forces an algorithm; otherwise every entry of the collective predicts the
 * call's time with its cost function under the communicator's link constants
 * (cost_model.h) and the cheapest wins, ties going to the earlier row.
 * LOOM_DETERMINISTIC=1 (the default) lets only the entries that add in rank
 * order compete, and overrules a LOOM_ALGO that names another, so that a
 * reduction's bits depend on the inputs alone (docs/ALGORITHMS.md).
 * LOOM_COLL_TRACE=1 logs one INFO line per call.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"
#include "kernels.h"
#include "param.h"
#include "shm/shm_coll.h"
#include "timer.h"

static const char *const coll_names[LOOM_COLL_NUM] = {
    [LOOM_COLL_ALLREDUCE] = "allreduce",
    [LOOM_COLL_ALLGATHER] = "allgather",
    [LOOM_COLL_REDUCE_SCATTER] = "reducescatter",
    [LOOM_COLL_BCAST] = "broadcast",
    [LOOM_COLL_REDUCE] = "reduce",
    [LOOM_COLL_ALLTOALL] = "alltoall",
    [LOOM_COLL_ALLTOALLV] = "alltoallv",
    [LOOM_COLL_BARRIER] = "barrier",
    [LOOM_COLL_ALLGATHERV] = "allgatherv",
    [LOOM_COLL_REDUCE_SCATTERV] = "reducescatterv",
};

/* Within a collective the row order is the tie-break: where two algorithms
 * cost the same (n = 2, where most of them are the same exchange), the one
 * measured faster comes first (docs/ALGORITHMS.md). */
static const loom_algo_t algos[] = {
    /* Shared memory (shm_coll.h), first: on the shm link class the "shm" row of a
     * collective costs 0 and wins whenever the communicator has an arena (every rank
     * on this host over shm); it picks tiny / flat / cico / cma by size itself. The other
     * shm rows only run when LOOM_ALGO forces them. Without an arena the network rows
     * compete alone (loom_shm_algo_usable). */
    {LOOM_COLL_ALLREDUCE, "shm", loom_allreduce_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "shm_flat", loom_allreduce_shm_flat, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "shm_cico", loom_allreduce_shm_cico, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "shm_cma", loom_allreduce_shm_cma, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "shm", loom_reduce_scatter_shm, loom_cost_shm_family,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "shm_cico", loom_reduce_scatter_shm_cico, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "shm_cma", loom_reduce_scatter_shm_cma, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "shm", loom_reduce_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "shm_flat", loom_reduce_shm_flat, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "shm_cico", loom_reduce_shm_cico, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "shm_cma", loom_reduce_shm_cma, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "shm", loom_allgather_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "shm_cico", loom_allgather_shm_cico, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "shm_cma", loom_allgather_shm_cma, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "shm", loom_bcast_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "shm_cico", loom_bcast_shm_cico, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "shm_cma", loom_bcast_shm_cma, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "shm", loom_alltoall_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "shm_cico", loom_alltoall_shm_cico, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "shm_cma", loom_alltoall_shm_cma, loom_cost_shm_forced, LOOM_ORDER_RANK},
    {LOOM_COLL_BARRIER, "shm", loom_barrier_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    /* The uneven collectives run their even kin's shm variants, which read the counts. */
    {LOOM_COLL_ALLGATHERV, "shm", loom_allgather_shm, loom_cost_shm_family, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHERV, "shm_cico", loom_allgather_shm_cico, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHERV, "shm_cma", loom_allgather_shm_cma, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTERV, "shm", loom_reduce_scatter_shm, loom_cost_shm_family,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTERV, "shm_cico", loom_reduce_scatter_shm_cico, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTERV, "shm_cma", loom_reduce_scatter_shm_cma, loom_cost_shm_forced,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "rd", loom_allreduce_rd, loom_cost_allreduce_rd, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "direct", loom_allreduce_direct, loom_cost_allreduce_direct,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLREDUCE, "rhd", loom_allreduce_rhd, loom_cost_allreduce_rhd, LOOM_ORDER_PAIR},
    {LOOM_COLL_ALLREDUCE, "ring", loom_allreduce_ring, loom_cost_allreduce_ring, LOOM_ORDER_PAIR},
    {LOOM_COLL_ALLREDUCE, "reduce_bcast", loom_allreduce_reduce_bcast,
     loom_cost_allreduce_reduce_bcast, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "direct", loom_allgather_direct, loom_cost_allgather_direct,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "rd", loom_allgather_rd, loom_cost_allgather_rd, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHER, "ring", loom_allgather_ring, loom_cost_allgather_ring, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "direct", loom_reduce_scatter_direct,
     loom_cost_reduce_scatter_direct, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "rhd", loom_reduce_scatter_rhd, loom_cost_reduce_scatter_rhd,
     LOOM_ORDER_PAIR},
    {LOOM_COLL_REDUCE_SCATTER, "ring", loom_reduce_scatter_ring, loom_cost_reduce_scatter_ring,
     LOOM_ORDER_PAIR},
    {LOOM_COLL_BCAST, "direct", loom_bcast_direct, loom_cost_bcast_direct, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "binomial", loom_bcast_binomial, loom_cost_bcast_binomial, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "scatter_allgather", loom_bcast_scatter_allgather,
     loom_cost_bcast_scatter_allgather, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "direct", loom_reduce_direct, loom_cost_reduce_direct, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE, "binomial", loom_reduce_binomial, loom_cost_reduce_binomial, LOOM_ORDER_OWN},
    {LOOM_COLL_REDUCE, "chain", loom_reduce_chain, loom_cost_reduce_chain, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "pairwise", loom_alltoall_pairwise, loom_cost_alltoall_pairwise,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "bruck", loom_alltoall_bruck, loom_cost_alltoall_bruck, LOOM_ORDER_RANK},
    /* AllToAllv: no cost can see the counts (they differ per rank), so both rows
     * price the layout's messages and steps only (cost_model.h). */
    {LOOM_COLL_ALLTOALLV, "hier", loom_alltoallv_hier, loom_cost_alltoallv_hier, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALLV, "pairwise", loom_alltoallv_pairwise, loom_cost_alltoallv_pairwise,
     LOOM_ORDER_RANK},
    {LOOM_COLL_BARRIER, "dissemination", loom_barrier_dissemination, loom_cost_only,
     LOOM_ORDER_RANK},
    /* The uneven collectives: their costs see the largest block (max_block). */
    {LOOM_COLL_ALLGATHERV, "direct", loom_allgatherv_direct, loom_cost_allgatherv_direct,
     LOOM_ORDER_RANK},
    {LOOM_COLL_ALLGATHERV, "ring", loom_allgatherv_ring, loom_cost_allgatherv_ring,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTERV, "direct", loom_reduce_scatterv_direct,
     loom_cost_reduce_scatterv_direct, LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTERV, "ring", loom_reduce_scatterv_ring, loom_cost_reduce_scatterv_ring,
     LOOM_ORDER_PAIR},
    /* Hierarchical (algo_hier.c): only across hosts with equal ranks per host. */
    {LOOM_COLL_ALLREDUCE, "hier", loom_allreduce_hier, loom_cost_allreduce_hier, LOOM_ORDER_OWN},
    {LOOM_COLL_ALLREDUCE, "hier_chain", loom_allreduce_hier_chain, loom_cost_allreduce_hier_chain,
     LOOM_ORDER_RANK},
    {LOOM_COLL_REDUCE_SCATTER, "hier", loom_reduce_scatter_hier, loom_cost_reduce_scatter_hier,
     LOOM_ORDER_OWN},
    {LOOM_COLL_ALLGATHER, "hier", loom_allgather_hier, loom_cost_allgather_hier, LOOM_ORDER_RANK},
    {LOOM_COLL_BCAST, "hier", loom_bcast_hier, loom_cost_bcast_hier, LOOM_ORDER_RANK},
    {LOOM_COLL_ALLTOALL, "hier", loom_alltoall_hier, loom_cost_alltoall_hier, LOOM_ORDER_RANK},
};

#define NALGOS ((int)(sizeof(algos) / sizeof(algos[0])))

/* The shm rows lead the table; the network rows follow. */
static int shm_rows(void)
{
    int n = 0;
    while (n < NALGOS && strncmp(algos[n].name, "shm", 3) == 0)
        n++;
    return n;
}

const loom_algo_t *loom_algo_table(int *n_p)
{
    *n_p = NALGOS;
    return algos;
}

const char *loom_coll_name(loom_coll_kind_t kind)
{
    return (unsigned)kind < LOOM_COLL_NUM ? coll_names[kind] : "unknown";
}

size_t loom_coll_bytes(const loom_coll_args_t *a, int nranks)
{
    size_t es = loom_dtype_size(a->dt);
    switch (a->kind) {
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLTOALL:
        return a->count * es * (size_t)nranks;
    case LOOM_COLL_ALLTOALLV: {
        size_t s = 0, r = 0;
        for (int i = 0; i < nranks; i++) {
            s += a->sendcounts[i];
            r += a->recvcounts[i];
        }
        return (s > r ? s : r) * es;
    }
    case LOOM_COLL_BARRIER:
        return 0;
    default:
        return a->count * es;
    }
}

/* The largest block of an AllGatherV or ReduceScatterV in bytes; 0 for the other collectives. */
static size_t max_block(const loom_coll_args_t *a, int nranks)
{
    if (a->kind != LOOM_COLL_ALLGATHERV && a->kind != LOOM_COLL_REDUCE_SCATTERV)
        return 0;
    size_t m = 0;
    for (int i = 0; i < nranks; i++)
        m = a->recvcounts[i] > m ? a->recvcounts[i] : m;
    return m * loom_dtype_size(a->dt);
}

loom_cost_call_t loom_coll_cost_call(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    size_t es = loom_dtype_size(a->dt), accsz = loom_acc_size(a->dt);
    loom_cost_call_t c = {
        .nranks = ctx->nranks,
        .nbytes = a->kind == LOOM_COLL_ALLTOALLV ? 0.0 : (double)loom_coll_bytes(a, ctx->nranks),
        .acc_ratio = es ? (double)accsz / (double)es : 1.0,
        .chunk_bytes = ctx->chunk_bytes,
        .ring_depth = ctx->ring_depth,
        .nhosts = ctx->group ? 1 : ctx->hosts.nhosts,
        .ppn = ctx->group ? 0 : ctx->hosts.ppn,
        .contiguous = ctx->group ? 1 : ctx->hosts.contiguous,
        .rank_order = loom_param_DETERMINISTIC() != 0,
        .cache_bytes = ctx->cache_bytes,
        .intra = ctx->intra,
        .max_block = (double)max_block(a, ctx->nranks)};
    return c;
}

const loom_algo_t *loom_algo_pick_flat(const loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    loom_cost_call_t call = loom_coll_cost_call(ctx, a);
    call.nhosts = 1;
    call.ppn = 0;
    return loom_algo_pick(algos + shm_rows(), NALGOS - shm_rows(), a->kind, &call, &ctx->link,
                          NULL);
}

/* The call and its links as its size sees them (loom_link_cost_for_call): what every cost
 * function is given. */
static void size_call(const loom_cost_call_t *call, const loom_link_cost_t *link,
                      loom_cost_call_t *sized, loom_link_cost_t *at)
{
    *sized = *call;
    sized->intra = loom_link_cost_for_call(&call->intra, call);
    *at = loom_link_cost_for_call(link, call);
}

const loom_algo_t *loom_algo_pick(const loom_algo_t *table, int n, loom_coll_kind_t kind,
                                  const loom_cost_call_t *call, const loom_link_cost_t *link,
                                  double *cost_p)
{
    const loom_algo_t *best = NULL;
    double best_cost = LOOM_COST_NA;
    loom_cost_call_t sized;
    loom_link_cost_t at;
    size_call(call, link, &sized, &at);
    for (int i = 0; i < n; i++) {
        if (table[i].kind != kind || (call->rank_order && !loom_algo_rank_order(&table[i], call)))
            continue;
        double c = table[i].cost(&sized, &at);
        if (!(c < best_cost))
            continue; /* not cheaper (or NaN): the earlier row stays */
        best = &table[i];
        best_cost = c;
    }
    if (cost_p)
        *cost_p = best_cost;
    return best;
}

/* Whether name is the name of an algorithm of collective coll (by its name), or
 * of any collective when coll is NULL (for the LOOM_ALGO check). */
static int known_name(const char *coll, const char *name)
{
    for (int i = 0; i < NALGOS; i++)
        if (strcasecmp(algos[i].name, name) == 0 &&
            (coll == NULL || strcasecmp(coll_names[algos[i].kind], coll) == 0))
            return 1;
    return 0;
}

/* The algorithm LOOM_ALGO names for this collective, if any. A name that no
 * algorithm has, or an unknown collective, is WARNed once per process. */
static const loom_algo_t *forced_algo(loom_coll_kind_t kind)
{
    static int warned;
    const char *spec = loom_param_ALGO();
    if (spec == NULL || spec[0] == '\0')
        return NULL;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    const loom_algo_t *found = NULL;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        const char *name = tok;
        int this_coll = 1;
        if (colon) {
            *colon = '\0';
            name = colon + 1;
            if (!known_name(tok, name) && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                LOOM_WARN("LOOM_ALGO: no algorithm \"%s\" for collective \"%s\" (loom_info -a "
                          "lists them); ignored",
                          name, tok);
            this_coll = strcasecmp(tok, coll_names[kind]) == 0;
        } else if (!known_name(NULL, name) && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
            LOOM_WARN("LOOM_ALGO: no algorithm is called \"%s\" (loom_info -a lists them); "
                      "ignored",
                      name);
        }
        for (int i = 0; found == NULL && this_coll && i < NALGOS; i++)
            if (algos[i].kind == kind && strcasecmp(algos[i].name, name) == 0)
                found = &algos[i];
    }
    return found;
}

/* The prediction of an shm row: the variant it runs (the plan's, or the one its name forces),
 * priced by shm_cost.c. */
static double shm_predicted(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                            const loom_algo_t *algo, const loom_cost_call_t *call)
{
    static const struct {
        const char *suffix;
        uint32_t variant;
    } forced[] = {{"_flat", SHM_ALGO_FLAT}, {"_cico", SHM_ALGO_CICO}, {"_cma", SHM_ALGO_CMA}};
    uint32_t variant = 0;
    for (size_t i = 0; i < sizeof(forced) / sizeof(forced[0]); i++)
        if (strcmp(algo->name + 3, forced[i].suffix) == 0)
            variant = forced[i].variant;
    if (variant == 0)
        variant = loom_shm_pick(ctx, a);
    return loom_shm_predict(a->kind, variant, call, &ctx->shm, &ctx->link);
}

/* The model's (or LOOM_ALGO's) choice for a call, NULL if none can run. */
static const loom_algo_t *choose(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                 const loom_cost_call_t *call, double *predicted_p)
{
    const loom_algo_t *algo = forced_algo(a->kind);
    if (algo != NULL && !loom_shm_algo_usable(ctx, algo->name))
        algo = NULL; /* a forced shm algorithm without an arena: the model's choice instead */
    if (algo != NULL && call->rank_order && !loom_algo_rank_order(algo, call)) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            LOOM_WARN("LOOM_ALGO: %s %s adds in an order of its own on %d ranks, which "
                      "LOOM_DETERMINISTIC=1 does not allow; the cost model's choice runs instead "
                      "(LOOM_DETERMINISTIC=0 lets it run)",
                      coll_names[a->kind], algo->name, call->nranks);
        algo = NULL;
    }
    if (algo != NULL && strncmp(algo->name, "shm", 3) == 0) {
        *predicted_p = shm_predicted(ctx, a, algo, call);
        return algo;
    }
    if (algo != NULL) {
        loom_cost_call_t sized;
        loom_link_cost_t at;
        size_call(call, &ctx->link, &sized, &at);
        *predicted_p = algo->cost(&sized, &at);
        return algo;
    }
    algo = loom_algo_pick(algos, NALGOS, a->kind, call, &ctx->link, predicted_p);
    if (algo != NULL && !loom_shm_algo_usable(ctx, algo->name)) /* shm class, no arena */
        algo = loom_algo_pick(algos + shm_rows(), NALGOS - shm_rows(), a->kind, call, &ctx->link,
                              predicted_p);
    if (algo != NULL && algo->cost == loom_cost_shm_family)
        *predicted_p = shm_predicted(ctx, a, algo, call);
    return algo;
}

const char *loom_coll_plan(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, double *predicted_ns)
{
    loom_cost_call_t call = loom_coll_cost_call(ctx, a);
    double ns = 0;
    const loom_algo_t *algo = choose(ctx, a, &call, &ns);
    if (algo == NULL)
        return NULL;
    *predicted_ns = ns;
    return algo->name;
}

/* choose(), remembered per collective: a run of calls of one size and
 * datatype (the latency-bound case) evaluates the model once. The choice
 * depends on nothing else that can change after creation: the link constants,
 * chunk and ring depth are fixed; the arena (gone once the communicator broke)
 * and the parameters (through their generation) are compared. */
static const loom_algo_t *choose_memo(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                      double *predicted_p)
{
    loom_algo_memo_t *m = &ctx->memo[a->kind];
    const size_t nbytes = a->kind == LOOM_COLL_ALLTOALLV ? 0 : loom_coll_bytes(a, ctx->nranks);
    const size_t vmax = max_block(a, ctx->nranks);
    const unsigned gen = loom_param_generation();
    const void *arena = loom_shm_arena(ctx);
    if (m->algo != NULL && m->param_gen == gen && m->nbytes == nbytes && m->max_block == vmax &&
        m->dt == a->dt && m->arena == arena) {
        *predicted_p = m->predicted_ns;
        return m->algo;
    }
    loom_cost_call_t call = loom_coll_cost_call(ctx, a);
    const loom_algo_t *algo = choose(ctx, a, &call, predicted_p);
    if (algo != NULL)
        *m = (loom_algo_memo_t){.algo = algo,
                                .arena = arena,
                                .predicted_ns = *predicted_p,
                                .nbytes = nbytes,
                                .max_block = vmax,
                                .dt = a->dt,
                                .param_gen = gen};
    return algo;
}

/* "rank" where the call adds in rank order, "own" where the algorithm's own
 * order decides the bits (trace lines). */
static const char *order_name(const loom_algo_t *algo, int nranks)
{
    loom_cost_call_t c = {.nranks = nranks};
    return loom_algo_rank_order(algo, &c) ? "rank" : "own";
}

/* What every rank must pass alike to this call: its messages carry it and
 * the receivers compare (p2p.h). AllToAllv's counts differ per rank, and so
 * do the fields a collective does not use. */
static loom_p2p_call_t call_of(const loom_coll_args_t *a)
{
    const int reduces = a->kind == LOOM_COLL_ALLREDUCE || a->kind == LOOM_COLL_REDUCE ||
                        a->kind == LOOM_COLL_REDUCE_SCATTER || a->kind == LOOM_COLL_REDUCE_SCATTERV;
    const int rooted = a->kind == LOOM_COLL_BCAST || a->kind == LOOM_COLL_REDUCE;
    const int moves = a->kind != LOOM_COLL_BARRIER;
    return (loom_p2p_call_t){.kind = (int32_t)a->kind,
                             .dt = moves ? (int32_t)a->dt : LOOM_P2P_CALL_ANY,
                             .op = reduces ? (int32_t)a->op : LOOM_P2P_CALL_ANY,
                             .root = rooted ? (int32_t)a->root : LOOM_P2P_CALL_ANY,
                             .count = moves && a->kind != LOOM_COLL_ALLTOALLV ? (int64_t)a->count
                                                                              : LOOM_P2P_CALL_ANY};
}

/* The shared-memory plan of a call, for LOOM_COLL_TRACE: the variant and copy mode with the
 * reason that chose them, the store thresholds with theirs, and the reduction block. */
static void shm_trace(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, char *buf, size_t len)
{
    loom_shm_plan_t p;
    loom_shm_plan_call(ctx, a, &p);
    char out[32], in[32];
    if (p.nt_out_min == SHM_NEVER)
        snprintf(out, sizeof(out), "never");
    else
        snprintf(out, sizeof(out), "from %zu KiB", p.nt_out_min >> 10);
    if (p.nt_in_min == SHM_NEVER)
        snprintf(in, sizeof(in), "never");
    else
        snprintf(in, sizeof(in), "from %zu KiB", p.nt_in_min >> 10);
    snprintf(buf, len,
             " shm variant %s copy %s (%s) non-temporal stores out %s in %s (%s) block %zu KiB",
             loom_shm_algo_name(p.variant), p.variant == SHM_ALGO_CMA ? "single" : "arena",
             p.reason, out, in, p.store_reason, p.block_bytes >> 10);
}

loomResult_t loom_coll_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                           const char **algo_name_p)
{
    double predicted = 0.0;
    const loom_algo_t *algo = choose_memo(ctx, a, &predicted);
    if (algo == NULL) {
        LOOM_WARN("no algorithm registered for collective %d", (int)a->kind);
        return loomInternalError;
    }
    if (algo_name_p)
        *algo_name_p = algo->name;
    const loom_p2p_call_t call = call_of(a);
    loom_p2p_set_call(ctx->p2p, coll_names[a->kind], ctx->seq, &call, coll_names, LOOM_COLL_NUM);
    if (loom_param_COLL_TRACE() == 0)
        return algo->fn(ctx, a);
    char shm[320] = "";
    if (strncmp(algo->name, "shm", 3) == 0)
        shm_trace(ctx, a, shm, sizeof(shm));
    uint64_t t0 = loom_now_ns();
    loomResult_t res = algo->fn(ctx, a);
    LOOM_INFO(LOOM_LOG_COLL,
              "%s seq %llu: %zu bytes %s %s algo %s order %s transport %s "
              "%.1f us (model %.1f us)%s -> %s",
              coll_names[a->kind], (unsigned long long)ctx->seq, loom_coll_bytes(a, ctx->nranks),
              loom_dtype_name(a->dt), loom_redop_name(a->op), algo->name,
              order_name(algo, ctx->nranks), loom_link_class_name(ctx->link.cls),
              (double)(loom_now_ns() - t0) / 1e3, predicted / 1e3, shm, loomGetErrorString(res));
    return res;
}

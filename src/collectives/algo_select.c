/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_select.c - the table of collective algorithms and the choice per call.
 * Selection is data: LOOM_ALGO ("direct", or "allreduce:direct,bcast:direct")
 * forces an algorithm; otherwise the first registered algorithm of the
 * collective whose size limit covers the call is used. LOOM_COLL_TRACE=1 logs one INFO line per
 * call.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "check.h"
#include "coll.h"
#include "dtype.h"
#include "param.h"
#include "shm_coll.h"
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
};

/* Default per call: the first entry of the collective whose max_bytes covers the
 * call's bytes. Thresholds are where the measured latency of the cheaper-per-
 * message algorithm stops winning (docs/ALGORITHMS.md). */
#define SMALL_ALLREDUCE_BYTES 4096
static const loom_algo_t algos[] = {
    /* Shared memory (shm_coll.h): first, so the default whenever the communicator has
     * an arena (every rank on this host over shm); loom_shm_algo_usable skips them
     * otherwise. "shm" picks a family by size; the others force one. */
    {LOOM_COLL_ALLREDUCE, "shm", loom_allreduce_shm, 0},
    {LOOM_COLL_ALLREDUCE, "shm_flat", loom_allreduce_shm_flat, 0},
    {LOOM_COLL_ALLREDUCE, "shm_cico", loom_allreduce_shm_cico, 0},
    {LOOM_COLL_ALLREDUCE, "shm_cma", loom_allreduce_shm_cma, 0},
    {LOOM_COLL_REDUCE_SCATTER, "shm", loom_reduce_scatter_shm, 0},
    {LOOM_COLL_REDUCE_SCATTER, "shm_cico", loom_reduce_scatter_shm_cico, 0},
    {LOOM_COLL_REDUCE_SCATTER, "shm_cma", loom_reduce_scatter_shm_cma, 0},
    {LOOM_COLL_REDUCE, "shm", loom_reduce_shm, 0},
    {LOOM_COLL_REDUCE, "shm_cico", loom_reduce_shm_cico, 0},
    {LOOM_COLL_REDUCE, "shm_cma", loom_reduce_shm_cma, 0},
    {LOOM_COLL_ALLGATHER, "shm", loom_allgather_shm, 0},
    {LOOM_COLL_ALLGATHER, "shm_cico", loom_allgather_shm_cico, 0},
    {LOOM_COLL_ALLGATHER, "shm_cma", loom_allgather_shm_cma, 0},
    {LOOM_COLL_BCAST, "shm", loom_bcast_shm, 0},
    {LOOM_COLL_BCAST, "shm_cico", loom_bcast_shm_cico, 0},
    {LOOM_COLL_BCAST, "shm_cma", loom_bcast_shm_cma, 0},
    {LOOM_COLL_ALLTOALL, "shm", loom_alltoall_shm, 0},
    {LOOM_COLL_ALLTOALL, "shm_cico", loom_alltoall_shm_cico, 0},
    {LOOM_COLL_ALLTOALL, "shm_cma", loom_alltoall_shm_cma, 0},
    {LOOM_COLL_BARRIER, "shm", loom_barrier_shm, 0},
    {LOOM_COLL_ALLREDUCE, "reduce_bcast", loom_allreduce_reduce_bcast, SMALL_ALLREDUCE_BYTES},
    {LOOM_COLL_ALLREDUCE, "direct", loom_allreduce_direct, 0},
    {LOOM_COLL_ALLGATHER, "direct", loom_allgather_direct, 0},
    {LOOM_COLL_REDUCE_SCATTER, "direct", loom_reduce_scatter_direct, 0},
    {LOOM_COLL_BCAST, "direct", loom_bcast_direct, 0},
    {LOOM_COLL_REDUCE, "direct", loom_reduce_direct, 0},
    {LOOM_COLL_ALLTOALL, "pairwise", loom_alltoall_pairwise, 0},
    {LOOM_COLL_ALLTOALLV, "pairwise", loom_alltoallv_pairwise, 0},
    {LOOM_COLL_BARRIER, "dissemination", loom_barrier_dissemination, 0},
};

const loom_algo_t *loom_algo_table(int *n_p)
{
    *n_p = (int)(sizeof(algos) / sizeof(algos[0]));
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

/* The algorithm LOOM_ALGO names for this collective, if any. */
static const loom_algo_t *forced_algo(loom_coll_kind_t kind)
{
    const char *spec = loom_param_ALGO();
    if (spec == NULL || spec[0] == '\0')
        return NULL;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        const char *name = tok;
        if (colon) {
            *colon = '\0';
            if (strcasecmp(tok, coll_names[kind]) != 0)
                continue;
            name = colon + 1;
        }
        for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
            if (algos[i].kind == kind && strcasecmp(algos[i].name, name) == 0)
                return &algos[i];
    }
    return NULL;
}

loomResult_t loom_coll_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                           const char **algo_name_p)
{
    const loom_algo_t *algo = forced_algo(a->kind);
    size_t bytes = loom_coll_bytes(a, ctx->nranks);
    if (algo != NULL && !loom_shm_algo_usable(ctx, algo->name))
        algo = NULL; /* a forced shm algorithm without an arena: the default instead */
    for (size_t i = 0; algo == NULL && i < sizeof(algos) / sizeof(algos[0]); i++)
        if (algos[i].kind == a->kind && (algos[i].max_bytes == 0 || bytes <= algos[i].max_bytes) &&
            loom_shm_algo_usable(ctx, algos[i].name))
            algo = &algos[i];
    if (algo == NULL) {
        LOOM_WARN("no algorithm registered for collective %d", (int)a->kind);
        return loomInternalError;
    }
    if (algo_name_p)
        *algo_name_p = algo->name;
    loom_p2p_set_context(ctx->p2p, coll_names[a->kind], ctx->seq);
    int trace = loom_param_COLL_TRACE() != 0;
    uint64_t t0 = trace ? loom_now_ns() : 0;
    loomResult_t res = algo->fn(ctx, a);
    if (trace) {
        const char *tp = loom_p2p_transport_name(ctx->p2p, (ctx->rank + 1) % ctx->nranks);
        LOOM_INFO(LOOM_LOG_COLL,
                  "%s seq %llu: %zu bytes %s %s algo %s transport %s "
                  "%.1f us -> %s",
                  coll_names[a->kind], (unsigned long long)ctx->seq, bytes, loom_dtype_name(a->dt),
                  loom_redop_name(a->op), algo->name, tp, (double)(loom_now_ns() - t0) / 1e3,
                  loomGetErrorString(res));
    }
    return res;
}

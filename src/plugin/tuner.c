/* SPDX-License-Identifier: Apache-2.0
 *
 * tuner.c - libnccl-tuner-loom.so: an NCCL tuner plugin that fills NCCL's cost table with loom's
 * predictions (tuner_model.c) for the machine loom sees (LOOM_TOPO_FILE, else detection of this
 * host). Exports ncclTunerPlugin_v5 (NCCL 2.28) and ncclTunerPlugin_v4 (older releases). It
 * never fails a call: whatever it cannot use (a bad topology file, an unknown collective, a table
 * of another shape), it leaves to NCCL's own choice, and it never undoes what NCCL ruled out or
 * ranked last on purpose (negative entries, the fp8 Ring penalty). docs/nccl-plugins.md says how
 * to use it.
 */
#include <stdlib.h>
#include <string.h>

#include "topo.h"
#include "tuner_abi.h"
#include "tuner_model.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    loom_tuner_model_t model;
    nccl_logger_t log;
} tuner_ctx_t;

#define LOG(c, level, ...)                                                                         \
    do {                                                                                           \
        if ((c)->log)                                                                              \
            (c)->log((level), NCCL_LOG_TUNING, __FILE__, __LINE__, __VA_ARGS__);                   \
    } while (0)

/* NCCL multiplies the Ring entries by 1024 for fp8 on more than 8 ranks, where a ring's long
 * chain of fp8 additions loses precision. The datatype never reaches a tuner, so the penalty is
 * read off the table: unpenalized, NCCL's best Ring entry stays within a small factor of its best
 * other entry (above it by at most tens at thousands of ranks, below it by at most a few where
 * NVLS or CollNet is faster); penalized, it is hundreds of times above. The split sits at the
 * factor's square root, and a false alarm costs little: it only keeps Ring entries that NCCL
 * already ranks far behind. */
#define FP8_RANKS_ABOVE 8
#define PENALTY_SPLIT   32.0f

typedef struct {
    int penalized;  /* NCCL ranked Ring last on purpose */
    float ring_min; /* its smallest valid Ring entry */
} ring_penalty_t;

static ring_penalty_t find_ring_penalty(float (*table)[NCCL_PROTOS], int na, int nranks)
{
    ring_penalty_t r = {0, 0};
    float other_min = -1;
    r.ring_min = -1;
    if (nranks <= FP8_RANKS_ABOVE || na <= NCCL_ALGO_RING)
        return r;
    for (int a = 0; a < na; a++)
        for (int p = 0; p < NCCL_PROTOS; p++) {
            float t = table[a][p];
            float *min = a == NCCL_ALGO_RING ? &r.ring_min : &other_min;
            if (t >= 0 && (*min < 0 || t < *min))
                *min = t;
        }
    /* without another candidate the penalty cannot change NCCL's algorithm */
    r.penalized = r.ring_min >= 0 && other_min >= 0 && r.ring_min >= PENALTY_SPLIT * other_min;
    return r;
}

static nccl_result_t tuner_init(size_t nranks, size_t nnodes, nccl_logger_t log,
                                const nccl_tuner_constants_v5_t *constants, void **ctx)
{
    if (!ctx)
        return NCCL_OK;
    *ctx = NULL;
    tuner_ctx_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NCCL_OK; /* no context: getCollInfo leaves every choice to NCCL */
    c->log = log;
    loom_topo_t t = {0};
    const char *path = getenv("LOOM_TOPO_FILE"), *source = "detected";
    char err[512];
    if (path && *path) {
        if (loom_topo_read(path, &t, err, sizeof(err)) == 0)
            source = path;
        else
            LOG(c, NCCL_LOG_WARN, "loom tuner: LOOM_TOPO_FILE %s; using this host as detected",
                err);
    }
    if (t.nhosts == 0 && loom_topo_alloc(&t, 1, 0) == 0)
        loom_topo_detect_host(&t.hosts[0], NULL);
    int nr = nranks > (1u << 30) ? 1 << 30 : (int)nranks;
    int nn = nnodes > (1u << 30) ? 1 << 30 : (int)nnodes;
    loom_tuner_model_init(&c->model, t.nhosts ? &t : NULL, nr, nn);
    loom_topo_free(&t);
    const char *latencies = "NCCL 2.28's defaults";
    if (constants) {
        if (loom_tuner_model_use_constants(&c->model, constants) == 0)
            latencies = "NCCL's";
        else
            LOG(c, NCCL_LOG_WARN,
                "loom tuner: NCCL's latency constants are not times; using "
                "NCCL 2.28's defaults");
    }
    LOG(c, NCCL_LOG_INFO,
        "loom tuner: %d ranks on %d nodes; %.1f GB/s per rank inside a node, %.1f GB/s per node "
        "to the network (topology: %s; latencies: %s)",
        c->model.nranks, c->model.nnodes, c->model.intra_gbs, c->model.net_gbs, source, latencies);
    *ctx = c;
    return NCCL_OK;
}

static nccl_result_t tuner_get_coll_info(void *ctx, int coll, size_t nbytes, int pipe_ops,
                                         float **cost_table, int num_algo, int num_proto,
                                         int reg_buff, int *nchannels)
{
    (void)reg_buff;
    (void)nchannels; /* NCCL's channel count stands */
    tuner_ctx_t *c = ctx;
    if (!c || !cost_table || num_proto != NCCL_PROTOS || num_algo < 1)
        return NCCL_OK;
    /* NCCL passes a float[numAlgo][NCCL_PROTOS] array cast to float**. */
    float(*table)[NCCL_PROTOS] = (float(*)[NCCL_PROTOS])(void *)cost_table;
    int na = num_algo < NCCL_ALGOS ? num_algo : NCCL_ALGOS;
    ring_penalty_t pen = find_ring_penalty(table, na, c->model.nranks);
    for (int a = 0; a < na; a++)
        for (int p = 0; p < NCCL_PROTOS; p++) {
            if (table[a][p] < 0)
                continue; /* NCCL does not allow it here: never re-enabled */
            if (pen.penalized && a == NCCL_ALGO_RING)
                continue; /* NCCL's penalty stands */
            double us = loom_tuner_predict(&c->model, coll, a, p, nbytes, pipe_ops);
            /* under the penalty another algorithm takes loom's time only if that keeps it
             * ahead of Ring, so that the tuner never makes NCCL pick the lossy ring */
            if (us >= 0 && (!pen.penalized || us < pen.ring_min))
                table[a][p] = (float)us;
        }
    return NCCL_OK;
}

static nccl_result_t tuner_destroy(void *ctx)
{
    free(ctx);
    return NCCL_OK;
}

static nccl_result_t tuner_init_v5(void **ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                                   nccl_logger_t log, nccl_nvl_domain_info_v5_t *nvl,
                                   nccl_tuner_constants_v5_t *constants)
{
    (void)comm_id;
    (void)nvl;
    /* read only: NCCL's own model keeps its constants */
    return tuner_init(nranks, nnodes, log, constants, ctx);
}

static nccl_result_t tuner_init_v4(size_t nranks, size_t nnodes, nccl_logger_t log, void **ctx)
{
    return tuner_init(nranks, nnodes, log, NULL, ctx);
}

EXPORT const nccl_tuner_v5_t ncclTunerPlugin_v5 = {
    .name = "loom",
    .init = tuner_init_v5,
    .getCollInfo = tuner_get_coll_info,
    .finalize = tuner_destroy,
};

EXPORT const nccl_tuner_v4_t ncclTunerPlugin_v4 = {
    .name = "loom",
    .init = tuner_init_v4,
    .getCollInfo = tuner_get_coll_info,
    .destroy = tuner_destroy,
};

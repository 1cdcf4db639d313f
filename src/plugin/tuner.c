/* SPDX-License-Identifier: Apache-2.0
 *
 * tuner.c - libnccl-tuner-loom.so: an NCCL tuner plugin that fills NCCL's cost table with loom's
 * predictions (tuner_model.c) for the machine loom sees (LOOM_TOPO_FILE, else detection of this
 * host). Exports ncclTunerPlugin_v5 (NCCL 2.28) and ncclTunerPlugin_v4 (older releases). It
 * never fails a call: whatever it cannot use (a bad topology file, an unknown collective, a table
 * of another shape), it leaves to NCCL's own choice. docs/nccl-plugins.md says how to use it.
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

static nccl_result_t tuner_init(size_t nranks, size_t nnodes, nccl_logger_t log, void **ctx)
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
    LOG(c, NCCL_LOG_INFO,
        "loom tuner: %d ranks on %d nodes; %.1f GB/s per rank inside a node, %.1f GB/s per node "
        "to the network (topology: %s)",
        c->model.nranks, c->model.nnodes, c->model.intra_gbs, c->model.net_gbs, source);
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
    for (int a = 0; a < na; a++)
        for (int p = 0; p < NCCL_PROTOS; p++) {
            if (table[a][p] == NCCL_ALGO_PROTO_IGNORE)
                continue; /* NCCL does not allow it here: never re-enabled */
            double us = loom_tuner_predict(&c->model, coll, a, p, nbytes, pipe_ops);
            if (us >= 0)
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
    (void)constants; /* NCCL's own model keeps its constants */
    return tuner_init(nranks, nnodes, log, ctx);
}

EXPORT const nccl_tuner_v5_t ncclTunerPlugin_v5 = {
    .name = "loom",
    .init = tuner_init_v5,
    .getCollInfo = tuner_get_coll_info,
    .finalize = tuner_destroy,
};

EXPORT const nccl_tuner_v4_t ncclTunerPlugin_v4 = {
    .name = "loom",
    .init = tuner_init,
    .getCollInfo = tuner_get_coll_info,
    .destroy = tuner_destroy,
};

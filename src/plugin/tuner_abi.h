/* SPDX-License-Identifier: Apache-2.0
 *
 * tuner_abi.h - the parts of NCCL's tuner plugin ABI that loom's tuner implements, written from
 * NCCL's documented layout (NCCL 2.28: ncclTunerPlugin_v5, and v4 for older releases). Only the
 * plugin and its tests include this; nothing here comes from NCCL's headers.
 */
#ifndef LOOM_PLUGIN_TUNER_ABI_H
#define LOOM_PLUGIN_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int nccl_result_t; /* ncclResult_t: 0 is ncclSuccess */
#define NCCL_OK 0

/* ncclFunc_t: only the first five reach a tuner. */
enum {
    NCCL_FN_BROADCAST,
    NCCL_FN_REDUCE,
    NCCL_FN_ALLGATHER,
    NCCL_FN_REDUCESCATTER,
    NCCL_FN_ALLREDUCE,
    NCCL_FN_COUNT
};

/* Algorithms and protocols: the cost table is float[NCCL_ALGOS][NCCL_PROTOS], microseconds;
 * -1 marks a combination NCCL does not allow, and NCCL picks the smallest other entry. */
enum {
    NCCL_ALGO_TREE,
    NCCL_ALGO_RING,
    NCCL_ALGO_COLLNET_DIRECT,
    NCCL_ALGO_COLLNET_CHAIN,
    NCCL_ALGO_NVLS,
    NCCL_ALGO_NVLS_TREE,
    NCCL_ALGO_PAT,
    NCCL_ALGOS
};
enum { NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE, NCCL_PROTOS };
#define NCCL_ALGO_PROTO_IGNORE (-1.0f)
/* NCCL ignores every negative entry, not only -1: it multiplies a whole Ring row by 1024 for fp8
 * on more than 8 ranks (to rank the lossy ring reduction last), which turns a -1 into -1024. */

/* The links of NCCL's hop latencies (hwLatencies' first index). */
enum { NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET, NCCL_HW_LINKS };

typedef void (*nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                              const char *fmt, ...);
#define NCCL_LOG_WARN   2
#define NCCL_LOG_INFO   3
#define NCCL_LOG_TUNING 0x40

typedef struct {
    int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} nccl_nvl_domain_info_v5_t;

/* NCCL's model constants (v5): NCCL passes them to init before it builds its own model, 1152
 * bytes of doubles. loom's tuner reads the Tree and Ring latencies (microseconds) and changes
 * nothing. */
typedef struct {
    double baseLatencies[NCCL_ALGOS][NCCL_PROTOS];
    double hwLatencies[NCCL_HW_LINKS][NCCL_ALGOS][NCCL_PROTOS];
    double llMaxBws[4][3];
    double perChMaxRingLL128Bws[4][3];
    double perChMaxTreeLL128Bws[4][3];
    double perChMaxTreeBws[4][3];
    double perChMaxNVLSTreeBws[4][3];
} nccl_tuner_constants_v5_t;

/* getCollInfo of v4 and v5 (and of v6 in later releases): no version passes the datatype. */
typedef nccl_result_t (*nccl_get_coll_info_fn_t)(void *ctx, int collType, size_t nBytes,
                                                 int numPipeOps, float **collCostTable, int numAlgo,
                                                 int numProto, int regBuff, int *nChannels);

typedef struct {
    const char *name;
    nccl_result_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                          nccl_logger_t logFunction, nccl_nvl_domain_info_v5_t *nvlDomainInfo,
                          nccl_tuner_constants_v5_t *constants);
    nccl_get_coll_info_fn_t getCollInfo;
    nccl_result_t (*finalize)(void *ctx);
} nccl_tuner_v5_t;

typedef struct {
    const char *name;
    nccl_result_t (*init)(size_t nRanks, size_t nNodes, nccl_logger_t logFunction, void **ctx);
    nccl_get_coll_info_fn_t getCollInfo;
    nccl_result_t (*destroy)(void *ctx);
} nccl_tuner_v4_t;

#endif

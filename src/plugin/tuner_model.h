/* SPDX-License-Identifier: Apache-2.0
 *
 * tuner_model.h - loom's model of NCCL's Ring and Tree algorithms on a described machine, for
 * the NCCL tuner plugin: the links come from loom's topology (NVLink or PCIe or shared memory
 * inside a node, the RDMA ports or NICs between nodes), and each algorithm x protocol's time is
 * latency (NCCL's per-protocol base and per-hop latencies) plus bytes over the bottleneck link's
 * rate, scaled by what the protocol delivers of it.
 */
#ifndef LOOM_PLUGIN_TUNER_MODEL_H
#define LOOM_PLUGIN_TUNER_MODEL_H

#include <stddef.h>

#include "topo.h"
#include "tuner_abi.h"

typedef struct {
    int nranks, nnodes, per_node;
    double intra_gbs; /* GB/s one rank moves inside its node (per direction) */
    double net_gbs;   /* GB/s one node moves to the network (all its rails) */
    int intra_link;   /* NCCL_HW_NVLINK, or NCCL_HW_PCI for PCIe and shared memory */
    int nvswitch;
    /* Microseconds, indexed by NCCL's numbering: base latency [algo][proto] and per-hop latency
     * [link][algo][proto] of Tree and Ring. */
    double base_us[NCCL_ALGO_RING + 1][NCCL_PROTOS];
    double hop_us[NCCL_HW_LINKS][NCCL_ALGO_RING + 1][NCCL_PROTOS];
} loom_tuner_model_t;

/* Fills m for a communicator of nranks over nnodes, from t's first host (nodes are taken to be
 * alike; nnodes < 1 counts as 1), with NCCL 2.28's default latencies. */
void loom_tuner_model_init(loom_tuner_model_t *m, const loom_topo_t *t, int nranks, int nnodes);
/* Takes the Tree and Ring latencies from the constants NCCL hands to a v5 init, the values its
 * own model uses. Returns 0, or -1 with m unchanged when one of them is not a time (negative,
 * zero, not finite, above a second): the constants of a release whose layout differs. */
int loom_tuner_model_use_constants(loom_tuner_model_t *m, const nccl_tuner_constants_v5_t *k);
/* Predicted microseconds of NCCL algorithm algo with protocol proto for collective coll (the
 * tuner ABI's numbering) of nbytes, repeated pipe_ops times back to back; a negative value when
 * loom does not model that combination (the caller leaves NCCL's own entry). */
double loom_tuner_predict(const loom_tuner_model_t *m, int coll, int algo, int proto, size_t nbytes,
                          int pipe_ops);

#endif

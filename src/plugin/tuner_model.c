/* SPDX-License-Identifier: Apache-2.0
 *
 * tuner_model.c - Ring and Tree times per protocol on a topology (tuner_model.h). The hop and
 * base latencies are NCCL's (its 2.28 defaults, or the constants NCCL hands to a v5 init); the
 * rates come from the machine: a ring step inside a node runs at the rank's NVLink (or PCIe)
 * rate, a step between nodes at its share of the node's network rate (one rail per rank), and
 * every step of a pipeline runs at the slowest.
 */
#include "tuner_model.h"

#include <math.h>
#include <string.h>

/* NCCL 2.28's defaults (ncclTunerConstantsDefaults), microseconds: base latency per algorithm
 * and protocol, and per-hop latency by link. */
static const double default_base_us[NCCL_ALGO_RING + 1][NCCL_PROTOS] = {
    [NCCL_ALGO_TREE] = {6.8, 14.0, 8.4},
    [NCCL_ALGO_RING] = {6.6, 14.0, 8.4},
};
static const double default_hop_us[NCCL_HW_LINKS][NCCL_ALGO_RING + 1][NCCL_PROTOS] = {
    [NCCL_HW_NVLINK] = {[NCCL_ALGO_TREE] = {0.6, 1.25, 4.0}, [NCCL_ALGO_RING] = {0.6, 1.9, 3.4}},
    [NCCL_HW_PCI] = {[NCCL_ALGO_TREE] = {1.0, 1.9, 4.0}, [NCCL_ALGO_RING] = {1.0, 2.5, 5.7}},
    [NCCL_HW_NET] = {[NCCL_ALGO_TREE] = {5.0, 8.5, 14.0}, [NCCL_ALGO_RING] = {2.7, 4.0, 14.0}},
};
/* What each protocol delivers of a link's rate: LL sends a flag with every 8 bytes, LL128 one
 * per 128. */
static const double proto_eff[NCCL_PROTOS] = {0.5, 0.9375, 1.0};

static int is_latency(double us)
{
    return isfinite(us) && us > 0 && us <= 1e6;
}

int loom_tuner_model_use_constants(loom_tuner_model_t *m, const nccl_tuner_constants_v5_t *k)
{
    if (!k)
        return -1;
    for (int a = NCCL_ALGO_TREE; a <= NCCL_ALGO_RING; a++)
        for (int p = 0; p < NCCL_PROTOS; p++) {
            if (!is_latency(k->baseLatencies[a][p]))
                return -1;
            for (int l = 0; l < NCCL_HW_LINKS; l++)
                if (!is_latency(k->hwLatencies[l][a][p]))
                    return -1;
        }
    for (int a = NCCL_ALGO_TREE; a <= NCCL_ALGO_RING; a++)
        for (int p = 0; p < NCCL_PROTOS; p++) {
            m->base_us[a][p] = k->baseLatencies[a][p];
            for (int l = 0; l < NCCL_HW_LINKS; l++)
                m->hop_us[l][a][p] = k->hwLatencies[l][a][p];
        }
    return 0;
}

void loom_tuner_model_init(loom_tuner_model_t *m, const loom_topo_t *t, int nranks, int nnodes)
{
    m->nranks = nranks > 0 ? nranks : 1;
    m->nnodes = nnodes > 0 ? nnodes : 1;
    if (m->nnodes > m->nranks)
        m->nnodes = m->nranks;
    m->per_node = (m->nranks + m->nnodes - 1) / m->nnodes;
    const loom_topo_host_t *h = t && t->nhosts > 0 ? &t->hosts[0] : NULL;
    memcpy(m->base_us, default_base_us, sizeof(m->base_us));
    memcpy(m->hop_us, default_hop_us, sizeof(m->hop_us));
    m->nvswitch = h && h->nvswitch;
    m->intra_link = NCCL_HW_PCI;
    m->intra_gbs = 10.0; /* shared memory between CPU processes */
    if (h && h->ngpus > 0) {
        double nvl = h->gpus[0].nvlinks * h->gpus[0].nvlink_gbps / 8.0;
        if (nvl > 0) {
            m->intra_gbs = nvl;
            m->intra_link = NCCL_HW_NVLINK;
        } else {
            m->intra_gbs = 24.0; /* PCIe Gen4 x16, one direction, as delivered */
        }
    }
    /* The network: active RDMA ports, else NICs that are up with a known speed, else 10 Gbit/s. */
    double net = 0;
    for (int i = 0; h && i < h->nrdma; i++)
        if (h->rdma[i].active && h->rdma[i].rate_gbps > 0)
            net += h->rdma[i].rate_gbps / 8.0;
    for (int i = 0; h && net == 0 && i < h->nnics; i++)
        if (h->nics[i].up && h->nics[i].speed_mbps > 0)
            net += h->nics[i].speed_mbps / 8000.0;
    m->net_gbs = net > 0 ? net : 1.25;
}

/* GB/s one rank gets through the slowest link its ring or tree crosses. */
static double rank_rate(const loom_tuner_model_t *m)
{
    double r = m->intra_gbs;
    if (m->nnodes > 1) {
        double share = m->net_gbs / m->per_node;
        if (share < r)
            r = share;
    }
    return r;
}

double loom_tuner_predict(const loom_tuner_model_t *m, int coll, int algo, int proto, size_t nbytes,
                          int pipe_ops)
{
    if (proto < 0 || proto >= NCCL_PROTOS || coll < 0 || coll >= NCCL_FN_COUNT)
        return -1;
    if (algo != NCCL_ALGO_RING && algo != NCCL_ALGO_TREE)
        return -1;
    int n = m->nranks, N = m->nnodes, g = m->per_node;
    double S = (double)nbytes, ops = pipe_ops > 0 ? pipe_ops : 1;
    double base = m->base_us[algo][proto];
    double hop_in = m->hop_us[m->intra_link][algo][proto],
           hop_net = m->hop_us[NCCL_HW_NET][algo][proto];
    double rate = rank_rate(m) * proto_eff[proto] * 1e3; /* bytes per microsecond */
    double lat, bytes;
    if (algo == NCCL_ALGO_TREE) {
        if (coll != NCCL_FN_ALLREDUCE)
            return -1; /* NCCL runs trees for AllReduce only */
        /* up a chain inside the node and a binary tree across nodes, then back down */
        lat = base + 2.0 * ((g - 1) * hop_in + (N > 1 ? ceil(log2(N)) * hop_net : 0));
        bytes = 2.0 * S;
    } else {
        /* a ring crosses the network once per node, every other step stays inside a node */
        double hops = (n - N) * hop_in + (N > 1 ? N * hop_net : 0);
        if (coll == NCCL_FN_ALLREDUCE) {
            lat = base + 2.0 * hops;
            bytes = 2.0 * (n - 1) / n * S;
        } else if (coll == NCCL_FN_ALLGATHER || coll == NCCL_FN_REDUCESCATTER) {
            lat = base + hops;
            bytes = (double)(n - 1) / n * S;
        } else { /* Broadcast, Reduce: a pipelined chain */
            lat = base + hops;
            bytes = S;
        }
    }
    return lat * ops + bytes / rate;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * net_auto.h - the choice between ucx and tcp across hosts when LOOM_NET is unset (net_auto.c).
 */
#ifndef LOOM_API_NET_AUTO_H
#define LOOM_API_NET_AUTO_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this rank offers for its links between hosts: NONE where net names transports, the
 * communicator stays on one host (spans_hosts 0) or the build has no UCX; else OFFER when
 * loom_net_prefer_ucx says so for this host's RDMA port, DECLINE otherwise. *rdma_gbps_p is
 * that port's rate (0: none, or not looked for: one host, no UCX), for the collectives' model
 * of the links UCX carries. */
loom_tp_ucx_auto_t loom_net_auto(const char *net, int spans_hosts, int tcp_mbps,
                                 double *rdma_gbps_p);
/* 1 when the cost model predicts a message to take less time over UCX at an RDMA port of
 * rdma_gbps (<= 0: none) than over tcp on an interface of tcp_mbps (<= 0: unknown). */
int loom_net_prefer_ucx(int tcp_mbps, double rdma_gbps);
/* The speed of the interface TCP uses (LOOM_SOCKET_IFNAME's choice) in Mbit/s; -1 unknown. */
int loom_net_tcp_mbps(void);
/* This host's best active RDMA rate as LOOM_TOPO_FILE describes it (0: none), which then
 * stands for this process instead of detection; topo_init.c calls it when it reads a file. */
void loom_net_set_file_rdma(double gbps);

#ifdef __cplusplus
}
#endif

#endif

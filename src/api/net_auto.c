/* SPDX-License-Identifier: Apache-2.0
 *
 * net_auto.c - loom's own choice of the transport between hosts when LOOM_NET leaves it open:
 * ucx where this build has UCX and the host has an active RDMA port whose rate, put into the
 * cost model, predicts a message of NET_CHOICE_BYTES to take less time than tcp at the speed
 * of the interface TCP uses; tcp otherwise. Each rank judges its own host and offers ucx or
 * not; p2p.c then uses ucx for a pair of ranks only where both offered it and UCX started on
 * both, so a host without RDMA keeps tcp with everyone and the ranks need no extra exchange.
 * The RDMA port comes from LOOM_TOPO_FILE when it describes this host (so a file can fix a
 * wrong detection, and tests can describe RDMA that is not there), else from detection, done
 * once per process. The rates found here also go to the collectives' model
 * (loom_coll_ctx_init), which prices the links with the class that carries them.
 */
#include <pthread.h>

#include "cost_model.h"
#include "debug.h"
#include "net_auto.h"
#include "socket.h"
#include "topo.h"
#include "transport.h"

/* The message the choice compares: large enough that the rate decides between links of
 * different speeds, small enough that latency still counts. */
#define NET_CHOICE_BYTES (1 << 20)

static pthread_mutex_t rdma_lock = PTHREAD_MUTEX_INITIALIZER;
static double file_rdma_gbps = -1;  /* from LOOM_TOPO_FILE; -1: no file said */
static double found_rdma_gbps = -1; /* detected; -1: not yet looked */

void loom_net_set_file_rdma(double gbps)
{
    pthread_mutex_lock(&rdma_lock);
    file_rdma_gbps = gbps;
    pthread_mutex_unlock(&rdma_lock);
}

static double host_rdma_gbps(void)
{
    pthread_mutex_lock(&rdma_lock);
    if (file_rdma_gbps < 0 && found_rdma_gbps < 0) {
        loom_topo_host_t h;
        loom_topo_detect_rdma(&h, NULL);
        found_rdma_gbps = loom_topo_best_rdma_gbps(&h);
    }
    double gbps = file_rdma_gbps >= 0 ? file_rdma_gbps : found_rdma_gbps;
    pthread_mutex_unlock(&rdma_lock);
    return gbps;
}

int loom_net_tcp_mbps(void)
{
    loom_sockaddr_t addr;
    char ifname[64] = "";
    if (loom_socket_pick_addr(&addr, ifname, sizeof(ifname)) != loomSuccess)
        return -1;
    return loom_topo_nic_speed_mbps(ifname, NULL);
}

int loom_net_prefer_ucx(int tcp_mbps, double rdma_gbps)
{
    if (!(rdma_gbps > 0))
        return 0;
    loom_link_cost_t tcp =
        loom_link_cost_at_rate(LOOM_LINK_TCP, tcp_mbps > 0 ? 8000.0 / tcp_mbps : 0);
    loom_link_cost_t ucx = loom_link_cost_at_rate(LOOM_LINK_UCX, 8.0 / rdma_gbps);
    return loom_link_message_ns(&ucx, NET_CHOICE_BYTES) <
           loom_link_message_ns(&tcp, NET_CHOICE_BYTES);
}

loom_tp_ucx_auto_t loom_net_auto(const char *net, int spans_hosts, int tcp_mbps,
                                 double *rdma_gbps_p)
{
    *rdma_gbps_p = 0;
    if (!spans_hosts || !loom_tp_built("ucx"))
        return LOOM_TP_UCX_AUTO_NONE;
    double gbps = host_rdma_gbps();
    *rdma_gbps_p = gbps; /* also where LOOM_NET names ucx: the model prices its links */
    if (net != NULL && net[0] != '\0')
        return LOOM_TP_UCX_AUTO_NONE;
    int offer = loom_net_prefer_ucx(tcp_mbps, gbps);
    LOOM_INFO(LOOM_LOG_INIT | LOOM_LOG_TRANSPORT,
              "between hosts: RDMA %.0f Gbit/s, TCP interface %d Mbit/s: %s", gbps, tcp_mbps,
              offer ? "ucx offered" : "tcp");
    return offer ? LOOM_TP_UCX_AUTO_OFFER : LOOM_TP_UCX_AUTO_DECLINE;
}

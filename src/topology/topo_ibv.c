/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_ibv.c - RDMA ports as libibverbs reports them: for each device and port, the link layer
 * (InfiniBand or Ethernet, i.e. RoCE), whether it is active, and its rate decoded from the
 * port's width and per-lane speed. It opens devices only to query them: no protection domain,
 * no queue pair. NUMA placement is left to topo_detect.c, the file that reads sysfs. The rate
 * table is always built (it is pure and unit-tested); the rest only when meson found
 * libibverbs. Called by topo_detect.c.
 */
#include "topo_sources.h"

#include <stddef.h>

/* Per-lane signalling rate in tenths of Gbit/s for each active_speed code, and lanes for each
 * active_width code, as the InfiniBand Architecture Specification numbers them (and verbs.h's
 * ibv_port_attr documents). Tenths keep SDR's 2.5 exact; the products match the kernel's
 * sysfs rate file (drivers/infiniband/core/sysfs.c), e.g. 4X FDR is 56, not 56.25. */
static const struct {
    int code, tenths;
} lane_speeds[] = {
    {1, 25},     /* SDR */
    {2, 50},     /* DDR */
    {4, 100},    /* QDR */
    {8, 100},    /* FDR10: 10.3125 Gbit/s with 64b/66b, reported as 10 */
    {16, 140},   /* FDR: 14.0625, reported as 14 */
    {32, 250},   /* EDR */
    {64, 500},   /* HDR */
    {128, 1000}, /* NDR */
    {256, 2000}, /* XDR: only in active_speed_ex of newer rdma-core */
};

static const struct {
    int code, lanes;
} widths[] = {
    {1, 1},  /* 1X */
    {2, 4},  /* 4X */
    {4, 8},  /* 8X */
    {8, 12}, /* 12X */
    {16, 2}, /* 2X */
};

double loom_topo_ibv_rate_gbps(int active_width, int active_speed)
{
    int lanes = 0, tenths = 0;
    for (size_t i = 0; i < sizeof(widths) / sizeof(*widths); i++)
        if (widths[i].code == active_width)
            lanes = widths[i].lanes;
    for (size_t i = 0; i < sizeof(lane_speeds) / sizeof(*lane_speeds); i++)
        if (lane_speeds[i].code == active_speed)
            tenths = lane_speeds[i].tenths;
    if (!lanes || !tenths)
        return -1;
    return lanes * tenths / 10.0;
}

#if LOOM_HAVE_IBVERBS

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"

static const char *link_layer_name(uint8_t ll)
{
    switch (ll) {
    case IBV_LINK_LAYER_ETHERNET:
        return "Ethernet";
    /* drivers older than RoCE report no link layer for InfiniBand ports, and sysfs prints
     * "InfiniBand" for those too */
    case IBV_LINK_LAYER_UNSPECIFIED:
    case IBV_LINK_LAYER_INFINIBAND:
        return "InfiniBand";
    default:
        return "unknown";
    }
}

/* Name order, then port order: the order the sysfs reader gives, so that the two sources
 * describe the same host with the same records. */
static int cmp_port(const void *a, const void *b)
{
    const loom_topo_rdma_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->port - y->port;
}

/* Appends a record for each port of dev; a device that cannot be opened or queried is
 * skipped with an INFO line, since the others are still worth describing. */
static void add_device(loom_topo_host_t *h, struct ibv_device *dev)
{
    const char *name = ibv_get_device_name(dev);
    struct ibv_context *ctx = ibv_open_device(dev);
    if (!ctx) {
        LOOM_INFO(LOOM_LOG_TOPO, "libibverbs: cannot open %s: %s", name ? name : "?",
                  strerror(errno));
        return;
    }
    struct ibv_device_attr da;
    int rc = ibv_query_device(ctx, &da);
    if (rc) {
        /* verbs return an errno value, not -1 */
        LOOM_INFO(LOOM_LOG_TOPO, "libibverbs: cannot query %s: %s", name ? name : "?",
                  strerror(rc));
        da.phys_port_cnt = 0;
    }
    for (int port = 1; port <= da.phys_port_cnt && h->nrdma < LOOM_TOPO_MAX_RDMA; port++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof(pa));
        rc = ibv_query_port(ctx, (uint8_t)port, &pa);
        if (rc) {
            LOOM_INFO(LOOM_LOG_TOPO, "libibverbs: cannot query %s port %d: %s", name ? name : "?",
                      port, strerror(rc));
            continue;
        }
        loom_topo_rdma_t *r = &h->rdma[h->nrdma++];
        memset(r, 0, sizeof(*r));
        snprintf(r->name, sizeof(r->name), "%s", name ? name : "?");
        r->port = port;
        snprintf(r->link_layer, sizeof(r->link_layer), "%s", link_layer_name(pa.link_layer));
        r->active = pa.state == IBV_PORT_ACTIVE;
        r->rate_gbps = loom_topo_ibv_rate_gbps(pa.active_width, pa.active_speed);
        r->numa = -1;
    }
    if (ibv_close_device(ctx))
        LOOM_INFO(LOOM_LOG_TOPO, "libibverbs: cannot close %s: %s", name ? name : "?",
                  strerror(errno));
}

int loom_topo_ibv_detect(loom_topo_host_t *h)
{
    int ndev = 0;
    struct ibv_device **list = ibv_get_device_list(&ndev);
    h->nrdma = 0;
    if (!list) {
        /* ENOSYS is a kernel without RDMA (no /sys/class/infiniband_verbs): no ports, which is
         * an answer, not a failure */
        if (errno == ENOSYS)
            return 0;
        LOOM_INFO(LOOM_LOG_TOPO, "libibverbs: cannot list RDMA devices: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < ndev && h->nrdma < LOOM_TOPO_MAX_RDMA; i++)
        add_device(h, list[i]);
    ibv_free_device_list(list);
    qsort(h->rdma, (size_t)h->nrdma, sizeof(h->rdma[0]), cmp_port);
    return 0;
}

#endif

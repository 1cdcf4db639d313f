/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_sources.h - the detection sources beside sysfs: hwloc (topo_hwloc.c), libibverbs
 * (topo_ibv.c) and NVML (topo_nvml.c). Each fills part of a host record and says whether it
 * could; topo_detect.c alone decides which ones run and falls back to sysfs for the rest. The
 * first two exist only when the build found their library (topo_config.h says which) and the
 * build is not the sysfs-only one (LOOM_TOPO_SYSFS_ONLY: the NCCL tuner plugin's copy, which
 * must load where neither library is installed); NVML is always built, because it is loaded at
 * run time.
 */
#ifndef LOOM_TOPOLOGY_TOPO_SOURCES_H
#define LOOM_TOPOLOGY_TOPO_SOURCES_H

#include "topo.h"
#include "topo_config.h"

#ifdef LOOM_TOPO_SYSFS_ONLY
#undef LOOM_HAVE_HWLOC
#define LOOM_HAVE_HWLOC 0
#undef LOOM_HAVE_IBVERBS
#define LOOM_HAVE_IBVERBS 0
#endif

#if LOOM_HAVE_HWLOC
/* Fills packages, cores, cpus, l1d_kb, l2_kb, l3_kb and numa[] from hwloc, and the NUMA node of
 * each NIC, RDMA device and GPU already in h whose node is unknown (-1) and that hwloc places
 * under exactly one node. synthetic NULL: this machine, CPUs outside this process's cgroup
 * included (as sysfs counts them); otherwise an hwloc synthetic description, e.g. "pack:2 numa:1
 * core:4 pu:2" (tests). Returns 0, or -1 with h's CPU and NUMA fields untouched if hwloc could not
 * load the topology. */
int loom_topo_hwloc_detect(loom_topo_host_t *h, const char *synthetic);
#endif

#if LOOM_HAVE_IBVERBS
/* Replaces h's RDMA ports with libibverbs' view: one record per device and port, with link
 * layer, state and rate; numa is left -1 for the caller (sysfs). Returns 0, with no ports on a
 * kernel without RDMA, or -1 with no ports if libibverbs cannot list devices for another
 * reason. */
int loom_topo_ibv_detect(loom_topo_host_t *h);
#endif

/* A port's rate in Gbit/s from ibv_port_attr's active_width and active_speed codes (the values
 * of enum ibv_port_width_t and the IB speed codes), as the kernel prints it in sysfs' rate, e.g.
 * 4X (2) NDR (128) is 400; -1 for a code neither table knows. Pure; always built, so that the
 * table is tested even where libibverbs is not. */
double loom_topo_ibv_rate_gbps(int active_width, int active_speed);

/* Replaces h's GPUs with NVML's view (name, PCI address, active NVLinks and their rate) and sets
 * h->nvswitch when an active link ends at an NVSwitch; numa is left -1 for the caller. lib is
 * the library to dlopen ("" skips NVML). Returns 0, or -1 with h untouched when the library or
 * one of its required functions is missing or NVML fails to start (no driver). */
int loom_topo_nvml_detect(loom_topo_host_t *h, const char *lib);

#endif

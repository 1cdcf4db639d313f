/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_hwloc.c - the host's CPUs, cores, packages, caches and NUMA nodes as hwloc sees them,
 * and the NUMA node of the NICs, RDMA devices and GPUs that sysfs left unplaced, through hwloc's
 * PCI and OS-device objects. hwloc knows machines whose sysfs is odd (no node directory, cores
 * numbered per die) and places devices by their local CPUs when firmware gives no numa_node.
 * It does not find devices: the records it places come from the other sources. Called by
 * topo_detect.c only; built only when meson found hwloc. Tests drive it with a synthetic topology.
 */
#include "topo_sources.h"

#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"

/* hwloc components loom does not want. Those that load GPU runtimes (CUDA, NVML, OpenCL, ROCm
 * SMI, Level Zero) or talk to an X server only add OS devices that loom finds by other means,
 * and cost time and libraries in the process. "pci" is libpciaccess: hwloc's Linux backend
 * reads the PCI tree from sysfs itself, with the classes and bus ids loom needs, whereas
 * libpciaccess keeps state in its globals that is lost (and reported by LeakSanitizer) when
 * hwloc unloads the plugin at hwloc_topology_destroy. */
static const char *const skipped_components[] = {"cuda",      "nvml", "opencl", "rsmi",
                                                 "levelzero", "gl",   "pci"};

/* The only NUMA node under which hwloc places obj (by its nearest CPU-side ancestor), or -1
 * when that ancestor spans several nodes or none. */
static int32_t numa_of_obj(hwloc_topology_t topo, hwloc_obj_t obj)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
    if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1)
        return -1;
    return (int32_t)hwloc_bitmap_first(anc->nodeset);
}

static hwloc_obj_t osdev_by_name(hwloc_topology_t topo, const char *name)
{
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o))
        if (o->name && !strcmp(o->name, name))
            return o;
    return NULL;
}

static void place_devices(hwloc_topology_t topo, loom_topo_host_t *h)
{
    for (int i = 0; i < h->nnics; i++) {
        hwloc_obj_t o = h->nics[i].numa < 0 ? osdev_by_name(topo, h->nics[i].name) : NULL;
        if (o)
            h->nics[i].numa = numa_of_obj(topo, o);
    }
    for (int i = 0; i < h->nrdma; i++) {
        hwloc_obj_t o = h->rdma[i].numa < 0 ? osdev_by_name(topo, h->rdma[i].name) : NULL;
        if (o)
            h->rdma[i].numa = numa_of_obj(topo, o);
    }
    for (int i = 0; i < h->ngpus; i++) {
        unsigned dom, bus, dev, fn;
        if (h->gpus[i].numa >= 0 ||
            sscanf(h->gpus[i].pci, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
            continue;
        hwloc_obj_t o = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
        if (o)
            h->gpus[i].numa = numa_of_obj(topo, o);
    }
}

static int cmp_numa_id(const void *a, const void *b)
{
    const loom_topo_numa_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* NUMA nodes in id order, as sysfs lists them; cpus counts PUs present, so a node's count and
 * its list agree even where the firmware declares CPUs that are not there. */
static void fill_numa(hwloc_topology_t topo, loom_topo_host_t *h)
{
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    h->nnuma = 0;
    for (int i = 0; i < n && h->nnuma < LOOM_TOPO_MAX_NUMA; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (!o)
            continue;
        loom_topo_numa_t *m = &h->numa[h->nnuma++];
        memset(m, 0, sizeof(*m));
        m->id = (int32_t)o->os_index;
        m->cpus =
            o->cpuset ? hwloc_get_nbobjs_inside_cpuset_by_type(topo, o->cpuset, HWLOC_OBJ_PU) : 0;
        /* hwloc writes ranges as "0-3,8", the kernel's cpulist format; one that does not fit
         * ends in "...", as the sysfs reader's does */
        if (o->cpuset && hwloc_bitmap_list_snprintf(m->cpulist, sizeof(m->cpulist), o->cpuset) >=
                             (int)sizeof(m->cpulist))
            snprintf(m->cpulist + sizeof(m->cpulist) - 4, 4, "...");
        m->mem_mb = o->attr && o->attr->numanode.local_memory
                        ? (int64_t)(o->attr->numanode.local_memory >> 20)
                        : -1;
    }
    qsort(h->numa, (size_t)h->nnuma, sizeof(h->numa[0]), cmp_numa_id);
}

/* The L3 of one package: the sum over the L3 caches inside the first package (several on
 * chiplet CPUs), or the machine's total divided among packages when hwloc reports none. */
static int32_t l3_of_package(hwloc_topology_t topo, int32_t packages)
{
    hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
    hwloc_obj_t scope = pkg ? pkg : hwloc_get_root_obj(topo);
    unsigned long long bytes = 0;
    int n = hwloc_get_nbobjs_inside_cpuset_by_type(topo, scope->cpuset, HWLOC_OBJ_L3CACHE);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t c = hwloc_get_obj_inside_cpuset_by_type(topo, scope->cpuset, HWLOC_OBJ_L3CACHE,
                                                            (unsigned)i);
        if (c && c->attr)
            bytes += c->attr->cache.size;
    }
    if (!n || !bytes)
        return -1;
    if (!pkg && packages > 1)
        bytes /= (unsigned long long)packages;
    unsigned long long kb = bytes >> 10;
    return kb > INT32_MAX ? INT32_MAX : (int32_t)kb;
}

/* The size in KiB of the cache of the given type above the first PU (the first online CPU, as
 * sysfs counts them), or -1 when there is none (synthetic topologies without that level). */
static int32_t cache_of_first_pu(hwloc_topology_t topo, hwloc_obj_type_t type)
{
    hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, 0);
    hwloc_obj_t c = pu ? hwloc_get_ancestor_obj_by_type(topo, type, pu) : NULL;
    unsigned long long kb = c && c->attr ? c->attr->cache.size >> 10 : 0;
    return kb && kb <= (1ULL << 30) ? (int32_t)kb : -1;
}

/* Configures and loads a topology: a synthetic one, or this machine with its I/O devices. */
static int load(hwloc_topology_t *topo_p, const char *synthetic)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo)) {
        LOOM_INFO(LOOM_LOG_TOPO, "hwloc: cannot initialize a topology; CPUs from sysfs");
        return -1;
    }
    int rc;
    if (synthetic) {
        rc = hwloc_topology_set_synthetic(topo, synthetic);
    } else {
        /* count every online CPU, as sysfs does: the job's binding is the rank record's
         * business, not the host's */
        rc = hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
        for (size_t i = 0; !rc && i < sizeof(skipped_components) / sizeof(*skipped_components); i++)
            (void)hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                                skipped_components[i]);
        /* PCI devices and their OS devices (NICs, RDMA, GPUs); bridges only as needed */
        if (!rc)
            rc = hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    }
    if (!rc)
        rc = hwloc_topology_load(topo);
    if (rc) {
        LOOM_INFO(LOOM_LOG_TOPO, "hwloc: cannot load the %s topology; CPUs from sysfs",
                  synthetic ? "synthetic" : "host's");
        hwloc_topology_destroy(topo);
        return -1;
    }
    *topo_p = topo;
    return 0;
}

int loom_topo_hwloc_detect(loom_topo_host_t *h, const char *synthetic)
{
    hwloc_topology_t topo;
    if (load(&topo, synthetic))
        return -1;
    int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    if (pus <= 0) {
        LOOM_INFO(LOOM_LOG_TOPO, "hwloc: the topology has no CPUs; CPUs from sysfs");
        hwloc_topology_destroy(topo);
        return -1;
    }
    int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    h->cpus = pus;
    /* some virtual machines report neither; one package of single-thread cores is what
     * the sysfs reader assumes then too */
    h->packages = packages > 0 ? packages : 1;
    h->cores = cores > 0 ? cores : pus;
    h->l3_kb = l3_of_package(topo, h->packages);
    h->l1d_kb = cache_of_first_pu(topo, HWLOC_OBJ_L1CACHE);
    h->l2_kb = cache_of_first_pu(topo, HWLOC_OBJ_L2CACHE);
    fill_numa(topo, h);
    place_devices(topo, h);
    hwloc_topology_destroy(topo);
    return 0;
}

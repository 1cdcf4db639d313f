/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_detect.c - decides where each part of a host's description comes from, and reads what
 * Linux describes in sysfs: CPUs, cores, packages and caches (devices/system/cpu), NUMA nodes
 * (devices/system/node), network interfaces (class/net), RDMA ports (class/infiniband) and
 * NVIDIA GPUs (bus/pci). For this machine it prefers hwloc (CPUs, NUMA, device placement),
 * libibverbs (RDMA ports) and NVML (GPUs, NVLinks) where the build or the system has them, and
 * falls back to sysfs part by part (docs/topology.md). The only file of loom that reads /sys. A
 * sysroot prefix lets tests describe machines that are not here; it always means sysfs.
 */
#include "topo.h"

#include <dirent.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "debug.h"
#include "param.h"
#include "topo_sources.h"

#define MAX_CPUS 4096

/* snprintf for paths and names built from directory entries; a result that does not fit is
 * cut, which at worst makes a read fail (an unknown value), never overflows. */
__attribute__((format(printf, 3, 4))) static void pathf(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0)
        buf[0] = '\0';
}

/* Reads the first line of root/rel into buf (newline removed); -1 if it cannot be read. */
static int read_line(const char *root, const char *rel, char *buf, size_t len)
{
    char path[1024];
    pathf(path, sizeof(path), "%s%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *ok = fgets(buf, (int)len, f);
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static long read_long(const char *root, const char *rel, long dflt)
{
    char buf[64], *end;
    if (read_line(root, rel, buf, sizeof(buf)))
        return dflt;
    long v = strtol(buf, &end, 0);
    return end == buf ? dflt : v;
}

/* Parses a kernel CPU list ("0-3,8") into set[MAX_CPUS]; returns the count, -1 if malformed. */
static int cpulist_parse(const char *s, unsigned char *set)
{
    memset(set, 0, MAX_CPUS);
    int n = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0 || a >= MAX_CPUS)
            return -1;
        s = end;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            if (end == s + 1 || b < a || b >= MAX_CPUS)
                return -1;
            s = end;
        }
        for (long c = a; c <= b; c++)
            if (!set[c]) {
                set[c] = 1;
                n++;
            }
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

/* The inverse: "0-3,8". Truncated lists end in "..." rather than overflow. */
static void cpulist_format(const unsigned char *set, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int c = 0; c < MAX_CPUS; c++) {
        if (!set[c])
            continue;
        int e = c;
        while (e + 1 < MAX_CPUS && set[e + 1])
            e++;
        char part[32];
        int n = e > c ? snprintf(part, sizeof(part), "%s%d-%d", used ? "," : "", c, e)
                      : snprintf(part, sizeof(part), "%s%d", used ? "," : "", c);
        if (used + (size_t)n + 4 >= len) {
            snprintf(out + used, len - used, "...");
            return;
        }
        memcpy(out + used, part, (size_t)n + 1);
        used += (size_t)n;
        c = e;
    }
}

static void detect_cpus(loom_topo_host_t *h, const char *root)
{
    char buf[4096];
    unsigned char *online = malloc(MAX_CPUS);
    int32_t *pkg = malloc(MAX_CPUS * sizeof(int32_t)), *core = malloc(MAX_CPUS * sizeof(int32_t));
    if (!online || !pkg || !core)
        goto out;
    if (read_line(root, "/sys/devices/system/cpu/online", buf, sizeof(buf)) ||
        (h->cpus = cpulist_parse(buf, online)) <= 0) {
        long n = root && *root ? -1 : sysconf(_SC_NPROCESSORS_ONLN);
        h->cpus = n > 0 ? (int32_t)n : -1;
        goto out;
    }
    int n = 0;
    for (int c = 0; c < MAX_CPUS; c++) {
        if (!online[c])
            continue;
        char rel[128];
        pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        long p = read_long(root, rel, 0);
        pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
        long k = read_long(root, rel, c);
        pkg[n] = (int32_t)p, core[n] = (int32_t)k;
        n++;
    }
    /* distinct packages, and distinct (package, core) pairs */
    h->packages = h->cores = 0;
    for (int i = 0; i < n; i++) {
        int new_pkg = 1, new_core = 1;
        for (int j = 0; j < i; j++) {
            if (pkg[j] == pkg[i]) {
                new_pkg = 0;
                if (core[j] == core[i])
                    new_core = 0;
            }
        }
        h->packages += new_pkg;
        h->cores += new_core;
    }
out:
    free(online);
    free(pkg);
    free(core);
}

/* The size of cache index idx of cpu in KiB ("49152K", "2M"), or -1 if sysfs does not say. */
static long cache_kb(const char *root, int cpu, int idx)
{
    char rel[160], buf[64], *end;
    pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index%d/size", cpu, idx);
    if (read_line(root, rel, buf, sizeof(buf)))
        return -1;
    long size = strtol(buf, &end, 10);
    if (end == buf || size <= 0 || size > (1L << 30))
        return -1;
    size = *end == 'M' ? size << 10 : *end == 'G' ? size << 20 : size;
    return size > (1L << 30) ? -1 : size; /* beyond any cache, and what a file may hold */
}

/* The cache level of cpu's index idx, or -1 past the last one (index0, 1, ... without gaps). */
static long cache_level(const char *root, int cpu, int idx)
{
    char rel[160];
    pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu, idx);
    return read_long(root, rel, -1);
}

/* The L1 data and L2 caches of one core, those of cpu: level 1 of type Data or Unified (never
 * Instruction), and level 2 of any type but Instruction. */
static void detect_core_caches(loom_topo_host_t *h, const char *root, int cpu)
{
    for (int i = 0; i < 16; i++) {
        char rel[160], type[32];
        long level = cache_level(root, cpu, i), kb;
        if (level < 0)
            break;
        pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index%d/type", cpu, i);
        if ((level != 1 && level != 2) || read_line(root, rel, type, sizeof(type)) ||
            !strcmp(type, "Instruction") || (kb = cache_kb(root, cpu, i)) < 0)
            continue;
        if (level == 1)
            h->l1d_kb = (int32_t)kb;
        else
            h->l2_kb = (int32_t)kb;
    }
}

/* The caches of the first online CPU's core (detect_core_caches) and the L3 of its package: the
 * sum of the distinct L3 caches the package's CPUs use (cpuN/cache/indexM with level 3), told
 * apart by the first CPU of their shared_cpu_list, since chiplet CPUs have several per package.
 * What sysfs does not show stays -1. */
static void detect_caches(loom_topo_host_t *h, const char *root)
{
    char buf[4096], rel[160];
    unsigned char *online = malloc(MAX_CPUS);
    long first_seen[64], pkg0 = -1, kb = 0;
    int nseen = 0;
    if (!online || read_line(root, "/sys/devices/system/cpu/online", buf, sizeof(buf)) ||
        cpulist_parse(buf, online) <= 0)
        goto out;
    for (int c = 0; c < MAX_CPUS && nseen < 64; c++) {
        if (!online[c])
            continue;
        pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        long p = read_long(root, rel, 0);
        if (pkg0 < 0) {
            pkg0 = p;
            detect_core_caches(h, root, c);
        }
        if (p != pkg0)
            continue;
        /* a few levels per CPU */
        for (int i = 0; i < 16; i++) {
            long level = cache_level(root, c, i);
            if (level < 0)
                break;
            if (level != 3)
                continue;
            pathf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list",
                  c, i);
            long first = read_line(root, rel, buf, sizeof(buf)) ? c : strtol(buf, NULL, 10);
            int seen = 0;
            for (int k = 0; k < nseen; k++)
                seen |= first_seen[k] == first;
            long size = seen ? -1 : cache_kb(root, c, i);
            if (size < 0)
                continue;
            kb += size;
            first_seen[nseen++] = first;
        }
    }
    if (kb > 0)
        h->l3_kb = kb > INT32_MAX ? INT32_MAX : (int32_t)kb;
out:
    free(online);
}

static int numa_of_cpu(const loom_topo_host_t *h, int cpu, unsigned char *set)
{
    for (int i = 0; i < h->nnuma; i++)
        if (cpulist_parse(h->numa[i].cpulist, set) > 0 && set[cpu])
            return h->numa[i].id;
    return -1;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

static void detect_numa(loom_topo_host_t *h, const char *root)
{
    char dir[1024];
    pathf(dir, sizeof(dir), "%s/sys/devices/system/node", root);
    DIR *d = opendir(dir);
    if (!d)
        return;
    int ids[LOOM_TOPO_MAX_NUMA], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < LOOM_TOPO_MAX_NUMA) {
        char *end;
        if (strncmp(e->d_name, "node", 4) || !e->d_name[4])
            continue;
        long id = strtol(e->d_name + 4, &end, 10);
        if (*end || id < 0 || id > 1 << 20)
            continue;
        ids[n++] = (int)id;
    }
    closedir(d);
    qsort(ids, (size_t)n, sizeof(int), cmp_int);
    unsigned char *set = malloc(MAX_CPUS);
    for (int i = 0; i < n && set; i++) {
        loom_topo_numa_t *m = &h->numa[h->nnuma];
        char rel[128], buf[256];
        m->id = ids[i];
        pathf(rel, sizeof(rel), "/sys/devices/system/node/node%d/cpulist", ids[i]);
        if (read_line(root, rel, m->cpulist, sizeof(m->cpulist)))
            m->cpulist[0] = '\0';
        m->cpus = m->cpulist[0] ? cpulist_parse(m->cpulist, set) : 0;
        if (m->cpus < 0)
            m->cpus = 0;
        m->mem_mb = -1;
        pathf(rel, sizeof(rel), "/sys/devices/system/node/node%d/meminfo", ids[i]);
        char path[1024];
        pathf(path, sizeof(path), "%s%s", root, rel);
        FILE *f = fopen(path, "r");
        while (f && fgets(buf, sizeof(buf), f)) {
            char *p = strstr(buf, "MemTotal:");
            if (p) {
                m->mem_mb = strtoll(p + 9, NULL, 10) / 1024;
                break;
            }
        }
        if (f)
            fclose(f);
        h->nnuma++;
    }
    free(set);
}

/* Entries of root/rel in name order, at most max of them, each at most LOOM_TOPO_NAME - 1 long. */
static int list_dir(const char *root, const char *rel, char (*names)[LOOM_TOPO_NAME], int max)
{
    char dir[1024];
    pathf(dir, sizeof(dir), "%s%s", root, rel);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= LOOM_TOPO_NAME)
            continue;
        pathf(names[n++], LOOM_TOPO_NAME, "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, LOOM_TOPO_NAME, (int (*)(const void *, const void *))strcmp);
    return n;
}

int32_t loom_topo_nic_speed_mbps(const char *ifname, const char *sysroot)
{
    char rel[160];
    if (ifname == NULL || ifname[0] == '\0' || strchr(ifname, '/') || strstr(ifname, ".."))
        return -1;
    pathf(rel, sizeof(rel), "/sys/class/net/%s/speed", ifname);
    long speed = read_long(sysroot ? sysroot : "", rel, -1);
    return speed > 0 && speed < (1L << 30) ? (int32_t)speed : -1;
}

static void detect_nics(loom_topo_host_t *h, const char *root)
{
    char names[64][LOOM_TOPO_NAME];
    int n = list_dir(root, "/sys/class/net", names, 64);
    for (int i = 0; i < n && h->nnics < LOOM_TOPO_MAX_NICS; i++) {
        if (!strcmp(names[i], "lo"))
            continue;
        loom_topo_nic_t *nic = &h->nics[h->nnics++];
        char rel[256], state[32];
        pathf(nic->name, sizeof(nic->name), "%s", names[i]);
        pathf(rel, sizeof(rel), "/sys/class/net/%s/operstate", names[i]);
        if (read_line(root, rel, state, sizeof(state)))
            state[0] = '\0';
        pathf(rel, sizeof(rel), "/sys/class/net/%s/carrier", names[i]);
        /* veth and tun report "unknown" while they carry traffic */
        nic->up =
            !strcmp(state, "up") || (!strcmp(state, "unknown") && read_long(root, rel, 0) == 1);
        nic->speed_mbps = loom_topo_nic_speed_mbps(names[i], root);
        pathf(rel, sizeof(rel), "/sys/class/net/%s/device/numa_node", names[i]);
        nic->numa = (int32_t)read_long(root, rel, -1);
    }
}

static void detect_rdma(loom_topo_host_t *h, const char *root)
{
    char devs[32][LOOM_TOPO_NAME];
    int n = list_dir(root, "/sys/class/infiniband", devs, 32);
    for (int i = 0; i < n; i++) {
        char rel[256], ports[16][LOOM_TOPO_NAME];
        pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/ports", devs[i]);
        int np = list_dir(root, rel, ports, 16);
        for (int p = 0; p < np && h->nrdma < LOOM_TOPO_MAX_RDMA; p++) {
            loom_topo_rdma_t *r = &h->rdma[h->nrdma++];
            char buf[128];
            pathf(r->name, sizeof(r->name), "%s", devs[i]);
            r->port = atoi(ports[p]);
            pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/ports/%s/link_layer", devs[i],
                  ports[p]);
            if (read_line(root, rel, r->link_layer, sizeof(r->link_layer)))
                pathf(r->link_layer, sizeof(r->link_layer), "unknown");
            pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/ports/%s/state", devs[i], ports[p]);
            r->active = !read_line(root, rel, buf, sizeof(buf)) && strstr(buf, "ACTIVE");
            pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/ports/%s/rate", devs[i], ports[p]);
            r->rate_gbps = read_line(root, rel, buf, sizeof(buf)) ? -1 : strtod(buf, NULL);
            pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/device/numa_node", devs[i]);
            r->numa = (int32_t)read_long(root, rel, -1);
        }
    }
}

/* The NUMA nodes of RDMA devices and GPUs found by libibverbs and NVML, which do not report
 * them; the sysfs readers above fill their own. Names with a '/' are not looked up. */
#if LOOM_HAVE_IBVERBS
static void place_rdma(loom_topo_host_t *h, const char *root)
{
    char rel[256];
    for (int i = 0; i < h->nrdma; i++) {
        loom_topo_rdma_t *r = &h->rdma[i];
        pathf(rel, sizeof(rel), "/sys/class/infiniband/%s/device/numa_node", r->name);
        r->numa = strchr(r->name, '/') ? -1 : (int32_t)read_long(root, rel, -1);
    }
}
#endif

static void place_gpus(loom_topo_host_t *h, const char *root)
{
    char rel[256];
    for (int i = 0; i < h->ngpus; i++) {
        loom_topo_gpu_t *g = &h->gpus[i];
        pathf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/numa_node", g->pci);
        g->numa = !g->pci[0] || strchr(g->pci, '/') ? -1 : (int32_t)read_long(root, rel, -1);
    }
}

/* NVIDIA display and 3D controllers on the PCI bus: the GPUs where NVML is absent. NVLinks are
 * not visible here: nvlinks stays 0 unless a topology file says otherwise. */
static void detect_gpus(loom_topo_host_t *h, const char *root)
{
    static char devs[512][LOOM_TOPO_NAME];
    int n = list_dir(root, "/sys/bus/pci/devices", devs, 512);
    for (int i = 0; i < n && h->ngpus < LOOM_TOPO_MAX_GPUS; i++) {
        char rel[256];
        pathf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/vendor", devs[i]);
        if (read_long(root, rel, 0) != 0x10de)
            continue;
        pathf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/class", devs[i]);
        long cls = read_long(root, rel, 0) >> 8;
        if (cls != 0x0300 && cls != 0x0302)
            continue;
        loom_topo_gpu_t *g = &h->gpus[h->ngpus++];
        pathf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/device", devs[i]);
        pathf(g->name, sizeof(g->name), "NVIDIA device 0x%04lx", read_long(root, rel, 0));
        pathf(g->pci, sizeof(g->pci), "%s", devs[i]);
        pathf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/numa_node", devs[i]);
        g->numa = (int32_t)read_long(root, rel, -1);
    }
}

// ---- Choosing the sources ----

/* Each returns 0 when its library described its part of this machine, or -1 for the sysfs
 * reader to do it. */
static int cpus_from_hwloc(loom_topo_host_t *h)
{
#if LOOM_HAVE_HWLOC
    return loom_topo_hwloc_detect(h, NULL);
#else
    (void)h;
    return -1;
#endif
}

/* No port at all is also handed to sysfs: libibverbs lists only devices with a user-space
 * provider installed, and sysfs shows the others. */
static int rdma_from_ibverbs(loom_topo_host_t *h)
{
#if LOOM_HAVE_IBVERBS
    if (loom_topo_ibv_detect(h) == 0 && h->nrdma > 0) {
        place_rdma(h, "");
        return 0;
    }
    h->nrdma = 0;
#else
    (void)h;
#endif
    return -1;
}

static int gpus_from_nvml(loom_topo_host_t *h)
{
    if (loom_topo_nvml_detect(h, loom_param_NVML_LIB()))
        return -1;
    place_gpus(h, "");
    return 0;
}

void loom_topo_detect_host(loom_topo_host_t *h, const char *sysroot)
{
    const char *root = sysroot ? sysroot : "";
    /* the libraries describe the machine this process runs on; a sysroot is another one, which
     * only the sysfs readers can see */
    int here = !*root;
    memset(h, 0, sizeof(*h));
    h->l1d_kb = h->l2_kb = h->l3_kb = -1;
    if (!here) {
        if (read_line(root, "/proc/sys/kernel/hostname", h->hostname, sizeof(h->hostname)))
            pathf(h->hostname, sizeof(h->hostname), "unknown");
    } else if (gethostname(h->hostname, sizeof(h->hostname) - 1)) {
        pathf(h->hostname, sizeof(h->hostname), "unknown");
    }
    detect_nics(h, root);
    int rdma_lib = here && !rdma_from_ibverbs(h);
    if (!rdma_lib)
        detect_rdma(h, root);
    int gpu_lib = here && !gpus_from_nvml(h);
    if (!gpu_lib)
        detect_gpus(h, root);
    /* last, because hwloc also places the devices found above that sysfs left unplaced */
    int cpu_lib = here && !cpus_from_hwloc(h);
    if (!cpu_lib) {
        detect_cpus(h, root);
        detect_numa(h, root);
        detect_caches(h, root);
    }
    if (h->packages <= 0)
        h->packages = 1;
    if (h->cores <= 0)
        h->cores = h->cpus;
    LOOM_INFO(LOOM_LOG_TOPO, "topology: CPUs and NUMA from %s, RDMA from %s, GPUs from %s",
              cpu_lib ? "hwloc" : "sysfs", rdma_lib ? "libibverbs" : "sysfs",
              gpu_lib ? "NVML" : "sysfs");
}

void loom_topo_detect_caches(loom_topo_host_t *h, const char *sysroot)
{
    h->l1d_kb = h->l2_kb = h->l3_kb = -1;
    detect_caches(h, sysroot ? sysroot : "");
}

void loom_topo_detect_rdma(loom_topo_host_t *h, const char *sysroot)
{
    const char *root = sysroot ? sysroot : "";
    memset(h, 0, sizeof(*h));
    if (*root || rdma_from_ibverbs(h))
        detect_rdma(h, root);
}

double loom_topo_best_rdma_gbps(const loom_topo_host_t *h)
{
    double best = 0;
    for (int i = 0; i < h->nrdma && i < LOOM_TOPO_MAX_RDMA; i++)
        if (h->rdma[i].active && h->rdma[i].rate_gbps > best)
            best = h->rdma[i].rate_gbps;
    return best;
}

void loom_topo_detect_rank(loom_topo_rank_t *r, const char *sysroot)
{
    loom_topo_host_t *h = calloc(1, sizeof(*h));
    unsigned char *set = calloc(MAX_CPUS, 1);
    r->numa = -1;
    r->cpus[0] = '\0';
    cpu_set_t cs;
    CPU_ZERO(&cs);
    if (!h || !set || sched_getaffinity(0, sizeof(cs), &cs))
        goto out;
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && c < MAX_CPUS; c++)
        if (CPU_ISSET(c, &cs)) {
            set[c] = 1;
            if (first < 0)
                first = c;
        }
    cpulist_format(set, r->cpus, sizeof(r->cpus));
    detect_numa(h, sysroot ? sysroot : "");
    if (first >= 0)
        r->numa = numa_of_cpu(h, first, set);
out:
    free(h);
    free(set);
}

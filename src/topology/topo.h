/* SPDX-License-Identifier: Apache-2.0
 *
 * topo.h - what loom knows about the machines it runs on: per host, the CPU packages, NUMA nodes
 * and cores with their caches, the network interfaces with their state and speed, the RDMA ports
 * and the GPUs; per rank, its host, its local index, its CPU binding and its NUMA node. Detected
 * (topo_detect.c, which chooses among hwloc, libibverbs, NVML and sysfs, and is the only file that
 * reads /sys) or loaded from a file (topo_file.c, the format of docs/topology.md), and written to
 * one with LOOM_TOPO_DUMP_FILE.
 *
 * Records are plain fixed-size structs so that ranks can exchange them through the bootstrap.
 */
#ifndef LOOM_TOPOLOGY_TOPO_H
#define LOOM_TOPOLOGY_TOPO_H

#include <stdint.h>
#include <stdio.h>

#define LOOM_TOPO_MAX_NUMA 16
#define LOOM_TOPO_MAX_NICS 16
#define LOOM_TOPO_MAX_RDMA 16
#define LOOM_TOPO_MAX_GPUS 16
#define LOOM_TOPO_NAME     64
#define LOOM_TOPO_CPULIST  128 /* "0-15,32-47" */

typedef struct {
    int32_t id;
    int32_t cpus; /* logical CPUs */
    char cpulist[LOOM_TOPO_CPULIST];
    int64_t mem_mb; /* -1 unknown */
} loom_topo_numa_t;

typedef struct {
    char name[LOOM_TOPO_NAME];
    int32_t up;         /* operstate "up" (or "unknown" with a carrier, as veth and tun report) */
    int32_t speed_mbps; /* -1 unknown (virtual interfaces) */
    int32_t numa;       /* -1 unknown */
} loom_topo_nic_t;

typedef struct {
    char name[LOOM_TOPO_NAME]; /* device, e.g. mlx5_0 */
    int32_t port;
    char link_layer[16]; /* InfiniBand, Ethernet */
    int32_t active;
    double rate_gbps;
    int32_t numa;
} loom_topo_rdma_t;

typedef struct {
    char name[LOOM_TOPO_NAME];
    char pci[32]; /* bus id, e.g. 0000:18:00.0 */
    int32_t numa;
    int32_t nvlinks;    /* active NVLink links */
    double nvlink_gbps; /* Gbit/s per link and direction */
} loom_topo_gpu_t;

typedef struct {
    char hostname[LOOM_TOPO_NAME];
    int32_t packages, cores, cpus; /* sockets, physical cores, logical CPUs */
    int32_t l3_kb;                 /* L3 cache of one package in KiB (all its L3s), -1 unknown */
    /* The private caches of one core in KiB, those of the first online CPU, -1 unknown: its L1
     * data cache, and its L2 (its size even where several cores share it). */
    int32_t l1d_kb, l2_kb;
    int32_t nnuma, nnics, nrdma, ngpus;
    int32_t nvswitch; /* GPUs all-to-all through NVSwitch */
    loom_topo_numa_t numa[LOOM_TOPO_MAX_NUMA];
    loom_topo_nic_t nics[LOOM_TOPO_MAX_NICS];
    loom_topo_rdma_t rdma[LOOM_TOPO_MAX_RDMA];
    loom_topo_gpu_t gpus[LOOM_TOPO_MAX_GPUS];
} loom_topo_host_t;

typedef struct {
    int32_t host;                 /* index into hosts */
    int32_t local_rank;           /* among the ranks of its host */
    int32_t numa;                 /* NUMA node of its first allowed CPU, -1 unknown */
    char cpus[LOOM_TOPO_CPULIST]; /* allowed CPUs (sched_getaffinity) */
} loom_topo_rank_t;

typedef struct {
    int nhosts, nranks;
    loom_topo_host_t *hosts;
    loom_topo_rank_t *ranks;
} loom_topo_t;

/* ---- Detection (topo_detect.c) ---- */

/* Describes the host this process runs on. With sysroot "" or NULL, the real machine, through
 * hwloc, libibverbs and NVML where loom has them and sysfs for the rest (docs/topology.md);
 * otherwise from sysroot's /sys and /proc alone (tests pass a directory holding a made-up
 * machine). Never fails: what cannot be read is left unknown (-1 or 0). */
void loom_topo_detect_host(loom_topo_host_t *h, const char *sysroot);
/* The caches alone (l1d_kb, l2_kb, l3_kb), from sysroot's sysfs: a few file reads, where
 * loom_topo_detect_host loads every library; hwloc finds the same sizes (test_topo_sources.cc). */
void loom_topo_detect_caches(loom_topo_host_t *h, const char *sysroot);
/* This process's CPU binding and NUMA node; host and local_rank are left to the caller. */
void loom_topo_detect_rank(loom_topo_rank_t *r, const char *sysroot);
/* The RDMA ports alone, as loom_topo_detect_host finds them (libibverbs, else sysfs): cheap
 * enough for communicator creation, which needs them to choose a transport between hosts. */
void loom_topo_detect_rdma(loom_topo_host_t *h, const char *sysroot);
/* The rate of h's fastest active RDMA port in Gbit/s, or 0 when it has none. */
double loom_topo_best_rdma_gbps(const loom_topo_host_t *h);
/* The speed of network interface ifname in Mbit/s as sysroot's sysfs reports it, or -1 when
 * unknown (virtual interfaces without a speed, loopback, a name that is not an interface). */
int32_t loom_topo_nic_speed_mbps(const char *ifname, const char *sysroot);

/* ---- Files (topo_file.c) ---- */

/* Writes t as JSON (docs/topology.md). Returns 0, or -1 if writing failed. */
int loom_topo_write(const loom_topo_t *t, FILE *f);
/* Reads and checks a file; on error returns -1 with "path: where: what" in err. */
int loom_topo_read(const char *path, loom_topo_t *t, char *err, size_t errlen);
/* Same, from memory (fuzzing, tests). */
int loom_topo_parse(const char *text, size_t len, loom_topo_t *t, char *err, size_t errlen);
void loom_topo_free(loom_topo_t *t);
/* A human-readable summary (loom_info). */
void loom_topo_print(const loom_topo_t *t, FILE *f);
/* Makes a record received from another process safe to use: counts clamped to the arrays,
 * every string terminated, cache sizes a file cannot hold made unknown (-1). */
void loom_topo_sanitize_host(loom_topo_host_t *h);
void loom_topo_sanitize_rank(loom_topo_rank_t *r);
/* Allocates hosts and ranks (zeroed); -1 on allocation failure. */
int loom_topo_alloc(loom_topo_t *t, int nhosts, int nranks);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_info.c - what this loom build is and how it is configured: version,
 * transports built in, the algorithms per collective, (-p) every LOOM_*
 * parameter with its current value and documentation, and (-d) the cost
 * model's constants per link class with where each came from (measured on
 * this machine by a communicator of two processes, as loom measures at
 * creation; the topology; the built-in defaults; LOOM_COST_<CLASS>) and its
 * decision table: the algorithm chosen per collective and size for a link
 * class and rank count (AllToAllv, chosen by the layout alone, in a line
 * below it). Like ucx_info. The device section of -v is loom_info_device.c's.
 * Reads internals (the parameter, transport and algorithm tables); changes nothing.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"
#include "cost_model.h"
#include "kernels.h"
#include "loom.h"
#include "loom_info.h"
#include "param.h"
#include "shm/shm_coll.h"
#include "topo.h"
#include "transport.h"

static void usage(void)
{
    printf("usage: loom_info [-v] [-p] [-a] [-t] [-d [-c shm|tcp] [-n NRANKS] [-H HOSTS]] [-h]\n"
           "  -v  version and build (default): transports, kernels, the device runtime\n"
           "      (LOOM_DEVICE), the CUDA runtime and its GPUs, the emulation, and the device\n"
           "      transports with what each needs and why one cannot run here\n"
           "  -p  every LOOM_* parameter: value, default, documentation\n"
           "  -a  algorithms per collective (in tie-break order)\n"
           "  -t  topology: LOOM_TOPO_FILE's if set, else this host as detected (packages,\n"
           "      NUMA nodes, NICs with state and speed, RDMA ports, GPUs) and this process\n"
           "  -d  the cost model's constants per link class and where each came from (shm and\n"
           "      tcp measured by two processes over LOOM_NET=shm and tcp, unless\n"
           "      LOOM_CALIBRATE=0), then its decision table: the algorithm it picks per\n"
           "      collective and size\n"
           "      (8 B to 1 GiB, float32), for link classes shm, ucx and tcp and 2, 4, 8\n"
           "      ranks; -c and -n restrict it to one class and one rank count. LOOM_COST_SHM,\n"
           "      LOOM_COST_UCX, LOOM_COST_TCP and LOOM_CHUNK_BYTES apply as in a communicator.\n"
           "      -H spreads the ranks over HOSTS hosts (NRANKS / HOSTS each, tcp or the -c\n"
           "      class between them, shm inside), where the hierarchical algorithms compete.\n"
           "      AllToAllv, whose counts differ per rank, gets one line: its algorithm for\n"
           "      every size\n");
}

static void print_version(void)
{
    int v = 0;
    loomGetVersion(&v);
    printf("# loom version %d.%d.%d (code %d)\n", v / 10000, (v / 100) % 100, v % 100, v);
    int n = 0;
    const loom_tp_t *const *reg = loom_tp_registry(&n);
    printf("# transports:");
    for (int i = 0; i < n; i++)
        printf(" %s", reg[i]->name);
    printf("\n# reduction kernels: %s\n", loom_kernels_isa_name(loom_kernels_isa()));
    loom_info_print_device();
}

static void print_params(void)
{
    int n = 0;
    const loom_param_info_t *t = loom_param_table(&n);
    for (int i = 0; i < n; i++) {
        char var[96];
        snprintf(var, sizeof(var), "LOOM_%s", t[i].name);
        const char *val = getenv(var);
        printf("%-22s = %-12s (default %s, %s, %s)\n    %s\n", var, val ? val : t[i].def,
               t[i].def[0] ? t[i].def : "empty", t[i].type, t[i].subsys, t[i].doc);
    }
}

/* The choosing collectives, in table column order. */
static const loom_coll_kind_t decision_kinds[] = {LOOM_COLL_ALLREDUCE,      LOOM_COLL_ALLGATHER,
                                                  LOOM_COLL_REDUCE_SCATTER, LOOM_COLL_BCAST,
                                                  LOOM_COLL_REDUCE,         LOOM_COLL_ALLTOALL};
#define NKINDS (sizeof(decision_kinds) / sizeof(decision_kinds[0]))

static void size_text(double b, char *buf, size_t len)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (b >= 1024 && u < 3) {
        b /= 1024;
        u++;
    }
    snprintf(buf, len, "%.0f %s", b, unit[u]);
}

/* The constants a communicator of this machine would use per class: shm
 * and tcp as two processes measure them over LOOM_NET=shm or tcp when they
 * create a communicator (the built-in defaults with LOOM_CALIBRATE=0, or
 * where that fails), ucx's from the defaults (UCX runs between hosts). */
static loom_link_cost_t g_cost[LOOM_LINK_NUM];
/* The arena probe of the shm class's communicator (shm_probe.c; zeros where none ran). */
static loom_shm_machine_t g_arena;

/* The hidden first argument that makes loom_info the second rank of measure_class's
 * communicator; the unique id follows it in hex. */
#define PEER_ARG "--calibration-peer"

/* Pins this process to the k-th CPU it may run on (as loomrun pins rank k), so that the two
 * ranks of a measurement run on two CPUs, as a benchmark's do; *saved (may be NULL) gets the
 * affinity before. No-op with fewer than k + 1 CPUs. */
static void pin_to_usable_cpu(int k, cpu_set_t *saved)
{
    cpu_set_t now;
    CPU_ZERO(&now);
    if (sched_getaffinity(0, sizeof(now), &now) != 0)
        return;
    if (saved)
        *saved = now;
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &now) || seen++ != k)
            continue;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        (void)sched_setaffinity(0, sizeof(one), &one);
        return;
    }
}

/* Rank 1 of measure_class's communicator: a fresh process image, so that nothing the parent's
 * threads held at fork (the allocator's locks, with the bootstrap root's thread running) is
 * held here. Returns the exit status. */
static int calibration_peer(const char *hex)
{
    loomUniqueId id;
    if (strlen(hex) != 2 * sizeof(id.internal))
        return 2;
    for (size_t i = 0; i < sizeof(id.internal); i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 2;
        id.internal[i] = (char)v;
    }
    pin_to_usable_cpu(1, NULL);
    loomComm_t comm = NULL;
    if (loomCommInitRank(&comm, 2, id, 1) != loomSuccess)
        return 1;
    loomCommDestroy(comm);
    return 0;
}

/* A communicator of two processes (this one and a child that runs this program again as
 * calibration_peer) over net: its constants into *l_p; -1 where it could not be created. */
static int measure_class(const char *net, loom_link_cost_t *l_p)
{
    if (setenv("LOOM_NET", net, 1) != 0)
        return -1;
    loom_param_reset_cache();
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess)
        return -1;
    char hex[2 * sizeof(id.internal) + 1];
    for (size_t i = 0; i < sizeof(id.internal); i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    char *const argv[] = {"loom_info", PEER_ARG, hex, NULL};
    fflush(NULL);
    /* Between fork and exec only async-signal-safe calls: the root's thread runs. */
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    cpu_set_t saved;
    CPU_ZERO(&saved);
    pin_to_usable_cpu(0, &saved);
    loomComm_t comm = NULL;
    loomResult_t res = loomCommInitRank(&comm, 2, id, 0);
    if (CPU_COUNT(&saved) > 0)
        (void)sched_setaffinity(0, sizeof(saved), &saved);
    if (res == loomSuccess) {
        *l_p = comm->coll.link;
        if (strcmp(net, "shm") == 0)
            g_arena = comm->coll.shm;
        loomCommDestroy(comm);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        ;
    return res == loomSuccess && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static void cost_constants(void)
{
    static const char *const nets[LOOM_LINK_NUM] = {"shm", NULL, "tcp"};
    const char *net = getenv("LOOM_NET");
    char *saved = net ? strdup(net) : NULL;
    for (int c = 0; c < LOOM_LINK_NUM; c++) {
        g_cost[c] = loom_link_cost_default((loom_link_class_t)c);
        if (nets[c] != NULL && loom_param_CALIBRATE() != 0 &&
            measure_class(nets[c], &g_cost[c]) != 0)
            fprintf(stderr,
                    "loom_info: a communicator over LOOM_NET=%s failed; the %s class "
                    "shows its defaults\n",
                    nets[c], nets[c]);
    }
    if (saved) {
        setenv("LOOM_NET", saved, 1);
        free(saved);
    } else {
        unsetenv("LOOM_NET");
    }
    loom_param_reset_cache();
    for (int c = 0; c < LOOM_LINK_NUM; c++) {
        char text[256];
        loom_link_cost_describe(&g_cost[c], text, sizeof(text));
        printf("# cost constants %s: %s\n", loom_link_class_name((loom_link_class_t)c), text);
    }
    printf(
        "# (measured: by two processes of this machine, as each communicator measures at "
        "creation; topology: the link's rate; builtin: the default; env: LOOM_COST_<CLASS>)\n\n");
}

/* The machine a communicator of this host would plan its shm calls with; single copy is
 * assumed to work for every rank (the arena checks it at creation). */
static void shm_machine_here(loom_shm_machine_t *m)
{
    loom_topo_host_t here;
    loom_topo_detect_caches(&here, NULL);
    loom_shm_set_detected_caches(here.l1d_kb, here.l2_kb, here.l3_kb);
    const char *path = loom_param_TOPO_FILE();
    if (path && *path) { /* its first host's caches, as a communicator's rank 0 would take */
        loom_topo_t t = {0};
        char err[256];
        if (loom_topo_read(path, &t, err, sizeof(err)) == 0 && t.nhosts > 0)
            loom_shm_set_file_caches(t.hosts[0].l1d_kb, t.hosts[0].l2_kb, t.hosts[0].l3_kb);
        loom_topo_free(&t);
    }
    const long cma = loom_param_SHM_COLL_CMA();
    const int single_copy = cma < 0 ? 0 : cma > 2 ? 2 : (int)cma;
    loom_shm_machine_fill(m, (size_t)loom_param_SHM_COLL_BYTES() / 2, single_copy,
                          single_copy == 1 && loom_arena_kernel_copy_fast());
    if (single_copy > 0)
        m->kernel_ns = loom_arena_kernel_copy_ns();
    m->flag_ns = g_arena.flag_ns;
    m->local_ns = g_arena.local_ns;
    m->cross_ns = g_arena.cross_ns;
    m->cross1_ns = g_arena.cross1_ns;
    m->copy_backward = g_arena.copy_backward;
    m->copy_forward_ns = g_arena.copy_forward_ns;
    m->copy_backward_ns = g_arena.copy_backward_ns;
    /* The probed calls price the tables of as many ranks, where their sizes are this
     * machine's (a LOOM_TOPO_FILE's caches or another slot size would change them). */
    if (m->l2 == g_arena.l2 && m->half == g_arena.half) {
        memcpy(m->call_ns, g_arena.call_ns, sizeof(m->call_ns));
        m->probe_ranks = g_arena.probe_ranks;
    }
}

/* A shm cell of the decision table: the variant the plan chooses and its predicted time. */
static void shm_cell(loom_coll_kind_t kind, const loom_cost_call_t *call,
                     const loom_shm_machine_t *m, const loom_shm_overrides_t *o,
                     const loom_link_cost_t *link, char *cell, size_t len)
{
    loom_shm_plan_t p;
    loom_shm_plan(kind, (size_t)call->nbytes, call->nranks, m, o, &p);
    const double ns = loom_shm_predict(kind, p.variant, call, m, link);
    snprintf(cell, len, ns < 1e5 ? "%s %.1fus" : "%s %.0fus", loom_shm_algo_name(p.variant),
             ns / 1e3);
}

static void print_decisions(loom_link_class_t cls, int nranks, int nhosts)
{
    loom_link_cost_t link = g_cost[cls];
    const int ppn = nhosts > 1 && nranks % nhosts == 0 ? nranks / nhosts : 0;
    size_t chunk = (size_t)loom_param_CHUNK_BYTES();
    if (chunk < 4096)
        chunk = 4096;
    printf("# link class %s: alpha %.1f us, o %.1f us, beta %.3f ns/B, one way %.3f ns/B, "
           "gamma %.3f ns/B; %d ranks on %d host(s) (ranks consecutive on each); chunk %zu "
           "bytes; %s; cells: algorithm (shm: the plan's variant) and predicted time\n",
           loom_link_class_name(cls), link.alpha_ns / 1e3, link.o_ns / 1e3, link.beta_ns,
           link.beta_one_ns, link.gamma_ns, nranks, nhosts, chunk,
           loom_param_DETERMINISTIC() ? "reductions in rank order (LOOM_DETERMINISTIC=1)"
                                      : "every reduction order (LOOM_DETERMINISTIC=0)");
    loom_shm_machine_t m;
    loom_shm_overrides_t o;
    shm_machine_here(&m);
    loom_shm_overrides(&o);
    if (cls == LOOM_LINK_SHM) {
        char text[1280];
        loom_shm_machine_text(&m, text, sizeof(text));
        printf("# shm plan: %s; streaming from %zu KiB written\n", text,
               loom_shm_nt_threshold(&m, nranks) >> 10);
    }
    printf("# %10s", "bytes");
    for (size_t k = 0; k < NKINDS; k++)
        printf(" %-24s", loom_coll_name(decision_kinds[k]));
    printf("\n");
    int n = 0;
    const loom_algo_t *table = loom_algo_table(&n);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    loom_cost_call_t call = {.nranks = nranks,
                             .acc_ratio = 1.0,
                             .chunk_bytes = chunk,
                             .ring_depth = loom_ring_depth(cls, nranks),
                             .nhosts = nhosts,
                             .ppn = ppn,
                             .contiguous = 1,
                             .rank_order = loom_param_DETERMINISTIC() != 0,
                             .intra = g_cost[LOOM_LINK_SHM],
                             .cache_bytes = (double)m.l2};
    for (double bytes = 8;; bytes = bytes * 4 > gib && bytes < gib ? gib : bytes * 4) {
        char sz[32];
        size_text(bytes, sz, sizeof(sz));
        printf("  %10s", sz);
        call.nbytes = bytes;
        for (size_t k = 0; k < NKINDS; k++) {
            double us = 0;
            const loom_algo_t *a = loom_algo_pick(table, n, decision_kinds[k], &call, &link, &us);
            char cell[48];
            if (a != NULL && strcmp(a->name, "shm") == 0) /* it picks by size itself */
                shm_cell(decision_kinds[k], &call, &m, &o, &link, cell, sizeof(cell));
            else
                snprintf(cell, sizeof(cell), "%s %.0fus", a ? a->name : "-", us / 1e3);
            printf(" %-24s", cell);
        }
        printf("\n");
        if (bytes >= gib)
            break;
    }
    /* Its counts differ per rank, so no size column: the layout alone chooses. */
    call.nbytes = 0;
    const loom_algo_t *a = loom_algo_pick(table, n, LOOM_COLL_ALLTOALLV, &call, &link, NULL);
    printf("# %s: %s at every size (counts differ per rank: the layout's messages choose)\n",
           loom_coll_name(LOOM_COLL_ALLTOALLV), a ? a->name : "-");
}

/* Each name, marked where the algorithm adds in an order of its own: "*" from
 * 3 ranks, "**" from 2 (docs/ALGORITHMS.md, Determinism). */
static void print_algos(void)
{
    for (int k = 0; k < LOOM_COLL_NUM; k++) {
        printf("%-14s", loom_coll_name((loom_coll_kind_t)k));
        int n = 0;
        const loom_algo_t *a = loom_algo_table(&n);
        for (int i = 0; i < n; i++)
            if (a[i].kind == (loom_coll_kind_t)k)
                printf(" %s%s", a[i].name,
                       a[i].order == LOOM_ORDER_PAIR  ? "*"
                       : a[i].order == LOOM_ORDER_OWN ? "**"
                                                      : "");
        printf("\n");
    }
    printf("# *: adds in an order of its own from 3 ranks, **: from 2; LOOM_DETERMINISTIC=1 (the "
           "default) runs neither there\n");
}

/* LOOM_TOPO_FILE's description, or this host and this process as detected. */
static int print_topology(void)
{
    loom_topo_t t = {0};
    const char *path = loom_param_TOPO_FILE();
    if (path && *path) {
        char err[512];
        if (loom_topo_read(path, &t, err, sizeof(err))) {
            fprintf(stderr, "loom_info: LOOM_TOPO_FILE %s\n", err);
            return 2;
        }
        printf("topology from LOOM_TOPO_FILE %s: ", path);
    } else {
        if (loom_topo_alloc(&t, 1, 1)) {
            fprintf(stderr, "loom_info: out of memory\n");
            return 2;
        }
        loom_topo_detect_host(&t.hosts[0], NULL);
        loom_topo_detect_rank(&t.ranks[0], NULL);
        printf("topology detected (this process as rank 0): ");
    }
    loom_topo_print(&t, stdout);
    loom_topo_free(&t);
    return 0;
}

/* A count of 1 to 2^20 from an option's argument, or -1 (reported). */
static int parse_count(const char *arg, const char *opt, const char *what)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end != '\0' || v < 1 || v > 1 << 20) {
        fprintf(stderr, "loom_info: %s wants a %s count >= 1, not '%s'\n", opt, what, arg);
        return -1;
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    int opt, any = 0, decisions = 0, nranks = 0, have_cls = 0, nhosts = 1;
    loom_link_class_t cls = LOOM_LINK_SHM;
    if (argc == 3 && strcmp(argv[1], PEER_ARG) == 0)
        return calibration_peer(argv[2]);
    while ((opt = getopt(argc, argv, "vpatdc:n:H:h")) != -1) {
        any = 1;
        switch (opt) {
        case 'd':
            decisions = 1;
            break;
        case 'c':
            if (loom_link_class_parse(optarg, &cls) != 0) {
                fprintf(stderr, "loom_info: unknown link class '%s'\nHINT: use shm or tcp\n",
                        optarg);
                return 2;
            }
            have_cls = 1;
            break;
        case 'n':
            if ((nranks = parse_count(optarg, "-n", "rank")) < 0)
                return 2;
            break;
        case 'H':
            if ((nhosts = parse_count(optarg, "-H", "host")) < 0)
                return 2;
            break;
        case 'v':
            print_version();
            break;
        case 'p':
            print_params();
            break;
        case 'a':
            print_algos();
            break;
        case 't':
            if (print_topology())
                return 2;
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }
    if (decisions)
        cost_constants();
    if (decisions && nhosts > 1) {
        /* Several hosts: the communicator's class is tcp (or -c's), shm inside each host. */
        int n = nranks > 0 ? nranks : 2 * nhosts;
        if (n % nhosts != 0) {
            fprintf(stderr, "loom_info: -H %d does not divide %d ranks\n", nhosts, n);
            return 2;
        }
        print_decisions(have_cls ? cls : LOOM_LINK_TCP, n, nhosts);
    } else if (decisions) {
        const int counts[] = {2, 4, 8};
        for (int c = 0; c < LOOM_LINK_NUM; c++) {
            if (have_cls && (loom_link_class_t)c != cls)
                continue;
            for (int i = 0; i < 3; i++) {
                if (nranks > 0 && i > 0)
                    break;
                print_decisions((loom_link_class_t)c, nranks > 0 ? nranks : counts[i], 1);
                printf("\n");
            }
        }
    }
    if (!any)
        print_version();
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * init.c - the start of a communicator's life: unique ids, creation
 * (bootstrap, peer identities, the point-to-point layer, then the collective
 * context with the shm arena; a failure once the layer is up breaks it, so
 * that every peer fails too), its references and the registry of live
 * communicators (registry.h), which lets every entry point reject a
 * destroyed or foreign handle with InvalidArgument instead of touching freed
 * memory. Split, destroy and abort are in lifecycle.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm.h"
#include "cpus.h"
#include "dev_comm.h"
#include "devrt.h"
#include "init.h"
#include "net_auto.h"
#include "param.h"
#include "socket.h"
#include "timer.h"

// ---- registry of live communicators ---------------------------------------------

loom_registry_t loom_comms =
    LOOM_REGISTRY_INITIALIZER("communicator", "destroyed, aborted or never created");

/* The reference is taken under the registry lock: once loomCommAbort or
 * loomCommDestroy has marked the communicator closing no new reference can
 * appear, and their teardown waits for the ones already held. A check
 * followed by a later reference would leave a window in which another thread
 * frees the communicator under the caller. */
loomResult_t loom_comm_acquire(loomComm_t comm, const char *fn)
{
    return loom_registry_acquire(&loom_comms, comm, fn);
}

// ---- identity -------------------------------------------------------------------

static void read_boot_id(char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f == NULL)
        return;
    if (fgets(buf, (int)len, f) == NULL)
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

static uint64_t hash_str(const char *s)
{
    static const uint8_t key[16] = {'l', 'o', 'o', 'm', '-', 'h', 'o', 's', 't'};
    return loom_siphash24(key, s, strlen(s));
}

void loom_identity_fill(loom_peer_info_t *me, int rank)
{
    memset(me, 0, sizeof(*me));
    me->rank = rank;
    me->pid = (int32_t)getpid();
    char host[LOOM_HOST_ID_MAX] = "";
    gethostname(host, sizeof(host) - 1);
    char boot[64], machine[LOOM_HOST_ID_MAX + 64];
    read_boot_id(boot, sizeof(boot));
    snprintf(machine, sizeof(machine), "%s/%s", host, boot);
    me->machine_hash = hash_str(machine);
    snprintf(me->hostname, sizeof(me->hostname), "%s", host);
    const char *override = loom_param_HOST_ID();
    if (override && *override) {
        snprintf(me->host_id, sizeof(me->host_id), "%s", override);
        char scoped[LOOM_HOST_ID_MAX + sizeof(machine) + 2];
        snprintf(scoped, sizeof(scoped), "%s@%s", override, machine);
        me->host_hash = hash_str(scoped);
    } else {
        snprintf(me->host_id, sizeof(me->host_id), "%s", host);
        me->host_hash = me->machine_hash;
    }
}

// ---- creation -------------------------------------------------------------------

LOOM_API loomResult_t loomGetUniqueId(loomUniqueId *uniqueId)
{
    if (uniqueId == NULL) {
        LOOM_WARN("loomGetUniqueId: uniqueId is NULL");
        return loomInvalidArgument;
    }
    loom_id_t id;
    memset(&id, 0, sizeof(id));
    id.magic = LOOM_ID_MAGIC;
    id.version = LOOM_ID_VERSION;
    LOOM_CHECK(loom_random_bytes(id.secret, sizeof(id.secret)));
    char ifname[64];
    LOOM_CHECK(loom_socket_pick_addr(&id.root, ifname, sizeof(ifname)));
    int fd = -1;
    LOOM_CHECK(loom_socket_listen(&id.root, &fd));
    LOOM_CHECK(loom_bootstrap_root_start(fd, id.secret, loom_param_TIMEOUT_MS()));
    char addr[96];
    LOOM_INFO(LOOM_LOG_BOOTSTRAP, "rendezvous service listening on %s (%s)",
              loom_sockaddr_str(&id.root, addr, sizeof(addr)), ifname);
    loom_id_encode(&id, uniqueId);
    return loomSuccess;
}

static loomResult_t check_config(const loomConfig_t *config)
{
    if (config == NULL)
        return loomSuccess;
    if (config->magic != LOOM_CONFIG_MAGIC || config->size < offsetof(loomConfig_t, blocking)) {
        LOOM_WARN("loomConfig_t was not initialized with LOOM_CONFIG_INITIALIZER (magic 0x%x, "
                  "size %zu bytes)",
                  config->magic, config->size);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* Reads a config field only if the caller's struct is large enough to hold it. */
#define CONFIG_HAS(_cfg, _field)                                                                   \
    ((_cfg) != NULL && (_cfg)->size >= offsetof(loomConfig_t, _field) + sizeof((_cfg)->_field))

static void apply_config(struct loomComm *c, const loomConfig_t *config)
{
    c->timeout_ms = loom_param_TIMEOUT_MS();
    if (CONFIG_HAS(config, timeout_ms) && config->timeout_ms != LOOM_CONFIG_UNDEF_INT &&
        config->timeout_ms > 0)
        c->timeout_ms = config->timeout_ms;
    if (c->timeout_ms <= 0)
        c->timeout_ms = 300000;
    const char *net = loom_param_NET();
    if (CONFIG_HAS(config, net) && config->net != NULL)
        net = config->net;
    snprintf(c->net, sizeof(c->net), "%s", net ? net : "");
    if (CONFIG_HAS(config, commName) && config->commName != NULL)
        snprintf(c->name, sizeof(c->name), "%s", config->commName);
    else
        snprintf(c->name, sizeof(c->name), "%p", (void *)c);
}

static void comm_free(struct loomComm *c)
{
    if (c->shrink_fd >= 0)
        close(c->shrink_fd);
    free(c->shrink_addrs);
    loom_secret_wipe(c->secret, sizeof(c->secret));
    loom_coll_ctx_free(&c->coll);
    loom_echo_ctx_free(c->echo);
    free(c->peers);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

/* Until a teardown starts nobody waits for a reference to drop, and the
 * decrement is the last access to c: no lock. Once `closing` is set the
 * decrement happens under the lock, which the teardown re-checks refs under,
 * so it cannot free the communicator before this has let go of it; a release
 * that read `closing` just before it was set is caught by the teardown's
 * periodic re-check (lifecycle.c). */
void loom_comm_release(struct loomComm *c)
{
    if (!__atomic_load_n(&c->closing, __ATOMIC_SEQ_CST)) {
        if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_SEQ_CST) == 0)
            comm_free(c);
        return;
    }
    pthread_mutex_lock(&c->lock);
    int left = __atomic_sub_fetch(&c->refs, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->waiters, __ATOMIC_SEQ_CST) > 0)
        pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (left == 0)
        comm_free(c);
}

void loom_comm_wake(struct loomComm *c)
{
    if (__atomic_load_n(&c->waiters, __ATOMIC_SEQ_CST) == 0)
        return;
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void loom_comm_set_async_error(struct loomComm *c, loomResult_t res, const char *msg)
{
    pthread_mutex_lock(&c->lock);
    if (c->async_error == loomSuccess) {
        c->async_error = res;
        snprintf(c->async_msg, sizeof(c->async_msg), "%s", msg ? msg : "");
    }
    pthread_mutex_unlock(&c->lock);
}

static void count_local(struct loomComm *c)
{
    c->local_rank = c->local_size = 0;
    for (int r = 0; r < c->nranks; r++) {
        if (c->peers[r].host_hash != c->peers[c->rank].host_hash)
            continue;
        if (r < c->rank)
            c->local_rank++;
        c->local_size++;
    }
}

/* How long a stream's worker and synchronizer yield before they sleep:
 * LOOM_SPIN_US, but at most OVERSUB_SPIN_NS when this host's ranks, each with
 * an issuing thread and a stream worker, outnumber the CPUs, where the thread
 * waited for needs the CPU (the shm arena's waits decide the same way). */
#define OVERSUB_SPIN_NS 2000
static int64_t stream_spin_ns(int local_size)
{
    int64_t spin = loom_param_SPIN_US() * 1000;
    if (loom_cpus_crowded(2L * local_size) && spin > OVERSUB_SPIN_NS)
        spin = OVERSUB_SPIN_NS;
    return spin < 0 ? 0 : spin;
}

/* What each rank tells the others at creation: its identity, where its shrink
 * rendezvous listens (shrink.c), and whether it has a device runtime (the
 * device state is made only when every rank has one, so that its collective
 * set-up runs on all ranks or on none). */
typedef struct {
    loom_peer_info_t info;
    loom_sockaddr_t shrink;
    int32_t device_rt;
    int32_t pad;
} join_info_t;

/* Opens this rank's shrink listener on the interface that reaches the rendezvous, then
 * all-gathers identities and listener addresses into c->peers and c->shrink_addrs. */
static loomResult_t exchange_identities(struct loomComm *c, loom_bootstrap_t *bs,
                                        const loom_peer_info_t *me)
{
    c->dev_rt = loom_devrt();
    join_info_t mine = {.info = *me, .device_rt = c->dev_rt != NULL};
    LOOM_CHECK(loom_bootstrap_local_addr(bs, &mine.shrink));
    LOOM_CHECK(loom_socket_listen(&mine.shrink, &c->shrink_fd));
    join_info_t *all = calloc((size_t)c->nranks, sizeof(*all));
    if (all == NULL) {
        LOOM_WARN("out of memory for %d peers", c->nranks);
        return loomSystemError;
    }
    loomResult_t res = loom_bootstrap_allgather(bs, &mine, sizeof(mine), all);
    c->dev_rt_absent = -1;
    for (int r = 0; res == loomSuccess && r < c->nranks; r++) {
        c->peers[r] = all[r].info;
        c->shrink_addrs[r] = all[r].shrink;
        if (!all[r].device_rt && c->dev_rt_absent < 0)
            c->dev_rt_absent = r;
    }
    free(all);
    return res;
}

loomResult_t loom_comm_create(loomComm_t *comm_p, int nranks, const loom_id_t *id, int rank,
                              const loomConfig_t *config, int topo)
{
    uint64_t t0 = loom_now_ns();
    loomResult_t res = loomSuccess;
    loom_bootstrap_t *bs = NULL;
    struct loomComm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("out of memory creating a communicator");
        return loomSystemError;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->refs = 1;
    c->shrink_fd = -1;
    loom_call_guard_init(); /* before any handle exists: see call_guard.h */
    c->rank = rank;
    c->nranks = nranks;
    apply_config(c, config);
    loom_debug_set_rank(rank);
    c->peers = calloc((size_t)nranks, sizeof(*c->peers));
    c->shrink_addrs = calloc((size_t)nranks, sizeof(*c->shrink_addrs));
    if (c->peers == NULL || c->shrink_addrs == NULL) {
        LOOM_WARN("out of memory for %d peers", nranks);
        res = loomSystemError;
        goto err_free;
    }
    LOOM_CHECK_GOTO(loom_bootstrap_join(id, rank, nranks, c->timeout_ms, &bs), res, err_free);
    loom_peer_info_t me;
    loom_identity_fill(&me, rank);
    if (topo) {
        const char *file = loom_param_TOPO_FILE(), *dump = loom_param_TOPO_DUMP_FILE();
        me.topo_flags =
            (file && *file ? LOOM_TOPO_FLAG_FILE : 0) | (dump && *dump ? LOOM_TOPO_FLAG_DUMP : 0);
    }
    LOOM_CHECK_GOTO(exchange_identities(c, bs, &me), res, err_leave);
    for (int r = 0; r < nranks; r++) {
        if (c->peers[r].rank != r) {
            LOOM_WARN("rank %d: bootstrap returned rank %d in slot %d", rank, c->peers[r].rank, r);
            res = loomInternalError;
            goto err_leave;
        }
        c->peers[r].host_id[LOOM_HOST_ID_MAX - 1] = '\0';
        c->peers[r].hostname[LOOM_HOST_ID_MAX - 1] = '\0';
    }
    count_local(c);
    LOOM_CHECK_GOTO(loom_topo_at_init(c, bs), res, err_leave);
    c->spin_ns = stream_spin_ns(c->local_size);
    memcpy(c->secret, id->secret, sizeof(c->secret));
    loom_tp_init_args_t args = {.rank = rank,
                                .nranks = nranks,
                                .peers = c->peers,
                                .secret = id->secret,
                                .timeout_ms = c->timeout_ms,
                                .abort_flag = &c->abort_flag};
    const int spans_hosts = c->local_size < nranks;
    const int tcp_mbps = spans_hosts ? loom_net_tcp_mbps() : -1;
    double rdma_gbps = 0;
    loom_tp_ucx_auto_t ucx_auto = loom_net_auto(c->net, spans_hosts, tcp_mbps, &rdma_gbps);
    LOOM_CHECK_GOTO(loom_p2p_create(bs, &args, c->net, ucx_auto, &c->p2p), res, err_leave);
    LOOM_CHECK_GOTO(loom_bootstrap_leave(bs), res, err_p2p);
    bs = NULL;
    LOOM_CHECK_GOTO(loom_coll_ctx_init(&c->coll, c->p2p, &args, tcp_mbps,
                                       rdma_gbps > 0 ? (int)(rdma_gbps * 1000) : -1),
                    res, err_p2p);
    LOOM_CHECK_GOTO(loom_registry_add(&loom_comms, c, &c->refs), res, err_p2p);
    /* Listed before the device state is made: its transports agree over c's collectives. */
    if ((res = loom_dev_comm_create(c)) != loomSuccess) {
        (void)loom_registry_remove(&loom_comms, c, NULL);
        goto err_p2p;
    }
    LOOM_INFO(LOOM_LOG_INIT,
              "comm %s rank %d nranks %d host %s local rank %d/%d - Init "
              "COMPLETE (%.1f ms)",
              c->name, rank, nranks, c->peers[rank].host_id, c->local_rank, c->local_size,
              (double)(loom_now_ns() - t0) / 1e6);
    *comm_p = c;
    return loomSuccess;

err_p2p:
    /* Peers still creating (the arena, calibration) learn of this failure from the notice:
     * a normal close would leave them waiting for this rank until their timeout. */
    loom_p2p_fail(c->p2p, res);
    (void)loom_p2p_destroy(c->p2p);
    (void)loom_coll_ctx_close(&c->coll); /* after the layer, as in a destroy */
err_leave:
    if (bs)
        (void)loom_bootstrap_leave(bs);
err_free:
    comm_free(c);
    return res;
}

LOOM_API loomResult_t loomCommInitRankConfig(loomComm_t *comm, int nranks, loomUniqueId commId,
                                             int rank, loomConfig_t *config)
{
    return loom_comm_init_checked(comm, nranks, commId, rank, config, 1);
}

loomResult_t loom_comm_init_checked(loomComm_t *comm, int nranks, loomUniqueId commId, int rank,
                                    const loomConfig_t *config, int topo)
{
    if (comm == NULL) {
        LOOM_WARN("loomCommInitRank: comm pointer is NULL");
        return loomInvalidArgument;
    }
    if (nranks < 1 || nranks > LOOM_BOOTSTRAP_MAX_RANKS) {
        LOOM_WARN("loomCommInitRank: nranks %d out of range [1, %d]", nranks,
                  LOOM_BOOTSTRAP_MAX_RANKS);
        return loomInvalidArgument;
    }
    if (rank < 0 || rank >= nranks) {
        LOOM_WARN("loomCommInitRank: rank %d out of range [0, %d)", rank, nranks);
        return loomInvalidArgument;
    }
    LOOM_CHECK(check_config(config));
    loom_id_t id;
    LOOM_CHECK(loom_id_decode(&commId, &id));
    return loom_comm_create(comm, nranks, &id, rank, config, topo);
}

LOOM_API loomResult_t loomCommInitRank(loomComm_t *comm, int nranks, loomUniqueId commId, int rank)
{
    return loomCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

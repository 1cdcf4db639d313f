/* SPDX-License-Identifier: Apache-2.0
 *
 * topo_init.c - the topology at communicator creation: LOOM_TOPO_FILE is read and checked
 * against the ranks that joined (its RDMA ports then stand for this host's in the choice of
 * transport between hosts, net_auto.c, and its caches in the shared-memory plan, shm_plan.h, which
 * otherwise reads this machine's); with LOOM_TOPO_DUMP_FILE, every rank's host and binding go
 * through the bootstrap and one rank writes the whole description. Communicators made by
 * loomCommSplit skip both: their ranks were described when their parent was made.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "debug.h"
#include "init.h"
#include "net_auto.h"
#include "param.h"
#include "shm/shm_plan.h"
#include "topo.h"

typedef struct {
    loom_topo_host_t host;
    loom_topo_rank_t rank;
} topo_record_t;

/* Each rank's host index, hosts numbered in order of their first rank; the count, or -1 when
 * out of memory. A hash table keyed by host hash keeps it linear in the rank count. */
static int number_hosts(const struct loomComm *c, int *host_of)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)c->nranks)
        cap *= 2;
    int *slot = malloc(cap * sizeof(int)), nhosts = 0;
    if (!slot)
        return -1;
    for (size_t i = 0; i < cap; i++)
        slot[i] = -1; /* the first rank seen on that host */
    for (int r = 0; r < c->nranks; r++) {
        uint64_t key = c->peers[r].host_hash;
        size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull) & (cap - 1);
        while (slot[i] >= 0 && c->peers[slot[i]].host_hash != key)
            i = (i + 1) & (cap - 1);
        if (slot[i] < 0) {
            slot[i] = r;
            host_of[r] = nhosts++;
        } else {
            host_of[r] = host_of[slot[i]];
        }
    }
    free(slot);
    return nhosts;
}

/* Hosts in order of their first rank, and each rank's host and local index. The records come
 * from other processes: they are made safe before use. */
static int topo_from_records(const struct loomComm *c, topo_record_t *recs, loom_topo_t *t)
{
    int *host_of = malloc((size_t)c->nranks * sizeof(int));
    int nhosts = host_of ? number_hosts(c, host_of) : -1;
    if (nhosts < 0) {
        free(host_of);
        return -1;
    }
    for (int r = 0; r < c->nranks; r++) {
        loom_topo_sanitize_host(&recs[r].host);
        loom_topo_sanitize_rank(&recs[r].rank);
    }
    if (loom_topo_alloc(t, nhosts, c->nranks)) {
        free(host_of);
        return -1;
    }
    int *local = calloc((size_t)nhosts, sizeof(int));
    for (int r = 0; local && r < c->nranks; r++) {
        int h = host_of[r];
        if (local[h] == 0) {
            t->hosts[h] = recs[r].host;
            /* loom's name for the host: LOOM_HOST_ID where it models several on one machine */
            snprintf(t->hosts[h].hostname, sizeof(t->hosts[h].hostname), "%s", c->peers[r].host_id);
        }
        t->ranks[r] = recs[r].rank;
        t->ranks[r].host = h;
        t->ranks[r].local_rank = local[h]++;
    }
    int rc = local ? 0 : -1;
    free(local);
    free(host_of);
    if (rc)
        loom_topo_free(t);
    return rc;
}

/* The file must describe these ranks: as many, on as many hosts, grouped the same way. */
static loomResult_t check_file(const struct loomComm *c, const loom_topo_t *file,
                               const loom_topo_t *seen, const char *path)
{
    if (file->nranks == 0)
        return loomSuccess; /* a machine description without ranks applies to any */
    if (file->nranks != c->nranks || file->nhosts != seen->nhosts) {
        LOOM_WARN("LOOM_TOPO_FILE %s describes %d ranks on %d hosts, but %d ranks on %d "
                  "hosts joined",
                  path, file->nranks, file->nhosts, c->nranks, seen->nhosts);
        return loomInvalidArgument;
    }
    for (int r = 0; r < c->nranks; r++)
        if (file->ranks[r].host != seen->ranks[r].host) {
            LOOM_WARN("LOOM_TOPO_FILE %s puts rank %d on host %d, but it shares "
                      "memory with the ranks of host %d",
                      path, r, file->ranks[r].host, seen->ranks[r].host);
            return loomInvalidArgument;
        }
    return loomSuccess;
}

/* The file's host of this rank: by its ranks where it lists them, else in the order hosts were
 * numbered here (a file of one host describes every host). */
static int file_host(const struct loomComm *c, const loom_topo_t *file, const loom_topo_t *seen)
{
    int h = file->nranks ? file->ranks[c->rank].host : seen->ranks[c->rank].host;
    return h >= 0 && h < file->nhosts ? h : 0;
}

/* This machine's caches for the shm collectives' plan: a few sysfs reads, once per process. */
static void detect_caches_once(void)
{
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
        return;
    loom_topo_host_t h;
    loom_topo_detect_caches(&h, NULL);
    loom_shm_set_detected_caches(h.l1d_kb, h.l2_kb, h.l3_kb);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

loomResult_t loom_topo_at_init(struct loomComm *c, loom_bootstrap_t *bs)
{
    detect_caches_once();
    int want = 0, writer = -1;
    for (int r = 0; r < c->nranks; r++) {
        want |= c->peers[r].topo_flags != 0;
        if (writer < 0 && (c->peers[r].topo_flags & LOOM_TOPO_FLAG_DUMP))
            writer = r;
    }
    if (!want)
        return loomSuccess;
    topo_record_t *recs = calloc((size_t)c->nranks, sizeof(*recs)), me;
    if (!recs) {
        LOOM_WARN("out of memory for %d topology records", c->nranks);
        return loomSystemError;
    }
    loom_topo_detect_host(&me.host, NULL);
    loom_topo_detect_rank(&me.rank, NULL);
    loomResult_t res = loom_bootstrap_allgather(bs, &me, sizeof(me), recs);
    loom_topo_t seen = {0}, file = {0};
    if (res == loomSuccess && topo_from_records(c, recs, &seen)) {
        LOOM_WARN("out of memory building the topology of %d ranks", c->nranks);
        res = loomSystemError;
    }
    free(recs);
    const char *path = loom_param_TOPO_FILE();
    if (res == loomSuccess && path && *path) {
        char err[512];
        if (loom_topo_read(path, &file, err, sizeof(err))) {
            LOOM_WARN("LOOM_TOPO_FILE %s", err);
            res = loomInvalidArgument;
        } else {
            res = check_file(c, &file, &seen, path);
        }
        if (res == loomSuccess && file.nhosts > 0) {
            const loom_topo_host_t *h = &file.hosts[file_host(c, &file, &seen)];
            loom_net_set_file_rdma(loom_topo_best_rdma_gbps(h));
            loom_shm_set_file_caches(h->l1d_kb, h->l2_kb, h->l3_kb);
        }
    }
    if (res == loomSuccess && writer == c->rank) {
        /* A file's description wins over detection, as it does everywhere else. */
        loom_topo_t *out = file.nhosts ? &file : &seen;
        if (file.nhosts && file.nranks == 0) {
            free(file.ranks);
            file.ranks = seen.ranks;
            file.nranks = seen.nranks;
            seen.ranks = NULL;
        }
        const char *dump = loom_param_TOPO_DUMP_FILE();
        FILE *f = fopen(dump, "w");
        int bad = !f || loom_topo_write(out, f);
        if (f && fclose(f))
            bad = 1;
        if (bad) {
            LOOM_WARN("LOOM_TOPO_DUMP_FILE %s: cannot write it", dump);
            res = loomSystemError;
        } else {
            LOOM_INFO(LOOM_LOG_TOPO, "topology of %d ranks on %d hosts written to %s", c->nranks,
                      out->nhosts, dump);
        }
    }
    loom_topo_free(&seen);
    loom_topo_free(&file);
    return res;
}

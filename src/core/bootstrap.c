/* SPDX-License-Identifier: Apache-2.0
 *
 * bootstrap.c - the rendezvous protocol, root and rank sides.
 *
 * Wire protocol (all integers little-endian as the host writes them; every
 * connection first passes the secret handshake of secret.c):
 *   rank -> root  HELLO  {u32 magic, i32 rank, i32 nranks, u32 pid}
 *   root -> rank  REPLY  {u32 status, u32 0, u64 len} + len bytes
 *                 (status 0: all ranks arrived; else a loomResult_t and a text)
 *   rank -> root  REQ    {u32 type, u32 len} + len bytes   type ALLGATHER or BYE
 *   root -> rank  REPLY  with nranks*len bytes, rank order
 * The root checks every field against fixed bounds before using it; a
 * connection that fails the handshake or sends a bad HELLO is closed and the
 * root keeps waiting for the real ranks, so stray connections cannot break a
 * rendezvous. If a rank disconnects, every other rank gets RemoteError naming it.
 */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "timer.h"

#define HELLO_MAGIC    0x4c4d4845u /* "LMHE" */
#define REQ_ALLGATHER  1u
#define REQ_BYE        2u
#define ROLE_BOOTSTRAP 0x424f4f54u
/* A single connection may hold up the root for at most this long. */
#define PER_CONN_MS 2000

typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t pid;
} hello_t;

typedef struct {
    uint32_t status;
    uint32_t pad;
    uint64_t len;
} reply_t;

typedef struct {
    uint32_t type;
    uint32_t len;
} req_t;

struct loom_bootstrap {
    int fd;
    int rank;
    int nranks;
    int64_t timeout_ms;
};

typedef struct {
    int listen_fd;
    uint8_t secret[LOOM_SECRET_BYTES];
    int64_t timeout_ms;
} root_args_t;

loomResult_t loom_id_decode(const loomUniqueId *uid, loom_id_t *id_p)
{
    loom_id_t id;
    memcpy(&id, uid->internal, sizeof(id));
    if (id.magic != LOOM_ID_MAGIC || id.version != LOOM_ID_VERSION) {
        LOOM_WARN("unique id is not valid (magic 0x%x version %u): was it made by "
                  "loomGetUniqueId and passed unchanged?",
                  id.magic, id.version);
        return loomInvalidArgument;
    }
    *id_p = id;
    return loomSuccess;
}

void loom_id_encode(const loom_id_t *id, loomUniqueId *uid)
{
    memset(uid, 0, sizeof(*uid));
    _Static_assert(sizeof(loom_id_t) <= LOOM_UNIQUE_ID_BYTES, "id must fit in loomUniqueId");
    memcpy(uid->internal, id, sizeof(*id));
}

// ---- root side ------------------------------------------------------------

static void root_send_reply(int fd, loomResult_t status, const void *data, size_t len,
                            uint64_t deadline)
{
    reply_t r = {.status = (uint32_t)status, .pad = 0, .len = len};
    if (loom_socket_send_all(fd, &r, sizeof(r), deadline) == loomSuccess && len > 0)
        (void)loom_socket_send_all(fd, data, len, deadline);
}

static void root_fail_all(int *fds, int nranks, loomResult_t status, const char *msg)
{
    uint64_t deadline = loom_deadline_ms(PER_CONN_MS);
    for (int r = 0; r < nranks; r++) {
        if (fds[r] >= 0) {
            root_send_reply(fds[r], status, msg, strlen(msg) + 1, deadline);
            close(fds[r]);
            fds[r] = -1;
        }
    }
}

/* Accepts one connection and registers it if it proves the secret and says
 * hello with a valid, new rank. Everything else is closed and logged. */
static void root_accept_one(root_args_t *a, int *fds, uint32_t *pids, int *nranks_p, int *arrived_p)
{
    int fd = -1;
    if (loom_socket_accept(a->listen_fd, &fd) != loomSuccess || fd < 0)
        return;
    uint64_t deadline = loom_deadline_ms(PER_CONN_MS);
    if (loom_handshake_accept(fd, a->secret, ROLE_BOOTSTRAP, deadline) != loomSuccess) {
        LOOM_INFO(LOOM_LOG_BOOTSTRAP, "bootstrap root: dropped a connection that did not prove "
                                      "the job secret");
        close(fd);
        return;
    }
    hello_t h;
    if (loom_socket_recv_all(fd, &h, sizeof(h), deadline) != loomSuccess) {
        close(fd);
        return;
    }
    char msg[160] = "";
    if (h.magic != HELLO_MAGIC)
        snprintf(msg, sizeof(msg), "bad hello magic 0x%x", h.magic);
    else if (h.nranks < 1 || h.nranks > LOOM_BOOTSTRAP_MAX_RANKS)
        snprintf(msg, sizeof(msg), "nranks %d out of range", h.nranks);
    else if (*nranks_p > 0 && h.nranks != *nranks_p)
        snprintf(msg, sizeof(msg), "rank %d says nranks %d, others said %d", h.rank, h.nranks,
                 *nranks_p);
    else if (h.rank < 0 || h.rank >= h.nranks)
        snprintf(msg, sizeof(msg), "rank %d out of range for nranks %d", h.rank, h.nranks);
    else if (*nranks_p > 0 && fds[h.rank] >= 0)
        snprintf(msg, sizeof(msg), "rank %d joined twice (pids %u and %u)", h.rank, pids[h.rank],
                 h.pid);
    if (msg[0]) {
        LOOM_WARN("bootstrap root: rejected a hello: %s", msg);
        root_send_reply(fd, loomInvalidUsage, msg, strlen(msg) + 1, deadline);
        close(fd);
        return;
    }
    if (*nranks_p == 0) {
        *nranks_p = h.nranks;
        for (int r = 0; r < h.nranks; r++)
            fds[r] = -1;
    }
    fds[h.rank] = fd;
    pids[h.rank] = h.pid;
    (*arrived_p)++;
}

/* Waits for every rank. Returns 0 when all arrived, -1 on deadline (the ranks
 * that did arrive are told which ones never did). */
static int root_gather(root_args_t *a, int *fds, uint32_t *pids, int *nranks_p)
{
    int arrived = 0;
    uint64_t deadline = loom_deadline_ms(a->timeout_ms);
    while (*nranks_p == 0 || arrived < *nranks_p) {
        uint64_t now = loom_now_ns();
        if (now >= deadline)
            break;
        struct pollfd p = {.fd = a->listen_fd, .events = POLLIN};
        int ms = (int)((deadline - now) / 1000000ull) + 1;
        if (poll(&p, 1, ms > 1000 ? 1000 : ms) > 0)
            root_accept_one(a, fds, pids, nranks_p, &arrived);
    }
    if (*nranks_p > 0 && arrived == *nranks_p)
        return 0;
    char msg[512];
    int o = snprintf(msg, sizeof(msg), "ranks that never arrived at the rendezvous within %lld ms:",
                     (long long)a->timeout_ms);
    for (int r = 0; r < *nranks_p && o < (int)sizeof(msg) - 16; r++)
        if (fds[r] < 0)
            o += snprintf(msg + o, sizeof(msg) - (size_t)o, " %d", r);
    LOOM_WARN("bootstrap root: %s", msg);
    if (*nranks_p > 0)
        root_fail_all(fds, *nranks_p, loomTimeout, msg);
    return -1;
}

/* Serves all-gather rounds until every rank says BYE or one fails. */
static void root_serve(root_args_t *a, int *fds, int nranks)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int r = 0; r < nranks; r++)
        root_send_reply(fds[r], loomSuccess, NULL, 0, loom_deadline_ms(a->timeout_ms));
    for (;;) {
        uint32_t len = 0, type = 0;
        for (int r = 0; r < nranks; r++) {
            req_t q;
            uint64_t deadline = loom_deadline_ms(a->timeout_ms);
            char msg[160];
            loomResult_t res = loom_socket_recv_all(fds[r], &q, sizeof(q), deadline);
            if (res == loomSuccess && r == 0) {
                type = q.type;
                len = q.len;
            }
            if (res == loomSuccess &&
                (q.type != type || q.len != len || (type != REQ_ALLGATHER && type != REQ_BYE) ||
                 len > LOOM_BOOTSTRAP_MAX_PAYLOAD)) {
                snprintf(msg, sizeof(msg),
                         "rank %d sent request %u of %u bytes, rank 0 sent "
                         "%u of %u bytes",
                         r, q.type, q.len, type, len);
                LOOM_WARN("bootstrap root: %s", msg);
                root_fail_all(fds, nranks, loomInvalidUsage, msg);
                goto out;
            }
            if (res == loomSuccess && type == REQ_ALLGATHER) {
                size_t need = (size_t)len * (size_t)nranks;
                if (need > cap) {
                    uint8_t *nb = realloc(buf, need);
                    if (nb == NULL) {
                        root_fail_all(fds, nranks, loomSystemError, "bootstrap root out of memory");
                        goto out;
                    }
                    buf = nb;
                    cap = need;
                }
                res = loom_socket_recv_all(fds[r], buf + (size_t)r * len, len, deadline);
            }
            if (res != loomSuccess) {
                snprintf(msg, sizeof(msg),
                         "rank %d left the rendezvous during communicator "
                         "setup (%s)",
                         r, loomGetErrorString(res));
                LOOM_WARN("bootstrap root: %s", msg);
                close(fds[r]);
                fds[r] = -1;
                root_fail_all(fds, nranks, loomRemoteError, msg);
                goto out;
            }
        }
        if (type == REQ_BYE)
            break;
        for (int r = 0; r < nranks; r++)
            root_send_reply(fds[r], loomSuccess, buf, (size_t)len * (size_t)nranks,
                            loom_deadline_ms(a->timeout_ms));
    }
    for (int r = 0; r < nranks; r++) {
        close(fds[r]);
        fds[r] = -1;
    }
out:
    free(buf);
}

static void *root_main(void *arg)
{
    root_args_t *a = arg;
    int *fds = calloc(LOOM_BOOTSTRAP_MAX_RANKS, sizeof(int));
    uint32_t *pids = calloc(LOOM_BOOTSTRAP_MAX_RANKS, sizeof(uint32_t));
    int nranks = 0;
    if (fds && pids && root_gather(a, fds, pids, &nranks) == 0)
        root_serve(a, fds, nranks);
    free(fds);
    free(pids);
    close(a->listen_fd);
    free(a);
    return NULL;
}

loomResult_t loom_bootstrap_root_start(int listen_fd, const uint8_t secret[LOOM_SECRET_BYTES],
                                       int64_t timeout_ms)
{
    root_args_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        LOOM_WARN("out of memory starting the bootstrap root");
        close(listen_fd);
        return loomSystemError;
    }
    a->listen_fd = listen_fd;
    memcpy(a->secret, secret, LOOM_SECRET_BYTES);
    a->timeout_ms = timeout_ms;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int ret = pthread_create(&t, &attr, root_main, a);
    pthread_attr_destroy(&attr);
    if (ret != 0) {
        LOOM_WARN("pthread_create for the bootstrap root failed: %s", strerror(ret));
        close(listen_fd);
        free(a);
        return loomSystemError;
    }
    return loomSuccess;
}

// ---- rank side --------------------------------------------------------------

static loomResult_t read_reply(loom_bootstrap_t *bs, void *out, size_t expect, const char *what)
{
    reply_t r;
    uint64_t deadline = loom_deadline_ms(bs->timeout_ms);
    loomResult_t res = loom_socket_recv_all(bs->fd, &r, sizeof(r), deadline);
    if (res != loomSuccess) {
        LOOM_WARN("rank %d: lost the bootstrap root while waiting for %s (%s)", bs->rank, what,
                  loomGetErrorString(res));
        return res == loomTimeout ? loomTimeout : loomRemoteError;
    }
    if (r.status != loomSuccess) {
        char msg[512] = "";
        size_t n = r.len < sizeof(msg) - 1 ? (size_t)r.len : sizeof(msg) - 1;
        if (n > 0)
            (void)loom_socket_recv_all(bs->fd, msg, n, deadline);
        msg[n] = '\0';
        loomResult_t st = r.status < loomNumResults ? (loomResult_t)r.status : loomRemoteError;
        LOOM_WARN("rank %d: rendezvous failed during %s: %s", bs->rank, what, msg);
        return st;
    }
    if (r.len != expect) {
        LOOM_WARN("rank %d: bootstrap root sent %llu bytes for %s, expected %zu", bs->rank,
                  (unsigned long long)r.len, what, expect);
        return loomRemoteError;
    }
    return expect ? loom_socket_recv_all(bs->fd, out, expect, deadline) : loomSuccess;
}

loomResult_t loom_bootstrap_join(const loom_id_t *id, int rank, int nranks, int64_t timeout_ms,
                                 loom_bootstrap_t **bs_p)
{
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    char addr[96];
    loom_sockaddr_str(&id->root, addr, sizeof(addr));
    int fd = -1, last_errno = 0;
    uint64_t backoff_us = 1000;
    /* The root may not listen yet (rank 0 of an env launch starts it): retry refused connects. */
    while (fd < 0) {
        int done = 0, err = 0;
        loomResult_t res = loom_socket_connect_start(&id->root, &fd);
        while (res == loomSuccess && !done && loom_now_ns() < deadline) {
            res = loom_socket_connect_poll(fd, &done, &err);
            if (res == loomSuccess && !done) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                poll(&p, 1, 10);
            }
        }
        if (res == loomSuccess && done)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
        last_errno = err;
        if (loom_now_ns() + backoff_us * 1000 >= deadline) {
            LOOM_WARN("rank %d: cannot reach the rendezvous at %s within %lld ms: %s", rank, addr,
                      (long long)timeout_ms, last_errno ? strerror(last_errno) : "timed out");
            return loomTimeout;
        }
        usleep((useconds_t)backoff_us);
        if (backoff_us < 100000)
            backoff_us *= 2;
    }
    loomResult_t res = loom_handshake_connect(fd, id->secret, ROLE_BOOTSTRAP, deadline);
    if (res != loomSuccess) {
        /* The handshake WARNed the cause; this adds where it happened. */
        LOOM_INFO(LOOM_LOG_BOOTSTRAP, "rank %d: handshake with the rendezvous at %s failed", rank,
                  addr);
        close(fd);
        return res;
    }
    hello_t h = {.magic = HELLO_MAGIC, .rank = rank, .nranks = nranks, .pid = (uint32_t)getpid()};
    res = loom_socket_send_all(fd, &h, sizeof(h), deadline);
    if (res != loomSuccess) {
        close(fd);
        return res;
    }
    loom_bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (bs == NULL) {
        close(fd);
        LOOM_WARN("out of memory");
        return loomSystemError;
    }
    bs->fd = fd;
    bs->rank = rank;
    bs->nranks = nranks;
    bs->timeout_ms = timeout_ms;
    res = read_reply(bs, NULL, 0, "all ranks to arrive");
    if (res != loomSuccess) {
        close(fd);
        free(bs);
        return res;
    }
    LOOM_INFO(LOOM_LOG_BOOTSTRAP, "rank %d joined the rendezvous at %s with %d ranks", rank, addr,
              nranks);
    *bs_p = bs;
    return loomSuccess;
}

loomResult_t loom_bootstrap_allgather(loom_bootstrap_t *bs, const void *data, size_t len, void *out)
{
    if (len > LOOM_BOOTSTRAP_MAX_PAYLOAD) {
        LOOM_WARN("bootstrap all-gather of %zu bytes exceeds the %u byte limit", len,
                  LOOM_BOOTSTRAP_MAX_PAYLOAD);
        return loomInternalError;
    }
    req_t q = {.type = REQ_ALLGATHER, .len = (uint32_t)len};
    uint64_t deadline = loom_deadline_ms(bs->timeout_ms);
    LOOM_CHECK(loom_socket_send_all(bs->fd, &q, sizeof(q), deadline));
    if (len > 0)
        LOOM_CHECK(loom_socket_send_all(bs->fd, data, len, deadline));
    return read_reply(bs, out, len * (size_t)bs->nranks, "an all-gather");
}

loomResult_t loom_bootstrap_leave(loom_bootstrap_t *bs)
{
    if (bs == NULL)
        return loomSuccess;
    req_t q = {.type = REQ_BYE, .len = 0};
    loomResult_t res = loom_socket_send_all(bs->fd, &q, sizeof(q), loom_deadline_ms(PER_CONN_MS));
    close(bs->fd);
    free(bs);
    return res;
}

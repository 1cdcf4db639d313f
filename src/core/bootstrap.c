/* SPDX-License-Identifier: Apache-2.0
 *
 * bootstrap.c - the rendezvous protocol, root and rank sides. The messages
 * and their bounds live in bootstrap_wire.c; this file moves them.
 * It carries only setup data (identities, transport handles), never user
 * data. Callers: api/init.c (loomGetUniqueId, communicator creation),
 * api/env_init.c (rank 0 serves the rendezvous), transport/p2p.c (handles).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "timer.h"

/* The root serves in two phases.
 *
 * Gather: one poll() loop over the listening socket and every connection that
 * has not yet said a valid hello. Each one is a small state machine: the
 * non-blocking secret handshake (secret.c, as acceptor), then the 16-byte
 * HELLO, which is decoded and bounded (bootstrap_wire.c) before it is used.
 * Nothing else is read from a connection until it has proved the job secret.
 * No connection can hold up another:
 *   - every pending connection has HS_MS from its accept to finish its hello,
 *     then it is dropped;
 *   - at most MAX_PENDING are held at once; a new one beyond that evicts the
 *     oldest unproven one (one that has sent nothing first). A real rank that
 *     loses its connection this way connects again (loom_bootstrap_join
 *     retries a connection the root closed during the handshake), while one
 *     with a wrong secret is told so and gives up at once;
 *   - out of descriptors, the root evicts too, else pauses accepting for
 *     EMFILE_PAUSE_MS.
 * Refused unproven connections are logged through a loom_stray_log_t: one
 * WARN, INFO lines after it, and a count when the gather ends. A connection
 * that proved the secret but sends a bad hello is a member of the job going
 * wrong (or an insider): it is WARNed, told why in a REPLY, and closed.
 *
 * Serve: once every rank has arrived the listening socket is closed and the
 * root answers each rank, then serves all-gather rounds: it reads one REQ
 * (plus payload) from every rank in rank order, checks that all agree, and
 * sends every rank the concatenation. Only proven ranks are left by then; a
 * rank that disconnects or breaks protocol fails everyone with a message. */

#define HS_MS           2000 /* from accept to a valid hello, per connection */
#define MAX_PENDING     128  /* connections held before their hello */
#define ACCEPT_BURST    64   /* accepts per poll round, so pending ones progress */
#define EMFILE_PAUSE_MS 100
#define REPLY_MS        2000 /* bound on sending a failure reply or a BYE */

struct loom_bootstrap {
    int fd;
    int rank;
    int nranks;
    int64_t timeout_ms;
};

loomResult_t loom_id_decode(const loomUniqueId *uid, loom_id_t *id_p)
{
    char why[128];
    if (loom_bs_id_decode(uid->internal, sizeof(uid->internal), id_p, why, sizeof(why)) !=
        loomSuccess) {
        LOOM_WARN("unique id is not valid (%s): was it made by loomGetUniqueId and passed "
                  "unchanged?",
                  why);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

void loom_id_encode(const loom_id_t *id, loomUniqueId *uid)
{
    memset(uid, 0, sizeof(*uid));
    _Static_assert(sizeof(loom_id_t) <= LOOM_UNIQUE_ID_BYTES, "id must fit in loomUniqueId");
    memcpy(uid->internal, id, sizeof(*id));
}

// ---- root: state ------------------------------------------------------------

typedef struct {
    int fd;
    int proven; /* handshake done: waiting for the hello */
    short revents;
    uint64_t deadline_ns;
    loom_handshake_t hs;
    uint8_t hello[LOOM_BS_HELLO_BYTES];
    size_t have;
} pending_t;

typedef struct {
    int listen_fd;
    uint8_t secret[LOOM_SECRET_BYTES];
    int64_t timeout_ms;
    pending_t pend[MAX_PENDING]; /* in accept order */
    int npend;
    int nranks; /* announced by the first accepted hello; 0 before it */
    int arrived;
    int *fds;        /* [nranks], -1 until the rank arrives */
    uint32_t *pids;  /* [nranks] */
    uint8_t *joined; /* [nranks] */
    uint64_t accept_again_ns;
    int fd_warned;
    int quiet_probes; /* a shrink's rendezvous: silent closes are probes (see pend_step) */
    loom_stray_log_t strays;
} root_t;

static void root_free(root_t *rt)
{
    for (int i = 0; i < rt->npend; i++) {
        close(rt->pend[i].fd);
        loom_handshake_clear(&rt->pend[i].hs);
    }
    for (int r = 0; r < rt->nranks; r++)
        if (rt->fds[r] >= 0)
            close(rt->fds[r]);
    if (rt->listen_fd >= 0)
        close(rt->listen_fd);
    free(rt->fds);
    free(rt->pids);
    free(rt->joined);
    loom_secret_wipe(rt->secret, sizeof(rt->secret));
    free(rt);
}

/* Removes pending entry i, closing its socket unless it was handed on (fd -1). */
static void pend_remove(root_t *rt, int i)
{
    pending_t *p = &rt->pend[i];
    if (p->fd >= 0)
        close(p->fd);
    loom_handshake_clear(&p->hs);
    memmove(p, p + 1, (size_t)(rt->npend - i - 1) * sizeof(*p));
    rt->npend--;
}

/* Drops an unproven connection, logged through the stray counter. A cause
 * from the handshake (hs.why) already names the peer. */
static void pend_stray(root_t *rt, int i, const char *cause)
{
    char peer[96], why[256];
    if (cause == rt->pend[i].hs.why)
        snprintf(why, sizeof(why), "dropped a connection: %s", cause);
    else
        snprintf(why, sizeof(why), "dropped a connection from %s: %s",
                 loom_socket_peer_str(rt->pend[i].fd, peer, sizeof(peer)), cause);
    LOOM_STRAY_NOTE(&rt->strays, why);
    pend_remove(rt, i);
}

/* Evicts the oldest unproven connection, preferring one that sent nothing.
 * Returns 0 if every pending connection has proved the secret. */
static int pend_evict(root_t *rt, const char *cause)
{
    int pick = -1;
    for (int i = 0; i < rt->npend && pick < 0; i++)
        if (!rt->pend[i].proven && loom_handshake_received(&rt->pend[i].hs) == 0)
            pick = i;
    for (int i = 0; i < rt->npend && pick < 0; i++)
        if (!rt->pend[i].proven)
            pick = i;
    if (pick < 0)
        return 0;
    pend_stray(rt, pick, cause);
    return 1;
}

/* One non-blocking attempt to tell a refused rank why; the caller closes. */
static void reply_once(int fd, loomResult_t status, const char *text)
{
    uint8_t buf[LOOM_BS_REPLY_BYTES + LOOM_BS_TEXT_MAX];
    size_t tlen = strlen(text) + 1;
    if (tlen > LOOM_BS_TEXT_MAX)
        tlen = LOOM_BS_TEXT_MAX;
    loom_bs_reply_encode(status, tlen, buf);
    memcpy(buf + LOOM_BS_REPLY_BYTES, text, tlen);
    buf[LOOM_BS_REPLY_BYTES + tlen - 1] = '\0';
    size_t n = 0;
    (void)loom_socket_send_some(fd, buf, LOOM_BS_REPLY_BYTES + tlen, &n);
}

static loomResult_t root_send_reply(int fd, loomResult_t status, const void *data, size_t len,
                                    uint64_t deadline)
{
    uint8_t hdr[LOOM_BS_REPLY_BYTES];
    loom_bs_reply_encode(status, len, hdr);
    LOOM_CHECK(loom_socket_send_all(fd, hdr, sizeof(hdr), deadline));
    return len > 0 ? loom_socket_send_all(fd, data, len, deadline) : loomSuccess;
}

/* Tells every arrived rank that the rendezvous failed, then closes them the
 * lingering way: shut down the sending side, discard what the ranks still
 * send (a request already on its way) until they close or REPLY_MS passes.
 * Closing with unread input would reset the connection, and a reset can
 * destroy the reply before the rank reads it. */
static void root_fail_all(root_t *rt, loomResult_t status, const char *msg)
{
    uint64_t deadline = loom_deadline_ms(REPLY_MS);
    int open = 0;
    for (int r = 0; r < rt->nranks; r++) {
        if (rt->fds[r] < 0)
            continue;
        (void)root_send_reply(rt->fds[r], status, msg, strlen(msg) + 1, deadline);
        shutdown(rt->fds[r], SHUT_WR);
        open++;
    }
    for (int r = 0; open > 0 && r < rt->nranks;) {
        uint64_t now = loom_now_ns();
        if (rt->fds[r] < 0) {
            r++;
            continue;
        }
        char sink[256];
        size_t n = 0;
        loomResult_t res = loom_socket_recv_some(rt->fds[r], sink, sizeof(sink), &n);
        if (res == loomSuccess && n == 0 && now < deadline) {
            struct pollfd p = {.fd = rt->fds[r], .events = POLLIN};
            (void)poll(&p, 1, (int)((deadline - now + 999999) / 1000000));
            continue;
        }
        if (res == loomSuccess && n > 0 && now < deadline)
            continue;
        close(rt->fds[r]);
        rt->fds[r] = -1;
        open--;
        r++;
    }
}

// ---- root: gather -------------------------------------------------------------

/* Records a valid hello: the connection becomes rank h->rank's. */
static loomResult_t root_register(root_t *rt, int i, const loom_bs_hello_t *h)
{
    if (rt->nranks == 0) {
        rt->fds = malloc((size_t)h->nranks * sizeof(*rt->fds));
        rt->pids = calloc((size_t)h->nranks, sizeof(*rt->pids));
        rt->joined = calloc((size_t)h->nranks, 1);
        if (rt->fds == NULL || rt->pids == NULL || rt->joined == NULL) {
            LOOM_WARN("bootstrap root: out of memory for the tables of %d ranks", h->nranks);
            reply_once(rt->pend[i].fd, loomSystemError, "bootstrap root out of memory");
            free(rt->fds);
            free(rt->pids);
            free(rt->joined);
            rt->fds = NULL;
            rt->pids = NULL;
            rt->joined = NULL;
            pend_remove(rt, i);
            return loomSystemError;
        }
        for (int r = 0; r < h->nranks; r++)
            rt->fds[r] = -1;
        rt->nranks = h->nranks;
    }
    char peer[96];
    LOOM_INFO(LOOM_LOG_BOOTSTRAP, "bootstrap root: rank %d of %d arrived from %s (pid %u)", h->rank,
              h->nranks, loom_socket_peer_str(rt->pend[i].fd, peer, sizeof(peer)), h->pid);
    rt->fds[h->rank] = rt->pend[i].fd;
    rt->pids[h->rank] = h->pid;
    rt->joined[h->rank] = 1;
    rt->arrived++;
    rt->pend[i].fd = -1;
    pend_remove(rt, i);
    return loomSuccess;
}

/* Advances pending connection i as far as its socket allows. *gone_p = 1 when
 * it left the pending list (refused, or registered as a rank). */
static loomResult_t pend_step(root_t *rt, int i, int *gone_p)
{
    pending_t *p = &rt->pend[i];
    char peer[96], why[256];
    *gone_p = 1;
    if (!p->proven) {
        int done = 0;
        if (loom_handshake_step(&p->hs, &done) != loomSuccess) {
            /* At a shrink's rendezvous, a connection closed before saying a byte is another
             * survivor's liveness probe (it asks only whether this process still holds its
             * port), not traffic to warn about. */
            if (rt->quiet_probes && p->hs.fail == LOOM_HS_FAIL_CLOSED &&
                loom_handshake_received(&p->hs) == 0) {
                LOOM_INFO(LOOM_LOG_BOOTSTRAP, "bootstrap root: a connection closed before its "
                                              "handshake (a liveness probe)");
                pend_remove(rt, i);
                return loomSuccess;
            }
            pend_stray(rt, i, p->hs.why);
            return loomSuccess;
        }
        if (!done) {
            *gone_p = 0;
            return loomSuccess;
        }
        loom_handshake_clear(&p->hs);
        p->proven = 1;
    }
    size_t n = 0;
    if (loom_socket_recv_some(p->fd, p->hello + p->have, sizeof(p->hello) - p->have, &n) !=
        loomSuccess) {
        LOOM_WARN("bootstrap root: a connection from %s proved the job secret, then closed "
                  "before its hello (%zu of %d bytes)",
                  loom_socket_peer_str(p->fd, peer, sizeof(peer)), p->have, LOOM_BS_HELLO_BYTES);
        pend_remove(rt, i);
        return loomSuccess;
    }
    p->have += n;
    if (p->have < sizeof(p->hello)) {
        *gone_p = 0;
        return loomSuccess;
    }
    loom_bs_hello_t h;
    if (loom_bs_hello_decode(p->hello, sizeof(p->hello), rt->nranks, rt->joined, &h, why,
                             sizeof(why)) != loomSuccess) {
        LOOM_WARN("bootstrap root: refused the hello of %s, which proved the job secret: %s",
                  loom_socket_peer_str(p->fd, peer, sizeof(peer)), why);
        reply_once(p->fd, loomInvalidUsage, why);
        pend_remove(rt, i);
        return loomSuccess;
    }
    return root_register(rt, i, &h);
}

static loomResult_t root_accept(root_t *rt)
{
    for (int k = 0; k < ACCEPT_BURST; k++) {
        int fd = -1;
        loomResult_t res = loom_socket_accept(rt->listen_fd, &fd);
        if (res == loomInProgress) {
            if (pend_evict(rt, "evicted to free a descriptor (process out of files)"))
                continue;
            if (!rt->fd_warned)
                LOOM_WARN("bootstrap root: out of file descriptors with %d connections pending; "
                          "accepting again every %d ms",
                          rt->npend, EMFILE_PAUSE_MS);
            rt->fd_warned = 1;
            rt->accept_again_ns = loom_deadline_ms(EMFILE_PAUSE_MS);
            return loomSuccess;
        }
        if (res != loomSuccess)
            return res;
        if (fd < 0)
            return loomSuccess;
        if (rt->npend == MAX_PENDING &&
            !pend_evict(rt, "evicted by a newer connection (too many unproven ones)")) {
            LOOM_STRAY_REFUSE(&rt->strays, fd, rt->npend);
            continue;
        }
        pending_t *p = &rt->pend[rt->npend];
        memset(p, 0, sizeof(*p));
        p->fd = fd;
        p->deadline_ns = loom_deadline_ms(HS_MS);
        if (loom_socket_tune(fd, 0) != loomSuccess) {
            close(fd); /* WARNed by the socket layer; this connection only */
            continue;
        }
        res = loom_handshake_init(&p->hs, fd, rt->secret, LOOM_BS_ROLE, 1);
        if (res != loomSuccess) {
            close(fd);
            return res;
        }
        p->hs.quiet = 1;
        rt->npend++;
        int gone = 0;
        LOOM_CHECK(pend_step(rt, rt->npend - 1, &gone)); /* sends the challenge */
    }
    return loomSuccess;
}

/* Drops pending connections past their deadline. */
static void root_expire(root_t *rt, uint64_t now)
{
    char peer[96], why[96];
    for (int i = 0; i < rt->npend;) {
        pending_t *p = &rt->pend[i];
        if (now < p->deadline_ns) {
            i++;
        } else if (!p->proven) {
            snprintf(why, sizeof(why), "no proof of the job secret within %d ms", HS_MS);
            pend_stray(rt, i, why);
        } else {
            LOOM_WARN("bootstrap root: dropped a connection from %s: it proved the job secret "
                      "but sent no hello within %d ms (%zu of %d bytes)",
                      loom_socket_peer_str(p->fd, peer, sizeof(peer)), HS_MS, p->have,
                      LOOM_BS_HELLO_BYTES);
            pend_remove(rt, i);
        }
    }
}

/* One poll round. */
static loomResult_t root_poll(root_t *rt, uint64_t deadline)
{
    struct pollfd pfd[MAX_PENDING + 1];
    uint64_t now = loom_now_ns(), wake = deadline;
    int n = 0, listening = now >= rt->accept_again_ns;
    for (int i = 0; i < rt->npend; i++) {
        pending_t *p = &rt->pend[i];
        pfd[n].fd = p->fd;
        pfd[n].events = p->proven ? POLLIN : loom_handshake_events(&p->hs);
        pfd[n++].revents = 0;
        if (p->deadline_ns < wake)
            wake = p->deadline_ns;
    }
    if (listening) {
        pfd[n].fd = rt->listen_fd;
        pfd[n].events = POLLIN;
        pfd[n++].revents = 0;
    } else if (rt->accept_again_ns < wake) {
        wake = rt->accept_again_ns;
    }
    int ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
    int rc = poll(pfd, (nfds_t)n, ms > 1000 ? 1000 : ms);
    if (rc < 0 && errno != EINTR) {
        LOOM_WARN("bootstrap root: poll over %d sockets failed: %s", n, strerror(errno));
        return loomSystemError;
    }
    if (rc <= 0) {
        root_expire(rt, loom_now_ns());
        return loomSuccess;
    }
    int npolled = rt->npend;
    for (int i = 0; i < npolled; i++)
        rt->pend[i].revents = pfd[i].revents;
    /* In accept order, so that a hello that arrived first is decided first. */
    for (int i = 0; i < rt->npend;) {
        int gone = 0;
        if (rt->pend[i].revents == 0) {
            i++;
            continue;
        }
        LOOM_CHECK(pend_step(rt, i, &gone));
        if (!gone)
            rt->pend[i++].revents = 0;
    }
    root_expire(rt, loom_now_ns());
    if (listening && (pfd[n - 1].revents & POLLIN) && (rt->nranks == 0 || rt->arrived < rt->nranks))
        LOOM_CHECK(root_accept(rt));
    return loomSuccess;
}

/* Waits for every rank. Returns Success when all arrived; otherwise the ranks
 * that did arrive are told why (and which ranks never did). */
static loomResult_t root_gather(root_t *rt)
{
    uint64_t deadline = loom_deadline_ms(rt->timeout_ms);
    loomResult_t res = loomSuccess;
    while (rt->nranks == 0 || rt->arrived < rt->nranks) {
        if (loom_now_ns() >= deadline) {
            res = loomTimeout;
            break;
        }
        res = root_poll(rt, deadline);
        if (res != loomSuccess)
            break;
    }
    /* Late or idle strays: nothing more is accepted, so close them now. */
    while (rt->npend > 0) {
        if (rt->pend[0].proven)
            pend_remove(rt, 0);
        else
            pend_stray(rt, 0, "still unproven when the rendezvous ended");
    }
    close(rt->listen_fd);
    rt->listen_fd = -1;
    loom_stray_summary(&rt->strays);
    if (res == loomSuccess)
        return loomSuccess;
    char msg[512];
    if (res != loomTimeout) {
        snprintf(msg, sizeof(msg), "the bootstrap root failed (%s)", loomGetErrorString(res));
    } else if (rt->nranks == 0) {
        snprintf(msg, sizeof(msg), "no rank arrived at the rendezvous within %lld ms",
                 (long long)rt->timeout_ms);
    } else {
        int o =
            snprintf(msg, sizeof(msg), "ranks that never arrived at the rendezvous within %lld ms:",
                     (long long)rt->timeout_ms);
        for (int r = 0; r < rt->nranks && o < (int)sizeof(msg) - 16; r++)
            if (rt->fds[r] < 0)
                o += snprintf(msg + o, sizeof(msg) - (size_t)o, " %d", r);
    }
    LOOM_WARN("bootstrap root: %s", msg);
    root_fail_all(rt, res, msg);
    return res;
}

// ---- root: serve --------------------------------------------------------------

/* Serves all-gather rounds until every rank says BYE or one fails. */
static void root_serve(root_t *rt)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    char msg[320], why[256];
    int nranks = rt->nranks;
    for (int r = 0; r < nranks; r++)
        (void)root_send_reply(rt->fds[r], loomSuccess, NULL, 0, loom_deadline_ms(rt->timeout_ms));
    for (;;) {
        loom_bs_req_t first = {0, 0}, q = {0, 0};
        for (int r = 0; r < nranks; r++) {
            uint8_t qb[LOOM_BS_REQ_BYTES];
            uint64_t deadline = loom_deadline_ms(rt->timeout_ms);
            loomResult_t res = loom_socket_recv_all(rt->fds[r], qb, sizeof(qb), deadline);
            if (res == loomSuccess &&
                loom_bs_req_decode(qb, sizeof(qb), nranks, r == 0 ? NULL : &first, &q, why,
                                   sizeof(why)) != loomSuccess) {
                snprintf(msg, sizeof(msg), "rank %d broke the bootstrap protocol: %s", r, why);
                LOOM_WARN("bootstrap root: %s", msg);
                root_fail_all(rt, loomInvalidUsage, msg);
                goto out;
            }
            if (res == loomSuccess && r == 0) {
                first = q;
                size_t need = (size_t)q.len * (size_t)nranks; /* bounded by the decoder */
                if (q.type == LOOM_BS_REQ_ALLGATHER && need > cap) {
                    uint8_t *nb = realloc(buf, need);
                    if (nb == NULL) {
                        LOOM_WARN("bootstrap root: out of memory for a %zu-byte all-gather", need);
                        root_fail_all(rt, loomSystemError, "bootstrap root out of memory");
                        goto out;
                    }
                    buf = nb;
                    cap = need;
                }
            }
            if (res == loomSuccess && q.type == LOOM_BS_REQ_ALLGATHER && q.len > 0)
                res = loom_socket_recv_all(rt->fds[r], buf + (size_t)r * q.len, q.len, deadline);
            if (res != loomSuccess) {
                snprintf(msg, sizeof(msg),
                         "rank %d left the rendezvous during communicator setup (%s)", r,
                         loomGetErrorString(res));
                LOOM_WARN("bootstrap root: %s", msg);
                close(rt->fds[r]);
                rt->fds[r] = -1;
                root_fail_all(rt, loomRemoteError, msg);
                goto out;
            }
        }
        if (first.type == LOOM_BS_REQ_BYE)
            break;
        size_t total = (size_t)first.len * (size_t)nranks;
        for (int r = 0; r < nranks; r++)
            (void)root_send_reply(rt->fds[r], loomSuccess, buf, total,
                                  loom_deadline_ms(rt->timeout_ms));
    }
out:
    free(buf);
}

static void *root_main(void *arg)
{
    root_t *rt = arg;
    if (root_gather(rt) == loomSuccess)
        root_serve(rt);
    root_free(rt);
    return NULL;
}

loomResult_t loom_bootstrap_root_start(int listen_fd, const uint8_t secret[LOOM_SECRET_BYTES],
                                       int64_t timeout_ms)
{
    return loom_bootstrap_root_start_shrink(listen_fd, secret, timeout_ms, 0);
}

loomResult_t loom_bootstrap_root_start_shrink(int listen_fd,
                                              const uint8_t secret[LOOM_SECRET_BYTES],
                                              int64_t timeout_ms, int quiet_probes)
{
    root_t *rt = calloc(1, sizeof(*rt));
    if (rt == NULL) {
        LOOM_WARN("out of memory starting the bootstrap root (%zu bytes)", sizeof(*rt));
        close(listen_fd);
        return loomSystemError;
    }
    rt->listen_fd = listen_fd;
    memcpy(rt->secret, secret, LOOM_SECRET_BYTES);
    rt->timeout_ms = timeout_ms;
    rt->quiet_probes = quiet_probes;
    loom_stray_init(&rt->strays, "bootstrap root", LOOM_LOG_BOOTSTRAP);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int ret = pthread_create(&t, &attr, root_main, rt);
    pthread_attr_destroy(&attr);
    if (ret != 0) {
        LOOM_WARN("pthread_create for the bootstrap root failed: %s", strerror(ret));
        root_free(rt);
        return loomSystemError;
    }
    return loomSuccess;
}

// ---- rank side --------------------------------------------------------------

static loomResult_t read_reply(loom_bootstrap_t *bs, void *out, size_t expect, const char *what)
{
    uint8_t hdr[LOOM_BS_REPLY_BYTES];
    uint64_t deadline = loom_deadline_ms(bs->timeout_ms);
    loomResult_t res = loom_socket_recv_all(bs->fd, hdr, sizeof(hdr), deadline);
    if (res != loomSuccess) {
        LOOM_WARN("rank %d: lost the bootstrap root while waiting for %s (%s)", bs->rank, what,
                  loomGetErrorString(res));
        return res == loomTimeout ? loomTimeout : loomRemoteError;
    }
    loom_bs_reply_t r = {0, 0};
    char why[128];
    res = loom_bs_reply_decode(hdr, sizeof(hdr), expect, &r, why, sizeof(why));
    if (res != loomSuccess && r.status != loomSuccess) {
        char msg[LOOM_BS_TEXT_MAX] = "";
        size_t n = (size_t)r.len; /* bounded by the decoder */
        if (n > 0 && loom_socket_recv_all(bs->fd, msg, n, deadline) != loomSuccess)
            n = 0;
        msg[n] = '\0';
        LOOM_WARN("rank %d: rendezvous failed during %s: %s", bs->rank, what,
                  msg[0] ? msg : "(no reason given)");
        return res;
    }
    if (res != loomSuccess) {
        LOOM_WARN("rank %d: bootstrap root broke protocol during %s: %s", bs->rank, what, why);
        return res;
    }
    res = expect ? loom_socket_recv_all(bs->fd, out, expect, deadline) : loomSuccess;
    if (res != loomSuccess) { /* the root left between the header and its data */
        LOOM_WARN("rank %d: lost the bootstrap root while waiting for %s (%s, after the reply's "
                  "header)",
                  bs->rank, what, loomGetErrorString(res));
        return res == loomTimeout ? loomTimeout : loomRemoteError;
    }
    return loomSuccess;
}

/* A TCP connection to the root, retrying refused connects (the root may not
 * listen yet: rank 0 of an env launch starts it) until deadline. */
static loomResult_t join_connect(const loom_id_t *id, int rank, uint64_t deadline,
                                 int64_t timeout_ms, const char *addr, int *fd_p)
{
    int fd = -1, last_errno = 0;
    uint64_t backoff_us = 1000;
    for (;;) {
        int done = 0, err = 0;
        loomResult_t res = loom_socket_connect_start(&id->root, &fd);
        while (res == loomSuccess && !done && loom_now_ns() < deadline) {
            res = loom_socket_connect_poll(fd, &done, &err);
            if (res == loomSuccess && !done) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                poll(&p, 1, 10);
            }
        }
        if (res == loomSuccess && done) {
            /* TCP_NODELAY as on the root's side: a request is a header and its data in two
             * sends, and with Nagle's rule the second waits for the root's delayed ACK of the
             * first (40 ms on Linux), twice per communicator created. */
            res = loom_socket_tune(fd, 0);
        }
        if (res == loomSuccess && done) {
            *fd_p = fd;
            return loomSuccess;
        }
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
}

/* The handshake as connector. *retry_p = 1 when the root closed the connection
 * before the end without refusing the proof: it sheds load that way, and a
 * new connection is worth trying. */
static loomResult_t join_handshake(int fd, const loom_id_t *id, int rank, uint64_t deadline,
                                   const char *addr, int *retry_p)
{
    loom_handshake_t hs;
    *retry_p = 0;
    loomResult_t res = loom_handshake_init(&hs, fd, id->secret, LOOM_BS_ROLE, 0);
    hs.quiet = 1;
    while (res == loomSuccess) {
        int done = 0;
        res = loom_handshake_step(&hs, &done);
        if (res != loomSuccess || done)
            break;
        uint64_t now = loom_now_ns();
        if (now >= deadline) {
            LOOM_WARN("rank %d: handshake with the rendezvous at %s timed out", rank, addr);
            res = loomTimeout;
            break;
        }
        uint64_t left_ms = (deadline - now + 999999) / 1000000;
        struct pollfd pfd = {.fd = fd, .events = loom_handshake_events(&hs)};
        if (poll(&pfd, 1, left_ms > 1000 ? 1000 : (int)left_ms) < 0 && errno != EINTR) {
            LOOM_WARN("rank %d: poll during the handshake with %s failed: %s", rank, addr,
                      strerror(errno));
            res = loomSystemError;
        }
    }
    if (res != loomSuccess && hs.fail == LOOM_HS_FAIL_CLOSED) {
        LOOM_INFO(LOOM_LOG_BOOTSTRAP, "rank %d: %s; connecting again", rank, hs.why);
        *retry_p = 1;
    } else if (res != loomSuccess && hs.fail != LOOM_HS_FAIL_NONE) {
        LOOM_WARN("rank %d: handshake with the rendezvous at %s failed: %s", rank, addr, hs.why);
    }
    loom_handshake_clear(&hs);
    return res;
}

loomResult_t loom_bootstrap_join(const loom_id_t *id, int rank, int nranks, int64_t timeout_ms,
                                 loom_bootstrap_t **bs_p)
{
    uint64_t deadline = loom_deadline_ms(timeout_ms);
    char addr[96];
    loom_sockaddr_str(&id->root, addr, sizeof(addr));
    int fd = -1;
    uint64_t backoff_us = 1000;
    for (;;) {
        LOOM_CHECK(join_connect(id, rank, deadline, timeout_ms, addr, &fd));
        int retry = 0;
        loomResult_t res = join_handshake(fd, id, rank, deadline, addr, &retry);
        if (res == loomSuccess)
            break;
        close(fd);
        if (!retry)
            return res;
        if (loom_now_ns() + backoff_us * 1000 >= deadline) {
            LOOM_WARN("rank %d: the rendezvous at %s kept closing the connection during the "
                      "handshake for %lld ms",
                      rank, addr, (long long)timeout_ms);
            return loomTimeout;
        }
        usleep((useconds_t)backoff_us);
        if (backoff_us < 100000)
            backoff_us *= 2;
    }
    loom_bs_hello_t h = {
        .magic = LOOM_BS_HELLO_MAGIC, .rank = rank, .nranks = nranks, .pid = (uint32_t)getpid()};
    uint8_t hb[LOOM_BS_HELLO_BYTES];
    loom_bs_hello_encode(&h, hb);
    loomResult_t res = loom_socket_send_all(fd, hb, sizeof(hb), deadline);
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
    /* The root's verdict (which ranks never arrived) is due at its own deadline,
     * which is this one: wait REPLY_MS longer, so that it is what a rank reports. */
    bs->timeout_ms = timeout_ms + REPLY_MS;
    res = read_reply(bs, NULL, 0, "all ranks to arrive");
    bs->timeout_ms = timeout_ms;
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

loomResult_t loom_bootstrap_local_addr(const loom_bootstrap_t *bs, loom_sockaddr_t *addr_p)
{
    socklen_t len = sizeof(*addr_p);
    memset(addr_p, 0, sizeof(*addr_p));
    if (getsockname(bs->fd, &addr_p->sa, &len) != 0) {
        LOOM_WARN("getsockname on the rendezvous connection: %s", strerror(errno));
        return loomSystemError;
    }
    if (addr_p->sa.sa_family == AF_INET6)
        addr_p->sin6.sin6_port = 0;
    else
        addr_p->sin.sin_port = 0;
    return loomSuccess;
}

loomResult_t loom_bootstrap_allgather(loom_bootstrap_t *bs, const void *data, size_t len, void *out)
{
    if (len > LOOM_BOOTSTRAP_MAX_PAYLOAD ||
        (uint64_t)len * (uint64_t)bs->nranks > LOOM_BOOTSTRAP_MAX_TOTAL) {
        LOOM_WARN("bootstrap all-gather of %zu bytes from %d ranks exceeds the limits (%u bytes "
                  "per rank, %llu in all)",
                  len, bs->nranks, LOOM_BOOTSTRAP_MAX_PAYLOAD,
                  (unsigned long long)LOOM_BOOTSTRAP_MAX_TOTAL);
        return loomInternalError;
    }
    loom_bs_req_t q = {.type = LOOM_BS_REQ_ALLGATHER, .len = (uint32_t)len};
    uint8_t qb[LOOM_BS_REQ_BYTES];
    loom_bs_req_encode(&q, qb);
    uint64_t deadline = loom_deadline_ms(bs->timeout_ms);
    LOOM_CHECK(loom_socket_send_all(bs->fd, qb, sizeof(qb), deadline));
    if (len > 0)
        LOOM_CHECK(loom_socket_send_all(bs->fd, data, len, deadline));
    return read_reply(bs, out, len * (size_t)bs->nranks, "an all-gather");
}

loomResult_t loom_bootstrap_leave(loom_bootstrap_t *bs)
{
    if (bs == NULL)
        return loomSuccess;
    loom_bs_req_t q = {.type = LOOM_BS_REQ_BYE, .len = 0};
    uint8_t qb[LOOM_BS_REQ_BYTES];
    loom_bs_req_encode(&q, qb);
    loomResult_t res = loom_socket_send_all(bs->fd, qb, sizeof(qb), loom_deadline_ms(REPLY_MS));
    close(bs->fd);
    free(bs);
    return res;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * secure_conn.c - connection setup behind a proof of the job secret, shared
 * by the tcp and ucx transports (secure_conn.h): the listener (accept,
 * eviction, deadlines, the stray log), the connector (connect with retries),
 * both ends of the non-blocking handshake, and the moving of the messages
 * after it. It knows no message's layout: the transport's
 * loom_secure_msg_fn_t reads and writes them. Never blocks.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "secure_conn.h"
#include "timer.h"

/* The life of a connection (the transport's parts in brackets):
 *   connector: TCP connect (refusals and resets retried every RETRY_NS: the
 *              peer may not listen yet) -> handshake (secret.c, the
 *              transport's role) -> send [its hello] -> [more messages].
 *   acceptor:  accept -> handshake -> receive [the hello: hello_bytes, grown
 *              as its header says] -> [more messages].
 * Nothing from an accepted socket reaches the transport before the handshake
 * proved the secret. A connection that fails before the proof is a stray:
 * closed and logged through the listener's loom_stray_log_t (one WARN, then
 * INFO and a count at close), so a flood cannot flood the log; a proven
 * peer's failures are WARNed. At most LOOM_SECURE_MAX_PENDING connections are
 * set up at once: a new one then evicts the oldest unproven one (one that has
 * sent nothing first), or with evict = 0 waits in the kernel's backlog. Out of
 * descriptors, an evicting listener evicts too. A connector whose connection
 * the listener closed during the handshake without refusing its proof
 * connects again (it was evicted); one told REFUSED (wrong secret) fails. */

#define RETRY_NS     1000000ull
#define ACCEPT_BURST 64   /* accepts per accept call, so held connections progress */
#define IO_FAILED    (-1) /* msgs_step: the socket failed, the result says how */
#define STRAY        (-2) /* accept_step: drop as a stray, hs.why says why */

typedef struct {
    uint32_t magic;
    uint32_t pad;
    loom_sockaddr_t addr;
} handle_t;

_Static_assert(sizeof(handle_t) == LOOM_SECURE_HANDLE_BYTES, "listen handle layout");

static int aborted(const loom_secure_cfg_t *cfg)
{
    return cfg->abort_flag != NULL && *cfg->abort_flag != 0;
}

// ---- connections and messages ---------------------------------------------

static void conn_init(loom_secure_conn_t *c)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->peer = -1;
}

void loom_secure_conn_clear(loom_secure_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    loom_handshake_clear(&c->hs);
    free(c->msg);
    free(c->kept);
    conn_init(c);
}

void loom_secure_conn_free(loom_secure_conn_t *c)
{
    if (c == NULL)
        return;
    loom_secure_conn_clear(c);
    free(c);
}

loomResult_t loom_secure_msg_new(loom_secure_conn_t *c, size_t nbytes, uint8_t **buf_p)
{
    uint8_t *m = malloc(nbytes);
    if (m == NULL) {
        LOOM_WARN("out of memory for a %zu-byte connection setup message", nbytes);
        return loomSystemError;
    }
    free(c->msg);
    c->msg = m;
    c->msg_have = 0;
    c->msg_want = nbytes;
    if (buf_p != NULL)
        *buf_p = m;
    return loomSuccess;
}

loomResult_t loom_secure_msg_grow(loom_secure_conn_t *c, size_t nbytes)
{
    uint8_t *m = realloc(c->msg, nbytes);
    if (m == NULL) {
        LOOM_WARN("out of memory for a %zu-byte connection setup message", nbytes);
        return loomSystemError;
    }
    c->msg = m;
    c->msg_want = nbytes;
    return loomSuccess;
}

loomResult_t loom_secure_conn_poll(const loom_secure_conn_t *c, loom_pollset_t *ps)
{
    if (c->fd < 0)
        return loomSuccess;
    const short ev = c->stage == LOOM_SECURE_HANDSHAKE ? loom_handshake_events(&c->hs)
                     : c->stage == LOOM_SECURE_RECV    ? POLLIN
                                                       : POLLOUT;
    return loom_pollset_add(ps, c->fd, ev);
}

/* Moves what the socket takes of c's message; *done_p = 1 once all of it moved. */
static loomResult_t msg_move(loom_secure_conn_t *c, int *done_p)
{
    *done_p = 0;
    while (c->msg_have < c->msg_want) {
        uint8_t *p = c->msg + c->msg_have;
        const size_t left = c->msg_want - c->msg_have;
        size_t n = 0;
        loomResult_t res = c->stage == LOOM_SECURE_SEND ? loom_socket_send_some(c->fd, p, left, &n)
                                                        : loom_socket_recv_some(c->fd, p, left, &n);
        if (res != loomSuccess)
            return res;
        if (n == 0)
            return loomSuccess;
        c->msg_have += n;
    }
    *done_p = 1;
    return loomSuccess;
}

/* Moves c's messages as far as the socket allows, on_msg (NULL: UP) deciding
 * at each boundary: *verdict_p = MORE (waiting for the socket), on_msg's
 * CLOSE or UP, or IO_FAILED with the socket's error returned (not logged,
 * unless by the socket layer). */
static loomResult_t msgs_step(loom_secure_conn_t *c, loom_secure_msg_fn_t on_msg, void *arg,
                              int *verdict_p)
{
    for (;;) {
        int done = 0;
        loomResult_t res = msg_move(c, &done);
        if (res != loomSuccess) {
            *verdict_p = IO_FAILED;
            return res;
        }
        *verdict_p = LOOM_SECURE_MORE;
        if (!done)
            return loomSuccess;
        if (on_msg == NULL) {
            *verdict_p = LOOM_SECURE_UP;
            return loomSuccess;
        }
        LOOM_CHECK(on_msg(arg, c, verdict_p));
        if (*verdict_p != LOOM_SECURE_MORE || c->msg_have == c->msg_want)
            return loomSuccess;
    }
}

// ---- connector -------------------------------------------------------------

loomResult_t loom_secure_handle_decode(const loom_secure_cfg_t *cfg, const void *handle, int peer,
                                       loom_sockaddr_t *addr_p)
{
    handle_t h;
    memcpy(&h, handle, sizeof(h));
    const int fam = h.addr.sa.sa_family;
    if (h.magic != cfg->handle_magic || (fam != AF_INET && fam != AF_INET6)) {
        LOOM_WARN("%s: rank %d: the handle of rank %d is not a %s handle (magic 0x%08x)", cfg->name,
                  cfg->rank, peer, cfg->name, h.magic);
        return loomInvalidArgument;
    }
    *addr_p = h.addr;
    return loomSuccess;
}

void loom_secure_connect_init(loom_secure_conn_t *c, const loom_sockaddr_t *addr, int peer,
                              uint64_t deadline_ns)
{
    conn_init(c);
    c->addr = *addr;
    c->peer = peer;
    c->deadline_ns = deadline_ns;
    c->stage = LOOM_SECURE_START;
}

static int retryable(int e)
{
    return e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == EHOSTUNREACH ||
           e == ENETUNREACH || e == ECONNABORTED;
}

/* Back to START after a failed attempt that is worth repeating. */
static void connect_retry(loom_secure_conn_t *c, int err)
{
    loom_handshake_clear(&c->hs);
    close(c->fd);
    c->fd = -1;
    c->last_errno = err;
    c->retry_at_ns = loom_now_ns() + RETRY_NS;
    c->stage = LOOM_SECURE_START;
}

/* CONNECTING: on to the handshake once the TCP connect is through. */
static loomResult_t connect_poll(loom_secure_conn_t *c, const loom_secure_cfg_t *cfg)
{
    char buf[96];
    int done = 0, err = 0;
    if (loom_socket_connect_poll(c->fd, &done, &err) != loomSuccess) {
        if (err == 0)
            return loomSystemError; /* WARNed by the socket layer */
        if (!retryable(err)) {
            LOOM_WARN("%s: rank %d cannot connect to rank %d at %s: %s", cfg->name, cfg->rank,
                      c->peer, loom_sockaddr_str(&c->addr, buf, sizeof(buf)), strerror(err));
            return loomSystemError;
        }
        connect_retry(c, err);
        return loomSuccess;
    }
    if (!done)
        return loomSuccess;
    LOOM_CHECK(loom_socket_tune(c->fd, cfg->sockbuf));
    LOOM_CHECK(loom_handshake_init(&c->hs, c->fd, cfg->secret, cfg->role, 0));
    c->hs.quiet = 1;
    c->stage = LOOM_SECURE_HANDSHAKE;
    return loomSuccess;
}

/* HANDSHAKE: on to the first message once both ends are proven. */
static loomResult_t connect_prove(loom_secure_conn_t *c, const loom_secure_cfg_t *cfg)
{
    char buf[96];
    int done = 0;
    loomResult_t res = loom_handshake_step(&c->hs, &done);
    if (res != loomSuccess && c->hs.fail == LOOM_HS_FAIL_CLOSED) {
        /* Evicted by a busy listener (a refusal would say so): connect again. */
        LOOM_INFO(cfg->subsys, "%s: rank %d: %s; connecting to rank %d again", cfg->name, cfg->rank,
                  c->hs.why, c->peer);
        connect_retry(c, ECONNRESET);
        return loomSuccess;
    }
    if (res != loomSuccess) {
        LOOM_WARN("%s: rank %d: handshake with rank %d at %s failed: %s", cfg->name, cfg->rank,
                  c->peer, loom_sockaddr_str(&c->addr, buf, sizeof(buf)), c->hs.why);
        return res;
    }
    if (done) {
        loom_handshake_clear(&c->hs);
        c->stage = LOOM_SECURE_SEND;
    }
    return loomSuccess;
}

loomResult_t loom_secure_connect_step(loom_secure_conn_t *c, const loom_secure_cfg_t *cfg,
                                      loom_secure_msg_fn_t on_msg, void *arg, int *up_p)
{
    char buf[96];
    *up_p = 0;
    if (aborted(cfg)) {
        LOOM_INFO(cfg->subsys, "%s: rank %d: connect to rank %d aborted", cfg->name, cfg->rank,
                  c->peer);
        return loomRemoteError;
    }
    for (;;) {
        const int stage = c->stage;
        if (stage == LOOM_SECURE_START && loom_now_ns() < c->retry_at_ns)
            return loomSuccess;
        if (stage == LOOM_SECURE_START) {
            LOOM_CHECK(loom_socket_connect_start(&c->addr, &c->fd));
            c->stage = LOOM_SECURE_CONNECTING;
        } else if (stage == LOOM_SECURE_CONNECTING) {
            LOOM_CHECK(connect_poll(c, cfg));
        } else if (stage == LOOM_SECURE_HANDSHAKE) {
            LOOM_CHECK(connect_prove(c, cfg));
        } else {
            int verdict = LOOM_SECURE_MORE;
            loomResult_t res = msgs_step(c, on_msg, arg, &verdict);
            if (verdict == IO_FAILED && res == loomRemoteError)
                LOOM_WARN("%s: rank %d: rank %d at %s closed the connection %s", cfg->name,
                          cfg->rank, c->peer, loom_sockaddr_str(&c->addr, buf, sizeof(buf)),
                          c->stage == LOOM_SECURE_SEND ? "before taking the hello"
                                                       : "after the handshake instead of replying");
            LOOM_CHECK(res);
            *up_p = verdict == LOOM_SECURE_UP;
            return verdict == LOOM_SECURE_CLOSE ? loomRemoteError : loomSuccess;
        }
        if (c->stage == stage)
            return loomSuccess; /* waiting for the socket */
    }
}

// ---- listener --------------------------------------------------------------

loomResult_t loom_secure_listen_open(loom_secure_listen_t *l, const loom_secure_cfg_t *cfg,
                                     const loom_secure_accept_t *acc, loom_sockaddr_t *addr,
                                     void *handle, size_t handle_len)
{
    LOOM_ASSERT(handle_len >= sizeof(handle_t));
    memset(l, 0, sizeof(*l));
    if (addr->sa.sa_family == AF_INET6)
        addr->sin6.sin6_port = 0;
    else
        addr->sin.sin_port = 0;
    LOOM_CHECK(loom_socket_listen(addr, &l->fd));
    l->cfg = cfg;
    l->acc = *acc;
    snprintf(l->who, sizeof(l->who), "%s: rank %d", cfg->name, cfg->rank);
    loom_stray_init(&l->strays, l->who, cfg->subsys);
    handle_t h;
    memset(&h, 0, sizeof(h));
    h.magic = cfg->handle_magic;
    h.addr = *addr;
    memset(handle, 0, handle_len);
    memcpy(handle, &h, sizeof(h));
    return loomSuccess;
}

/* Unlinks c (prev: the one before it, or NULL) and frees it. */
static void pending_drop(loom_secure_listen_t *l, loom_secure_conn_t *c, loom_secure_conn_t *prev)
{
    if (prev != NULL)
        prev->next = c->next;
    else
        l->pending = c->next;
    l->npending--;
    loom_secure_conn_free(c);
}

/* Drops an unproven connection, logged through the stray counter. A cause
 * from the handshake (hs.why) already names the peer. */
static void pending_stray(loom_secure_listen_t *l, loom_secure_conn_t *c, loom_secure_conn_t *prev,
                          const char *cause)
{
    char peer[96], why[256];
    if (cause == c->hs.why)
        snprintf(why, sizeof(why), "dropped a connection: %s", cause);
    else
        snprintf(why, sizeof(why), "dropped a connection from %s: %s",
                 loom_socket_peer_str(c->fd, peer, sizeof(peer)), cause);
    LOOM_STRAY_NOTE(&l->strays, why);
    pending_drop(l, c, prev);
}

/* Drops c, past its deadline: a stray if it is still unproven. */
static void pending_late(loom_secure_listen_t *l, loom_secure_conn_t *c, loom_secure_conn_t *prev)
{
    char buf[96];
    const long long ms = (long long)l->cfg->timeout_ms;
    if (c->stage == LOOM_SECURE_HANDSHAKE) {
        snprintf(buf, sizeof(buf), "no proof of the job secret within %lld ms", ms);
        pending_stray(l, c, prev, buf);
        return;
    }
    LOOM_WARN("%s dropped a connection from %s: it proved the job secret but %s within %lld ms",
              l->who, loom_socket_peer_str(c->fd, buf, sizeof(buf)),
              c->stage == LOOM_SECURE_RECV ? "did not finish its hello" : "did not take the reply",
              ms);
    pending_drop(l, c, prev);
}

/* Evicts the oldest unproven connection, preferring one that sent nothing.
 * Returns 0 if there is none. */
static int pending_evict(loom_secure_listen_t *l, const char *cause)
{
    loom_secure_conn_t *pick = NULL, *pick_prev = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        loom_secure_conn_t *prev = NULL;
        for (loom_secure_conn_t *c = l->pending; c != NULL; prev = c, c = c->next) {
            if (c->stage != LOOM_SECURE_HANDSHAKE ||
                (pass == 0 && loom_handshake_received(&c->hs) != 0))
                continue;
            if (pick == NULL || c->accepted_ns < pick->accepted_ns) {
                pick = c;
                pick_prev = prev;
            }
        }
    }
    if (pick == NULL)
        return 0;
    pending_stray(l, pick, pick_prev, cause);
    return 1;
}

/* Starts the handshake on an accepted socket; a socket that cannot be tuned
 * is closed (WARNed by the socket layer), the listener goes on. */
static loomResult_t pending_add(loom_secure_listen_t *l, int fd)
{
    const loom_secure_cfg_t *cfg = l->cfg;
    loom_secure_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        LOOM_WARN("%s: out of memory for an incoming connection (%zu bytes)", cfg->name,
                  sizeof(*c));
        return loomSystemError;
    }
    conn_init(c);
    c->fd = fd;
    c->stage = LOOM_SECURE_HANDSHAKE;
    c->accepted_ns = loom_now_ns();
    c->deadline_ns = loom_deadline_ms(cfg->timeout_ms);
    if (loom_socket_tune(fd, cfg->sockbuf) != loomSuccess) {
        loom_secure_conn_free(c);
        return loomSuccess;
    }
    loomResult_t res = loom_handshake_init(&c->hs, fd, cfg->secret, cfg->role, 1);
    if (res != loomSuccess) {
        loom_secure_conn_free(c);
        return res;
    }
    c->hs.quiet = 1;
    c->next = l->pending;
    l->pending = c;
    l->npending++;
    return loomSuccess;
}

static loomResult_t accept_new(loom_secure_listen_t *l)
{
    for (int k = 0; k < ACCEPT_BURST; k++) {
        if (!l->acc.evict && l->npending >= LOOM_SECURE_MAX_PENDING)
            return loomSuccess; /* the rest wait in the backlog */
        int fd = -1;
        loomResult_t res = loom_socket_accept(l->fd, &fd);
        if (res == loomInProgress) {
            if (l->acc.evict &&
                pending_evict(l, "evicted to free a descriptor (process out of files)"))
                continue;
            if (!l->fd_warned)
                LOOM_WARN("%s is out of file descriptors with %d connections being set up; new "
                          "connections wait in the backlog",
                          l->who, l->npending);
            l->fd_warned = 1;
            return loomSuccess;
        }
        if (res != loomSuccess)
            return res;
        if (fd < 0)
            return loomSuccess;
        if (l->npending >= LOOM_SECURE_MAX_PENDING &&
            !pending_evict(l, "evicted by a newer connection (too many unproven ones)")) {
            LOOM_STRAY_REFUSE(&l->strays, fd, l->npending);
            continue;
        }
        LOOM_CHECK(pending_add(l, fd));
    }
    return loomSuccess;
}

/* Advances one incoming connection: *verdict_p = MORE (keep it), CLOSE (drop
 * it, logged), UP, or STRAY (drop it as a stray, hs.why says why). */
static loomResult_t accept_step(loom_secure_listen_t *l, loom_secure_conn_t *c, int *verdict_p)
{
    char buf[96];
    *verdict_p = LOOM_SECURE_MORE;
    if (c->stage == LOOM_SECURE_HANDSHAKE) {
        int done = 0;
        if (loom_handshake_step(&c->hs, &done) != loomSuccess) {
            *verdict_p = STRAY;
            return loomSuccess;
        }
        if (!done)
            return loomSuccess;
        loom_handshake_clear(&c->hs);
        LOOM_CHECK(loom_secure_msg_new(c, l->acc.hello_bytes, NULL));
        c->stage = LOOM_SECURE_RECV;
    }
    loomResult_t res = msgs_step(c, l->acc.on_msg, l->acc.arg, verdict_p);
    if (*verdict_p != IO_FAILED)
        return res;
    if (res == loomRemoteError && c->stage == LOOM_SECURE_RECV)
        LOOM_WARN("%s: a connection from %s proved the job secret, then closed before its hello",
                  l->who, loom_socket_peer_str(c->fd, buf, sizeof(buf)));
    else if (res == loomRemoteError)
        LOOM_WARN("%s: rank %d closed the connection before taking the reply", l->who, c->peer);
    *verdict_p = LOOM_SECURE_CLOSE; /* this connection only */
    return loomSuccess;
}

loomResult_t loom_secure_listen_accept(loom_secure_listen_t *l, void **up_p, int *peer_p)
{
    *up_p = NULL;
    if (aborted(l->cfg)) {
        LOOM_INFO(l->cfg->subsys, "%s: accept aborted", l->who);
        return loomRemoteError;
    }
    l->accepting = 1;
    LOOM_CHECK(accept_new(l));
    const uint64_t now = loom_now_ns();
    loom_secure_conn_t *prev = NULL, *c = l->pending;
    while (c != NULL) {
        loom_secure_conn_t *next = c->next;
        int verdict = LOOM_SECURE_MORE;
        loomResult_t res = accept_step(l, c, &verdict);
        if (res != loomSuccess) {
            pending_drop(l, c, prev);
            return res;
        }
        if (verdict == STRAY) {
            pending_stray(l, c, prev, c->hs.why);
        } else if (verdict == LOOM_SECURE_MORE && now >= c->deadline_ns) {
            pending_late(l, c, prev);
        } else if (verdict == LOOM_SECURE_MORE) {
            prev = c;
        } else if (verdict == LOOM_SECURE_UP) {
            *up_p = c->up;
            *peer_p = c->peer;
            pending_drop(l, c, prev);
            return loomSuccess;
        } else {
            pending_drop(l, c, prev);
        }
        c = next;
    }
    return loomSuccess;
}

loomResult_t loom_secure_listen_poll(loom_secure_listen_t *l, loom_pollset_t *ps)
{
    if (!l->accepting)
        return loomSuccess;
    l->accepting = 0;
    if (l->acc.evict || l->npending < LOOM_SECURE_MAX_PENDING)
        LOOM_CHECK(loom_pollset_add(ps, l->fd, POLLIN));
    for (const loom_secure_conn_t *c = l->pending; c != NULL; c = c->next)
        LOOM_CHECK(loom_secure_conn_poll(c, ps));
    return loomSuccess;
}

loomResult_t loom_secure_listen_close(loom_secure_listen_t *l)
{
    while (l->pending != NULL) {
        if (l->pending->stage == LOOM_SECURE_HANDSHAKE)
            pending_stray(l, l->pending, NULL, "still unproven when the listener closed");
        else
            pending_drop(l, l->pending, NULL);
    }
    loom_stray_summary(&l->strays);
    if (close(l->fd) != 0) {
        LOOM_WARN("%s: close of the listening socket failed: %s", l->who, strerror(errno));
        return loomSystemError;
    }
    l->fd = -1;
    return loomSuccess;
}

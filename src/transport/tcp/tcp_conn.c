/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp_conn.c - connection setup of the tcp transport: the listener, the
 * non-blocking connect and accept (secret handshake, then the hello), and the
 * assembly of a peer's several sockets into one connection. Every socket of
 * a connection is set up and authenticated on its own, exactly like the
 * first. It moves no data after the hello (tcp.c does) and never blocks.
 * Called through the table in tcp.c, by p2p.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "tcp_conn.h"
#include "timer.h"

/* Connection setup, all non-blocking, driven by repeated connect()/accept():
 *   connector: for each of its nsocks sockets: TCP connect to the listener
 *              (ECONNREFUSED and friends are retried every RETRY_NS until the
 *              timeout: the peer may not listen yet) -> secret handshake
 *              (secret.c, role TCP) -> HELLO. The connection is up once every
 *              socket sent its hello.
 *   acceptor:  accept -> secret handshake -> read HELLO -> check it -> keep
 *              the socket in the peer's assembly; the connection is up once
 *              the assembly holds all the sockets the hellos announced.
 * HELLO, little-endian, one of:
 *   "LMTH" (12 bytes): u32 magic, i32 rank, i32 nranks. A one-socket connection.
 *   "LMTS" (20 bytes): the same three fields with magic "LMTS", then u16 socket
 *          index, u16 sockets in the connection (2..LOOM_TCP_MAX_SOCKS), u32
 *          striping piece in bytes. Every socket of a connection announces the
 *          same count and piece (the connector's LOOM_TCP_NSOCKS and
 *          LOOM_TCP_PIECE_BYTES), so the receive side needs no setting of its own.
 * Nothing from an accepted socket is parsed before the handshake proved the
 * secret; a socket failing any step is closed and the listener keeps serving
 * the others. Refusals of unproven connections go through the listener's
 * loom_stray_log_t (one WARN, then INFO and a count at close), so a flood
 * cannot flood the log; a proven peer's bad hello is WARNed. At most
 * MAX_HANDSHAKES unproven sockets are held: a new one evicts the oldest (one
 * that has sent nothing first), and out of descriptors the listener evicts
 * too. A connector whose socket the listener closed during the handshake
 * without refusing its proof connects that socket again (it was evicted); one
 * told REFUSED (wrong secret) fails at once. The connector's send connection
 * is then the acceptor's receive connection: data flows one way only. */

#define TCP_HANDLE_MAGIC       0x5054434cu /* "LCTP" */
#define TCP_HELLO_MAGIC        0x48544d4cu /* "LMTH" */
#define TCP_HELLO_STRIPE_MAGIC 0x53544d4cu /* "LMTS" */
#define TCP_HELLO_BYTES        12
#define TCP_HELLO_STRIPE_BYTES 20
#define TCP_HS_ROLE            0x20504354u /* "TCP ": the handshake role of data connections */
#define RETRY_NS               1000000ull
#define MAX_HANDSHAKES         256 /* unauthenticated sockets one listener holds at once */
#define ACCEPT_BURST           64  /* accepts per accept() call, so held sockets progress */

_Static_assert(TCP_HELLO_STRIPE_BYTES <= LOOM_TCP_HELLO_MAX, "hello buffer too small");

typedef struct {
    uint32_t magic;
    uint32_t pad;
    loom_sockaddr_t addr;
} tcp_handle_t;

_Static_assert(sizeof(tcp_handle_t) <= LOOM_TP_HANDLE_MAX, "tcp handle too large");

enum { ST_START, ST_CONNECTING, ST_HANDSHAKE, ST_HELLO };

static const char *addr_str(const loom_sockaddr_t *a, char *buf)
{
    return loom_sockaddr_str(a, buf, 96);
}

static int aborted(const tcp_ctx_t *ctx)
{
    return ctx->abort_flag != NULL && *ctx->abort_flag != 0;
}

static void put_le(uint8_t *p, uint32_t v, int bytes)
{
    for (int b = 0; b < bytes; b++)
        p[b] = (uint8_t)(v >> (8 * b));
}

static uint32_t get_le(const uint8_t *p, int bytes)
{
    uint32_t v = 0;
    for (int b = 0; b < bytes; b++)
        v |= (uint32_t)p[b] << (8 * b);
    return v;
}

static void setup_free(tcp_setup_t *st)
{
    if (st == NULL)
        return;
    if (st->fd >= 0)
        close(st->fd);
    loom_handshake_clear(&st->hs);
    free(st);
}

loomResult_t loom_tcp_pfd_add(tcp_ctx_t *ctx, size_t *n, int fd, short events)
{
    if (*n == ctx->pfds_cap) {
        size_t cap = ctx->pfds_cap ? 2 * ctx->pfds_cap : 64;
        struct pollfd *p = realloc(ctx->pfds, cap * sizeof(*p));
        if (p == NULL) {
            LOOM_WARN("tcp: out of memory for %zu poll entries", cap);
            return loomSystemError;
        }
        ctx->pfds = p;
        ctx->pfds_cap = cap;
    }
    ctx->pfds[*n].fd = fd;
    ctx->pfds[*n].events = events;
    ctx->pfds[*n].revents = 0;
    (*n)++;
    return loomSuccess;
}

// ---- listen -----------------------------------------------------------------

loomResult_t loom_tcp_listen(void *ctx_v, void *handle, void **listen_p)
{
    tcp_ctx_t *ctx = ctx_v;
    if (ctx->listen != NULL) {
        LOOM_WARN("tcp: rank %d called listen twice on one context", ctx->rank);
        return loomInvalidUsage;
    }
    tcp_listen_t *l = calloc(1, sizeof(*l));
    if (l != NULL)
        l->assembling = calloc((size_t)ctx->nranks, sizeof(*l->assembling));
    if (l == NULL || l->assembling == NULL) {
        LOOM_WARN("tcp: out of memory for a listener of %d ranks", ctx->nranks);
        free(l);
        return loomSystemError;
    }
    loom_sockaddr_t addr = ctx->addr;
    if (addr.sa.sa_family == AF_INET6)
        addr.sin6.sin6_port = 0;
    else
        addr.sin.sin_port = 0;
    loomResult_t res = loom_socket_listen(&addr, &l->fd);
    if (res != loomSuccess) {
        free(l->assembling);
        free(l);
        return res;
    }
    l->ctx = ctx;
    char who[64];
    snprintf(who, sizeof(who), "tcp: rank %d", ctx->rank);
    loom_stray_init(&l->strays, who, LOOM_LOG_TCP);
    ctx->listen = l;
    tcp_handle_t h;
    memset(&h, 0, sizeof(h));
    h.magic = TCP_HANDLE_MAGIC;
    h.addr = addr;
    memset(handle, 0, LOOM_TP_HANDLE_MAX);
    memcpy(handle, &h, sizeof(h));
    char buf[96];
    LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d listening on %s (%s)", ctx->rank, addr_str(&addr, buf),
              ctx->ifname);
    *listen_p = l;
    return loomSuccess;
}

// ---- connect ----------------------------------------------------------------

static int retryable(int e)
{
    return e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == EHOSTUNREACH ||
           e == ENETUNREACH || e == ECONNABORTED;
}

void loom_tcp_connect_drop(tcp_ctx_t *ctx, int peer)
{
    tcp_connecting_t *cn = ctx->connecting[peer];
    if (cn == NULL)
        return;
    for (int i = 0; i < LOOM_TCP_MAX_SOCKS; i++)
        setup_free(cn->socks[i]);
    free(cn);
    ctx->connecting[peer] = NULL;
}

/* The hello of socket st->index: the one-socket form when the connection has one. */
static void hello_encode(const tcp_ctx_t *ctx, tcp_setup_t *st)
{
    const int striped = ctx->nsocks > 1;
    put_le(st->hello, striped ? TCP_HELLO_STRIPE_MAGIC : TCP_HELLO_MAGIC, 4);
    put_le(st->hello + 4, (uint32_t)ctx->rank, 4);
    put_le(st->hello + 8, (uint32_t)ctx->nranks, 4);
    st->hello_want = TCP_HELLO_BYTES;
    if (striped) {
        put_le(st->hello + 12, (uint32_t)st->index, 2);
        put_le(st->hello + 14, (uint32_t)ctx->nsocks, 2);
        put_le(st->hello + 16, ctx->piece_bytes, 4);
        st->hello_want = TCP_HELLO_STRIPE_BYTES;
    }
    st->hello_have = 0;
}

/* One step of a connecting socket's state machine; *ready_p = 1 when its HELLO is out. */
static loomResult_t connect_step(tcp_ctx_t *ctx, tcp_setup_t *st, int *ready_p)
{
    char buf[96];
    *ready_p = 0;
    for (;;) {
        switch (st->stage) {
        case ST_START:
            if (loom_now_ns() < st->retry_at_ns)
                return loomSuccess;
            LOOM_CHECK(loom_socket_connect_start(&st->addr, &st->fd));
            st->stage = ST_CONNECTING;
            break;
        case ST_CONNECTING: {
            int done = 0, err = 0;
            if (loom_socket_connect_poll(st->fd, &done, &err) != loomSuccess) {
                if (err == 0)
                    return loomSystemError; /* WARNed by the socket layer */
                if (!retryable(err)) {
                    LOOM_WARN("tcp: rank %d cannot connect to rank %d at %s: %s", ctx->rank,
                              st->peer, addr_str(&st->addr, buf), strerror(err));
                    return loomSystemError;
                }
                close(st->fd);
                st->fd = -1;
                st->last_errno = err;
                st->retry_at_ns = loom_now_ns() + RETRY_NS;
                st->stage = ST_START;
                return loomSuccess;
            }
            if (!done)
                return loomSuccess;
            LOOM_CHECK(loom_socket_tune(st->fd, ctx->sockbuf));
            LOOM_CHECK(loom_handshake_init(&st->hs, st->fd, ctx->secret, TCP_HS_ROLE, 0));
            st->hs.quiet = 1;
            st->stage = ST_HANDSHAKE;
            break;
        }
        case ST_HANDSHAKE: {
            int done = 0;
            loomResult_t res = loom_handshake_step(&st->hs, &done);
            if (res != loomSuccess && st->hs.fail == LOOM_HS_FAIL_CLOSED) {
                /* Evicted by a busy listener (a refusal would say so): connect again. */
                LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d: %s; connecting to rank %d again", ctx->rank,
                          st->hs.why, st->peer);
                loom_handshake_clear(&st->hs);
                close(st->fd);
                st->fd = -1;
                st->last_errno = ECONNRESET;
                st->retry_at_ns = loom_now_ns() + RETRY_NS;
                st->stage = ST_START;
                return loomSuccess;
            }
            if (res != loomSuccess) {
                LOOM_WARN("tcp: rank %d: handshake with rank %d at %s failed: %s", ctx->rank,
                          st->peer, addr_str(&st->addr, buf), st->hs.why);
                return res;
            }
            if (!done)
                return loomSuccess;
            loom_handshake_clear(&st->hs);
            hello_encode(ctx, st);
            st->stage = ST_HELLO;
            break;
        }
        case ST_HELLO: {
            size_t n = 0;
            loomResult_t res = loom_socket_send_some(st->fd, st->hello + st->hello_have,
                                                     st->hello_want - st->hello_have, &n);
            if (res == loomRemoteError)
                LOOM_WARN("tcp: rank %d: rank %d at %s closed the connection during the hello",
                          ctx->rank, st->peer, addr_str(&st->addr, buf));
            if (res != loomSuccess)
                return res;
            st->hello_have += n;
            *ready_p = st->hello_have == st->hello_want;
            return loomSuccess;
        }
        }
    }
}

/* Starts a connect to peer: one setup per socket. */
static loomResult_t connect_begin(tcp_ctx_t *ctx, const void *handle, int peer)
{
    tcp_handle_t h;
    memcpy(&h, handle, sizeof(h));
    int fam = h.addr.sa.sa_family;
    if (h.magic != TCP_HANDLE_MAGIC || (fam != AF_INET && fam != AF_INET6)) {
        LOOM_WARN("tcp: rank %d got an invalid tcp handle from rank %d (magic 0x%08x)", ctx->rank,
                  peer, h.magic);
        return loomInvalidArgument;
    }
    tcp_connecting_t *cn = calloc(1, sizeof(*cn));
    if (cn == NULL) {
        LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*cn));
        return loomSystemError;
    }
    ctx->connecting[peer] = cn;
    const uint64_t deadline = loom_deadline_ms(ctx->timeout_ms);
    for (int i = 0; i < ctx->nsocks; i++) {
        tcp_setup_t *st = calloc(1, sizeof(*st));
        if (st == NULL) {
            LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer,
                      sizeof(*st));
            loom_tcp_connect_drop(ctx, peer);
            return loomSystemError;
        }
        st->fd = -1;
        st->peer = peer;
        st->index = i;
        st->addr = h.addr;
        st->stage = ST_START;
        st->deadline_ns = deadline;
        cn->socks[i] = st;
    }
    return loomSuccess;
}

loomResult_t loom_tcp_connect(void *ctx_v, const void *handle, int peer, void **send_comm_p)
{
    tcp_ctx_t *ctx = ctx_v;
    char buf[96];
    if (peer < 0 || peer >= ctx->nranks) {
        LOOM_WARN("tcp: rank %d asked to connect to rank %d of %d", ctx->rank, peer, ctx->nranks);
        return loomInvalidArgument;
    }
    if (ctx->send_up[peer]) {
        LOOM_WARN("tcp: rank %d is already connected to rank %d", ctx->rank, peer);
        return loomInvalidUsage;
    }
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d: connect to rank %d aborted", ctx->rank, peer);
        loom_tcp_connect_drop(ctx, peer);
        return loomRemoteError;
    }
    if (ctx->connecting[peer] == NULL)
        LOOM_CHECK(connect_begin(ctx, handle, peer));
    tcp_connecting_t *cn = ctx->connecting[peer];
    for (int i = 0; i < ctx->nsocks; i++) {
        if (cn->ready[i])
            continue;
        int ready = 0;
        loomResult_t res = connect_step(ctx, cn->socks[i], &ready);
        if (res != loomSuccess) {
            loom_tcp_connect_drop(ctx, peer);
            return res;
        }
        cn->ready[i] = (uint8_t)ready;
        cn->nready += ready;
    }
    if (cn->nready < ctx->nsocks) {
        const tcp_setup_t *st = cn->socks[0];
        if (loom_now_ns() >= st->deadline_ns) {
            for (int i = 0; i < ctx->nsocks; i++)
                if (!cn->ready[i]) {
                    st = cn->socks[i];
                    break;
                }
            LOOM_WARN("tcp: rank %d could not connect to rank %d at %s within %lld ms (socket %d "
                      "of %d: %s)",
                      ctx->rank, peer, addr_str(&st->addr, buf), (long long)ctx->timeout_ms,
                      st->index, ctx->nsocks,
                      st->stage == ST_START ? strerror(st->last_errno) : "no answer");
            loom_tcp_connect_drop(ctx, peer);
            return loomTimeout;
        }
        *send_comm_p = NULL;
        return loomSuccess;
    }
    int fds[LOOM_TCP_MAX_SOCKS];
    for (int i = 0; i < ctx->nsocks; i++) {
        fds[i] = cn->socks[i]->fd;
        cn->socks[i]->fd = -1;
    }
    loom_tcp_connect_drop(ctx, peer);
    tcp_comm_t *c;
    LOOM_CHECK(loom_tcp_comm_create(ctx, fds, ctx->nsocks, ctx->piece_bytes, peer, 1, &c));
    LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d connected to rank %d (%d sockets, %u-byte pieces)",
              ctx->rank, peer, ctx->nsocks, ctx->piece_bytes);
    *send_comm_p = c;
    return loomSuccess;
}

// ---- accept -----------------------------------------------------------------

static void assembly_free(tcp_assembly_t *a)
{
    if (a == NULL)
        return;
    for (int i = 0; i < LOOM_TCP_MAX_SOCKS; i++)
        if (a->fds[i] >= 0)
            close(a->fds[i]);
    free(a);
}

static void listen_drop(tcp_listen_t *l, tcp_setup_t *st, tcp_setup_t *prev)
{
    if (prev != NULL)
        prev->next = st->next;
    else
        l->setups = st->next;
    l->n_setups--;
    setup_free(st);
}

/* Drops an unproven incoming connection, logged through the stray counter.
 * A cause from the handshake (hs.why) already names the peer. */
static void listen_stray(tcp_listen_t *l, tcp_setup_t *st, tcp_setup_t *prev, const char *cause)
{
    char peer[96], why[256];
    if (cause == st->hs.why)
        snprintf(why, sizeof(why), "dropped a connection: %s", cause);
    else
        snprintf(why, sizeof(why), "dropped a connection from %s: %s",
                 loom_socket_peer_str(st->fd, peer, sizeof(peer)), cause);
    LOOM_STRAY_NOTE(&l->strays, why);
    listen_drop(l, st, prev);
}

/* Evicts the oldest unproven connection, preferring one that sent nothing.
 * Returns 0 if there is none. */
static int listen_evict(tcp_listen_t *l, const char *cause)
{
    tcp_setup_t *pick = NULL, *pick_prev = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        tcp_setup_t *prev = NULL;
        for (tcp_setup_t *st = l->setups; st != NULL; prev = st, st = st->next) {
            if (st->stage != ST_HANDSHAKE || (pass == 0 && loom_handshake_received(&st->hs) != 0))
                continue;
            if (pick == NULL || st->accepted_ns < pick->accepted_ns) {
                pick = st;
                pick_prev = prev;
            }
        }
    }
    if (pick == NULL)
        return 0;
    listen_stray(l, pick, pick_prev, cause);
    return 1;
}

static loomResult_t accept_new(tcp_listen_t *l)
{
    tcp_ctx_t *ctx = l->ctx;
    for (int k = 0; k < ACCEPT_BURST; k++) {
        int fd = -1;
        loomResult_t res = loom_socket_accept(l->fd, &fd);
        if (res == loomInProgress) {
            if (listen_evict(l, "evicted to free a descriptor (process out of files)"))
                continue;
            if (!l->fd_warned)
                LOOM_WARN("tcp: rank %d is out of file descriptors with %d connections being "
                          "set up; new connections wait in the backlog",
                          ctx->rank, l->n_setups);
            l->fd_warned = 1;
            return loomSuccess;
        }
        if (res != loomSuccess)
            return res;
        if (fd < 0)
            return loomSuccess;
        if (l->n_setups >= MAX_HANDSHAKES &&
            !listen_evict(l, "evicted by a newer connection (too many unproven ones)")) {
            char peer[96], why[192];
            snprintf(why, sizeof(why),
                     "refused a connection from %s: %d proven connections are being set up",
                     loom_socket_peer_str(fd, peer, sizeof(peer)), l->n_setups);
            LOOM_STRAY_NOTE(&l->strays, why);
            close(fd);
            continue;
        }
        tcp_setup_t *st = calloc(1, sizeof(*st));
        if (st == NULL) {
            close(fd);
            LOOM_WARN("tcp: out of memory for an incoming connection (%zu bytes)", sizeof(*st));
            return loomSystemError;
        }
        st->fd = fd;
        st->peer = -1;
        st->stage = ST_HANDSHAKE;
        st->accepted_ns = loom_now_ns();
        st->deadline_ns = loom_deadline_ms(ctx->timeout_ms);
        if (loom_socket_tune(fd, ctx->sockbuf) != loomSuccess) {
            setup_free(st); /* WARNed by the socket layer; this connection only */
            continue;
        }
        res = loom_handshake_init(&st->hs, fd, ctx->secret, TCP_HS_ROLE, 1);
        if (res != loomSuccess) {
            setup_free(st);
            return res;
        }
        st->hs.quiet = 1;
        st->next = l->setups;
        l->setups = st;
        l->n_setups++;
    }
    return loomSuccess;
}

/* What a complete hello says. */
typedef struct {
    uint32_t magic;
    int rank, nranks;
    int index, nsocks;
    uint32_t piece_bytes;
} hello_t;

/* Reads the hello as far as the socket allows; *complete_p = 1 once all of it
 * is in (its length follows from the magic). */
static loomResult_t hello_read(tcp_setup_t *st, int *complete_p)
{
    *complete_p = 0;
    for (;;) {
        size_t n = 0;
        LOOM_CHECK(loom_socket_recv_some(st->fd, st->hello + st->hello_have,
                                         st->hello_want - st->hello_have, &n));
        st->hello_have += n;
        if (st->hello_have < st->hello_want) {
            if (n == 0)
                return loomSuccess;
            continue;
        }
        if (st->hello_want == TCP_HELLO_BYTES && get_le(st->hello, 4) == TCP_HELLO_STRIPE_MAGIC) {
            st->hello_want = TCP_HELLO_STRIPE_BYTES;
            continue;
        }
        *complete_p = 1;
        return loomSuccess;
    }
}

/* Checks a complete hello against this communicator, the connections already
 * up and the peer's earlier sockets; 1 if the socket may join its assembly. */
static int hello_check(tcp_listen_t *l, const hello_t *h)
{
    tcp_ctx_t *ctx = l->ctx;
    if ((h->magic != TCP_HELLO_MAGIC && h->magic != TCP_HELLO_STRIPE_MAGIC) ||
        h->nranks != ctx->nranks || h->rank < 0 || h->rank >= ctx->nranks) {
        LOOM_WARN("tcp: rank %d refused a connection: hello magic 0x%08x, rank %d of %d ranks "
                  "(expected magic 0x%08x or 0x%08x and %d ranks)",
                  ctx->rank, h->magic, h->rank, h->nranks, TCP_HELLO_MAGIC, TCP_HELLO_STRIPE_MAGIC,
                  ctx->nranks);
        return 0;
    }
    if (ctx->recv_up[h->rank]) {
        LOOM_WARN("tcp: rank %d refused a second connection from rank %d", ctx->rank, h->rank);
        return 0;
    }
    if (h->magic == TCP_HELLO_STRIPE_MAGIC &&
        (h->nsocks < 2 || h->nsocks > LOOM_TCP_MAX_SOCKS || h->index >= h->nsocks ||
         h->piece_bytes < LOOM_TCP_MIN_PIECE_BYTES || h->piece_bytes > LOOM_TCP_MAX_PIECE_BYTES)) {
        LOOM_WARN("tcp: rank %d refused a connection from rank %d: socket %d of %d with %u-byte "
                  "pieces (2 to %d sockets, pieces of %u to %u bytes)",
                  ctx->rank, h->rank, h->index, h->nsocks, h->piece_bytes, LOOM_TCP_MAX_SOCKS,
                  LOOM_TCP_MIN_PIECE_BYTES, LOOM_TCP_MAX_PIECE_BYTES);
        return 0;
    }
    const tcp_assembly_t *a = l->assembling[h->rank];
    if (a != NULL && (a->nsocks != h->nsocks || a->piece_bytes != h->piece_bytes)) {
        LOOM_WARN("tcp: rank %d refused a connection from rank %d: socket %d of %d with %u-byte "
                  "pieces, where its earlier sockets announced %d with %u-byte pieces",
                  ctx->rank, h->rank, h->index, h->nsocks, h->piece_bytes, a->nsocks,
                  a->piece_bytes);
        return 0;
    }
    if (a != NULL && a->fds[h->index] >= 0) {
        LOOM_WARN("tcp: rank %d refused a second connection from rank %d for socket %d of %d",
                  ctx->rank, h->rank, h->index, h->nsocks);
        return 0;
    }
    return 1;
}

/* Moves a proven socket into its peer's assembly; *complete_p = 1 when that
 * was the last one. */
static loomResult_t assembly_add(tcp_listen_t *l, const hello_t *h, tcp_setup_t *st,
                                 int *complete_p)
{
    tcp_assembly_t *a = l->assembling[h->rank];
    if (a == NULL) {
        a = calloc(1, sizeof(*a));
        if (a == NULL) {
            LOOM_WARN("tcp: out of memory for a connection from rank %d (%zu bytes)", h->rank,
                      sizeof(*a));
            return loomSystemError;
        }
        a->nsocks = h->nsocks;
        a->piece_bytes = h->piece_bytes;
        for (int i = 0; i < LOOM_TCP_MAX_SOCKS; i++)
            a->fds[i] = -1;
        l->assembling[h->rank] = a;
    }
    a->fds[h->index] = st->fd;
    st->fd = -1;
    a->have++;
    *complete_p = a->have == a->nsocks;
    return loomSuccess;
}

/* Advances one incoming socket. *keep_p = 0: drop its setup (already logged,
 * or *stray_p = 1: the caller logs it as a stray with st->hs.why, or its
 * socket moved to an assembly); *peer_p >= 0: that peer's connection is
 * complete. */
static loomResult_t accept_step(tcp_listen_t *l, tcp_setup_t *st, int *keep_p, int *peer_p,
                                int *stray_p)
{
    tcp_ctx_t *ctx = l->ctx;
    char pbuf[96];
    *keep_p = 1;
    *peer_p = -1;
    *stray_p = 0;
    if (st->stage == ST_HANDSHAKE) {
        int done = 0;
        if (loom_handshake_step(&st->hs, &done) != loomSuccess) {
            *keep_p = 0;
            *stray_p = 1;
            return loomSuccess;
        }
        if (!done)
            return loomSuccess;
        loom_handshake_clear(&st->hs);
        st->stage = ST_HELLO;
        st->hello_want = TCP_HELLO_BYTES;
    }
    int complete = 0;
    loomResult_t res = hello_read(st, &complete);
    if (res != loomSuccess) {
        if (res == loomRemoteError)
            LOOM_WARN("tcp: rank %d: a connection from %s proved the job secret, then closed "
                      "before its hello",
                      ctx->rank, loom_socket_peer_str(st->fd, pbuf, sizeof(pbuf)));
        *keep_p = 0;
        return loomSuccess;
    }
    if (!complete)
        return loomSuccess;
    const uint8_t *b = st->hello;
    hello_t h = {.magic = get_le(b, 4),
                 .rank = (int32_t)get_le(b + 4, 4),
                 .nranks = (int32_t)get_le(b + 8, 4),
                 .index = 0,
                 .nsocks = 1,
                 .piece_bytes = 0};
    if (h.magic == TCP_HELLO_STRIPE_MAGIC) {
        h.index = (int)get_le(b + 12, 2);
        h.nsocks = (int)get_le(b + 14, 2);
        h.piece_bytes = get_le(b + 16, 4);
    }
    *keep_p = 0;
    if (!hello_check(l, &h))
        return loomSuccess;
    LOOM_CHECK(assembly_add(l, &h, st, &complete));
    if (complete)
        *peer_p = h.rank;
    return loomSuccess;
}

/* Turns peer's complete assembly into its receive connection. */
static loomResult_t assembly_finish(tcp_listen_t *l, int peer, tcp_comm_t **comm_p)
{
    tcp_ctx_t *ctx = l->ctx;
    tcp_assembly_t *a = l->assembling[peer];
    l->assembling[peer] = NULL;
    int fds[LOOM_TCP_MAX_SOCKS];
    for (int i = 0; i < a->nsocks; i++)
        fds[i] = a->fds[i];
    const int nsocks = a->nsocks;
    const uint32_t piece = a->piece_bytes;
    free(a);
    LOOM_CHECK(loom_tcp_comm_create(ctx, fds, nsocks, piece, peer, 0, comm_p));
    LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d accepted rank %d (%d sockets, %u-byte pieces)", ctx->rank,
              peer, nsocks, piece);
    return loomSuccess;
}

loomResult_t loom_tcp_accept(void *listen_v, void **recv_comm_p, int *peer_p)
{
    tcp_listen_t *l = listen_v;
    tcp_ctx_t *ctx = l->ctx;
    char buf[96];
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d: accept aborted", ctx->rank);
        return loomRemoteError;
    }
    l->accepting = 1;
    LOOM_CHECK(accept_new(l));
    uint64_t now = loom_now_ns();
    tcp_setup_t *prev = NULL, *st = l->setups;
    while (st != NULL) {
        tcp_setup_t *next = st->next;
        int keep = 0, peer = -1, stray = 0;
        LOOM_CHECK(accept_step(l, st, &keep, &peer, &stray));
        if (stray) {
            listen_stray(l, st, prev, st->hs.why);
            st = next;
            continue;
        }
        if (keep && now >= st->deadline_ns) {
            if (st->stage == ST_HANDSHAKE) {
                snprintf(buf, sizeof(buf), "no proof of the job secret within %lld ms",
                         (long long)ctx->timeout_ms);
                listen_stray(l, st, prev, buf);
            } else {
                LOOM_WARN("tcp: rank %d dropped a connection from %s: it proved the job secret "
                          "but sent no hello within %lld ms",
                          ctx->rank, loom_socket_peer_str(st->fd, buf, sizeof(buf)),
                          (long long)ctx->timeout_ms);
                listen_drop(l, st, prev);
            }
            st = next;
            continue;
        }
        if (keep) {
            prev = st;
            st = next;
            continue;
        }
        listen_drop(l, st, prev);
        st = next;
        if (peer >= 0) {
            tcp_comm_t *c;
            LOOM_CHECK(assembly_finish(l, peer, &c));
            *recv_comm_p = c;
            *peer_p = peer;
            return loomSuccess;
        }
    }
    *recv_comm_p = NULL;
    return loomSuccess;
}

loomResult_t loom_tcp_setup_poll(tcp_ctx_t *ctx, size_t *n_p)
{
    /* A listener nobody accepts on would make every wait return at once. */
    if (ctx->listen != NULL && ctx->listen->accepting) {
        ctx->listen->accepting = 0;
        LOOM_CHECK(loom_tcp_pfd_add(ctx, n_p, ctx->listen->fd, POLLIN));
        for (tcp_setup_t *st = ctx->listen->setups; st != NULL; st = st->next)
            LOOM_CHECK(loom_tcp_pfd_add(ctx, n_p, st->fd,
                                        st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs)
                                                                  : POLLIN));
    }
    for (int p = 0; p < ctx->nranks; p++) {
        const tcp_connecting_t *cn = ctx->connecting[p];
        for (int i = 0; cn != NULL && i < LOOM_TCP_MAX_SOCKS; i++) {
            const tcp_setup_t *st = cn->socks[i];
            if (st == NULL || st->fd < 0 || cn->ready[i])
                continue;
            short ev = st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs) : POLLOUT;
            LOOM_CHECK(loom_tcp_pfd_add(ctx, n_p, st->fd, ev));
        }
    }
    return loomSuccess;
}

loomResult_t loom_tcp_close_listen(void *listen_v)
{
    tcp_listen_t *l = listen_v;
    loomResult_t res = loomSuccess;
    if (l == NULL)
        return loomSuccess;
    while (l->setups != NULL) {
        if (l->setups->stage == ST_HANDSHAKE)
            listen_stray(l, l->setups, NULL, "still unproven when the listener closed");
        else
            listen_drop(l, l->setups, NULL);
    }
    loom_stray_summary(&l->strays);
    if (l->assembling != NULL)
        for (int p = 0; p < l->ctx->nranks; p++)
            assembly_free(l->assembling[p]);
    free(l->assembling);
    if (close(l->fd) != 0) {
        LOOM_WARN("tcp: close of the listening socket failed: %s", strerror(errno));
        res = loomSystemError;
    }
    if (l->ctx->listen == l)
        l->ctx->listen = NULL;
    free(l);
    return res;
}

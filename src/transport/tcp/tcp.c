/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp.c - the tcp transport (loom_tp_tcp): one TCP connection per peer and
 * direction, authenticated with the job secret, carrying stream.c frames.
 * It is the fallback that reaches every peer; it does not pick ranks'
 * transports (transport.c and p2p.c do) and has no progress thread: data
 * moves only inside test(), waits happen in wait(). Called through the table
 * at the end of this file by p2p.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "param.h"
#include "secret.h"
#include "socket.h"
#include "stream.h"
#include "timer.h"
#include "transport.h"

/* Connection setup, all non-blocking, driven by repeated connect()/accept():
 *   connector: TCP connect to the listener (ECONNREFUSED and friends are
 *              retried every RETRY_NS until the timeout: the peer may not
 *              listen yet) -> secret handshake (secret.c, role TCP) -> HELLO.
 *   acceptor:  accept -> secret handshake -> read HELLO -> check the rank.
 * HELLO (12 bytes, little-endian): u32 magic "LMTH", i32 rank, i32 nranks.
 * Nothing from an accepted socket is parsed before the handshake proved the
 * secret; a connection failing any step is closed and the listener keeps
 * serving the others. Refusals of unproven connections go through the
 * listener's loom_stray_log_t (one WARN, then INFO and a count at close), so
 * a flood cannot flood the log; a proven peer's bad hello is WARNed. At most
 * MAX_HANDSHAKES unproven connections are held: a new one evicts the oldest
 * (one that has sent nothing first), and out of descriptors the listener
 * evicts too. A connector whose connection the listener closed during the
 * handshake without refusing its proof connects again (it was evicted); one
 * told REFUSED (wrong secret) fails at once. The connector's send connection
 * is then the acceptor's receive connection: data flows one way only. */

#define TCP_HANDLE_MAGIC 0x5054434cu /* "LCTP" */
#define TCP_HELLO_MAGIC  0x48544d4cu /* "LMTH" */
#define TCP_HELLO_BYTES  12
#define TCP_HS_ROLE      0x20504354u /* "TCP ": the handshake role of data connections */
#define RETRY_NS         1000000ull
#define MAX_HANDSHAKES   256 /* unauthenticated connections one listener holds at once */
#define ACCEPT_BURST     64  /* accepts per accept() call, so held connections progress */

typedef struct {
    uint32_t magic;
    uint32_t pad;
    loom_sockaddr_t addr;
} tcp_handle_t;

_Static_assert(sizeof(tcp_handle_t) <= LOOM_TP_HANDLE_MAX, "tcp handle too large");

enum { ST_START, ST_CONNECTING, ST_HANDSHAKE, ST_HELLO };

/* A connection being set up, on either end. */
typedef struct tcp_setup {
    struct tcp_setup *next;
    int fd;
    int stage;
    int peer;             /* connector: the target rank */
    int last_errno;       /* connector: why the last attempt failed */
    uint64_t accepted_ns; /* acceptor: when accepted (eviction picks the oldest) */
    uint64_t deadline_ns;
    uint64_t retry_at_ns;
    loom_sockaddr_t addr; /* connector: the listener */
    loom_handshake_t hs;
    uint8_t hello[TCP_HELLO_BYTES];
    size_t hello_have;
} tcp_setup_t;

typedef struct tcp_comm {
    struct tcp_comm *prev, *next;
    struct tcp_ctx *ctx;
    int fd;
    int peer;
    int is_send;
    loom_tp_stream_t stream;
} tcp_comm_t;

typedef struct tcp_listen {
    struct tcp_ctx *ctx;
    int fd;
    tcp_setup_t *setups; /* accepted, hello not yet received */
    int n_setups;
    int accepting; /* accept() ran since the last wait(): the caller waits for peers */
    int fd_warned; /* out of descriptors was WARNed */
    loom_stray_log_t strays;
} tcp_listen_t;

typedef struct tcp_ctx {
    int rank;
    int nranks;
    uint8_t secret[LOOM_SECRET_BYTES];
    int64_t timeout_ms;
    int64_t sockbuf;
    volatile const int *abort_flag;
    volatile const int *quiet_flag;
    loom_sockaddr_t addr;
    char ifname[64];
    tcp_listen_t *listen;
    tcp_comm_t *comms;        /* every open connection, for wait() */
    tcp_setup_t **connecting; /* [nranks] connects in progress */
    uint8_t *send_up;         /* [nranks] send connection established */
    uint8_t *recv_up;         /* [nranks] receive connection established */
    struct pollfd *pfds;      /* wait()'s scratch array */
    size_t pfds_cap;
} tcp_ctx_t;

static const char *addr_str(const loom_sockaddr_t *a, char *buf)
{
    return loom_sockaddr_str(a, buf, 96);
}

static int aborted(const tcp_ctx_t *ctx)
{
    return ctx->abort_flag != NULL && *ctx->abort_flag != 0;
}

// ---- byte channel for stream.c ---------------------------------------------

static int gone_errno(int e)
{
    return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ETIMEDOUT ||
           e == EHOSTUNREACH || e == ENETUNREACH || e == ENOTCONN;
}

static loomResult_t tcp_writev(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                               int *gone_errno_p)
{
    tcp_comm_t *c = chan;
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = (struct iovec *)iov;
    msg.msg_iovlen = (size_t)iovcnt;
    ssize_t n;
    do {
        n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *nbytes_p = 0;
            return loomSuccess;
        }
        if (gone_errno(errno)) {
            *gone_errno_p = errno;
            return loomRemoteError;
        }
        LOOM_WARN("tcp: rank %d: sendmsg to rank %d failed: %s", c->ctx->rank, c->peer,
                  strerror(errno));
        return loomSystemError;
    }
    *nbytes_p = (size_t)n;
    return loomSuccess;
}

static loomResult_t tcp_readv(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                              int *gone_errno_p)
{
    tcp_comm_t *c = chan;
    ssize_t n;
    do {
        n = readv(c->fd, iov, iovcnt);
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
        *gone_errno_p = 0;
        return loomRemoteError;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *nbytes_p = 0;
            return loomSuccess;
        }
        if (gone_errno(errno)) {
            *gone_errno_p = errno;
            return loomRemoteError;
        }
        LOOM_WARN("tcp: rank %d: readv from rank %d failed: %s", c->ctx->rank, c->peer,
                  strerror(errno));
        return loomSystemError;
    }
    *nbytes_p = (size_t)n;
    return loomSuccess;
}

static const loom_tp_stream_io_t tcp_io = {.writev = tcp_writev, .readv = tcp_readv};

static loomResult_t comm_create(tcp_ctx_t *ctx, int fd, int peer, int is_send, tcp_comm_t **comm_p)
{
    tcp_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*c));
        return loomSystemError;
    }
    c->ctx = ctx;
    c->fd = fd;
    c->peer = peer;
    c->is_send = is_send;
    loom_tp_stream_init(&c->stream, &tcp_io, c, "tcp", ctx->rank, peer, ctx->quiet_flag);
    c->next = ctx->comms;
    if (ctx->comms != NULL)
        ctx->comms->prev = c;
    ctx->comms = c;
    if (is_send)
        ctx->send_up[peer] = 1;
    else
        ctx->recv_up[peer] = 1;
    *comm_p = c;
    return loomSuccess;
}

static loomResult_t comm_destroy(tcp_comm_t *c)
{
    tcp_ctx_t *ctx = c->ctx;
    loomResult_t res = loomSuccess;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        ctx->comms = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    if (c->is_send)
        ctx->send_up[c->peer] = 0;
    else
        ctx->recv_up[c->peer] = 0;
    loom_tp_stream_fini(&c->stream);
    if (close(c->fd) != 0) {
        LOOM_WARN("tcp: close of the connection %s rank %d failed: %s", c->is_send ? "to" : "from",
                  c->peer, strerror(errno));
        res = loomSystemError;
    }
    free(c);
    return res;
}

static void setup_free(tcp_setup_t *st)
{
    if (st->fd >= 0)
        close(st->fd);
    loom_handshake_clear(&st->hs);
    free(st);
}

// ---- init, listen -----------------------------------------------------------

static loomResult_t tcp_finalize(void *ctx_v);

static loomResult_t tcp_init(const loom_tp_init_args_t *args, void **ctx_p)
{
    loomResult_t res;
    tcp_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        LOOM_WARN("tcp: out of memory for the context (%zu bytes)", sizeof(*ctx));
        return loomSystemError;
    }
    ctx->rank = args->rank;
    ctx->nranks = args->nranks;
    memcpy(ctx->secret, args->secret, LOOM_SECRET_BYTES);
    ctx->timeout_ms = args->timeout_ms;
    ctx->abort_flag = args->abort_flag;
    ctx->quiet_flag = args->quiet_flag;
    ctx->sockbuf = loom_param_TCP_SOCKBUF();
    ctx->connecting = calloc((size_t)args->nranks, sizeof(*ctx->connecting));
    ctx->send_up = calloc((size_t)args->nranks, 1);
    ctx->recv_up = calloc((size_t)args->nranks, 1);
    if (ctx->connecting == NULL || ctx->send_up == NULL || ctx->recv_up == NULL) {
        LOOM_WARN("tcp: out of memory for the connection tables of %d ranks", args->nranks);
        res = loomSystemError;
        goto err_free;
    }
    LOOM_CHECK_GOTO(loom_socket_pick_addr(&ctx->addr, ctx->ifname, sizeof(ctx->ifname)), res,
                    err_free);
    *ctx_p = ctx;
    return loomSuccess;
err_free:
    tcp_finalize(ctx);
    return res;
}

static loomResult_t tcp_can_connect(void *ctx, const loom_peer_info_t *self,
                                    const loom_peer_info_t *peer, int *ok_p)
{
    (void)ctx;
    (void)self;
    (void)peer;
    *ok_p = 1;
    return loomSuccess;
}

static loomResult_t tcp_listen(void *ctx_v, void *handle, void **listen_p)
{
    tcp_ctx_t *ctx = ctx_v;
    if (ctx->listen != NULL) {
        LOOM_WARN("tcp: rank %d called listen twice on one context", ctx->rank);
        return loomInvalidUsage;
    }
    tcp_listen_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        LOOM_WARN("tcp: out of memory for a listener (%zu bytes)", sizeof(*l));
        return loomSystemError;
    }
    loom_sockaddr_t addr = ctx->addr;
    if (addr.sa.sa_family == AF_INET6)
        addr.sin6.sin6_port = 0;
    else
        addr.sin.sin_port = 0;
    loomResult_t res = loom_socket_listen(&addr, &l->fd);
    if (res != loomSuccess) {
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

static void connect_drop(tcp_ctx_t *ctx, int peer)
{
    setup_free(ctx->connecting[peer]);
    ctx->connecting[peer] = NULL;
}

/* One step of the connector's state machine; *ready_p = 1 when HELLO is out. */
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
            uint32_t v[3] = {TCP_HELLO_MAGIC, (uint32_t)ctx->rank, (uint32_t)ctx->nranks};
            for (int i = 0; i < 3; i++)
                for (int b = 0; b < 4; b++)
                    st->hello[4 * i + b] = (uint8_t)(v[i] >> (8 * b));
            st->hello_have = 0;
            st->stage = ST_HELLO;
            break;
        }
        case ST_HELLO: {
            size_t n = 0;
            loomResult_t res = loom_socket_send_some(st->fd, st->hello + st->hello_have,
                                                     TCP_HELLO_BYTES - st->hello_have, &n);
            if (res == loomRemoteError)
                LOOM_WARN("tcp: rank %d: rank %d at %s closed the connection during the hello",
                          ctx->rank, st->peer, addr_str(&st->addr, buf));
            if (res != loomSuccess)
                return res;
            st->hello_have += n;
            *ready_p = st->hello_have == TCP_HELLO_BYTES;
            return loomSuccess;
        }
        }
    }
}

static loomResult_t tcp_connect(void *ctx_v, const void *handle, int peer, void **send_comm_p)
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
        if (ctx->connecting[peer] != NULL)
            connect_drop(ctx, peer);
        return loomRemoteError;
    }
    tcp_setup_t *st = ctx->connecting[peer];
    if (st == NULL) {
        tcp_handle_t h;
        memcpy(&h, handle, sizeof(h));
        int fam = h.addr.sa.sa_family;
        if (h.magic != TCP_HANDLE_MAGIC || (fam != AF_INET && fam != AF_INET6)) {
            LOOM_WARN("tcp: rank %d got an invalid tcp handle from rank %d (magic 0x%08x)",
                      ctx->rank, peer, h.magic);
            return loomInvalidArgument;
        }
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer,
                      sizeof(*st));
            return loomSystemError;
        }
        st->fd = -1;
        st->peer = peer;
        st->addr = h.addr;
        st->stage = ST_START;
        st->deadline_ns = loom_deadline_ms(ctx->timeout_ms);
        ctx->connecting[peer] = st;
    }
    int ready = 0;
    loomResult_t res = connect_step(ctx, st, &ready);
    if (res != loomSuccess) {
        connect_drop(ctx, peer);
        return res;
    }
    if (!ready) {
        if (loom_now_ns() >= st->deadline_ns) {
            LOOM_WARN("tcp: rank %d could not connect to rank %d at %s within %lld ms (%s)",
                      ctx->rank, peer, addr_str(&st->addr, buf), (long long)ctx->timeout_ms,
                      st->stage == ST_START ? strerror(st->last_errno) : "no answer");
            connect_drop(ctx, peer);
            return loomTimeout;
        }
        *send_comm_p = NULL;
        return loomSuccess;
    }
    tcp_comm_t *c;
    res = comm_create(ctx, st->fd, peer, 1, &c);
    if (res != loomSuccess) {
        connect_drop(ctx, peer);
        return res;
    }
    st->fd = -1;
    connect_drop(ctx, peer);
    LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d connected to rank %d", ctx->rank, peer);
    *send_comm_p = c;
    return loomSuccess;
}

// ---- accept -----------------------------------------------------------------

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

/* Advances one incoming connection. *keep_p = 0: drop it (already logged, or
 * *stray_p = 1: the caller logs it as a stray with st->hs.why);
 * *peer_p >= 0: its hello named a valid, new peer. */
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
    }
    size_t n = 0;
    loomResult_t res = loom_socket_recv_some(st->fd, st->hello + st->hello_have,
                                             TCP_HELLO_BYTES - st->hello_have, &n);
    if (res != loomSuccess) {
        if (res == loomRemoteError)
            LOOM_WARN("tcp: rank %d: a connection from %s proved the job secret, then closed "
                      "before its hello",
                      ctx->rank, loom_socket_peer_str(st->fd, pbuf, sizeof(pbuf)));
        *keep_p = 0;
        return loomSuccess;
    }
    st->hello_have += n;
    if (st->hello_have < TCP_HELLO_BYTES)
        return loomSuccess;
    uint32_t v[3];
    for (int i = 0; i < 3; i++)
        v[i] = (uint32_t)st->hello[4 * i] | (uint32_t)st->hello[4 * i + 1] << 8 |
               (uint32_t)st->hello[4 * i + 2] << 16 | (uint32_t)st->hello[4 * i + 3] << 24;
    int rank = (int32_t)v[1], nranks = (int32_t)v[2];
    *keep_p = 0;
    if (v[0] != TCP_HELLO_MAGIC || nranks != ctx->nranks || rank < 0 || rank >= ctx->nranks) {
        LOOM_WARN("tcp: rank %d refused a connection: hello magic 0x%08x, rank %d of %d ranks "
                  "(expected magic 0x%08x and %d ranks)",
                  ctx->rank, v[0], rank, nranks, TCP_HELLO_MAGIC, ctx->nranks);
        return loomSuccess;
    }
    if (ctx->recv_up[rank]) {
        LOOM_WARN("tcp: rank %d refused a second connection from rank %d", ctx->rank, rank);
        return loomSuccess;
    }
    *keep_p = 1;
    *peer_p = rank;
    return loomSuccess;
}

static loomResult_t tcp_accept(void *listen_v, void **recv_comm_p, int *peer_p)
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
        if (keep && peer < 0 && now >= st->deadline_ns) {
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
        if (!keep) {
            listen_drop(l, st, prev);
            st = next;
            continue;
        }
        if (peer >= 0) {
            tcp_comm_t *c;
            LOOM_CHECK(comm_create(ctx, st->fd, peer, 0, &c));
            st->fd = -1;
            listen_drop(l, st, prev);
            LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d accepted rank %d", ctx->rank, peer);
            *recv_comm_p = c;
            *peer_p = peer;
            return loomSuccess;
        }
        prev = st;
        st = next;
    }
    *recv_comm_p = NULL;
    return loomSuccess;
}

// ---- data -------------------------------------------------------------------

static loomResult_t tcp_isend(void *send_comm, const void *buf, size_t len, uint32_t tag,
                              void **req_p)
{
    tcp_comm_t *c = send_comm;
    if (!c->is_send) {
        LOOM_WARN("tcp: rank %d: isend on the receive connection from rank %d", c->ctx->rank,
                  c->peer);
        return loomInvalidUsage;
    }
    loom_tp_stream_req_t *r;
    LOOM_CHECK(loom_tp_stream_isend(&c->stream, buf, len, tag, &r));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t tcp_irecv(void *recv_comm, void *buf, size_t len, uint32_t tag, void **req_p)
{
    tcp_comm_t *c = recv_comm;
    if (c->is_send) {
        LOOM_WARN("tcp: rank %d: irecv on the send connection to rank %d", c->ctx->rank, c->peer);
        return loomInvalidUsage;
    }
    loom_tp_stream_req_t *r;
    LOOM_CHECK(loom_tp_stream_irecv(&c->stream, buf, len, tag, &r));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t tcp_test(void *req, int *done_p, size_t *nbytes_p)
{
    return loom_tp_stream_test(req, done_p, nbytes_p);
}

static loomResult_t pfd_add(tcp_ctx_t *ctx, size_t *n, int fd, short events)
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

static loomResult_t tcp_wait(void *ctx_v, int timeout_us)
{
    tcp_ctx_t *ctx = ctx_v;
    size_t n = 0;
    for (tcp_comm_t *c = ctx->comms; c != NULL; c = c->next) {
        short ev = (short)((loom_tp_stream_wants_write(&c->stream) ? POLLOUT : 0) |
                           (loom_tp_stream_wants_read(&c->stream) ? POLLIN : 0));
        if (ev != 0)
            LOOM_CHECK(pfd_add(ctx, &n, c->fd, ev));
    }
    /* A listener nobody accepts on would make every wait return at once. */
    if (ctx->listen != NULL && ctx->listen->accepting) {
        ctx->listen->accepting = 0;
        LOOM_CHECK(pfd_add(ctx, &n, ctx->listen->fd, POLLIN));
        for (tcp_setup_t *st = ctx->listen->setups; st != NULL; st = st->next)
            LOOM_CHECK(
                pfd_add(ctx, &n, st->fd,
                        st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs) : POLLIN));
    }
    for (int p = 0; p < ctx->nranks; p++) {
        tcp_setup_t *st = ctx->connecting[p];
        if (st == NULL || st->fd < 0)
            continue;
        short ev = st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs) : POLLOUT;
        LOOM_CHECK(pfd_add(ctx, &n, st->fd, ev));
    }
    if (timeout_us < 0)
        timeout_us = 0;
    struct timespec ts = {.tv_sec = timeout_us / 1000000,
                          .tv_nsec = (timeout_us % 1000000) * 1000L};
    if (ppoll(ctx->pfds, n, &ts, NULL) < 0 && errno != EINTR) {
        LOOM_WARN("tcp: rank %d: ppoll over %zu sockets failed: %s", ctx->rank, n, strerror(errno));
        return loomSystemError;
    }
    return loomSuccess;
}

// ---- teardown ---------------------------------------------------------------

static loomResult_t tcp_close_comm(void *comm)
{
    return comm == NULL ? loomSuccess : comm_destroy(comm);
}

static loomResult_t tcp_close_listen(void *listen_v)
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
    if (close(l->fd) != 0) {
        LOOM_WARN("tcp: close of the listening socket failed: %s", strerror(errno));
        res = loomSystemError;
    }
    if (l->ctx->listen == l)
        l->ctx->listen = NULL;
    free(l);
    return res;
}

static loomResult_t tcp_finalize(void *ctx_v)
{
    tcp_ctx_t *ctx = ctx_v;
    loomResult_t res = loomSuccess;
    if (ctx == NULL)
        return loomSuccess;
    if (ctx->listen != NULL)
        LOOM_CHECK_IGNORE(tcp_close_listen(ctx->listen), res);
    while (ctx->comms != NULL) {
        LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d: connection %s rank %d still open at finalize",
                  ctx->rank, ctx->comms->is_send ? "to" : "from", ctx->comms->peer);
        LOOM_CHECK_IGNORE(comm_destroy(ctx->comms), res);
    }
    if (ctx->connecting != NULL)
        for (int p = 0; p < ctx->nranks; p++)
            if (ctx->connecting[p] != NULL)
                connect_drop(ctx, p);
    free(ctx->connecting);
    free(ctx->send_up);
    free(ctx->recv_up);
    free(ctx->pfds);
    volatile uint8_t *sec = ctx->secret;
    for (size_t i = 0; i < sizeof(ctx->secret); i++)
        sec[i] = 0;
    free(ctx);
    return res;
}

const loom_tp_t loom_tp_tcp = {
    .abi_version = LOOM_TP_ABI_V1,
    .name = "tcp",
    .init = tcp_init,
    .finalize = tcp_finalize,
    .can_connect = tcp_can_connect,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .accept = tcp_accept,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .test = tcp_test,
    .wait = tcp_wait,
    .close_send = tcp_close_comm,
    .close_recv = tcp_close_comm,
    .close_listen = tcp_close_listen,
};

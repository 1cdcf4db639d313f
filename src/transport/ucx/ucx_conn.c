/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx_conn.c - connection setup of the ucx transport over a TCP side channel:
 * the listener whose address is the listen handle, the non-blocking connect
 * and accept (secret handshake, then the exchange of ranks and UCP worker
 * addresses), and the hand-over to ucx.c, which opens the UCP endpoint. The
 * side-channel socket is closed as soon as the addresses crossed it; it
 * carries no data. Never blocks. Called through the table in ucx.c, by p2p.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "timer.h"
#include "ucx.h"

/* Why a side channel: a UCP worker address does not fit the 128-byte listen
 * handle (UCX 1.13 on one host: 79 bytes with UCX_TLS=tcp, 145 with sm,self,
 * more with every device), and UCP's own listener (ucp_listener_create) cannot
 * give an endpoint shared-memory lanes: with UCX_TLS=sm,self its connection
 * fails as unreachable. So the handle is a TCP address, like tcp's, and:
 *   connector: TCP connect to the listener (refusals are retried every
 *              RETRY_NS until the timeout: the peer may not listen yet) ->
 *              secret handshake (secret.c, role UCX) -> HELLO -> read REPLY
 *              -> endpoint to the listener's worker: the send connection.
 *   acceptor:  accept -> secret handshake -> read HELLO -> check it -> REPLY
 *              -> endpoint to the connector's worker: the receive connection.
 * HELLO, little-endian: u32 magic "LMUH", i32 rank, i32 nranks, u32 address
 * bytes, then the connector's worker address. REPLY: u32 magic "LMUR", u32
 * address bytes, then the acceptor's worker address. Addresses longer than
 * LOOM_UCX_ADDR_MAX are refused. Nothing from an accepted socket is parsed
 * before the handshake proved the job secret, and a worker address is sent
 * only to a peer that proved it. Refusals of unproven connections go through
 * the listener's loom_stray_log_t (one WARN, then INFO and a count at close);
 * a proven peer's bad hello is WARNed. At most MAX_SETUPS connections are set
 * up at once: more wait in the backlog. */

#define UCX_HANDLE_MAGIC 0x5843554cu /* "LUCX" */
#define UCX_HELLO_MAGIC  0x48554d4cu /* "LMUH" */
#define UCX_REPLY_MAGIC  0x52554d4cu /* "LMUR" */
#define UCX_HELLO_BYTES  16          /* header; the address follows */
#define UCX_REPLY_BYTES  8
#define UCX_HS_ROLE      0x20584355u /* "UCX ": the handshake role of ucx side channels */
#define RETRY_NS         1000000ull
#define MAX_SETUPS       256 /* incoming connections being set up at once */
#define ACCEPT_BURST     64  /* accepts per accept() call, so held sockets progress */

typedef struct {
    uint32_t magic;
    uint32_t pad;
    loom_sockaddr_t addr;
} ucx_handle_t;

_Static_assert(sizeof(ucx_handle_t) <= LOOM_TP_HANDLE_MAX, "ucx handle too large");

enum { ST_START, ST_CONNECTING, ST_HANDSHAKE, ST_SEND, ST_RECV };

static int aborted(const ucx_ctx_t *ctx)
{
    return ctx->abort_flag != NULL && *ctx->abort_flag != 0;
}

static void put_le(uint8_t *p, uint32_t v)
{
    for (int b = 0; b < 4; b++)
        p[b] = (uint8_t)(v >> (8 * b));
}

static uint32_t get_le(const uint8_t *p)
{
    uint32_t v = 0;
    for (int b = 0; b < 4; b++)
        v |= (uint32_t)p[b] << (8 * b);
    return v;
}

static void setup_free(ucx_setup_t *st)
{
    if (st == NULL)
        return;
    if (st->fd >= 0)
        close(st->fd);
    loom_handshake_clear(&st->hs);
    free(st->msg);
    free(st->got);
    free(st);
}

loomResult_t loom_ucx_pfd_add(ucx_ctx_t *ctx, size_t *n, int fd, short events)
{
    if (*n == ctx->pfds_cap) {
        size_t cap = ctx->pfds_cap ? 2 * ctx->pfds_cap : 64;
        struct pollfd *p = realloc(ctx->pfds, cap * sizeof(*p));
        if (p == NULL) {
            LOOM_WARN("ucx: out of memory for %zu poll entries", cap);
            return loomSystemError;
        }
        ctx->pfds = p;
        ctx->pfds_cap = cap;
    }
    ctx->pfds[*n] = (struct pollfd){.fd = fd, .events = events, .revents = 0};
    (*n)++;
    return loomSuccess;
}

/* Prepares st->msg as a message of hdr_bytes + this worker's address. */
static loomResult_t msg_build(ucx_ctx_t *ctx, ucx_setup_t *st, uint32_t magic, size_t hdr_bytes)
{
    free(st->msg);
    st->msg = malloc(hdr_bytes + ctx->my_addr_len);
    if (st->msg == NULL) {
        LOOM_WARN("ucx: out of memory for a %zu-byte worker address message",
                  hdr_bytes + ctx->my_addr_len);
        return loomSystemError;
    }
    put_le(st->msg, magic);
    if (magic == UCX_HELLO_MAGIC) {
        put_le(st->msg + 4, (uint32_t)ctx->rank);
        put_le(st->msg + 8, (uint32_t)ctx->nranks);
    }
    put_le(st->msg + hdr_bytes - 4, (uint32_t)ctx->my_addr_len);
    memcpy(st->msg + hdr_bytes, ctx->my_addr, ctx->my_addr_len);
    st->msg_have = 0;
    st->msg_want = hdr_bytes + ctx->my_addr_len;
    return loomSuccess;
}

/* Sends what the socket takes of st->msg; *done_p = 1 once all of it left. */
static loomResult_t msg_send(ucx_setup_t *st, int *done_p)
{
    size_t n = 0;
    LOOM_CHECK(
        loom_socket_send_some(st->fd, st->msg + st->msg_have, st->msg_want - st->msg_have, &n));
    st->msg_have += n;
    *done_p = st->msg_have == st->msg_want;
    return loomSuccess;
}

/* Reads a message of hdr_bytes whose last header word is the address length;
 * *done_p = 1 once all of it is in. *bad_p = 1 (and no error) if the header
 * announces an address longer than LOOM_UCX_ADDR_MAX or an empty one. */
static loomResult_t msg_recv(ucx_setup_t *st, size_t hdr_bytes, int *done_p, int *bad_p)
{
    *done_p = *bad_p = 0;
    if (st->msg == NULL) {
        st->msg = malloc(hdr_bytes);
        if (st->msg == NULL) {
            LOOM_WARN("ucx: out of memory for a %zu-byte header", hdr_bytes);
            return loomSystemError;
        }
        st->msg_have = 0;
        st->msg_want = hdr_bytes;
    }
    for (;;) {
        size_t n = 0;
        LOOM_CHECK(
            loom_socket_recv_some(st->fd, st->msg + st->msg_have, st->msg_want - st->msg_have, &n));
        st->msg_have += n;
        if (st->msg_have < st->msg_want) {
            if (n == 0)
                return loomSuccess;
            continue;
        }
        if (st->msg_want > hdr_bytes) {
            *done_p = 1;
            return loomSuccess;
        }
        const uint32_t len = get_le(st->msg + hdr_bytes - 4);
        if (len == 0 || len > LOOM_UCX_ADDR_MAX) {
            *bad_p = 1;
            return loomSuccess;
        }
        uint8_t *m = realloc(st->msg, hdr_bytes + len);
        if (m == NULL) {
            LOOM_WARN("ucx: out of memory for a %u-byte worker address", len);
            return loomSystemError;
        }
        st->msg = m;
        st->msg_want = hdr_bytes + len;
    }
}

// ---- listen -----------------------------------------------------------------

loomResult_t loom_ucx_listen(void *ctx_v, void *handle, void **listen_p)
{
    ucx_ctx_t *ctx = ctx_v;
    if (ctx->listen != NULL) {
        LOOM_WARN("ucx: rank %d called listen twice on one context", ctx->rank);
        return loomInvalidUsage;
    }
    ucx_listen_t *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        LOOM_WARN("ucx: out of memory for a listener (%zu bytes)", sizeof(*l));
        return loomSystemError;
    }
    loom_sockaddr_t addr = ctx->sockaddr;
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
    snprintf(who, sizeof(who), "ucx: rank %d", ctx->rank);
    loom_stray_init(&l->strays, who, LOOM_LOG_UCX);
    ctx->listen = l;
    ucx_handle_t h;
    memset(&h, 0, sizeof(h));
    h.magic = UCX_HANDLE_MAGIC;
    h.addr = addr;
    memset(handle, 0, LOOM_TP_HANDLE_MAX);
    memcpy(handle, &h, sizeof(h));
    char buf[96];
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d listening on %s (%s) for worker address exchange",
              ctx->rank, loom_sockaddr_str(&addr, buf, sizeof(buf)), ctx->ifname);
    *listen_p = l;
    return loomSuccess;
}

// ---- connect ----------------------------------------------------------------

static int retryable(int e)
{
    return e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == EHOSTUNREACH ||
           e == ENETUNREACH || e == ECONNABORTED;
}

void loom_ucx_connect_drop(ucx_ctx_t *ctx, int peer)
{
    setup_free(ctx->connecting[peer]);
    ctx->connecting[peer] = NULL;
}

/* Back to ST_START after a failed attempt that is worth repeating. */
static void connect_retry(ucx_setup_t *st, int err)
{
    loom_handshake_clear(&st->hs);
    close(st->fd);
    st->fd = -1;
    st->last_errno = err;
    st->retry_at_ns = loom_now_ns() + RETRY_NS;
    st->stage = ST_START;
}

/* One step of a connecting side channel; *ready_p = 1 once the reply is in. */
static loomResult_t connect_step(ucx_ctx_t *ctx, ucx_setup_t *st, int *ready_p)
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
                    LOOM_WARN("ucx: rank %d cannot connect to rank %d at %s: %s", ctx->rank,
                              st->peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)),
                              strerror(err));
                    return loomSystemError;
                }
                connect_retry(st, err);
                return loomSuccess;
            }
            if (!done)
                return loomSuccess;
            LOOM_CHECK(loom_socket_tune(st->fd, 0));
            LOOM_CHECK(loom_handshake_init(&st->hs, st->fd, ctx->secret, UCX_HS_ROLE, 0));
            st->hs.quiet = 1;
            st->stage = ST_HANDSHAKE;
            break;
        }
        case ST_HANDSHAKE: {
            int done = 0;
            loomResult_t res = loom_handshake_step(&st->hs, &done);
            if (res != loomSuccess && st->hs.fail == LOOM_HS_FAIL_CLOSED) {
                /* Shed by a busy listener (a refusal would say so): connect again. */
                LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: %s; connecting to rank %d again", ctx->rank,
                          st->hs.why, st->peer);
                connect_retry(st, ECONNRESET);
                return loomSuccess;
            }
            if (res != loomSuccess) {
                LOOM_WARN("ucx: rank %d: handshake with rank %d at %s failed: %s", ctx->rank,
                          st->peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)), st->hs.why);
                return res;
            }
            if (!done)
                return loomSuccess;
            loom_handshake_clear(&st->hs);
            LOOM_CHECK(msg_build(ctx, st, UCX_HELLO_MAGIC, UCX_HELLO_BYTES));
            st->stage = ST_SEND;
            break;
        }
        case ST_SEND: {
            int done = 0;
            loomResult_t res = msg_send(st, &done);
            if (res != loomSuccess) {
                LOOM_WARN("ucx: rank %d: rank %d at %s closed the connection before taking the "
                          "hello: %s",
                          ctx->rank, st->peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)),
                          loomGetErrorString(res));
                return loomRemoteError;
            }
            if (!done)
                return loomSuccess;
            free(st->msg);
            st->msg = NULL;
            st->stage = ST_RECV;
            break;
        }
        case ST_RECV: {
            int done = 0, bad = 0;
            loomResult_t res = msg_recv(st, UCX_REPLY_BYTES, &done, &bad);
            if (res == loomRemoteError) {
                LOOM_WARN("ucx: rank %d: rank %d at %s refused the connection after the "
                          "handshake (it closed the side channel instead of replying)",
                          ctx->rank, st->peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)));
                return loomRemoteError;
            }
            LOOM_CHECK(res);
            if (bad || (st->msg_have >= 4 && get_le(st->msg) != UCX_REPLY_MAGIC)) {
                LOOM_WARN("ucx: rank %d: rank %d sent a bad reply (magic 0x%08x, %u-byte worker "
                          "address; at most %u bytes)",
                          ctx->rank, st->peer, get_le(st->msg), get_le(st->msg + 4),
                          LOOM_UCX_ADDR_MAX);
                return loomRemoteError;
            }
            *ready_p = done;
            return loomSuccess;
        }
        default:
            LOOM_WARN("ucx: rank %d: connection to rank %d in unknown stage %d", ctx->rank,
                      st->peer, st->stage);
            return loomInternalError;
        }
    }
}

loomResult_t loom_ucx_connect(void *ctx_v, const void *handle, int peer, void **send_comm_p)
{
    ucx_ctx_t *ctx = ctx_v;
    *send_comm_p = NULL;
    if (peer < 0 || peer >= ctx->nranks || peer == ctx->rank) {
        LOOM_WARN("ucx: rank %d: connect to rank %d (valid: 0 to %d, not self)", ctx->rank, peer,
                  ctx->nranks - 1);
        return loomInvalidArgument;
    }
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: connect to rank %d aborted", ctx->rank, peer);
        return loomRemoteError;
    }
    ucx_setup_t *st = ctx->connecting[peer];
    if (st == NULL && ctx->peers[peer].comms[1] != NULL) {
        LOOM_WARN("ucx: rank %d is already connected to rank %d", ctx->rank, peer);
        return loomInvalidUsage;
    }
    if (st == NULL) {
        ucx_handle_t h;
        memcpy(&h, handle, sizeof(h));
        if (h.magic != UCX_HANDLE_MAGIC) {
            LOOM_WARN("ucx: rank %d: the handle of rank %d is not a ucx handle (magic 0x%08x)",
                      ctx->rank, peer, h.magic);
            return loomInvalidArgument;
        }
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            LOOM_WARN("ucx: out of memory for a connection to rank %d", peer);
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
        loom_ucx_connect_drop(ctx, peer);
        return res;
    }
    if (!ready) {
        if (st->stage == ST_START && loom_now_ns() >= st->deadline_ns) {
            char buf[96];
            LOOM_WARN("ucx: rank %d could not connect to rank %d at %s within %lld ms: %s",
                      ctx->rank, peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)),
                      (long long)ctx->timeout_ms, strerror(st->last_errno));
            loom_ucx_connect_drop(ctx, peer);
            return loomTimeout;
        }
        return loomSuccess;
    }
    ucx_comm_t *c;
    res = loom_ucx_comm_open(ctx, peer, 1, st->msg + UCX_REPLY_BYTES,
                             st->msg_want - UCX_REPLY_BYTES, &c);
    loom_ucx_connect_drop(ctx, peer);
    LOOM_CHECK(res);
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d connected to rank %d", ctx->rank, peer);
    *send_comm_p = c;
    return loomSuccess;
}

// ---- accept -----------------------------------------------------------------

static void listen_drop(ucx_listen_t *l, ucx_setup_t *st, ucx_setup_t *prev)
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
static void listen_stray(ucx_listen_t *l, ucx_setup_t *st, ucx_setup_t *prev, const char *cause)
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

static loomResult_t accept_new(ucx_listen_t *l)
{
    ucx_ctx_t *ctx = l->ctx;
    for (int k = 0; k < ACCEPT_BURST && l->n_setups < MAX_SETUPS; k++) {
        int fd = -1;
        loomResult_t res = loom_socket_accept(l->fd, &fd);
        if (res == loomInProgress)
            return loomSuccess; /* out of descriptors: the connection waits in the backlog */
        if (res != loomSuccess)
            return res;
        if (fd < 0)
            return loomSuccess;
        ucx_setup_t *st = calloc(1, sizeof(*st));
        if (st == NULL) {
            close(fd);
            LOOM_WARN("ucx: out of memory for an incoming connection (%zu bytes)", sizeof(*st));
            return loomSystemError;
        }
        st->fd = fd;
        st->peer = -1;
        st->stage = ST_HANDSHAKE;
        st->deadline_ns = loom_deadline_ms(ctx->timeout_ms);
        if (loom_socket_tune(fd, 0) != loomSuccess) {
            setup_free(st); /* WARNed by the socket layer; this connection only */
            continue;
        }
        res = loom_handshake_init(&st->hs, fd, ctx->secret, UCX_HS_ROLE, 1);
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

/* Checks a complete hello; 1 if the connection may go on (st->peer is set). */
static int hello_check(ucx_listen_t *l, ucx_setup_t *st)
{
    ucx_ctx_t *ctx = l->ctx;
    const uint32_t magic = get_le(st->msg);
    const int rank = (int32_t)get_le(st->msg + 4), nranks = (int32_t)get_le(st->msg + 8);
    if (magic != UCX_HELLO_MAGIC || nranks != ctx->nranks || rank < 0 || rank >= nranks ||
        rank == ctx->rank) {
        LOOM_WARN("ucx: rank %d refused a connection: hello magic 0x%08x, rank %d of %d ranks "
                  "(expected magic 0x%08x, another rank of %d)",
                  ctx->rank, magic, rank, nranks, UCX_HELLO_MAGIC, ctx->nranks);
        return 0;
    }
    if (ctx->peers[rank].comms[0] != NULL) {
        LOOM_WARN("ucx: rank %d refused a second connection from rank %d", ctx->rank, rank);
        return 0;
    }
    st->peer = rank;
    return 1;
}

/* Advances one incoming connection. *keep_p = 0: drop it (already logged, or
 * *stray_p = 1: the caller logs it as a stray with st->hs.why); *up_p = 1: the
 * reply is out and st->peer's receive connection may open (the peer's worker
 * address is kept in st->got). */
static loomResult_t accept_step(ucx_listen_t *l, ucx_setup_t *st, int *keep_p, int *stray_p,
                                int *up_p)
{
    ucx_ctx_t *ctx = l->ctx;
    char pbuf[96];
    *keep_p = 1;
    *stray_p = *up_p = 0;
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
        st->stage = ST_RECV;
    }
    if (st->stage == ST_RECV) {
        int done = 0, bad = 0;
        loomResult_t res = msg_recv(st, UCX_HELLO_BYTES, &done, &bad);
        if (res != loomSuccess || bad) {
            if (res == loomRemoteError)
                LOOM_WARN("ucx: rank %d: a connection from %s proved the job secret, then closed "
                          "before its hello",
                          ctx->rank, loom_socket_peer_str(st->fd, pbuf, sizeof(pbuf)));
            else if (bad)
                LOOM_WARN("ucx: rank %d refused a connection from %s: its hello announces a "
                          "%u-byte worker address (1 to %u bytes)",
                          ctx->rank, loom_socket_peer_str(st->fd, pbuf, sizeof(pbuf)),
                          get_le(st->msg + 12), LOOM_UCX_ADDR_MAX);
            *keep_p = 0;
            return res == loomRemoteError ? loomSuccess : res;
        }
        if (!done)
            return loomSuccess;
        if (!hello_check(l, st)) {
            *keep_p = 0;
            return loomSuccess;
        }
        /* The hello (the peer's worker address) waits in st->got for the endpoint. */
        st->got = st->msg;
        st->msg = NULL;
        LOOM_CHECK(msg_build(ctx, st, UCX_REPLY_MAGIC, UCX_REPLY_BYTES));
        st->stage = ST_SEND;
    }
    int done = 0;
    if (msg_send(st, &done) != loomSuccess) {
        LOOM_WARN("ucx: rank %d: rank %d closed the connection before taking the reply", ctx->rank,
                  st->peer);
        *keep_p = 0;
        return loomSuccess;
    }
    *up_p = done;
    return loomSuccess;
}

/* Opens the receive connection of a setup whose reply is out; *comm_p = NULL
 * when it is refused (already logged). */
static loomResult_t accept_finish(ucx_listen_t *l, ucx_setup_t *st, ucx_comm_t **comm_p)
{
    ucx_ctx_t *ctx = l->ctx;
    *comm_p = NULL;
    if (ctx->peers[st->peer].comms[0] != NULL) {
        LOOM_WARN("ucx: rank %d refused a second connection from rank %d", ctx->rank, st->peer);
        return loomSuccess;
    }
    const size_t addr_len = get_le(st->got + 12);
    LOOM_CHECK(loom_ucx_comm_open(ctx, st->peer, 0, st->got + UCX_HELLO_BYTES, addr_len, comm_p));
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d accepted rank %d", ctx->rank, st->peer);
    return loomSuccess;
}

loomResult_t loom_ucx_accept(void *listen_v, void **recv_comm_p, int *peer_p)
{
    ucx_listen_t *l = listen_v;
    ucx_ctx_t *ctx = l->ctx;
    *recv_comm_p = NULL;
    if (aborted(ctx)) {
        LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d: accept aborted", ctx->rank);
        return loomRemoteError;
    }
    l->accepting = 1;
    LOOM_CHECK(accept_new(l));
    const uint64_t now = loom_now_ns();
    ucx_setup_t *prev = NULL, *st = l->setups;
    while (st != NULL) {
        ucx_setup_t *next = st->next;
        int keep = 0, stray = 0, up = 0;
        LOOM_CHECK(accept_step(l, st, &keep, &stray, &up));
        if (stray) {
            listen_stray(l, st, prev, st->hs.why);
        } else if (keep && !up && now >= st->deadline_ns) {
            char buf[96];
            if (st->stage == ST_HANDSHAKE) {
                snprintf(buf, sizeof(buf), "no proof of the job secret within %lld ms",
                         (long long)ctx->timeout_ms);
                listen_stray(l, st, prev, buf);
            } else {
                LOOM_WARN("ucx: rank %d dropped a connection from %s: it proved the job secret "
                          "but did not finish the address exchange within %lld ms",
                          ctx->rank, loom_socket_peer_str(st->fd, buf, sizeof(buf)),
                          (long long)ctx->timeout_ms);
                listen_drop(l, st, prev);
            }
        } else if (keep && !up) {
            prev = st;
        } else if (!keep) {
            listen_drop(l, st, prev);
        } else {
            ucx_comm_t *c = NULL;
            loomResult_t res = accept_finish(l, st, &c);
            const int peer = st->peer;
            listen_drop(l, st, prev);
            LOOM_CHECK(res);
            if (c != NULL) {
                *recv_comm_p = c;
                *peer_p = peer;
                return loomSuccess;
            }
        }
        st = next;
    }
    return loomSuccess;
}

loomResult_t loom_ucx_setup_poll(ucx_ctx_t *ctx, size_t *n_p)
{
    /* A listener nobody accepts on would make every wait return at once. */
    if (ctx->listen != NULL && ctx->listen->accepting) {
        ctx->listen->accepting = 0;
        if (ctx->listen->n_setups < MAX_SETUPS)
            LOOM_CHECK(loom_ucx_pfd_add(ctx, n_p, ctx->listen->fd, POLLIN));
        for (ucx_setup_t *st = ctx->listen->setups; st != NULL; st = st->next)
            LOOM_CHECK(loom_ucx_pfd_add(ctx, n_p, st->fd,
                                        st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs)
                                        : st->stage == ST_SEND    ? POLLOUT
                                                                  : POLLIN));
    }
    for (int p = 0; p < ctx->nranks; p++) {
        const ucx_setup_t *st = ctx->connecting[p];
        if (st == NULL || st->fd < 0)
            continue;
        short ev = st->stage == ST_HANDSHAKE ? loom_handshake_events(&st->hs)
                   : st->stage == ST_RECV    ? POLLIN
                                             : POLLOUT;
        LOOM_CHECK(loom_ucx_pfd_add(ctx, n_p, st->fd, ev));
    }
    return loomSuccess;
}

loomResult_t loom_ucx_close_listen(void *listen_v)
{
    ucx_listen_t *l = listen_v;
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
        LOOM_WARN("ucx: close of the listening socket failed: %s", strerror(errno));
        res = loomSystemError;
    }
    if (l->ctx->listen == l)
        l->ctx->listen = NULL;
    free(l);
    return res;
}

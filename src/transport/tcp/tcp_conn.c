/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp_conn.c - connection setup of the tcp transport: the hello each socket
 * sends once it proved the job secret, and the assembly of a peer's several
 * sockets into one connection. The listener, the non-blocking connect and
 * accept and the secret handshake are secure_conn.c's (shared with ucx); every
 * socket of a connection goes through them on its own, exactly like the
 * first. It moves no data after the hello (tcp.c does) and never blocks.
 * Called through the table in tcp.c, by p2p.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "tcp_conn.h"
#include "timer.h"

/* Connection setup, all non-blocking, driven by repeated connect()/accept():
 *   connector: for each of its nsocks sockets: secure_conn.c connects it and
 *              proves the secret (role TCP), then sends its HELLO. The
 *              connection is up once every socket sent its hello.
 *   acceptor:  secure_conn.c accepts and proves the secret, then reads the
 *              HELLO -> check it -> keep the socket in the peer's assembly;
 *              the connection is up once the assembly holds all the sockets
 *              the hellos announced.
 * HELLO, little-endian, one of:
 *   "LMTH" (12 bytes): u32 magic, i32 rank, i32 nranks. A one-socket connection.
 *   "LMTS" (20 bytes): the same three fields with magic "LMTS", then u16 socket
 *          index, u16 sockets in the connection (2..LOOM_TCP_MAX_SOCKS), u32
 *          striping piece in bytes. Every socket of a connection announces the
 *          same count and piece (the connector's LOOM_TCP_NSOCKS and
 *          LOOM_TCP_PIECE_BYTES), so the receive side needs no setting of its own.
 * Nothing from an accepted socket is parsed before the handshake proved the
 * secret (secure_conn.c: strays are closed and logged once; at most
 * LOOM_SECURE_MAX_PENDING are held, a new one evicting the oldest); a proven
 * peer's bad hello is WARNed and its socket closed, the listener serving the
 * others. The connector's send connection is then the acceptor's receive
 * connection: data flows one way only. */

#define TCP_HANDLE_MAGIC       0x5054434cu /* "LCTP" */
#define TCP_HELLO_MAGIC        0x48544d4cu /* "LMTH" */
#define TCP_HELLO_STRIPE_MAGIC 0x53544d4cu /* "LMTS" */
#define TCP_HELLO_BYTES        12
#define TCP_HELLO_STRIPE_BYTES 20
#define TCP_HS_ROLE            0x20504354u /* "TCP ": the handshake role of data connections */

_Static_assert(LOOM_SECURE_HANDLE_BYTES <= LOOM_TP_HANDLE_MAX, "tcp handle too large");

/* "autotuned by the kernel" or "of N bytes" (LOOM_TCP_SOCKBUF), for the INFO lines. */
static const char *sockbuf_text(const tcp_ctx_t *ctx, char *buf, size_t len)
{
    if (ctx->sockbuf <= 0)
        return "autotuned by the kernel";
    snprintf(buf, len, "of %lld bytes", (long long)ctx->sockbuf);
    return buf;
}

void loom_tcp_conn_init(tcp_ctx_t *ctx)
{
    ctx->sec = (loom_secure_cfg_t){.name = "tcp",
                                   .rank = ctx->rank,
                                   .subsys = LOOM_LOG_TCP,
                                   .role = TCP_HS_ROLE,
                                   .handle_magic = TCP_HANDLE_MAGIC,
                                   .secret = ctx->secret,
                                   .sockbuf = ctx->sockbuf,
                                   .timeout_ms = ctx->timeout_ms,
                                   .abort_flag = ctx->abort_flag};
}

static loomResult_t accept_hello(void *arg, loom_secure_conn_t *c, int *verdict_p);

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
    l->ctx = ctx;
    const loom_secure_accept_t acc = {
        .hello_bytes = TCP_HELLO_BYTES, .evict = 1, .on_msg = accept_hello, .arg = l};
    loom_sockaddr_t addr = ctx->addr;
    loomResult_t res =
        loom_secure_listen_open(&l->sl, &ctx->sec, &acc, &addr, handle, LOOM_TP_HANDLE_MAX);
    if (res != loomSuccess) {
        free(l->assembling);
        free(l);
        return res;
    }
    ctx->listen = l;
    char buf[96];
    LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d listening on %s (%s)", ctx->rank,
              loom_sockaddr_str(&addr, buf, sizeof(buf)), ctx->ifname);
    *listen_p = l;
    return loomSuccess;
}

// ---- connect ----------------------------------------------------------------

void loom_tcp_connect_drop(tcp_ctx_t *ctx, int peer)
{
    tcp_connecting_t *cn = ctx->connecting[peer];
    if (cn == NULL)
        return;
    for (int i = 0; i < ctx->nsocks; i++)
        loom_secure_conn_clear(&cn->socks[i]);
    free(cn);
    ctx->connecting[peer] = NULL;
}

/* Puts the hello of socket index in c: the one-socket form when the connection has one. */
static loomResult_t hello_encode(const tcp_ctx_t *ctx, loom_secure_conn_t *c, int index)
{
    const int striped = ctx->nsocks > 1;
    uint8_t *b;
    LOOM_CHECK(loom_secure_msg_new(c, striped ? TCP_HELLO_STRIPE_BYTES : TCP_HELLO_BYTES, &b));
    loom_secure_put_le(b, striped ? TCP_HELLO_STRIPE_MAGIC : TCP_HELLO_MAGIC, 4);
    loom_secure_put_le(b + 4, (uint32_t)ctx->rank, 4);
    loom_secure_put_le(b + 8, (uint32_t)ctx->nranks, 4);
    if (striped) {
        loom_secure_put_le(b + 12, (uint32_t)index, 2);
        loom_secure_put_le(b + 14, (uint32_t)ctx->nsocks, 2);
        loom_secure_put_le(b + 16, ctx->piece_bytes, 4);
    }
    return loomSuccess;
}

/* Starts a connect to peer: one setup per socket. */
static loomResult_t connect_begin(tcp_ctx_t *ctx, const void *handle, int peer)
{
    loom_sockaddr_t addr;
    LOOM_CHECK(loom_secure_handle_decode(&ctx->sec, handle, peer, &addr));
    tcp_connecting_t *cn = calloc(1, sizeof(*cn));
    if (cn == NULL) {
        LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*cn));
        return loomSystemError;
    }
    ctx->connecting[peer] = cn;
    const uint64_t deadline = loom_deadline_ms(ctx->timeout_ms);
    for (int i = 0; i < ctx->nsocks; i++)
        loom_secure_connect_init(&cn->socks[i], &addr, peer, deadline);
    for (int i = 0; i < ctx->nsocks; i++) {
        loomResult_t res = hello_encode(ctx, &cn->socks[i], i);
        if (res != loomSuccess) {
            loom_tcp_connect_drop(ctx, peer);
            return res;
        }
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
    if (ctx->connecting[peer] == NULL)
        LOOM_CHECK(connect_begin(ctx, handle, peer));
    tcp_connecting_t *cn = ctx->connecting[peer];
    for (int i = 0; i < ctx->nsocks; i++) {
        if (cn->ready[i])
            continue;
        int ready = 0;
        loomResult_t res = loom_secure_connect_step(&cn->socks[i], &ctx->sec, NULL, NULL, &ready);
        if (res != loomSuccess) {
            loom_tcp_connect_drop(ctx, peer);
            return res;
        }
        cn->ready[i] = (uint8_t)ready;
        cn->nready += ready;
    }
    if (cn->nready < ctx->nsocks) {
        const loom_secure_conn_t *st = &cn->socks[0];
        if (loom_now_ns() >= st->deadline_ns) {
            for (int i = 0; i < ctx->nsocks; i++)
                if (!cn->ready[i]) {
                    st = &cn->socks[i];
                    break;
                }
            LOOM_WARN("tcp: rank %d could not connect to rank %d at %s within %lld ms (socket %d "
                      "of %d: %s)",
                      ctx->rank, peer, loom_sockaddr_str(&st->addr, buf, sizeof(buf)),
                      (long long)ctx->timeout_ms, (int)(st - cn->socks), ctx->nsocks,
                      st->stage == LOOM_SECURE_START ? strerror(st->last_errno) : "no answer");
            loom_tcp_connect_drop(ctx, peer);
            return loomTimeout;
        }
        *send_comm_p = NULL;
        return loomSuccess;
    }
    int fds[LOOM_TCP_MAX_SOCKS];
    for (int i = 0; i < ctx->nsocks; i++) {
        fds[i] = cn->socks[i].fd;
        cn->socks[i].fd = -1;
    }
    loom_tcp_connect_drop(ctx, peer);
    tcp_comm_t *c;
    char sb[48];
    LOOM_CHECK(loom_tcp_comm_create(ctx, fds, ctx->nsocks, ctx->piece_bytes, peer, 1, &c));
    LOOM_INFO(LOOM_LOG_TCP,
              "tcp: rank %d connected to rank %d (%d sockets, %u-byte pieces, socket buffers %s)",
              ctx->rank, peer, ctx->nsocks, ctx->piece_bytes, sockbuf_text(ctx, sb, sizeof(sb)));
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

/* What a complete hello says. */
typedef struct {
    uint32_t magic;
    int rank, nranks;
    int index, nsocks;
    uint32_t piece_bytes;
} hello_t;

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
static loomResult_t assembly_add(tcp_listen_t *l, const hello_t *h, int fd, int *complete_p)
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
    a->fds[h->index] = fd;
    a->have++;
    *complete_p = a->have == a->nsocks;
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
    char sb[48];
    LOOM_INFO(LOOM_LOG_TCP,
              "tcp: rank %d accepted rank %d (%d sockets, %u-byte pieces, socket buffers %s)",
              ctx->rank, peer, nsocks, piece, sockbuf_text(ctx, sb, sizeof(sb)));
    return loomSuccess;
}

/* secure_conn.c's verdict on a proven socket's hello, read as far as its
 * magic tells: refused (WARNed), kept in its peer's assembly, or the last
 * socket of that assembly (then the receive connection is in c->up). */
static loomResult_t accept_hello(void *arg, loom_secure_conn_t *c, int *verdict_p)
{
    tcp_listen_t *l = arg;
    const uint8_t *b = c->msg;
    *verdict_p = LOOM_SECURE_MORE;
    if (c->msg_want == TCP_HELLO_BYTES && loom_secure_get_le(b, 4) == TCP_HELLO_STRIPE_MAGIC)
        return loom_secure_msg_grow(c, TCP_HELLO_STRIPE_BYTES);
    hello_t h = {.magic = loom_secure_get_le(b, 4),
                 .rank = (int32_t)loom_secure_get_le(b + 4, 4),
                 .nranks = (int32_t)loom_secure_get_le(b + 8, 4),
                 .index = 0,
                 .nsocks = 1,
                 .piece_bytes = 0};
    if (h.magic == TCP_HELLO_STRIPE_MAGIC) {
        h.index = (int)loom_secure_get_le(b + 12, 2);
        h.nsocks = (int)loom_secure_get_le(b + 14, 2);
        h.piece_bytes = loom_secure_get_le(b + 16, 4);
    }
    *verdict_p = LOOM_SECURE_CLOSE;
    if (!hello_check(l, &h))
        return loomSuccess;
    int complete = 0;
    LOOM_CHECK(assembly_add(l, &h, c->fd, &complete));
    c->fd = -1;
    if (!complete)
        return loomSuccess;
    tcp_comm_t *comm;
    LOOM_CHECK(assembly_finish(l, h.rank, &comm));
    c->up = comm;
    c->peer = h.rank;
    *verdict_p = LOOM_SECURE_UP;
    return loomSuccess;
}

loomResult_t loom_tcp_accept(void *listen_v, void **recv_comm_p, int *peer_p)
{
    tcp_listen_t *l = listen_v;
    return loom_secure_listen_accept(&l->sl, recv_comm_p, peer_p);
}

loomResult_t loom_tcp_setup_poll(tcp_ctx_t *ctx)
{
    if (ctx->listen != NULL)
        LOOM_CHECK(loom_secure_listen_poll(&ctx->listen->sl, &ctx->pollset));
    for (int p = 0; p < ctx->nranks; p++) {
        const tcp_connecting_t *cn = ctx->connecting[p];
        for (int i = 0; cn != NULL && i < ctx->nsocks; i++)
            if (!cn->ready[i])
                LOOM_CHECK(loom_secure_conn_poll(&cn->socks[i], &ctx->pollset));
    }
    return loomSuccess;
}

loomResult_t loom_tcp_close_listen(void *listen_v)
{
    tcp_listen_t *l = listen_v;
    if (l == NULL)
        return loomSuccess;
    for (int p = 0; p < l->ctx->nranks; p++)
        assembly_free(l->assembling[p]);
    free(l->assembling);
    if (l->ctx->listen == l)
        l->ctx->listen = NULL;
    loomResult_t res = loom_secure_listen_close(&l->sl);
    free(l);
    return res;
}

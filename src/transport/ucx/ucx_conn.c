/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx_conn.c - connection setup of the ucx transport over a TCP side channel:
 * the exchange of ranks and UCP worker addresses once the side channel proved
 * the job secret, and the hand-over to ucx.c, which opens the UCP endpoint.
 * The listener, the non-blocking connect and accept and the handshake are
 * secure_conn.c's (shared with tcp). The side-channel socket is closed as
 * soon as the addresses crossed it; it carries no data. Never blocks. Called
 * through the table in ucx.c, by p2p.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "debug.h"
#include "timer.h"
#include "ucx.h"

/* Why a side channel: a UCP worker address does not fit the 128-byte listen
 * handle (UCX 1.13 on one host: 79 bytes with UCX_TLS=tcp, 145 with sm,self,
 * more with every device), and UCP's own listener (ucp_listener_create) cannot
 * give an endpoint shared-memory lanes: with UCX_TLS=sm,self its connection
 * fails as unreachable. So the handle is a TCP address, like tcp's, and:
 *   connector: secure_conn.c connects and proves the secret (role UCX) ->
 *              HELLO -> read REPLY -> endpoint to the listener's worker: the
 *              send connection.
 *   acceptor:  secure_conn.c accepts and proves the secret -> read HELLO ->
 *              check it -> REPLY -> endpoint to the connector's worker: the
 *              receive connection.
 * HELLO, little-endian: u32 magic "LMUH", i32 rank, i32 nranks, u32 address
 * bytes, then the connector's worker address. REPLY: u32 magic "LMUR", u32
 * address bytes, then the acceptor's worker address. Addresses longer than
 * LOOM_UCX_ADDR_MAX are refused. Nothing from an accepted socket is parsed
 * before the handshake proved the job secret, and a worker address is sent
 * only to a peer that proved it. At most LOOM_SECURE_MAX_PENDING connections
 * are set up at once: more wait in the backlog (no eviction). */

#define UCX_HANDLE_MAGIC 0x5843554cu /* "LUCX" */
#define UCX_HELLO_MAGIC  0x48554d4cu /* "LMUH" */
#define UCX_REPLY_MAGIC  0x52554d4cu /* "LMUR" */
#define UCX_HELLO_BYTES  16          /* header; the address follows */
#define UCX_REPLY_BYTES  8
#define UCX_HS_ROLE      0x20584355u /* "UCX ": the handshake role of ucx side channels */

_Static_assert(LOOM_SECURE_HANDLE_BYTES <= LOOM_TP_HANDLE_MAX, "ucx handle too large");

void loom_ucx_conn_init(ucx_ctx_t *ctx)
{
    ctx->sec = (loom_secure_cfg_t){.name = "ucx",
                                   .rank = ctx->rank,
                                   .subsys = LOOM_LOG_UCX,
                                   .role = UCX_HS_ROLE,
                                   .handle_magic = UCX_HANDLE_MAGIC,
                                   .secret = ctx->secret,
                                   .sockbuf = 0,
                                   .timeout_ms = ctx->timeout_ms,
                                   .abort_flag = ctx->abort_flag};
}

/* Puts a message of hdr_bytes + this worker's address in c, to be sent. */
static loomResult_t msg_build(ucx_ctx_t *ctx, loom_secure_conn_t *c, uint32_t magic,
                              size_t hdr_bytes)
{
    uint8_t *m;
    LOOM_CHECK(loom_secure_msg_new(c, hdr_bytes + ctx->my_addr_len, &m));
    loom_secure_put_le(m, magic, 4);
    if (magic == UCX_HELLO_MAGIC) {
        loom_secure_put_le(m + 4, (uint32_t)ctx->rank, 4);
        loom_secure_put_le(m + 8, (uint32_t)ctx->nranks, 4);
    }
    loom_secure_put_le(m + hdr_bytes - 4, (uint32_t)ctx->my_addr_len, 4);
    memcpy(m + hdr_bytes, ctx->my_addr, ctx->my_addr_len);
    return loomSuccess;
}

/* The worker address bytes that the header of c's message (its first
 * hdr_bytes, the last word) announces; 0 if out of bounds (1 to LOOM_UCX_ADDR_MAX). */
static uint32_t addr_bytes(const loom_secure_conn_t *c, size_t hdr_bytes)
{
    const uint32_t len = loom_secure_get_le(c->msg + hdr_bytes - 4, 4);
    return len > LOOM_UCX_ADDR_MAX ? 0 : len;
}

static loomResult_t accept_msg(void *arg, loom_secure_conn_t *c, int *verdict_p);

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
    l->ctx = ctx;
    const loom_secure_accept_t acc = {
        .hello_bytes = UCX_HELLO_BYTES, .evict = 0, .on_msg = accept_msg, .arg = l};
    loom_sockaddr_t addr = ctx->sockaddr;
    loomResult_t res =
        loom_secure_listen_open(&l->sl, &ctx->sec, &acc, &addr, handle, LOOM_TP_HANDLE_MAX);
    if (res != loomSuccess) {
        free(l);
        return res;
    }
    ctx->listen = l;
    char buf[96];
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d listening on %s (%s) for worker address exchange",
              ctx->rank, loom_sockaddr_str(&addr, buf, sizeof(buf)), ctx->ifname);
    *listen_p = l;
    return loomSuccess;
}

// ---- connect ----------------------------------------------------------------

void loom_ucx_connect_drop(ucx_ctx_t *ctx, int peer)
{
    loom_secure_conn_free(ctx->connecting[peer]);
    ctx->connecting[peer] = NULL;
}

/* secure_conn.c's connector at a message boundary: the hello is out (read the
 * reply's header), the reply's header is in (read its address), or all of
 * the reply is in (up). */
static loomResult_t connect_msg(void *arg, loom_secure_conn_t *c, int *verdict_p)
{
    ucx_ctx_t *ctx = arg;
    *verdict_p = LOOM_SECURE_MORE;
    if (c->stage == LOOM_SECURE_SEND) {
        c->stage = LOOM_SECURE_RECV;
        return loom_secure_msg_new(c, UCX_REPLY_BYTES, NULL);
    }
    if (c->msg_want > UCX_REPLY_BYTES) {
        *verdict_p = LOOM_SECURE_UP;
        return loomSuccess;
    }
    const uint32_t len = addr_bytes(c, UCX_REPLY_BYTES);
    if (loom_secure_get_le(c->msg, 4) != UCX_REPLY_MAGIC || len == 0) {
        LOOM_WARN("ucx: rank %d: rank %d sent a bad reply (magic 0x%08x, %u-byte worker "
                  "address; at most %u bytes)",
                  ctx->rank, c->peer, loom_secure_get_le(c->msg, 4),
                  loom_secure_get_le(c->msg + 4, 4), LOOM_UCX_ADDR_MAX);
        *verdict_p = LOOM_SECURE_CLOSE;
        return loomSuccess;
    }
    return loom_secure_msg_grow(c, UCX_REPLY_BYTES + len);
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
    loom_secure_conn_t *c = ctx->connecting[peer];
    if (c == NULL && ctx->peers[peer].comms[1] != NULL) {
        LOOM_WARN("ucx: rank %d is already connected to rank %d", ctx->rank, peer);
        return loomInvalidUsage;
    }
    loomResult_t res = loomSuccess;
    if (c == NULL) {
        loom_sockaddr_t addr;
        LOOM_CHECK(loom_secure_handle_decode(&ctx->sec, handle, peer, &addr));
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            LOOM_WARN("ucx: out of memory for a connection to rank %d", peer);
            return loomSystemError;
        }
        loom_secure_connect_init(c, &addr, peer, loom_deadline_ms(ctx->timeout_ms));
        ctx->connecting[peer] = c;
        res = msg_build(ctx, c, UCX_HELLO_MAGIC, UCX_HELLO_BYTES);
    }
    int up = 0;
    if (res == loomSuccess)
        res = loom_secure_connect_step(c, &ctx->sec, connect_msg, ctx, &up);
    if (res != loomSuccess) {
        loom_ucx_connect_drop(ctx, peer);
        return res;
    }
    if (!up) {
        if (c->stage == LOOM_SECURE_START && loom_now_ns() >= c->deadline_ns) {
            char buf[96];
            LOOM_WARN("ucx: rank %d could not connect to rank %d at %s within %lld ms: %s",
                      ctx->rank, peer, loom_sockaddr_str(&c->addr, buf, sizeof(buf)),
                      (long long)ctx->timeout_ms, strerror(c->last_errno));
            loom_ucx_connect_drop(ctx, peer);
            return loomTimeout;
        }
        return loomSuccess;
    }
    ucx_comm_t *comm;
    res = loom_ucx_comm_open(ctx, peer, 1, c->msg + UCX_REPLY_BYTES, c->msg_want - UCX_REPLY_BYTES,
                             &comm);
    loom_ucx_connect_drop(ctx, peer);
    LOOM_CHECK(res);
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d connected to rank %d", ctx->rank, peer);
    *send_comm_p = comm;
    return loomSuccess;
}

// ---- accept -----------------------------------------------------------------

/* Checks a complete hello; 1 if the connection may go on (c->peer is set). */
static int hello_check(ucx_listen_t *l, loom_secure_conn_t *c)
{
    ucx_ctx_t *ctx = l->ctx;
    const uint32_t magic = loom_secure_get_le(c->msg, 4);
    const int rank = (int32_t)loom_secure_get_le(c->msg + 4, 4),
              nranks = (int32_t)loom_secure_get_le(c->msg + 8, 4);
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
    c->peer = rank;
    return 1;
}

/* Opens the receive connection once the reply is out (c->kept holds the
 * peer's hello); refuses it (WARNed) if one opened meanwhile. */
static loomResult_t accept_finish(ucx_listen_t *l, loom_secure_conn_t *c, int *verdict_p)
{
    ucx_ctx_t *ctx = l->ctx;
    if (ctx->peers[c->peer].comms[0] != NULL) {
        LOOM_WARN("ucx: rank %d refused a second connection from rank %d", ctx->rank, c->peer);
        return loomSuccess;
    }
    ucx_comm_t *comm;
    LOOM_CHECK(loom_ucx_comm_open(ctx, c->peer, 0, c->kept + UCX_HELLO_BYTES,
                                  loom_secure_get_le(c->kept + 12, 4), &comm));
    LOOM_INFO(LOOM_LOG_UCX, "ucx: rank %d accepted rank %d", ctx->rank, c->peer);
    c->up = comm;
    *verdict_p = LOOM_SECURE_UP;
    return loomSuccess;
}

/* secure_conn.c's acceptor at a message boundary: the hello's header is in
 * (read its address), all of the hello is in (check it, send the reply), or
 * the reply is out (open the receive connection). */
static loomResult_t accept_msg(void *arg, loom_secure_conn_t *c, int *verdict_p)
{
    ucx_listen_t *l = arg;
    char pbuf[96];
    *verdict_p = LOOM_SECURE_CLOSE;
    if (c->stage == LOOM_SECURE_SEND)
        return accept_finish(l, c, verdict_p);
    if (c->msg_want == UCX_HELLO_BYTES) {
        const uint32_t len = addr_bytes(c, UCX_HELLO_BYTES);
        if (len == 0) {
            LOOM_WARN("ucx: rank %d refused a connection from %s: its hello announces a "
                      "%u-byte worker address (1 to %u bytes)",
                      l->ctx->rank, loom_socket_peer_str(c->fd, pbuf, sizeof(pbuf)),
                      loom_secure_get_le(c->msg + 12, 4), LOOM_UCX_ADDR_MAX);
            return loomSuccess;
        }
        *verdict_p = LOOM_SECURE_MORE;
        return loom_secure_msg_grow(c, UCX_HELLO_BYTES + len);
    }
    if (!hello_check(l, c))
        return loomSuccess;
    /* The hello (the peer's worker address) waits in c->kept for the endpoint. */
    c->kept = c->msg;
    c->msg = NULL;
    c->stage = LOOM_SECURE_SEND;
    *verdict_p = LOOM_SECURE_MORE;
    return msg_build(l->ctx, c, UCX_REPLY_MAGIC, UCX_REPLY_BYTES);
}

loomResult_t loom_ucx_accept(void *listen_v, void **recv_comm_p, int *peer_p)
{
    ucx_listen_t *l = listen_v;
    return loom_secure_listen_accept(&l->sl, recv_comm_p, peer_p);
}

loomResult_t loom_ucx_setup_poll(ucx_ctx_t *ctx)
{
    if (ctx->listen != NULL)
        LOOM_CHECK(loom_secure_listen_poll(&ctx->listen->sl, &ctx->pollset));
    for (int p = 0; p < ctx->nranks; p++)
        if (ctx->connecting[p] != NULL)
            LOOM_CHECK(loom_secure_conn_poll(ctx->connecting[p], &ctx->pollset));
    return loomSuccess;
}

loomResult_t loom_ucx_close_listen(void *listen_v)
{
    ucx_listen_t *l = listen_v;
    if (l == NULL)
        return loomSuccess;
    loomResult_t res = loom_secure_listen_close(&l->sl);
    if (l->ctx->listen == l)
        l->ctx->listen = NULL;
    free(l);
    return res;
}

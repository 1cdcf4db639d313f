/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp.c - the tcp transport (loom_tp_tcp): per peer and direction one
 * connection of LOOM_TCP_NSOCKS sockets, each authenticated with the job
 * secret (tcp_conn.c), carrying wire.c frames; payloads longer than
 * LOOM_TCP_PIECE_BYTES are striped across the sockets, shorter ones stay on
 * the first. It is the fallback that reaches every peer; it does not pick
 * ranks' transports (transport.c and p2p.c do) and has no progress thread:
 * data moves only inside isend() (what the sockets take at once) and test(),
 * waits happen in wait(). Called through the table at the end of this file
 * by p2p.c.
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
#include "tcp_conn.h"
#include "timer.h"

/* Per-byte and per-message costs (measurements in docs/PERFORMANCE.md):
 * - payloads go from the caller's buffer to the socket and from the socket
 *   into the caller's buffer (sendmsg/readv on iovecs): the kernel's copy is
 *   the only one (MSG_ZEROCOPY costs more CPU on loopback, so it is not used);
 * - small messages batch: one sendmsg carries every queued frame, and a
 *   receive connection's read-ahead takes a small message with its header in
 *   one readv;
 * - isend writes what the sockets take at once, so a message leaves when it
 *   is posted rather than at the next test;
 * - TCP_NODELAY on every socket; SO_SNDBUF/SO_RCVBUF only if LOOM_TCP_SOCKBUF
 *   asks: by default the kernel autotunes them, which keeps a window small
 *   until the connection shows it needs more, so a receiver copies out bytes
 *   the sender has just written rather than megabytes queued ahead of it;
 * - no spinning here: p2p.c spins LOOM_SPIN_US before it calls wait(). */

/* Bytes a receive connection reads past a frame header (wire.c's read-ahead):
 * enough for a small message and the header after it in one readv. */
#define TCP_READAHEAD_BYTES 4096

// ---- byte channel for wire.c ---------------------------------------------

static int gone_errno(int e)
{
    return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ETIMEDOUT ||
           e == EHOSTUNREACH || e == ENETUNREACH || e == ENOTCONN;
}

/* " (socket 2 of 4)" for connections of several sockets, else "". */
static const char *sock_name(const tcp_sock_t *k, char *buf, size_t len)
{
    if (k->comm->nsocks == 1)
        buf[0] = '\0';
    else
        snprintf(buf, len, " (socket %d of %d)", k->index, k->comm->nsocks);
    return buf;
}

static loomResult_t tcp_writev(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                               int *gone_errno_p)
{
    tcp_sock_t *k = chan;
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = (struct iovec *)iov;
    msg.msg_iovlen = (size_t)iovcnt;
    ssize_t n;
    do {
        n = sendmsg(k->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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
        char sb[48];
        LOOM_WARN("tcp: rank %d: sendmsg to rank %d%s failed: %s", k->comm->ctx->rank,
                  k->comm->peer, sock_name(k, sb, sizeof(sb)), strerror(errno));
        return loomSystemError;
    }
    *nbytes_p = (size_t)n;
    return loomSuccess;
}

static loomResult_t tcp_readv(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                              int *gone_errno_p)
{
    tcp_sock_t *k = chan;
    ssize_t n;
    do {
        n = readv(k->fd, iov, iovcnt);
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
        char sb[48];
        LOOM_WARN("tcp: rank %d: readv from rank %d%s failed: %s", k->comm->ctx->rank,
                  k->comm->peer, sock_name(k, sb, sizeof(sb)), strerror(errno));
        return loomSystemError;
    }
    *nbytes_p = (size_t)n;
    return loomSuccess;
}

static const loom_wire_io_t tcp_io = {.writev = tcp_writev, .readv = tcp_readv};

// ---- connections --------------------------------------------------------------

static void close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

loomResult_t loom_tcp_comm_create(tcp_ctx_t *ctx, const int *fds, int nsocks, uint32_t piece_bytes,
                                  int peer, int is_send, tcp_comm_t **comm_p)
{
    tcp_comm_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        LOOM_WARN("tcp: out of memory for a connection to rank %d (%zu bytes)", peer, sizeof(*c));
        close_fds(fds, nsocks);
        return loomSystemError;
    }
    c->ctx = ctx;
    c->peer = peer;
    c->is_send = is_send;
    c->nsocks = nsocks;
    void *chans[LOOM_TCP_MAX_SOCKS] = {NULL};
    for (int i = 0; i < nsocks; i++) {
        c->socks[i] = (tcp_sock_t){.comm = c, .fd = fds[i], .index = i};
        chans[i] = &c->socks[i];
    }
    loom_wire_init(&c->stream, &tcp_io, &c->socks[0], "tcp", ctx->rank, peer, ctx->quiet_flag);
    loom_wire_set_stamp(&c->stream, ctx->stamp_ops);
    loomResult_t res = loom_wire_set_lanes(&c->stream, nsocks, chans, piece_bytes);
    if (res == loomSuccess && !is_send)
        res = loom_wire_set_readahead(&c->stream, TCP_READAHEAD_BYTES);
    if (res != loomSuccess) {
        loom_wire_fini(&c->stream);
        close_fds(fds, nsocks);
        free(c);
        return res;
    }
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
    loom_wire_fini(&c->stream);
    for (int i = 0; i < c->nsocks; i++) {
        if (close(c->socks[i].fd) != 0) {
            char sb[48];
            LOOM_WARN("tcp: close of the connection %s rank %d%s failed: %s",
                      c->is_send ? "to" : "from", c->peer, sock_name(&c->socks[i], sb, sizeof(sb)),
                      strerror(errno));
            res = loomSystemError;
        }
    }
    free(c);
    return res;
}

// ---- init ---------------------------------------------------------------------

static loomResult_t tcp_finalize(void *ctx_v);

/* LOOM_TCP_NSOCKS and LOOM_TCP_PIECE_BYTES, checked against the wire's bounds. */
static loomResult_t read_params(tcp_ctx_t *ctx)
{
    const int64_t nsocks = loom_param_TCP_NSOCKS(), piece = loom_param_TCP_PIECE_BYTES();
    if (nsocks < 1 || nsocks > LOOM_TCP_MAX_SOCKS) {
        LOOM_WARN("LOOM_TCP_NSOCKS=%lld is out of range: 1 to %d sockets per peer and direction",
                  (long long)nsocks, LOOM_TCP_MAX_SOCKS);
        return loomInvalidArgument;
    }
    if (piece < LOOM_TCP_MIN_PIECE_BYTES || piece > LOOM_TCP_MAX_PIECE_BYTES) {
        LOOM_WARN("LOOM_TCP_PIECE_BYTES=%lld is out of range: %u to %u bytes", (long long)piece,
                  LOOM_TCP_MIN_PIECE_BYTES, LOOM_TCP_MAX_PIECE_BYTES);
        return loomInvalidArgument;
    }
    ctx->nsocks = (int)nsocks;
    ctx->piece_bytes = (uint32_t)piece;
    ctx->sockbuf = loom_param_TCP_SOCKBUF();
    return loomSuccess;
}

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
    ctx->stamp_ops = args->stamp_ops;
    ctx->connecting = calloc((size_t)args->nranks, sizeof(*ctx->connecting));
    ctx->send_up = calloc((size_t)args->nranks, 1);
    ctx->recv_up = calloc((size_t)args->nranks, 1);
    if (ctx->connecting == NULL || ctx->send_up == NULL || ctx->recv_up == NULL) {
        LOOM_WARN("tcp: out of memory for the connection tables of %d ranks", args->nranks);
        res = loomSystemError;
        goto err_free;
    }
    LOOM_CHECK_GOTO(read_params(ctx), res, err_free);
    loom_tcp_conn_init(ctx);
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
    loom_wire_req_t *r;
    LOOM_CHECK(loom_wire_isend(&c->stream, buf, len, tag, &r));
    /* Hand the sockets what they take now; a failure lands in the request. */
    (void)loom_wire_push(&c->stream);
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
    loom_wire_req_t *r;
    LOOM_CHECK(loom_wire_irecv(&c->stream, buf, len, tag, &r));
    *req_p = r;
    return loomSuccess;
}

static loomResult_t tcp_test(void *req, int *done_p, size_t *nbytes_p)
{
    return loom_wire_test(req, done_p, nbytes_p);
}

static loomResult_t tcp_wait(void *ctx_v, int timeout_us)
{
    tcp_ctx_t *ctx = ctx_v;
    ctx->pollset.n = 0;
    for (tcp_comm_t *c = ctx->comms; c != NULL; c = c->next) {
        if (loom_wire_buffered(&c->stream))
            timeout_us = 0; /* a test() can progress without the socket */
        for (int i = 0; i < c->nsocks; i++) {
            short ev = (short)((loom_wire_lane_wants_write(&c->stream, i) ? POLLOUT : 0) |
                               (loom_wire_lane_wants_read(&c->stream, i) ? POLLIN : 0));
            if (ev != 0)
                LOOM_CHECK(loom_pollset_add(&ctx->pollset, c->socks[i].fd, ev));
        }
    }
    LOOM_CHECK(loom_tcp_setup_poll(ctx));
    const size_t n = ctx->pollset.n;
    if (timeout_us < 0)
        timeout_us = 0;
    struct timespec ts = {.tv_sec = timeout_us / 1000000,
                          .tv_nsec = (timeout_us % 1000000) * 1000L};
    if (ppoll(ctx->pollset.fds, n, &ts, NULL) < 0 && errno != EINTR) {
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

static loomResult_t tcp_finalize(void *ctx_v)
{
    tcp_ctx_t *ctx = ctx_v;
    loomResult_t res = loomSuccess;
    if (ctx == NULL)
        return loomSuccess;
    if (ctx->listen != NULL)
        LOOM_CHECK_IGNORE(loom_tcp_close_listen(ctx->listen), res);
    while (ctx->comms != NULL) {
        LOOM_INFO(LOOM_LOG_TCP, "tcp: rank %d: connection %s rank %d still open at finalize",
                  ctx->rank, ctx->comms->is_send ? "to" : "from", ctx->comms->peer);
        LOOM_CHECK_IGNORE(comm_destroy(ctx->comms), res);
    }
    if (ctx->connecting != NULL)
        for (int p = 0; p < ctx->nranks; p++)
            loom_tcp_connect_drop(ctx, p);
    free(ctx->connecting);
    free(ctx->send_up);
    free(ctx->recv_up);
    free(ctx->pollset.fds);
    loom_secret_wipe(ctx->secret, sizeof(ctx->secret));
    free(ctx);
    return res;
}

const loom_tp_t loom_tp_tcp = {
    .abi_version = LOOM_TP_ABI_V1,
    .name = "tcp",
    .init = tcp_init,
    .finalize = tcp_finalize,
    .can_connect = tcp_can_connect,
    .listen = loom_tcp_listen,
    .connect = loom_tcp_connect,
    .accept = loom_tcp_accept,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .test = tcp_test,
    .wait = tcp_wait,
    .close_send = tcp_close_comm,
    .close_recv = tcp_close_comm,
    .close_listen = loom_tcp_close_listen,
};

/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp_conn.h - the tcp transport's shared state (context, listener,
 * connections and their sockets) and its connection setup: listen, the
 * non-blocking connect and accept (secret handshake: secure_conn.h) and the
 * hello, several sockets per peer and direction assembled into one connection.
 * The data path (framing over the sockets, wait, the table) is tcp.c; this
 * header is private to the tcp folder.
 */
#ifndef LOOM_TCP_CONN_H
#define LOOM_TCP_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "secure_conn.h"
#include "transport.h"
#include "wire.h"

#define LOOM_TCP_MAX_SOCKS       LOOM_WIRE_MAX_LANES /* sockets per peer and direction */
#define LOOM_TCP_MIN_PIECE_BYTES 4096u
#define LOOM_TCP_MAX_PIECE_BYTES (1u << 30)

typedef struct tcp_comm tcp_comm_t;
typedef struct tcp_ctx tcp_ctx_t;

/* One socket of a connection: the stream's lane `index`. */
typedef struct {
    tcp_comm_t *comm;
    int fd;
    int index;
} tcp_sock_t;

/* A connection (one direction to or from one peer) over nsocks sockets. */
struct tcp_comm {
    tcp_comm_t *prev, *next;
    tcp_ctx_t *ctx;
    int peer;
    int is_send;
    int nsocks;
    tcp_sock_t socks[LOOM_TCP_MAX_SOCKS];
    loom_wire_t stream;
};

/* A send connection being set up: every socket runs its own setup. */
typedef struct {
    loom_secure_conn_t socks[LOOM_TCP_MAX_SOCKS]; /* [ctx->nsocks] */
    uint8_t ready[LOOM_TCP_MAX_SOCKS];            /* its hello is out */
    int nready;
} tcp_connecting_t;

/* The sockets of a peer's send connection that proved themselves so far. */
typedef struct {
    int nsocks;
    uint32_t piece_bytes;
    int have;
    int fds[LOOM_TCP_MAX_SOCKS]; /* -1 until that socket arrived */
} tcp_assembly_t;

typedef struct {
    tcp_ctx_t *ctx;
    loom_secure_listen_t sl;     /* the socket and the sockets being set up */
    tcp_assembly_t **assembling; /* [nranks] incomplete connections from each peer */
} tcp_listen_t;

struct tcp_ctx {
    int rank;
    int nranks;
    uint8_t secret[LOOM_SECRET_BYTES];
    loom_secure_cfg_t sec; /* connection setup (loom_tcp_conn_init) */
    int64_t timeout_ms;
    int64_t sockbuf;
    int nsocks;           /* sockets of each send connection (LOOM_TCP_NSOCKS) */
    uint32_t piece_bytes; /* striping piece of send connections (LOOM_TCP_PIECE_BYTES) */
    volatile const int *abort_flag;
    volatile const int *quiet_flag;
    const loom_tp_stamp_ops_t *stamp_ops; /* the init args': every stream stamps with them */
    loom_sockaddr_t addr;
    char ifname[64];
    tcp_listen_t *listen;
    tcp_comm_t *comms;             /* every open connection, for wait() */
    tcp_connecting_t **connecting; /* [nranks] connects in progress */
    uint8_t *send_up;              /* [nranks] send connection established */
    uint8_t *recv_up;              /* [nranks] receive connection established */
    loom_pollset_t pollset;        /* wait()'s scratch array */
};

/* Creates a connection over fds[nsocks] (owned by it from now on, also on
 * failure) and links it into ctx. Defined in tcp.c. */
loomResult_t loom_tcp_comm_create(tcp_ctx_t *ctx, const int *fds, int nsocks, uint32_t piece_bytes,
                                  int peer, int is_send, tcp_comm_t **comm_p);

/* Fills ctx->sec once ctx's settings are read (init). */
void loom_tcp_conn_init(tcp_ctx_t *ctx);
/* The table members of connection setup (contracts in transport.h). */
loomResult_t loom_tcp_listen(void *ctx, void *handle, void **listen_p);
loomResult_t loom_tcp_connect(void *ctx, const void *handle, int peer, void **send_comm_p);
loomResult_t loom_tcp_accept(void *listen, void **recv_comm_p, int *peer_p);
loomResult_t loom_tcp_close_listen(void *listen);
/* Abandons a connect in progress to peer (finalize). */
void loom_tcp_connect_drop(tcp_ctx_t *ctx, int peer);
/* Adds the poll entries of the sockets being set up to ctx->pollset (wait()). */
loomResult_t loom_tcp_setup_poll(tcp_ctx_t *ctx);

#endif

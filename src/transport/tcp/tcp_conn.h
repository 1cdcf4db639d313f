/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp_conn.h - the tcp transport's shared state (context, listener,
 * connections and their sockets) and its connection setup: listen, the
 * non-blocking connect and accept with the secret handshake and the hello,
 * several sockets per peer and direction assembled into one connection.
 * The data path (framing over the sockets, wait, the table) is tcp.c; this
 * header is private to the tcp folder.
 */
#ifndef LOOM_TCP_CONN_H
#define LOOM_TCP_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "secret.h"
#include "socket.h"
#include "stream.h"
#include "transport.h"

#define LOOM_TCP_MAX_SOCKS       LOOM_TP_STREAM_MAX_LANES /* sockets per peer and direction */
#define LOOM_TCP_MIN_PIECE_BYTES 4096u
#define LOOM_TCP_MAX_PIECE_BYTES (1u << 30)
#define LOOM_TCP_HELLO_MAX       20 /* bytes of the longest hello */

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
    loom_tp_stream_t stream;
};

/* One socket being set up, on either end. */
typedef struct tcp_setup {
    struct tcp_setup *next;
    int fd;
    int stage;
    int peer;             /* connector: the target rank */
    int index;            /* connector: which socket of the connection */
    int last_errno;       /* connector: why the last attempt failed */
    uint64_t accepted_ns; /* acceptor: when accepted (eviction picks the oldest) */
    uint64_t deadline_ns;
    uint64_t retry_at_ns;
    loom_sockaddr_t addr; /* connector: the listener */
    loom_handshake_t hs;
    uint8_t hello[LOOM_TCP_HELLO_MAX];
    size_t hello_have;
    size_t hello_want; /* bytes of this hello (known once its magic is read) */
} tcp_setup_t;

/* A send connection being set up: every socket runs its own setup. */
typedef struct {
    tcp_setup_t *socks[LOOM_TCP_MAX_SOCKS];
    uint8_t ready[LOOM_TCP_MAX_SOCKS];
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
    int fd;
    tcp_setup_t *setups; /* accepted, hello not yet received */
    int n_setups;
    int accepting; /* accept() ran since the last wait(): the caller waits for peers */
    int fd_warned; /* out of descriptors was WARNed */
    tcp_assembly_t **assembling; /* [nranks] incomplete connections from each peer */
    loom_stray_log_t strays;
} tcp_listen_t;

struct tcp_ctx {
    int rank;
    int nranks;
    uint8_t secret[LOOM_SECRET_BYTES];
    int64_t timeout_ms;
    int64_t sockbuf;
    int nsocks;           /* sockets of each send connection (LOOM_TCP_NSOCKS) */
    uint32_t piece_bytes; /* striping piece of send connections (LOOM_TCP_PIECE_BYTES) */
    volatile const int *abort_flag;
    volatile const int *quiet_flag;
    loom_sockaddr_t addr;
    char ifname[64];
    tcp_listen_t *listen;
    tcp_comm_t *comms;             /* every open connection, for wait() */
    tcp_connecting_t **connecting; /* [nranks] connects in progress */
    uint8_t *send_up;              /* [nranks] send connection established */
    uint8_t *recv_up;              /* [nranks] receive connection established */
    struct pollfd *pfds;           /* wait()'s scratch array */
    size_t pfds_cap;
};

/* Creates a connection over fds[nsocks] (owned by it from now on, also on
 * failure) and links it into ctx. Defined in tcp.c. */
loomResult_t loom_tcp_comm_create(tcp_ctx_t *ctx, const int *fds, int nsocks, uint32_t piece_bytes,
                                  int peer, int is_send, tcp_comm_t **comm_p);

/* The table members of connection setup (contracts in transport.h). */
loomResult_t loom_tcp_listen(void *ctx, void *handle, void **listen_p);
loomResult_t loom_tcp_connect(void *ctx, const void *handle, int peer, void **send_comm_p);
loomResult_t loom_tcp_accept(void *listen, void **recv_comm_p, int *peer_p);
loomResult_t loom_tcp_close_listen(void *listen);
/* Abandons a connect in progress to peer (finalize). */
void loom_tcp_connect_drop(tcp_ctx_t *ctx, int peer);
/* Adds the poll entries of the sockets being set up (wait()). */
loomResult_t loom_tcp_setup_poll(tcp_ctx_t *ctx, size_t *n_p);
/* Appends one poll entry to ctx->pfds (grows it). */
loomResult_t loom_tcp_pfd_add(tcp_ctx_t *ctx, size_t *n_p, int fd, short events);

#endif

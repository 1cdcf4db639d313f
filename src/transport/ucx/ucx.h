/* SPDX-License-Identifier: Apache-2.0
 *
 * ucx.h - the ucx transport's shared state (context, per-peer endpoints,
 * connections, requests) and the interface between its two files: ucx_conn.c
 * sets connections up over a small TCP side channel (listen, connect, accept:
 * secure_conn.h's secret handshake, then the exchange of UCP worker
 * addresses), ucx.c owns the UCP context and worker, the data path, wait and
 * the table. Private to the ucx folder; built only when meson found UCX
 * (LOOM_HAVE_UCX).
 */
#ifndef LOOM_UCX_H
#define LOOM_UCX_H

#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "secure_conn.h"
#include "transport.h"

#define LOOM_UCX_ADDR_MAX 16384u /* bytes of a worker address a peer may announce */

typedef struct ucx_ctx ucx_ctx_t;
typedef struct ucx_comm ucx_comm_t;
typedef struct ucx_req ucx_req_t;

/* One UCP endpoint per peer, shared by the send connection to it and the
 * receive connection from it: tag receives are worker-wide, so the endpoint
 * matters to a receive only as the place where the peer's failure shows up. */
typedef struct {
    ucx_ctx_t *ctx;
    int rank;
    ucp_ep_h ep;          /* NULL until a connection to or from this peer is up */
    int refs;             /* connections using ep */
    int failed;           /* the endpoint's error callback ran */
    ucs_status_t status;  /* why, once failed */
    ucx_comm_t *comms[2]; /* [is_send] the open connections */
} ucx_peer_t;

/* A request: ours, so that the table hands out stable pointers whatever UCP
 * does with its own (completes at once, or later through the callback). */
struct ucx_req {
    ucx_req_t *prev, *next; /* in its connection's pending list, or the free list */
    ucx_ctx_t *ctx;
    ucx_comm_t *comm; /* NULL once orphaned (its connection closed first) */
    void *ucp;        /* UCP's request while in flight */
    int done;
    ucs_status_t status;
    size_t len;    /* posted length (the receive buffer's capacity) */
    size_t nbytes; /* bytes moved (receive: the message's length) */
    uint32_t tag;
    int is_send;
    int counted; /* a send in flight, counted in ctx->nsends */
};

struct ucx_comm {
    ucx_ctx_t *ctx;
    int peer;
    int is_send;
    ucx_req_t *pending; /* requests in flight, for failure and close */
};

typedef struct {
    ucx_ctx_t *ctx;
    loom_secure_listen_t sl; /* the side channel's socket and connections being set up */
} ucx_listen_t;

struct ucx_ctx {
    int rank;
    int nranks;
    uint8_t secret[LOOM_SECRET_BYTES];
    loom_secure_cfg_t sec; /* side-channel setup (loom_ucx_conn_init) */
    int64_t timeout_ms;
    volatile const int *abort_flag;
    volatile const int *quiet_flag;
    ucp_context_h ucp;
    ucp_worker_h worker;
    int efd;                /* the worker's wakeup descriptor */
    void *drain_buf;        /* finalize: a message still being taken when the worker goes */
    int nsends;             /* sends UCP still holds (wait() keeps its sleeps short) */
    int no_peer_mode;       /* UCP found no lane with peer error handling: endpoints go without */
    ucp_address_t *my_addr; /* this worker's address, sent to every peer */
    size_t my_addr_len;
    loom_sockaddr_t sockaddr; /* the side channel's interface */
    char ifname[64];
    ucx_listen_t *listen;
    ucx_peer_t *peers;               /* [nranks] */
    loom_secure_conn_t **connecting; /* [nranks] connects in progress */
    ucx_req_t *free_reqs;            /* recycled requests */
    ucx_req_t *orphans;              /* requests whose connection closed while UCP held them */
    void **closing;                  /* endpoint close requests still in flight */
    int nclosing, closing_cap;
    loom_pollset_t pollset; /* wait()'s scratch array */
};

/* ---- ucx.c ---- */
/* Creates (or reuses) the endpoint to peer from its worker address and opens
 * a connection on it; *comm_p is the new connection. */
loomResult_t loom_ucx_comm_open(ucx_ctx_t *ctx, int peer, int is_send, const void *addr,
                                size_t addr_len, ucx_comm_t **comm_p);

/* ---- ucx_conn.c ---- */
/* Fills ctx->sec once ctx's settings are read (init). */
void loom_ucx_conn_init(ucx_ctx_t *ctx);
/* The table members of connection setup (contracts in transport.h). */
loomResult_t loom_ucx_listen(void *ctx, void *handle, void **listen_p);
loomResult_t loom_ucx_connect(void *ctx, const void *handle, int peer, void **send_comm_p);
loomResult_t loom_ucx_accept(void *listen, void **recv_comm_p, int *peer_p);
loomResult_t loom_ucx_close_listen(void *listen);
/* Abandons a connect in progress to peer (finalize). */
void loom_ucx_connect_drop(ucx_ctx_t *ctx, int peer);
/* Adds the poll entries of the side-channel sockets being set up to ctx->pollset (wait()). */
loomResult_t loom_ucx_setup_poll(ucx_ctx_t *ctx);

#endif

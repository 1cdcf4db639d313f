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

#define LOOM_UCX_ADDR_MAX   16384u /* bytes of a worker address a peer may announce */
#define LOOM_UCX_INLINE_MAX 2048u  /* collective payloads up to this carry their stamp inline */

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
    int sends_orphaned;   /* a connection closed with sends pending: close the endpoint forced */
    ucs_status_t status;  /* why, once failed */
    ucx_comm_t *comms[2]; /* [is_send] the open connections */
} ucx_peer_t;

/* A request: ours, so that the table hands out stable pointers whatever UCP
 * does with its own (completes at once, or later through the callback). */
struct ucx_req {
    ucx_req_t *prev, *next; /* in its connection's pending or done list, or the free list */
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
    /* Call stamps (ucx_stamp.c) */
    void *buf;                          /* the caller's buffer */
    int coll;                           /* a collective receive: its stamp is checked */
    int inline_form;                    /* posted as [stamp, buf, spill] (see ucx_stamp.c) */
    uint64_t sender_tag;                /* a receive's matched UCP tag */
    ucp_dt_iov_t iov[3];                /* the pieces of an inline message */
    uint8_t stamp[LOOM_TP_STAMP_BYTES]; /* a stamp or probe this request sends or receives */
};

struct ucx_comm {
    ucx_ctx_t *ctx;
    int peer;
    int is_send;
    ucx_req_t *pending; /* requests in flight, for failure and close */
    /* Call stamps (ucx_stamp.c). Send side: the stamp last sent in a message of its own. */
    int stamp_sent_valid;
    uint8_t stamp_sent[LOOM_TP_STAMP_BYTES];
    /* Receive side: the receive of such a stamp (NULL: none posted), this rank's stamp
     * when the last one was taken, and the probe receive kept posted. */
    ucx_req_t *stamp_rx;
    int stamp_got_valid;
    uint8_t stamp_got[LOOM_TP_STAMP_BYTES];
    ucx_req_t *probe_rx;
    ucx_req_t *done; /* completed, not yet tested: freed at close */
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
    const loom_tp_stamp_ops_t *stamp_ops; /* call stamps (transport.h), NULL: none */
    uint8_t *spill;     /* [LOOM_UCX_INLINE_MAX]: where an inline receive takes excess bytes */
    uint32_t coll_seq;  /* the sequence number (24 bits) of the last collective tag seen */
    int coll_seq_valid; /* one was seen */
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
/* Requests: a zeroed one from the free list (NULL and a WARN when out of
 * memory), back to it, and detached from its connection while UCP holds it. */
ucx_req_t *loom_ucx_req_get(ucx_ctx_t *ctx);
void loom_ucx_req_put(ucx_ctx_t *ctx, ucx_req_t *r);
void loom_ucx_req_orphan(ucx_ctx_t *ctx, ucx_req_t *r);
/* The UCP tag of loom tag `tag` from rank. */
uint64_t loom_ucx_tag_of(int rank, uint32_t tag);
/* Posts r (len and tag set) as a send to peer of count elements of dt at
 * buffer with UCP tag utag; r->comm NULL makes it an orphan from the start
 * (nobody tests it; it frees itself). */
loomResult_t loom_ucx_send_post(ucx_ctx_t *ctx, int peer, ucx_req_t *r, const void *buffer,
                                size_t count, ucp_datatype_t dt, uint64_t utag);
/* Posts r (len and tag set) as a receive on c, matching the UCP tag of r->tag
 * except the bits of `ignore`. */
loomResult_t loom_ucx_recv_post(ucx_comm_t *c, ucx_req_t *r, void *buffer, size_t count,
                                ucp_datatype_t dt, uint64_t ignore);
/* RemoteError for a request to or from peer that failed with st (WARN, or INFO
 * while the layer above tears down). */
loomResult_t loom_ucx_peer_failed(ucx_ctx_t *ctx, int peer, int is_send, ucs_status_t st);

/* ---- ucx_stamp.c: call stamps (transport.h) ---- */
/* A send r (len, tag, buf set) on c: how it goes out (*buffer, *count, *dt,
 * *utag start as the plain message), sending the stamp ahead where needed. */
loomResult_t loom_ucx_stamp_send_prep(ucx_comm_t *c, ucx_req_t *r, const void **buffer,
                                      size_t *count, ucp_datatype_t *dt, uint64_t *utag);
/* A receive r (len, tag, buf set) on c: how it is posted. */
void loom_ucx_stamp_recv_prep(ucx_comm_t *c, ucx_req_t *r, void **buffer, size_t *count,
                              ucp_datatype_t *dt, uint64_t *ignore);
/* A collective receive r that UCP completed: checks its stamp and leaves
 * r->nbytes the payload's size; *ready_p = 0 while its stamp has not arrived.
 * InvalidUsage when the calls differ or the message is longer than r. */
loomResult_t loom_ucx_stamp_recv_done(ucx_req_t *r, int *ready_p);
/* Before the first collective message of a call (tag) is sent or received:
 * a message of the previous call that is still unexpected, never taken by
 * this rank's call, is a difference of the calls (InvalidUsage, checked). */
loomResult_t loom_ucx_stamp_leftovers(ucx_ctx_t *ctx, uint32_t tag);
/* Posts receive connection c's probe receive. */
loomResult_t loom_ucx_probe_open(ucx_comm_t *c);
/* Hands a probe that arrived from peer to the check and posts the next receive. */
loomResult_t loom_ucx_probe_poll(ucx_ctx_t *ctx, int peer);
/* Frees c's stamp and probe receives that completed (pending ones are
 * orphaned with c's other requests). */
void loom_ucx_stamp_close(ucx_comm_t *c);

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

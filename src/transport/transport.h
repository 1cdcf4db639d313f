/* SPDX-License-Identifier: Apache-2.0
 *
 * transport.h - the internal transport interface: a table of function
 * pointers in the shape of NCCL's ncclNet_t, filled with designated
 * initializers by each transport (shm/, tcp/). Collectives never see a
 * transport directly: they go through p2p.h, which drives these tables.
 *
 * Connection model: every rank calls listen() once per transport and ships
 * the handle to all ranks through the bootstrap; for every peer the first
 * transport whose can_connect() says yes is used; the rank then connect()s a
 * send connection to that peer and accept()s the peer's send connection as
 * its receive connection. Connections are unidirectional and deliver tagged
 * messages in order.
 */
#ifndef LOOM_TRANSPORT_H
#define LOOM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_TP_ABI_V1     1u
#define LOOM_TP_HANDLE_MAX 128 /* bytes exchanged through bootstrap per listen() */
#define LOOM_HOST_ID_MAX   64

/* What the bootstrap tells every rank about every rank. */
typedef struct {
    int32_t rank;
    int32_t pid;
    uint64_t host_hash;    /* equal on ranks that share memory */
    uint64_t machine_hash; /* hostname + boot id: equal on one real machine, whatever LOOM_HOST_ID
                              says */
    char host_id[LOOM_HOST_ID_MAX]; /* printable host identity (hostname or LOOM_HOST_ID) */
    char hostname[LOOM_HOST_ID_MAX];
    int32_t topo_flags; /* LOOM_TOPO_FLAG_*: what this rank asks of the topology at init */
    int32_t pad;
} loom_peer_info_t;
#define LOOM_TOPO_FLAG_FILE 1 /* LOOM_TOPO_FILE is set */
#define LOOM_TOPO_FLAG_DUMP 2 /* LOOM_TOPO_DUMP_FILE is set */

/* Call stamps: every message of a collective carries its sender's description
 * of the call it belongs to, so that ranks whose calls differ (another
 * collective, count, datatype, op or root) find out from the first message
 * instead of moving garbage. The stamp's bytes are the layer above's (p2p.c);
 * a transport only carries and hands them back. Contract:
 *  - a message whose tag has LOOM_TP_TAG_COLL set carries `stamp` as it is
 *    when isend is called (tcp, shm: in the frame header; ucx: in front of
 *    the payload, or in a message of its own ahead of long messages);
 *  - before a receive completes with such a message, the transport calls
 *    check(arg, peer, tag, stamp) with the message's stamp and the tag of the
 *    receive (a transport that reads headers before matching calls it then,
 *    with the message's own tag). Success: go on. InvalidUsage: the calls
 *    differ (check WARNed); the receive fails with it, and so does any later
 *    one on that connection. InProgress: the stamp is of a later call than
 *    this rank's; call check again before matching the message;
 *  - isend(LOOM_TP_TAG_PROBE, len 0) sends the current stamp alone; the
 *    receiving transport consumes it without a posted receive and hands it to
 *    check(arg, peer, LOOM_TP_TAG_PROBE, stamp) (InProgress means nothing
 *    there), so that ranks that all wait on one another still compare calls;
 *  - a message longer than the receive it matched is reported through
 *    oversize(arg, peer, tag, nbytes, capacity), which WARNs and returns the
 *    receive's error (InvalidUsage).
 * Without stamp ops (NULL in the init args) messages carry zeros and nothing
 * is checked; a probe is then an ordinary message. */
#define LOOM_TP_STAMP_BYTES 20
#define LOOM_TP_TAG_COLL    0x80000000u /* tags of collectives: carry the stamp */
#define LOOM_TP_TAG_PROBE   0x7ffffffeu /* a stamp alone (see above); no user tag */

typedef struct {
    const uint8_t *stamp; /* [LOOM_TP_STAMP_BYTES]: the running call's, read at each isend */
    loomResult_t (*check)(void *arg, int peer, uint32_t tag, const uint8_t *stamp);
    loomResult_t (*oversize)(void *arg, int peer, uint32_t tag, uint64_t nbytes, size_t capacity);
    void *arg;
} loom_tp_stamp_ops_t;

typedef struct {
    int rank; /* this rank */
    int nranks;
    const loom_peer_info_t *peers;  /* [nranks], peers[rank] is this rank */
    const uint8_t *secret;          /* 16-byte job secret: every connection proves it */
    int64_t timeout_ms;             /* bound for any internal blocking step */
    volatile const int *abort_flag; /* non-zero: give up at once with RemoteError */
    /* Non-zero while the layer above tears down (destroy, abort, a failure it is
     * already reporting): a peer found gone then is expected, logged as INFO. */
    volatile const int *quiet_flag;
    const loom_tp_stamp_ops_t *stamp_ops; /* call stamps (see above); NULL: none */
} loom_tp_init_args_t;

typedef struct loom_tp {
    uint32_t abi_version; /* LOOM_TP_ABI_V1 */
    const char *name;     /* "shm" | "tcp" | "ucx"; used in logs and LOOM_NET */

    /* Creates the transport's context for one communicator. */
    loomResult_t (*init)(const loom_tp_init_args_t *args, void **ctx_p);
    /* Frees the context; all connections are closed before. */
    loomResult_t (*finalize)(void *ctx);
    /* Pure check, no side effects: *ok_p = 1 if this transport can reach peer. */
    loomResult_t (*can_connect)(void *ctx, const loom_peer_info_t *self,
                                const loom_peer_info_t *peer, int *ok_p);
    /* Writes <= LOOM_TP_HANDLE_MAX bytes to handle; the core ships it to all ranks.
     * One listen per context; peers of any rank connect to it. */
    loomResult_t (*listen)(void *ctx, void *handle, void **listen_p);
    /* Starts or continues a connection to peer, whose listen handle is given.
     * Never blocks: returns Success with *send_comm_p == NULL until established;
     * call again with the same arguments. */
    loomResult_t (*connect)(void *ctx, const void *handle, int peer, void **send_comm_p);
    /* Never blocks: *recv_comm_p == NULL if no new peer connection is complete;
     * otherwise *peer_p is the rank it comes from (proven by the handshake). */
    loomResult_t (*accept)(void *listen, void **recv_comm_p, int *peer_p);
    /* Queue a message. Never block; *req_p is the request to test. Messages on
     * one connection are delivered in order. buf must stay valid until done. */
    loomResult_t (*isend)(void *send_comm, const void *buf, size_t len, uint32_t tag, void **req_p);
    /* Post a receive for the next message carrying tag on this connection;
     * receives with equal tags match in posting order. A message longer than
     * len fails the request with InvalidUsage. */
    loomResult_t (*irecv)(void *recv_comm, void *buf, size_t len, uint32_t tag, void **req_p);
    /* Makes progress on req's connection. *done_p = 1 when complete, then
     * *nbytes_p = bytes moved and req is freed. An error also frees req. */
    loomResult_t (*test)(void *req, int *done_p, size_t *nbytes_p);
    /* Blocks up to timeout_us until some connection of ctx that has pending
     * work may progress (may return early). Does not itself move data. */
    loomResult_t (*wait)(void *ctx, int timeout_us);
    loomResult_t (*close_send)(void *send_comm);
    loomResult_t (*close_recv)(void *recv_comm);
    loomResult_t (*close_listen)(void *listen);
} loom_tp_t;

extern const loom_tp_t loom_tp_shm;
extern const loom_tp_t loom_tp_tcp;
#ifdef LOOM_HAVE_UCX
extern const loom_tp_t loom_tp_ucx;
#endif

/* The registry: the transports built in, in default preference order. */
const loom_tp_t *const *loom_tp_registry(int *n_p);
/* 1 if tp is used only where LOOM_NET names it or where loom's own choice
 * across hosts takes it (ucx, loom_tp_ucx_auto_t below): it reaches every
 * peer, so listed by default it would take every link from tcp, and starting
 * it would cost time and descriptors where it is not used. */
int loom_tp_opt_in(const loom_tp_t *tp);
/* Whether ucx may carry links between hosts though LOOM_NET does not name it
 * (api/net_auto.c decides). NONE: it may not (LOOM_NET is set, one host, no
 * UCX in this build); the same on every rank. Otherwise every rank lists ucx
 * before tcp, and each rank starts it only if it OFFERs it (its host has an
 * RDMA port the model prefers to tcp); a pair of ranks uses ucx only where
 * both started it. */
typedef enum {
    LOOM_TP_UCX_AUTO_NONE,
    LOOM_TP_UCX_AUTO_DECLINE,
    LOOM_TP_UCX_AUTO_OFFER
} loom_tp_ucx_auto_t;
/* 1 if this build has the transport called name ("ucx" needs UCX at build time). */
int loom_tp_built(const char *name);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * secure_conn.h - the secret-proven connection setup that the tcp and ucx
 * transports share: a non-blocking listener on the chosen interface whose
 * address is the listen handle; the accept of pending connections, each with
 * its own deadline, through secret.c's handshake (anything that does not prove
 * the job secret - stray, partial, wrong secret, silent - is closed and logged
 * once through a loom_stray_log_t, and nothing it sent is parsed); the
 * connecting side (TCP connect with retries, its half of the handshake); and
 * the messages each transport exchanges after the proof. What those messages
 * say, and what a set-up connection becomes, stay with the transport: it
 * decides at every message boundary through a loom_secure_msg_fn_t. Never
 * blocks. Used by tcp_conn.c and ucx_conn.c (the bootstrap root has its own).
 */
#ifndef LOOM_SECURE_CONN_H
#define LOOM_SECURE_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "secret.h"
#include "socket.h"

#define LOOM_SECURE_MAX_PENDING  256 /* connections one listener sets up at once */
#define LOOM_SECURE_HANDLE_BYTES (8 + sizeof(loom_sockaddr_t)) /* u32 magic, u32 0, address */

/* Who sets connections up, and how: the transport's, read-only here. */
typedef struct {
    const char *name;               /* the transport, in logs: "tcp" */
    int rank;                       /* this end's rank, in logs */
    uint32_t subsys;                /* LOOM_LOG_* of the INFO lines */
    uint32_t role;                  /* the protocol's handshake role (secret.h) */
    uint32_t handle_magic;          /* first word of the listen handle */
    const uint8_t *secret;          /* LOOM_SECRET_BYTES */
    int64_t sockbuf;                /* socket buffer bytes, 0 for the kernel's */
    int64_t timeout_ms;             /* a connection's setup deadline, from its start */
    volatile const int *abort_flag; /* non-zero: accept and connect fail (RemoteError) */
} loom_secure_cfg_t;

/* Stages of a connection. After the proof the transport moves it between
 * SEND and RECV, one message at a time. */
enum {
    LOOM_SECURE_START,      /* connector: waits for retry_at_ns, then connects */
    LOOM_SECURE_CONNECTING, /* connector: the TCP connect is in progress */
    LOOM_SECURE_HANDSHAKE,  /* proving the job secret, both ends */
    LOOM_SECURE_SEND,       /* sending msg */
    LOOM_SECURE_RECV        /* receiving msg */
};

/* One connection being set up, on either end. */
typedef struct loom_secure_conn {
    struct loom_secure_conn *next; /* in the listener's pending list */
    int fd;                        /* -1 when none (also once handed on) */
    int stage;                     /* LOOM_SECURE_* */
    int peer;                      /* connector: the target rank; acceptor: set by on_msg */
    int last_errno;                /* connector: why the last connect attempt failed */
    uint64_t accepted_ns;          /* acceptor: when accepted (eviction picks the oldest) */
    uint64_t deadline_ns;
    uint64_t retry_at_ns;
    loom_sockaddr_t addr; /* connector: the listener */
    loom_handshake_t hs;
    uint8_t *msg;    /* the message being sent or received */
    size_t msg_have; /* bytes of msg moved */
    size_t msg_want; /* bytes of msg (grown as its header tells) */
    uint8_t *kept;   /* an earlier message the transport keeps (freed with the connection) */
    void *up;        /* acceptor, on UP: what the connection became (the receive connection) */
} loom_secure_conn_t;

/* What the transport makes of a connection whose message is complete. */
enum {
    LOOM_SECURE_MORE,  /* it grew msg, or started the next message: move more bytes */
    LOOM_SECURE_CLOSE, /* done with it: refused (and WARNed), or its socket handed on */
    LOOM_SECURE_UP     /* the connection is set up */
};

/* Called once msg_have == msg_want (stage SEND: all sent; RECV: all in);
 * sets *verdict_p to one of the above. On an error return the connection is
 * closed and the error ends the caller's step. */
typedef loomResult_t (*loom_secure_msg_fn_t)(void *arg, loom_secure_conn_t *c, int *verdict_p);

/* How a listener treats a connection once it proved the secret: the transport's part. */
typedef struct {
    size_t hello_bytes;          /* the first message it receives: its first bytes */
    int evict;                   /* full: a new connection evicts the oldest unproven one
                                    (0: new connections wait in the kernel's backlog) */
    loom_secure_msg_fn_t on_msg; /* decides at each message boundary */
    void *arg;                   /* on_msg's */
} loom_secure_accept_t;

/* A listener: its socket and the connections it sets up (accepted, not yet up). */
typedef struct {
    const loom_secure_cfg_t *cfg;
    loom_secure_accept_t acc;
    char who[64];  /* "tcp: rank 3", the log prefix */
    int fd;        /* the listening socket */
    int accepting; /* accept ran since the last poll: the caller waits for peers */
    int fd_warned; /* out of descriptors was WARNed */
    loom_secure_conn_t *pending;
    int npending;
    loom_stray_log_t strays;
} loom_secure_listen_t;

// ---- connections and messages ---------------------------------------------

/* Replaces c's message with a new one of nbytes; *buf_p (may be NULL) gets
 * its bytes, for the caller to fill when it is to be sent. The caller sets
 * the stage. */
loomResult_t loom_secure_msg_new(loom_secure_conn_t *c, size_t nbytes, uint8_t **buf_p);
/* Receiving: the message is nbytes long in all (its header said so). */
loomResult_t loom_secure_msg_grow(loom_secure_conn_t *c, size_t nbytes);
/* The messages' fields: little-endian, 1 to 4 bytes. */
static inline void loom_secure_put_le(uint8_t *p, uint32_t v, int nbytes)
{
    for (int b = 0; b < nbytes; b++)
        p[b] = (uint8_t)(v >> (8 * b));
}
static inline uint32_t loom_secure_get_le(const uint8_t *p, int nbytes)
{
    uint32_t v = 0;
    for (int b = 0; b < nbytes; b++)
        v |= (uint32_t)p[b] << (8 * b);
    return v;
}
/* Adds c's poll entry (none when c has no socket). */
loomResult_t loom_secure_conn_poll(const loom_secure_conn_t *c, loom_pollset_t *ps);
/* Closes c's socket and frees what it holds; c is then as after connect_init. */
void loom_secure_conn_clear(loom_secure_conn_t *c);
/* Clears and frees a connection from calloc (NULL is fine). */
void loom_secure_conn_free(loom_secure_conn_t *c);

// ---- connector -------------------------------------------------------------

/* Decodes a listen handle of cfg's transport into *addr_p; WARNs and returns
 * InvalidArgument when it is not one (peer names its sender). */
loomResult_t loom_secure_handle_decode(const loom_secure_cfg_t *cfg, const void *handle, int peer,
                                       loom_sockaddr_t *addr_p);
/* c (the caller's memory) is to connect to addr for peer by deadline_ns. The
 * caller then puts the first message in with msg_new: it goes out once the
 * secret is proven. */
void loom_secure_connect_init(loom_secure_conn_t *c, const loom_sockaddr_t *addr, int peer,
                              uint64_t deadline_ns);
/* Advances c as far as its socket allows: connect (refusals and resets are
 * retried every millisecond, since the peer may not listen yet; so is a
 * connection the listener closed during the handshake without refusing this
 * end's proof), the handshake, then the messages, on_msg deciding at each
 * boundary (NULL: up once the first is out). *up_p = 1 once on_msg says UP;
 * its CLOSE is RemoteError. Failures are WARNed; the caller then clears c.
 * Does not time out: the caller compares c->deadline_ns. */
loomResult_t loom_secure_connect_step(loom_secure_conn_t *c, const loom_secure_cfg_t *cfg,
                                      loom_secure_msg_fn_t on_msg, void *arg, int *up_p);

// ---- listener --------------------------------------------------------------

/* Listens on addr's interface at a free port (*addr gets it) and writes the
 * listen handle into handle (handle_len bytes, zero-filled beyond the first
 * LOOM_SECURE_HANDLE_BYTES). l is the caller's memory. */
loomResult_t loom_secure_listen_open(loom_secure_listen_t *l, const loom_secure_cfg_t *cfg,
                                     const loom_secure_accept_t *acc, loom_sockaddr_t *addr,
                                     void *handle, size_t handle_len);
/* The accept of the transport table (contract in transport.h): accepts what
 * is pending, drops what is past its deadline and advances the rest; stops at
 * the first connection on_msg calls UP (*up_p = its c->up, *peer_p = its
 * c->peer), else *up_p = NULL. Errors: on_msg's, the listening socket's. */
loomResult_t loom_secure_listen_accept(loom_secure_listen_t *l, void **up_p, int *peer_p);
/* Adds the listener's poll entries, if accept ran since the last call (a
 * listener nobody accepts on would make every wait return at once). */
loomResult_t loom_secure_listen_poll(loom_secure_listen_t *l, loom_pollset_t *ps);
/* Drops every connection still being set up, logs the stray summary and
 * closes the socket. */
loomResult_t loom_secure_listen_close(loom_secure_listen_t *l);

#endif

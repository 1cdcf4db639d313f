/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p_impl.h - the point-to-point layer's private state, shared by its own
 * files only: p2p_setup.c (create, break, destroy), p2p.c (posting, messages
 * to self), p2p_wait.c (waits and how a failed one ends), p2p_notice.c (the
 * notices), p2p_stamp.c (call stamps) and p2p_report.c (the messages and the
 * timeout dump of a failure). Everyone else uses p2p.h.
 */
#ifndef LOOM_TRANSPORT_P2P_IMPL_H
#define LOOM_TRANSPORT_P2P_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "p2p.h"

/* Failure protocol.
 * Every connection ends with exactly one notice: a frame with the reserved
 * tag LOOM_TAG_NOTICE and NOTICE_BYTES of payload (little-endian):
 *   u32 magic, u32 kind, i32 from, i32 cause rank, u32 code, i32 rank2,
 *   u64 seq, u64 value, u64 value2
 * kind BYE: the sender destroyed its communicator normally. Any other kind:
 * the sender's communicator broke, and `cause` is the rank found at fault
 * first (DEAD: its process is gone; LOST: it closed its connections without
 * a notice; TIMEOUT: it made no progress for the timeout; ABORT: it called
 * loomCommAbort; ERROR: it failed locally with result `code`; CLOSED: it
 * destroyed its communicator while the sender still needed it; MISMATCH:
 * rank2 received a message of a call of `cause` that differs from its own
 * call in the fields of the mask `code` (MM_*), the first of them being
 * `value` at `cause` and `value2` at rank2; every rank then returns
 * InvalidUsage). rank2 and the values are 0 for other kinds.
 * A receive for the notice is posted on every receive connection as soon as
 * the layer is up, so a notice never waits unmatched, and a BYE ends the
 * stream before its end is read: a normal close never looks like a failure.
 *
 * When a wait fails (dead peer, closed connection, timeout, abort, notice),
 * the layer breaks at once: it queues a notice carrying the first cause on
 * every send connection, drives them for at most NOTICE_FLUSH_NS, and closes
 * every connection, so that a peer waiting on this rank (and, hop by hop, a
 * peer waiting on that one) fails within its next look at the connection,
 * naming the rank that failed first. A rank that learns of a timeout from a
 * notice still returns loomTimeout no earlier than its own timeout. */

#define MAX_TP             4
#define LIVENESS_PERIOD_NS 100000000ull /* check peers' pids every 100 ms without progress */
#define NOTICE_MAGIC       0x4e4d4f4cu  /* "LOMN" */
#define NOTICE_BYTES       48
#define NOTICE_FLUSH_NS    100000000ull /* at most 100 ms to hand notices to the transports */
#define EXIT_GRACE_NS      300000000ull /* a same-machine peer that closed may take this to exit */
#define DUMP_MAX_PENDING   64           /* requests listed in a timeout dump */

enum { N_NONE, N_BYE, N_DEAD, N_LOST, N_TIMEOUT, N_ABORT, N_ERROR, N_CLOSED, N_MISMATCH, N_KINDS };

/* The fields of a call that differ (N_MISMATCH's code), in the order messages name them. */
enum {
    MM_KIND = 1 << 0,  /* another collective (or not a collective) */
    MM_COUNT = 1 << 1, /* count */
    MM_DTYPE = 1 << 2, /* datatype */
    MM_OP = 1 << 3,    /* reduction op */
    MM_ROOT = 1 << 4,  /* root */
    MM_SEQ = 1 << 5,   /* a message of a call that the receiver's call of that number never took */
    MM_ALL = (1 << 6) - 1
};

/* Why the layer broke: the first cause, as found here or as a notice told it
 * (a received notice is kept in this form too, with via = its sender). */
typedef struct {
    int kind;               /* N_* (never N_BYE) */
    int rank;               /* the rank at fault */
    int via;                /* the peer whose notice told us; -1 when found here */
    uint32_t code;          /* N_ERROR: the failing rank's loomResult_t; N_MISMATCH: MM_* mask */
    uint64_t seq;           /* via >= 0: the reporter's sequence number */
    int rank2;              /* N_MISMATCH: the rank that received the differing message */
    uint64_t value, value2; /* N_MISMATCH: the first differing field at rank, at rank2 */
} cause_t;

/* A call as this rank states it (set_call / set_context) and as a stamp
 * carries it; kind CALL_OTHER is an operation that is not one of the
 * collectives (an Echo all-reduce, calibration, creation). */
#define CALL_OTHER (-2)
typedef struct {
    uint64_t seq;
    loom_p2p_call_t c;
} call_state_t;

/* A failure this rank found in what a peer sent (a differing call, an
 * oversized message): it wins over whatever the failing wait sees next. */
typedef struct {
    int set;
    int peer;         /* the rank whose message it was */
    cause_t cause;    /* N_MISMATCH, or N_ERROR of this rank with InvalidUsage */
    loomResult_t res; /* what this rank returns: InvalidUsage */
    char detail[768]; /* the WARN's text */
} found_t;

enum { NS_WAITING, NS_GOT, NS_ENDED }; /* notice state of a receive connection */

typedef struct {
    int tp;           /* index into p2p->tps, -1 for self */
    void *send;       /* transport send connection */
    void *recv;       /* transport receive connection */
    void *notice_req; /* the posted notice receive; NULL once finished or closed */
    int notice_state; /* NS_*: NS_ENDED when the stream ended without a notice */
    cause_t got;      /* valid in NS_GOT: the notice, via = this peer */
    uint8_t notice_buf[NOTICE_BYTES];
} peer_conn_t;

/* Handles every rank publishes: one slot per registry transport. */
typedef struct {
    uint8_t present[MAX_TP];
    uint8_t handle[MAX_TP][LOOM_TP_HANDLE_MAX];
} handles_t;

struct loom_p2p {
    int rank;
    int nranks;
    loom_tp_init_args_t args;       /* the transports get args.abort_flag = &tp_abort */
    volatile const int *abort_flag; /* the communicator's (loomCommAbort) */
    volatile int tp_abort; /* set once aborted or broken: transports give up, shm closes hard */
    volatile int tp_quiet; /* set once tearing down: peers leaving is expected (INFO) */
    loom_peer_info_t *peers;
    /* How a wait spins before it sleeps in the transports (loom_p2p_spin_setup):
     * LOOM_SPIN_US; with more ranks on this machine than CPUs, each pass yields
     * the CPU, which a rank waited on may need. */
    uint64_t spin_ns;
    int spin_yields;
    int ntp;
    const loom_tp_t *tps[MAX_TP];
    void *ctx[MAX_TP];
    void *listen[MAX_TP];
    uint8_t tp_auto[MAX_TP]; /* listed by loom's own choice (LOOM_NET unset): may be absent */
    peer_conn_t *conns;
    /* Messages to self: posted sends and receives, matched in order per tag. */
    loom_p2p_req_t **self_sends;
    const void **self_bufs;
    int nself_sends;
    loom_p2p_req_t **self_recvs;
    void **self_rbufs;
    int nself_recvs;
    int self_cap;
    const char *what; /* the current operation (a string with static storage) */
    uint64_t seq;
    int broken;                   /* a wait failed: every later call fails */
    int closed;                   /* connections closed (after a break, or in destroy) */
    cause_t cause;                /* valid once broken */
    void **flush;                 /* [nranks] notice sends being flushed */
    loom_p2p_break_fn_t on_break; /* the break hook (loom_p2p_on_break), NULL if none */
    void *on_break_arg;
    uint64_t bytes_sent; /* payload bytes handed to transports (atomic: read by any thread) */
    uint8_t notice_out[NOTICE_BYTES];
    /* Call stamps (p2p_stamp.c): the current and the previous call, the stamp of
     * the current one that transports copy into messages, and their ops. */
    call_state_t call, call_prev;
    const char *const *kind_names;
    int nkinds;
    uint8_t stamp[LOOM_TP_STAMP_BYTES];
    loom_tp_stamp_ops_t stamp_ops;
    found_t found;
    void **probes; /* [nranks] probe sends in flight */
};

static inline int loom_p2p_aborted(const loom_p2p_t *p)
{
    return p->abort_flag != NULL && __atomic_load_n(p->abort_flag, __ATOMIC_ACQUIRE) != 0;
}

static inline int loom_p2p_same_machine(const loom_p2p_t *p, int peer)
{
    return p->peers[peer].machine_hash == p->peers[p->rank].machine_hash;
}

// ---- p2p_wait.c --------------------------------------------------------------------
/* Sets p->spin_ns and p->spin_yields from LOOM_SPIN_US and this machine's ranks and CPUs. */
void loom_p2p_spin_setup(loom_p2p_t *p);

// ---- p2p_setup.c -------------------------------------------------------------------
/* Breaks the layer (once): every peer gets the cause, then every connection
 * closes; reqs[n] are abandoned (their transport requests go with them). */
void loom_p2p_break(loom_p2p_t *p, const cause_t *cause, loom_p2p_req_t *reqs, int n);

// ---- p2p_wait.c --------------------------------------------------------------------
/* 1 if pid no longer runs: gone, or a zombie its parent has not reaped yet. */
int loom_p2p_pid_gone(int pid);
/* A transport call for a request to or from peer failed with res: finds the
 * cause, breaks the layer and returns what to return. */
loomResult_t loom_p2p_request_failed(loom_p2p_t *p, loom_p2p_req_t *reqs, int n, int peer,
                                     int is_send, loomResult_t res, uint64_t start_ns);

/* ---- p2p_report.c ---- */
/* The name of a notice kind (N_*). */
const char *loom_p2p_kind_name(int kind);
/* "rank 2 (host h, pid 7)" in buf. */
const char *loom_p2p_who(const loom_p2p_t *p, int rank, char *buf, size_t len);
/* The still pending requests of reqs, e.g.
 * " receive from rank 2 (host h, pid 7; 4096 bytes, tag 0x80000281);". */
void loom_p2p_pending_list(const loom_p2p_t *p, const loom_p2p_req_t *reqs, int n, char *buf,
                           size_t len);
/* The message of a failure with cause c (see p2p_report.c). */
void loom_p2p_describe(const loom_p2p_t *p, const cause_t *c, const char *direct, const char *pend,
                       char *msg, size_t len);
/* Logs (INFO) and writes (LOOM_DUMP_ON_TIMEOUT) what this rank waited for. */
void loom_p2p_dump_timeout(const loom_p2p_t *p, const loom_p2p_req_t *reqs, int n, const cause_t *c,
                           uint64_t waited_ns);

// ---- p2p_notice.c: the notices -----------------------------------------------------
/* Posts the receive of every peer's notice (at creation). */
loomResult_t loom_p2p_notice_recvs_post(loom_p2p_t *p);
/* Looks for peer's notice without blocking (progresses its receive stream). */
void loom_p2p_notice_poll(loom_p2p_t *p, int peer);
/* Polls every peer's notice; a peer whose notice reports a failure or whose
 * stream ended without one, or -1. */
int loom_p2p_notices_poll_all(loom_p2p_t *p);
/* Sends a notice of `kind` (cause may be NULL) to every open connection but
 * skip's, flushing for a bounded time; failures to send are ignored. */
void loom_p2p_notices_send(loom_p2p_t *p, int kind, const cause_t *cause, int skip);

// ---- p2p_stamp.c: call stamps ------------------------------------------------------
/* Fills p->stamp_ops and the stamp of creation (seq 0, not a collective). */
void loom_p2p_stamp_init(loom_p2p_t *p);
/* Sends the current call's stamp to every peer that reqs[n] still wait to
 * receive from, unless a probe to it is in flight (a stalled wait). */
void loom_p2p_probe_peers(loom_p2p_t *p, const loom_p2p_req_t *reqs, int n);
/* The fields (MM_*) in which call t differs from call m of the same number. */
unsigned loom_p2p_call_diff(const call_state_t *t, const call_state_t *m);
/* Records and WARNs a mismatch with peer's call t (mine: this rank's call it
 * differs from); `late`: t's message was meant for this rank's call `mine`
 * (a receive's tag) but belongs to another call of the peer. Returns
 * InvalidUsage. */
loomResult_t loom_p2p_mismatch(loom_p2p_t *p, int peer, unsigned diff, const call_state_t *t,
                               const call_state_t *mine, int late);
/* The words of a mismatch a notice reported (N_MISMATCH, via >= 0). */
void loom_p2p_mismatch_text(const loom_p2p_t *p, const cause_t *c, char *buf, size_t len);

#endif /* LOOM_TRANSPORT_P2P_IMPL_H */

/* SPDX-License-Identifier: Apache-2.0
 *
 * p2p.h - the point-to-point layer of a communicator: one connection per
 * peer and direction over the transport chosen for that peer, tagged
 * non-blocking send/receive, and bounded waits (timeout, abort, dead peers).
 * Collective algorithms are written against this interface only.
 */
#ifndef LOOM_P2P_H
#define LOOM_P2P_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "transport.h"

typedef struct loom_p2p loom_p2p_t;

/* One outstanding operation. Owned by the caller (stack or array); filled by
 * isend/irecv and completed by wait. */
typedef struct {
    void *tp_req; /* transport request, NULL once complete */
    const loom_tp_t *tp;
    int peer; /* rank in the communicator */
    int is_send;
    uint32_t tag;
    size_t nbytes;     /* requested bytes */
    size_t done_bytes; /* bytes moved (receives: the message's size) */
    int done;
} loom_p2p_req_t;

/* Tags: the top bit separates collectives from user send/recv; collectives
 * carry their sequence number and step so mismatched calls are diagnosed.
 * LOOM_TAG_NOTICE is the layer's own: the last frame of every connection,
 * saying why it ends (a normal destroy, or the failure that broke it). */
#define LOOM_TAG_P2P    0u
#define LOOM_TAG_NOTICE 0x7fffffffu
static inline uint32_t loom_tag_coll(uint64_t seq, unsigned step)
{
    return LOOM_TP_TAG_COLL | ((uint32_t)(seq & 0xFFFFFFu) << 7) | (step & 0x7Fu);
}

/* Sets up the layer: transport contexts, listen handles exchanged with the
 * bootstrap (allgather), connections to every peer. Blocking, collective. */
struct loom_bootstrap;
loomResult_t loom_p2p_create(struct loom_bootstrap *bs, const loom_tp_init_args_t *args,
                             const char *net_list, loom_tp_ucx_auto_t ucx_auto, loom_p2p_t **p2p_p);
/* Tells every peer why its connections end (a normal destroy, an abort, or
 * the failure that broke the layer), closes them and frees the layer. Never
 * waits for peers beyond a short bounded flush; keeps going on errors and
 * returns the first. Runs no break hook: a normal end is no break. */
loomResult_t loom_p2p_destroy(loom_p2p_t *p2p);

/* The break hook: what else must fail when the layer breaks (the first
 * failure: a wait that saw an abort, a peer's notice or death, a timeout or
 * a failed transport call; or loom_p2p_fail). fn(arg, seq) runs once, on the
 * thread that found the failure, right after every peer was sent the cause
 * and before any connection closes, so whoever waits on this rank outside
 * the messages (memory shared with peers) can be told at once and read the
 * cause already; seq is the operation under way (set_context). One hook per
 * layer: a later call replaces it, fn NULL removes it; if the layer broke
 * already, fn runs at once. Whoever owns arg keeps it until the layer is
 * destroyed. */
typedef void (*loom_p2p_break_fn_t)(void *arg, uint64_t seq);
void loom_p2p_on_break(loom_p2p_t *p2p, loom_p2p_break_fn_t fn, void *arg);
/* A failure found outside the layer's waits, after creation (a part of the
 * communicator that failed to set up on this rank): breaks the layer with
 * res as a failed wait does, so every peer learns from the notice that this
 * rank failed with res (their waits on it fail with RemoteError naming it)
 * and every connection closes. WARNs nothing (the caller did, where it found
 * the failure) and keeps loomGetLastError's message; nothing if the layer
 * broke already. */
void loom_p2p_fail(loom_p2p_t *p2p, loomResult_t res);

/* The rank whose death (process gone, connection lost) broke the layer, as found here or as
 * a peer's notice reported it; -1 if the layer is not broken or broke for another cause.
 * Call it when no wait is running (after the calls have let go). */
int loom_p2p_lost_rank(const loom_p2p_t *p2p);

/* Post a send/receive of nbytes with tag to/from peer (peer may be self: the
 * message is copied locally when the matching receive is posted). Never
 * blocks. nbytes == 0 is allowed and still matches a message. */
loomResult_t loom_p2p_isend(loom_p2p_t *p2p, int peer, const void *buf, size_t nbytes, uint32_t tag,
                            loom_p2p_req_t *req);
loomResult_t loom_p2p_irecv(loom_p2p_t *p2p, int peer, void *buf, size_t nbytes, uint32_t tag,
                            loom_p2p_req_t *req);
/* Progress without blocking: *all_done_p = 1 when every request of reqs[n]
 * completed. A failed request breaks the layer as in wait_all. */
loomResult_t loom_p2p_test_all(loom_p2p_t *p2p, loom_p2p_req_t *reqs, int n, int *all_done_p);
/* Waits until every request of reqs[n] is complete. Spins briefly, then
 * sleeps in the transports. Bounded: Timeout after the communicator's timeout
 * without progress; RemoteError on abort, when a peer is found dead (pid gone
 * on this machine, connection closed) or when a peer reports that its
 * communicator broke. The message names the rank at fault first (rank, host,
 * pid), the operation and its sequence number, and what was pending; a
 * timeout also writes the dump of LOOM_DUMP_ON_TIMEOUT. On error the layer
 * breaks: it tells every peer the cause, closes every connection and
 * abandons the requests; every later call fails with InvalidUsage. */
loomResult_t loom_p2p_wait_all(loom_p2p_t *p2p, loom_p2p_req_t *reqs, int n);
/* As wait_all for reqs[n], while also progressing also[nalso] (which need not
 * finish): a pipeline waits for the receives of one step without stalling the
 * sends of the others, which complete only when tested. */
loomResult_t loom_p2p_wait_for(loom_p2p_t *p2p, loom_p2p_req_t *reqs, int n, loom_p2p_req_t *also,
                               int nalso);
/* Bytes handed to the transports for other ranks since the layer was created. */
uint64_t loom_p2p_bytes_sent(const loom_p2p_t *p2p);

/* Describes the current operation for error messages, e.g. "allreduce seq 12".
 * what is kept, not copied: a string with static storage (a literal). An
 * operation with a new sequence number (an Echo all-reduce, calibration) is
 * not one of the collectives below: its messages say so, and a rank whose
 * call of that number is a collective fails on them (see set_call). */
void loom_p2p_set_context(loom_p2p_t *p2p, const char *what, uint64_t seq);

/* What every rank must pass alike to a collective: its kind and, where the
 * collective has them, count, datatype, op and root (LOOM_P2P_CALL_ANY where
 * they need not agree: AllToAllv's counts, a Broadcast's op). */
#define LOOM_P2P_CALL_ANY (-1)
typedef struct {
    int32_t kind;         /* index into the kind names of set_call */
    int32_t dt, op, root; /* loomDataType_t, loomRedOp_t, rank, or LOOM_P2P_CALL_ANY */
    int64_t count;        /* elements, or LOOM_P2P_CALL_ANY */
} loom_p2p_call_t;

/* set_context for collective seq, plus what its messages carry (a stamp, see
 * transport.h): a rank that receives a message of a call that differs from
 * its own (another kind, count, datatype, op, root, or a message of a call
 * seq its own call of that number never took) fails with InvalidUsage naming
 * the field and both ranks' values, and its notices make every other rank
 * fail with InvalidUsage too (docs/reliability.md). A wait that makes no
 * progress for 100 ms sends its call to the peers it waits on (a probe), so
 * that ranks that all wait on one another still find a difference. Not
 * thread safe: one call at a time, like every collective. kind_names[nkinds]
 * (static storage) name the kinds in messages. */
void loom_p2p_set_call(loom_p2p_t *p2p, const char *what, uint64_t seq, const loom_p2p_call_t *call,
                       const char *const *kind_names, int nkinds);
/* peer's call of number seq seen outside its messages (in memory the ranks
 * share), compared with this rank's call of that number (the current or the
 * previous one; none, or not a collective: nothing to compare) in the fields
 * that call constrains (not the ones it leaves LOOM_P2P_CALL_ANY, and only
 * the kind where the kinds differ). A difference fails as one found in a
 * message does: InvalidUsage here, naming the field and both values, and on
 * every rank through the notices. Success where they agree. */
loomResult_t loom_p2p_call_seen(loom_p2p_t *p2p, int peer, uint64_t seq,
                                const loom_p2p_call_t *theirs);
/* The numbers of this rank's current and previous calls (set_call). */
void loom_p2p_call_seqs(const loom_p2p_t *p2p, uint64_t *cur_p, uint64_t *prev_p);
/* Name of the transport used to reach peer ("self" for the rank itself). */
const char *loom_p2p_transport_name(loom_p2p_t *p2p, int peer);
int loom_p2p_rank(const loom_p2p_t *p2p);
int loom_p2p_nranks(const loom_p2p_t *p2p);

/* Bounds for a wait that is not on requests (flags in memory shared with peers), with
 * the causes and messages of loom_p2p_wait_all; the wait shows in messages and
 * the timeout dump as a receive from `waited` with the collective tag of
 * `step` (none if waited < 0 or is this rank). Events:
 *   CHECK: fails if the communicator was aborted, a peer's notice reports a
 *          failure (or its stream ended) or a same-machine peer's process is
 *          gone; else Success (call it every 100 ms of waiting);
 *   LEFT: `peer` announced outside the streams that it broke or left: its
 *         notice (or its death) says why;
 *   TIMEOUT: no progress for the timeout, waiting for `waited`;
 *   ERROR: the wait failed here with `res`;
 *   BLAME: `peer` is at fault with `res` (a buffer of it that this rank cannot
 *          read): this rank fails with RemoteError naming it, and its notice
 *          makes `peer` itself return `res`.
 * A failure breaks the layer as wait_all does; detail (may be NULL) says what
 * was awaited and goes into the message. start_ns: when the wait began. */
enum {
    LOOM_P2P_EV_CHECK,
    LOOM_P2P_EV_LEFT,
    LOOM_P2P_EV_TIMEOUT,
    LOOM_P2P_EV_ERROR,
    LOOM_P2P_EV_BLAME
};
/* 1 if what CHECK fails on is there (abort, a peer's failure notice or ended
 * stream, a dead same-machine peer, an earlier failure), without failing
 * anything. A waiter calls it before its last look at what it waits for: a
 * peer that posted that and then failed in a later call must not fail it. */
int loom_p2p_failure_seen(loom_p2p_t *p2p);
loomResult_t loom_p2p_wait_event(loom_p2p_t *p2p, int ev, int peer, int waited, unsigned step,
                                 loomResult_t res, uint64_t start_ns, const char *detail);

#endif

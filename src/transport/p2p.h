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
    return 0x80000000u | ((uint32_t)(seq & 0xFFFFFFu) << 7) | (step & 0x7Fu);
}

/* Sets up the layer: transport contexts, listen handles exchanged with the
 * bootstrap (allgather), connections to every peer. Blocking, collective. */
struct loom_bootstrap;
loomResult_t loom_p2p_create(struct loom_bootstrap *bs, const loom_tp_init_args_t *args,
                             const char *net_list, loom_p2p_t **p2p_p);
/* Tells every peer why its connections end (a normal destroy, an abort, or
 * the failure that broke the layer), closes them and frees the layer. Never
 * waits for peers beyond a short bounded flush; keeps going on errors and
 * returns the first. */
loomResult_t loom_p2p_destroy(loom_p2p_t *p2p);

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

/* Describes the current operation for error messages, e.g. "allreduce seq 12". */
void loom_p2p_set_context(loom_p2p_t *p2p, const char *what, uint64_t seq);
/* Name of the transport used to reach peer ("self" for the rank itself). */
const char *loom_p2p_transport_name(loom_p2p_t *p2p, int peer);
int loom_p2p_rank(const loom_p2p_t *p2p);
int loom_p2p_nranks(const loom_p2p_t *p2p);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * echo.h - Echo's engine inside the library: the rank layout of a
 * communicator (hosts x ranks per host), the feedback state, and the
 * pipelined two-shot exchange over the point-to-point layer. The public
 * entry points (src/api/echo_api.c) validate and queue; this runs a call in
 * its turn. docs/echo.md describes the algorithm.
 */
#ifndef LOOM_ECHO_ENGINE_H
#define LOOM_ECHO_ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "loom_echo.h"
#include "p2p.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who owns what. The count elements form P = hosts * local chunks of chunk
 * values each (the last ones short or empty); chunk c is owned by the rank
 * with local index c / hosts on host c % hosts, so the chunks of local index
 * l (its "slice") are contiguous. Flat: hosts = P, local = 1. */
typedef struct {
    int rank, nranks;
    int hosts, local; /* H hosts of L ranks each */
    int host, lrank;  /* this rank's host and local index */
    int *rank_of;     /* [H*L]: the rank at host h, local index l is rank_of[h*L + l] */
} loom_echo_layout_t;

/* Fills the layout of nranks ranks from their host hashes: hierarchical when
 * hier != 0, there is more than one host and every host has the same number
 * (> 1) of ranks; flat otherwise. SystemError if out of memory. */
loomResult_t loom_echo_layout_init(loom_echo_layout_t *lay, const loom_peer_info_t *peers,
                                   int nranks, int rank, int hier);
void loom_echo_layout_free(loom_echo_layout_t *lay);
/* Values per owner chunk for count elements: ceil(count / P) rounded up to a
 * whole tile, so chunk boundaries fall on tile boundaries. */
size_t loom_echo_chunk(size_t count, int nranks);
/* The chunk this rank owns, and its range [*off, *off + *len) (len may be 0). */
int loom_echo_own_chunk(const loom_echo_layout_t *lay, size_t count, size_t *off, size_t *len);

/* One communicator's Echo engine: layout (fixed at first use), workspace,
 * counters. */
typedef struct loom_echo_ctx {
    loom_echo_layout_t lay;
    uint8_t *ws; /* workspace, grown on demand, kept for later calls */
    size_t ws_bytes;
    loom_p2p_req_t *reqs; /* request array, grown on demand */
    size_t nreqs_cap;
    loomEchoCounters_t counters; /* updated with atomics (read by any thread) */
} loom_echo_ctx_t;

loomResult_t loom_echo_ctx_create(const loom_peer_info_t *peers, int nranks, int rank,
                                  loom_echo_ctx_t **ctx_p);
void loom_echo_ctx_free(loom_echo_ctx_t *ctx);

/* The feedback state. e1 holds this rank's residuals of its first
 * quantizations at the elements' positions (zero where it quantizes nothing);
 * e2 the residual of its owner sum, for its own chunk. refs: 1 for the user
 * plus one per call in progress or queued; the last release frees it. */
struct loomEchoState {
    const void *comm; /* identity only: calls must pass the same communicator */
    size_t count;
    loomDataType_t dt;
    size_t own_off, own_len; /* this rank's chunk */
    float *e1;               /* [count] */
    float *e2;               /* [own_len] */
    int refs;
};

/* One call, as queued. */
typedef struct {
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    loomDataType_t dt;
    struct loomEchoState *state; /* NULL: no feedback */
} loom_echo_args_t;

/* Runs one call on every rank (seq: the communicator's collective sequence
 * number, for tags and messages). */
loomResult_t loom_echo_run(loom_echo_ctx_t *ctx, loom_p2p_t *p2p, uint64_t seq,
                           const loom_echo_args_t *a);

#ifdef __cplusplus
}
#endif

#endif

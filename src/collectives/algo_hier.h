/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_hier.h - what the hierarchical algorithms share: the two parts of a
 * communicator that spans hosts (this rank's host, and its rail: one rank
 * per host with its local index), the fallback where the layout has no
 * hierarchy, their kept buffer, and the tag steps of their phases. The
 * algorithms themselves live in algo_hier.c (AllReduce, ReduceScatter,
 * AllGather, Broadcast, AllToAll), algo_hier_a2av.c (AllToAllv) and
 * algo_hier_chain.c (AllReduce in rank order).
 */
#ifndef LOOM_ALGO_HIER_H
#define LOOM_ALGO_HIER_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tag steps of the hierarchical phases, one list so that no two collide (the
 * rail algorithms use their own steps, on connections between hosts). */
enum {
    STEP_LOCAL_REDUCE = 20,
    STEP_LOCAL_GATHER = 21,
    STEP_LOCAL_SCATTER = 22,
    STEP_RAIL_ALLTOALL = 23,
    STEP_A2AV_DIRECT = 24, /* AllToAllv: blocks that go straight to their rank */
    STEP_A2AV_LOCAL = 25,  /* AllToAllv: small blocks to the rank of the right local index */
    STEP_A2AV_RAIL = 26,   /* AllToAllv: small blocks between hosts, one message per pair */
    STEP_CHAIN_RAW = 27,   /* hier_chain: raw slices to their owners inside the host */
    STEP_CHAIN_UP = 28,    /* hier_chain: partials up the rail */
    STEP_CHAIN_DOWN = 29   /* hier_chain: results down the rail */
};

/* One call's view of the layout: L ranks on each of H hosts, this rank being
 * local index l on host `host`; `local` and `rail` are the two parts. */
typedef struct {
    loom_coll_ctx_t *ctx;
    loom_coll_ctx_t local, rail;
    int L, H, l, host;
} loom_hier_t;

/* Fills h for a call on ctx; 0 when the layout has no hierarchy (one host,
 * one rank per host, hosts of unequal sizes, or ctx is itself a part), and
 * the caller then runs loom_hier_flat. */
int loom_hier_begin(loom_hier_t *h, loom_coll_ctx_t *ctx);
/* Where a layout has no hierarchy: the model's flat choice on the whole
 * communicator. */
loomResult_t loom_hier_flat(loom_coll_ctx_t *ctx, const loom_coll_args_t *a);
/* The algorithms' own buffer of at least nbytes (kept for later calls; its
 * contents are not kept when it grows). */
loomResult_t loom_hier_buf(loom_coll_ctx_t *ctx, size_t nbytes, uint8_t **buf_p);
/* Inside the host: every rank sends its span of buf (spans[L], equal on the
 * host's ranks) to each other rank and receives theirs in place. */
loomResult_t loom_hier_local_allgather(loom_hier_t *h, uint8_t *buf, const loom_span_t *spans,
                                       size_t es, unsigned step);
/* *(void **)p_out = n zeroed entries of size bytes (at least one); SystemError
 * (WARNed) when out of memory. */
loomResult_t loom_hier_calloc(size_t n, size_t size, void *p_out);

#ifdef __cplusplus
}
#endif

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_ep.h - what the files of the collective MoE part share (docs/moe.md, "Dispatch and
 * combine"): the plan and handle structures, the row and segment formats on the wire, and the
 * status word by which every rank learns that one of them refused its input. moe_plan.c builds
 * plans, moe_layout.c handles, moe_xfer.c moves rows. Internal to src/moe/.
 */
#ifndef LOOM_MOE_EP_H
#define LOOM_MOE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "loom_moe.h"

#define LOOM_MOE_MAX_TOP_K   64
#define LOOM_MOE_MAX_EXPERTS 32767 /* local ids travel as int16 */

/* Counters of a plan, as loomMoeStats_t without its header. */
typedef struct loom_moe_counters {
    uint64_t layouts, tokens, pairs, pairs_local;
    uint64_t rows_naive_remote, rows_dedup_remote, rows_sent_remote, rows_sent_self;
    uint64_t bytes_sent, bytes_recv;
    uint64_t rows_dropped, pairs_dropped;
} loom_moe_counters_t;

typedef struct loom_moe_trace_writer loom_moe_trace_writer_t;

/* LOOM_MOE_TRACE_FILE for one plan (moe_trace_env.c). */
typedef struct loom_moe_tracing {
    char *path;     /* the expanded file name; NULL: tracing is off (or was turned off) */
    int64_t every;  /* record layouts 0, every, 2*every, ... */
    uint32_t layer; /* the plan's creation order among the traced plans of the process */
    uint64_t calls; /* layouts whose routing every rank accepted */
    loom_moe_trace_writer_t *writer; /* opened at the first record */
} loom_moe_tracing_t;

/* Buffers a plan keeps for the exchanges of its handles (moe_xfer.c), so that a step reuses the
 * pages the last one touched instead of mapping and faulting in fresh ones. Each grows to the
 * largest size asked of it and lives until loomMoePlanDestroy. Contents never carry over: every
 * call writes what it sends, the row padding included. */
enum {
    LOOM_MOE_BUF_SEND,  /* an exchange's send segments */
    LOOM_MOE_BUF_RECV,  /* its receive segments */
    LOOM_MOE_BUF_SEND2, /* combine backward's second exchange */
    LOOM_MOE_BUF_RECV2,
    LOOM_MOE_BUF_SUM, /* combine's float32 sums, one row per token */
    LOOM_MOE_NUM_BUFS
};
typedef struct loom_moe_buf {
    void *ptr;
    size_t cap; /* bytes */
} loom_moe_buf_t;

struct loomMoePlan {
    loomComm_t comm;
    int rank, nranks;
    int num_experts, top_k, mode;
    loomDataType_t dtype;
    size_t hidden;
    size_t elem_bytes;    /* of dtype */
    size_t payload_bytes; /* H * elem_bytes: one token row */
    size_t pairs_per_row; /* k in dedup mode, 1 in naive mode */
    size_t trailer_off;   /* payload_bytes rounded up to 4 */
    size_t row_bytes;     /* the wire stride of a row, a multiple of 16 */
    int32_t *expert_rank; /* [E] */
    int32_t *local_id;    /* [E] index of the expert among its rank's, by ascending id */
    int *num_local;       /* [G] experts on each rank */
    int max_local;        /* the largest of num_local */
    int capacity;         /* loomMoeCapacity_t */
    size_t max_recv_rows; /* static modes */
    loom_moe_tracing_t trace;
    int live_handles;
    loom_moe_counters_t stats;
    loom_moe_buf_t bufs[LOOM_MOE_NUM_BUFS];
};

struct loomMoeHandle {
    loomMoePlan_t plan;
    size_t num_tokens;
    int32_t *topk;  /* [T*k] copy */
    float *weights; /* [T*k] copy */
    /* Send side: rows in wire order, destination ascending, then token (then slot). */
    size_t *send_rows; /* [G] */
    size_t send_total;
    int32_t *row_token; /* [send_total] */
    int32_t *row_slot;  /* [send_total] top-k slot of a naive row; NULL in dedup mode */
    /* Receive side. */
    size_t *recv_rows; /* [G] from each source */
    size_t recv_total;
    int64_t *pair_count;    /* [L*G]: pairs for local expert l from source s at [l*G+s] */
    int64_t *expert_count;  /* [L] */
    int64_t *expert_offset; /* [L] */
    size_t recv_slots;
    /* Filled by Dispatch from the trailers: row r's pairs are [row_start[r], row_start[r+1]),
     * in top-k slot order, each with its slot in recv_x and its weight. */
    int dispatched;
    size_t *row_start;  /* [recv_total + 1] */
    size_t *pair_slot;  /* [recv_slots] */
    float *pair_weight; /* [recv_slots] */
    /* Static capacity (moe_capacity.c). Drop mode sets the dropped selections of topk to -1. */
    size_t required_rows_max; /* the most rows a rank needed before drops, on every rank */
    int overflowed;
    int refused;   /* error mode overflowed: only Query and Destroy accept the handle */
    int need_rank; /* refused: the rank named in the message */
    size_t rows_dropped, pairs_dropped;
};

/* One segment per peer and direction: this header, then its rows. The header travels even
 * when there are no rows, so every rank hears every other rank's status. */
#define LOOM_MOE_SEG_MAGIC 0x53454f4du /* "MOES" */
typedef struct loom_moe_seg_hdr {
    uint32_t magic;
    uint32_t status; /* a loomResult_t: Success, or why the sender refused its input */
    uint64_t rows;
} loom_moe_seg_hdr_t;

/* Static capacity, after a layout's count exchange (moe_capacity.c): one AllGather of every
 * rank's needed rows gives the verdict. Error mode: an overflow marks the handle refused and
 * returns InvalidUsage. Drop mode: an overflow runs the grant exchange and sets the dropped
 * selections of h->topk to -1; *recount_p = 1 then, on every rank, because the counts must be
 * exchanged again, with *recount_status_p as this rank's status (a failure of its drops). */
loomResult_t loom_moe_capacity_apply(struct loomMoePlan *p, struct loomMoeHandle *h, int *recount_p,
                                     loomResult_t *recount_status_p);
/* InvalidUsage, WARNed, for a handle refused by error mode; Success otherwise. */
loomResult_t loom_moe_handle_usable(const char *call, const struct loomMoeHandle *h);

/* LOOM_MOE_TRACE_FILE (moe_trace_env.c): start reads the parameters for a new plan (never
 * fails: a bad setting WARNs and leaves tracing off); record appends one layout's routing
 * when it is due, WARNing once and turning the plan's tracing off on a failure; stop closes. */
void loom_moe_tracing_start(struct loomMoePlan *p);
void loom_moe_tracing_record(struct loomMoePlan *p, const int32_t *topk, const float *weights,
                             size_t num_tokens);
void loom_moe_tracing_stop(struct loomMoePlan *p);

/* Buffer `which` of the plan with room for at least `bytes` (never NULL, even for 0 bytes), or
 * NULL when memory ran out; its contents are undefined. Freed by loom_moe_bufs_free. */
void *loom_moe_buf(struct loomMoePlan *p, int which, size_t bytes);
void loom_moe_bufs_free(struct loomMoePlan *p);

/* The first refusal among the statuses of ranks 0..nranks-1 (status_of(i) read by the caller
 * into statuses[]), or Success. On a rank other than the refusing one, WARNs naming it. */
loomResult_t loom_moe_status_join(const char *call, const uint32_t *statuses, int nranks,
                                  int my_rank);

#endif

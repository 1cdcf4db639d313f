/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_moe.h - mixture-of-experts support (docs/moe.md).
 *
 * The pure part: co-selection and cross-layer affinity statistics from
 * routing decisions, a next-layer prediction from affinity, and the placement
 * of experts on ranks that keeps co-selected experts together. These
 * functions need no communicator; they are integer-only and deterministic, so
 * every rank that passes the same counts (all-reduced with loomUint64 and
 * loomSum) gets the same bytes, on every compiler. All are thread safe on
 * distinct outputs and never block. The collective part: plans, layouts,
 * dispatch and combine (and their backward passes) over a communicator; then
 * token re-ordering, a pure permutation and two collectives that apply it.
 *
 * Routing arrays are top-k tables: int32 [num_tokens * top_k], row t holding
 * token t's expert ids; -1 means "no selection" and may repeat, every other
 * value is in [0, num_experts) and appears at most once per row.
 */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MOE_API_VERSION 1

/* ---- Statistics ---------------------------------------------------------- */

/* Adds one routing batch into the co-selection matrix: for every token and
 * every two distinct experts a, b it selected, coselect[a*E+b] and
 * coselect[b*E+a] each grow by 1; for every expert a it selected,
 * coselect[a*E+a] and load[a] (when load is not NULL) grow by 1. So coselect
 * is X^T X for the token-by-expert selection matrix X: symmetric, with the
 * per-expert token counts on its diagonal.
 * In: topk_idx [num_tokens*top_k] (may be NULL when num_tokens is 0).
 * In/out: coselect [E*E], load [E] or NULL; untouched when an error is returned.
 * Errors: InvalidArgument (E < 1, top_k outside 1..E, a NULL array, an id out
 * of range or repeated in a row, num_tokens*top_k overflowing), SystemError
 * (out of memory). */
LOOM_API loomResult_t loomMoeCoselectAccumulate(const int32_t *topk_idx, size_t num_tokens,
                                                int top_k, int num_experts, uint64_t *coselect,
                                                uint64_t *load);

/* Adds one batch into the cross-layer affinity matrix: for every token and
 * every pair (a selected in the previous layer, b selected in this one),
 * affinity[a*num_experts+b] grows by 1. The "previous layer" is any top-k
 * table over the same tokens, e.g. token ids with prev_k = 1.
 * In: prev_topk [num_tokens*prev_k] over prev_num_experts ids, topk_idx
 * [num_tokens*top_k] over num_experts ids. In/out: affinity
 * [prev_num_experts*num_experts]; untouched when an error is returned.
 * Errors: those of loomMoeCoselectAccumulate, for both tables. */
LOOM_API loomResult_t loomMoeAffinityAccumulate(const int32_t *prev_topk, int prev_k,
                                                int prev_num_experts, const int32_t *topk_idx,
                                                int top_k, int num_experts, size_t num_tokens,
                                                uint64_t *affinity);

/* Predicts this layer's experts from the previous layer's: each expert a a
 * token selected before votes for b with P(b | a) = affinity[a][b] / sum_b'
 * affinity[a][b'], in 32-bit fixed point rounded down; row t of pred_topk gets
 * the pred_k experts with the largest total vote, largest first, ties to the
 * lower id. Experts without any vote are never predicted: their slots hold -1.
 * In: affinity [prev_num_experts*num_experts], prev_topk [num_tokens*prev_k].
 * Out: pred_topk [num_tokens*pred_k]; untouched when an error is returned.
 * Errors: those of loomMoeCoselectAccumulate (pred_k in 1..num_experts). */
LOOM_API loomResult_t loomMoeAffinityPredict(const uint64_t *affinity, int prev_num_experts,
                                             int num_experts, const int32_t *prev_topk, int prev_k,
                                             size_t num_tokens, int pred_k, int32_t *pred_topk);

/* ---- Placement ----------------------------------------------------------- */

#define LOOM_MOE_PLACEMENT_CONFIG_MAGIC 0x4c4d4f02u

/* Options of loomMoePlacementCompute. Always start from
 * LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER, which sets every int to
 * LOOM_CONFIG_UNDEF_INT (UNDEF below: the field's default). A struct from an
 * older caller (smaller size) gets the defaults for the fields it lacks; a
 * larger one (a newer caller) is accepted only if the bytes past this
 * version's struct are zero. */
typedef struct loomMoePlacementConfig_v1 {
    size_t size;             /* sizeof(loomMoePlacementConfig_t), set by the initializer */
    unsigned int magic;      /* LOOM_MOE_PLACEMENT_CONFIG_MAGIC */
    unsigned int version;    /* LOOM_VERSION_CODE of the headers the caller built with */
    int nranks;              /* G in 1..2^20 ranks; required. Rank r gets floor(E/G) experts, plus
                                one for r < E mod G (so ranks >= E get none when G > E) */
    int ranks_per_host;      /* R: ranks h*R..h*R+R-1 form host h; experts are split across
                                hosts first. UNDEF or 1 = one level. R must divide G */
    int load_slack_permille; /* s: keep every rank's load (sum of load[e]) within
                                (1000+s)/1000 of its fair share where possible. UNDEF = load
                                is ignored */
    int max_passes;          /* refinement passes at most (0 = the greedy seed alone); they
                                stop once a pass finds no improving swap. UNDEF = 100 */
} loomMoePlacementConfig_t;

#define LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER                                                      \
    {                                                                                              \
        sizeof(loomMoePlacementConfig_t), LOOM_MOE_PLACEMENT_CONFIG_MAGIC, LOOM_VERSION_CODE,      \
            LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT,                   \
            LOOM_CONFIG_UNDEF_INT                                                                  \
    }

/* Places E experts on config->nranks ranks so that experts often selected
 * together share a rank (docs/moe.md gives the algorithm): a greedy seed, then
 * pair swaps between ranks while a swap raises the co-selection kept inside
 * ranks. Every rank holds exactly its share of experts (see nranks), whatever
 * the counts. Integer-only and deterministic: equal inputs give equal bytes.
 * In: coselect [E*E], symmetric (the diagonal is ignored); load [E] or NULL
 * (needed only with load_slack_permille). The off-diagonal entries must sum
 * to less than 2^60, and load to less than 2^60.
 * Out: expert_rank [E], the rank of each expert; cut_weight (or NULL): the sum
 * of coselect[a*E+b] over a < b placed on different ranks. Untouched when an
 * error is returned.
 * Errors: InvalidArgument (E < 1, NULL coselect or expert_rank, a config not
 * made with the initializer, nranks outside 1..2^20, ranks_per_host not dividing nranks,
 * negative passes or slack, a slack without load, coselect not symmetric or too
 * large), SystemError (out of memory). */
LOOM_API loomResult_t loomMoePlacementCompute(const uint64_t *coselect, const uint64_t *load,
                                              int num_experts,
                                              const loomMoePlacementConfig_t *config,
                                              int32_t *expert_rank, uint64_t *cut_weight);

/* ---- Dispatch and combine -------------------------------------------------
 * A plan per MoE layer, over a communicator; per routed batch a layout (one
 * small count exchange) gives a handle, then dispatch sends each token once
 * per rank that hosts one of its experts, and combine brings back one
 * weighted partial per (token, rank) and adds them in a fixed order
 * (docs/moe.md: the wire format, the slot order, the combine order); the
 * backward calls run the adjoints on the same handle.
 * Every call below is blocking and collective over the plan's communicator:
 * each rank calls it, in the same order, with its own tokens (T may differ
 * across ranks and be 0). Invalid input on one rank makes every rank return
 * loomInvalidArgument, never a hang; outputs are then left untouched. A plan
 * and its handles are used by one thread at a time. Errors common to all:
 * RemoteError, Timeout, SystemError (as the collectives of loom.h). */

#define LOOM_MOE_CONFIG_MAGIC      0x4c4d4f01u
#define LOOM_MOE_LAYOUT_INFO_MAGIC 0x4c4d4f03u
#define LOOM_MOE_STATS_MAGIC       0x4c4d4f04u

typedef struct loomMoePlan *loomMoePlan_t;     /* one MoE layer: comm, E, k, H, placement */
typedef struct loomMoeHandle *loomMoeHandle_t; /* one routed batch: counts, rows, slot map */

typedef enum {
    loomMoeModeDedup = 0, /* one row per (token, destination rank) */
    loomMoeModeNaive = 1  /* one row per (token, expert): for comparison, same results */
} loomMoeMode_t;

/* What a layout does when a rank would receive more rows than the plan allows (docs/moe.md,
 * "Capacity"). The static modes cost one more AllGather of a count per rank in every layout,
 * and DROP, when some rank overflows, an AllToAll of grants and a second count exchange. */
typedef enum {
    loomMoeCapacityDropless = 0, /* no limit: the layout returns the exact sizes to allocate */
    loomMoeCapacityError = 1,    /* a rank over max_recv_rows fails every rank's layout alike */
    loomMoeCapacityDrop = 2      /* overflowing ranks grant quotas; senders drop their lightest
                                    rows, deterministically, and report them */
} loomMoeCapacity_t;

/* Options of loomMoePlanCreate; start from LOOM_MOE_CONFIG_INITIALIZER (UNDEF
 * below: LOOM_CONFIG_UNDEF_INT). A larger struct (a newer caller) is accepted
 * only if the bytes past this version's struct are zero; a smaller one that
 * ends before capacity (an older caller) gets the dropless default. */
typedef struct loomMoeConfig_v1 {
    size_t size;                /* sizeof(loomMoeConfig_t), set by the initializer */
    unsigned int magic;         /* LOOM_MOE_CONFIG_MAGIC */
    unsigned int version;       /* LOOM_VERSION_CODE of the headers the caller built with */
    int num_experts;            /* E in 1..32767; required */
    int top_k;                  /* k in 1..min(E, 64); required. Routing rows may hold -1 */
    int datatype;               /* loomFloat32, loomBfloat16 or loomFloat16: x, recv_x,
                                   expert_out and y; required. Weights are always float32 */
    int mode;                   /* loomMoeMode_t; UNDEF = loomMoeModeDedup */
    size_t hidden;              /* H >= 1 elements per token row; required (0 = unset) */
    const int32_t *expert_rank; /* [E] rank of each expert, in [0, nranks), copied; NULL =
                                   contiguous: rank r holds the next floor(E/G) experts, plus
                                   one for r < E mod G (the shares of loomMoePlacementCompute) */
    int capacity;               /* loomMoeCapacity_t; UNDEF or absent = loomMoeCapacityDropless */
    int64_t max_recv_rows;      /* static modes: rows (token, rank) one rank may receive, those
                                   from itself included, >= 0; required there (UNDEF is
                                   negative, refused); ignored by dropless */
} loomMoeConfig_t;

#define LOOM_MOE_CONFIG_INITIALIZER                                                                \
    {                                                                                              \
        sizeof(loomMoeConfig_t), LOOM_MOE_CONFIG_MAGIC, LOOM_VERSION_CODE, LOOM_CONFIG_UNDEF_INT,  \
            LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, 0, NULL,          \
            LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT                                           \
    }

/* What a layout needs the caller to allocate; start from
 * LOOM_MOE_LAYOUT_INFO_INITIALIZER. The counts are written; the two arrays,
 * when not NULL, are the caller's and receive num_local_experts entries. */
typedef struct loomMoeLayoutInfo_v1 {
    size_t size;            /* sizeof(loomMoeLayoutInfo_t), set by the initializer */
    unsigned int magic;     /* LOOM_MOE_LAYOUT_INFO_MAGIC */
    unsigned int version;   /* LOOM_VERSION_CODE */
    int num_local_experts;  /* out: L, the experts this rank hosts (may be 0) */
    size_t send_rows;       /* out: rows this rank sends, those to itself included */
    size_t recv_rows;       /* out: rows it receives, those from itself included */
    size_t recv_slots;      /* out: rows of recv_x and expert_out, one per (token, local expert) */
    int64_t *expert_count;  /* in: [L] or NULL; out: slots of each local expert */
    int64_t *expert_offset; /* in: [L] or NULL; out: first slot of each local expert */
    /* Static capacity modes (0 in dropless); written only when the caller's size holds them. */
    size_t required_rows_max; /* out: the most rows any rank needed before drops, the same on
                                 every rank */
    int overflowed;           /* out: 1 if required_rows_max > max_recv_rows, on every rank */
    size_t rows_dropped;      /* out: drop mode: rows this rank did not send */
    size_t pairs_dropped;     /* out: drop mode: selections in those rows */
} loomMoeLayoutInfo_t;

#define LOOM_MOE_LAYOUT_INFO_INITIALIZER                                                           \
    {                                                                                              \
        sizeof(loomMoeLayoutInfo_t), LOOM_MOE_LAYOUT_INFO_MAGIC, LOOM_VERSION_CODE, 0, 0, 0, 0,    \
            NULL, NULL, 0, 0, 0, 0                                                                 \
    }

/* Counters of one plan, summed over its layouts, dispatches, combines and
 * backward calls on this rank. "Remote" rows go to another rank; rows to the rank itself are
 * local copies and never wire bytes. */
typedef struct loomMoeStats_v1 {
    size_t size;                /* sizeof(loomMoeStats_t), set by the initializer */
    unsigned int magic;         /* LOOM_MOE_STATS_MAGIC */
    unsigned int version;       /* LOOM_VERSION_CODE */
    uint64_t layouts;           /* loomMoeLayout calls that succeeded */
    uint64_t tokens;            /* tokens routed */
    uint64_t pairs;             /* selections that are not -1 */
    uint64_t pairs_local;       /* of those, with the expert on this rank */
    uint64_t rows_naive_remote; /* remote rows of naive mode: pairs - pairs_local */
    uint64_t rows_dedup_remote; /* remote rows of dedup mode: distinct other ranks per token */
    uint64_t rows_sent_remote;  /* remote rows this plan's mode sent (one of the two above) */
    uint64_t rows_sent_self;    /* rows this rank sent to itself */
    uint64_t bytes_sent;        /* wire bytes to other ranks, dispatch, combine, backward */
    uint64_t bytes_recv;        /* wire bytes from other ranks, dispatch, combine, backward */
    uint64_t rows_dropped;      /* drop mode: rows this rank did not send (written only when
                                   the caller's size holds it, as pairs_dropped) */
    uint64_t pairs_dropped;     /* drop mode: selections in them; pairs counts the rest */
} loomMoeStats_t;

#define LOOM_MOE_STATS_INITIALIZER                                                                 \
    {                                                                                              \
        sizeof(loomMoeStats_t), LOOM_MOE_STATS_MAGIC, LOOM_VERSION_CODE, 0, 0, 0, 0, 0, 0, 0, 0,   \
            0, 0, 0, 0                                                                             \
    }

/* Creates a plan for one MoE layer over comm, which must outlive it.
 * Collective: every rank must pass the same E, k, H, datatype, mode,
 * placement, capacity and max_recv_rows; each is compared across ranks (the placement as a 64-bit
 * hash, all in one AllReduce), and a difference, or an invalid config on any rank, fails every rank
 * with InvalidArgument naming the field. Local expert ids on a rank run 0..L-1 in ascending global
 * id. Out: *plan, set only on success. Errors: InvalidArgument. */
LOOM_API loomResult_t loomMoePlanCreate(loomMoePlan_t *plan, const loomMoeConfig_t *config,
                                        loomComm_t comm);
/* Frees a plan; NULL is a no-op. Local. Errors: InvalidUsage while handles
 * made from it are alive (the plan is then kept). */
LOOM_API loomResult_t loomMoePlanDestroy(loomMoePlan_t plan);
/* Copies the plan's counters into *stats (made with LOOM_MOE_STATS_INITIALIZER),
 * then zeroes them if reset != 0. Local. Errors: InvalidArgument. */
LOOM_API loomResult_t loomMoePlanGetStats(loomMoePlan_t plan, loomMoeStats_t *stats, int reset);

/* Routes a batch of T tokens: topk_idx [T*k] (ids in [0, E) or -1, none
 * twice in a row, as for the statistics above) and topk_weights [T*k] float32
 * (ignored where the id is -1); both may be NULL when T is 0 and are copied, so
 * they may be reused at once. One small AllToAll of counts, never of the
 * routing. *info (may be NULL; see loomMoeHandleQuery) gets the exact sizes to
 * allocate for dispatch and combine. Static capacity (docs/moe.md): in error
 * mode, when a rank would receive more than max_recv_rows, every rank returns
 * InvalidUsage ("rank R needs N rows > max_recv_rows M"), with *info filled
 * (required_rows_max, overflowed) and *handle set to a handle that only
 * loomMoeHandleQuery and loomMoeHandleDestroy accept; in drop mode rows are
 * dropped by the grant rule and reported in *info, the counters and
 * loomMoeHandleKept, and every later call on the handle honours the drops.
 * Collective; blocking. Out: *handle, set on success (and on the overflow
 * above). Errors: InvalidArgument (bad routing or arguments on any rank:
 * every rank returns it; the rank at fault names the token, slot and id),
 * InvalidUsage (error-mode overflow). */
LOOM_API loomResult_t loomMoeLayout(loomMoePlan_t plan, const int32_t *topk_idx,
                                    const float *topk_weights, size_t num_tokens,
                                    loomMoeHandle_t *handle, loomMoeLayoutInfo_t *info);
/* Writes kept [T*k]: 1 where the selection (t, j) reaches its expert, 0 where its id is -1 or
 * drop mode dropped it. Local. Errors: InvalidArgument (NULL handle, kept NULL with T > 0),
 * InvalidUsage (a handle refused by error mode: nothing reaches an expert). */
LOOM_API loomResult_t loomMoeHandleKept(loomMoeHandle_t handle, uint8_t *kept);
/* Sends token rows x [T*H] to the ranks of their experts and writes recv_x
 * [recv_slots*H] expert-major: local expert ascending, then source rank, then
 * source token. Dedup mode moves each token once per destination rank and
 * copies it into each of its local experts' slots on arrival. Collective;
 * blocking; may be repeated (new x, same routing). Errors: InvalidArgument
 * (on any rank: x NULL with T > 0, recv_x NULL with recv_slots > 0). */
LOOM_API loomResult_t loomMoeDispatch(loomMoeHandle_t handle, const void *x, void *recv_x);
/* Returns expert outputs expert_out [recv_slots*H] (same slot order as
 * recv_x, unweighted) and writes y [T*H]: y[t] = sum over t's selections of
 * weight * expert_out, computed in float32 in a fixed order and rounded once
 * (docs/moe.md), so the bits do not depend on the transport, arrival order
 * or mode. A token without selections gets 0. Needs a Dispatch on the handle
 * first. Collective; blocking. Errors: InvalidArgument (on any rank:
 * expert_out NULL with recv_slots > 0, y NULL with T > 0), InvalidUsage (no
 * dispatch yet, on any rank). */
LOOM_API loomResult_t loomMoeCombine(loomMoeHandle_t handle, const void *expert_out, void *y);
/* The adjoint of loomMoeDispatch (docs/moe.md, "Backward"): takes the gradient of recv_x,
 * grad_recv_x [recv_slots*H] in the slot order of recv_x, and writes grad_x [T*H]: grad_x[t] =
 * the sum of the gradients of t's slots, in combine's order (per rank, slots in top-k order
 * into a float32 partial; the home rank adds the partials in ascending rank and rounds once),
 * so the bits do not depend on the transport, arrival order or mode. A token without
 * selections gets 0. Needs a Dispatch on the handle first. Collective; blocking. Errors:
 * InvalidArgument (on any rank: grad_recv_x NULL with recv_slots > 0, grad_x NULL with T > 0),
 * InvalidUsage (no dispatch yet, on any rank). */
LOOM_API loomResult_t loomMoeDispatchBackward(loomMoeHandle_t handle, const void *grad_recv_x,
                                              void *grad_x);
/* The adjoint of loomMoeCombine: takes grad_y [T*H] and the expert_out [recv_slots*H] that
 * combine took, and writes grad_expert_out [recv_slots*H] (slot of the pair (t, j): w[t, j] *
 * grad_y[t] in float32, rounded to the datatype) and grad_weights [T*k] float32 (entry (t, j):
 * <grad_y[t], expert_out[slot of (t, j)]> summed in float32 over the columns in order; 0 where
 * the id is -1). grad_y travels as dispatch sends x, one row per (token, rank); the weight
 * gradients come back in a second exchange. Same bits in both modes. Needs a Dispatch on the
 * handle first. Collective; blocking. Errors: InvalidArgument (on any rank: grad_y or
 * grad_weights NULL with T > 0, expert_out or grad_expert_out NULL with recv_slots > 0),
 * InvalidUsage (no dispatch yet, on any rank). */
LOOM_API loomResult_t loomMoeCombineBackward(loomMoeHandle_t handle, const void *grad_y,
                                             const void *expert_out, void *grad_expert_out,
                                             float *grad_weights);
/* Fills *info as loomMoeLayout did. Local. Errors: InvalidArgument. */
LOOM_API loomResult_t loomMoeHandleQuery(loomMoeHandle_t handle, loomMoeLayoutInfo_t *info);
/* Frees a handle; NULL is a no-op. Local. */
LOOM_API loomResult_t loomMoeHandleDestroy(loomMoeHandle_t handle);

/* ---- Re-ordering ----------------------------------------------------------
 * Moves tokens toward the ranks of their next layer's experts through the
 * sequence-parallel ReduceScatter a layer already runs (docs/moe.md,
 * "Re-ordering"). A permutation perm [T] lists natural token indices by
 * position; rank r owns positions first_r .. first_r + n_r - 1, with n_r =
 * floor(T/G) plus one for r < T mod G and first_r = r*floor(T/G) + min(r, T
 * mod G) (the shares of the placement). */

/* Computes perm [num_tokens] (out) from the predicted experts pred_topk
 * [num_tokens*pred_k] (ids in [0, E) or -1, none twice in a row) and the
 * placement expert_rank [E] (values in [0, nranks)): score[t][g] counts t's
 * predicted experts on g; tokens in order of best score descending, then best
 * minus second-best descending, then index take their highest-scoring rank
 * with room left (ties to the lower rank); each rank's tokens by index. Pure,
 * integer-only, deterministic: every rank computes the same bytes. home_rank
 * [num_tokens] (out, or NULL) gets the rank each token lands on, for
 * loom's row counts. Outputs untouched on error. Errors: InvalidArgument
 * (a bad table or placement, nranks outside 1..2^20, more than 2^31-1 tokens,
 * a NULL array with tokens), SystemError (out of memory). */
LOOM_API loomResult_t loomMoeReorderCompute(const int32_t *expert_rank, int num_experts, int nranks,
                                            const int32_t *pred_topk, int pred_k, size_t num_tokens,
                                            int32_t *perm, int32_t *home_rank);
/* Row j of recvbuff [n_r*hidden] = op over ranks of row perm[first_r + j] of
 * sendbuff [num_tokens*hidden]: a gather of the rows into a scratch buffer,
 * then loomReduceScatter, with the same bits. hidden, datatype, op, perm and
 * num_tokens must be equal on every rank: each rank checks them itself, so a
 * perm that is not a permutation is refused on every rank with no message
 * sent; a NULL buffer with rows, on its rank alone (as by loomReduceScatter).
 * The buffers may overlap. Collective over comm; blocking. Errors: those of
 * loomReduceScatter. */
LOOM_API loomResult_t loomMoeReduceScatterPermuted(const void *sendbuff, void *recvbuff,
                                                   size_t hidden, loomDataType_t datatype,
                                                   loomRedOp_t op, const int32_t *perm,
                                                   size_t num_tokens, loomComm_t comm);
/* The inverse and adjoint: row perm[first_g + j] of recvbuff
 * [num_tokens*hidden] = row j of rank g's sendbuff [n_g*hidden] (loomAllGather,
 * then a scatter into natural order). Arguments and errors as above. */
LOOM_API loomResult_t loomMoeAllGatherPermuted(const void *sendbuff, void *recvbuff, size_t hidden,
                                               loomDataType_t datatype, const int32_t *perm,
                                               size_t num_tokens, loomComm_t comm);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_MOE_H */

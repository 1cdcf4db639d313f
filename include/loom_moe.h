/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_moe.h - mixture-of-experts support (docs/moe.md).
 *
 * This version holds the pure part: co-selection and cross-layer affinity
 * statistics from routing decisions, a next-layer prediction from affinity,
 * and the placement of experts on ranks that keeps co-selected experts
 * together. These functions need no communicator; they are integer-only and
 * deterministic, so every rank that passes the same counts (all-reduced with
 * loomUint64 and loomSum) gets the same bytes, on every compiler. All are
 * thread safe on distinct outputs and never block.
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
 * The collective part (plans over a communicator, the per-batch layout,
 * dispatch and combine) will be declared here. */

#ifdef __cplusplus
}
#endif
#endif /* LOOM_MOE_H */

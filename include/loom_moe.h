/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_moe.h - mixture-of-experts support (docs/moe.md).
 *
 * This version holds the pure part: co-selection and cross-layer affinity
 * statistics from routing decisions and a next-layer prediction from
 * affinity. These functions need no communicator; they are integer-only and
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

/* ---- Dispatch and combine -------------------------------------------------
 * The collective part (plans over a communicator, the per-batch layout,
 * dispatch and combine) will be declared here. */

#ifdef __cplusplus
}
#endif
#endif /* LOOM_MOE_H */

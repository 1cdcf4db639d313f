/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_gen.h - synthetic MoE routing with a known structure, and the row counts that dedup
 * dispatch is judged by (docs/moe-trace.md gives every formula). The generators are
 * deterministic for a seed on every machine (splitmix64, rng.h): uniform top-k; planted
 * partitions (E experts in G hidden groups, a token's experts drawn from its group with
 * probability rho per slot) with Zipf popularity, inter-layer affinity, masked selections and
 * a hot set of experts (one rank's, to skew the load);
 * and text-driven groups, where a token's group follows from the byte it stands for and the
 * byte before. Used by the MoE benchmark and the tests; pure functions of their arguments, no
 * communicator, thread-safe.
 */
#ifndef LOOM_MOE_GEN_H
#define LOOM_MOE_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* A planted-partition routing model (algorithms B.4 of docs/moe-trace.md). */
typedef struct loom_moe_gen {
    uint32_t num_experts; /* E, 1..32767 */
    uint32_t top_k;       /* k, 1..E */
    uint32_t num_groups;  /* G hidden groups, 1..E, sizes floor(E/G) or ceil(E/G) */
    double rho;           /* per slot: P(the expert comes from the token's group), [0, 1] */
    double zipf_alpha;    /* expert popularity (r + 1)^-alpha over a hidden order r; [0, 8] */
    double rho_layer;     /* per token and layer > 0: P(group = the previous layer's, mapped) */
    double mask;          /* per slot: P(the selection is -1), [0, 1] */
    uint32_t hot_experts; /* skew: experts 0..hot_experts-1 (rank 0's under a contiguous */
    double hot_ratio;     /*   placement) draw hot_ratio x their share at k = 1; 0 experts: off */
    uint64_t seed;
} loom_moe_gen_t;

/* Fills topk (T, k) with k distinct experts per token, uniform without replacement, and weight
 * (T, k; may be NULL) with positive weights summing to 1 per token, largest first. */
loomResult_t loom_moe_gen_uniform(uint32_t num_experts, uint32_t top_k, size_t num_tokens,
                                  uint64_t seed, int32_t *topk, float *weight);

/* Fills L layers of routing for T tokens from model g: topk (L, T, k), weight (L, T, k) or
 * NULL, group (L, T) or NULL (each token's hidden group). loomInvalidArgument if g is out of
 * range. */
loomResult_t loom_moe_gen_planted(const loom_moe_gen_t *g, size_t num_tokens, uint32_t num_layers,
                                  int32_t *topk, float *weight, uint32_t *group);

/* The planted truth of layer `layer`: expert_group (E) receives each expert's hidden group. */
loomResult_t loom_moe_gen_groups(const loom_moe_gen_t *g, uint32_t layer, uint32_t *expert_group);

/* Text-driven routing: token t is byte text[t]; its group at layer l is a fixed hash of its
 * text class, the previous byte's class and the previous byte, mod G, through a per-layer
 * permutation of the groups (rho_layer is not used). Fills topk, weight, group as
 * loom_moe_gen_planted does and text_class (T, or NULL). */
loomResult_t loom_moe_gen_text(const loom_moe_gen_t *g, const uint8_t *text, size_t num_tokens,
                               uint32_t num_layers, int32_t *topk, float *weight, uint32_t *group,
                               uint8_t *text_class);

/* A byte's text class, 0..13: lower-case, upper-case, digit, space, newline, punctuation, other
 * (times 2), plus 1 inside a word (the previous byte is a letter or digit). */
uint8_t loom_moe_text_class(uint8_t prev, uint8_t cur);

/* Row counts of one routing batch under a placement (docs/moe-trace.md, "Metrics"). */
typedef struct loom_moe_rows {
    uint64_t pairs;             /* selections that are not -1 */
    uint64_t pairs_local;       /* of those, with the expert on the token's home rank */
    uint64_t rows_naive_remote; /* R0: pairs - pairs_local, one row per remote selection */
    uint64_t rows;              /* sum over tokens of the distinct ranks their experts are on */
    uint64_t rows_remote;       /* R1: the same without each token's home rank */
    uint64_t rows_max_to_rank;  /* the most remote rows one rank receives */
} loom_moe_rows_t;

/* Counts rows for topk (T, k) with expert e on rank expert_rank[e] (E entries in
 * [0, nranks)) and token t at home on home_rank[t] (T entries; NULL: no token is local).
 * rows_to_rank (nranks, or NULL) receives the remote rows each rank receives.
 * loomInvalidArgument if an id or a rank is out of range. */
loomResult_t loom_moe_rows_count(const int32_t *topk, size_t num_tokens, uint32_t top_k,
                                 uint32_t num_experts, const int32_t *expert_rank, uint32_t nranks,
                                 const int32_t *home_rank, uint64_t *rows_to_rank,
                                 loom_moe_rows_t *rows);

/* Under uniform routing (k distinct experts, uniform without replacement), the expected number
 * of distinct ranks a token's experts are on: sum over ranks r of 1 - C(E - n_r, k) / C(E, k),
 * with n_r the experts on r (G (1 - C(E - E/G, k) / C(E, k)) for an even placement). */
loomResult_t loom_moe_expected_distinct_ranks(const int32_t *expert_rank, uint32_t num_experts,
                                              uint32_t nranks, uint32_t top_k, double *expect_p);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_coselect.c - routing statistics for expert placement: co-selection
 * counts within a layer, affinity counts across layers, and the prediction of
 * a layer's experts from the previous layer's through affinity. Integer-only,
 * so counts all-reduced across ranks give every rank the same answers. Does
 * not place experts (moe_place.c) and never communicates. Called by users
 * through include/loom_moe.h.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom_moe.h"
#include "moe.h"

loomResult_t loom_moe_topk_check(const char *what, const int32_t *topk, size_t num_tokens,
                                 int top_k, int num_experts)
{
    if (num_experts < 1 || top_k < 1 || top_k > num_experts) {
        LOOM_WARN("%s: top_k %d must be in 1..num_experts, num_experts %d must be >= 1", what,
                  top_k, num_experts);
        return loomInvalidArgument;
    }
    if (num_tokens > SIZE_MAX / (size_t)top_k / sizeof(int32_t)) {
        LOOM_WARN("%s: %zu tokens x top_k %d overflows", what, num_tokens, top_k);
        return loomInvalidArgument;
    }
    if (num_tokens == 0)
        return loomSuccess;
    if (topk == NULL) {
        LOOM_WARN("%s is NULL with %zu tokens", what, num_tokens);
        return loomInvalidArgument;
    }
    /* seen[e] holds 1 + the last row that selected e: one pass finds repeats. */
    size_t *seen = calloc((size_t)num_experts, sizeof(*seen));
    if (seen == NULL) {
        LOOM_WARN("%s: out of memory for %d experts", what, num_experts);
        return loomSystemError;
    }
    loomResult_t res = loomSuccess;
    for (size_t t = 0; t < num_tokens && res == loomSuccess; t++) {
        for (int j = 0; j < top_k; j++) {
            int32_t e = topk[t * (size_t)top_k + (size_t)j];
            if (e == -1)
                continue;
            if (e < 0 || e >= num_experts) {
                LOOM_WARN("%s: token %zu slot %d holds expert %d, outside 0..%d", what, t, j, e,
                          num_experts - 1);
                res = loomInvalidArgument;
                break;
            }
            if (seen[e] == t + 1) {
                LOOM_WARN("%s: token %zu selects expert %d twice", what, t, e);
                res = loomInvalidArgument;
                break;
            }
            seen[e] = t + 1;
        }
    }
    free(seen);
    return res;
}

static loomResult_t check_matrix(const char *what, const void *m)
{
    if (m == NULL) {
        LOOM_WARN("%s is NULL", what);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomMoeCoselectAccumulate(const int32_t *topk_idx, size_t num_tokens,
                                                int top_k, int num_experts, uint64_t *coselect,
                                                uint64_t *load)
{
    LOOM_CHECK(loom_moe_topk_check("topk_idx", topk_idx, num_tokens, top_k, num_experts));
    LOOM_CHECK(check_matrix("coselect", coselect));
    size_t ne = (size_t)num_experts;
    for (size_t t = 0; t < num_tokens; t++) {
        const int32_t *row = topk_idx + t * (size_t)top_k;
        for (int i = 0; i < top_k; i++) {
            if (row[i] < 0)
                continue;
            size_t a = (size_t)row[i];
            if (load != NULL)
                load[a]++;
            for (int j = 0; j < top_k; j++)
                if (row[j] >= 0)
                    coselect[a * ne + (size_t)row[j]]++;
        }
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomMoeAffinityAccumulate(const int32_t *prev_topk, int prev_k,
                                                int prev_num_experts, const int32_t *topk_idx,
                                                int top_k, int num_experts, size_t num_tokens,
                                                uint64_t *affinity)
{
    LOOM_CHECK(loom_moe_topk_check("prev_topk", prev_topk, num_tokens, prev_k, prev_num_experts));
    LOOM_CHECK(loom_moe_topk_check("topk_idx", topk_idx, num_tokens, top_k, num_experts));
    LOOM_CHECK(check_matrix("affinity", affinity));
    size_t ne = (size_t)num_experts;
    for (size_t t = 0; t < num_tokens; t++) {
        const int32_t *prev = prev_topk + t * (size_t)prev_k;
        const int32_t *cur = topk_idx + t * (size_t)top_k;
        for (int i = 0; i < prev_k; i++) {
            if (prev[i] < 0)
                continue;
            for (int j = 0; j < top_k; j++)
                if (cur[j] >= 0)
                    affinity[(size_t)prev[i] * ne + (size_t)cur[j]]++;
        }
    }
    return loomSuccess;
}

// ---- prediction ------------------------------------------------------------

/* vote(a, b) = floor(2^32 * affinity[a][b] / rowsum[a]). A row sum of 2^32 or
 * more is first shifted right (with each entry) until it fits in 32 bits, so
 * the product fits in 64 and the result stays an exact function of the counts. */
typedef struct {
    uint64_t sum;   /* the row sum, shifted */
    unsigned shift; /* bits dropped from the row sum and each entry */
} vote_row_t;

static loomResult_t vote_rows(const uint64_t *affinity, size_t prev_ne, size_t ne, vote_row_t *rows)
{
    for (size_t a = 0; a < prev_ne; a++) {
        uint64_t sum = 0;
        for (size_t b = 0; b < ne; b++) {
            uint64_t v = affinity[a * ne + b];
            if (sum > UINT64_MAX - v) {
                LOOM_WARN("affinity row %zu sums past 2^64 over %zu experts", a, ne);
                return loomInvalidArgument;
            }
            sum += v;
        }
        unsigned shift = 0;
        while ((sum >> shift) >= ((uint64_t)1 << 32))
            shift++;
        rows[a].sum = sum >> shift;
        rows[a].shift = shift;
    }
    return loomSuccess;
}

/* Row t's top pred_k experts by score, largest first, ties to the lower id;
 * -1 past the experts with a nonzero score. */
static void predict_row(const uint64_t *score, int num_experts, int pred_k, int32_t *out)
{
    int n = 0;
    for (int j = 0; j < pred_k; j++)
        out[j] = -1;
    for (int b = 0; b < num_experts; b++) {
        if (score[b] == 0)
            continue;
        /* ids arrive ascending, so an equal score never moves ahead of an earlier id */
        int pos = n < pred_k ? n : pred_k;
        while (pos > 0 && score[out[pos - 1]] < score[b])
            pos--;
        if (pos >= pred_k)
            continue;
        int last = n < pred_k ? n : pred_k - 1;
        memmove(out + pos + 1, out + pos, (size_t)(last - pos) * sizeof(*out));
        out[pos] = b;
        if (n < pred_k)
            n++;
    }
}

LOOM_API loomResult_t loomMoeAffinityPredict(const uint64_t *affinity, int prev_num_experts,
                                             int num_experts, const int32_t *prev_topk, int prev_k,
                                             size_t num_tokens, int pred_k, int32_t *pred_topk)
{
    LOOM_CHECK(loom_moe_topk_check("prev_topk", prev_topk, num_tokens, prev_k, prev_num_experts));
    LOOM_CHECK(check_matrix("affinity", affinity));
    if (num_experts < 1 || pred_k < 1 || pred_k > num_experts) {
        LOOM_WARN("pred_k %d must be in 1..num_experts, num_experts %d must be >= 1", pred_k,
                  num_experts);
        return loomInvalidArgument;
    }
    if (num_tokens > SIZE_MAX / (size_t)pred_k / sizeof(int32_t)) {
        LOOM_WARN("pred_topk: %zu tokens x pred_k %d overflows", num_tokens, pred_k);
        return loomInvalidArgument;
    }
    if (num_tokens > 0 && pred_topk == NULL) {
        LOOM_WARN("pred_topk is NULL with %zu tokens", num_tokens);
        return loomInvalidArgument;
    }
    size_t prev_ne = (size_t)prev_num_experts, ne = (size_t)num_experts;
    vote_row_t *rows = malloc(prev_ne * sizeof(*rows));
    uint64_t *score = malloc(ne * sizeof(*score));
    loomResult_t res = loomSuccess;
    if (rows == NULL || score == NULL) {
        LOOM_WARN("out of memory predicting over %zu x %zu experts", prev_ne, ne);
        res = loomSystemError;
        goto out;
    }
    LOOM_CHECK_GOTO(vote_rows(affinity, prev_ne, ne, rows), res, out);
    for (size_t t = 0; t < num_tokens; t++) {
        memset(score, 0, ne * sizeof(*score));
        const int32_t *prev = prev_topk + t * (size_t)prev_k;
        for (int i = 0; i < prev_k; i++) {
            if (prev[i] < 0 || rows[prev[i]].sum == 0)
                continue;
            const vote_row_t *r = &rows[prev[i]];
            const uint64_t *arow = affinity + (size_t)prev[i] * ne;
            for (size_t b = 0; b < ne; b++)
                score[b] += ((arow[b] >> r->shift) << 32) / r->sum;
        }
        predict_row(score, num_experts, pred_k, pred_topk + t * (size_t)pred_k);
    }
out:
    free(rows);
    free(score);
    return res;
}

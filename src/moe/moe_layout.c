/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_layout.c - loomMoeLayout: turns one batch's routing into a handle. Each rank counts the
 * rows it will send to every rank and the pairs for each of that rank's local experts, and
 * sends exactly those counts, with a status word, in one AllToAll (never the routing itself).
 * From the counts it receives, a rank knows its receive sizes and the first slot of every
 * (local expert, source) run, so dispatch can write slots in the canonical order without a
 * sort. In the static capacity modes the verdict and the drops follow the count exchange
 * (moe_capacity.c), and drops are followed by a second count exchange. Also loomMoeHandleQuery,
 * loomMoeHandleKept and loomMoeHandleDestroy. Moves no rows (moe_xfer.c).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moe.h"
#include "moe_ep.h"

/* Forgets both sides of a count exchange, so that it can run again after drops. */
static void sides_reset(struct loomMoeHandle *h)
{
    free(h->send_rows);
    free(h->row_token);
    free(h->row_slot);
    free(h->recv_rows);
    free(h->pair_count);
    free(h->expert_count);
    free(h->expert_offset);
    h->send_rows = h->recv_rows = NULL;
    h->row_token = h->row_slot = NULL;
    h->pair_count = h->expert_count = h->expert_offset = NULL;
    h->send_total = h->recv_total = h->recv_slots = 0;
}

static void handle_free(struct loomMoeHandle *h)
{
    if (h == NULL)
        return;
    free(h->topk);
    free(h->weights);
    sides_reset(h);
    free(h->row_start);
    free(h->pair_slot);
    free(h->pair_weight);
    free(h);
}

static loomResult_t oom(const char *what, size_t n)
{
    LOOM_WARN("loomMoeLayout: out of memory for %s (%zu entries)", what, n);
    return loomSystemError;
}

/* An info struct from an older caller ends before the capacity fields: those are not written. */
static loomResult_t info_check(const loomMoeLayoutInfo_t *info)
{
    return loom_moe_struct_check(
        "loomMoeLayoutInfo_t", "LOOM_MOE_LAYOUT_INFO_INITIALIZER", info, info ? info->size : 0,
        info ? info->magic : 0, LOOM_MOE_LAYOUT_INFO_MAGIC,
        offsetof(loomMoeLayoutInfo_t, required_rows_max), sizeof(*info), 0);
}

/* The local checks of one rank's arguments; Success or the refusal to share. */
static loomResult_t layout_check(const struct loomMoePlan *p, const int32_t *topk_idx,
                                 const float *topk_weights, size_t num_tokens,
                                 loomMoeHandle_t *handle, const loomMoeLayoutInfo_t *info)
{
    if (handle == NULL) {
        LOOM_WARN("loomMoeLayout: handle is NULL");
        return loomInvalidArgument;
    }
    if (info != NULL)
        LOOM_CHECK(info_check(info));
    if (num_tokens > INT32_MAX) {
        LOOM_WARN("loomMoeLayout: %zu tokens, more than the %d a batch may hold", num_tokens,
                  INT32_MAX);
        return loomInvalidArgument;
    }
    LOOM_CHECK(loom_moe_topk_check("loomMoeLayout: topk_idx", topk_idx, num_tokens, p->top_k,
                                   p->num_experts));
    if (topk_weights == NULL && num_tokens > 0) {
        LOOM_WARN("loomMoeLayout: topk_weights is NULL with %zu tokens", num_tokens);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* One pass over the routing in token, then slot, order. Counting (pos NULL): rows and pairs
 * per destination into msg and send_rows, and the counters. Filling: each row's token (and
 * slot, naive) at pos[g]++, so tokens ascend within each destination. */
static void route_pass(const struct loomMoePlan *p, struct loomMoeHandle *h, int32_t *seen,
                       size_t *pos, int64_t *msg, size_t msg_len, loom_moe_counters_t *c)
{
    size_t k = (size_t)p->top_k;
    int naive = p->mode == loomMoeModeNaive;
    for (size_t g = 0; g < (size_t)p->nranks; g++)
        seen[g] = -1;
    for (size_t t = 0; t < h->num_tokens; t++) {
        for (size_t j = 0; j < k; j++) {
            int32_t e = h->topk[t * k + j];
            if (e < 0)
                continue;
            size_t g = (size_t)p->expert_rank[e];
            int first = seen[g] != (int32_t)t, self = g == (size_t)p->rank;
            seen[g] = (int32_t)t;
            if (pos == NULL) {
                msg[g * msg_len + 2 + (size_t)p->local_id[e]]++;
                c->pairs++;
                c->pairs_local += self;
                c->rows_naive_remote += !self;
                c->rows_dedup_remote += first && !self;
                h->send_rows[g] += naive || first;
            } else if (naive || first) {
                h->row_token[pos[g]] = (int32_t)t;
                if (naive)
                    h->row_slot[pos[g]] = (int32_t)j;
                pos[g]++;
            }
        }
    }
}

static loomResult_t routing_copy(const struct loomMoePlan *p, struct loomMoeHandle *h,
                                 const int32_t *topk_idx, const float *topk_weights)
{
    size_t n = h->num_tokens * (size_t)p->top_k;
    h->topk = malloc((n ? n : 1) * sizeof(int32_t));
    h->weights = malloc((n ? n : 1) * sizeof(float));
    if (h->topk == NULL || h->weights == NULL)
        return oom("the routing copy", n);
    if (n > 0) {
        memcpy(h->topk, topk_idx, n * sizeof(int32_t));
        memcpy(h->weights, topk_weights, n * sizeof(float));
    }
    return loomSuccess;
}

/* Builds the send side from the handle's routing: rows per destination, and each row's token
 * (and top-k slot in naive mode) in wire order. Fills msg[g] = {status, rows, pairs for each
 * of g's local experts} and the routing counters. */
static loomResult_t send_side(const struct loomMoePlan *p, struct loomMoeHandle *h, int64_t *msg,
                              size_t msg_len, loom_moe_counters_t *c)
{
    size_t G = (size_t)p->nranks;
    int naive = p->mode == loomMoeModeNaive;
    h->send_rows = calloc(G, sizeof(size_t));
    size_t *pos = calloc(G, sizeof(size_t));
    int32_t *seen = malloc(G * sizeof(int32_t));
    loomResult_t res = loomSuccess;
    if (h->send_rows == NULL || pos == NULL || seen == NULL) {
        res = oom("the send counts", G);
        goto out;
    }
    route_pass(p, h, seen, NULL, msg, msg_len, c);
    for (size_t g = 0; g < G; g++) {
        msg[g * msg_len + 1] = (int64_t)h->send_rows[g];
        pos[g] = h->send_total;
        h->send_total += h->send_rows[g];
    }
    c->rows_sent_self = h->send_rows[p->rank];
    c->rows_sent_remote = h->send_total - c->rows_sent_self;
    size_t rows = h->send_total;
    h->row_token = malloc((rows ? rows : 1) * sizeof(int32_t));
    h->row_slot = naive ? malloc((rows ? rows : 1) * sizeof(int32_t)) : NULL;
    if (h->row_token == NULL || (naive && h->row_slot == NULL)) {
        res = oom("the send rows", rows);
        goto out;
    }
    route_pass(p, h, seen, pos, msg, msg_len, c);
out:
    free(pos);
    free(seen);
    return res;
}

/* From the counts received, the receive sizes and each local expert's run of slots. */
static loomResult_t recv_side(const struct loomMoePlan *p, struct loomMoeHandle *h,
                              const int64_t *msg, size_t msg_len)
{
    size_t G = (size_t)p->nranks, L = (size_t)p->num_local[p->rank];
    h->recv_rows = calloc(G, sizeof(size_t));
    h->pair_count = calloc(L * G + 1, sizeof(int64_t));
    h->expert_count = calloc(L + 1, sizeof(int64_t));
    h->expert_offset = calloc(L + 1, sizeof(int64_t));
    if (h->recv_rows == NULL || h->pair_count == NULL || h->expert_count == NULL ||
        h->expert_offset == NULL)
        return oom("the receive counts", L * G);
    for (size_t s = 0; s < G; s++) {
        const int64_t *m = msg + s * msg_len;
        if (m[1] < 0) {
            LOOM_WARN("loomMoeLayout: rank %zu announced %lld rows", s, (long long)m[1]);
            return loomRemoteError;
        }
        h->recv_rows[s] = (size_t)m[1];
        h->recv_total += (size_t)m[1];
        for (size_t l = 0; l < (size_t)p->max_local; l++) {
            if (m[2 + l] < 0 || (l >= L && m[2 + l] != 0)) {
                LOOM_WARN("loomMoeLayout: rank %zu announced %lld pairs for local expert %zu of "
                          "rank %d, which hosts %zu",
                          s, (long long)m[2 + l], l, p->rank, L);
                return loomRemoteError;
            }
            if (l < L) {
                h->pair_count[l * G + s] = m[2 + l];
                h->expert_count[l] += m[2 + l];
            }
        }
    }
    for (size_t l = 0; l < L; l++) {
        h->expert_offset[l] = (int64_t)h->recv_slots;
        h->recv_slots += (size_t)h->expert_count[l];
    }
    return loomSuccess;
}

/* One count exchange: this rank's status (and, when it is Success, its counts from the handle's
 * routing) to every rank, then the receive side from what came back. msg holds 2*G*msg_len. */
static loomResult_t count_exchange(struct loomMoePlan *p, struct loomMoeHandle *h,
                                   loomResult_t status, int64_t *msg, size_t msg_len,
                                   loom_moe_counters_t *c)
{
    size_t G = (size_t)p->nranks;
    memset(msg, 0, 2 * G * msg_len * sizeof(int64_t));
    if (status == loomSuccess)
        status = send_side(p, h, msg, msg_len, c);
    if (status != loomSuccess)
        memset(msg, 0, G * msg_len * sizeof(int64_t));
    for (size_t g = 0; g < G; g++)
        msg[g * msg_len] = status;
    int64_t *in = msg + G * msg_len;
    LOOM_CHECK(loomAllToAll(msg, in, msg_len, loomInt64, p->comm, NULL));
    uint32_t *st = malloc(G * sizeof(uint32_t));
    if (st == NULL)
        return oom("the statuses", G);
    for (size_t s = 0; s < G; s++)
        st[s] = (uint32_t)in[s * msg_len];
    loomResult_t res = loom_moe_status_join("loomMoeLayout", st, p->nranks, p->rank);
    free(st);
    if (res == loomSuccess)
        res = recv_side(p, h, in, msg_len);
    return res;
}

static void fill_info(const struct loomMoeHandle *h, loomMoeLayoutInfo_t *info)
{
    const struct loomMoePlan *p = h->plan;
    int L = p->num_local[p->rank];
    info->num_local_experts = L;
    info->send_rows = h->send_total;
    info->recv_rows = h->recv_total;
    info->recv_slots = h->recv_slots;
    if (info->expert_count != NULL && L > 0)
        memcpy(info->expert_count, h->expert_count, (size_t)L * sizeof(int64_t));
    if (info->expert_offset != NULL && L > 0)
        memcpy(info->expert_offset, h->expert_offset, (size_t)L * sizeof(int64_t));
    if (info->size >= sizeof(*info)) {
        info->required_rows_max = h->required_rows_max;
        info->overflowed = h->overflowed;
        info->rows_dropped = h->rows_dropped;
        info->pairs_dropped = h->pairs_dropped;
    }
}

static void counters_add(loom_moe_counters_t *sum, const loom_moe_counters_t *c)
{
    sum->layouts += c->layouts;
    sum->tokens += c->tokens;
    sum->pairs += c->pairs;
    sum->pairs_local += c->pairs_local;
    sum->rows_naive_remote += c->rows_naive_remote;
    sum->rows_dedup_remote += c->rows_dedup_remote;
    sum->rows_sent_remote += c->rows_sent_remote;
    sum->rows_sent_self += c->rows_sent_self;
    sum->rows_dropped += c->rows_dropped;
    sum->pairs_dropped += c->pairs_dropped;
}

LOOM_API loomResult_t loomMoeLayout(loomMoePlan_t plan, const int32_t *topk_idx,
                                    const float *topk_weights, size_t num_tokens,
                                    loomMoeHandle_t *handle, loomMoeLayoutInfo_t *info)
{
    if (plan == NULL) {
        LOOM_WARN("loomMoeLayout: plan is NULL");
        return loomInvalidArgument;
    }
    size_t G = (size_t)plan->nranks, msg_len = 2 + (size_t)plan->max_local;
    int64_t *msg = calloc(2 * G * msg_len, sizeof(int64_t));
    struct loomMoeHandle *h = calloc(1, sizeof(*h));
    loom_moe_counters_t c = {0};
    if (msg == NULL || h == NULL) {
        /* Without its buffers this rank cannot take part: its peers will time out. */
        free(msg);
        free(h);
        return oom("the count exchange", 2 * G * msg_len);
    }
    h->plan = plan;
    h->num_tokens = num_tokens;
    loomResult_t status = layout_check(plan, topk_idx, topk_weights, num_tokens, handle, info);
    if (status == loomSuccess)
        status = routing_copy(plan, h, topk_idx, topk_weights);
    loomResult_t res = count_exchange(plan, h, status, msg, msg_len, &c);
    if (res == loomSuccess)
        loom_moe_tracing_record(plan, h->topk, h->weights, num_tokens);
    int recount = 0;
    loomResult_t recount_status = loomSuccess;
    if (res == loomSuccess && plan->capacity != loomMoeCapacityDropless)
        res = loom_moe_capacity_apply(plan, h, &recount, &recount_status);
    if (res == loomSuccess && recount) {
        /* Drops changed the routing: exchange the counts again, so receivers size their runs. */
        sides_reset(h);
        memset(&c, 0, sizeof(c));
        res = count_exchange(plan, h, recount_status, msg, msg_len, &c);
        c.rows_dropped = h->rows_dropped;
        c.pairs_dropped = h->pairs_dropped;
    }
    free(msg);
    if (res != loomSuccess && !h->refused) {
        handle_free(h);
        return res;
    }
    if (res == loomSuccess) {
        c.layouts = 1;
        c.tokens = num_tokens;
        counters_add(&plan->stats, &c);
    }
    plan->live_handles++;
    if (info != NULL)
        fill_info(h, info);
    *handle = h;
    return res;
}

LOOM_API loomResult_t loomMoeHandleQuery(loomMoeHandle_t handle, loomMoeLayoutInfo_t *info)
{
    if (handle == NULL) {
        LOOM_WARN("loomMoeHandleQuery: handle is NULL");
        return loomInvalidArgument;
    }
    LOOM_CHECK(info_check(info));
    fill_info(handle, info);
    return loomSuccess;
}

LOOM_API loomResult_t loomMoeHandleKept(loomMoeHandle_t handle, uint8_t *kept)
{
    if (handle == NULL) {
        LOOM_WARN("loomMoeHandleKept: handle is NULL");
        return loomInvalidArgument;
    }
    LOOM_CHECK(loom_moe_handle_usable("loomMoeHandleKept", handle));
    size_t n = handle->num_tokens * (size_t)handle->plan->top_k;
    if (kept == NULL && n > 0) {
        LOOM_WARN("loomMoeHandleKept: kept is NULL with %zu tokens", handle->num_tokens);
        return loomInvalidArgument;
    }
    /* Drop mode set the dropped selections of the handle's routing to -1. */
    for (size_t i = 0; i < n; i++)
        kept[i] = handle->topk[i] >= 0;
    return loomSuccess;
}

LOOM_API loomResult_t loomMoeHandleDestroy(loomMoeHandle_t handle)
{
    if (handle == NULL)
        return loomSuccess;
    handle->plan->live_handles--;
    handle_free(handle);
    return loomSuccess;
}

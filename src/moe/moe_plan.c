/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_plan.c - MoE plans: one per layer over a communicator. Creation checks the config and
 * then, with one AllReduce, that every rank passed the same E, k, H, datatype, mode,
 * placement and capacity, so that a mismatch fails every rank at once instead of corrupting rows
 * later. Also the counters (loomMoePlanGetStats) and the checks every collective MoE call shares.
 * Does not route or move rows (moe_layout.c, moe_xfer.c). Called through include/loom_moe.h.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "moe.h"
#include "moe_ep.h"

loomResult_t loom_moe_struct_check(const char *type, const char *init, const void *s, size_t size,
                                   unsigned int magic, unsigned int want_magic, size_t min_size,
                                   size_t own_size, int zero_tail)
{
    if (s == NULL || magic != want_magic || size < min_size) {
        LOOM_WARN("%s was not initialized with %s (%s, magic 0x%x, size %zu bytes, need magic "
                  "0x%x and at least %zu bytes)",
                  type, init, s ? "set" : "NULL", s ? magic : 0u, s ? size : (size_t)0, want_magic,
                  min_size);
        return loomInvalidArgument;
    }
    /* A newer caller's fields must be unset (zero) for this library to honour it. */
    for (size_t i = own_size; zero_tail && i < size; i++) {
        if (((const unsigned char *)s)[i] != 0) {
            LOOM_WARN("%s of %zu bytes sets byte %zu, past the %zu bytes this library knows", type,
                      size, i, own_size);
            return loomInvalidArgument;
        }
    }
    return loomSuccess;
}

loomResult_t loom_moe_status_join(const char *call, const uint32_t *statuses, int nranks,
                                  int my_rank)
{
    for (int r = 0; r < nranks; r++) {
        if (statuses[r] == loomSuccess)
            continue;
        loomResult_t res =
            statuses[r] < loomNumResults ? (loomResult_t)statuses[r] : loomRemoteError;
        /* The refusing rank has already said why; the others name it. */
        if (r != my_rank)
            LOOM_WARN("%s: rank %d refused its input (%s; its log says why), so rank %d returns "
                      "too",
                      call, r, loomGetErrorString(res), my_rank);
        return res;
    }
    return loomSuccess;
}

// ---- config ------------------------------------------------------------------------------

#define CONFIG_HAS(_cfg, _field)                                                                   \
    ((_cfg)->size >= offsetof(loomMoeConfig_t, _field) + sizeof((_cfg)->_field))

static loomResult_t read_capacity(const loomMoeConfig_t *cfg, struct loomMoePlan *p)
{
    int cap = CONFIG_HAS(cfg, capacity) ? cfg->capacity : LOOM_CONFIG_UNDEF_INT;
    p->capacity = cap == LOOM_CONFIG_UNDEF_INT ? loomMoeCapacityDropless : cap;
    if (p->capacity != loomMoeCapacityDropless && p->capacity != loomMoeCapacityError &&
        p->capacity != loomMoeCapacityDrop) {
        LOOM_WARN("loomMoeConfig_t: capacity %d is none of loomMoeCapacityDropless (0), "
                  "loomMoeCapacityError (1) and loomMoeCapacityDrop (2)",
                  p->capacity);
        return loomInvalidArgument;
    }
    if (p->capacity == loomMoeCapacityDropless)
        return loomSuccess;
    int64_t rows = CONFIG_HAS(cfg, max_recv_rows) ? cfg->max_recv_rows : LOOM_CONFIG_UNDEF_INT;
    if (rows < 0) {
        LOOM_WARN("loomMoeConfig_t: max_recv_rows %lld%s must be >= 0 rows in the static "
                  "capacity modes",
                  (long long)rows, rows == LOOM_CONFIG_UNDEF_INT ? " (unset)" : "");
        return loomInvalidArgument;
    }
    p->max_recv_rows = (size_t)rows;
    return loomSuccess;
}

static loomResult_t read_config(const loomMoeConfig_t *cfg, int nranks, struct loomMoePlan *p)
{
    /* The capacity fields came later: a struct that ends before them is an older caller's. */
    LOOM_CHECK(loom_moe_struct_check("loomMoeConfig_t", "LOOM_MOE_CONFIG_INITIALIZER", cfg,
                                     cfg ? cfg->size : 0, cfg ? cfg->magic : 0,
                                     LOOM_MOE_CONFIG_MAGIC, offsetof(loomMoeConfig_t, capacity),
                                     sizeof(loomMoeConfig_t), 1));
    const int undef = LOOM_CONFIG_UNDEF_INT;
    if (cfg->num_experts < 1 || cfg->num_experts > LOOM_MOE_MAX_EXPERTS) {
        LOOM_WARN("loomMoeConfig_t: num_experts %d%s must be in 1..%d", cfg->num_experts,
                  cfg->num_experts == undef ? " (unset)" : "", LOOM_MOE_MAX_EXPERTS);
        return loomInvalidArgument;
    }
    int kmax = cfg->num_experts < LOOM_MOE_MAX_TOP_K ? cfg->num_experts : LOOM_MOE_MAX_TOP_K;
    if (cfg->top_k < 1 || cfg->top_k > kmax) {
        LOOM_WARN("loomMoeConfig_t: top_k %d%s must be in 1..%d (num_experts %d, at most %d)",
                  cfg->top_k, cfg->top_k == undef ? " (unset)" : "", kmax, cfg->num_experts,
                  LOOM_MOE_MAX_TOP_K);
        return loomInvalidArgument;
    }
    if (cfg->datatype != loomFloat32 && cfg->datatype != loomBfloat16 &&
        cfg->datatype != loomFloat16) {
        LOOM_WARN("loomMoeConfig_t: datatype %d%s must be loomFloat32, loomBfloat16 or "
                  "loomFloat16",
                  cfg->datatype, cfg->datatype == undef ? " (unset)" : "");
        return loomInvalidArgument;
    }
    int mode = cfg->mode == undef ? loomMoeModeDedup : cfg->mode;
    if (mode != loomMoeModeDedup && mode != loomMoeModeNaive) {
        LOOM_WARN("loomMoeConfig_t: mode %d is neither loomMoeModeDedup (0) nor "
                  "loomMoeModeNaive (1)",
                  mode);
        return loomInvalidArgument;
    }
    size_t elem = loom_dtype_size((loomDataType_t)cfg->datatype);
    /* A row plus its trailer must fit size_t with room to spare. */
    if (cfg->hidden < 1 || cfg->hidden > ((size_t)1 << 40) / elem) {
        LOOM_WARN("loomMoeConfig_t: hidden %zu must be in 1..%zu elements", cfg->hidden,
                  ((size_t)1 << 40) / elem);
        return loomInvalidArgument;
    }
    for (int e = 0; cfg->expert_rank != NULL && e < cfg->num_experts; e++) {
        if (cfg->expert_rank[e] < 0 || cfg->expert_rank[e] >= nranks) {
            LOOM_WARN("loomMoeConfig_t: expert_rank[%d] = %d, outside the communicator's ranks "
                      "0..%d",
                      e, cfg->expert_rank[e], nranks - 1);
            return loomInvalidArgument;
        }
    }
    LOOM_CHECK(read_capacity(cfg, p));
    p->num_experts = cfg->num_experts;
    p->top_k = cfg->top_k;
    p->mode = mode;
    p->dtype = (loomDataType_t)cfg->datatype;
    p->hidden = cfg->hidden;
    p->elem_bytes = elem;
    return loomSuccess;
}

/* Rank r holds the next floor(E/G) experts, plus one for r < E mod G. */
static void contiguous_placement(int num_experts, int nranks, int32_t *expert_rank)
{
    int e = 0;
    for (int r = 0; r < nranks; r++) {
        int share = num_experts / nranks + (r < num_experts % nranks ? 1 : 0);
        for (int i = 0; i < share; i++)
            expert_rank[e++] = r;
    }
}

/* Placement, local ids and the row format. */
static loomResult_t plan_derive(struct loomMoePlan *p, const int32_t *expert_rank)
{
    size_t ne = (size_t)p->num_experts;
    p->expert_rank = malloc(ne * sizeof(int32_t));
    p->local_id = malloc(ne * sizeof(int32_t));
    p->num_local = calloc((size_t)p->nranks, sizeof(int));
    if (p->expert_rank == NULL || p->local_id == NULL || p->num_local == NULL) {
        LOOM_WARN("loomMoePlanCreate: out of memory for %d experts on %d ranks", p->num_experts,
                  p->nranks);
        return loomSystemError;
    }
    if (expert_rank != NULL)
        memcpy(p->expert_rank, expert_rank, ne * sizeof(int32_t));
    else
        contiguous_placement(p->num_experts, p->nranks, p->expert_rank);
    for (size_t e = 0; e < ne; e++)
        p->local_id[e] = p->num_local[p->expert_rank[e]]++;
    for (int r = 0; r < p->nranks; r++)
        if (p->num_local[r] > p->max_local)
            p->max_local = p->num_local[r];
    p->payload_bytes = p->hidden * p->elem_bytes;
    p->pairs_per_row = p->mode == loomMoeModeNaive ? 1 : (size_t)p->top_k;
    p->trailer_off = (p->payload_bytes + 3) & ~(size_t)3;
    size_t trailer = 4 + p->pairs_per_row * (sizeof(float) + sizeof(int16_t));
    p->row_bytes = (p->trailer_off + trailer + 15) & ~(size_t)15;
    return loomSuccess;
}

// ---- the collective check ------------------------------------------------------------------

enum {
    F_STATUS,
    F_EXPERTS,
    F_TOPK,
    F_HIDDEN,
    F_DTYPE,
    F_MODE,
    F_PLACEMENT,
    F_CAPACITY,
    F_MAX_RECV,
    F_COUNT
};
static const char *const field_name[F_COUNT] = {"status",           "num_experts", "top_k",
                                                "hidden",           "datatype",    "mode",
                                                "expert placement", "capacity",    "max_recv_rows"};

/* FNV-1a over the placement's values, as little-endian int32. */
static uint64_t placement_hash(const int32_t *expert_rank, int num_experts)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int e = 0; e < num_experts; e++) {
        uint32_t v = (uint32_t)expert_rank[e];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

/* One AllReduce(MAX) of each field and of its complement gives every field's MAX and MIN on
 * every rank; a field whose MIN and MAX differ was passed differently somewhere. */
static loomResult_t plan_agree(const struct loomMoePlan *p, int valid)
{
    uint64_t v[2 * F_COUNT] = {0};
    if (valid) {
        v[F_EXPERTS] = (uint64_t)p->num_experts;
        v[F_TOPK] = (uint64_t)p->top_k;
        v[F_HIDDEN] = (uint64_t)p->hidden;
        v[F_DTYPE] = (uint64_t)p->dtype;
        v[F_MODE] = (uint64_t)p->mode;
        v[F_PLACEMENT] = placement_hash(p->expert_rank, p->num_experts);
        v[F_CAPACITY] = (uint64_t)p->capacity;
        v[F_MAX_RECV] = (uint64_t)p->max_recv_rows;
    } else {
        v[F_STATUS] = 1;
    }
    uint64_t mine[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        mine[f] = v[f];
        v[F_COUNT + f] = ~v[f];
    }
    LOOM_CHECK(loomAllReduce(v, v, 2 * F_COUNT, loomUint64, loomMax, p->comm, NULL));
    if (v[F_STATUS] != 0) {
        if (valid)
            LOOM_WARN("loomMoePlanCreate: another rank passed an invalid config (its log says "
                      "which), so rank %d fails too",
                      p->rank);
        return loomInvalidArgument;
    }
    for (int f = F_EXPERTS; f < F_COUNT; f++) {
        uint64_t hi = v[f], lo = ~v[F_COUNT + f];
        if (hi == lo)
            continue;
        LOOM_WARN("loomMoePlanCreate: %s differs across ranks (from 0x%llx to 0x%llx; rank %d "
                  "passed 0x%llx): every rank must pass the same plan",
                  field_name[f], (unsigned long long)lo, (unsigned long long)hi, p->rank,
                  (unsigned long long)mine[f]);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static void plan_free(struct loomMoePlan *p)
{
    if (p == NULL)
        return;
    free(p->expert_rank);
    free(p->local_id);
    free(p->num_local);
    loom_moe_bufs_free(p);
    loom_moe_tracing_stop(p);
    free(p);
}

LOOM_API loomResult_t loomMoePlanCreate(loomMoePlan_t *plan, const loomMoeConfig_t *config,
                                        loomComm_t comm)
{
    int nranks = 0, rank = 0;
    if (comm == NULL) {
        LOOM_WARN("loomMoePlanCreate: comm is NULL");
        return loomInvalidArgument;
    }
    LOOM_CHECK(loomCommCount(comm, &nranks));
    LOOM_CHECK(loomCommUserRank(comm, &rank));
    struct loomMoePlan *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        LOOM_WARN("loomMoePlanCreate: out of memory for a plan");
        return loomSystemError;
    }
    p->comm = comm;
    p->rank = rank;
    p->nranks = nranks;
    int valid = 1;
    if (plan == NULL) {
        LOOM_WARN("loomMoePlanCreate: plan is NULL");
        valid = 0;
    } else if (read_config(config, nranks, p) != loomSuccess) {
        valid = 0;
    }
    loomResult_t res = loomSuccess;
    if (valid)
        res = plan_derive(p, config->expert_rank);
    /* Out of memory here still joins the check, so that the other ranks do not wait. */
    loomResult_t agreed = plan_agree(p, valid && res == loomSuccess);
    if (res == loomSuccess)
        res = agreed;
    if (res != loomSuccess) {
        plan_free(p);
        return res;
    }
    LOOM_INFO(LOOM_LOG_COLL,
              "moe plan: rank %d of %d, %d experts (%d here), top_k %d, hidden %zu, %s, %s mode, "
              "%zu bytes a row",
              rank, nranks, p->num_experts, p->num_local[rank], p->top_k, p->hidden,
              loom_dtype_name(p->dtype), p->mode == loomMoeModeNaive ? "naive" : "dedup",
              p->row_bytes);
    loom_moe_tracing_start(p);
    *plan = p;
    return loomSuccess;
}

LOOM_API loomResult_t loomMoePlanDestroy(loomMoePlan_t plan)
{
    if (plan == NULL)
        return loomSuccess;
    if (plan->live_handles > 0) {
        LOOM_WARN("loomMoePlanDestroy: %d handles made from the plan are alive; destroy them "
                  "first",
                  plan->live_handles);
        return loomInvalidUsage;
    }
    plan_free(plan);
    return loomSuccess;
}

LOOM_API loomResult_t loomMoePlanGetStats(loomMoePlan_t plan, loomMoeStats_t *stats, int reset)
{
    if (plan == NULL) {
        LOOM_WARN("loomMoePlanGetStats: plan is NULL");
        return loomInvalidArgument;
    }
    LOOM_CHECK(loom_moe_struct_check("loomMoeStats_t", "LOOM_MOE_STATS_INITIALIZER", stats,
                                     stats ? stats->size : 0, stats ? stats->magic : 0,
                                     LOOM_MOE_STATS_MAGIC, offsetof(loomMoeStats_t, rows_dropped),
                                     sizeof(loomMoeStats_t), 0));
    const loom_moe_counters_t *c = &plan->stats;
    stats->layouts = c->layouts;
    stats->tokens = c->tokens;
    stats->pairs = c->pairs;
    stats->pairs_local = c->pairs_local;
    stats->rows_naive_remote = c->rows_naive_remote;
    stats->rows_dedup_remote = c->rows_dedup_remote;
    stats->rows_sent_remote = c->rows_sent_remote;
    stats->rows_sent_self = c->rows_sent_self;
    stats->bytes_sent = c->bytes_sent;
    stats->bytes_recv = c->bytes_recv;
    if (stats->size >= sizeof(loomMoeStats_t)) {
        stats->rows_dropped = c->rows_dropped;
        stats->pairs_dropped = c->pairs_dropped;
    }
    if (reset)
        memset(&plan->stats, 0, sizeof(plan->stats));
    return loomSuccess;
}

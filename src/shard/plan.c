/* SPDX-License-Identifier: Apache-2.0
 *
 * plan.c - loomShardPlanCreate and loomShardPlanDestroy: the checks of the list and config, the
 * choice of each matrix's owner (docs/shard.md, Planner) and the layout of the full buffer,
 * shards and state (shard_plan.h). Pure: the same input gives the same plan and fingerprint on
 * every rank, so nothing here may depend on the process (addresses, time, environment).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard_plan.h"

/* Every element count stays below this, so that bytes (x 16 at most: param, grad and two Adam
 * moments) and Rows' padding fit size_t. */
#define SHARD_MAX_ELEMS (SIZE_MAX / 64)

static loomResult_t check_config(const loomShardConfig_t *c, loomShardConfig_t *out)
{
    static const char fn[] = "loomShardPlanCreate";
    if (c->size != sizeof(loomShardConfig_t) || c->magic != LOOM_SHARD_CONFIG_MAGIC ||
        c->version != LOOM_VERSION_CODE) {
        LOOM_WARN("%s: config has size %zu, magic 0x%x, version %u (expected %zu, 0x%x, %u): "
                  "start from LOOM_SHARD_CONFIG_INITIALIZER",
                  fn, c->size, c->magic, c->version, sizeof(loomShardConfig_t),
                  LOOM_SHARD_CONFIG_MAGIC, (unsigned)LOOM_VERSION_CODE);
        return loomInvalidUsage;
    }
    if (c->ns_steps < 1) {
        LOOM_WARN("%s: config ns_steps %d must be >= 1", fn, c->ns_steps);
        return loomInvalidUsage;
    }
    if ((unsigned)c->layout > (unsigned)loomShardReplicated) {
        LOOM_WARN("%s: config layout %d is not Owner, Rows or Replicated", fn, (int)c->layout);
        return loomInvalidArgument;
    }
    if ((unsigned)c->balance > (unsigned)loomShardBalanceRoundRobin) {
        LOOM_WARN("%s: config balance %d is not NsCost, Numel or RoundRobin", fn, (int)c->balance);
        return loomInvalidArgument;
    }
    *out = *c;
    out->deterministic = c->deterministic != 0;
    out->agree = c->agree != 0;
    out->rows_bucketed = c->rows_bucketed != 0;
    return loomSuccess;
}

static loomResult_t check_params(const loomShardParam_t *ps, int n, int P, size_t *total)
{
    static const char fn[] = "loomShardPlanCreate";
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        const loomShardParam_t *q = &ps[i];
        size_t numel;
        if (q->rows == 0 || q->cols == 0) {
            LOOM_WARN("%s: param %d has a zero shape (%zu x %zu)", fn, i, q->rows, q->cols);
            return loomInvalidArgument;
        }
        if (__builtin_mul_overflow(q->rows, q->cols, &numel) || numel > SHARD_MAX_ELEMS ||
            __builtin_add_overflow(sum, numel, &sum) || sum > SHARD_MAX_ELEMS) {
            LOOM_WARN("%s: param %d (%zu x %zu) overflows: at most %zu elements in all", fn, i,
                      q->rows, q->cols, (size_t)SHARD_MAX_ELEMS);
            return loomInvalidArgument;
        }
        if (q->kind != loomShardMatrix && q->kind != loomShardElementwise) {
            LOOM_WARN("%s: param %d has kind %d (neither Matrix nor Elementwise)", fn, i,
                      (int)q->kind);
            return loomInvalidArgument;
        }
        if (q->kind == loomShardMatrix && (q->owner < -1 || q->owner >= P)) {
            LOOM_WARN("%s: param %d (matrix %zu x %zu) has owner %d, outside -1..%d for %d ranks",
                      fn, i, q->rows, q->cols, q->owner, P - 1, P);
            return loomInvalidArgument;
        }
        if (q->kind == loomShardElementwise && q->owner != -1) {
            LOOM_WARN("%s: param %d is element-wise but has owner %d (only matrices take one)", fn,
                      i, q->owner);
            return loomInvalidArgument;
        }
        if (q->bucket < 0 || (i > 0 && q->bucket < ps[i - 1].bucket)) {
            LOOM_WARN("%s: param %d has bucket %d after bucket %d: buckets are >= 0 and must "
                      "not decrease along the list",
                      fn, i, q->bucket, i > 0 ? ps[i - 1].bucket : 0);
            return loomInvalidArgument;
        }
    }
    *total = sum;
    return loomSuccess;
}

static size_t piece_lo(size_t n, int r, int P)
{
    return (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)P);
}

/* ---- the planner -------------------------------------------------------------------------- */

typedef struct {
    double load;
    size_t bytes;
} rank_load_t;

/* A free matrix while planning: sorted by (cost desc, numel desc, list index asc). */
typedef struct {
    double cost;
    size_t numel;
    int idx;
} plan_item_t;

static int cmp_item(const void *a, const void *b)
{
    const plan_item_t *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return x->idx < y->idx ? -1 : 1;
}

static double balance_cost(const shard_param_t *q, const loomShardConfig_t *c)
{
    if (c->balance == loomShardBalanceNsCost)
        return q->ns_cost;
    return (double)q->numel; /* Numel, and RoundRobin's order */
}

static loomResult_t over_cap(int i, const shard_param_t *q, size_t cap)
{
    LOOM_WARN("loomShardPlanCreate: param %d (matrix %zu x %zu, %zu bytes of param, grad and "
              "momentum) fits on no rank under max_rank_bytes %zu",
              i, q->rows, q->cols, 12 * q->numel, cap);
    return loomInvalidArgument;
}

/* Chooses owners for the free matrices (Owner layout); fixed ones keep theirs. */
static loomResult_t assign_owners(struct loomShardPlan *p)
{
    const int P = p->nranks, n = p->nparams;
    const size_t cap = p->cfg.max_rank_bytes;
    rank_load_t *ld = calloc((size_t)P, sizeof(*ld));
    plan_item_t *items = malloc((size_t)n * sizeof(*items));
    loomResult_t res = loomSuccess;
    int nfree = 0;
    if (ld == NULL || items == NULL) {
        LOOM_WARN("loomShardPlanCreate: out of memory for %d params on %d ranks", n, P);
        res = loomSystemError;
        goto out;
    }
    for (int b = 0; b < p->nbuckets; b++) {
        size_t ne = p->buckets[b].e_elems;
        for (int r = 0; r < P; r++)
            ld[r].bytes += 16 * (piece_lo(ne, r + 1, P) - piece_lo(ne, r, P));
    }
    for (int r = 0; r < P; r++)
        if (cap != 0 && ld[r].bytes > cap) {
            LOOM_WARN("loomShardPlanCreate: the element-wise pieces alone need %zu bytes on rank "
                      "%d, over max_rank_bytes %zu",
                      ld[r].bytes, r, cap);
            res = loomInvalidArgument;
            goto out;
        }
    for (int i = 0; i < n; i++) {
        shard_param_t *q = &p->params[i];
        if (q->kind != loomShardMatrix)
            continue;
        if (q->hint >= 0) {
            q->owner = q->hint;
            ld[q->owner].load += balance_cost(q, &p->cfg);
            ld[q->owner].bytes += 12 * q->numel;
            if (cap != 0 && ld[q->owner].bytes > cap) {
                res = over_cap(i, q, cap);
                goto out;
            }
        } else {
            items[nfree++] = (plan_item_t){balance_cost(q, &p->cfg), q->numel, i};
        }
    }
    qsort(items, (size_t)nfree, sizeof(*items), cmp_item);
    for (int k = 0; k < nfree; k++) {
        int i = items[k].idx, best = -1;
        shard_param_t *q = &p->params[i];
        size_t add = 12 * q->numel;
        if (p->cfg.balance == loomShardBalanceRoundRobin) {
            best = k % P;
            if (cap != 0 && ld[best].bytes + add > cap)
                best = -1;
        } else {
            for (int r = 0; r < P; r++) {
                if (cap != 0 && ld[r].bytes + add > cap)
                    continue;
                if (best < 0 || ld[r].load < ld[best].load ||
                    (ld[r].load == ld[best].load && ld[r].bytes < ld[best].bytes))
                    best = r;
            }
        }
        if (best < 0) {
            res = over_cap(i, q, cap);
            goto out;
        }
        q->owner = best;
        ld[best].load += items[k].cost;
        ld[best].bytes += add;
    }
out:
    free(ld);
    free(items);
    return res;
}

/* ---- the layout --------------------------------------------------------------------------- */

static void layout_bucket(struct loomShardPlan *p, int b, size_t *cursor, int *ord)
{
    shard_bucket_t *bk = &p->buckets[b];
    const int P = p->nranks;
    const int owner_layout = p->cfg.layout == loomShardOwner;
    bk->off = *cursor;
    /* The matrix region: by owner under Owner (each M(b,r) in list order), else list order. */
    for (int r = 0; r < (owner_layout ? P : 1); r++) {
        shard_seg_t *s = &p->segs[b * P + r];
        s->m_start = *cursor;
        for (int i = bk->first; i < bk->end; i++) {
            shard_param_t *q = &p->params[i];
            if (q->kind != loomShardMatrix || (owner_layout && q->owner != r))
                continue;
            q->offset = *cursor;
            *cursor += q->numel;
            *ord++ = i;
        }
        s->m_len = *cursor - s->m_start;
    }
    size_t e_start = *cursor;
    for (int i = bk->first; i < bk->end; i++) {
        shard_param_t *q = &p->params[i];
        if (q->kind != loomShardElementwise)
            continue;
        q->offset = *cursor;
        *cursor += q->numel;
        *ord++ = i;
    }
    bk->e_elems = *cursor - e_start;
    bk->m_elems = e_start - bk->off;
    for (int r = 0; r < P; r++) {
        shard_seg_t *s = &p->segs[b * P + r];
        if (p->cfg.layout == loomShardOwner) {
            s->e_start = e_start + piece_lo(bk->e_elems, r, P);
            s->e_len = piece_lo(bk->e_elems, r + 1, P) - piece_lo(bk->e_elems, r, P);
        } else if (p->cfg.layout == loomShardReplicated) {
            s->m_start = bk->off;
            s->m_len = bk->m_elems;
            s->e_start = e_start;
            s->e_len = bk->e_elems;
        } else {
            s->m_start = s->e_start = 0;
            s->m_len = s->e_len = 0;
            for (int i = bk->first; i < bk->end; i++) {
                size_t row0, nrows;
                shard_rows_range(p, i, r, &row0, &nrows);
                if (p->params[i].kind == loomShardMatrix)
                    s->m_len += nrows * p->params[i].cols;
                else
                    s->e_len += nrows * p->params[i].cols;
            }
        }
    }
    for (int i = bk->first; i < bk->end; i++) {
        const shard_param_t *q = &p->params[i];
        size_t padded = q->chunk * q->cols;
        bk->blk += padded;
        if (q->kind == loomShardMatrix) {
            bk->blk_m += padded;
            bk->nmat++;
        }
    }
}

static void layout(struct loomShardPlan *p)
{
    const int P = p->nranks;
    size_t cursor = 0;
    int placed = 0;
    for (int b = 0; b < p->nbuckets; b++) {
        shard_bucket_t *bk = &p->buckets[b];
        layout_bucket(p, b, &cursor, p->order + placed);
        placed += bk->end - bk->first;
        p->padded += bk->blk * (size_t)P;
        p->padded_matrix += bk->blk_m * (size_t)P;
        p->matrix_elems += bk->m_elems;
        for (int r = 0; r < P; r++) {
            shard_seg_t *s = &p->segs[b * P + r];
            s->shard_off = p->shard_elems[r];
            s->state_off = p->state_elems[r];
            p->shard_elems[r] += s->m_len + s->e_len;
            p->state_elems[r] += s->m_len + 2 * s->e_len;
        }
    }
    p->total = cursor;
    for (int i = 0; i < p->nparams; i++) {
        const shard_param_t *q = &p->params[i];
        if (q->kind != loomShardMatrix)
            continue;
        for (int r = 0; r < P; r++)
            if (p->cfg.layout != loomShardOwner || q->owner == r) {
                p->rank_cost[r] += q->ns_cost;
                p->rank_nmat[r]++;
            }
    }
}

/* FNV-1a over every input of the plan and every offset, 8 little-endian bytes per field. */
static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    for (int k = 0; k < 8; k++) {
        h ^= (v >> (8 * k)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t fingerprint(const struct loomShardPlan *p)
{
    const loomShardConfig_t *c = &p->cfg;
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv_u64(h, (uint64_t)p->nranks);
    h = fnv_u64(h, (uint64_t)p->nparams);
    h = fnv_u64(h, (uint64_t)c->layout);
    h = fnv_u64(h, (uint64_t)c->balance);
    h = fnv_u64(h, (uint64_t)c->ns_steps);
    h = fnv_u64(h, (uint64_t)c->max_rank_bytes);
    h = fnv_u64(h, (uint64_t)c->deterministic);
    h = fnv_u64(h, (uint64_t)c->agree);
    h = fnv_u64(h, (uint64_t)c->rows_bucketed);
    for (int i = 0; i < p->nparams; i++) {
        const shard_param_t *q = &p->params[i];
        h = fnv_u64(h, (uint64_t)q->rows);
        h = fnv_u64(h, (uint64_t)q->cols);
        h = fnv_u64(h, (uint64_t)q->kind);
        h = fnv_u64(h, (uint64_t)q->bucket);
        h = fnv_u64(h, (uint64_t)(int64_t)q->owner);
        h = fnv_u64(h, (uint64_t)q->offset);
    }
    return h;
}

static loomResult_t plan_alloc(struct loomShardPlan *p, int n, int P)
{
    p->params = calloc((size_t)n, sizeof(*p->params));
    p->order = calloc((size_t)n, sizeof(int));
    p->buckets = calloc((size_t)p->nbuckets, sizeof(*p->buckets));
    p->segs = calloc((size_t)p->nbuckets * (size_t)P, sizeof(*p->segs));
    p->shard_elems = calloc((size_t)P, sizeof(size_t));
    p->state_elems = calloc((size_t)P, sizeof(size_t));
    p->rank_cost = calloc((size_t)P, sizeof(double));
    p->rank_nmat = calloc((size_t)P, sizeof(int));
    if (!p->params || !p->order || !p->buckets || !p->segs || !p->shard_elems || !p->state_elems ||
        !p->rank_cost || !p->rank_nmat) {
        LOOM_WARN("loomShardPlanCreate: out of memory for %d params, %d buckets, %d ranks", n,
                  p->nbuckets, P);
        return loomSystemError;
    }
    return loomSuccess;
}

static void plan_free(struct loomShardPlan *p)
{
    free(p->params);
    free(p->order);
    free(p->buckets);
    free(p->segs);
    free(p->shard_elems);
    free(p->state_elems);
    free(p->rank_cost);
    free(p->rank_nmat);
    free(p);
}

static void fill_params(struct loomShardPlan *p, const loomShardParam_t *ps)
{
    const int P = p->nranks;
    for (int i = 0; i < p->nparams; i++) {
        shard_param_t *q = &p->params[i];
        shard_bucket_t *bk = &p->buckets[ps[i].bucket];
        q->rows = ps[i].rows;
        q->cols = ps[i].cols;
        q->numel = q->rows * q->cols;
        q->kind = ps[i].kind;
        q->bucket = ps[i].bucket;
        q->hint = ps[i].owner;
        q->owner = -1;
        q->chunk = (q->rows + (size_t)P - 1) / (size_t)P;
        if (q->kind == loomShardMatrix) {
            double s = (double)(q->rows < q->cols ? q->rows : q->cols);
            double l = (double)(q->rows < q->cols ? q->cols : q->rows);
            q->ns_cost = (double)p->cfg.ns_steps * s * s * (2.0 * l + s);
        }
        if (bk->end == 0)
            bk->first = i;
        bk->end = i + 1;
        if (q->kind == loomShardElementwise)
            bk->e_elems += q->numel; /* for assign_owners; layout_bucket sets it again */
    }
    for (int b = 0; b < p->nbuckets; b++)
        if (p->buckets[b].end == 0) /* an empty bucket: [x, x) where its successor starts */
            p->buckets[b].first = p->buckets[b].end = b > 0 ? p->buckets[b - 1].end : 0;
}

LOOM_API loomResult_t loomShardPlanCreate(loomShardPlan_t *plan, const loomShardParam_t *params,
                                          int nparams, int nranks, const loomShardConfig_t *config)
{
    static const loomShardConfig_t defaults = LOOM_SHARD_CONFIG_INITIALIZER;
    loomShardConfig_t cfg;
    size_t total;
    if (plan == NULL || params == NULL || nparams < 1 || nranks < 1) {
        LOOM_WARN("loomShardPlanCreate: plan %p, params %p, nparams %d, nranks %d: needs "
                  "non-NULL pointers and counts >= 1",
                  (void *)plan, (const void *)params, nparams, nranks);
        return loomInvalidArgument;
    }
    *plan = NULL;
    LOOM_CHECK(check_config(config != NULL ? config : &defaults, &cfg));
    LOOM_CHECK(check_params(params, nparams, nranks, &total));
    struct loomShardPlan *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        LOOM_WARN("loomShardPlanCreate: out of memory");
        return loomSystemError;
    }
    p->nparams = nparams;
    p->nranks = nranks;
    p->nbuckets = params[nparams - 1].bucket + 1;
    p->cfg = cfg;
    loomResult_t res = plan_alloc(p, nparams, nranks);
    if (res == loomSuccess) {
        fill_params(p, params);
        if (cfg.layout == loomShardOwner)
            res = assign_owners(p);
    }
    if (res != loomSuccess) {
        plan_free(p);
        return res;
    }
    layout(p);
    if (cfg.layout != loomShardOwner && cfg.max_rank_bytes != 0)
        for (int r = 0; r < nranks; r++) {
            size_t bytes = 4 * (2 * p->shard_elems[r] + p->state_elems[r]);
            if (bytes > cfg.max_rank_bytes) {
                LOOM_WARN("loomShardPlanCreate: the %s layout holds %zu bytes on rank %d, over "
                          "max_rank_bytes %zu",
                          cfg.layout == loomShardRows ? "Rows" : "Replicated", bytes, r,
                          cfg.max_rank_bytes);
                plan_free(p);
                return loomInvalidArgument;
            }
        }
    p->fingerprint = fingerprint(p);
    pthread_mutex_init(&p->lock, NULL);
    *plan = p;
    return loomSuccess;
}

LOOM_API loomResult_t loomShardPlanDestroy(loomShardPlan_t plan)
{
    if (plan == NULL)
        return loomSuccess;
    pthread_mutex_destroy(&plan->lock);
    plan_free(plan);
    return loomSuccess;
}

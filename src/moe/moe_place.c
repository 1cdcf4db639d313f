/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_place.c - loomMoePlacementCompute: experts onto ranks so that experts
 * selected together share a rank. Balanced by construction (every rank gets
 * its fixed share of experts), integer-only and deterministic, with every tie
 * going to the lower index, so equal counts give equal bytes on every rank
 * and compiler. Computes from counts only (moe_coselect.c gathers them);
 * never communicates. The algorithm and its guarantees: docs/moe.md.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "check.h"
#include "loom_moe.h"
#include "moe.h"

/* Counts are summed in uint64 and gains taken as int64: with the
 * off-diagonal total below 2^60, no sum or difference below can overflow. */
#define COUNT_LIMIT ((uint64_t)1 << 60)
/* Local search by swaps can, on contrived weights, improve in tiny steps for a
 * long time; real counts settle in a few passes. The cap bounds the call. */
#define DEFAULT_PASSES 100

typedef struct {
    const uint64_t *w;    /* coselect [ne*ne]; the diagonal reads as 0 */
    const uint64_t *load; /* [ne], or NULL when load is ignored */
    size_t ne;
} graph_t;

/* One partition problem: vertices verts[0..nv) into nparts parts of cap[p]
 * vertices each (sum of caps == nv), part p's load held to bound[p] where
 * possible (bound NULL: no load rule). */
typedef struct {
    const graph_t *g;
    const int *verts;
    int nv;
    const int *cap;
    const uint64_t *bound;
    int nparts;
    int max_passes; /* passes at most; they stop early when one makes no swap */
} level_t;

typedef struct {
    int *part;       /* [nv] part of each vertex, -1 while unassigned */
    uint64_t *conn;  /* [nv*nparts] weight from vertex i to part p (refinement) */
    uint64_t *key;   /* [nv] scratch for the greedy choice */
    uint64_t *pload; /* [nparts] load per part */
} state_t;

static uint64_t wt(const level_t *lv, int i, int j)
{
    if (i == j)
        return 0;
    return lv->g->w[(size_t)lv->verts[i] * lv->g->ne + (size_t)lv->verts[j]];
}

static uint64_t vload(const level_t *lv, int i)
{
    return lv->g->load ? lv->g->load[lv->verts[i]] : 0;
}

static uint64_t excess(const level_t *lv, int p, uint64_t load)
{
    return lv->bound && load > lv->bound[p] ? load - lv->bound[p] : 0;
}

// ---- greedy seed -------------------------------------------------------------

/* The unassigned vertex to add to part p: among those whose load still fits
 * the part's bound, the largest key (lowest index on ties); if none fits, the
 * lightest. */
static int greedy_pick(const level_t *lv, const state_t *st, int p)
{
    int best = -1, light = -1;
    for (int i = 0; i < lv->nv; i++) {
        if (st->part[i] >= 0)
            continue;
        if (light < 0 || vload(lv, i) < vload(lv, light))
            light = i;
        if (excess(lv, p, st->pload[p] + vload(lv, i)) > 0)
            continue;
        if (best < 0 || st->key[i] > st->key[best])
            best = i;
    }
    return best >= 0 ? best : light;
}

/* Greedy growth: part by part, seed with the unassigned vertex of largest
 * weight to the other unassigned ones, then add the vertex most connected to
 * the part until it holds cap[p]. O(nparts * nv^2). */
static void greedy_seed(const level_t *lv, state_t *st)
{
    for (int i = 0; i < lv->nv; i++)
        st->part[i] = -1;
    for (int p = 0; p < lv->nparts; p++) {
        if (lv->cap[p] == 0)
            continue;
        for (int i = 0; i < lv->nv; i++) {
            st->key[i] = 0;
            if (st->part[i] >= 0)
                continue;
            for (int j = 0; j < lv->nv; j++)
                if (st->part[j] < 0)
                    st->key[i] += wt(lv, i, j);
        }
        int v = greedy_pick(lv, st, p);
        memset(st->key, 0, (size_t)lv->nv * sizeof(*st->key));
        for (int n = 0;;) {
            st->part[v] = p;
            st->pload[p] += vload(lv, v);
            if (++n == lv->cap[p])
                break;
            for (int i = 0; i < lv->nv; i++)
                st->key[i] += wt(lv, i, v);
            v = greedy_pick(lv, st, p);
        }
    }
}

// ---- refinement --------------------------------------------------------------

static void conn_build(const level_t *lv, state_t *st)
{
    memset(st->conn, 0, (size_t)lv->nv * (size_t)lv->nparts * sizeof(*st->conn));
    for (int i = 0; i < lv->nv; i++)
        for (int j = 0; j < lv->nv; j++)
            st->conn[(size_t)i * (size_t)lv->nparts + (size_t)st->part[j]] += wt(lv, i, j);
}

/* Within-part weight gained by swapping a and b (in different parts). */
static int64_t swap_gain(const level_t *lv, const state_t *st, int a, int b)
{
    const uint64_t *ca = st->conn + (size_t)a * (size_t)lv->nparts;
    const uint64_t *cb = st->conn + (size_t)b * (size_t)lv->nparts;
    int pa = st->part[a], pb = st->part[b];
    return (int64_t)ca[pb] - (int64_t)ca[pa] + (int64_t)cb[pa] - (int64_t)cb[pb] -
           2 * (int64_t)wt(lv, a, b);
}

/* Load excess of a's and b's parts, before (old) and after (new) a swap. */
static void swap_excess(const level_t *lv, const state_t *st, int a, int b, uint64_t *old_p,
                        uint64_t *new_p)
{
    int pa = st->part[a], pb = st->part[b];
    uint64_t la = st->pload[pa], lb = st->pload[pb];
    *old_p = excess(lv, pa, la) + excess(lv, pb, lb);
    *new_p = excess(lv, pa, la - vload(lv, a) + vload(lv, b)) +
             excess(lv, pb, lb - vload(lv, b) + vload(lv, a));
}

static void swap_apply(const level_t *lv, state_t *st, int a, int b)
{
    int pa = st->part[a], pb = st->part[b];
    size_t np = (size_t)lv->nparts;
    for (int v = 0; v < lv->nv; v++) {
        uint64_t wa = wt(lv, v, a), wb = wt(lv, v, b);
        st->conn[(size_t)v * np + (size_t)pa] += wb - wa; /* modular: the result is exact */
        st->conn[(size_t)v * np + (size_t)pb] += wa - wb;
    }
    st->pload[pa] += vload(lv, b) - vload(lv, a);
    st->pload[pb] += vload(lv, a) - vload(lv, b);
    st->part[a] = pb;
    st->part[b] = pa;
}

/* Passes over a = 0..nv-1: swap a with the partner b in another part that
 * lowers the two parts' load excess most, then gains most within-part weight
 * (lowest b on ties), if the swap lowers the excess or keeps it and gains.
 * Each swap strictly improves (total excess, cut) in that order, so passes
 * end; a pass without a swap proves that no single swap improves. */
static void refine(const level_t *lv, state_t *st)
{
    conn_build(lv, st);
    for (int pass = 0; pass < lv->max_passes; pass++) {
        int swaps = 0;
        for (int a = 0; a < lv->nv; a++) {
            int best = -1;
            uint64_t best_drop = 0;
            int64_t best_gain = 0;
            for (int b = 0; b < lv->nv; b++) {
                if (st->part[b] == st->part[a])
                    continue;
                uint64_t old_ex, new_ex;
                swap_excess(lv, st, a, b, &old_ex, &new_ex);
                if (new_ex > old_ex)
                    continue;
                uint64_t drop = old_ex - new_ex;
                int64_t gain = swap_gain(lv, st, a, b);
                if (drop == 0 && gain <= 0)
                    continue;
                if (best < 0 || drop > best_drop || (drop == best_drop && gain > best_gain)) {
                    best = b;
                    best_drop = drop;
                    best_gain = gain;
                }
            }
            if (best >= 0) {
                swap_apply(lv, st, a, best);
                swaps++;
            }
        }
        if (swaps == 0)
            break;
    }
}

/* Partitions one level; part_out[i] gets verts[i]'s part. */
static loomResult_t place_level(const level_t *lv, int *part_out)
{
    state_t st;
    st.part = part_out;
    st.conn = calloc((size_t)lv->nv * (size_t)lv->nparts, sizeof(*st.conn));
    st.key = calloc((size_t)lv->nv, sizeof(*st.key));
    st.pload = calloc((size_t)lv->nparts, sizeof(*st.pload));
    loomResult_t res = loomSuccess;
    if (st.conn == NULL || st.key == NULL || st.pload == NULL) {
        LOOM_WARN("out of memory placing %d experts on %d parts", lv->nv, lv->nparts);
        res = loomSystemError;
    } else {
        greedy_seed(lv, &st);
        refine(lv, &st);
    }
    free(st.conn);
    free(st.key);
    free(st.pload);
    return res;
}

// ---- entry point -------------------------------------------------------------

/* The config's fields, with defaults for those an older (smaller) struct lacks. */
typedef struct {
    int nranks, ranks_per_host, slack_permille, max_passes;
} opts_t;

#define CFG_HAS(_cfg, _field)                                                                      \
    ((_cfg)->size >= offsetof(loomMoePlacementConfig_t, _field) + sizeof((_cfg)->_field))

static loomResult_t read_config(const loomMoePlacementConfig_t *cfg, opts_t *o)
{
    LOOM_CHECK(loom_moe_struct_check(
        "loomMoePlacementConfig_t", "LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER", cfg,
        cfg ? cfg->size : 0, cfg ? cfg->magic : 0, LOOM_MOE_PLACEMENT_CONFIG_MAGIC,
        offsetof(loomMoePlacementConfig_t, nranks) + sizeof(cfg->nranks), sizeof(*cfg), 1));
    const int undef = LOOM_CONFIG_UNDEF_INT;
    o->nranks = cfg->nranks;
    o->ranks_per_host = CFG_HAS(cfg, ranks_per_host) ? cfg->ranks_per_host : undef;
    o->slack_permille = CFG_HAS(cfg, load_slack_permille) ? cfg->load_slack_permille : undef;
    o->max_passes = CFG_HAS(cfg, max_passes) ? cfg->max_passes : undef;
    if (o->ranks_per_host == undef)
        o->ranks_per_host = 1;
    if (o->max_passes == undef)
        o->max_passes = DEFAULT_PASSES;
    else if (o->max_passes < 0) {
        LOOM_WARN("placement max_passes %d is negative", o->max_passes);
        return loomInvalidArgument;
    }
    if (o->nranks == undef) {
        LOOM_WARN("loomMoePlacementConfig_t: nranks is not set (it has no default)");
        return loomInvalidArgument;
    }
    if (o->nranks < 1 || o->nranks > LOOM_BOOTSTRAP_MAX_RANKS || o->ranks_per_host < 1 ||
        o->nranks % o->ranks_per_host != 0) {
        LOOM_WARN("placement on %d ranks with %d ranks per host: need nranks in 1..%d (what a "
                  "communicator can hold) and ranks_per_host dividing it",
                  o->nranks, o->ranks_per_host, LOOM_BOOTSTRAP_MAX_RANKS);
        return loomInvalidArgument;
    }
    if (o->slack_permille != undef && o->slack_permille < 0) {
        LOOM_WARN("placement load_slack_permille %d is negative", o->slack_permille);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* Symmetric, and the off-diagonal total below COUNT_LIMIT; the load total too. */
static loomResult_t check_counts(const uint64_t *w, const uint64_t *load, size_t ne,
                                 uint64_t *load_total_p)
{
    uint64_t total = 0;
    for (size_t a = 0; a < ne; a++) {
        for (size_t b = a + 1; b < ne; b++) {
            if (w[a * ne + b] != w[b * ne + a]) {
                LOOM_WARN("coselect is not symmetric: [%zu][%zu] = %llu, [%zu][%zu] = %llu", a, b,
                          (unsigned long long)w[a * ne + b], b, a,
                          (unsigned long long)w[b * ne + a]);
                return loomInvalidArgument;
            }
            total += w[a * ne + b] < COUNT_LIMIT ? w[a * ne + b] : COUNT_LIMIT;
            if (total >= COUNT_LIMIT / 2) {
                LOOM_WARN("coselect's entries over %zu experts sum to 2^60 or more: scale them "
                          "down",
                          ne);
                return loomInvalidArgument;
            }
        }
    }
    uint64_t ltotal = 0;
    for (size_t a = 0; load && a < ne; a++) {
        ltotal += load[a] < COUNT_LIMIT ? load[a] : COUNT_LIMIT;
        if (ltotal >= COUNT_LIMIT) {
            LOOM_WARN("load over %zu experts sums to 2^60 or more: scale it down", ne);
            return loomInvalidArgument;
        }
    }
    *load_total_p = ltotal;
    return loomSuccess;
}

/* floor(total * ncap * (1000 + slack) / (1000 * ne)): ncap experts' fair share
 * of the load, widened by the slack. */
static uint64_t load_bound(uint64_t total, int ncap, int slack, size_t ne)
{
    __extension__ typedef unsigned __int128 u128;
    u128 v = (u128)total * (u128)ncap * (u128)(1000 + (int64_t)slack) / ((u128)1000 * ne);
    return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

typedef struct {
    int *verts, *part, *cap, *host;
    uint64_t *bound;
} scratch_t;

/* Level one: hosts of R ranks each (when 1 < R < G) take their experts; level two:
 * each host's ranks split its experts. rank_cap[r] is rank r's share. */
static loomResult_t place_all(const graph_t *g, const opts_t *o, uint64_t ltotal,
                              const int *rank_cap, scratch_t *s, int32_t *expert_rank)
{
    int ne = (int)g->ne, R = o->ranks_per_host, G = o->nranks;
    int hosts = (R > 1 && R < G) ? G / R : 1;
    int per_host = G / hosts;
    int use_load = o->slack_permille != LOOM_CONFIG_UNDEF_INT;
    level_t lv = {.g = g, .max_passes = o->max_passes};
    for (int e = 0; e < ne; e++) {
        s->verts[e] = e;
        s->host[e] = 0;
    }
    if (hosts > 1) {
        for (int h = 0; h < hosts; h++) {
            s->cap[h] = 0;
            for (int r = h * per_host; r < (h + 1) * per_host; r++)
                s->cap[h] += rank_cap[r];
            s->bound[h] = load_bound(ltotal, s->cap[h], o->slack_permille, g->ne);
        }
        lv.verts = s->verts, lv.nv = ne, lv.cap = s->cap, lv.nparts = hosts;
        lv.bound = use_load ? s->bound : NULL;
        LOOM_CHECK(place_level(&lv, s->host));
    }
    for (int h = 0; h < hosts; h++) {
        int nv = 0;
        for (int e = 0; e < ne; e++)
            if (s->host[e] == h)
                s->verts[nv++] = e;
        if (nv == 0)
            continue;
        for (int i = 0; i < per_host; i++) {
            s->cap[i] = rank_cap[h * per_host + i];
            s->bound[i] = load_bound(ltotal, s->cap[i], o->slack_permille, g->ne);
        }
        lv.verts = s->verts, lv.nv = nv, lv.cap = s->cap, lv.nparts = per_host;
        lv.bound = use_load ? s->bound : NULL;
        LOOM_CHECK(place_level(&lv, s->part));
        for (int i = 0; i < nv; i++)
            expert_rank[s->verts[i]] = (int32_t)(h * per_host + s->part[i]);
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomMoePlacementCompute(const uint64_t *coselect, const uint64_t *load,
                                              int num_experts,
                                              const loomMoePlacementConfig_t *config,
                                              int32_t *expert_rank, uint64_t *cut_weight)
{
    opts_t o;
    LOOM_CHECK(read_config(config, &o));
    if (num_experts < 1 || coselect == NULL || expert_rank == NULL) {
        LOOM_WARN("placement of %d experts needs num_experts >= 1, coselect (%s) and "
                  "expert_rank (%s)",
                  num_experts, coselect ? "set" : "NULL", expert_rank ? "set" : "NULL");
        return loomInvalidArgument;
    }
    if (o.slack_permille != LOOM_CONFIG_UNDEF_INT && load == NULL) {
        LOOM_WARN("placement load_slack_permille %d needs load, which is NULL", o.slack_permille);
        return loomInvalidArgument;
    }
    size_t ne = (size_t)num_experts;
    uint64_t ltotal = 0;
    int use_load = o.slack_permille != LOOM_CONFIG_UNDEF_INT;
    LOOM_CHECK(check_counts(coselect, use_load ? load : NULL, ne, &ltotal));

    size_t nmax = ne > (size_t)o.nranks ? ne : (size_t)o.nranks;
    scratch_t s = {.verts = malloc(ne * sizeof(int)),
                   .part = malloc(ne * sizeof(int)),
                   .cap = malloc(nmax * sizeof(int)),
                   .host = malloc(ne * sizeof(int)),
                   .bound = malloc(nmax * sizeof(uint64_t))};
    int *rank_cap = malloc((size_t)o.nranks * sizeof(int));
    int32_t *out = malloc(ne * sizeof(int32_t));
    loomResult_t res = loomSuccess;
    if (!s.verts || !s.part || !s.cap || !s.host || !s.bound || !rank_cap || !out) {
        LOOM_WARN("out of memory placing %d experts on %d ranks", num_experts, o.nranks);
        res = loomSystemError;
        goto out;
    }
    for (int r = 0; r < o.nranks; r++)
        rank_cap[r] = num_experts / o.nranks + (r < num_experts % o.nranks ? 1 : 0);
    graph_t g = {.w = coselect, .load = use_load ? load : NULL, .ne = ne};
    LOOM_CHECK_GOTO(place_all(&g, &o, ltotal, rank_cap, &s, out), res, out);
    uint64_t cut = 0;
    for (size_t a = 0; a < ne; a++)
        for (size_t b = a + 1; b < ne; b++)
            if (out[a] != out[b])
                cut += coselect[a * ne + b];
    memcpy(expert_rank, out, ne * sizeof(int32_t));
    if (cut_weight != NULL)
        *cut_weight = cut;
out:
    free(s.verts);
    free(s.part);
    free(s.cap);
    free(s.host);
    free(s.bound);
    free(rank_cap);
    free(out);
    return res;
}

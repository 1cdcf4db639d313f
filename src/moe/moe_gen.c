/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_gen.c - synthetic routing (moe_gen.h) and the row counts of dedup dispatch. The planted
 * model follows the correlation-aware MoE design (docs/moe-trace.md, "Generators"):
 *   1. per layer, a hidden permutation cuts the experts into G groups of near-equal size, a
 *      second one orders them by popularity (r + 1)^-alpha (times a factor for hot experts),
 *      and a third maps the previous layer's groups onto this layer's (inter-layer affinity);
 *   2. a token keeps its previous group, mapped, with probability rho_layer, or else draws one
 *      with probability proportional to the group's popularity (text: a hash of its bytes);
 *   3. each of its k slots draws, without replacement and by popularity, from the group with
 *      probability rho (while the group has experts left), else from all experts;
 *   4. each slot is masked to -1 with probability `mask`; weights are a softmax of uniform
 *      logits in [0, 2) over the kept slots, largest first, drawn from a stream of their own so
 *      that asking for them does not change the experts.
 * Draws without replacement sample the popularity CDF and reject experts already taken; after
 * 16 rejections a linear scan over the rest samples the same conditional law exactly.
 */
#include "moe_gen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"
#include "moe_trace.h"
#include "rng.h"

/* One layer's hidden structure. */
typedef struct model {
    uint32_t e, g;
    uint32_t *expert_group; /* (E) */
    uint32_t *by_group;     /* (E) experts ordered by group */
    uint32_t *group_start;  /* (G + 1) offsets into by_group */
    uint32_t *sigma;        /* (G) previous layer's group -> this layer's */
    uint32_t *text_perm;    /* (G) text hash -> group */
    double *pop;            /* (E) popularity */
    double *cum_all;        /* (E) inclusive prefix sums of pop over experts 0..E-1 */
    double *cum_group;      /* (E) the same over by_group, restarting at each group */
    double *cum_mass;       /* (G) inclusive prefix sums of the groups' popularity */
} model_t;

static loomResult_t gen_check(const loom_moe_gen_t *g)
{
    if (g->num_experts < 1 || g->num_experts > LOOM_MOE_TRACE_MAX_EXPERTS || g->top_k < 1 ||
        g->top_k > g->num_experts || g->num_groups < 1 || g->num_groups > g->num_experts) {
        LOOM_WARN("routing generator: E %u, k %u, G %u: need 1 <= k <= E <= %d and 1 <= G <= E",
                  g->num_experts, g->top_k, g->num_groups, LOOM_MOE_TRACE_MAX_EXPERTS);
        return loomInvalidArgument;
    }
    /* Written so that NaN fails too. */
    if (!(g->rho >= 0 && g->rho <= 1) || !(g->rho_layer >= 0 && g->rho_layer <= 1) ||
        !(g->mask >= 0 && g->mask <= 1) || !(g->zipf_alpha >= 0 && g->zipf_alpha <= 8)) {
        LOOM_WARN("routing generator: rho %g, rho_layer %g, mask %g must lie in [0, 1] and "
                  "zipf_alpha %g in [0, 8]",
                  g->rho, g->rho_layer, g->mask, g->zipf_alpha);
        return loomInvalidArgument;
    }
    const double n_hot = g->hot_experts;
    if (g->hot_experts > g->num_experts ||
        (n_hot > 0 &&
         !(g->hot_ratio == 1 || (g->hot_ratio > 1 && g->hot_ratio * n_hot < g->num_experts)))) {
        LOOM_WARN("routing generator: %u hot experts of %u at ratio %g: need ratio 1, or ratio > 1 "
                  "with ratio x hot experts < E",
                  g->hot_experts, g->num_experts, g->hot_ratio);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static void shuffle(uint32_t *a, uint32_t n, loom_rng_t *r)
{
    for (uint32_t i = 0; i < n; i++)
        a[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = loom_rng_below(r, i), t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static void model_free(model_t *m)
{
    free(m->expert_group);
    free(m->by_group);
    free(m->group_start);
    free(m->sigma);
    free(m->text_perm);
    free(m->pop);
    free(m->cum_all);
    free(m->cum_group);
    free(m->cum_mass);
}

static loomResult_t model_alloc(model_t *m, uint32_t e, uint32_t g)
{
    memset(m, 0, sizeof(*m));
    m->e = e;
    m->g = g;
    m->expert_group = malloc(e * sizeof(uint32_t));
    m->by_group = malloc(e * sizeof(uint32_t));
    m->group_start = malloc((g + 1) * sizeof(uint32_t));
    m->sigma = malloc(g * sizeof(uint32_t));
    m->text_perm = malloc(g * sizeof(uint32_t));
    m->pop = malloc(e * sizeof(double));
    m->cum_all = malloc(e * sizeof(double));
    m->cum_group = malloc(e * sizeof(double));
    m->cum_mass = malloc(g * sizeof(double));
    if (!m->expert_group || !m->by_group || !m->group_start || !m->sigma || !m->text_perm ||
        !m->pop || !m->cum_all || !m->cum_group || !m->cum_mass) {
        LOOM_WARN("routing generator: out of memory for %u experts", e);
        model_free(m);
        return loomSystemError;
    }
    return loomSuccess;
}

/* The structure of `layer`, a function of (seed, layer) alone. */
static void model_build(model_t *m, const loom_moe_gen_t *g, uint32_t layer)
{
    loom_rng_t r = loom_rng_seed(g->seed ^ (0xa0761d6478bd642fULL * ((uint64_t)layer + 1)));
    const uint32_t e = m->e, ng = m->g;
    shuffle(m->by_group, e, &r); /* position i of the permutation is in group floor(i G / E) */
    for (uint32_t i = 0; i < e; i++)
        m->expert_group[m->by_group[i]] = (uint32_t)((uint64_t)i * ng / e);
    for (uint32_t i = 0; i <= ng; i++)
        m->group_start[i] = (uint32_t)(((uint64_t)i * e + ng - 1) / ng);
    /* Popularity by a hidden order: pop first holds a shuffled rank per expert. */
    for (uint32_t i = 0; i < e; i++)
        m->pop[i] = (double)i;
    for (uint32_t i = e; i > 1; i--) {
        uint32_t j = loom_rng_below(&r, i);
        double t = m->pop[i - 1];
        m->pop[i - 1] = m->pop[j];
        m->pop[j] = t;
    }
    for (uint32_t i = 0; i < e; i++)
        m->pop[i] = g->zipf_alpha == 0 ? 1.0 : pow(m->pop[i] + 1.0, -g->zipf_alpha);
    /* Hot experts: a weight h on n of E experts gives them h n / (h n + E - n) of single draws,
     * which is ratio x n / E for h = ratio (E - n) / (E - ratio n). */
    if (g->hot_experts > 0) {
        const double n = g->hot_experts, h = g->hot_ratio * (e - n) / (e - g->hot_ratio * n);
        for (uint32_t i = 0; i < g->hot_experts; i++)
            m->pop[i] *= h;
    }
    shuffle(m->sigma, ng, &r);
    shuffle(m->text_perm, ng, &r);
    double acc = 0;
    for (uint32_t i = 0; i < e; i++)
        m->cum_all[i] = acc += m->pop[i];
    acc = 0;
    for (uint32_t grp = 0; grp < ng; grp++) {
        double in = 0;
        for (uint32_t i = m->group_start[grp]; i < m->group_start[grp + 1]; i++)
            m->cum_group[i] = in += m->pop[m->by_group[i]];
        m->cum_mass[grp] = acc += in;
    }
}

/* First index i < n with cum[i] > u, or n - 1. */
static uint32_t upper_bound(const double *cum, uint32_t n, double u)
{
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cum[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Draws an expert not marked with `stamp` from list (NULL: 0..n-1) by popularity; -1 if every
 * one is taken. */
static int32_t draw(const uint32_t *list, const double *cum, uint32_t n, const double *pop,
                    const uint64_t *mark, uint64_t stamp, loom_rng_t *r)
{
    for (int tries = 0; tries < 16; tries++) {
        uint32_t i = upper_bound(cum, n, loom_rng_uniform(r) * cum[n - 1]);
        uint32_t ex = list ? list[i] : i;
        if (mark[ex] != stamp && pop[ex] > 0)
            return (int32_t)ex;
    }
    double rest = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t ex = list ? list[i] : i;
        rest += mark[ex] != stamp ? pop[ex] : 0;
    }
    if (rest <= 0)
        return -1;
    double u = loom_rng_uniform(r) * rest;
    int32_t last = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t ex = list ? list[i] : i;
        if (mark[ex] == stamp)
            continue;
        last = (int32_t)ex;
        u -= pop[ex];
        if (u < 0)
            break;
    }
    return last;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Softmax of uniform logits in [0, 2) over the kept slots of row, largest first. */
static void row_weights(const int32_t *row, uint32_t k, double *scratch, float *w, loom_rng_t *r)
{
    for (uint32_t j = 0; j < k; j++)
        scratch[j] = exp(2.0 * loom_rng_uniform(r));
    qsort(scratch, k, sizeof(double), cmp_desc);
    double sum = 0;
    for (uint32_t j = 0; j < k; j++)
        sum += row[j] >= 0 ? scratch[j] : 0;
    for (uint32_t j = 0; j < k; j++)
        w[j] = row[j] >= 0 ? (float)(scratch[j] / sum) : 0.0f;
}

/* Key of a token's text context; the same on every machine. */
static uint32_t text_group(const model_t *m, uint8_t cls, uint8_t prev_cls, uint8_t prev)
{
    loom_rng_t h = loom_rng_seed((uint64_t)cls | (uint64_t)prev_cls << 8 | (uint64_t)prev << 16);
    return m->text_perm[loom_rng_next(&h) % m->g];
}

static loomResult_t generate(const loom_moe_gen_t *g, const uint8_t *text, size_t num_tokens,
                             uint32_t num_layers, int32_t *topk, float *weight, uint32_t *group,
                             uint8_t *text_class)
{
    loomResult_t res = gen_check(g);
    if (res != loomSuccess)
        return res;
    const uint32_t e = g->num_experts, k = g->top_k, ng = g->num_groups;
    if (num_layers > 0 && num_tokens > SIZE_MAX / sizeof(int32_t) / k / num_layers) {
        LOOM_WARN("routing generator: %zu tokens x %u layers x top-k %u overflow", num_tokens,
                  num_layers, k);
        return loomInvalidArgument;
    }
    model_t m;
    res = model_alloc(&m, e, ng);
    if (res != loomSuccess)
        return res;
    uint64_t *mark = calloc(e, sizeof(uint64_t));
    uint32_t *cur = malloc((num_tokens ? num_tokens : 1) * sizeof(uint32_t));
    double *scratch = malloc(k * sizeof(double));
    if (!mark || !cur || !scratch) {
        LOOM_WARN("routing generator: out of memory for %zu tokens", num_tokens);
        res = loomSystemError;
        goto out;
    }
    for (size_t t = 0; text && text_class && t < num_tokens; t++)
        text_class[t] = loom_moe_text_class(t ? text[t - 1] : '\n', text[t]);
    loom_rng_t r = loom_rng_seed(g->seed ^ 0xe7037ed1a0b428dbULL);
    loom_rng_t rw = loom_rng_seed(g->seed ^ 0x8ebc6af09c88c6e3ULL);
    uint64_t stamp = 0;
    for (uint32_t l = 0; l < num_layers; l++) {
        model_build(&m, g, l);
        uint8_t prev = '\n', prev_cls = loom_moe_text_class('\n', '\n');
        for (size_t t = 0; t < num_tokens; t++) {
            if (text) {
                uint8_t cls = loom_moe_text_class(prev, text[t]);
                cur[t] = text_group(&m, cls, prev_cls, prev);
                prev = text[t];
                prev_cls = cls;
            } else if (l > 0 && loom_rng_uniform(&r) < g->rho_layer) {
                cur[t] = m.sigma[cur[t]];
            } else {
                cur[t] = upper_bound(m.cum_mass, ng, loom_rng_uniform(&r) * m.cum_mass[ng - 1]);
            }
            const uint32_t grp = cur[t], lo = m.group_start[grp];
            const uint32_t size = m.group_start[grp + 1] - lo;
            int32_t *row = topk + ((size_t)l * num_tokens + t) * k;
            uint32_t in_group = 0;
            stamp++;
            for (uint32_t j = 0; j < k; j++) {
                int32_t ex = -1;
                if (loom_rng_uniform(&r) < g->rho && in_group < size)
                    ex = draw(m.by_group + lo, m.cum_group + lo, size, m.pop, mark, stamp, &r);
                if (ex < 0)
                    ex = draw(NULL, m.cum_all, e, m.pop, mark, stamp, &r);
                mark[ex] = stamp;
                in_group += m.expert_group[ex] == grp;
                row[j] = ex;
            }
            for (uint32_t j = 0; j < k; j++)
                if (loom_rng_uniform(&r) < g->mask)
                    row[j] = -1;
            if (weight)
                row_weights(row, k, scratch, weight + ((size_t)l * num_tokens + t) * k, &rw);
            if (group)
                group[(size_t)l * num_tokens + t] = grp;
        }
    }
out:
    free(mark);
    free(cur);
    free(scratch);
    model_free(&m);
    return res;
}

loomResult_t loom_moe_gen_planted(const loom_moe_gen_t *g, size_t num_tokens, uint32_t num_layers,
                                  int32_t *topk, float *weight, uint32_t *group)
{
    return generate(g, NULL, num_tokens, num_layers, topk, weight, group, NULL);
}

loomResult_t loom_moe_gen_text(const loom_moe_gen_t *g, const uint8_t *text, size_t num_tokens,
                               uint32_t num_layers, int32_t *topk, float *weight, uint32_t *group,
                               uint8_t *text_class)
{
    if (text == NULL && num_tokens > 0) {
        LOOM_WARN("routing generator: %zu tokens of text but no text", num_tokens);
        return loomInvalidArgument;
    }
    return generate(g, text, num_tokens, num_layers, topk, weight, group, text_class);
}

loomResult_t loom_moe_gen_uniform(uint32_t num_experts, uint32_t top_k, size_t num_tokens,
                                  uint64_t seed, int32_t *topk, float *weight)
{
    loom_moe_gen_t g = {.num_experts = num_experts, .top_k = top_k, .num_groups = 1, .seed = seed};
    return generate(&g, NULL, num_tokens, 1, topk, weight, NULL, NULL);
}

loomResult_t loom_moe_gen_groups(const loom_moe_gen_t *g, uint32_t layer, uint32_t *expert_group)
{
    loomResult_t res = gen_check(g);
    if (res != loomSuccess)
        return res;
    model_t m;
    res = model_alloc(&m, g->num_experts, g->num_groups);
    if (res != loomSuccess)
        return res;
    model_build(&m, g, layer);
    memcpy(expert_group, m.expert_group, g->num_experts * sizeof(uint32_t));
    model_free(&m);
    return loomSuccess;
}

uint8_t loom_moe_text_class(uint8_t prev, uint8_t cur)
{
    int base;
    if (cur >= 'a' && cur <= 'z')
        base = 0;
    else if (cur >= 'A' && cur <= 'Z')
        base = 1;
    else if (cur >= '0' && cur <= '9')
        base = 2;
    else if (cur == ' ' || cur == '\t' || cur == '\r')
        base = 3;
    else if (cur == '\n')
        base = 4;
    else if (cur > ' ' && cur < 0x7f)
        base = 5;
    else
        base = 6;
    int inside = (prev >= 'a' && prev <= 'z') || (prev >= 'A' && prev <= 'Z') ||
                 (prev >= '0' && prev <= '9');
    return (uint8_t)(2 * base + inside);
}

// ---- Metrics -----------------------------------------------------------------------------------

loomResult_t loom_moe_rows_count(const int32_t *topk, size_t num_tokens, uint32_t top_k,
                                 uint32_t num_experts, const int32_t *expert_rank, uint32_t nranks,
                                 const int32_t *home_rank, uint64_t *rows_to_rank,
                                 loom_moe_rows_t *rows)
{
    if (nranks < 1 || num_experts < 1 || top_k < 1) {
        LOOM_WARN("row count: %u ranks, %u experts, top-k %u: each must be at least 1", nranks,
                  num_experts, top_k);
        return loomInvalidArgument;
    }
    for (uint32_t e = 0; e < num_experts; e++) {
        if (expert_rank[e] < 0 || (uint32_t)expert_rank[e] >= nranks) {
            LOOM_WARN("row count: expert %u placed on rank %d of %u", e, (int)expert_rank[e],
                      nranks);
            return loomInvalidArgument;
        }
    }
    /* Every input is checked before anything is counted, so outputs change only on success. */
    for (size_t t = 0; t < num_tokens; t++) {
        if (home_rank && (home_rank[t] < 0 || (uint32_t)home_rank[t] >= nranks)) {
            LOOM_WARN("row count: token %zu at home on rank %d of %u", t, (int)home_rank[t],
                      nranks);
            return loomInvalidArgument;
        }
        for (uint32_t j = 0; j < top_k; j++) {
            int32_t ex = topk[t * top_k + j];
            if (ex < -1 || (ex >= 0 && (uint32_t)ex >= num_experts)) {
                LOOM_WARN("row count: token %zu slot %u: expert id %d outside [0, %u) and not -1",
                          t, j, (int)ex, num_experts);
                return loomInvalidArgument;
            }
        }
    }
    uint64_t *seen = calloc(nranks, sizeof(uint64_t));
    uint64_t *to = calloc(nranks, sizeof(uint64_t));
    if (!seen || !to) {
        LOOM_WARN("row count: out of memory for %u ranks", nranks);
        free(seen);
        free(to);
        return loomSystemError;
    }
    loom_moe_rows_t c = {0};
    for (size_t t = 0; t < num_tokens; t++) {
        const int64_t home = home_rank ? home_rank[t] : -1;
        for (uint32_t j = 0; j < top_k; j++) {
            int32_t ex = topk[t * top_k + j];
            if (ex < 0)
                continue;
            const uint32_t dst = (uint32_t)expert_rank[ex];
            c.pairs++;
            c.pairs_local += dst == home;
            if (seen[dst] == t + 1)
                continue;
            seen[dst] = t + 1; /* a (token, rank) pair counts once */
            c.rows++;
            if (dst != home) {
                c.rows_remote++;
                to[dst]++;
            }
        }
    }
    c.rows_naive_remote = c.pairs - c.pairs_local;
    for (uint32_t r = 0; r < nranks; r++) {
        c.rows_max_to_rank = to[r] > c.rows_max_to_rank ? to[r] : c.rows_max_to_rank;
        if (rows_to_rank)
            rows_to_rank[r] = to[r];
    }
    *rows = c;
    free(seen);
    free(to);
    return loomSuccess;
}

loomResult_t loom_moe_expected_distinct_ranks(const int32_t *expert_rank, uint32_t num_experts,
                                              uint32_t nranks, uint32_t top_k, double *expect_p)
{
    if (nranks < 1 || num_experts < 1 || top_k < 1 || top_k > num_experts) {
        LOOM_WARN("expected distinct ranks: %u ranks, %u experts, top-k %u: need ranks >= 1 and "
                  "1 <= k <= E",
                  nranks, num_experts, top_k);
        return loomInvalidArgument;
    }
    uint32_t *n = calloc(nranks, sizeof(uint32_t));
    if (n == NULL) {
        LOOM_WARN("expected distinct ranks: out of memory for %u ranks", nranks);
        return loomSystemError;
    }
    for (uint32_t e = 0; e < num_experts; e++) {
        if (expert_rank[e] < 0 || (uint32_t)expert_rank[e] >= nranks) {
            LOOM_WARN("expected distinct ranks: expert %u placed on rank %d of %u", e,
                      (int)expert_rank[e], nranks);
            free(n);
            return loomInvalidArgument;
        }
        n[expert_rank[e]]++;
    }
    /* P(rank r missed) = C(E - n_r, k) / C(E, k) = prod_{i<k} (E - n_r - i) / (E - i): the ratio
     * as a product never forms the binomials, which overflow doubles from E of about 1030. */
    double expect = 0;
    for (uint32_t r = 0; r < nranks; r++) {
        double miss = 1;
        for (uint32_t i = 0; i < top_k && miss > 0; i++) {
            double left = (double)num_experts - n[r] - i;
            miss = left <= 0 ? 0 : miss * left / ((double)num_experts - i);
        }
        expect += 1 - miss;
    }
    free(n);
    *expect_p = expect;
    return loomSuccess;
}

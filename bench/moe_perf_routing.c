/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_perf_routing.c - moe_perf's routing: generated (src/moe/moe_gen.h) or read from an
 * LMTR trace (moe_trace.h), with the layer before for re-ordering; the placements; the row counts
 * every mode is judged by; the re-ordering's prediction and permutation; the check's token
 * values and expert outputs.
 */
#include <math.h>
#include <string.h>

#include "moe_gen.h"
#include "moe_perf.h"
#include "moe_trace.h"
#include "rng.h"

// ---- Routing -------------------------------------------------------------------

static void routing_alloc(routing_t *r, int nbatches, size_t total_tokens)
{
    r->nbatches = nbatches;
    r->off = xcalloc((size_t)nbatches, sizeof(size_t));
    r->ntok = xcalloc((size_t)nbatches, sizeof(size_t));
    r->topk = xcalloc(total_tokens * (size_t)r->top_k, sizeof(int32_t));
}

static void layers_alloc(layers_t *ly, int nbatches, size_t total_tokens, int k)
{
    ly->nbatches = nbatches;
    ly->off = xcalloc((size_t)nbatches, sizeof(size_t));
    ly->ntok = xcalloc((size_t)nbatches, sizeof(size_t));
    ly->prev = xcalloc(2 * total_tokens * (size_t)k, sizeof(int32_t));
    ly->cur = ly->prev + total_tokens * (size_t)k;
}

void layers_free(layers_t *ly)
{
    free(ly->prev);
    free(ly->off);
    free(ly->ntok);
    memset(ly, 0, sizeof(*ly));
}

/* Pairs of a trace's batches for re-ordering: the j-th batch of layer lmin + 1 at a step (lmin
 * the least layer in the file) and the j-th of layer lmin at that step (micro-batches keep
 * their order), when they hold as many tokens; their indices go to cur_i[] and prev_i[] in file
 * order. Returns how many. */
static size_t trace_pairs(const loom_moe_trace_t *t, size_t *cur_i, size_t *prev_i)
{
    uint32_t lmin = UINT32_MAX;
    for (size_t b = 0; b < t->num_batches; b++)
        lmin = t->batches[b].layer < lmin ? t->batches[b].layer : lmin;
    size_t n = 0;
    for (size_t b = 0; b < t->num_batches; b++) {
        const loom_moe_trace_batch_t *c = &t->batches[b];
        if (c->layer != lmin + 1)
            continue;
        size_t j = 0; /* c is the j-th batch of its step and layer */
        for (size_t a = 0; a < b; a++)
            j += t->batches[a].layer == c->layer && t->batches[a].step == c->step;
        for (size_t a = 0; a < t->num_batches; a++) {
            const loom_moe_trace_batch_t *p = &t->batches[a];
            if (p->layer != lmin || p->step != c->step || j-- > 0)
                continue;
            if (p->num_tokens == c->num_tokens) {
                cur_i[n] = b;
                prev_i[n++] = a;
            }
            break;
        }
    }
    return n;
}

/* Each batch of the trace split evenly over the ranks, in file order. With re-ordering among
 * the modes, only the batches of trace_pairs() are measured (by every mode), and ly receives
 * them whole with the batches of the layer before; a trace without two such pairs drops the
 * mode, or refuses it when --modes named it. */
void routing_from_trace(opts_t *o, routing_t *r, layers_t *ly)
{
    loom_moe_trace_t *t = NULL;
    if (loom_moe_trace_read(o->trace, &t) != loomSuccess)
        bench_die("check the path; docs/moe-trace.md gives the format", "cannot read trace %s: %s",
                  o->trace, loomGetLastError(NULL));
    if (t->num_batches < 2)
        bench_die(NULL, "trace %s has %zu batches; placement needs at least 2", o->trace,
                  t->num_batches);
    size_t nb = t->num_batches, *cur_i = xcalloc(nb, sizeof(size_t)),
           *prev_i = xcalloc(nb, sizeof(size_t));
    size_t npairs = (o->modes & (1u << MODE_REORDER)) ? trace_pairs(t, cur_i, prev_i) : 0;
    if ((o->modes & (1u << MODE_REORDER)) && npairs < 2) {
        if (o->modes_explicit)
            bench_die("record the routing of two consecutive layers (docs/moe-trace.md), or "
                      "leave dedup+place+reorder out of --modes",
                      "trace %s: dedup+place+reorder predicts the measured layer from the layer "
                      "before, but the trace holds %zu batch(es) of two consecutive layers at "
                      "one step with equal token counts, not at least 2",
                      o->trace, npairs);
        if (g_rank == 0)
            printf("# dedup+place+reorder left out: trace %s has no two consecutive layers at "
                   "one step to predict the measured layer from\n",
                   o->trace);
        o->modes &= ~(1u << MODE_REORDER);
    }
    if (npairs >= 2) {
        nb = npairs;
    } else {
        for (size_t b = 0; b < nb; b++)
            cur_i[b] = b;
    }
    r->num_experts = (int)t->header.num_experts;
    r->top_k = (int)t->header.top_k;
    size_t k = (size_t)r->top_k, total = 0, whole = 0;
    for (size_t b = 0; b < nb; b++) {
        total += t->batches[cur_i[b]].num_tokens / (size_t)g_nranks + 1;
        whole += t->batches[cur_i[b]].num_tokens;
    }
    routing_alloc(r, (int)nb, total);
    if (npairs >= 2)
        layers_alloc(ly, (int)nb, whole, r->top_k);
    size_t pos = 0, at = 0;
    for (size_t b = 0; b < nb; b++) {
        const loom_moe_trace_batch_t *c = &t->batches[cur_i[b]];
        size_t n = c->num_tokens, lo = n * (size_t)g_rank / (size_t)g_nranks;
        size_t hi = n * (size_t)(g_rank + 1) / (size_t)g_nranks;
        r->off[b] = pos;
        r->ntok[b] = hi - lo;
        memcpy(r->topk + pos * k, c->topk + lo * k, (hi - lo) * k * sizeof(int32_t));
        pos += hi - lo;
        if (hi - lo > r->max_tok)
            r->max_tok = hi - lo;
        if (npairs >= 2) {
            ly->off[b] = at;
            ly->ntok[b] = n;
            memcpy(ly->cur + at * k, c->topk, n * k * sizeof(int32_t));
            memcpy(ly->prev + at * k, t->batches[prev_i[b]].topk, n * k * sizeof(int32_t));
            at += n;
        }
    }
    const char *base = strrchr(o->trace, '/');
    snprintf(r->label, sizeof(r->label), "%s", base ? base + 1 : o->trace);
    free(cur_i);
    free(prev_i);
    loom_moe_trace_free(t);
}

/* Two generated layers of batches x nranks x T tokens, (layer, token, k): the measured one is
 * the second, so that re-ordering can predict it from the first. The generator's knobs are
 * those of this run's G ranks whatever nranks is (hidden groups, skew's hot experts), so that a
 * projection to other rank counts (project_rows()) routes as the measured run does. */
int32_t *generate_topk(const opts_t *o, int top_k, int nranks)
{
    size_t all = o->tokens * (size_t)nranks * (size_t)o->batches;
    int32_t *topk = xcalloc(2 * all * (size_t)top_k, sizeof(int32_t));
    loom_moe_gen_t g = {.num_experts = (uint32_t)o->num_experts,
                        .top_k = (uint32_t)top_k,
                        .num_groups = (uint32_t)(o->groups ? o->groups : g_nranks),
                        .rho = o->gen == GEN_UNIFORM ? 0.0 : o->rho,
                        .zipf_alpha = o->zipf,
                        .rho_layer = o->rho_layer,
                        .mask = o->mask,
                        .seed = o->seed};
    if (g.num_groups > g.num_experts)
        g.num_groups = g.num_experts;
    if (o->gen == GEN_SKEW && g_nranks > 1) {
        g.hot_experts = (uint32_t)(o->num_experts / g_nranks);
        g.hot_ratio = o->hot_ratio;
    }
    loomResult_t res;
    if (o->gen == GEN_UNIFORM && o->mask == 0.0) {
        /* Independent layers: the prediction carries nothing (the control). */
        res = loom_moe_gen_uniform(g.num_experts, g.top_k, 2 * all, o->seed, topk, NULL);
    } else if (o->gen == GEN_TEXT) {
        FILE *f = fopen(o->text, "rb");
        uint8_t *text = xcalloc(all, 1);
        size_t got = f ? fread(text, 1, all, f) : 0;
        if (f)
            fclose(f);
        if (got == 0)
            bench_die(NULL, "cannot read any byte of --text %s", o->text);
        for (size_t i = got; i < all; i++)
            text[i] = text[i % got];
        res = loom_moe_gen_text(&g, text, all, 2, topk, NULL, NULL, NULL);
        free(text);
    } else {
        res = loom_moe_gen_planted(&g, all, 2, topk, NULL, NULL);
    }
    if (res != loomSuccess)
        bench_die("see the generator knobs in moe_perf -h",
                  "the routing generator refused E=%d k=%d "
                  "groups=%u: %s",
                  o->num_experts, top_k, g.num_groups, loomGetLastError(NULL));
    return topk;
}

/* The second of two generated layers, the same on every rank; rank g of batch b takes tokens
 * (b * G + g) * T onwards, so that the hidden structure is shared by all. With re-ordering
 * among the modes, ly receives both layers whole. */
void routing_generate(const opts_t *o, int top_k, routing_t *r, layers_t *ly)
{
    r->num_experts = o->num_experts;
    r->top_k = top_k;
    size_t per = o->tokens, G = (size_t)g_nranks, k = (size_t)top_k;
    size_t all = per * G * (size_t)o->batches;
    int32_t *topk = generate_topk(o, top_k, g_nranks);
    const int32_t *cur = topk + all * k;
    routing_alloc(r, o->batches, per * (size_t)o->batches);
    for (int b = 0; b < o->batches; b++) {
        r->off[b] = (size_t)b * per;
        r->ntok[b] = per;
        memcpy(r->topk + r->off[b] * k, cur + ((size_t)b * G + (size_t)g_rank) * per * k,
               per * k * sizeof(int32_t));
    }
    r->max_tok = per;
    if (o->modes & (1u << MODE_REORDER)) {
        layers_alloc(ly, o->batches, all, top_k);
        for (int b = 0; b < o->batches; b++) {
            ly->off[b] = (size_t)b * per * G;
            ly->ntok[b] = per * G;
        }
        memcpy(ly->prev, topk, 2 * all * k * sizeof(int32_t));
    }
    free(topk);
    if (o->gen == GEN_UNIFORM || o->gen == GEN_TEXT)
        snprintf(r->label, sizeof(r->label), "%s", k_gen_names[o->gen]);
    else
        snprintf(r->label, sizeof(r->label), "%s%g", k_gen_names[o->gen], o->rho);
}

void routing_free(routing_t *r)
{
    free(r->topk);
    free(r->off);
    free(r->ntok);
}

// ---- Placements ------------------------------------------------------------------

/* Rank r holds the next floor(E/G) experts, plus one for r < E mod G (loom_moe.h's shares). */
void place_contiguous(int E, int G, int32_t *expert_rank)
{
    int e = 0;
    for (int r = 0; r < G; r++)
        for (int i = 0; i < E / G + (r < E % G); i++)
            expert_rank[e++] = r;
}

/* The contiguous shares, shuffled by a seed every rank shares. */
void place_random(int E, int G, uint64_t seed, int32_t *expert_rank)
{
    place_contiguous(E, G, expert_rank);
    loom_rng_t s = loom_rng_seed(seed ^ 0x5eedULL);
    for (int i = E - 1; i > 0; i--) {
        int j = (int)(loom_rng_next(&s) % (uint64_t)(i + 1));
        int32_t t = expert_rank[i];
        expert_rank[i] = expert_rank[j];
        expert_rank[j] = t;
    }
}

/* The placement of E experts on G ranks from co-selection counts cos[E * E] and loads
 * cos[E * E ..]. */
void place_counts(const uint64_t *cos, int E, int G, int32_t *expert_rank)
{
    loomMoePlacementConfig_t cfg = LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER;
    cfg.nranks = G;
    CHECK(loomMoePlacementCompute(cos, cos + (size_t)E * (size_t)E, E, &cfg, expert_rank, NULL));
}

/* Co-selection counts of every rank's first half of the batches, summed, then placed. */
void place_coselect(const routing_t *r, int32_t *expert_rank)
{
    size_t E = (size_t)r->num_experts;
    uint64_t *cos = xcalloc(E * E + E, sizeof(uint64_t));
    for (int b = 0; b < r->nbatches / 2; b++)
        CHECK(loomMoeCoselectAccumulate(r->topk + r->off[b] * (size_t)r->top_k, r->ntok[b],
                                        r->top_k, r->num_experts, cos, cos + E * E));
    CHECK(loomAllReduce(cos, cos, E * E + E, loomUint64, loomSum, g_comm, NULL));
    place_counts(cos, r->num_experts, g_nranks, expert_rank);
    free(cos);
}

// ---- Metrics of the routing ----------------------------------------------------------

/* Rows one rank at home `home` sends each of G ranks for T tokens (itself included): dedup[G]
 * one per (token, rank), naive[G] one per (token, expert); tot[4] += pairs, pairs_local, R0
 * and R1 (remote rows of naive and dedup). */
void rows_of(const int32_t *topk, size_t T, int k, int E, const int32_t *expert_rank, int G,
             int home, uint64_t *dedup, uint64_t *naive, uint64_t *tot)
{
    int32_t *homes = xcalloc(T, sizeof(int32_t));
    for (size_t t = 0; t < T; t++)
        homes[t] = home;
    loom_moe_rows_t rows;
    if (loom_moe_rows_count(topk, T, (uint32_t)k, (uint32_t)E, expert_rank, (uint32_t)G, homes,
                            dedup, &rows) != loomSuccess)
        bench_die(NULL, "the routing holds an expert id out of range");
    dedup[home] = rows.rows - rows.rows_remote;
    memset(naive, 0, (size_t)G * sizeof(uint64_t));
    for (size_t i = 0; i < T * (size_t)k; i++)
        if (topk[i] >= 0)
            naive[expert_rank[topk[i]]]++;
    tot[0] += rows.pairs;
    tot[1] += rows.pairs_local;
    tot[2] += rows.rows_naive_remote;
    tot[3] += rows.rows_remote;
    free(homes);
}

/* The most remote rows one rank receives in a step whose rows rank s sends rank d are
 * m[s * G + d]. */
uint64_t max_received(const uint64_t *m, int G)
{
    uint64_t most = 0;
    for (int d = 0; d < G; d++) {
        uint64_t n = 0;
        for (int s = 0; s < G; s++)
            n += s == d ? 0 : m[(size_t)s * (size_t)G + (size_t)d];
        most = n > most ? n : most;
    }
    return most;
}

void counts_free(counts_t *c)
{
    free(c->naive);
    free(c->dedup);
}

/* Row counts of the evaluation batches under a placement, every token at home on its rank. */
counts_t count_rows(const routing_t *r, const int32_t *expert_rank)
{
    int first = r->nbatches / 2, nb = r->nbatches - first;
    size_t G = (size_t)g_nranks, GG = G * G, k = (size_t)r->top_k;
    /* per batch: dedup then naive rows to each rank, gathered from every rank */
    size_t n = (size_t)nb * 2 * G;
    uint64_t *mine = xcalloc(n, sizeof(uint64_t)), *all = xcalloc(n * G, sizeof(uint64_t));
    uint64_t tot[4] = {0};
    for (int b = 0; b < nb; b++) {
        int bb = first + b;
        uint64_t *dedup = mine + (size_t)b * 2 * G;
        rows_of(r->topk + r->off[bb] * k, r->ntok[bb], (int)k, r->num_experts, expert_rank,
                g_nranks, g_rank, dedup, dedup + G, tot);
    }
    CHECK(loomAllGather(mine, all, n, loomUint64, g_comm, NULL));
    CHECK(loomAllReduce(tot, tot, 4, loomUint64, loomSum, g_comm, NULL));
    counts_t c = {.rows_naive = (double)tot[2] / nb,
                  .rows_dedup = (double)tot[3] / nb,
                  .hit = tot[0] ? 100.0 * (double)tot[1] / (double)tot[0] : 0.0,
                  .naive = xcalloc((size_t)nb * GG, sizeof(uint64_t)),
                  .dedup = xcalloc((size_t)nb * GG, sizeof(uint64_t))};
    for (int b = 0; b < nb; b++) {
        for (size_t s = 0; s < G; s++)
            for (size_t d = 0; d < G; d++) {
                const uint64_t *from = all + s * n + (size_t)b * 2 * G;
                c.dedup[(size_t)b * GG + s * G + d] = from[d];
                c.naive[(size_t)b * GG + s * G + d] = from[G + d];
            }
        c.max_dedup += (double)max_received(c.dedup + (size_t)b * GG, g_nranks) / nb;
        c.max_naive += (double)max_received(c.naive + (size_t)b * GG, g_nranks) / nb;
    }
    free(mine);
    free(all);
    return c;
}

// ---- Re-ordering -----------------------------------------------------------------------------

/* Rank g's share of T tokens (loom_moe.h, "Re-ordering"): n tokens from first. */
void share(size_t T, int G, int g, size_t *first, size_t *n)
{
    size_t q = T / (size_t)G, m = T % (size_t)G;
    *first = (size_t)g * q + ((size_t)g < m ? (size_t)g : m);
    *n = q + ((size_t)g < m);
}

/* The rank whose share of T tokens holds token t, and t's index there. */
static int share_owner(size_t T, int G, size_t t, size_t *index)
{
    size_t q = T / (size_t)G, m = T % (size_t)G, first, n;
    size_t g = t < m * (q + 1) ? t / (q + 1) : m + (t - m * (q + 1)) / q;
    share(T, G, (int)g, &first, &n);
    *index = t - first;
    return (int)g;
}

/* The affinity from the layer before to the measured one over every rank's share of the first
 * half of the batches, summed over the ranks, as place_coselect() learns the placement. */
void reorder_init(reorder_t *ro, const layers_t *ly, const int32_t *expert_rank, int E, int k)
{
    size_t most = 1, nperm = 0, first, n;
    for (int b = 0; b < ly->nbatches; b++) {
        most = ly->ntok[b] > most ? ly->ntok[b] : most;
        nperm += b >= ly->nbatches / 2 ? ly->ntok[b] : 0;
    }
    *ro = (reorder_t){.ly = ly, .expert_rank = expert_rank, .E = E, .k = k};
    ro->aff = xcalloc((size_t)E * (size_t)E, sizeof(uint64_t));
    for (int b = 0; b < ly->nbatches / 2; b++) {
        share(ly->ntok[b], g_nranks, g_rank, &first, &n);
        size_t at = (ly->off[b] + first) * (size_t)k;
        CHECK(loomMoeAffinityAccumulate(ly->prev + at, k, E, ly->cur + at, k, E, n, ro->aff));
    }
    CHECK(
        loomAllReduce(ro->aff, ro->aff, (size_t)E * (size_t)E, loomUint64, loomSum, g_comm, NULL));
    ro->ident = xcalloc(most, sizeof(int32_t));
    for (size_t t = 0; t < most; t++)
        ro->ident[t] = (int32_t)t;
    ro->pred_own = xcalloc(most * (size_t)k, sizeof(int32_t));
    ro->pred = xcalloc(most * (size_t)k, sizeof(int32_t));
    ro->perm_now = xcalloc(most, sizeof(int32_t));
    ro->perm = xcalloc(nperm, sizeof(int32_t));
    ro->poff = xcalloc((size_t)ly->nbatches, sizeof(size_t));
}

void reorder_free(reorder_t *ro)
{
    free(ro->aff);
    free(ro->ident);
    free(ro->pred_own);
    free(ro->pred);
    free(ro->perm_now);
    free(ro->perm);
    free(ro->src);
    free(ro->poff);
}

/* Batch b's re-ordering as a layer runs it, into ro->perm_now: this rank predicts its share's
 * experts from the layer before, an AllGather of the T * k int32 predictions gives every rank
 * all of them in natural order, and every rank computes the same permutation. What moves the
 * tokens, the permuted ReduceScatter, stands in for one the layer runs anyway. With times,
 * times[3] receives the microseconds of the local work, times[4] those of the AllGather. */
void reorder_batch(reorder_t *ro, int b, double *times)
{
    const layers_t *ly = ro->ly;
    size_t T = ly->ntok[b], k = (size_t)ro->k, first, n;
    share(T, g_nranks, g_rank, &first, &n);
    double t0 = now_us();
    CHECK(loomMoeAffinityPredict(ro->aff, ro->E, ro->E, ly->prev + (ly->off[b] + first) * k, ro->k,
                                 n, ro->k, ro->pred_own));
    double t1 = now_us();
    CHECK(loomMoeAllGatherPermuted(ro->pred_own, ro->pred, k, loomInt32, ro->ident, T, g_comm));
    double t2 = now_us();
    CHECK(loomMoeReorderCompute(ro->expert_rank, ro->E, g_nranks, ro->pred, ro->k, T, ro->perm_now,
                                NULL));
    if (times) {
        times[3] = t1 - t0 + now_us() - t2;
        times[4] = t2 - t1;
    }
}

/* The measured layer as re-ordering hands it out: evaluation batch b of rr holds the rows of
 * the tokens perm[first .. first + n) of this rank's share, the first half none. */
void routing_reordered(reorder_t *ro, const routing_t *r, routing_t *rr)
{
    const layers_t *ly = ro->ly;
    size_t k = (size_t)ro->k, total = 0, at = 0, first, n;
    for (int b = ly->nbatches / 2; b < ly->nbatches; b++) {
        share(ly->ntok[b], g_nranks, g_rank, &first, &n);
        total += n;
    }
    *rr = (routing_t){.num_experts = ro->E, .top_k = ro->k};
    snprintf(rr->label, sizeof(rr->label), "%s", r->label);
    routing_alloc(rr, ly->nbatches, total);
    ro->src = xcalloc(2 * total, sizeof(int32_t));
    for (int b = 0, pos = 0; b < ly->nbatches; b++) {
        rr->off[b] = (size_t)pos;
        if (b < ly->nbatches / 2)
            continue;
        reorder_batch(ro, b, NULL);
        size_t T = ly->ntok[b];
        ro->poff[b] = at;
        memcpy(ro->perm + at, ro->perm_now, T * sizeof(int32_t));
        at += T;
        share(T, g_nranks, g_rank, &first, &n);
        for (size_t j = 0; j < n; j++) {
            size_t t = (size_t)ro->perm_now[first + j], f;
            memcpy(rr->topk + ((size_t)pos + j) * k, ly->cur + (ly->off[b] + t) * k,
                   k * sizeof(int32_t));
            int32_t *src = ro->src + 2 * ((size_t)pos + j);
            src[0] = share_owner(T, g_nranks, t, &f);
            src[1] = (int32_t)f;
        }
        rr->ntok[b] = n;
        rr->max_tok = n > rr->max_tok ? n : rr->max_tok;
        pos += (int)n;
    }
}

// ---- Data and the check ------------------------------------------------------------------

/* Inputs are integers in [-4, 4] and weights multiples of 1/8, so that every product and sum
 * of the reference is exact and the expected output is rounded once, as combine's is. */
double x_value(size_t t, int rank, size_t i)
{
    return (double)((t * 7 + i * 3 + (size_t)rank * 5) % 9) - 4.0;
}

float weight_value(size_t t, int j)
{
    return (float)(1 + (t + (size_t)j) % 4) / 8.0f;
}

/* The expert function: expert e multiplies by e + 1, rounded to the datatype. */
static double expert_value(loomDataType_t dt, double x, int e)
{
    char tmp[8];
    bench_store(dt, tmp, 0, x * (e + 1));
    return bench_load_float(dt, tmp, 0);
}

void run_experts(loomDataType_t dt, size_t H, const int32_t *expert_rank, int E,
                 const loomMoeLayoutInfo_t *info, const void *in, void *out)
{
    int l = 0;
    for (int e = 0; e < E; e++) {
        if (expert_rank[e] != g_rank)
            continue;
        size_t lo = (size_t)info->expert_offset[l], hi = lo + (size_t)info->expert_count[l];
        for (size_t i = lo * H; i < hi * H; i++)
            bench_store(dt, out, i, expert_value(dt, bench_load_float(dt, in, i), e));
        l++;
    }
}

/* Elements of y that differ from the reference of this rank's tokens: token t's input is
 * x_value(t, this rank), or with src (two per token) that of token src[2t + 1] of rank src[2t]. */
long long count_wrong(loomDataType_t dt, size_t H, const int32_t *topk, int k, size_t T,
                      const int32_t *src, const void *y)
{
    long long wrong = 0;
    char ref[8];
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < H; i++) {
            double acc = 0.0,
                   x = src ? x_value((size_t)src[2 * t + 1], src[2 * t], i) : x_value(t, g_rank, i);
            for (int j = 0; j < k; j++)
                if (topk[t * (size_t)k + (size_t)j] >= 0)
                    acc += (double)weight_value(t, j) *
                           expert_value(dt, x, topk[t * (size_t)k + (size_t)j]);
            bench_store(dt, ref, 0, acc);
            wrong += bench_load_float(dt, ref, 0) != bench_load_float(dt, y, t * H + i);
        }
    return wrong;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * layout.c - which parameters a rank holds and where: the tensor and unit tables of model.h,
 * the parameter initialisation keyed by global element index, and range walks over tensors.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int layout_is_moe(const model_cfg_t *c, int l)
{
    return c->moe_e > 0 && l >= 0 && l % c->moe_every == c->moe_every - 1;
}

/* Global shape of tensor kind k (of layer l: a MoE block stacks its experts' matrices). */
static void global_shape(const model_cfg_t *c, int k, int l, int *rows, int *cols)
{
    int C = c->d, ne = layout_is_moe(c, l) ? c->moe_e : 1;
    switch (k) {
    case TK_WTE:
        *rows = c->vocab, *cols = C;
        return;
    case TK_WPE:
        *rows = c->ctx, *cols = C;
        return;
    case TK_WQ:
    case TK_WK:
    case TK_WV:
    case TK_WO:
        *rows = C, *cols = C;
        return;
    case TK_WUP:
        *rows = ne * C, *cols = 4 * C;
        return;
    case TK_WDOWN:
        *rows = ne * 4 * C, *cols = C;
        return;
    case TK_WR:
        *rows = C, *cols = c->moe_e;
        return;
    default:
        *rows = 1, *cols = C;
        return; /* LayerNorm weights and biases */
    }
}

static size_t tensor_size(const model_cfg_t *c, int k, int l)
{
    int r, co;
    global_shape(c, k, l, &r, &co);
    return (size_t)r * (size_t)co;
}

/* The tensor kinds of block l in global order; returns their count. */
static int block_kinds(const model_cfg_t *c, int l, int kinds[BLOCK_TENSORS + 1])
{
    int n = 0;
    for (int k = TK_LN1W; k <= TK_WDOWN; k++)
        kinds[n++] = k;
    if (layout_is_moe(c, l))
        kinds[n++] = TK_WR;
    return n;
}

static size_t block_size(const model_cfg_t *c, int l)
{
    int kinds[BLOCK_TENSORS + 1], nk = block_kinds(c, l, kinds);
    size_t n = 0;
    for (int i = 0; i < nk; i++)
        n += tensor_size(c, kinds[i], l);
    return n;
}

/* Offset of tensor k (of layer l for block tensors) in the global vector. */
static size_t global_offset(const model_cfg_t *c, int k, int l)
{
    size_t emb = tensor_size(c, TK_WTE, -1) + tensor_size(c, TK_WPE, -1);
    if (k == TK_WTE)
        return 0;
    if (k == TK_WPE)
        return tensor_size(c, TK_WTE, -1);
    size_t off = emb;
    int last = k == TK_LNFW || k == TK_LNFB ? c->layers : l;
    for (int j = 0; j < last; j++)
        off += block_size(c, j);
    if (k == TK_LNFW)
        return off;
    if (k == TK_LNFB)
        return off + tensor_size(c, TK_LNFW, -1);
    int kinds[BLOCK_TENSORS + 1], nk = block_kinds(c, l, kinds);
    for (int i = 0; i < nk && kinds[i] != k; i++)
        off += tensor_size(c, kinds[i], l);
    return off;
}

static enum split split_of(int k)
{
    switch (k) {
    case TK_WQ:
    case TK_WK:
    case TK_WV:
    case TK_WUP:
        return SPLIT_COLS;
    case TK_WO:
    case TK_WDOWN:
        return SPLIT_ROWS;
    default:
        return SPLIT_NONE;
    }
}

int layout_check(const model_cfg_t *c, const grid_pos_t *g, char *err, size_t errlen)
{
    if (c->vocab != 256 || c->ctx < 2 || c->d < 1 || c->heads < 1 || c->layers < 1) {
        snprintf(err, errlen, "bad model shape (ctx %d, d %d, heads %d, layers %d)", c->ctx, c->d,
                 c->heads, c->layers);
        return -1;
    }
    if (c->d % c->heads) {
        snprintf(err, errlen, "--d %d is not a multiple of --heads %d", c->d, c->heads);
        return -1;
    }
    if (g->dp < 1 || g->tp < 1 || g->pp < 1 || g->cp < 1) {
        snprintf(err, errlen, "parallel degrees must be >= 1");
        return -1;
    }
    if (c->heads % g->tp) {
        snprintf(err, errlen, "--tp %d must divide --heads %d", g->tp, c->heads);
        return -1;
    }
    if (g->pp > c->layers) {
        snprintf(err, errlen, "--pp %d is larger than --layers %d", g->pp, c->layers);
        return -1;
    }
    if (c->ctx % (2 * g->cp)) {
        snprintf(err, errlen, "--ctx %d must be a multiple of 2 * --cp (%d)", c->ctx, 2 * g->cp);
        return -1;
    }
    return 0;
}

static int tensor_count(const layout_t *lay)
{
    int n = 0;
    for (int l = lay->l0; l < lay->l1; l++)
        n += layout_is_moe(&lay->cfg, l) ? MOE_SHARED + 2 * lay->nle : BLOCK_TENSORS;
    if (lay->first)
        n += 2;
    if (lay->last)
        n += 2 + (lay->first ? 0 : 1);
    return n;
}

static void add_tensor(layout_t *lay, int kind, int layer, size_t *off)
{
    const model_cfg_t *c = &lay->cfg;
    ltensor_t *t = &lay->t[lay->nt++];
    int tp = lay->g.tp, r = lay->g.tp_i;
    t->kind = kind;
    t->layer = layer;
    t->expert = -1;
    global_shape(c, kind, layer, &t->grow, &t->gcols);
    t->rows = t->grow, t->cols = t->gcols, t->r0 = 0, t->c0 = 0;
    enum split s = split_of(kind);
    if (s == SPLIT_COLS) {
        t->cols = t->gcols / tp;
        t->c0 = r * t->cols;
    } else if (s == SPLIT_ROWS) {
        t->rows = t->grow / tp;
        t->r0 = r * t->rows;
    }
    t->goff = global_offset(c, kind, layer < 0 ? 0 : layer);
    t->off = *off;
    *off += (size_t)t->rows * (size_t)t->cols;
    t->decay = t->grow > 1; /* matrices decay; LayerNorm vectors do not */
    /* Replicated tensors are counted by TP rank 0; the head's copy of wte never. */
    int head_copy = kind == TK_WTE && !lay->first;
    t->counted = !head_copy && (s != SPLIT_NONE || r == 0);
}

/* Expert e's wup or wdown of a MoE block: its rows of the stacked tensor (no TP with MoE). */
static void add_expert_tensor(layout_t *lay, int kind, int layer, int e, size_t *off)
{
    add_tensor(lay, kind, layer, off);
    ltensor_t *t = &lay->t[lay->nt - 1];
    *off -= (size_t)t->rows * (size_t)t->cols;
    t->rows = t->grow / lay->cfg.moe_e;
    t->cols = t->gcols;
    t->c0 = 0;
    t->r0 = e * t->rows;
    t->expert = e;
    *off += (size_t)t->rows * (size_t)t->cols;
}

static void add_unit(layout_t *lay, int kind, int layer, int t0, size_t *off)
{
    unit_t *u = &lay->u[lay->nu++];
    u->kind = kind;
    u->layer = layer;
    u->t0 = t0;
    u->nt = lay->nt - t0;
    u->len = *off - u->off;
    size_t s = (size_t)lay->shards;
    u->padded = (u->len + s - 1) / s * s;
    *off = u->off + u->padded;
}

/* The experts of MoE block l on this rank, ascending: e_out[nle]. */
static void local_experts(const layout_t *lay, int l, int *e_out)
{
    int n = 0, E = lay->cfg.moe_e;
    for (int e = 0; e < E && n < lay->nle; e++)
        if (lay->erank[(size_t)l * (size_t)E + (size_t)e] == lay->g.ep_i)
            e_out[n++] = e;
}

int layout_build(layout_t *lay, const model_cfg_t *cfg, const grid_pos_t *g, int shards)
{
    lay->cfg = *cfg;
    lay->g = *g;
    lay->shards = shards;
    lay->l0 = g->pp_i * cfg->layers / g->pp;
    lay->l1 = (g->pp_i + 1) * cfg->layers / g->pp;
    lay->first = g->pp_i == 0;
    lay->last = g->pp_i == g->pp - 1;
    lay->cl = cfg->d / g->tp;
    lay->hl = cfg->heads / g->tp;
    lay->fl = 4 * cfg->d / g->tp;
    lay->nt = 0;
    lay->nu = 0;
    int E = cfg->moe_e, ep = g->ep > 0 ? g->ep : 1, nl = lay->l1 - lay->l0;
    /* Contiguous placement, as loomMoePlacementCompute shares them: rank r holds floor(E/ep)
     * experts, plus one for r < E mod ep. */
    lay->nle = E > 0 ? E / ep + (g->ep_i < E % ep) : 0;
    lay->erank = calloc((size_t)cfg->layers * (size_t)(E > 0 ? E : 1), sizeof(int32_t));
    lay->ub = calloc((size_t)nl, sizeof(int));
    lay->ue = calloc((size_t)nl, sizeof(int));
    int *le = calloc((size_t)(lay->nle > 0 ? lay->nle : 1), sizeof(int));
    if (lay->erank && lay->ub && lay->ue && le) {
        lay->t = calloc((size_t)tensor_count(lay), sizeof(ltensor_t));
        lay->u = calloc((size_t)(2 * nl + 2), sizeof(unit_t));
    }
    if (!lay->t || !lay->u) {
        free(le);
        layout_free(lay);
        return -1;
    }
    for (int l = 0; l < cfg->layers && E > 0; l++)
        for (int r = 0, e = 0; r < ep; r++)
            for (int i = 0; i < E / ep + (r < E % ep); i++)
                lay->erank[(size_t)l * (size_t)E + (size_t)e++] = r;
    size_t off = 0;
    if (lay->first) {
        int t0 = lay->nt;
        lay->u[lay->nu].off = off;
        add_tensor(lay, TK_WTE, -1, &off);
        add_tensor(lay, TK_WPE, -1, &off);
        add_unit(lay, UNIT_EMB, -1, t0, &off);
    }
    for (int l = lay->l0; l < lay->l1; l++) {
        int t0 = lay->nt, moe = layout_is_moe(cfg, l);
        lay->ub[l - lay->l0] = lay->nu;
        lay->ue[l - lay->l0] = -1;
        lay->u[lay->nu].off = off;
        for (int k = TK_LN1W; k <= (moe ? TK_LN2B : TK_WDOWN); k++)
            add_tensor(lay, k, l, &off);
        if (moe)
            add_tensor(lay, TK_WR, l, &off);
        add_unit(lay, UNIT_BLOCK, l, t0, &off);
        if (!moe)
            continue;
        t0 = lay->nt;
        lay->ue[l - lay->l0] = lay->nu;
        lay->u[lay->nu].off = off;
        local_experts(lay, l, le);
        for (int j = 0; j < lay->nle; j++) {
            add_expert_tensor(lay, TK_WUP, l, le[j], &off);
            add_expert_tensor(lay, TK_WDOWN, l, le[j], &off);
        }
        add_unit(lay, UNIT_EXPERTS, l, t0, &off);
    }
    free(le);
    if (lay->last) {
        int t0 = lay->nt;
        lay->u[lay->nu].off = off;
        add_tensor(lay, TK_LNFW, -1, &off);
        add_tensor(lay, TK_LNFB, -1, &off);
        if (!lay->first)
            add_tensor(lay, TK_WTE, -1, &off);
        add_unit(lay, UNIT_FINAL, -1, t0, &off);
    }
    lay->total = off;
    lay->global_len = global_offset(cfg, TK_LNFB, 0) + tensor_size(cfg, TK_LNFB, -1);
    return 0;
}

void layout_place(layout_t *lay, int layer, const int32_t *expert_rank)
{
    int E = lay->cfg.moe_e, j = 0;
    const unit_t *u = layout_expert_unit(lay, layer);
    for (int e = 0; e < E; e++) {
        lay->erank[(size_t)layer * (size_t)E + (size_t)e] = expert_rank[e];
        for (int i = 0; u && expert_rank[e] == lay->g.ep_i && i < 2 && 2 * j + i < u->nt; i++) {
            ltensor_t *t = &lay->t[u->t0 + 2 * j + i];
            t->expert = e;
            t->r0 = e * t->rows;
        }
        j += expert_rank[e] == lay->g.ep_i;
    }
}

void layout_free(layout_t *lay)
{
    free(lay->t);
    free(lay->u);
    free(lay->erank);
    free(lay->ub);
    free(lay->ue);
    lay->t = NULL;
    lay->u = NULL;
    lay->erank = NULL;
    lay->ub = lay->ue = NULL;
    lay->nt = lay->nu = 0;
}

const ltensor_t *layout_block_tensor(const layout_t *lay, int layer, int kind)
{
    const unit_t *u = layout_block_unit(lay, layer);
    return u ? &lay->t[u->t0 + (kind == TK_WR ? MOE_SHARED - 1 : kind - TK_LN1W)] : NULL;
}

const ltensor_t *layout_expert_tensor(const layout_t *lay, int layer, int j, int kind)
{
    const unit_t *u = layout_expert_unit(lay, layer);
    return u ? &lay->t[u->t0 + 2 * j + (kind == TK_WDOWN)] : NULL;
}

const unit_t *layout_block_unit(const layout_t *lay, int layer)
{
    if (layer < lay->l0 || layer >= lay->l1)
        return NULL;
    return &lay->u[lay->ub[layer - lay->l0]];
}

const unit_t *layout_expert_unit(const layout_t *lay, int layer)
{
    if (layer < lay->l0 || layer >= lay->l1 || lay->ue[layer - lay->l0] < 0)
        return NULL;
    return &lay->u[lay->ue[layer - lay->l0]];
}

const unit_t *layout_unit_of(const layout_t *lay, int kind)
{
    for (int i = 0; i < lay->nu; i++)
        if (lay->u[i].kind == kind)
            return &lay->u[i];
    return NULL;
}

/* splitmix64: a counter-based generator, so that value i needs no state. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Which tensor kind global element i falls in. */
static int kind_at(const model_cfg_t *c, size_t i)
{
    size_t emb0 = tensor_size(c, TK_WTE, -1), emb = emb0 + tensor_size(c, TK_WPE, -1);
    if (i < emb0)
        return TK_WTE;
    if (i < emb)
        return TK_WPE;
    size_t j = i - emb;
    for (int l = 0; l < c->layers; l++) {
        size_t bs = block_size(c, l);
        if (j >= bs) {
            j -= bs;
            continue;
        }
        int kinds[BLOCK_TENSORS + 1], nk = block_kinds(c, l, kinds);
        for (int k = 0; k < nk; k++) {
            size_t n = tensor_size(c, kinds[k], l);
            if (j < n)
                return kinds[k];
            j -= n;
        }
    }
    return j < (size_t)c->d ? TK_LNFW : TK_LNFB;
}

float model_init_value(const model_cfg_t *c, size_t gi)
{
    int k = kind_at(c, gi);
    if (k == TK_LN1W || k == TK_LN2W || k == TK_LNFW)
        return 1.0f;
    if (k == TK_LN1B || k == TK_LN2B || k == TK_LNFB)
        return 0.0f;
    /* GPT-2: N(0, 0.02), and the projections into the residual stream scaled by 1/sqrt(2L). */
    double std = 0.02;
    if (k == TK_WO || k == TK_WDOWN)
        std /= sqrt(2.0 * c->layers);
    uint64_t a = mix64(c->seed * 0x2545f4914f6cdd1dull ^ (2 * gi));
    uint64_t b = mix64(c->seed * 0x2545f4914f6cdd1dull ^ (2 * gi + 1));
    double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
    double u2 = (double)(b >> 11) / 9007199254740992.0;
    return (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void layout_init_params(const layout_t *lay, float *p)
{
    for (size_t i = 0; i < lay->total; i++)
        p[i] = 0.0f;
    for (int n = 0; n < lay->nt; n++) {
        const ltensor_t *t = &lay->t[n];
        for (int i = 0; i < t->rows; i++)
            for (int j = 0; j < t->cols; j++)
                p[t->off + (size_t)i * (size_t)t->cols + (size_t)j] =
                    model_init_value(&lay->cfg, ltensor_global(t, i, j));
    }
}

void layout_for_range(const layout_t *lay, size_t a, size_t b,
                      void (*fn)(const ltensor_t *t, size_t lo, size_t hi, void *arg), void *arg)
{
    for (int n = 0; n < lay->nt; n++) {
        const ltensor_t *t = &lay->t[n];
        size_t lo = t->off, hi = t->off + (size_t)t->rows * (size_t)t->cols;
        if (lo < a)
            lo = a;
        if (hi > b)
            hi = b;
        if (lo < hi)
            fn(t, lo, hi, arg);
    }
}

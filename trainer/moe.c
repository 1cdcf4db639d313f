/* SPDX-License-Identifier: Apache-2.0
 *
 * moe.c - a mixture-of-experts layer in place of a block's MLP (--moe E:k), over loom's MoE API
 * (include/loom_moe.h), always, even when one rank holds every expert, so that one code path
 * serves every layout: a linear router C -> E, softmax, the top k with their probabilities
 * renormalised, the Switch/GShard load-balancing loss; loomMoeLayout and loomMoeDispatch take each
 * token to the ranks of its experts (the EP group), each expert (a GELU MLP) runs on its rows,
 * and loomMoeCombine brings back their weighted sum. The backward runs loom's adjoints on the same
 * handle; the router's gradient flows through the combine weights (loomMoeCombineBackward's
 * weight gradients) and the auxiliary loss.
 */
#include "train.h"

#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Grows *p to hold n floats (contents not kept). */
static void grow(float **p, size_t n)
{
    free(*p);
    *p = train_calloc(n, sizeof(float));
}

/* Makes (or remakes) layer l's plan on its current placement. */
static void make_plan(stage_t *s, int l)
{
    const layout_t *lay = s->lay;
    const model_cfg_t *m = &lay->cfg;
    loomMoePlan_t *plan = &s->plans[l - lay->l0];
    loomMoePlanDestroy(*plan);
    *plan = NULL;
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = m->moe_e;
    cfg.top_k = m->moe_k;
    cfg.datatype = loomFloat32;
    cfg.mode = s->o->moe_mode;
    cfg.hidden = (size_t)m->d;
    cfg.expert_rank = lay->erank + (size_t)l * (size_t)m->moe_e;
    tc_check(loomMoePlanCreate(plan, &cfg, s->c->ep), s->c, "loomMoePlanCreate");
}

void moe_init(stage_t *s, int n)
{
    const layout_t *lay = s->lay;
    const model_cfg_t *m = &lay->cfg;
    size_t nl = (size_t)(lay->l1 - lay->l0), E = (size_t)m->moe_e;
    s->plans = train_calloc(nl, sizeof(loomMoePlan_t));
    if (E == 0)
        return;
    s->rlog = train_calloc((size_t)n * E, sizeof(float));
    s->rdw = train_calloc((size_t)n * (size_t)m->moe_k, sizeof(float));
    s->cosel = train_calloc(nl * E * E, sizeof(uint64_t));
    s->load = train_calloc(nl * E, sizeof(uint64_t));
    for (int l = lay->l0; l < lay->l1; l++)
        if (layout_is_moe(m, l))
            make_plan(s, l);
    if (s->o->moe_trace)
        trace_open(s, s->o->moe_trace);
    if (s->o->moe_replay)
        replay_open(s, s->o->moe_replay);
}

void moe_free(stage_t *s)
{
    trace_close(s);
    for (int l = 0; s->plans && l < s->lay->l1 - s->lay->l0; l++)
        loomMoePlanDestroy(s->plans[l]);
    free(s->plans);
    free(s->rlog), free(s->rdw), free(s->deout), free(s->dgel), free(s->drecv);
    free(s->cosel), free(s->load);
}

void moe_acts_alloc(block_acts_t *b, const layout_t *lay, int layer, int n, size_t *floats)
{
    const model_cfg_t *m = &lay->cfg;
    if (!layout_is_moe(m, layer))
        return;
    size_t N = (size_t)n, E = (size_t)m->moe_e, k = (size_t)m->moe_k;
    b->probs = train_calloc(N * E, sizeof(float));
    b->w = train_calloc(N * k, sizeof(float));
    b->auxg = train_calloc(E, sizeof(float));
    b->idx = train_calloc(N * k, sizeof(int32_t));
    b->ecount = train_calloc((size_t)lay->nle, sizeof(int64_t));
    b->eoff = train_calloc((size_t)lay->nle, sizeof(int64_t));
    *floats += N * E + N * k + E;
}

void moe_acts_free(block_acts_t *b)
{
    loomMoeHandleDestroy(b->moe);
    free(b->probs), free(b->w), free(b->auxg), free(b->idx), free(b->ecount), free(b->eoff);
    free(b->recv), free(b->eup), free(b->egel), free(b->eout);
}

static const float *expert_w(const stage_t *s, const float *PX, int layer, int j, int kind)
{
    const ltensor_t *t = layout_expert_tensor(s->lay, layer, j, kind);
    return PX + (t->off - layout_expert_unit(s->lay, layer)->off);
}

static const float *router_w(const stage_t *s, const float *P, int layer)
{
    const ltensor_t *t = layout_block_tensor(s->lay, layer, TK_WR);
    return P + (t->off - layout_block_unit(s->lay, layer)->off);
}

/* Runs a loom MoE call, timed as MoE communication. */
#define MOE_CALL(s, what, call)                                                                    \
    do {                                                                                           \
        double t0_ = tc_now();                                                                     \
        tc_check(call, (s)->c, what);                                                              \
        double dt_ = tc_now() - t0_;                                                               \
        (s)->moe_s += dt_;                                                                         \
        (s)->c->comm_s += dt_;                                                                     \
    } while (0)

void moe_forward(stage_t *s, int layer, const float *P, const float *PX, mb_acts_t *a,
                 block_acts_t *b, float *y)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, F = 4 * C, E = lay->cfg.moe_e, k = lay->cfg.moe_k;
    linear_fwd_f(s->rlog, b->h2, router_w(s, P, layer), n, C, E, 0);
    router_fwd_f(b->probs, b->idx, b->w, s->rlog, n, E, k);
    if (!s->eval && s->replay)
        replay_route(s, layer, a, b);
    /* Its share of the step's loss: the aux loss of the micro-batch's n tokens, weighted as n of
     * the global batch's tokens, as the language-model loss weights each token. */
    a->aux += moe_aux_f(b->auxg, b->probs, b->idx, n, E, k, s->o->moe_aux, (double)n * a->scale);
    if (!s->eval && s->trace)
        trace_batch(s, layer, a, b);
    if (!s->eval && s->o->moe_place) {
        size_t li = (size_t)(layer - lay->l0);
        tc_check(loomMoeCoselectAccumulate(b->idx, (size_t)n, k, E, s->cosel + li * E * E,
                                           s->load + li * E),
                 s->c, "loomMoeCoselectAccumulate");
    }
    loomMoeHandleDestroy(b->moe);
    b->moe = NULL;
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    info.expert_count = b->ecount;
    info.expert_offset = b->eoff;
    MOE_CALL(s, "loomMoeLayout",
             loomMoeLayout(s->plans[layer - lay->l0], b->idx, b->w, (size_t)n, &b->moe, &info));
    b->slots = info.recv_slots;
    if (b->slots > b->cap) {
        b->cap = b->slots;
        grow(&b->recv, b->cap * (size_t)C), grow(&b->eout, b->cap * (size_t)C);
        grow(&b->eup, b->cap * (size_t)F), grow(&b->egel, b->cap * (size_t)F);
    }
    MOE_CALL(s, "loomMoeDispatch", loomMoeDispatch(b->moe, b->h2, b->recv));
    for (int j = 0; j < lay->nle; j++) {
        int cnt = (int)b->ecount[j];
        size_t o = (size_t)b->eoff[j];
        if (cnt == 0)
            continue;
        linear_fwd_f(b->eup + o * F, b->recv + o * C, expert_w(s, PX, layer, j, TK_WUP), cnt, C, F,
                     0);
        gelu_fwd_f(b->egel + o * F, b->eup + o * F, (size_t)cnt * (size_t)F);
        linear_fwd_f(b->eout + o * C, b->egel + o * F, expert_w(s, PX, layer, j, TK_WDOWN), cnt, F,
                     C, 0);
    }
    MOE_CALL(s, "loomMoeCombine", loomMoeCombine(b->moe, b->eout, y));
    if (s->eval) {
        loomMoeHandleDestroy(b->moe);
        b->moe = NULL;
    }
}

void moe_backward(stage_t *s, int layer, const float *P, float *G, const float *PX, float *GX,
                  mb_acts_t *a, block_acts_t *b, const float *dy, float *dh)
{
    const layout_t *lay = s->lay;
    int n = a->n, C = lay->cfg.d, F = 4 * C, E = lay->cfg.moe_e, k = lay->cfg.moe_k;
    if (b->slots > s->dcap) {
        s->dcap = b->slots;
        grow(&s->deout, s->dcap * (size_t)C), grow(&s->drecv, s->dcap * (size_t)C);
        grow(&s->dgel, s->dcap * (size_t)F);
    }
    MOE_CALL(s, "loomMoeCombineBackward",
             loomMoeCombineBackward(b->moe, dy, b->eout, s->deout, s->rdw));
    for (int j = 0; j < lay->nle; j++) {
        int cnt = (int)b->ecount[j];
        size_t o = (size_t)b->eoff[j];
        if (cnt == 0)
            continue;
        const ltensor_t *tu = layout_expert_tensor(lay, layer, j, TK_WUP),
                        *td = layout_expert_tensor(lay, layer, j, TK_WDOWN);
        size_t base = layout_expert_unit(lay, layer)->off;
        linear_bwd_f(s->dgel, GX + (td->off - base), s->deout + o * C, b->egel + o * F,
                     expert_w(s, PX, layer, j, TK_WDOWN), cnt, F, C);
        gelu_bwd_f(s->dgel, s->dgel, b->eup + o * F, (size_t)cnt * (size_t)F);
        linear_bwd_f(s->drecv + o * C, GX + (tu->off - base), s->dgel, b->recv + o * C,
                     expert_w(s, PX, layer, j, TK_WUP), cnt, C, F);
    }
    MOE_CALL(s, "loomMoeDispatchBackward", loomMoeDispatchBackward(b->moe, s->drecv, dh));
    loomMoeHandleDestroy(b->moe);
    b->moe = NULL;
    /* The router: through the combine weights and the auxiliary loss, into dh. */
    router_bwd_f(s->rlog, s->rdw, b->probs, b->idx, b->w, b->auxg, n, E, k);
    float *gwr =
        G + (layout_block_tensor(lay, layer, TK_WR)->off - layout_block_unit(lay, layer)->off);
    linear_bwd_f(s->dtmp, gwr, s->rlog, b->h2, router_w(s, P, layer), n, C, E);
    for (size_t i = 0; i < (size_t)n * (size_t)C; i++)
        dh[i] += s->dtmp[i];
}

void moe_take_stats(stage_t *s, double out[MOE_STATS])
{
    memset(out, 0, MOE_STATS * sizeof(double));
    for (int l = 0; s->plans && l < s->lay->l1 - s->lay->l0; l++) {
        loomMoeStats_t st = LOOM_MOE_STATS_INITIALIZER;
        if (!s->plans[l])
            continue;
        tc_check(loomMoePlanGetStats(s->plans[l], &st, 1), s->c, "loomMoePlanGetStats");
        out[MOE_ROWS_SAVED] += (double)(st.rows_naive_remote - st.rows_dedup_remote);
        out[MOE_ROWS_SENT] += (double)st.rows_sent_remote;
        out[MOE_PAIRS] += (double)st.pairs;
        out[MOE_PAIRS_LOCAL] += (double)st.pairs_local;
    }
    out[MOE_SECONDS] = s->moe_s;
    s->moe_s = 0;
}

/* Moves layer l's experts from the placement old[E] to the layout's current one: every EP rank
 * contributes its experts' parameters and moments (in ceil(E/ep) slots), and takes its new ones
 * from the rank that held them. */
static void move_experts(stage_t *s, engine_t *e, int l, const int32_t *old)
{
    const layout_t *lay = &e->lay;
    const unit_t *u = layout_expert_unit(lay, l);
    int E = lay->cfg.moe_e, ep = lay->g.ep, slots = (E + ep - 1) / ep;
    size_t el = (size_t)8 * (size_t)lay->cfg.d * (size_t)lay->cfg.d, rec = 3 * el;
    float *bufs[3] = {e->params, e->m, e->v};
    float *send = train_calloc((size_t)slots * rec, sizeof(float));
    float *all = train_calloc((size_t)ep * (size_t)slots * rec, sizeof(float));
    for (int j = 0; j < lay->nle; j++)
        for (int b = 0; b < 3; b++)
            memcpy(send + (size_t)j * rec + (size_t)b * el, bufs[b] + u->off + (size_t)j * el,
                   el * sizeof(float));
    tc_allgather(s->c, P_MISC, s->c->ep, send, all, (size_t)slots * rec);
    for (int j = 0; j < lay->nle; j++) {
        int x = layout_expert_tensor(lay, l, j, TK_WUP)->expert, r = old[x], i = 0;
        for (int y = 0; y < x; y++)
            i += old[y] == r;
        const float *src = all + ((size_t)r * (size_t)slots + (size_t)i) * rec;
        for (int b = 0; b < 3; b++)
            memcpy(bufs[b] + u->off + (size_t)j * el, src + (size_t)b * el, el * sizeof(float));
    }
    free(send);
    free(all);
}

int moe_replace(stage_t *s, engine_t *e)
{
    layout_t *lay = &e->lay;
    size_t E = (size_t)lay->cfg.moe_e;
    int moved = 0;
    int32_t *now = train_calloc(E, sizeof(int32_t)), *old = train_calloc(E, sizeof(int32_t));
    for (int l = lay->l0; l < lay->l1; l++) {
        if (!layout_is_moe(&lay->cfg, l))
            continue;
        size_t li = (size_t)(l - lay->l0);
        uint64_t *cs = s->cosel + li * E * E, *ld = s->load + li * E;
        tc_check(loomAllReduce(cs, cs, E * E, loomUint64, loomSum, s->c->world, NULL), s->c,
                 "loomAllReduce");
        tc_check(loomAllReduce(ld, ld, E, loomUint64, loomSum, s->c->world, NULL), s->c,
                 "loomAllReduce");
        loomMoePlacementConfig_t pc = LOOM_MOE_PLACEMENT_CONFIG_INITIALIZER;
        pc.nranks = lay->g.ep;
        tc_check(loomMoePlacementCompute(cs, ld, (int)E, &pc, now, NULL), s->c,
                 "loomMoePlacementCompute");
        memset(cs, 0, E * E * sizeof(uint64_t));
        memset(ld, 0, E * sizeof(uint64_t));
        memcpy(old, lay->erank + (size_t)l * E, E * sizeof(int32_t));
        int changed = 0;
        for (size_t x = 0; x < E; x++)
            changed += now[x] != old[x];
        if (!changed)
            continue;
        moved += changed;
        layout_place(lay, l, now);
        move_experts(s, e, l, old);
        make_plan(s, l);
    }
    free(now);
    free(old);
    return moved;
}

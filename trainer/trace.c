/* SPDX-License-Identifier: Apache-2.0
 *
 * trace.c - --moe-trace PREFIX: the routing of every MoE block in every training forward,
 * written as an LMTR v1 routing trace (docs/moe-trace.md), one file per rank,
 * PREFIX.rank<r>.lmtr, with the combine weights and the tokens' bytes as token ids; bench/moe_perf
 * --trace replays such a file through loom's dispatch and combine. --moe-replay FILE forces a
 * recorded routing on the training forwards (Megatron's RouterReplay): the router still computes
 * its probabilities, and the weights are those of the replayed experts, renormalised. The one
 * file of loom-train that uses a library internal, the trace reader and writer
 * (src/moe/moe_trace.h), as moe_perf does: the format has one codec.
 */
#include "train.h"

#include "moe_trace.h"
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trace_open(stage_t *s, const char *prefix)
{
    const model_cfg_t *m = &s->lay->cfg;
    char path[4200];
    snprintf(path, sizeof(path), "%s.rank%d.lmtr", prefix, s->c->rank);
    loom_moe_trace_header_t h = {.num_experts = (uint32_t)m->moe_e,
                                 .top_k = (uint32_t)m->moe_k,
                                 .flags = LOOM_MOE_TRACE_WEIGHTS | LOOM_MOE_TRACE_TOKEN_IDS,
                                 .nranks = (uint32_t)s->c->size,
                                 .rank = (uint32_t)s->c->rank,
                                 .name = "loom-train"};
    /* A file left by an earlier run of the same shape would be appended to: start afresh. */
    remove(path);
    tc_check(loom_moe_trace_writer_open(path, &h, &s->trace), s->c, "loom_moe_trace_writer_open");
}

void trace_batch(stage_t *s, int layer, const mb_acts_t *a, const block_acts_t *b)
{
    uint32_t *ids = malloc((size_t)(a->n > 0 ? a->n : 1) * sizeof(uint32_t));
    if (!ids) {
        fprintf(stderr, "loom-train: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < a->n; i++)
        ids[i] = a->tok[i];
    loom_moe_trace_batch_t t = {.step = (uint32_t)s->e->step,
                                .layer = (uint32_t)layer,
                                .num_tokens = (uint32_t)a->n,
                                .topk = b->idx,
                                .weight = b->w,
                                .token_id = ids};
    tc_check(loom_moe_trace_writer_append(s->trace, &t), s->c, "loom_moe_trace_writer_append");
    free(ids);
}

void trace_close(stage_t *s)
{
    if (s->trace)
        tc_check(loom_moe_trace_writer_close(s->trace), s->c, "loom_moe_trace_writer_close");
    s->trace = NULL;
    loom_moe_trace_free(s->replay);
    s->replay = NULL;
}

void replay_open(stage_t *s, const char *path)
{
    const model_cfg_t *m = &s->lay->cfg;
    tc_check(loom_moe_trace_read(path, &s->replay), s->c, "loom_moe_trace_read");
    const loom_moe_trace_header_t *h = &s->replay->header;
    if (h->num_experts != (uint32_t)m->moe_e || h->top_k != (uint32_t)m->moe_k) {
        fprintf(stderr,
                "loom-train: rank %d: --moe-replay %s routes %u experts, top %u; the model has %d, "
                "top %d\n",
                s->c->rank, path, h->num_experts, h->top_k, m->moe_e, m->moe_k);
        exit(2);
    }
}

/* The record of (step, block) number `nth` in the file's order, or NULL. */
static const loom_moe_trace_batch_t *find_record(const loom_moe_trace_t *t, uint32_t step,
                                                 uint32_t layer, int nth)
{
    for (size_t i = 0; i < t->num_batches; i++) {
        const loom_moe_trace_batch_t *b = &t->batches[i];
        if (b->step == step && b->layer == layer && nth-- == 0)
            return b;
    }
    return NULL;
}

void replay_route(stage_t *s, int layer, const mb_acts_t *a, block_acts_t *b)
{
    const model_cfg_t *m = &s->lay->cfg;
    /* The global batch's micro-batches in one process's order: this one is its first sequence
     * over the sequences per micro-batch. */
    int nth = a->seq0 / a->nseq;
    const loom_moe_trace_batch_t *r =
        find_record(s->replay, (uint32_t)s->e->step, (uint32_t)layer, nth);
    int ok = r && r->num_tokens == (uint32_t)a->n && r->token_id;
    for (int i = 0; ok && i < a->n; i++)
        ok = r->token_id[i] == a->tok[i];
    for (int i = 0; ok && i < a->n * m->moe_k; i++)
        ok = r->topk[i] >= 0;
    if (!ok) {
        fprintf(
            stderr,
            "loom-train: rank %d: --moe-replay %s has no routing of these %d tokens (step %lld, "
            "block %d, micro-batch %d of the global batch) with every selection made\n",
            s->c->rank, s->o->moe_replay, a->n, (long long)s->e->step, layer, nth);
        exit(1);
    }
    memcpy(b->idx, r->topk, (size_t)a->n * (size_t)m->moe_k * sizeof(int32_t));
    router_weights_f(b->w, b->probs, b->idx, a->n, m->moe_e, m->moe_k);
}

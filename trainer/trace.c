/* SPDX-License-Identifier: Apache-2.0
 *
 * trace.c - --moe-trace PREFIX: the routing of every MoE block in every training forward,
 * written as an LMTR v1 routing trace (docs/moe-trace.md), one file per rank,
 * PREFIX.rank<r>.lmtr, with the combine weights and the tokens' bytes as token ids; bench/moe_perf
 * --trace replays such a file through loom's dispatch and combine. The one file of loom-train
 * that uses a library internal, the trace writer (src/moe/moe_trace.h), as moe_perf does: the
 * format has one encoder.
 */
#include "train.h"

#include "moe_trace.h"

#include <stdio.h>
#include <stdlib.h>

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
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_trace_env.c - LOOM_MOE_TRACE_FILE and LOOM_MOE_TRACE_EVERY: every plan appends the routing
 * of its layouts (every N-th one) to an LMTR trace of its rank (moe_trace.c writes the format,
 * docs/moe-trace.md), so that any program using loom yields real routing traces without code of
 * its own. Each rank writes its own file (%r in the name); a record's step is the layout's index
 * in its plan and its layer the plan's creation order in the process. Tracing never fails a
 * layout: a file that cannot be opened or written WARNs once and turns the plan's tracing off.
 * Called by moe_plan.c (start, stop) and moe_layout.c (record).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "moe_ep.h"
#include "moe_trace.h"
#include "param.h"
#include "path_pattern.h"

/* Plans created with tracing on, process-wide: the next one's layer. */
static atomic_uint next_layer;

static void tracing_off(struct loomMoePlan *p)
{
    loom_moe_trace_writer_close(p->trace.writer);
    p->trace.writer = NULL;
    free(p->trace.path);
    p->trace.path = NULL;
}

void loom_moe_tracing_start(struct loomMoePlan *p)
{
    const char *pattern = loom_param_MOE_TRACE_FILE();
    if (pattern == NULL || pattern[0] == '\0')
        return;
    /* Ranks writing one file would interleave headers and records of different ranks. */
    if (p->nranks > 1 && strstr(pattern, "%r") == NULL) {
        LOOM_WARN("LOOM_MOE_TRACE_FILE '%s' has no %%r but the plan spans %d ranks: each rank "
                  "needs a file of its own, so rank %d does not trace",
                  pattern, p->nranks, p->rank);
        return;
    }
    int64_t every = loom_param_MOE_TRACE_EVERY();
    if (every < 1) {
        LOOM_WARN("LOOM_MOE_TRACE_EVERY %lld must be >= 1; rank %d records every layout",
                  (long long)every, p->rank);
        every = 1;
    }
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) != 0)
        strcpy(host, "unknown");
    char path[4096];
    loom_expand_path(pattern, host, p->rank, path, sizeof(path));
    p->trace.path = strdup(path);
    if (p->trace.path == NULL) {
        LOOM_WARN("LOOM_MOE_TRACE_FILE: out of memory for the name '%s'; rank %d does not trace",
                  path, p->rank);
        return;
    }
    p->trace.every = every;
    p->trace.layer = atomic_fetch_add(&next_layer, 1u);
    p->trace.calls = 0;
}

void loom_moe_tracing_record(struct loomMoePlan *p, const int32_t *topk, const float *weights,
                             size_t num_tokens)
{
    if (p->trace.path == NULL)
        return;
    uint64_t step = p->trace.calls++;
    if (step % (uint64_t)p->trace.every != 0)
        return;
    loomResult_t res = loomSuccess;
    if (p->trace.writer == NULL) {
        loom_moe_trace_header_t hdr = {0};
        hdr.num_experts = (uint32_t)p->num_experts;
        hdr.top_k = (uint32_t)p->top_k;
        hdr.flags = LOOM_MOE_TRACE_WEIGHTS;
        hdr.nranks = (uint32_t)p->nranks;
        hdr.rank = (uint32_t)p->rank;
        res = loom_moe_trace_writer_open(p->trace.path, &hdr, &p->trace.writer);
    }
    /* Weights where the id is -1 are the caller's don't-care values: the file holds 0 there. */
    size_t n = num_tokens * (size_t)p->top_k;
    float *w = malloc((n ? n : 1) * sizeof(float));
    if (res == loomSuccess && w == NULL) {
        LOOM_WARN("LOOM_MOE_TRACE_FILE: out of memory for %zu weights", n);
        res = loomSystemError;
    }
    if (res == loomSuccess) {
        for (size_t i = 0; i < n; i++)
            w[i] = topk[i] >= 0 ? weights[i] : 0.0f;
        loom_moe_trace_batch_t b = {0};
        b.step = (uint32_t)step;
        b.layer = p->trace.layer;
        b.num_tokens = (uint32_t)num_tokens;
        b.topk = (int32_t *)topk;
        b.weight = w;
        res = loom_moe_trace_writer_append(p->trace.writer, &b);
    }
    free(w);
    if (res != loomSuccess) {
        /* The writer has WARNed the cause; this says what follows, once: tracing ends here. */
        LOOM_WARN("LOOM_MOE_TRACE_FILE: rank %d stops tracing to %s after layout %llu (%s); the "
                  "layouts go on",
                  p->rank, p->trace.path, (unsigned long long)step, loomGetErrorString(res));
        tracing_off(p);
    }
}

void loom_moe_tracing_stop(struct loomMoePlan *p)
{
    if (p->trace.writer != NULL && loom_moe_trace_writer_close(p->trace.writer) != loomSuccess)
        LOOM_WARN("LOOM_MOE_TRACE_FILE: closing %s failed on rank %d: its last records may be "
                  "lost",
                  p->trace.path, p->rank);
    p->trace.writer = NULL;
    tracing_off(p);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_perf_models.c - shard_perf's parameter lists: GPT-2 shapes in llm.c's per-layer order
 * (ln1 w/b, qkv and its bias, attention projection and its bias, ln2 w/b, fc and its bias, fc
 * projection and its bias), the four weight matrices labelled loomShardMatrix and everything
 * else loomShardElementwise, one bucket per layer and a last one for the (tied) token
 * embedding, the position embedding and the final LayerNorm. The last bucket comes after the
 * layers because buckets may not decrease along the list. Also the plan of a list.
 */
#include <string.h>

#include "shard_perf.h"

const char *const k_model_names[] = {"gpt-tiny", "gpt-cpu", "gpt2-124m"};

static const struct {
    int layers;
    size_t C, V, T;
} k_shapes[NUM_MODELS] = {{4, 128, 256, 128}, {6, 384, 256, 256}, {12, 768, 50257, 1024}};

static void add(sp_model_t *m, size_t rows, size_t cols, loomShardKind_t kind, int bucket)
{
    m->params[m->nparams++] =
        (loomShardParam_t){.rows = rows, .cols = cols, .kind = kind, .owner = -1, .bucket = bucket};
}

void sp_model_build(int model, sp_model_t *m)
{
    const size_t C = k_shapes[model].C;
    const int L = k_shapes[model].layers;
    *m = (sp_model_t){.name = k_model_names[model],
                      .layers = L,
                      .C = C,
                      .V = k_shapes[model].V,
                      .T = k_shapes[model].T,
                      .nbuckets = L + 1};
    m->params = sp_alloc((size_t)L * 12 + 4, sizeof(loomShardParam_t));
    const loomShardKind_t E = loomShardElementwise, M = loomShardMatrix;
    for (int l = 0; l < L; l++) {
        add(m, C, 1, E, l); /* ln1 w, b */
        add(m, C, 1, E, l);
        add(m, C, 3 * C, M, l); /* qkv */
        add(m, 3 * C, 1, E, l);
        add(m, C, C, M, l); /* attention projection */
        add(m, C, 1, E, l);
        add(m, C, 1, E, l); /* ln2 w, b */
        add(m, C, 1, E, l);
        add(m, C, 4 * C, M, l); /* fc */
        add(m, 4 * C, 1, E, l);
        add(m, 4 * C, C, M, l); /* fc projection */
        add(m, C, 1, E, l);
    }
    add(m, m->V, C, E, L); /* wte, also the LM head */
    add(m, m->T, C, E, L); /* wpe */
    add(m, C, 1, E, L);    /* final LayerNorm w, b */
    add(m, C, 1, E, L);
}

void sp_model_free(sp_model_t *m)
{
    free(m->params);
    m->params = NULL;
}

size_t sp_model_elems(const sp_model_t *m, loomShardKind_t kind)
{
    size_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i].kind == kind)
            n += m->params[i].rows * m->params[i].cols;
    return n;
}

/* The plan of m on nranks ranks for a LAY_* layout; balance matters for Owner only. */
loomShardPlan_t sp_plan(const sp_model_t *m, int nranks, int layout, int balance, int deterministic)
{
    loomShardConfig_t cfg = LOOM_SHARD_CONFIG_INITIALIZER;
    cfg.layout = layout == LAY_OWNER        ? loomShardOwner
                 : layout == LAY_REPLICATED ? loomShardReplicated
                                            : loomShardRows;
    cfg.rows_bucketed = layout == LAY_ROWS_BUCKETED;
    cfg.balance = (loomShardBalance_t)balance;
    cfg.deterministic = deterministic;
    loomShardPlan_t plan = NULL;
    SP_CHECK(loomShardPlanCreate(&plan, m->params, m->nparams, nranks, &cfg));
    return plan;
}

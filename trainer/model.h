/* SPDX-License-Identifier: Apache-2.0
 *
 * model.h - loom-train's GPT and how one rank holds its part of it.
 *
 * The model: token and position embeddings, L pre-LayerNorm blocks (causal multi-head attention
 * with separate Q, K, V and output projections; a GELU MLP of width 4C), a final LayerNorm and
 * an LM head tied to the token embedding. Linear layers have no bias.
 *
 * The global parameter vector (what one process holds, what --dump-params writes) is the
 * concatenation, in this order, of wte[V][C], wpe[T][C], then per layer ln1.w[C], ln1.b[C],
 * wq[C][C], wk[C][C], wv[C][C], wo[C][C], ln2.w[C], ln2.b[C], wup[C][4C], wdown[4C][C], then
 * lnf.w[C], lnf.b[C]. A mixture-of-experts block (--moe E:k) holds E experts' wup and wdown
 * stacked (wup[E*C][4C], wdown[E*4C][C], expert e's rows first at e*C and e*4C) and then the router
 * wr[C][E]. Element i of it is initialised from (seed, i) alone, so every shard of any
 * layout holds the values one process would.
 *
 * A rank holds units: the embedding unit (wte, wpe) on the first pipeline stage, one unit per
 * block of its stage, and the final unit (lnf, plus a copy of wte for the tied head when there
 * are several stages) on the last stage; a MoE block's experts (those of the rank's EP position)
 * are a unit of their own after its block's. Units are the buckets of gradient reduction and the
 * granularity of ZeRO sharding. Inside a unit, tensors are packed in the order above; each
 * unit's length is padded to a multiple of the data-parallel degree so that its shards are equal
 * ranges. Tensor parallelism splits wq, wk, wv and wup by columns (whole heads, whole slices of
 * the MLP) and wo and wdown by rows; everything else is replicated across the TP group.
 */
#ifndef LOOM_TRAINER_MODEL_H
#define LOOM_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int vocab;  /* 256: bytes */
    int ctx;    /* sequence length T (and rows of wpe) */
    int d;      /* model width C */
    int heads;  /* attention heads */
    int layers; /* blocks */
    uint64_t seed;
    int moe_e, moe_k; /* --moe E:k: experts and experts per token (moe_e 0: no MoE) */
    int moe_every;    /* block l is a mixture of experts iff l % moe_every == moe_every - 1 */
} model_cfg_t;

/* One rank's position in the grid of parallel degrees. */
typedef struct {
    int dp, tp, pp, cp;         /* degrees */
    int dp_i, tp_i, pp_i, cp_i; /* this rank's coordinates */
    int ep, ep_i;               /* expert parallelism inside the data group: ep_i = dp_i % ep */
} grid_pos_t;

enum tensor_kind {
    TK_WTE,
    TK_WPE,
    TK_LN1W,
    TK_LN1B,
    TK_WQ,
    TK_WK,
    TK_WV,
    TK_WO,
    TK_LN2W,
    TK_LN2B,
    TK_WUP,
    TK_WDOWN,
    TK_WR, /* a mixture-of-experts block's router */
    TK_LNFW,
    TK_LNFB,
    TK_COUNT
};
#define BLOCK_TENSORS 10 /* TK_LN1W .. TK_WDOWN */
#define MOE_SHARED    9  /* a MoE block's unit: TK_LN1W .. TK_LN2B, then TK_WR */

enum split { SPLIT_NONE, SPLIT_COLS, SPLIT_ROWS };

/* One tensor as this rank holds it. */
typedef struct {
    int kind, layer; /* layer -1 for the embeddings and the final unit */
    int expert;      /* a MoE block's TK_WUP / TK_WDOWN: the expert it belongs to; else -1 */
    int rows, cols;  /* local shape */
    int grow, gcols; /* global shape */
    int r0, c0;      /* where the local block starts in the global tensor */
    size_t goff;     /* offset of the global tensor in the global vector */
    size_t off;      /* offset in this rank's unit-packed local vector */
    int decay;       /* AdamW weight decay applies (matrices) */
    int counted;     /* this rank is the one that counts these elements (norms, dumps) */
} ltensor_t;

/* UNIT_EXPERTS: the experts a rank holds of a MoE block (reduced over the replicas of the same
 * experts, not over the whole data group). */
enum unit_kind { UNIT_EMB, UNIT_BLOCK, UNIT_EXPERTS, UNIT_FINAL };

typedef struct {
    int kind, layer;
    int t0, nt;    /* tensors [t0, t0 + nt) of the rank's table */
    size_t off;    /* offset of the unit in the local vector */
    size_t len;    /* elements of its tensors */
    size_t padded; /* len rounded up to a multiple of the shard count */
} unit_t;

typedef struct {
    model_cfg_t cfg;
    grid_pos_t g;
    int shards;      /* ZeRO shard count: the data group's size (dp * cp) */
    int l0, l1;      /* this stage's layers [l0, l1) */
    int first, last; /* this rank is on the first / last pipeline stage */
    int cl, hl, fl;  /* local attention width C/tp, local heads H/tp, local MLP width 4C/tp */
    ltensor_t *t;
    int nt;
    unit_t *u;
    int nu;
    size_t total;      /* local vector length, padding included */
    size_t global_len; /* length of the global parameter vector */
    int nle;           /* experts this rank holds of each MoE block */
    int32_t *erank;    /* [layers][moe_e]: the EP rank holding each expert */
    int *ub, *ue;      /* per local layer: its block unit and its experts' unit (-1: dense) */
} layout_t;

/* Checks the configuration and the grid; on error writes a message to err and returns -1. */
int layout_check(const model_cfg_t *cfg, const grid_pos_t *g, char *err, size_t errlen);
/* Builds the rank's tables. Returns 0, or -1 on allocation failure. */
int layout_build(layout_t *lay, const model_cfg_t *cfg, const grid_pos_t *g, int shards);
void layout_free(layout_t *lay);

/* The index of a block tensor in the rank's table: tensor k (TK_LN1W..TK_WDOWN, TK_WR) of layer
 * l; in a MoE block, only the shared ones (TK_LN1W..TK_LN2B, TK_WR). */
const ltensor_t *layout_block_tensor(const layout_t *lay, int layer, int kind);
/* Local expert j's TK_WUP or TK_WDOWN of MoE block l (local experts in ascending global id). */
const ltensor_t *layout_expert_tensor(const layout_t *lay, int layer, int j, int kind);
/* The unit holding layer l's block, its experts (NULL if dense), the embedding unit, the final
 * unit (NULL if not here). */
const unit_t *layout_block_unit(const layout_t *lay, int layer);
const unit_t *layout_expert_unit(const layout_t *lay, int layer);
/* Block l is a mixture of experts. */
int layout_is_moe(const model_cfg_t *cfg, int layer);
/* Gives MoE block l the placement expert_rank[moe_e] (each EP rank keeping its count of experts):
 * the rank's expert tensors are renamed to the experts it now holds. Their values are the
 * caller's to move. */
void layout_place(layout_t *lay, int layer, const int32_t *expert_rank);
const unit_t *layout_unit_of(const layout_t *lay, int kind);

/* Global index of local element (i, j) of tensor t. */
static inline size_t ltensor_global(const ltensor_t *t, int i, int j)
{
    return t->goff + (size_t)(t->r0 + i) * (size_t)t->gcols + (size_t)(t->c0 + j);
}

/* The initial value of global element i (depends on seed, i and the tensor it falls in). */
float model_init_value(const model_cfg_t *cfg, size_t gi);
/* Fills the local vector p[lay->total] with the initial values (padding = 0). */
void layout_init_params(const layout_t *lay, float *p);
/* Calls fn(t, lo, hi, arg) for each tensor piece that falls in local range [a, b): lo and hi
 * are offsets into the local vector. Padding is skipped. */
void layout_for_range(const layout_t *lay, size_t a, size_t b,
                      void (*fn)(const ltensor_t *t, size_t lo, size_t hi, void *arg), void *arg);

#endif

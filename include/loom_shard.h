/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_shard.h - owner-shaped sharding for matrix optimizers (docs/shard.md).
 *
 * A plan places each 2-D matrix whole on one owner rank, balanced by its
 * Newton-Schulz cost, and splits element-wise parameters (vectors,
 * embeddings, the LM head) evenly. Gradients reach the owners with one
 * uneven reduce-scatter per bucket (loomReduceScatterV), each owner runs
 * Muon on its own matrices and AdamW on its element-wise pieces with no
 * communication, and the parameters come back with one uneven all-gather per
 * bucket (loomAllGatherV). Two other layouts share every kernel: Rows (FSDP2
 * Shard(0), the all-gather-before-Newton-Schulz baseline) and Replicated
 * (DDP Muon). Does not: split one matrix across owners, run forward or
 * backward, or choose which parameters are matrices (the caller labels
 * them).
 *
 * Buffers are float32. The "full" buffer of a plan holds every parameter in
 * plan order (loomShardParamInfo gives each one's offset; every parameter is
 * contiguous there); a rank's "shard" is the packed concatenation, bucket by
 * bucket, of the segments that rank owns (loomShardRankInfo: shard_elems).
 * The plan functions, introspection, pack/unpack and kernels are local,
 * synchronous and thread safe on distinct outputs; a plan is immutable and
 * may be shared by threads.
 */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loomShardPlan *loomShardPlan_t;

typedef enum {
    loomShardMatrix = 0,     /* whole on one owner; Muon */
    loomShardElementwise = 1 /* split evenly over the ranks; AdamW */
} loomShardKind_t;

typedef enum {
    loomShardOwner = 0,     /* each matrix whole on its owner (the default) */
    loomShardRows = 1,      /* FSDP2 Shard(0): row chunks of ceil(rows/P), padded; the step
                               all-gathers each pre-Newton-Schulz update (the baseline) */
    loomShardReplicated = 2 /* DDP: AllReduce, every rank steps every parameter */
} loomShardLayout_t;

typedef enum {
    loomShardBalanceNsCost = 0, /* ns_steps * s*s * (2l+s) multiply-adds, s/l the short/long side */
    loomShardBalanceNumel = 1,  /* rows * cols */
    loomShardBalanceRoundRobin = 2 /* by numel descending, owner = position mod P */
} loomShardBalance_t;

typedef struct {
    size_t rows, cols;    /* row-major shape, both >= 1; a vector is (n, 1) */
    loomShardKind_t kind; /* the caller decides; shapes are never used to guess */
    int owner;            /* -1: the planner chooses; 0..P-1: fixed (Matrix only) */
    int bucket;           /* >= 0, non-decreasing along the list */
} loomShardParam_t;

#define LOOM_SHARD_CONFIG_MAGIC 0x4c6d5368u
/* Options of loomShardPlanCreate; start from LOOM_SHARD_CONFIG_INITIALIZER. */
typedef struct {
    size_t size;                /* sizeof(loomShardConfig_t), set by the initializer */
    unsigned int magic;         /* LOOM_SHARD_CONFIG_MAGIC */
    unsigned int version;       /* LOOM_VERSION_CODE of the headers the caller built with */
    loomShardLayout_t layout;   /* Owner (default) | Rows | Replicated */
    loomShardBalance_t balance; /* NsCost (default) */
    int ns_steps;               /* Newton-Schulz steps for the cost model, >= 1; 5 */
    size_t max_rank_bytes;      /* 0: no cap; else param + grad + state bytes one rank may own */
    int deterministic;          /* 1: every gradient reduction sums ranks in order 0..P-1 (direct
                                   V collectives) so results are bitwise those of one process */
    int agree;                  /* 1: ReduceGrads ends with a status agreement, so either every
                                   rank has its gradients or every rank returns the error */
    int rows_bucketed;          /* Rows only: 1 = one in-step all-gather per bucket, 0 = per
                                   matrix (torch's behaviour) */
} loomShardConfig_t;

#define LOOM_SHARD_CONFIG_INITIALIZER                                                              \
    {                                                                                              \
        sizeof(loomShardConfig_t), LOOM_SHARD_CONFIG_MAGIC, LOOM_VERSION_CODE, loomShardOwner,     \
            loomShardBalanceNsCost, 5, 0, 1, 1, 0                                                  \
    }

/* ---- Plan (local, no communication) ------------------------------------- */

/* Builds the plan for nparams parameters on nranks ranks. Pure: the same
 * input gives the same bytes (and fingerprint) on every rank.
 * Errors: InvalidArgument (NULL, nparams < 1, nranks < 1, a zero or
 * overflowing shape, owner >= nranks on a Matrix or owner >= 0 on an
 * Elementwise, a decreasing bucket, a max_rank_bytes no assignment meets:
 * the message names the first matrix that fits nowhere), InvalidUsage (a
 * config with a wrong size, magic or version, ns_steps < 1), SystemError. */
LOOM_API loomResult_t loomShardPlanCreate(loomShardPlan_t *plan, const loomShardParam_t *params,
                                          int nparams, int nranks, const loomShardConfig_t *config);
LOOM_API loomResult_t loomShardPlanDestroy(loomShardPlan_t plan);
/* Collective: checks that every rank of comm built the same plan (the
 * fingerprint) and that comm has nranks ranks. A mismatch returns
 * InvalidUsage on every rank, with a message naming the ranks that differ. */
LOOM_API loomResult_t loomShardPlanVerify(loomShardPlan_t plan, loomComm_t comm,
                                          loomStream_t stream);

/* ---- Introspection (local) ---------------------------------------------- */

typedef struct {
    int nmatrices;      /* matrices owned (Owner), touched (Rows) or stepped (Replicated) */
    size_t shard_elems; /* length of this rank's packed shard */
    size_t state_elems; /* float32 optimizer-state elements: momentum + Adam m, v */
    double ns_cost;     /* Newton-Schulz multiply-adds this rank runs per step */
    size_t owned_bytes; /* param + grad + state bytes held at rest */
} loomShardRankInfo_t;

typedef struct {
    int nranks, nbuckets;
    size_t total_elems, matrix_elems, elementwise_elems;
    size_t padded_elems;        /* N_pad: Rows' padded total (= total_elems for Owner/Replicated) */
    size_t padded_matrix_elems; /* N_M,pad: the matrices' part of it */
    double cost_total, cost_max, cost_mean;
    double cost_bound;                   /* mean + (1 - 1/P) * the largest matrix cost */
    double bytes_imbalance;              /* max / mean owned_bytes */
    double step_bytes_per_rank;          /* mean send bytes of ReduceGrads + Step + GatherParams */
    double baseline_step_bytes_per_rank; /* the same for the Rows layout of this list */
    uint64_t fingerprint;                /* FNV-1a over (P, config, params, offsets) */
} loomShardStats_t;

/* owner: the owning rank of a Matrix under Owner, -1 when the parameter is
 * split (Elementwise, or any parameter under Rows) or everywhere
 * (Replicated); offset: its first element in the full buffer. Either may be
 * NULL. Errors: InvalidArgument. */
LOOM_API loomResult_t loomShardParamInfo(loomShardPlan_t plan, int param, int *owner,
                                         size_t *offset);
/* Where `rank` holds parameter `param` in its packed shard: the parameter's elements [*first,
 * *first + *count) (row-major) sit at offset *shard_off of the shard; *count is 0 where the rank
 * holds none of it. Every layout gives at most one contiguous run per rank and parameter (Owner:
 * a matrix whole on its owner, a range of an element-wise one; Rows: a range of rows;
 * Replicated: all of it), so per-parameter work on shards (a norm that skips a tied copy, masks)
 * needs no knowledge of the layout. Any output may be NULL. Errors: InvalidArgument. */
LOOM_API loomResult_t loomShardParamPiece(loomShardPlan_t plan, int rank, int param,
                                          size_t *shard_off, size_t *first, size_t *count);
LOOM_API loomResult_t loomShardRankInfo(loomShardPlan_t plan, int rank, loomShardRankInfo_t *info);
LOOM_API loomResult_t loomShardStats(loomShardPlan_t plan, loomShardStats_t *stats);
/* model_order holds the parameters back to back in list order; plan_order
 * is the full buffer. Out of place only. Errors: InvalidArgument (NULL, a
 * datatype other than loomFloat32, equal or overlapping buffers). */
LOOM_API loomResult_t loomShardPack(loomShardPlan_t plan, const void *model_order, void *plan_order,
                                    loomDataType_t datatype);
LOOM_API loomResult_t loomShardUnpack(loomShardPlan_t plan, const void *plan_order,
                                      void *model_order, loomDataType_t datatype);

/* ---- Communication (bucket -1: every bucket, in one group) --------------- */

/* Every rank passes its full gradient buffer (plan order); rank r receives
 * the reduced values of its shard. In place when grad_shard == grads_full:
 * the results land in r's own segments of the full buffer and the rest of it
 * is left undefined. op: loomSum or loomAvg (sum, then divide once). For
 * Replicated every rank receives everything (an AllReduce). Errors:
 * InvalidArgument, InvalidUsage (comm size != nranks, bucket out of range),
 * and those of the collectives (RemoteError, Timeout). With agree, an error
 * on any rank is returned on every rank. */
LOOM_API loomResult_t loomShardReduceGrads(loomShardPlan_t plan, int bucket, const void *grads_full,
                                           void *grad_shard, loomDataType_t datatype,
                                           loomRedOp_t op, loomComm_t comm, loomStream_t stream);
/* Every rank contributes its shard; every rank ends with the full buffer.
 * In place when param_shard == params_full (the shard's values then sit in
 * the rank's own segments). A no-op for Replicated. */
LOOM_API loomResult_t loomShardGatherParams(loomShardPlan_t plan, int bucket,
                                            const void *param_shard, void *params_full,
                                            loomDataType_t datatype, loomComm_t comm,
                                            loomStream_t stream);

/* ---- Optimizer ---------------------------------------------------------- */

typedef enum {
    loomMuonLerp = 0,      /* B += (1 - beta)(G - B)   (torch.optim.Muon) */
    loomMuonAccumulate = 1 /* B = mu B + G              (Keller's Muon) */
} loomMuonMomentum_t;

typedef enum {
    loomMuonScaleOriginal = 0,   /* sqrt(max(1, rows/cols))    (torch, Keller) */
    loomMuonScaleMatchAdamW = 1, /* 0.2 * sqrt(max(rows, cols)) (Moonlight) */
    loomMuonScaleSpectral = 2,   /* sqrt(rows/cols)            (Dion) */
    loomMuonScaleNone = 3
} loomMuonLrScale_t;

#define LOOM_MUON_CONFIG_MAGIC 0x4c6d4d75u
/* Options of the step and of loomMuonUpdate; start from
 * LOOM_MUON_CONFIG_INITIALIZER. */
typedef struct {
    size_t size;
    unsigned int magic;               /* LOOM_MUON_CONFIG_MAGIC */
    unsigned int version;             /* LOOM_VERSION_CODE */
    float lr, momentum, weight_decay; /* Muon: 0.02, 0.95, 0 */
    int nesterov;                     /* 1 */
    loomMuonMomentum_t momentum_form; /* Lerp */
    loomMuonLrScale_t lr_scale;       /* Original */
    int ns_steps;                     /* 5 */
    const float *ns_coeffs;           /* NULL: (3.4445, -4.7750, 2.0315) every step; else
                                         ns_steps x 3, one (a, b, c) per step */
    float ns_eps;                     /* 1e-7: divide by max(||U||_F, eps) */
    float adam_lr, adam_beta1, adam_beta2, adam_eps, adam_weight_decay; /* 3e-4 .9 .95 1e-8 0 */
    long step;   /* 1-based, for AdamW's bias correction */
    int threads; /* matrices stepped in parallel (BLAS one thread inside); 1 */
} loomMuonConfig_t;

#define LOOM_MUON_CONFIG_INITIALIZER                                                               \
    {                                                                                              \
        sizeof(loomMuonConfig_t), LOOM_MUON_CONFIG_MAGIC, LOOM_VERSION_CODE, 0.02f, 0.95f, 0.0f,   \
            1, loomMuonLerp, loomMuonScaleOriginal, 5, NULL, 1e-7f, 3e-4f, 0.9f, 0.95f, 1e-8f,     \
            0.0f, 1, 1                                                                             \
    }

/* params / grads point at the full plan-order buffer (else at the rank's
 * packed shard, as ReduceGrads writes it out of place). */
#define LOOM_SHARD_PARAMS_FULL 0x1u
#define LOOM_SHARD_GRADS_FULL  0x2u

/* Float32 optimizer-state elements `rank` must provide (all buckets), to be
 * zeroed before step 1. 0 for a bad plan or rank. */
LOOM_API size_t loomShardStateElems(loomShardPlan_t plan, int rank);
/* One optimizer step for `rank` (bucket -1: all): Muon on its matrices,
 * AdamW on its element-wise pieces; with a FULL flag only this rank's
 * segments are read or written. Owner and Replicated never communicate
 * (comm may be NULL); Rows all-gathers each pre-Newton-Schulz update (per
 * matrix, or per bucket with rows_bucketed) and needs comm with rank ==
 * its rank. Errors: InvalidArgument, InvalidUsage (a bad Muon config,
 * ns_steps < 1, step < 1), those of the collectives for Rows. */
LOOM_API loomResult_t loomShardStep(loomShardPlan_t plan, int rank, int bucket, void *params,
                                    const void *grads, float *state, unsigned int flags,
                                    const loomMuonConfig_t *config, loomComm_t comm,
                                    loomStream_t stream);
/* QK-clip and the like: multiplies rows [row0, row0 + n) of parameter
 * `param` by scale[0..n) wherever `rank` holds them (the owner: whole rows;
 * Rows and Elementwise: its local part). Local. */
LOOM_API loomResult_t loomShardScaleRows(loomShardPlan_t plan, int rank, void *params,
                                         unsigned int flags, int param, size_t row0, size_t n,
                                         const float *scale);

/* ---- Kernels usable on their own (local; float32; BLAS) ------------------ */

/* Floats of workspace loomNewtonSchulz needs for a rows x cols input. */
LOOM_API size_t loomNewtonSchulzWorkspace(size_t rows, size_t cols);
/* out = NS(in): X = in / max(||in||_F, eps), then `steps` quintic iterations
 * A = X X^T, B = b A + c A A, X = a X + B X on the wide orientation (rows >
 * cols works on the transpose, without a copy). out may equal in. coeffs:
 * NULL for the default, else steps x 3. Errors: InvalidArgument. */
LOOM_API loomResult_t loomNewtonSchulz(float *out, const float *in, size_t rows, size_t cols,
                                       int steps, const float *coeffs, float eps, float *work);
/* One Muon update of one matrix: momentum, Nesterov, NS, decoupled weight
 * decay, scaled step (docs/shard.md gives the exact operation order). work
 * holds rows*cols + loomNewtonSchulzWorkspace(rows, cols) floats. */
LOOM_API loomResult_t loomMuonUpdate(float *param, const float *grad, float *momentum, size_t rows,
                                     size_t cols, const loomMuonConfig_t *config, float *work);
/* One AdamW update of n elements (torch.optim.AdamW's order, config->step
 * for the bias correction). m and v start at zero. */
LOOM_API loomResult_t loomAdamWUpdate(float *param, const float *grad, float *m, float *v, size_t n,
                                      const loomMuonConfig_t *config);

/* ---- Counters (this process, this plan) --------------------------------- */

typedef struct {
    uint64_t reduce_calls, gather_calls, step_calls;
    uint64_t step_collectives;       /* collectives issued inside loomShardStep */
    uint64_t bytes_sent, bytes_recv; /* logical payload, from the counts passed down */
    double comm_seconds, ns_seconds, step_seconds;
} loomShardCounters_t;
LOOM_API loomResult_t loomShardGetCounters(loomShardPlan_t plan, loomShardCounters_t *counters,
                                           int reset);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SHARD_H */

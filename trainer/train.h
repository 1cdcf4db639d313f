/* SPDX-License-Identifier: Apache-2.0
 *
 * train.h - the pieces of loom-train and how they meet: options, the grid of communicators,
 * the parameter engine (DP, ZeRO-1/2/3), one micro-batch's activations, the stage's forward and
 * backward, the pipeline schedules, data and checkpoints. Each .c file owns one of them.
 */
#ifndef LOOM_TRAINER_TRAIN_H
#define LOOM_TRAINER_TRAIN_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"
#include "loom_echo.h"
#include "loom_moe.h"
#include "loom_shard.h"
#include "model.h"

/* calloc of n elements of sz bytes (at least one), or exit with a message: the trainer has no
 * use for a run that cannot hold its state (alloc.c). */
void *train_calloc(size_t n, size_t sz);

/* ---- Options (main.c) ---------------------------------------------------------------------- */

/* The pipeline schedules, in --pp-schedule's spelling: one line each (enum and name).
 * SCHED_DUALPIPE: the bidirectional pipeline (schedule_dualpipe.c). */
#define TRAIN_SCHEDULES(X)                                                                         \
    X(SCHED_1F1B, "1f1b")                                                                          \
    X(SCHED_GPIPE, "gpipe")                                                                        \
    X(SCHED_ZB_H1, "zb-h1")                                                                        \
    X(SCHED_ZB_H2, "zb-h2")                                                                        \
    X(SCHED_DUALPIPE, "dualpipe")
#define TRAIN_SCHED_ENUM(e, name) e,
enum schedule { TRAIN_SCHEDULES(TRAIN_SCHED_ENUM) SCHED_COUNT };
#undef TRAIN_SCHED_ENUM
/* The name of each schedule (main.c). */
extern const char *const schedule_names[SCHED_COUNT];
enum optim { OPTIM_ADAMW, OPTIM_MUON };
/* --shard: ZeRO-1's sharded AdamW, or loom_shard's layouts for Muon (none: DDP Muon) */
enum shard_mode { SHARD_UNSET = -1, SHARD_NONE, SHARD_ZERO1, SHARD_OWNER, SHARD_ROWS };
enum tp_reduce { TP_FP32, TP_ECHO };

typedef struct {
    model_cfg_t model;
    int dp, tp, pp, cp;
    int sp;    /* --sp: Ulysses sequence parallelism over the grid's cp dimension (1: none; when
                  > 1, cp == sp and attention is ulysses.c's instead of the ring) */
    int zero;  /* 0 (plain DP), 1, 2, 3 */
    int batch; /* global batch, in sequences */
    int micro; /* micro-batches per step on each rank */
    int steps;
    int schedule;
    int tp_reduce;
    int overlap; /* DP/ZeRO-1 gradient reduction on a stream during the backward */
    double lr, beta1, beta2, eps, wd, clip;
    int warmup;       /* steps of linear learning-rate warmup */
    const char *data; /* corpus file */
    double val_frac;  /* tail of the corpus kept for validation */
    int val_every, val_batches;
    const char *save, *resume, *log_json, *dump_params;
    const char *dump_grads, *dump_batch; /* the first step's gradients and global batch */
    int quiet;
    int ep;         /* --ep: expert-parallel degree inside the data group (MoE) */
    double moe_aux; /* --moe-aux: the load-balancing loss's coefficient */
    int moe_mode;   /* --moe-mode: loomMoeModeDedup or loomMoeModeNaive */
    int moe_place;  /* --moe-place coselect:N: re-place the experts every N steps (0: static) */
    const char *moe_trace;  /* --moe-trace PREFIX: the routing, as LMTR v1 trace files */
    const char *moe_replay; /* --moe-replay FILE: the routing forced from such a file */
    int optim;              /* --optim: OPTIM_ADAMW or OPTIM_MUON */
    int shard;              /* --shard: enum shard_mode, resolved by main.c (never UNSET after) */
    double muon_lr, muon_momentum;   /* --muon-lr, --muon-momentum: Muon's matrices */
    int diloco;                      /* --diloco H: an outer step every H inner steps (0: off) */
    double outer_lr, outer_momentum; /* --outer-lr, --outer-momentum: DiLoCo's Nesterov */
    int diloco_echo;                 /* --diloco-echo: the deltas' all-reduce through Echo */
    int diloco_sim;  /* --diloco-sim R: R replicas one after the other in this one process */
    int grad_halves; /* --grad-halves: the two halves of the micro-batches accumulate apart */
    int elastic;     /* --elastic: survivors of a dead rank go on (elastic.c) */
    int save_every;  /* --save-every N: --save after every N steps (0: at the end) */
    int kill_rank, kill_step; /* --elastic-kill-rank/-step (tests): that rank dies in that step */
} opts_t;

/* Parses the command line into o (options.c): defaults, values, and the checks of every mode;
 * on a bad or refused option prints why and returns -1 (--help: prints the usage and exits). */
int opts_parse(int argc, char **argv, opts_t *o);

/* ---- Communicators and counters (comm.c) --------------------------------------------------- */

/* P_SP: Ulysses' all-to-alls around attention (ulysses.c); P_MIRROR: the sum of DualPipe's two
 * copies of a stage (schedule_dualpipe.c) */
enum purpose { P_TP, P_CP, P_PP, P_DATA, P_TIE, P_MISC, P_SP, P_MIRROR, P_COUNT };
/* K_SHARD*: loom_shard's ReduceGrads and GatherParams of one unit (or all of them), and the
 * collectives its Step issues (the Rows layout's gathers of the pre-Newton-Schulz update) */
enum ckind {
    K_ALLREDUCE,
    K_ECHO,
    K_REDUCESCATTER,
    K_ALLGATHER,
    K_SEND,
    K_RECV,
    K_SHARDREDUCE,
    K_SHARDGATHER,
    K_SHARDSTEP,
    K_ALLTOALL,
    K_COUNT
};

/* --elastic: where a failed collective unwinds to (elastic.c arms it around the training steps),
 * and what failed. */
typedef struct {
    jmp_buf jb;
    const char *what;
    double t; /* when the failure was seen */
} tc_recover_t;

typedef struct {
    loomComm_t world, tp, cp, data, tie; /* tie: first and last stage (NULL elsewhere or pp 1) */
    loomComm_t ep;  /* the MoE blocks' expert-parallel group (one rank without --ep) */
    loomComm_t edp; /* the replicas of this rank's experts: data / ep (data itself at ep 1) */
    int edp_rank;   /* position in edp */
    int rank, size;
    grid_pos_t g;
    int data_rank, data_size; /* position in the data group (dp x cp) */
    int pp_prev, pp_next;     /* world ranks of the neighbouring stages, -1 if none */
    int cp_prev, cp_next;     /* ranks in cp */
    loomStream_t stream;      /* gradient reduction during the backward */
    int use_echo;             /* TP_ECHO: row-parallel outputs go through Echo */
    loomEchoState_t echo;     /* the residual stream's feedback state */
    size_t echo_count;
    uint64_t calls[P_COUNT][K_COUNT], bytes[P_COUNT][K_COUNT];
    double comm_s;         /* seconds spent waiting in communication */
    double pp_wait_s;      /* of which waiting on the pipeline neighbours */
    tc_recover_t *recover; /* --elastic, during the steps: a RemoteError unwinds to it */
    int kill_after;        /* --elastic-kill-rank: raise SIGKILL before the n-th data-group
                              collective from now (0: never) */
} tcomm_t;

/* Exits the process with the loom error after printing what failed; under --elastic, while
 * c->recover is armed, a loomRemoteError (a peer died, or a survivor revoked) unwinds the step to
 * it instead. */
void tc_check(loomResult_t r, const tcomm_t *c, const char *what);
int tc_init(tcomm_t *c, const opts_t *o);
/* The grid over c->world (which tc_init made, or a shrink): positions, the split communicators
 * and the stream. 0, or -1 with a message (c->world destroyed). */
int tc_grid(tcomm_t *c, const opts_t *o);
void tc_free(tcomm_t *c);
double tc_now(void);
/* Blocking (stream NULL) or queued collectives on float32, counted under purpose p. */
void tc_allreduce(tcomm_t *c, int p, loomComm_t comm, float *buf, size_t n, loomStream_t s);
void tc_allreduce_d(tcomm_t *c, int p, loomComm_t comm, double *buf, size_t n);
void tc_reduce_scatter(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv,
                       size_t recvcount, loomStream_t s);
void tc_allgather(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv,
                  size_t sendcount);
void tc_allgather_d(tcomm_t *c, int p, loomComm_t comm, const double *send, double *recv,
                    size_t sendcount);
/* The TP all-reduce of a row-parallel layer's output (fp32 or Echo) / of an input gradient. */
void tc_tp_forward(tcomm_t *c, float *buf, size_t n, int eval);
void tc_tp_backward(tcomm_t *c, float *buf, size_t n);
/* One grouped exchange: sends (s1, s2) to peer `to` and receives (r1, r2) from `from`, each
 * n floats; s2/r2 may be NULL. pp chooses the counters and the pipeline wait clock. */
void tc_exchange(tcomm_t *c, int p, loomComm_t comm, int to, const float *s1, const float *s2,
                 int from, float *r1, float *r2, size_t n);
/* Pipeline point to point (world ranks); either side may be absent (-1 / NULL). */
/* Blocking loomAllToAll of float32: block j (n floats) of send goes to rank j; the bytes counted
 * are the whole send buffer (n x comm size x 4), the block this rank keeps included. */
void tc_alltoall(tcomm_t *c, int p, loomComm_t comm, const float *send, float *recv, size_t n);
void tc_pp(tcomm_t *c, int to, const float *send, size_t sn, int from, float *recv, size_t rn);
/* Several pipeline sends and receives (world ranks) as one group, counted and timed as tc_pp:
 * an op sends buf to peer when send is set, else receives into it. Sends to and receives from
 * one peer match in the order posted. */
typedef struct {
    int peer, send;
    float *buf;
    size_t n;
} tc_p2p_t;
void tc_pp_many(tcomm_t *c, const tc_p2p_t *ops, int n);
void tc_stream_sync(tcomm_t *c);

/* ---- Parameters, gradients and optimizer (engine.c) ---------------------------------------- */

typedef struct {
    const opts_t *o;
    layout_t lay;
    tcomm_t *c;
    int zero, shards, srank;
    float *params; /* full local vector (zero < 3) or the rank's shards (zero 3) */
    float *grads;  /* full local vector (zero < 2) or the rank's shards (zero 2, 3) */
    float *gshard; /* zero 1: the reduced gradients of the rank's shards; Muon: of its shard
                      of the plan (muon.c) */
    float *ghalf;  /* --grad-halves: the second half's accumulator (full local vector) */
    int half;      /* --grad-halves: the micro-batch in backward is of the second half */
    float *m, *v;  /* AdamW's moments: full (zero 0) or shards; Muon: m is loom_shard's state
                      (momentum of the matrices, Adam moments of the rest), v is unused */
    size_t pn, gn, on, vn, gsn; /* lengths of params, grads, m, v and gshard */
    loomShardPlan_t plan;       /* --optim muon: the plan over the data group (muon.c) */
    size_t *norm_runs;          /* Muon: [2 * nnorm] (shard offset, count) of the counted
                                   tensors' pieces in gshard, for the global norm */
    int nnorm;
    /* Per unit: gathered parameters (zero 3) and gradient accumulators (zero 2, 3), with counts
     * of their current users; NULL while not resident. */
    float **ugath, **ugrad;
    int *uref, *ugref;
    size_t peak_tmp, cur_tmp; /* floats of temporary unit buffers: peak and now */
    float *rs_tmp;            /* ZeRO-2/3: a unit's reduce-scatter result while it runs */
    int64_t step;
    double last_norm;
    int dumped_grads;
    int local_steps; /* DiLoCo: each rank steps on its own gradients (no data-group reduction,
                        the norm over its own gradients) */
} engine_t;

int eng_init(engine_t *e, const opts_t *o, tcomm_t *c);
/* The same for the stage pp_i of the pipeline instead of the rank's own (DualPipe's second copy).
 */
int eng_init_at(engine_t *e, const opts_t *o, tcomm_t *c, int pp_i);
/* eng_init in two: the buffers (zeroed), then the initial parameters and moments of step 0
 * (--elastic rebuilds without the initial values where it restores the state). */
int eng_alloc(engine_t *e, const opts_t *o, tcomm_t *c);
void eng_init_params(engine_t *e);
void eng_free(engine_t *e);
/* The unit's full local parameters, gathered if they are sharded; pair with eng_release. */
float *eng_acquire(engine_t *e, const unit_t *u);
void eng_release(engine_t *e, const unit_t *u);
/* The unit's gradient accumulator; pair with eng_grad_end. When the last user of the last
 * micro-batch ends it, the unit's reduction starts (DP/ZeRO-1: on the stream). */
float *eng_grad_begin(engine_t *e, const unit_t *u);
void eng_grad_end(engine_t *e, const unit_t *u, int last_micro);
void eng_zero_grads(engine_t *e);
/* Finishes the reductions, clips by the global norm, runs AdamW, re-gathers parameters. */
void eng_step(engine_t *e, double lr);
/* eng_step's two halves after the reductions: this rank's sum of squares of the reduced
 * gradients it counts, and the clip by the global norm with AdamW and the re-gather. */
double eng_sumsq(engine_t *e);
void eng_update(engine_t *e, double lr, double norm);
/* Writes the global parameter vector (or, with grads, the reduced gradients before clipping, as
 * eng_step does on the run's first step with --dump-grads) to
 * path on world rank 0. Collective over the world; returns 0 or -1. */
int eng_dump(engine_t *e, const char *path, int grads);
/* Checkpoint of this rank's state; returns 0 or -1 with a message. */
int eng_save(engine_t *e, const char *path, char *err, size_t errlen);
int eng_load(engine_t *e, const char *path, char *err, size_t errlen);

/* ---- Elastic training (elastic.c, ckpt_global.c) -------------------------------------------- */

/* The rank's parameters and AdamW moments to global-order vectors gp, gm, gv (global_len floats
 * each): the elements this rank counts (each by one rank of the world, as eng_dump), or with all
 * every element a plain-DP rank holds (ZeRO-0 only); and back (every element the rank holds). */
void eng_export(engine_t *e, float *gp, float *gm, float *gv, int all);
void eng_import(engine_t *e, const float *gp, const float *gm, const float *gv);
/* The layout-independent checkpoint PREFIX.global (header, then parameters, m, v in global
 * order): written by world rank 0, collective over the world, 0 on every rank or -1 with a
 * message; read by any layout (this rank only), giving its step and the writing run's id. */
int ckpt_global_save(engine_t *e, const char *prefix, uint64_t run_id, char *err, size_t errlen);
int ckpt_global_load(engine_t *e, const char *prefix, uint64_t *step, uint64_t *run_id, char *err,
                     size_t errlen);
int ckpt_global_exists(const char *prefix);

/* What a recovery did, for the log. */
typedef struct {
    int64_t failed_step;                 /* the step (0-based) that failed */
    int old_world, new_world;            /* world sizes */
    int nlost, lost[8];                  /* old ranks found dead (the first 8) */
    int old_rank;                        /* this rank's number before the shrink */
    const char *path;                    /* "in-memory", "checkpoint" or "initial" */
    int64_t resume_step;                 /* the step the run goes on from (0-based) */
    double t_seen, shrink_s, recovery_s; /* recovery_s: from t_seen to the state restored */
    double rebuild_s;                    /* of which the engine and stage rebuilt */
} elastic_ev_t;

/* What a run keeps for its recoveries. */
typedef struct {
    uint64_t run_id;       /* elastic_run_id */
    int64_t ckpt_step;     /* the step of this run's last PREFIX.global (-1: none yet) */
    int64_t resume_global; /* the step of the global --resume checkpoint it began at (-1: none) */
    int recoveries;
} elastic_state_t;

/* parse's checks of --elastic, --save-every and the kill options; 0 or -1 with a message. */
int elastic_check(const opts_t *o);
/* Arms --elastic-kill-*: on the victim, in the kill step, before its second data-group
 * collective (the first unit's gradient reduction is then under way on the others). */
void elastic_arm_kill(tcomm_t *c, const opts_t *o, int64_t step, int recovered);
/* After a failure: revokes every communicator of the grid, shrinks the world to the survivors
 * (loom finds the dead), aborts the old communicators, refuses what cannot be rebuilt (exits
 * with a message on every survivor), sets o->dp to the new data-parallel degree and rebuilds the
 * grid on the new world (tc_grid). The counters start again from zero. */
void elastic_shrink(tcomm_t *c, opts_t *o, elastic_ev_t *ev);
/* Whether the state in memory survives a failure: plain DP (ZeRO-0, every rank holds all of it,
 * and a step changes it only after its last collective). */
int elastic_in_memory(const opts_t *o);
/* An id of this run, drawn by world rank 0 and shared: a recovery reloads only a checkpoint that
 * this run wrote. Collective over the world. */
uint64_t elastic_run_id(tcomm_t *c);
/* The in-memory path (plain DP), on the rebuilt engine: g is this survivor's state (params, m, v
 * in global order, 3 x global_len floats) after `step` steps. A survivor may have finished the
 * failed step before the failure reached it: then the lowest of those that did gives its state
 * to the others. Collective over the new world. */
void elastic_restore_memory(engine_t *e, float *g, int64_t step);
/* The checkpoint path, on the rebuilt engine: this run's last PREFIX.global (--save), else the
 * global --resume checkpoint, else (a run begun at step 0) the initial state (eng_init_params).
 * Exits on every survivor where none fits. Collective; returns "checkpoint" or "initial". */
const char *elastic_restore_ckpt(engine_t *e, const opts_t *o, const elastic_state_t *st,
                                 int64_t first_step);
/* Rank 0's line and --log-json event (log may be NULL) of recovery number n. */
void elastic_report(FILE *log, const elastic_ev_t *ev, int n, int dp, int quiet);

/* ---- Muon through loom_shard (muon.c) ----------------------------------------------------- */

/* Makes the plan of this rank's tensors over the data group (one bucket per unit; matrices by
 * Muon, embeddings, LayerNorms and routers by AdamW) and lays the local vector out in the plan's
 * order, so that params and grads are the plan's full buffers; fills e->gsn and e->on. Checks
 * the plan across the data group. Returns 0 or -1 with a message. */
int muon_layout(engine_t *e);
/* The unit's backward is done (last micro-batch): its reduction to the owners starts on the stream
 * (loomShardReduceGrads into gshard), unless the tied embedding's sum must come first. */
void muon_unit_done(engine_t *e, const unit_t *u);
/* The rest of the step after the backward: reductions not yet run, the clip, loomShardStep on
 * this rank's share, loomShardGatherParams. */
void muon_step(engine_t *e, double lr);
/* The reduced gradients as the full plan-order vector (gathered from the shards), in a buffer
 * the caller frees. */
float *muon_full_grads(engine_t *e);
/* This rank's loom_shard figures for the summary: bytes sent and received, step collectives,
 * state floats, Newton-Schulz multiply-adds per step. */
void muon_figures(const engine_t *e, double out[5]);

/* ---- Activations and the stage's forward/backward (stage.c, block.c) ----------------------- */

typedef struct {
    float *h1, *mean1, *rstd1;
    float *qkv; /* [3][n][cl]: q, k, v */
    float *att; /* [n][cl] */
    float *lse; /* [n][hl] */
    float *x2;  /* [n][C] */
    float *h2, *mean2, *rstd2;
    float *up, *gel; /* [n][fl] */
    /* A MoE block (moe.c): the router's output, the routed batch kept from the forward to the
     * backward, and its expert-major rows (slots), in buffers that grow to the largest batch. */
    float *probs, *w, *auxg; /* [n][E], [n][k], [E] */
    int32_t *idx;            /* [n][k] */
    loomMoeHandle_t moe;
    int64_t *ecount, *eoff; /* [local experts] */
    size_t slots, cap;
    float *recv, *eup, *egel, *eout; /* [cap][C], [cap][4C], [cap][4C], [cap][C] */
} block_acts_t;

typedef struct {
    int n, nseq, tl; /* local tokens, sequences, local tokens per sequence */
    int seq0;        /* its first sequence in the global batch */
    int nl;          /* blocks on this stage */
    uint8_t *tok, *tgt;
    int32_t *pos;
    float *x;        /* [nl + 1][n][C]: the residual stream at each block boundary */
    block_acts_t *b; /* per local layer */
    float *hf, *meanf, *rstdf, *dlogits; /* last stage */
    double loss;                         /* this micro-batch's share of the step's loss */
    double aux;    /* its MoE load-balancing loss, scaled as the loss (not in loss) */
    double scale;  /* the loss scale of the forward, for the backward's auxiliary gradient */
    size_t floats; /* its size, for the memory report */
} mb_acts_t;

typedef struct {
    engine_t *e;
    tcomm_t *c;
    const opts_t *o;
    const layout_t *lay;
    int32_t **cppos; /* [cp][tl]: the positions held by each CP rank (zigzag chunks) */
    int eval;        /* forward only (validation): plain fp32 TP all-reduces */
    int local_loss;  /* DiLoCo's inner steps: the loss is this rank's sum, not gathered */
    double *lossbuf; /* global_loss's buffer (schedule.c), lossbuf_n doubles */
    size_t lossbuf_n;
    /* scratch, sized for one micro-batch */
    float *ml, *kvbuf[2], *dkvbuf[2], *dx, *dh, *dtmp, *dqkv, *datt, *dup, *delta, *logits;
    /* MoE (moe.c): a plan per local layer (NULL for a dense block), the router's scratch, the
     * backward's slot buffers, and the seconds spent in loom's MoE calls */
    loomMoePlan_t *plans;
    float *rlog, *rdw; /* [n][E], [n][k] */
    float *deout, *dgel, *drecv;
    size_t dcap;
    double moe_s;
    uint64_t *cosel, *load; /* per local layer [E*E], [E]: co-selections since the last placement */
    struct loom_moe_trace_writer *trace; /* --moe-trace's file (trace.c), or NULL */
    struct loom_moe_trace *replay;       /* --moe-replay's routing, or NULL */
    /* Ulysses (ulysses.c): the positions of a whole sequence in the order the all-to-all
     * gathers them (cppos[0], cppos[1], ...), and two exchange buffers of 3 x [n][cl] */
    int32_t *sppos;
    float *spbuf[2];
    struct zb_state *zb;   /* zero-bubble schedules (schedule_zb.c): deferred W's, timings */
    struct dualpipe *dual; /* --pp-schedule dualpipe: the second copy and the program, or NULL */
} stage_t;

int stage_init(stage_t *s, engine_t *e, tcomm_t *c, const opts_t *o, int n);
void stage_free(stage_t *s);
int mb_alloc(mb_acts_t *a, const layout_t *lay, int nseq, int tl);
void mb_free(mb_acts_t *a);
/* Forward of the stage for one micro-batch; its input is a->x (filled by the caller for a stage
 * that is not the first). On the last stage the loss and dlogits are computed. */
void stage_forward(stage_t *s, mb_acts_t *a, double scale);
/* Backward; dx holds the gradient of the stage's output on entry (ignored on the last stage)
 * and of its input on return. */
void stage_backward(stage_t *s, mb_acts_t *a, float *dx, int last_micro);
/* A block; PX and GX are its experts' unit (NULL for a dense block). */
void block_forward(stage_t *s, int layer, const float *P, const float *PX, mb_acts_t *a,
                   const float *x, float *xout);
void block_backward(stage_t *s, int layer, const float *P, float *G, const float *PX, float *GX,
                    mb_acts_t *a, const float *x, float *dx);
/* The backward of a block's attention (ring attention over CP): datt in, dq, dk, dv written into
 * dqkv ([3][n][cl]). */
void attention_bwd(stage_t *s, mb_acts_t *a, const float *qkv, const float *att, const float *lse,
                   const float *datt, float *dqkv);

/* ---- Ulysses sequence parallelism (ulysses.c) ---------------------------------------------- */

/* Scratch for n local tokens a micro-batch (nothing when sp is 1); ulysses_free releases it. */
void ulysses_init(stage_t *s, int n);
void ulysses_free(stage_t *s);
/* Attention of one block under --sp: qkv ([3][n][cl], this rank's tokens, all local heads) goes
 * through an all-to-all over the cp communicator and comes back head-sharded ([3][nseq * T][cl /
 * sp]: the whole sequences, heads/sp of the local heads), which the backward reuses: qkv is
 * overwritten with it. Attention runs there; its output goes back by a second all-to-all to att
 * ([n][cl]); lse ([nseq * T][hl / sp], as many floats as [n][hl]) stays head-sharded. */
void ulysses_fwd(stage_t *s, mb_acts_t *a, float *qkv, float *att, float *lse);
/* Its backward: datt ([n][cl]) with the softmax's row terms goes head-sharded by one all-to-all,
 * dq/dk/dv come back by another into dqkv ([3][n][cl], written). */
void ulysses_bwd(stage_t *s, mb_acts_t *a, const float *qkv, const float *att, const float *lse,
                 const float *datt, float *dqkv);

/* ---- Mixture of experts (moe.c) ------------------------------------------------------------ */

/* Plans and scratch (n tokens a micro-batch) of the stage's MoE blocks; collective over the EP
 * group. */
void moe_init(stage_t *s, int n);
void moe_free(stage_t *s);
void moe_acts_alloc(block_acts_t *b, const layout_t *lay, int layer, int n, size_t *floats);
void moe_acts_free(block_acts_t *b);
/* The MoE layer in place of the MLP: b->h2 in, y out (without the residual); adds its
 * auxiliary loss to a->aux. */
void moe_forward(stage_t *s, int layer, const float *P, const float *PX, mb_acts_t *a,
                 block_acts_t *b, float *y);
/* Its backward: dy in, dh (the gradient of h2, written) out; weight gradients accumulated. */
void moe_backward(stage_t *s, int layer, const float *P, float *G, const float *PX, float *GX,
                  mb_acts_t *a, block_acts_t *b, const float *dy, float *dh);
/* This rank's MoE counters since the last call, summed over its MoE blocks (then reset): remote
 * rows dedup saves against naive, remote rows sent, selections, selections of a local expert,
 * and the seconds spent in loom's MoE calls (layout, dispatch, combine, their backward). */
enum { MOE_ROWS_SAVED, MOE_ROWS_SENT, MOE_PAIRS, MOE_PAIRS_LOCAL, MOE_SECONDS, MOE_STATS };
void moe_take_stats(stage_t *s, double out[MOE_STATS]);
/* --moe-place coselect: places each MoE block's experts anew from the co-selections the training
 * forwards saw since the last placement (summed over the world, so every rank computes the same
 * placement), moves the parameters and AdamW moments of each expert that changes rank to its new
 * owner, and remakes the block's plan. Collective over the world. Returns the experts moved. */
int moe_replace(stage_t *s, engine_t *e);

/* --moe-trace (trace.c): opens this rank's trace file, appends one MoE block's routing of a
 * training forward (step: the optimizer steps done), closes it. Exits on a failed write. */
void trace_open(stage_t *s, const char *prefix);
void trace_batch(stage_t *s, int layer, const mb_acts_t *a, const block_acts_t *b);
void trace_close(stage_t *s);
/* --moe-replay FILE: loads the trace (exits unless it routes the model's E and k), and overwrites
 * a training forward's routing b->idx with the record of the same step, block and micro-batch of
 * the global batch (in the order one process runs them; its token bytes must match), b->w with
 * the renormalised probabilities of those experts. Exits where the file has no such record. */
void replay_open(stage_t *s, const char *path);
void replay_route(stage_t *s, int layer, const mb_acts_t *a, block_acts_t *b);

/* ---- Schedules (schedule.c) ---------------------------------------------------------------- */

/* Runs the forward and backward of every micro-batch of this rank (or the forward only), per
 * the schedule; mbs[i] holds micro-batch i's tokens. Returns the global mean loss. */
double schedule_run(stage_t *s, mb_acts_t *mbs, int nmb, int backward, double scale);
/* The schedule's bubble share of the step with a backward twice as long as the forward and no
 * communication time: (pp-1)/(m+pp-1) for 1F1B and GPipe, DualPipe's from its program; NAN for
 * the zero-bubble schedules, whose bubble depends on the split backward's measured times. */
double schedule_ideal_bubble(const stage_t *s, int nmb);

/* ---- DualPipe (schedule_dualpipe.c) ------------------------------------------------------- */

/* --pp-schedule dualpipe's checks of the options; 0 or -1 with a message. */
int dualpipe_check(const opts_t *o);
/* Builds the second copy (engine and stage for stage pp-1-r), the communicator of the mirror
 * pair {r, pp-1-r} and this rank's program for nmb micro-batches of nseq sequences; collective
 * over the world. 0 or -1 with a message. */
int dualpipe_init(stage_t *s, int nmb, int nseq);
void dualpipe_free(stage_t *s);
/* The layout micro-batch i's activations take: the first copy's for the first half, the second
 * copy's for the second. */
const layout_t *dualpipe_mb_layout(const stage_t *s, int i, int nmb);
double dualpipe_run(stage_t *s, mb_acts_t *mbs, int nmb, int backward, double scale);
/* The copies' gradients summed (mirror pair, then the data group, then the tied embedding),
 * the clip by the global norm and AdamW on both copies. */
void dualpipe_step(stage_t *s, double lr);
/* Adds the second copy's memory to a summary row (bytes: params, grads, optimizer, temporaries,
 * activations; local floats). */
void dualpipe_mem(const stage_t *s, double mem[6]);
double dualpipe_ideal_bubble(const stage_t *s);

/* ---- Zero-bubble schedules (schedule_zb.c, backward_zb.c) ---------------------------------- */

/* ZB-H1 / ZB-H2: the forward and the split backward (B: input gradients, W: weight gradients,
 * deferred into the bubbles) of every micro-batch of this rank, per the schedule. */
void zb_run(stage_t *s, mb_acts_t *mbs, int nmb, double scale);
void zb_free(stage_t *s);
/* This rank's figures for the summary, indexed by the ZB_* below (zeros where the schedule is not
 * zero-bubble). Not collective. */
enum {
    ZB_F_MS,       /* mean ms of one F of the stage */
    ZB_B_MS,       /* of one B */
    ZB_W_MS,       /* of one W */
    ZB_INFLIGHT,   /* most micro-batches between their F and their W at once */
    ZB_PENDING,    /* most W's deferred at once (B done, W not) */
    ZB_KEEP_BYTES, /* bytes held for the deferred W's (pending slots x one micro-batch's) */
    ZB_FIGS
};
void zb_figures(const stage_t *s, double out[ZB_FIGS]);

/* ---- Data (data.c) ------------------------------------------------------------------------- */

typedef struct {
    uint8_t *bytes;
    size_t len, train_len; /* [0, train_len) trains, the rest validates */
} corpus_t;

int corpus_load(corpus_t *cp, const char *path, double val_frac, int ctx, char *err, size_t n);
void corpus_free(corpus_t *cp);
/* Fills micro-batch a (sequences [seq0, seq0 + a->nseq) of the global batch of step `step`) with
 * this CP rank's tokens, targets and positions. val: from the validation part, batch `step`. */
/* Where sequence g of step `step`'s global batch starts in the corpus. */
size_t corpus_start(const corpus_t *cp, const opts_t *o, uint64_t step, uint64_t g, int val);
/* Writes a step's global batch: the tokens of every sequence, then their targets. */
int corpus_dump_batch(const corpus_t *cp, const opts_t *o, uint64_t step, const char *path);
void corpus_fill(const corpus_t *cp, const opts_t *o, const stage_t *s, mb_acts_t *a, uint64_t step,
                 int seq0, int val);

/* ---- DiLoCo (diloco.c) ------------------------------------------------------------------- */

typedef struct {
    int h;                  /* inner steps per outer step */
    int replicas;           /* R: the data-parallel degree, or --diloco-sim's count */
    float *outer, *mom;     /* theta_outer and the outer Nesterov momentum, [e->pn] each */
    float **rp, **rm, **rv; /* --diloco-sim: each replica's parameters and AdamW moments (replica
                               0's are the engine's own buffers) */
    double *mb_loss;        /* --diloco-sim: one step's micro-batch losses, replica-major */
    double *own, *all;      /* the round's micro-batch losses: this rank's [h][micro] (the
                               simulation's: [h][R][micro]), gathered [ranks][h][micro] */
    double *norms;          /* the round's gradient norms (replica 0's) */
    int pending;            /* steps of this round so far */
    double *done_loss;      /* [h]: the losses of the steps diloco_step made known */
    loomEchoState_t echo;   /* --diloco-echo: the deltas' feedback state */
    int64_t outer_steps;
} diloco_t;

/* --diloco's options against the rest; 0 or -1 with a message (called by parse). */
int diloco_check(const opts_t *o);
/* The replicas that share a global batch: --diloco-sim's count, else the data-parallel degree. */
int diloco_replicas(const opts_t *o, const grid_pos_t *g);
/* theta_outer, the momentum and (--diloco-sim) the replicas' state; 0 or -1 with a message. */
int diloco_init(diloco_t *d, engine_t *e, const opts_t *o);
void diloco_free(diloco_t *d);
/* One inner step of global batch `step` on every replica this process runs: each trains on its
 * share (bl sequences, nmb micro-batches of bm) with the loss scaled by 1 / (bl x T), the plain
 * one-replica step, and AdamW on its own gradients. Then, every h steps and after the run's last,
 * the outer step. The replicas exchange nothing between outer steps, not even their losses: the
 * round's losses are gathered at its outer step. Returns how many steps' losses that made known
 * (0 inside a round), in done_loss (each the mean of the replicas' losses) and norms (replica 0's
 * gradient norm). */
int diloco_step(diloco_t *d, stage_t *s, const corpus_t *cp, mb_acts_t *mbs, int nmb, int bl,
                int bm, int64_t step, double lr);
/* --diloco-sim's validation: each replica on its share, the losses added in the order of the
 * distributed run's. */
double diloco_sim_validate(diloco_t *d, stage_t *s, const corpus_t *cp, mb_acts_t *mbs, int nmb,
                           int bl, int bm, double scale);
/* The summary's DiLoCo fields (rank 0 writes; every rank calls: it gathers each rank's outer
 * state size). */
void diloco_summary(const diloco_t *d, const engine_t *e, int64_t steps_run, FILE *log);

#endif

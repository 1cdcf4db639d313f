/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_plan.h - the inside of a loomShardPlan (plan.c builds it; comm.c, step.c, rows.c and
 * the tests read it) and the enumeration of what one rank holds of one bucket.
 *
 * Per bucket the full buffer is its matrix region then its element-wise region. Owner lays the
 * matrix region out as M(b,0) | ... | M(b,P-1) (each rank's matrices in list order); Rows and
 * Replicated keep list order. A rank's shard holds, per bucket, its matrix elements then its
 * element-wise elements; its state, per bucket, momentum (one float per matrix element of the
 * shard), then Adam m, then Adam v (one float each per element-wise element of the shard).
 */
#ifndef LOOM_SHARD_PLAN_H
#define LOOM_SHARD_PLAN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "loom_shard.h"

typedef struct {
    size_t rows, cols, numel;
    loomShardKind_t kind;
    int bucket;
    int hint;      /* the caller's owner (-1: free) */
    int owner;     /* Owner layout: the matrix's rank; -1 otherwise */
    size_t offset; /* first element in the full buffer */
    size_t chunk;  /* Rows: ceil(rows / P) rows per rank */
    double ns_cost;
} shard_param_t;

/* What rank r holds of bucket b. Owner: M(b,r) = [m_start, m_start + m_len) and E(b,r) =
 * [e_start, e_start + e_len) of the full buffer. Replicated: the whole regions. Rows: the
 * starts are unused (the rank holds row chunks of every parameter), the lengths count its rows. */
typedef struct {
    size_t m_start, m_len, e_start, e_len;
    size_t shard_off; /* where the bucket starts in the rank's shard */
    size_t state_off; /* where the bucket starts in the rank's state */
} shard_seg_t;

typedef struct {
    int first, end;    /* parameters [first, end) of the list */
    size_t off;        /* first element in the full buffer */
    size_t m_elems;    /* the matrix region */
    size_t e_elems;    /* the element-wise region */
    size_t blk, blk_m; /* Rows: one rank's padded block (all / matrices only) */
    int nmat;          /* matrices in the bucket */
} shard_bucket_t;

struct loomShardPlan {
    int nparams, nranks, nbuckets;
    loomShardConfig_t cfg;
    shard_param_t *params; /* list order */
    int *order;            /* plan order: order[k] is the k-th parameter of the full buffer */
    shard_bucket_t *buckets;
    shard_seg_t *segs;                 /* [b * nranks + r] */
    size_t *shard_elems, *state_elems; /* per rank */
    double *rank_cost;                 /* per rank: NS multiply-adds per step */
    int *rank_nmat;
    size_t total, matrix_elems, padded, padded_matrix;
    uint64_t fingerprint;
    pthread_mutex_t lock; /* the counters */
    loomShardCounters_t counters;
};

/* One run of elements rank r holds: param's elements [full_off, full_off + len) of the full
 * buffer, at shard_off in the shard and state_off in the state's momentum part (matrices) or
 * m part (element-wise; v follows at + e_len of the bucket). A matrix piece covers rows
 * [row0, row0 + nrows). */
typedef struct {
    int param;
    size_t full_off, shard_off, state_off, len, row0, nrows;
} shard_piece_t;

/* The pieces of rank r in bucket b, matrices first (in plan order), then element-wise ones;
 * returns how many there are and fills out when it is not NULL. */
int shard_pieces(const struct loomShardPlan *p, int rank, int b, shard_piece_t *out);

/* Rows: the rows [*row0, *row0 + *nrows) of parameter i that rank r holds. */
void shard_rows_range(const struct loomShardPlan *p, int i, int r, size_t *row0, size_t *nrows);

/* The checks every entry point starts with; WARN naming fn. */
loomResult_t shard_check_plan(const struct loomShardPlan *p, const char *fn);
loomResult_t shard_check_rank(const struct loomShardPlan *p, int rank, const char *fn);
loomResult_t shard_check_bucket(const struct loomShardPlan *p, int bucket, const char *fn);
loomResult_t shard_check_dtype(loomDataType_t dt, const char *fn);

/* Counters: adds under the plan's lock. */
void shard_count(struct loomShardPlan *p, const loomShardCounters_t *add);

#endif

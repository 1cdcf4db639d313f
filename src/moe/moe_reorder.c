/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_reorder.c - token re-ordering (docs/moe.md, "Re-ordering"): the permutation that sends
 * each token to the rank of its predicted next-layer experts, and the ReduceScatter and
 * AllGather that move rows under it. The permutation is a pure integer function, so every rank
 * computes the same one without a message; the two collectives are a local gather or scatter
 * around loomReduceScatter and loomAllGather, so they inherit those calls' bits, order and
 * errors. Does not predict (loomMoeAffinityPredict) and does not place (moe_place.c). Called by
 * users through include/loom_moe.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "check.h"
#include "dtype.h"
#include "loom_moe.h"
#include "moe.h"

/* Rank r's share of T positions: the first T mod G ranks hold one more, as experts are shared
 * out by the placement. */
static void share(size_t num_tokens, int nranks, int r, size_t *first, size_t *count)
{
    size_t q = num_tokens / (size_t)nranks, m = num_tokens % (size_t)nranks, ru = (size_t)r;
    *count = q + (ru < m ? 1 : 0);
    *first = ru * q + (ru < m ? ru : m);
}

// ---- The permutation --------------------------------------------------------------------------

/* A token's place in the assignment order, and the key that decides it. */
typedef struct order_key {
    int32_t best;   /* the largest score over ranks */
    int32_t margin; /* best minus the largest score on another rank */
    int32_t token;
} order_key_t;

static int key_cmp(const void *pa, const void *pb)
{
    const order_key_t *a = pa, *b = pb;
    if (a->best != b->best)
        return a->best > b->best ? -1 : 1;
    if (a->margin != b->margin)
        return a->margin > b->margin ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

/* Adds token t's scores into score [G] (zero outside the ranks its row touches). */
static void score_add(const int32_t *row, int pred_k, const int32_t *expert_rank, int32_t *score)
{
    for (int j = 0; j < pred_k; j++)
        if (row[j] >= 0)
            score[expert_rank[row[j]]]++;
}

static loomResult_t check_placement(const int32_t *expert_rank, int num_experts, int nranks)
{
    if (nranks < 1 || nranks > LOOM_BOOTSTRAP_MAX_RANKS) {
        LOOM_WARN("loomMoeReorderCompute: nranks %d outside 1..%d", nranks,
                  LOOM_BOOTSTRAP_MAX_RANKS);
        return loomInvalidArgument;
    }
    if (expert_rank == NULL) {
        LOOM_WARN("loomMoeReorderCompute: expert_rank is NULL");
        return loomInvalidArgument;
    }
    for (int e = 0; e < num_experts; e++) {
        if (expert_rank[e] < 0 || expert_rank[e] >= nranks) {
            LOOM_WARN("loomMoeReorderCompute: expert_rank[%d] = %d, outside 0..%d", e,
                      expert_rank[e], nranks - 1);
            return loomInvalidArgument;
        }
    }
    return loomSuccess;
}

/* Step 1: each token's key. score [G] is zero on entry and on return. */
static void keys_fill(const int32_t *expert_rank, const int32_t *pred_topk, int pred_k, size_t nt,
                      int32_t *score, order_key_t *keys)
{
    for (size_t t = 0; t < nt; t++) {
        const int32_t *row = pred_topk + t * (size_t)pred_k;
        score_add(row, pred_k, expert_rank, score);
        int32_t best = 0, second = 0;
        /* Each rank the row touches is read once, then zeroed for the next token. */
        for (int j = 0; j < pred_k; j++) {
            if (row[j] < 0)
                continue;
            int32_t *s = &score[expert_rank[row[j]]];
            if (*s > best) {
                second = best;
                best = *s;
            } else if (*s > second) {
                second = *s;
            }
            *s = 0;
        }
        keys[t] = (order_key_t){.best = best, .margin = best - second, .token = (int32_t)t};
    }
}

/* Step 2: owner[t] for every token, in key order. room [G] holds each rank's free positions. */
static void assign(const int32_t *expert_rank, const int32_t *pred_topk, int pred_k,
                   const order_key_t *keys, size_t nt, int32_t *score, size_t *room, int32_t *owner)
{
    int lowest_free = 0; /* room only shrinks, so the lowest rank with room only rises */
    for (size_t i = 0; i < nt; i++) {
        const int32_t t = keys[i].token;
        const int32_t *row = pred_topk + (size_t)t * (size_t)pred_k;
        score_add(row, pred_k, expert_rank, score);
        int pick = -1;
        int32_t pick_score = 0;
        for (int j = 0; j < pred_k; j++) {
            if (row[j] < 0)
                continue;
            int g = expert_rank[row[j]];
            if (room[g] > 0 &&
                (score[g] > pick_score || (score[g] == pick_score && pick >= 0 && g < pick))) {
                pick = g;
                pick_score = score[g];
            }
        }
        for (int j = 0; j < pred_k; j++)
            if (row[j] >= 0)
                score[expert_rank[row[j]]] = 0;
        if (pick < 0) { /* every rank with room scores 0 for t: the lowest of them */
            while (room[lowest_free] == 0)
                lowest_free++;
            pick = lowest_free;
        }
        room[pick]--;
        owner[t] = pick;
    }
}

LOOM_API loomResult_t loomMoeReorderCompute(const int32_t *expert_rank, int num_experts, int nranks,
                                            const int32_t *pred_topk, int pred_k, size_t num_tokens,
                                            int32_t *perm, int32_t *home_rank)
{
    LOOM_CHECK(loom_moe_topk_check("pred_topk", pred_topk, num_tokens, pred_k, num_experts));
    LOOM_CHECK(check_placement(expert_rank, num_experts, nranks));
    if (num_tokens > INT32_MAX) {
        LOOM_WARN("loomMoeReorderCompute: %zu tokens, more than an int32 perm holds (%d)",
                  num_tokens, INT32_MAX);
        return loomInvalidArgument;
    }
    if (perm == NULL && num_tokens > 0) {
        LOOM_WARN("loomMoeReorderCompute: perm is NULL with %zu tokens", num_tokens);
        return loomInvalidArgument;
    }
    if (num_tokens == 0)
        return loomSuccess;
    const size_t nt = num_tokens, ng = (size_t)nranks;
    int32_t *score = calloc(ng, sizeof(*score));
    size_t *room = malloc(ng * sizeof(*room));
    order_key_t *keys = malloc(nt * sizeof(*keys));
    int32_t *owner = malloc(nt * sizeof(*owner));
    if (score == NULL || room == NULL || keys == NULL || owner == NULL) {
        LOOM_WARN("loomMoeReorderCompute: out of memory for %zu tokens on %d ranks", nt, nranks);
        free(score);
        free(room);
        free(keys);
        free(owner);
        return loomSystemError;
    }
    keys_fill(expert_rank, pred_topk, pred_k, nt, score, keys);
    qsort(keys, nt, sizeof(*keys), key_cmp); /* a total order: the index breaks every tie */
    size_t first;
    for (int g = 0; g < nranks; g++)
        share(nt, nranks, g, &first, &room[g]);
    assign(expert_rank, pred_topk, pred_k, keys, nt, score, room, owner);
    /* Step 3: each rank's tokens by index; room now counts the positions filled. */
    for (int g = 0; g < nranks; g++)
        room[g] = 0;
    for (size_t t = 0; t < nt; t++) {
        size_t count, g = (size_t)owner[t];
        share(nt, nranks, owner[t], &first, &count);
        perm[first + room[g]++] = (int32_t)t;
        if (home_rank != NULL)
            home_rank[t] = owner[t];
    }
    free(score);
    free(room);
    free(keys);
    free(owner);
    return loomSuccess;
}

// ---- The permuted collectives -----------------------------------------------------------------
/* Both run one collective on G blocks of cap = ceil(T/G) rows each: block g holds rank g's n_g
 * rows, then zero rows up to cap. When G divides T there is no padding, and the user's own
 * buffer is the collective's receive (ReduceScatter) or send (AllGather) buffer; otherwise the
 * collective runs in place on the scratch, and n_r rows are copied. A padded row is reduced like
 * any other, and each element's bits depend only on the ranks' values for it (include/loom.h),
 * so the padding never changes a result. Cost: the scratch (G*cap rows) and one local copy of
 * every row besides the collective's own, which moves G*cap rows where the plain call would
 * move T: (G-1)*cap rows sent per rank on a ring. */

/* What one call of either collective works with. */
typedef struct permuted {
    int rank, nranks;
    size_t row;        /* bytes per row: hidden x element size */
    size_t cap;        /* rows per block */
    size_t mine;       /* n_r: rows this rank owns */
    size_t count;      /* elements per block: the collective's count */
    uint8_t *blocks;   /* [G*cap*row] scratch */
    uint8_t *my_block; /* this rank's block in it */
} permuted_t;

static loomResult_t check_perm(const char *fn, const int32_t *perm, size_t num_tokens, int rank)
{
    if (num_tokens > INT32_MAX) {
        LOOM_WARN("%s: rank %d: %zu tokens, more than an int32 perm holds (%d)", fn, rank,
                  num_tokens, INT32_MAX);
        return loomInvalidArgument;
    }
    if (num_tokens == 0)
        return loomSuccess;
    if (perm == NULL) {
        LOOM_WARN("%s: rank %d: perm is NULL with %zu tokens", fn, rank, num_tokens);
        return loomInvalidArgument;
    }
    uint8_t *seen = calloc(num_tokens, 1);
    if (seen == NULL) {
        LOOM_WARN("%s: rank %d: out of memory checking a perm of %zu tokens", fn, rank, num_tokens);
        return loomSystemError;
    }
    loomResult_t res = loomSuccess;
    for (size_t i = 0; i < num_tokens; i++) {
        int32_t t = perm[i];
        if (t < 0 || (size_t)t >= num_tokens || seen[t]) {
            LOOM_WARN("%s: rank %d: perm[%zu] = %d is %s: perm must hold each of 0..%zu once", fn,
                      rank, i, t, t < 0 || (size_t)t >= num_tokens ? "out of range" : "repeated",
                      num_tokens - 1);
            res = loomInvalidArgument;
            break;
        }
        seen[t] = 1;
    }
    free(seen);
    return res;
}

static loomResult_t buf_check(const char *fn, int rank, const char *what, const void *buf,
                              size_t bytes)
{
    if (buf == NULL && bytes > 0) {
        LOOM_WARN("%s: rank %d: %s is NULL with %zu bytes to move", fn, rank, what, bytes);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* The local checks, then the scratch. Every argument a rank checks here must be equal on every
 * rank but the two buffers, which loomReduceScatter and loomAllGather check the same way.
 * op is NULL for the AllGather. With an op (the ReduceScatter), sendbuff holds all T rows in
 * natural order and recvbuff the n_r rows this rank owns; without, the other way round. */
static loomResult_t permuted_open(const char *fn, const void *sendbuff, const void *recvbuff,
                                  size_t hidden, loomDataType_t datatype, const loomRedOp_t *op,
                                  const int32_t *perm, size_t num_tokens, loomComm_t comm,
                                  permuted_t *p)
{
    LOOM_CHECK(loomCommCount(comm, &p->nranks));
    LOOM_CHECK(loomCommUserRank(comm, &p->rank));
    if (!loom_dtype_valid(datatype)) {
        LOOM_WARN("%s: rank %d: invalid datatype %d", fn, p->rank, (int)datatype);
        return loomInvalidArgument;
    }
    if (op != NULL && !loom_redop_valid(*op)) {
        LOOM_WARN("%s: rank %d: invalid reduction op %d", fn, p->rank, (int)*op);
        return loomInvalidArgument;
    }
    const int natural_send = op != NULL;
    LOOM_CHECK(check_perm(fn, perm, num_tokens, p->rank));
    const size_t es = loom_dtype_size(datatype), ng = (size_t)p->nranks;
    size_t first;
    share(num_tokens, p->nranks, p->rank, &first, &p->mine);
    p->cap = (num_tokens + ng - 1) / ng;
    if (hidden > SIZE_MAX / es || (hidden > 0 && p->cap > SIZE_MAX / (hidden * es) / ng)) {
        LOOM_WARN("%s: rank %d: %zu tokens of %zu elements (%zu bytes each) on %d ranks overflow",
                  fn, p->rank, num_tokens, hidden, es, p->nranks);
        return loomInvalidArgument;
    }
    p->row = hidden * es;
    p->count = p->cap * hidden;
    const size_t all = num_tokens * p->row, own = p->mine * p->row;
    LOOM_CHECK(buf_check(fn, p->rank, "sendbuff", sendbuff, natural_send ? all : own));
    LOOM_CHECK(buf_check(fn, p->rank, "recvbuff", recvbuff, natural_send ? own : all));
    const size_t bytes = ng * p->cap * p->row;
    p->blocks = malloc(bytes > 0 ? bytes : 1);
    if (p->blocks == NULL) {
        LOOM_WARN("%s: rank %d: out of memory for %zu bytes of scratch", fn, p->rank, bytes);
        return loomSystemError;
    }
    p->my_block = p->blocks + (size_t)p->rank * p->cap * p->row;
    return loomSuccess;
}

/* Moves rows between the natural order and the blocks: from src, natural row perm[first_g + j]
 * goes to row j of block g and the padding is zeroed; or, to dst, the reverse (one of src and
 * dst is NULL). */
static void permuted_move(const permuted_t *p, const int32_t *perm, size_t num_tokens,
                          const uint8_t *src, uint8_t *dst)
{
    if (p->row == 0)
        return;
    for (int g = 0; g < p->nranks; g++) {
        size_t first, count;
        share(num_tokens, p->nranks, g, &first, &count);
        uint8_t *block = p->blocks + (size_t)g * p->cap * p->row;
        for (size_t j = 0; j < count; j++) {
            const size_t at = (size_t)perm[first + j] * p->row;
            if (src != NULL)
                memcpy(block + j * p->row, src + at, p->row);
            else
                memcpy(dst + at, block + j * p->row, p->row);
        }
        if (src != NULL)
            memset(block + count * p->row, 0, (p->cap - count) * p->row);
    }
}

LOOM_API loomResult_t loomMoeReduceScatterPermuted(const void *sendbuff, void *recvbuff,
                                                   size_t hidden, loomDataType_t datatype,
                                                   loomRedOp_t op, const int32_t *perm,
                                                   size_t num_tokens, loomComm_t comm)
{
    permuted_t p;
    LOOM_CHECK(permuted_open("loomMoeReduceScatterPermuted", sendbuff, recvbuff, hidden, datatype,
                             &op, perm, num_tokens, comm, &p));
    /* The gather only reads sendbuff, so the rows it needs are all in the scratch before the
     * collective writes recvbuff: the two may overlap. */
    permuted_move(&p, perm, num_tokens, sendbuff, NULL);
    loomResult_t res;
    if (p.cap == p.mine) {
        res = loomReduceScatter(p.blocks, recvbuff, p.count, datatype, op, comm, NULL);
    } else {
        res = loomReduceScatter(p.blocks, p.my_block, p.count, datatype, op, comm, NULL);
        if (res == loomSuccess && p.mine > 0)
            memcpy(recvbuff, p.my_block, p.mine * p.row);
    }
    free(p.blocks);
    return res;
}

LOOM_API loomResult_t loomMoeAllGatherPermuted(const void *sendbuff, void *recvbuff, size_t hidden,
                                               loomDataType_t datatype, const int32_t *perm,
                                               size_t num_tokens, loomComm_t comm)
{
    permuted_t p;
    LOOM_CHECK(permuted_open("loomMoeAllGatherPermuted", sendbuff, recvbuff, hidden, datatype, NULL,
                             perm, num_tokens, comm, &p));
    loomResult_t res;
    if (p.cap == p.mine) {
        res = loomAllGather(sendbuff, p.blocks, p.count, datatype, comm, NULL);
    } else {
        if (p.mine > 0)
            memcpy(p.my_block, sendbuff, p.mine * p.row);
        memset(p.my_block + p.mine * p.row, 0, (p.cap - p.mine) * p.row);
        res = loomAllGather(p.my_block, p.blocks, p.count, datatype, comm, NULL);
    }
    /* The collective has read sendbuff whole before the scatter writes recvbuff. */
    if (res == loomSuccess)
        permuted_move(&p, perm, num_tokens, NULL, recvbuff);
    free(p.blocks);
    return res;
}

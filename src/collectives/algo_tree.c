/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_tree.c - rooted algorithms: binomial-tree Broadcast and Reduce,
 * segmented so that large vectors pipeline down (up) the tree, and van de
 * Geijn's scatter + all-gather Broadcast for large vectors.
 *
 * Binomial tree (relative rank vr = (rank - root) mod n): the parent of vr > 0
 * is vr minus its lowest set bit; the children of vr are vr + m for every
 * power of two m below that bit (below n for the root) with vr + m < n.
 * ceil(log2 n) levels; the root sends or receives ceil(log2 n) messages per
 * segment, so its link carries ceil(log2 n) S.
 *
 * Segments: the vector is cut into segments of LOOM_CHUNK_BYTES. Broadcast:
 * a rank receives segment j+1 while it forwards segment j to its children,
 * largest subtree first. Reduce: a rank receives its children's partials of
 * segment j+1 while it combines segment j and sends it to its parent. Waits
 * are on receives (which depend only on ancestors, resp. descendants) or on
 * sends (the other direction), so the tree's acyclicity rules out deadlock.
 *
 * Reduce order (determinism): rank vr starts from its own data and adds its
 * children's partials in increasing m: ((x[vr] op P[vr+1]) op P[vr+2]) op
 * P[vr+4] ..., so with 4 ranks the root computes (x0 op x1) op (x2 op x3) in
 * relative ranks. Leaves send their raw data; inner ranks send partials in the
 * accumulator type (float32 for 16/8-bit floats); the root rounds once.
 * Scratch: two segments per child and two for the own partial (accumulator type).
 *
 * scatter_allgather (Broadcast): the root sends block b of loom_split(count, n)
 * to rank b, then the ranks run the ring all-gather on those blocks
 * (algo_ring.c). Bytes per rank 2(n-1)/n S, 2(n-1) steps.
 */
#include <stdlib.h>
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "dtype.h"

enum { STEP_TREE = 1, STEP_SCATTER = 5 };

#define MAX_CHILDREN 32 /* ceil(log2 n) for any int n */

typedef struct {
    int vr;
    int parent; /* real rank, -1 for the root */
    int nchild;
    int child[MAX_CHILDREN]; /* real ranks, increasing m */
    int child_leaf[MAX_CHILDREN];
} tree_t;

static void tree_build(int n, int rank, int root, tree_t *t)
{
    t->vr = (rank - root + n) % n;
    int top = 1;
    if (t->vr == 0) {
        while (top < n)
            top <<= 1;
        t->parent = -1;
    } else {
        top = t->vr & -t->vr;
        t->parent = (t->vr - top + root) % n;
    }
    t->nchild = 0;
    for (int m = 1; m < top; m <<= 1) {
        int c = t->vr + m;
        if (c >= n)
            break;
        t->child[t->nchild] = (c + root) % n;
        t->child_leaf[t->nchild] = m == 1 || c + 1 >= n; /* no child of its own */
        t->nchild++;
    }
}

static size_t nsegs(size_t total, size_t seg)
{
    return (total + seg - 1) / seg;
}

// ---- Broadcast ------------------------------------------------------------------

loomResult_t loom_bcast_binomial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    if (bytes == 0)
        return loomSuccess;
    const int is_root = me == a->root;
    if (n == 1) {
        if (a->sendbuff != a->recvbuff)
            memcpy(a->recvbuff, a->sendbuff, bytes);
        return loomSuccess;
    }
    tree_t t;
    tree_build(n, me, a->root, &t);
    const size_t seg = ctx->chunk_bytes;
    const size_t m = nsegs(bytes, seg);
    const uint8_t *src = is_root ? a->sendbuff : a->recvbuff;
    uint8_t *dst = a->recvbuff;
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_TREE);
    loom_p2p_req_t rq[2], sq[2][MAX_CHILDREN];
    int nsq[2] = {0, 0};
    if (!is_root)
        LOOM_CHECK(loom_coll_irecv(ctx, t.parent, dst, m > 1 ? seg : bytes, tag, &rq[0]));
    for (size_t j = 0; j < m; j++) {
        size_t off = j * seg, len = bytes - off < seg ? bytes - off : seg;
        if (!is_root) {
            if (j + 1 < m) {
                size_t noff = off + seg, nlen = bytes - noff < seg ? bytes - noff : seg;
                LOOM_CHECK(loom_coll_irecv(ctx, t.parent, dst + noff, nlen, tag, &rq[(j + 1) % 2]));
            }
            LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, &rq[j % 2], 1));
        }
        int g = (int)(j % 2);
        if (nsq[!g] > 0)
            LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, sq[!g], nsq[!g]));
        nsq[!g] = 0;
        for (int c = t.nchild - 1; c >= 0; c--) /* largest subtree first */
            LOOM_CHECK(loom_coll_isend(ctx, t.child[c], src + off, len, tag, &sq[g][nsq[g]++]));
    }
    for (int g = 0; g < 2; g++)
        if (nsq[g] > 0)
            LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, sq[g], nsq[g]));
    if (is_root && a->sendbuff != a->recvbuff)
        memcpy(a->recvbuff, a->sendbuff, bytes);
    return loomSuccess;
}

loomResult_t loom_bcast_scatter_allgather(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t es = loom_dtype_size(a->dt);
    if (a->count == 0)
        return loomSuccess;
    if (n == 1)
        return loom_bcast_binomial(ctx, a);
    uint8_t *recv = a->recvbuff;
    size_t *v = malloc(sizeof(size_t) * 2 * (size_t)n);
    loom_p2p_req_t *reqs = malloc(sizeof(*reqs) * (size_t)n);
    loomResult_t res = loomSuccess;
    if (v == NULL || reqs == NULL) {
        LOOM_WARN("out of memory for %d blocks", n);
        res = loomSystemError;
        goto out;
    }
    for (int b = 0; b < n; b++)
        loom_split(a->count, n, b, &v[b], &v[n + b]);
    const uint32_t tag = loom_tag_coll(ctx->seq, STEP_SCATTER);
    int nreq = 0;
    if (me == a->root) {
        if (a->sendbuff != a->recvbuff)
            memcpy(recv, a->sendbuff, a->count * es);
        for (int d = 1; d < n; d++) {
            int b = (me + d) % n;
            if (v[n + b] > 0)
                LOOM_CHECK_GOTO(
                    loom_coll_isend(ctx, b, recv + v[b] * es, v[n + b] * es, tag, &reqs[nreq++]),
                    res, out);
        }
    } else if (v[n + me] > 0) {
        LOOM_CHECK_GOTO(
            loom_coll_irecv(ctx, a->root, recv + v[me] * es, v[n + me] * es, tag, &reqs[nreq++]),
            res, out);
    }
    if (nreq > 0)
        LOOM_CHECK_GOTO(loom_p2p_wait_all(ctx->p2p, reqs, nreq), res, out);
    res = loom_coll_ring_allgather_blocks(ctx, a, v, v + n, recv);
out:
    free(v);
    free(reqs);
    return res;
}

// ---- Reduce ---------------------------------------------------------------------

typedef struct {
    loom_coll_ctx_t *ctx;
    const loom_coll_args_t *a;
    tree_t t;
    size_t es, accsz, ce;
    uint8_t *part[2];               /* own partial per segment parity */
    uint8_t *from[2][MAX_CHILDREN]; /* children's partials per segment parity */
    loom_p2p_req_t rq[2][MAX_CHILDREN];
    loom_p2p_req_t sq;
    int sq_posted;
} reduce_tree_t;

static size_t seg_len(const reduce_tree_t *r, size_t j)
{
    size_t off = j * r->ce;
    return r->a->count - off < r->ce ? r->a->count - off : r->ce;
}

static loomResult_t post_child_recvs(reduce_tree_t *r, size_t j)
{
    const uint32_t tag = loom_tag_coll(r->ctx->seq, STEP_TREE);
    size_t len = seg_len(r, j);
    for (int c = 0; c < r->t.nchild; c++) {
        size_t nbytes = len * (r->t.child_leaf[c] ? r->es : r->accsz);
        LOOM_CHECK(loom_coll_irecv(r->ctx, r->t.child[c], r->from[j % 2][c], nbytes, tag,
                                   &r->rq[j % 2][c]));
    }
    return loomSuccess;
}

/* Segment j: combine own data and the children's partials in increasing m,
 * then send to the parent (raw when a leaf) or round into recvbuff (root). */
static loomResult_t reduce_segment(reduce_tree_t *r, size_t j, size_t nseg)
{
    const loom_coll_args_t *a = r->a;
    const size_t len = seg_len(r, j), off = j * r->ce;
    const uint8_t *own = (const uint8_t *)a->sendbuff + off * r->es;
    const int g = (int)(j % 2);
    if (j + 1 < nseg)
        LOOM_CHECK(post_child_recvs(r, j + 1));
    if (r->t.nchild > 0) {
        loom_reduce_init(a->dt, r->part[g], own, len);
        LOOM_CHECK(loom_p2p_wait_all(r->ctx->p2p, r->rq[g], r->t.nchild));
        for (int c = 0; c < r->t.nchild; c++) {
            if (r->t.child_leaf[c])
                loom_reduce_acc(a->dt, a->op, r->part[g], r->from[g][c], len);
            else
                loom_combine_partials(a->dt, a->op, r->part[g], r->from[g][c], len);
        }
    }
    if (r->sq_posted) {
        LOOM_CHECK(loom_p2p_wait_all(r->ctx->p2p, &r->sq, 1));
        r->sq_posted = 0;
    }
    if (r->t.parent < 0) {
        uint8_t *dst = (uint8_t *)a->recvbuff + off * r->es;
        if (r->t.nchild > 0)
            loom_reduce_finish(a->dt, a->op, dst, r->part[g], len, r->ctx->nranks);
        return loomSuccess;
    }
    const uint32_t tag = loom_tag_coll(r->ctx->seq, STEP_TREE);
    const void *src = r->t.nchild > 0 ? (const void *)r->part[g] : (const void *)own;
    size_t nbytes = len * (r->t.nchild > 0 ? r->accsz : r->es);
    LOOM_CHECK(loom_coll_isend(r->ctx, r->t.parent, src, nbytes, tag, &r->sq));
    r->sq_posted = 1;
    return loomSuccess;
}

loomResult_t loom_reduce_binomial(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    if (ctx->nranks == 1)
        return loom_reduce_direct(ctx, a);
    if (a->count == 0)
        return loomSuccess;
    reduce_tree_t r;
    memset(&r, 0, sizeof(r));
    r.ctx = ctx;
    r.a = a;
    tree_build(ctx->nranks, ctx->rank, a->root, &r.t);
    r.es = loom_dtype_size(a->dt);
    r.accsz = loom_acc_size(a->dt);
    r.ce = loom_chunk_elems(ctx, r.es);
    if (r.ce > a->count)
        r.ce = a->count;
    const int k = r.t.nchild;
    if (k > 0) {
        size_t sizes[2 + 2 * MAX_CHILDREN];
        uint8_t *parts[2 + 2 * MAX_CHILDREN];
        for (int i = 0; i < 2 + 2 * k; i++)
            sizes[i] = r.ce * r.accsz;
        LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 2 + 2 * k, parts));
        r.part[0] = parts[0];
        r.part[1] = parts[1];
        for (int c = 0; c < k; c++) {
            r.from[0][c] = parts[2 + c];
            r.from[1][c] = parts[2 + k + c];
        }
    }
    size_t m = nsegs(a->count, r.ce);
    LOOM_CHECK(post_child_recvs(&r, 0));
    for (size_t j = 0; j < m; j++)
        LOOM_CHECK(reduce_segment(&r, j, m));
    if (r.sq_posted)
        LOOM_CHECK(loom_p2p_wait_all(ctx->p2p, &r.sq, 1));
    return loomSuccess;
}

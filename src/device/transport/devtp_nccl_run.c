/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_nccl_run.c - the nccl device transport's calls, queued on the
 * caller's stream: NCCL moves bytes (ncclUint8, so every datatype moves
 * alike), loom's kernel reduces. No NCCL reduction is ever used: its
 * float16/bfloat16 sums round at every step, loom's round once, in rank
 * order.
 *   AllGather  ncclAllGather (one chunk) or grouped Send/Recv per chunk;
 *   Broadcast  ncclBroadcast per chunk;
 *   AllToAll   grouped Send/Recv of each block to its rank;
 *   AllReduce  each rank's block b of the chunk sent to rank b (grouped
 *              Send/Recv into the scratch), rank b reduces the n blocks in
 *              rank order, then ncclAllGather of the reduced blocks (grouped
 *              Send/Recv when the chunk does not split evenly);
 *   ReduceScatter  the first two steps with whole blocks;
 *   Reduce     every rank's chunk sent to the root, the root reduces.
 * Buffers in host memory (the runtime's ptr_device < 0) are staged through
 * the scratch: inputs are copied in before, outputs copied out after, as the
 * kernels and NCCL need device memory. Whether a rank stages is its own
 * affair; the NCCL operations must pair up across ranks, so the chunk size
 * is computed from the call and the agreed scratch size alone, as if every
 * buffer were staged: every rank issues the same NCCL operations.
 *
 * Scratch of a chunk of len elements per block (regions 256-byte aligned):
 *   R    the blocks received for a reduction (n slots);
 *   IN   the staged input (n blocks for ReduceScatter and AllToAll);
 *   OUT  the staged output (n blocks for AllGather and AllToAll).
 */
#include <string.h>

#include "check.h"
#include "dev_kernels.h"
#include "devtp_nccl.h"
#include "dtype.h"

#define NCCL_ALIGN 256u

static size_t align_up(size_t v)
{
    return (v + NCCL_ALIGN - 1) & ~(size_t)(NCCL_ALIGN - 1);
}

int loom_devtp_nccl_handles(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call)
{
    (void)state;
    if (!loom_dtype_valid(call->dt))
        return 0;
    switch (call->kind) {
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_REDUCE:
        return dc->nranks <= LOOM_DK_MAX_SRCS && loom_dk_dtype_ok(call->dt) &&
               loom_redop_valid(call->op);
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_BCAST:
    case LOOM_COLL_ALLTOALL:
        return 1;
    default:
        return 0;
    }
}

typedef struct {
    nccl_state_t *st;
    const loom_devrt_t *rt;
    const loom_nccl_lib_t *nl;
    const loom_coll_args_t *c;
    loom_dev_stream_t s;
    size_t es;
    int n, me;
    size_t per;      /* elements per chunk (per block) */
    size_t len, off; /* the chunk under way */
    char *R, *IN, *OUT;
    int in_dev, out_dev; /* the caller's buffers are used directly */
    int reads, writes;   /* this rank reads sendbuff / writes recvbuff */
} nrun_t;

/* How many chunk-lengths of scratch a chunk needs, and how much more. */
static void need(loom_coll_kind_t k, size_t n, size_t *mult, size_t *extra)
{
    *extra = 0;
    switch (k) {
    case LOOM_COLL_ALLREDUCE:
        *mult = 3;
        *extra = n;
        break;
    case LOOM_COLL_REDUCE_SCATTER:
        *mult = 2 * n + 1;
        break;
    case LOOM_COLL_REDUCE:
        *mult = n + 2;
        break;
    case LOOM_COLL_ALLGATHER:
        *mult = n + 1;
        break;
    case LOOM_COLL_ALLTOALL:
        *mult = 2 * n;
        break;
    default: /* broadcast */
        *mult = 2;
        break;
    }
}

static size_t chunk_elems(const nccl_state_t *st, loom_coll_kind_t k, size_t es)
{
    size_t mult, extra;
    need(k, (size_t)st->nranks, &mult, &extra);
    size_t units = (st->chunk_bytes - 3 * NCCL_ALIGN) / es;
    if (units <= extra)
        return 0;
    size_t c = (units - extra) / mult;
    size_t a = NCCL_ALIGN / es;
    if (c > a)
        c -= c % a;
    return c;
}

static char *at(const void *p, size_t elems, size_t es)
{
    return (char *)(uintptr_t)p + elems * es;
}

/* Block j of the chunk's input and output, where NCCL and the kernels use them. */
static char *in_blk(const nrun_t *x, int j)
{
    return x->in_dev ? at(x->c->sendbuff, (size_t)j * x->c->count + x->off, x->es)
                     : at(x->IN, (size_t)j * x->len, x->es);
}
static char *out_blk(const nrun_t *x, int j)
{
    return x->out_dev ? at(x->c->recvbuff, (size_t)j * x->c->count + x->off, x->es)
                      : at(x->OUT, (size_t)j * x->len, x->es);
}

static loomResult_t ok(const nrun_t *x, loom_nccl_result_t res, const char *what)
{
    return res == LOOM_NCCL_SUCCESS ? loomSuccess : loom_devtp_nccl_fail(x->st, res, what);
}

static loomResult_t send(const nrun_t *x, const void *buf, size_t elems, int peer)
{
    if (elems == 0)
        return loomSuccess;
    return ok(x, x->nl->Send(buf, elems * x->es, LOOM_NCCL_UINT8, peer, x->st->comm, x->s),
              "ncclSend");
}

static loomResult_t recv(const nrun_t *x, void *buf, size_t elems, int peer)
{
    if (elems == 0)
        return loomSuccess;
    return ok(x, x->nl->Recv(buf, elems * x->es, LOOM_NCCL_UINT8, peer, x->st->comm, x->s),
              "ncclRecv");
}

static loomResult_t copy(const nrun_t *x, void *dst, const void *src, size_t elems)
{
    if (elems == 0 || dst == src)
        return loomSuccess;
    return x->rt->memcpy_async(dst, src, elems * x->es, x->s);
}

/* Grouped exchange: to every peer p, send_of(p) (send_n(p) elements); from
 * every peer p, into recv_of(p) (recv_n(p) elements). The group is always
 * closed, whatever failed inside it (NCCL's group depth is per thread). */
typedef struct {
    const void *(*send_of)(const nrun_t *, int);
    size_t (*send_n)(const nrun_t *, int);
    void *(*recv_of)(const nrun_t *, int);
    size_t (*recv_n)(const nrun_t *, int);
} xchg_t;

static loomResult_t exchange(const nrun_t *x, const xchg_t *e)
{
    loomResult_t r = ok(x, x->nl->GroupStart(), "ncclGroupStart");
    if (r != loomSuccess)
        return r;
    for (int p = 0; p < x->n && r == loomSuccess; p++) {
        if (p == x->me)
            continue;
        if (e->send_of != NULL)
            r = send(x, e->send_of(x, p), e->send_n(x, p), p);
        if (r == loomSuccess && e->recv_of != NULL)
            r = recv(x, e->recv_of(x, p), e->recv_n(x, p), p);
    }
    loomResult_t end = ok(x, x->nl->GroupEnd(), "ncclGroupEnd");
    return r != loomSuccess ? r : end;
}

/* ---- AllReduce: block b of a chunk is [b * B, min((b + 1) * B, len)) ---------- */
static size_t ar_B(const nrun_t *x)
{
    return (x->len + (size_t)x->n - 1) / (size_t)x->n;
}
static size_t ar_start(const nrun_t *x, int b)
{
    size_t s = (size_t)b * ar_B(x);
    return s < x->len ? s : x->len;
}
static size_t ar_size(const nrun_t *x, int b)
{
    return ar_start(x, b + 1) - ar_start(x, b);
}
static const void *ar_send_in(const nrun_t *x, int p)
{
    return in_blk(x, 0) + ar_start(x, p) * x->es;
}
static void *ar_recv_R(const nrun_t *x, int p)
{
    return at(x->R, (size_t)p * ar_B(x), x->es);
}
static size_t ar_mine(const nrun_t *x, int p)
{
    (void)p;
    return ar_size(x, x->me);
}
static const void *ar_send_out(const nrun_t *x, int p)
{
    (void)p;
    return out_blk(x, 0) + ar_start(x, x->me) * x->es;
}
static void *ar_recv_out(const nrun_t *x, int p)
{
    return out_blk(x, 0) + ar_start(x, p) * x->es;
}

static loomResult_t reduce_into(const nrun_t *x, void *dst, const void *const *srcs, size_t n)
{
    if (n == 0)
        return loomSuccess;
    return x->rt->reduce(x->s, x->c->dt, x->c->op, dst, srcs, x->n, n, x->n);
}

static loomResult_t allreduce(nrun_t *x)
{
    const xchg_t scatter = {ar_send_in, ar_size, ar_recv_R, ar_mine};
    LOOM_CHECK(exchange(x, &scatter));
    const void *srcs[LOOM_DK_MAX_SRCS];
    for (int p = 0; p < x->n; p++)
        srcs[p] = p == x->me ? ar_send_in(x, p) : ar_recv_R(x, p);
    LOOM_CHECK(reduce_into(x, ar_recv_out(x, x->me), srcs, ar_size(x, x->me)));
    if (x->len % (size_t)x->n == 0) {
        size_t b = ar_B(x) * x->es;
        char *out = out_blk(x, 0);
        return ok(
            x,
            x->nl->AllGather(out + (size_t)x->me * b, out, b, LOOM_NCCL_UINT8, x->st->comm, x->s),
            "ncclAllGather");
    }
    const xchg_t gather = {ar_send_out, ar_mine, ar_recv_out, ar_size};
    return exchange(x, &gather);
}

/* ---- the others: whole blocks of len elements ------------------------------------ */
static size_t whole(const nrun_t *x, int p)
{
    (void)p;
    return x->len;
}
static const void *blk_in(const nrun_t *x, int p)
{
    return in_blk(x, p);
}
static const void *first_in(const nrun_t *x, int p)
{
    (void)p;
    return in_blk(x, 0);
}
static void *blk_out(const nrun_t *x, int p)
{
    return out_blk(x, p);
}
static void *slot_R(const nrun_t *x, int p)
{
    return at(x->R, (size_t)p * x->len, x->es);
}

static loomResult_t reduce_blocks(nrun_t *x, const void *own)
{
    const void *srcs[LOOM_DK_MAX_SRCS];
    for (int p = 0; p < x->n; p++)
        srcs[p] = p == x->me ? own : slot_R(x, p);
    return reduce_into(x, out_blk(x, 0), srcs, x->len);
}

static loomResult_t run_chunk(nrun_t *x, int single)
{
    const loom_coll_args_t *c = x->c;
    switch (c->kind) {
    case LOOM_COLL_ALLREDUCE:
        return allreduce(x);
    case LOOM_COLL_REDUCE_SCATTER: {
        const xchg_t e = {blk_in, whole, slot_R, whole};
        LOOM_CHECK(exchange(x, &e));
        return reduce_blocks(x, in_blk(x, x->me));
    }
    case LOOM_COLL_REDUCE: {
        if (x->me != c->root) {
            LOOM_CHECK(ok(x, x->nl->GroupStart(), "ncclGroupStart"));
            loomResult_t r = send(x, in_blk(x, 0), x->len, c->root);
            loomResult_t end = ok(x, x->nl->GroupEnd(), "ncclGroupEnd");
            return r != loomSuccess ? r : end;
        }
        const xchg_t e = {NULL, NULL, slot_R, whole};
        LOOM_CHECK(exchange(x, &e));
        return reduce_blocks(x, in_blk(x, 0));
    }
    case LOOM_COLL_ALLGATHER: {
        if (single)
            return ok(x,
                      x->nl->AllGather(in_blk(x, 0), out_blk(x, 0), x->len * x->es, LOOM_NCCL_UINT8,
                                       x->st->comm, x->s),
                      "ncclAllGather");
        const xchg_t e = {first_in, whole, blk_out, whole};
        LOOM_CHECK(exchange(x, &e));
        return copy(x, out_blk(x, x->me), in_blk(x, 0), x->len);
    }
    case LOOM_COLL_BCAST: {
        char *out = out_blk(x, 0);
        const void *in = x->me == c->root ? (const void *)in_blk(x, 0) : out;
        return ok(
            x,
            x->nl->Broadcast(in, out, x->len * x->es, LOOM_NCCL_UINT8, c->root, x->st->comm, x->s),
            "ncclBroadcast");
    }
    case LOOM_COLL_ALLTOALL: {
        const xchg_t e = {blk_in, whole, blk_out, whole};
        LOOM_CHECK(exchange(x, &e));
        return copy(x, out_blk(x, x->me), in_blk(x, x->me), x->len);
    }
    default:
        return loomInternalError;
    }
}

/* Blocks of the caller's buffers the chunk stages. */
static int in_blocks(const nrun_t *x)
{
    return x->c->kind == LOOM_COLL_REDUCE_SCATTER || x->c->kind == LOOM_COLL_ALLTOALL ? x->n : 1;
}
static int out_blocks(const nrun_t *x)
{
    return x->c->kind == LOOM_COLL_ALLGATHER || x->c->kind == LOOM_COLL_ALLTOALL ? x->n : 1;
}

static loomResult_t chunk(nrun_t *x, int single)
{
    const loom_coll_args_t *c = x->c;
    if (!x->in_dev)
        for (int j = 0; j < in_blocks(x); j++)
            LOOM_CHECK(copy(x, at(x->IN, (size_t)j * x->len, x->es),
                            at(c->sendbuff, (size_t)j * c->count + x->off, x->es), x->len));
    LOOM_CHECK(run_chunk(x, single));
    if (!x->out_dev)
        for (int j = 0; j < out_blocks(x); j++)
            LOOM_CHECK(copy(x, at(c->recvbuff, (size_t)j * c->count + x->off, x->es),
                            at(x->OUT, (size_t)j * x->len, x->es), x->len));
    return loomSuccess;
}

static loomResult_t run_locked(loom_dev_comm_t *dc, nccl_state_t *st, const loom_coll_args_t *c,
                               loom_dev_stream_t s)
{
    nrun_t x;
    memset(&x, 0, sizeof(x));
    x.st = st;
    x.rt = st->rt;
    x.nl = st->lib;
    x.c = c;
    x.s = s;
    x.es = loom_dtype_size(c->dt);
    x.n = st->nranks;
    x.me = st->rank;
    x.per = chunk_elems(st, c->kind, x.es);
    if (x.per == 0) {
        loom_set_last_error("nccl device transport: LOOM_DEVICE_NCCL_BYTES (%zu) is too small "
                            "for a chunk of this collective on %d ranks",
                            st->chunk_bytes, st->nranks);
        return loomInvalidUsage;
    }
    x.reads = c->kind != LOOM_COLL_BCAST || x.me == c->root;
    x.writes = c->kind != LOOM_COLL_REDUCE || x.me == c->root;
    x.in_dev = !x.reads || x.rt->ptr_device(c->sendbuff) >= 0;
    x.out_dev = !x.writes || x.rt->ptr_device(c->recvbuff) >= 0;
    size_t mult, extra;
    need(c->kind, (size_t)x.n, &mult, &extra);
    (void)mult;
    size_t r_bytes = 0, in_bytes = x.per * x.es * (size_t)in_blocks(&x);
    switch (c->kind) {
    case LOOM_COLL_ALLREDUCE:
        r_bytes = (x.per + extra) * x.es;
        break;
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_REDUCE:
        r_bytes = x.per * x.es * (size_t)x.n;
        break;
    default:
        break;
    }
    x.R = st->scratch;
    x.IN = x.R + align_up(r_bytes);
    x.OUT = x.IN + align_up(in_bytes);
    (void)dc;
    int single = c->count <= x.per;
    for (x.off = 0; x.off < c->count; x.off += x.per) {
        x.len = c->count - x.off < x.per ? c->count - x.off : x.per;
        LOOM_CHECK(chunk(&x, single));
    }
    return loomSuccess;
}

loomResult_t loom_devtp_nccl_run(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                                 loom_dev_stream_t s)
{
    nccl_state_t *st = state;
    if (st == NULL || !loom_devtp_nccl_handles(dc, st, call)) {
        loom_set_last_error("nccl device transport: collective %d, datatype %d, op %d is not one "
                            "it runs",
                            (int)call->kind, (int)call->dt, (int)call->op);
        return loomInvalidArgument;
    }
    if ((call->kind == LOOM_COLL_BCAST || call->kind == LOOM_COLL_REDUCE) &&
        (call->root < 0 || call->root >= st->nranks)) {
        loom_set_last_error("nccl device transport: root %d is not a rank of %d", call->root,
                            st->nranks);
        return loomInvalidArgument;
    }
    if (call->count == 0)
        return loomSuccess;
    pthread_mutex_lock(&st->lock);
    loomResult_t r;
    if (st->aborted) {
        loom_set_last_error("nccl device transport: released (the communicator was aborted, "
                            "revoked or timed out): nothing more is queued");
        r = loomInvalidUsage;
    } else {
        r = run_locked(dc, st, call, s);
    }
    pthread_mutex_unlock(&st->lock);
    if (r != loomSuccess)
        return r;
    return loom_devtp_track(&st->track, st->rt, s);
}

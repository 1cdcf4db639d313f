/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_ipc_run.c - the ipc device transport's calls: which collectives it
 * runs, and the chunks of one call queued on a stream with the flag protocol
 * of devtp_ipc.c (steps (a) to (f); the argument that it is race free is
 * there). A chunk is as many elements as fit a rank's scratch: its whole
 * input for AllReduce, Reduce, Broadcast and AllGather, its n blocks side by
 * side (block j at j * len elements) for ReduceScatter and AllToAll. Every
 * rank computes the same chunks from the call's arguments alone, so the
 * ranks' flag operations pair up. Reductions run loom's device kernel over
 * the n scratch buffers in rank order (the bits of the host collectives).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "devtp_ipc.h"
#include "dtype.h"

/* Chunks end on this many bytes where they can (the kernels' vector loads). */
#define IPC_ALIGN_BYTES 256u

int loom_devtp_ipc_handles(const loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call)
{
    (void)state;
    if (dc->nranks > LOOM_DK_MAX_SRCS || !loom_dtype_valid(call->dt))
        return 0;
    switch (call->kind) {
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_REDUCE:
        return loom_dk_dtype_ok(call->dt) && loom_redop_valid(call->op);
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_BCAST:
    case LOOM_COLL_ALLTOALL:
        return 1; /* bytes are copied: every datatype */
    default:
        return 0;
    }
}

typedef struct {
    ipc_state_t *st;
    const loom_devrt_t *rt;
    const loom_coll_args_t *c;
    loom_dev_stream_t s;
    size_t es; /* element bytes */
    int n, me;
} run_t;

static char *at(const void *p, size_t elems, size_t es)
{
    return (char *)(uintptr_t)p + elems * es;
}

static loomResult_t copy(run_t *x, void *dst, const void *src, size_t elems)
{
    if (elems == 0 || dst == src)
        return loomSuccess;
    return x->rt->memcpy_async(dst, src, elems * x->es, x->s);
}

/* dst[0, len) = op over ranks of the n scratch buffers at element offset boff. A
 * host destination is computed in the device staging buffer and copied out. */
static loomResult_t reduce(run_t *x, void *dst, size_t boff, size_t len)
{
    const void *srcs[LOOM_DK_MAX_SRCS];
    const loom_devrt_t *rt = x->rt;
    if (rt->ptr_device(dst) >= 0) {
        for (int p = 0; p < x->n; p++)
            srcs[p] = at(x->st->peer[p], boff, x->es);
        return rt->reduce(x->s, x->c->dt, x->c->op, dst, srcs, x->n, len, x->n);
    }
    size_t piece = x->st->out_bytes / x->es;
    for (size_t o = 0; o < len; o += piece) {
        size_t m = len - o < piece ? len - o : piece;
        for (int p = 0; p < x->n; p++)
            srcs[p] = at(x->st->peer[p], boff + o, x->es);
        LOOM_CHECK(rt->reduce(x->s, x->c->dt, x->c->op, x->st->out, srcs, x->n, m, x->n));
        LOOM_CHECK(copy(x, at(dst, o, x->es), x->st->out, m));
    }
    return loomSuccess;
}

/* Steps (a) and (d): wait for every peer's word of `kind` in this rank's
 * block, then reset it. */
static loomResult_t wait_peers(run_t *x, unsigned kind)
{
    for (int p = 0; p < x->n; p++) {
        if (p == x->me)
            continue;
        uint32_t *w = ipc_flag_dev(x->st, x->me, kind, p);
        LOOM_CHECK(x->rt->wait_u32(x->s, w, 1));
        LOOM_CHECK(x->rt->write_u32(x->s, w, 0));
    }
    return loomSuccess;
}

/* Steps (c) and (f): this rank's word of `kind` in every peer's block. */
static loomResult_t signal_peers(run_t *x, unsigned kind)
{
    for (int p = 0; p < x->n; p++)
        if (p != x->me)
            LOOM_CHECK(x->rt->write_u32(x->s, ipc_flag_dev(x->st, p, kind, x->me), 1));
    return loomSuccess;
}

/* (b): this rank's input of elements [off, off + len) into its scratch. */
static loomResult_t copy_in(run_t *x, size_t off, size_t len)
{
    const loom_coll_args_t *c = x->c;
    void *scratch = x->st->scratch;
    switch (c->kind) {
    case LOOM_COLL_BCAST:
        return x->me == c->root ? copy(x, scratch, at(c->sendbuff, off, x->es), len) : loomSuccess;
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLTOALL:
        for (int j = 0; j < x->n; j++)
            LOOM_CHECK(copy(x, at(scratch, (size_t)j * len, x->es),
                            at(c->sendbuff, (size_t)j * c->count + off, x->es), len));
        return loomSuccess;
    default:
        return copy(x, scratch, at(c->sendbuff, off, x->es), len);
    }
}

/* (e): the chunk's result from the n scratch buffers. */
static loomResult_t work(run_t *x, size_t off, size_t len)
{
    const loom_coll_args_t *c = x->c;
    void *const *peer = x->st->peer;
    switch (c->kind) {
    case LOOM_COLL_ALLREDUCE:
        return reduce(x, at(c->recvbuff, off, x->es), 0, len);
    case LOOM_COLL_REDUCE:
        return x->me == c->root ? reduce(x, at(c->recvbuff, off, x->es), 0, len) : loomSuccess;
    case LOOM_COLL_REDUCE_SCATTER:
        return reduce(x, at(c->recvbuff, off, x->es), (size_t)x->me * len, len);
    case LOOM_COLL_BCAST:
        if (x->me == c->root && c->sendbuff == c->recvbuff)
            return loomSuccess;
        return copy(x, at(c->recvbuff, off, x->es), peer[c->root], len);
    case LOOM_COLL_ALLGATHER:
        for (int p = 0; p < x->n; p++) {
            void *dst = at(c->recvbuff, (size_t)p * c->count + off, x->es);
            if (p == x->me && dst == at(c->sendbuff, off, x->es))
                continue; /* in place: already there */
            LOOM_CHECK(copy(x, dst, peer[p], len));
        }
        return loomSuccess;
    case LOOM_COLL_ALLTOALL:
        for (int p = 0; p < x->n; p++)
            LOOM_CHECK(copy(x, at(c->recvbuff, (size_t)p * c->count + off, x->es),
                            at(peer[p], (size_t)x->me * len, x->es), len));
        return loomSuccess;
    default:
        return loomInternalError;
    }
}

static loomResult_t chunk(run_t *x, size_t off, size_t len)
{
    LOOM_CHECK(wait_peers(x, IPC_DONE));    /* (a) */
    LOOM_CHECK(copy_in(x, off, len));       /* (b) */
    LOOM_CHECK(signal_peers(x, IPC_READY)); /* (c) */
    LOOM_CHECK(wait_peers(x, IPC_READY));   /* (d) */
    LOOM_CHECK(work(x, off, len));          /* (e) */
    return signal_peers(x, IPC_DONE);       /* (f) */
}

/* Elements per chunk: what fits the scratch (n blocks of it for ReduceScatter
 * and AllToAll), ending on IPC_ALIGN_BYTES where that leaves at least one. */
static size_t chunk_elems(const ipc_state_t *st, loom_coll_kind_t kind, size_t es)
{
    size_t per =
        kind == LOOM_COLL_REDUCE_SCATTER || kind == LOOM_COLL_ALLTOALL ? (size_t)st->nranks : 1;
    size_t c = st->chunk_bytes / (es * per);
    size_t align = IPC_ALIGN_BYTES / es;
    if (c > align)
        c -= c % align;
    return c;
}

loomResult_t loom_devtp_ipc_run(loom_dev_comm_t *dc, void *state, const loom_coll_args_t *call,
                                loom_dev_stream_t s)
{
    ipc_state_t *st = state;
    if (st == NULL || !loom_devtp_ipc_handles(dc, st, call)) {
        loom_set_last_error("ipc device transport: collective %d, datatype %d, op %d is not one "
                            "it runs",
                            (int)call->kind, (int)call->dt, (int)call->op);
        return loomInvalidArgument;
    }
    if ((call->kind == LOOM_COLL_BCAST || call->kind == LOOM_COLL_REDUCE) &&
        (call->root < 0 || call->root >= st->nranks)) {
        loom_set_last_error("ipc device transport: root %d is not a rank of %d", call->root,
                            st->nranks);
        return loomInvalidArgument;
    }
    if (__atomic_load_n(&st->released, __ATOMIC_ACQUIRE)) {
        loom_set_last_error("ipc device transport: released (the communicator was aborted, "
                            "revoked or timed out): nothing more is queued");
        return loomInvalidUsage;
    }
    if (call->count == 0)
        return loomSuccess;
    run_t x = {st, st->rt, call, s, loom_dtype_size(call->dt), st->nranks, st->rank};
    size_t per = chunk_elems(st, call->kind, x.es);
    loomResult_t r = loomSuccess;
    for (size_t off = 0; off < call->count && r == loomSuccess; off += per)
        r = chunk(&x, off, call->count - off < per ? call->count - off : per);
    if (r != loomSuccess) {
        /* Half a call is queued: this rank's stream must not wait for what
         * will never come. The peers learn of it through the watchdog. */
        LOOM_WARN("ipc device transport: rank %d: queuing a call failed half way (%s); releasing "
                  "the transport",
                  st->rank, loomGetLastError(NULL));
        loom_devtp_ipc_release(dc, st);
        return r;
    }
    return loom_devtp_track(&st->track, st->rt, s);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_impl_coll.c - the collectives and point-to-point calls in route and
 * loom modes: look the handle up, check what loom must check before it can
 * decide, ask the routing rules (shim_route.h) where the call goes, trace the
 * decision, and run it on the real library, loom or Echo.
 *
 * On loom: the datatypes and built-in ops share NCCL's numbering; AlltoAll is
 * loomAllToAll; Bcast is an in-place loomBroadcast; Gather and Scatter, which
 * loom lacks, are Sends and Recvs in one loom group (the root copies its own
 * block); a PreMulSum op scales the input into a temporary (shim_premul.h)
 * that loom sums. Echo runs without error feedback (state NULL): a shim call
 * carries no object to key the residual to, and frameworks reuse one buffer
 * for unrelated values (every layer, every bucket), so a residual kept per
 * buffer would feed one tensor's error into another.
 *
 * Streams, host buffers: NULL runs the call before returning; a loom stream
 * queues it (and the scaling and copies around it, as host functions, in
 * order); a CUDA stream is synchronized first, then the call runs before
 * returning.
 * Device buffers (CUDA device memory, as the driver says) go to loom's
 * device path as they are, where loom's communicator has one: a loom stream
 * queues the call; a CUDA stream (NULL: CUDA's default stream) is handed to
 * loom as the loom stream wrapping it (shim_streams.h), so the call is
 * queued on it and returns, as NCCL's does. Whether the stream is being
 * captured is loom's business: it refuses a capture on a transport that
 * cannot be captured, with its reason. Nothing runs on the host around such
 * a call: Gather's and Scatter's own block is a Send and Recv of the root to
 * itself in the same loom group, and PreMulSum, whose input the shim scales
 * on the host, is refused (route mode sends it to NCCL).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom_echo.h"
#include "shim_buffers.h"
#include "shim_coll.h"
#include "shim_group.h"
#include "shim_streams.h"

/* ---- the rules ------------------------------------------------------------ */

static pthread_once_t rules_once = PTHREAD_ONCE_INIT;
static const shim_rules_t *rules;
static char rules_err[256];

static void rules_load(void)
{
    const char *text = getenv("LOOM_NCCL_ROUTE");
    if (text != NULL && *text) {
        shim_rules_t *parsed = NULL;
        if (shim_rules_parse(text, &parsed, rules_err, sizeof(rules_err)) == ncclSuccess)
            rules = parsed; /* kept for the life of the process */
        else if (rules_err[0] == '\0')
            snprintf(rules_err, sizeof(rules_err), "cannot parse \"%s\"", text);
    } else {
        const char *echo = getenv("LOOM_NCCL_ECHO");
        rules = shim_rules_default(echo != NULL && strcmp(echo, "1") == 0);
    }
    if (rules != NULL)
        shim_log(SHIM_LOG_INFO, "routing rules: %s", shim_rules_text(rules));
}

/* ---- names for the trace ---------------------------------------------------- */

static int is_reduction(shim_coll_t coll)
{
    return coll == SHIM_COLL_ALLREDUCE || coll == SHIM_COLL_REDUCESCATTER ||
           coll == SHIM_COLL_REDUCE;
}

static int is_rooted(shim_coll_t coll)
{
    return coll == SHIM_COLL_BROADCAST || coll == SHIM_COLL_REDUCE || coll == SHIM_COLL_GATHER ||
           coll == SHIM_COLL_SCATTER;
}

/* ---- the real library ------------------------------------------------------- */

static ncclResult_t real_call(const shim_op_t *o, ncclComm_t h)
{
    const ncclRedOp_t op = (ncclRedOp_t)o->op;
    const void *sb = o->sendbuff;
    void *rb = o->recvbuff;
    const size_t n = o->count;
    const ncclDataType_t dt = o->datatype;
    cudaStream_t s = o->stream;
    switch (o->coll) {
    case SHIM_COLL_ALLREDUCE:
        return SHIM_REAL(AllReduce, (sb, rb, n, dt, op, h, s));
    case SHIM_COLL_ALLGATHER:
        return SHIM_REAL(AllGather, (sb, rb, n, dt, h, s));
    case SHIM_COLL_REDUCESCATTER:
        return SHIM_REAL(ReduceScatter, (sb, rb, n, dt, op, h, s));
    case SHIM_COLL_BROADCAST:
        return o->bcast ? SHIM_REAL(Bcast, (rb, n, dt, o->root, h, s))
                        : SHIM_REAL(Broadcast, (sb, rb, n, dt, o->root, h, s));
    case SHIM_COLL_REDUCE:
        return SHIM_REAL(Reduce, (sb, rb, n, dt, op, o->root, h, s));
    case SHIM_COLL_ALLTOALL:
        return SHIM_REAL(AlltoAll, (sb, rb, n, dt, h, s));
    case SHIM_COLL_GATHER:
        return SHIM_REAL(Gather, (sb, rb, n, dt, o->root, h, s));
    case SHIM_COLL_SCATTER:
        return SHIM_REAL(Scatter, (sb, rb, n, dt, o->root, h, s));
    case SHIM_COLL_SEND:
        return SHIM_REAL(Send, (sb, n, dt, o->peer, h, s));
    case SHIM_COLL_RECV:
        return SHIM_REAL(Recv, (rb, n, dt, o->peer, h, s));
    default:
        return shim_fail(ncclInternalError, "%s: unknown collective %d", o->fn, (int)o->coll);
    }
}

/* ---- work around a loom call: host functions and the group's after-list ------ */

typedef struct {
    loomStream_t stream; /* NULL: run right after the group */
    loomHostFn_t fn;
    void *arg;
} after_t;

/* Set while recorded ops are issued inside one loom group (shim_ops_replay):
 * what must wait for the group's loomGroupEnd. */
typedef struct {
    after_t *list;
    int n, cap;
} replay_t;

static void free_fn(void *arg, loomResult_t status)
{
    (void)status;
    free(arg);
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_t;

static void copy_fn(void *arg, loomResult_t status)
{
    (void)status;
    copy_t *c = arg;
    memmove(c->dst, c->src, c->bytes);
    free(c);
}

typedef struct {
    shim_premul_t pm;
    const void *src;
    void *dst;
    size_t count;
} scale_t;

static void scale_fn(void *arg, loomResult_t status)
{
    (void)status;
    scale_t *s = arg;
    shim_premul_scale(&s->pm, s->src, s->dst, s->count);
    free(s);
}

/* Runs fn(arg) after what was issued so far: now without a stream, else
 * queued on the stream; during a replay, after the group (the group's calls
 * are queued only at its loomGroupEnd). */
static ncclResult_t after(loomStream_t ls, replay_t *rp, loomHostFn_t fn, void *arg)
{
    if (rp != NULL) {
        if (rp->n == rp->cap) {
            int cap = rp->cap ? 2 * rp->cap : 8;
            after_t *l = realloc(rp->list, (size_t)cap * sizeof(*l));
            if (l == NULL) {
                /* Nothing queued can use arg yet only if there is no stream. */
                if (ls != NULL)
                    (void)loomStreamSynchronize(ls);
                fn(arg, loomSuccess);
                return shim_fail(ncclSystemError, "out of memory recording work after a group");
            }
            rp->list = l;
            rp->cap = cap;
        }
        rp->list[rp->n++] = (after_t){ls, fn, arg};
        return ncclSuccess;
    }
    if (ls == NULL) {
        fn(arg, loomSuccess);
        return ncclSuccess;
    }
    if (loomStreamLaunchHostFunc(ls, fn, arg) != loomSuccess) {
        /* The stream is going away or out of memory: once it is idle nothing of it can
         * touch arg any more. */
        (void)loomStreamSynchronize(ls);
        fn(arg, loomSuccess);
    }
    return ncclSuccess;
}

static void replay_finish(replay_t *rp)
{
    for (int i = 0; i < rp->n; i++)
        (void)after(rp->list[i].stream, NULL, rp->list[i].fn, rp->list[i].arg);
    free(rp->list);
    rp->list = NULL;
    rp->n = rp->cap = 0;
}

/* ---- loom's side --------------------------------------------------------------- */

/* Gather and Scatter as one loom group of Sends and Recvs; the root's own
 * block is a copy (none when in place). */
static loomResult_t gather_scatter(const shim_op_t *o, loomComm_t l, loomStream_t ls, replay_t *rp,
                                   ncclResult_t *side)
{
    const shim_comm_t *c = o->comm;
    const size_t bytes = o->count * shim_dtype_size(o->datatype);
    const loomDataType_t dt = (loomDataType_t)o->datatype;
    const int gather = o->coll == SHIM_COLL_GATHER;
    /* The root's own block: where it goes and where it comes from (the same when in place). */
    void *dst = NULL;
    const void *src = NULL;
    if (c->rank == o->root && bytes > 0) {
        dst = gather ? (char *)o->recvbuff + (size_t)o->root * bytes : o->recvbuff;
        src = gather ? o->sendbuff : (const char *)o->sendbuff + (size_t)o->root * bytes;
    }
    loomResult_t lr = loomGroupStart();
    for (int r = 0; lr == loomSuccess && r < c->nranks; r++) {
        if (r == o->root || (c->rank != o->root && r != c->rank))
            continue;
        if (c->rank != o->root)
            lr = gather ? loomSend(o->sendbuff, o->count, dt, o->root, l, ls)
                        : loomRecv(o->recvbuff, o->count, dt, o->root, l, ls);
        else
            lr = gather ? loomRecv((char *)o->recvbuff + (size_t)r * bytes, o->count, dt, r, l, ls)
                        : loomSend((const char *)o->sendbuff + (size_t)r * bytes, o->count, dt, r,
                                   l, ls);
    }
    /* On device memory the host cannot copy: the root sends the block to itself. */
    if (lr == loomSuccess && o->device && dst != src)
        lr = loomSend(src, o->count, dt, o->root, l, ls);
    if (lr == loomSuccess && o->device && dst != src)
        lr = loomRecv(dst, o->count, dt, o->root, l, ls);
    const loomResult_t end = loomGroupEnd();
    if (lr == loomSuccess)
        lr = end;
    if (lr != loomSuccess || o->device || dst == src)
        return lr;
    if (ls == NULL) {
        memmove(dst, src, bytes);
        return lr;
    }
    copy_t *cp = malloc(sizeof(*cp));
    if (cp == NULL) {
        (void)loomStreamSynchronize(ls);
        memmove(dst, src, bytes);
        return lr;
    }
    *cp = (copy_t){dst, src, bytes};
    *side = after(ls, rp, copy_fn, cp);
    return lr;
}

/* Scales a PreMulSum call's input into a new temporary, in stream order. */
static ncclResult_t premul_stage(const shim_op_t *o, loomStream_t ls, replay_t *rp, void **temp)
{
    const size_t n = o->count * (o->coll == SHIM_COLL_REDUCESCATTER ? (size_t)o->comm->nranks : 1);
    const size_t bytes = n * shim_dtype_size(o->datatype);
    void *t = malloc(bytes ? bytes : 1);
    if (t == NULL)
        return shim_fail(ncclSystemError,
                         "%s: out of memory for the %zu bytes of a PreMulSum "
                         "call's scaled input",
                         o->fn, bytes);
    if (ls != NULL && rp == NULL) {
        scale_t *s = malloc(sizeof(*s));
        if (s == NULL) {
            free(t);
            return shim_fail(ncclSystemError, "%s: out of memory", o->fn);
        }
        *s = (scale_t){o->pm, o->sendbuff, t, n};
        ncclResult_t r = after(ls, NULL, scale_fn, s);
        if (r != ncclSuccess) {
            free(t);
            return r;
        }
    } else {
        /* In a replay the group's calls reach the stream only at its end: wait for what
         * is queued before so that the input read now is the one the call would see. */
        if (ls != NULL)
            (void)loomStreamSynchronize(ls);
        shim_premul_scale(&o->pm, o->sendbuff, t, n);
    }
    *temp = t;
    return ncclSuccess;
}

/* Refuses a call on device buffers that loom's side of its communicator cannot take. */
static ncclResult_t device_check(const shim_op_t *o, loomComm_t l)
{
    const char *why = NULL;
    if (!shim_comm_device(o->comm, l, NULL, &why))
        return shim_fail(ncclInvalidUsage,
                         "%s: device buffers need loom's device path, which communicator %p does "
                         "not have: %s",
                         o->fn, (void *)o->comm->handle, why);
    if (o->premul)
        return shim_fail(ncclInvalidUsage,
                         "%s: a PreMulSum op on device buffers: loom scales a PreMulSum input on "
                         "the host, which cannot read device memory",
                         o->fn);
    return ncclSuccess;
}

static ncclResult_t issue(const shim_op_t *o, loomComm_t l, const shim_stream_t *st, replay_t *rp)
{
    loomStream_t ls = NULL;
    if (o->device) {
        ncclResult_t r = device_check(o, l);
        if (r == ncclSuccess && st->kind == SHIM_STREAM_LOOM)
            ls = st->loom;
        else if (r == ncclSuccess)
            r = shim_wrap_stream(o->comm, o->stream, o->fn, rp != NULL, &ls);
        if (r != ncclSuccess)
            return r;
    } else if (st->kind == SHIM_STREAM_CUDA) {
        ncclResult_t r = shim_stream_sync(o->stream, o->fn);
        if (r != ncclSuccess)
            return r;
    } else if (st->kind == SHIM_STREAM_LOOM) {
        ls = st->loom;
    }
    const void *send = o->sendbuff;
    void *temp = NULL;
    loomRedOp_t op = (loomRedOp_t)(o->op < 0 ? 0 : o->op);
    if (o->premul) {
        ncclResult_t r = premul_stage(o, ls, rp, &temp);
        if (r != ncclSuccess)
            return r;
        send = temp;
        op = loomSum;
    }
    const loomDataType_t dt = (loomDataType_t)o->datatype;
    ncclResult_t side = ncclSuccess;
    loomResult_t lr;
    switch (o->coll) {
    case SHIM_COLL_ALLREDUCE:
        lr = o->target == SHIM_TO_ECHO
                 ? loomEchoAllReduce(send, o->recvbuff, o->count, dt, l, NULL, ls)
                 : loomAllReduce(send, o->recvbuff, o->count, dt, op, l, ls);
        break;
    case SHIM_COLL_ALLGATHER:
        lr = loomAllGather(send, o->recvbuff, o->count, dt, l, ls);
        break;
    case SHIM_COLL_REDUCESCATTER:
        lr = loomReduceScatter(send, o->recvbuff, o->count, dt, op, l, ls);
        break;
    case SHIM_COLL_BROADCAST:
        lr =
            loomBroadcast(o->bcast ? o->recvbuff : send, o->recvbuff, o->count, dt, o->root, l, ls);
        break;
    case SHIM_COLL_REDUCE:
        lr = loomReduce(send, o->recvbuff, o->count, dt, op, o->root, l, ls);
        break;
    case SHIM_COLL_ALLTOALL:
        lr = loomAllToAll(send, o->recvbuff, o->count, dt, l, ls);
        break;
    case SHIM_COLL_GATHER:
    case SHIM_COLL_SCATTER:
        lr = gather_scatter(o, l, ls, rp, &side);
        break;
    case SHIM_COLL_SEND:
        lr = loomSend(send, o->count, dt, o->peer, l, ls);
        break;
    case SHIM_COLL_RECV:
        lr = loomRecv(o->recvbuff, o->count, dt, o->peer, l, ls);
        break;
    default:
        lr = loomInternalError;
        break;
    }
    const ncclResult_t r = shim_loom(lr);
    if (temp != NULL) {
        /* Without a stream and outside a replay the call is over: free at once. A queued
         * scaling still writes the temporary even if the call was refused, so a stream's
         * temporary always goes in stream order. */
        ncclResult_t fr = after(ls, rp, free_fn, temp);
        if (side == ncclSuccess)
            side = fr;
    }
    return r != ncclSuccess ? r : side;
}

/* ---- the shim's own calls ------------------------------------------------------ */

static size_t mul_sat(size_t a, size_t b)
{
    size_t p;
    return __builtin_mul_overflow(a, b, &p) ? (size_t)-1 : p;
}

/* The loomCollective_t of a collective loomCommDevicePlan answers for; -1 for the others. */
static int plan_coll(shim_coll_t coll)
{
    switch (coll) {
    case SHIM_COLL_ALLREDUCE:
        return loomCollAllReduce;
    case SHIM_COLL_ALLGATHER:
        return loomCollAllGather;
    case SHIM_COLL_REDUCESCATTER:
        return loomCollReduceScatter;
    case SHIM_COLL_BROADCAST:
        return loomCollBroadcast;
    case SHIM_COLL_REDUCE:
        return loomCollReduce;
    case SHIM_COLL_ALLTOALL:
        return loomCollAllToAll;
    default:
        return -1;
    }
}

/* What loom's side can do with a call's device buffers, for the rules. Route mode asks loom
 * (exact: plan set); loom mode has checked the device path and lets loom itself refuse what
 * its transports cannot run, so every call there may go to loom. */
static void device_facts(const shim_op_t *o, loomComm_t l, int plan, shim_call_t *call, char *why,
                         size_t whylen)
{
    const char *dev_why = NULL;
    call->loom_device = l == NULL || shim_comm_device(o->comm, l, NULL, &dev_why);
    call->loom_why = dev_why;
    call->loom_device_coll = call->loom_device;
    call->loom_capturable = call->loom_device;
    if (!plan || !call->loom_device)
        return;
    const int pc = plan_coll(o->coll);
    if (pc < 0) {
        /* Gather and Scatter: Sends and Recvs in a loom group, which run host-staged. */
        call->loom_capturable = 0;
        return;
    }
    const char *tp = NULL;
    int cap = 0;
    const int op = is_reduction(o->coll) && o->op >= 0 && o->op < ncclNumOps ? o->op : ncclSum;
    if (loomCommDevicePlan(l, (loomCollective_t)pc, (loomDataType_t)o->datatype, (loomRedOp_t)op,
                           &tp, &cap, why, whylen) != loomSuccess) {
        tp = NULL;
        snprintf(why, whylen, "%s", loomGetLastError(NULL));
    }
    call->loom_device_coll = tp != NULL;
    call->loom_capturable = tp != NULL && cap;
    call->loom_why = why;
}

static ncclResult_t coll_handle(shim_op_t *o, int paired, ncclComm_t h)
{
    shim_comm_t *c = o->comm;
    const size_t esize = shim_dtype_size(o->datatype);
    ncclResult_t op_res = ncclSuccess;
    if (is_reduction(o->coll) && !(o->op >= 0 && o->op < ncclNumOps)) {
        op_res = shim_premul_get(c, (ncclRedOp_t)o->op, o->datatype, o->fn, &o->pm);
        o->premul = op_res == ncclSuccess;
    }
    if (esize == 0 || op_res != ncclSuccess) {
        if (paired)
            return real_call(o, h); /* the real library names what is wrong */
        if (esize == 0)
            return shim_fail(ncclInvalidArgument, "%s: datatype %d is not valid", o->fn,
                             (int)o->datatype);
        return op_res;
    }

    const int in_group = shim_group_depth() > 0;
    shim_stream_t st;
    ncclResult_t r = shim_stream_classify(o->stream, o->fn, &st);
    if (r != ncclSuccess)
        return r;
    const int device = shim_any_device_ptr(o->sendbuff, o->recvbuff);
    o->device = device;
    if (!paired && !device && st.capturing)
        return shim_fail(ncclInvalidUsage,
                         "%s: stream %p is being captured into a CUDA graph, and loom's host path "
                         "(host buffers) cannot be captured",
                         o->fn, (void *)o->stream);
    pthread_once(&rules_once, rules_load);
    if (rules == NULL)
        return shim_fail(ncclInvalidArgument, "%s: LOOM_NCCL_ROUTE: %s", o->fn, rules_err);

    /* Usable now, or (loom mode, in a group) made by an init deferred in this group. */
    loomComm_t l = NULL;
    if (!(paired && in_group)) {
        pthread_mutex_lock(&c->lock);
        const int deferred = c->job != NULL && !c->job->started && c->state == ncclInProgress;
        pthread_mutex_unlock(&c->lock);
        if (!(deferred && in_group)) {
            r = shim_comm_ready(c, o->fn, &l);
            if (r != ncclSuccess)
                return r;
        }
    }
    if (is_rooted(o->coll) && (o->root < 0 || o->root >= c->nranks) && !paired)
        return shim_fail(ncclInvalidArgument, "%s: root %d out of range [0, %d)", o->fn, o->root,
                         c->nranks);
    /* Loom mode refuses what its device path cannot take now (a communicator still being made
     * in this group is asked when the group runs). */
    if (!paired && device && l != NULL && (r = device_check(o, l)) != ncclSuccess)
        return r;

    shim_call_t call = {.coll = o->coll,
                        .datatype = o->datatype,
                        .op = is_reduction(o->coll) ? o->op : -1,
                        .bytes = mul_sat(o->count, esize),
                        .nranks = c->nranks,
                        .hosts = c->hosts,
                        .name = c->named ? c->name : NULL,
                        .in_group = in_group,
                        .device_buffers = device,
                        .paired = paired,
                        .capturing = st.capturing};
    char dev_why[512] = "";
    if (device)
        device_facts(o, l, paired && !in_group, &call, dev_why, sizeof(dev_why));
    /* The reason is written only for the trace: formatting it costs as much as deciding. */
    const int tracing = shim_trace_enabled();
    char why[512];
    why[0] = '\0';
    shim_target_t t =
        shim_route_decide(rules, &call, tracing ? why : NULL, tracing ? sizeof(why) : 0);
    if (!paired && t == SHIM_TO_NCCL)
        t = SHIM_TO_LOOM; /* loom mode: NCCL's share is loom's exact path */
    if (tracing)
        shim_log(SHIM_LOG_TRACE, "%s comm=%d/%d count=%zu dtype=%s op=%s%s -> %s (%s)", o->fn,
                 c->rank, c->nranks, o->count, shim_dtype_name(o->datatype), shim_op_name(call.op),
                 device ? " buffers=device" : "", shim_target_name(t), why);
    if (t == SHIM_TO_NCCL)
        return real_call(o, h);
    o->target = t;
    if (in_group) {
        r = shim_group_record(o);
        if (r == ncclSuccess)
            o->comm = NULL; /* the record holds the reference now */
        return r;
    }
    return issue(o, l, &st, NULL);
}

static ncclResult_t coll_entry(shim_op_t *o, ncclComm_t h)
{
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_find(h);
    if (c == NULL) {
        if (paired) {
            if (shim_trace_enabled())
                shim_log(SHIM_LOG_TRACE,
                         "%s count=%zu -> nccl (not a communicator of this "
                         "library: passed through)",
                         o->fn, o->count);
            return real_call(o, h);
        }
        return shim_fail(ncclInvalidArgument,
                         "%s: %p is not a communicator of this library (destroyed, never "
                         "created, or made by another library)",
                         o->fn, (void *)h);
    }
    o->comm = c;
    ncclResult_t r = coll_handle(o, paired, h);
    if (o->comm != NULL)
        shim_comm_release(o->comm);
    return r;
}

ncclResult_t shim_ops_replay(shim_op_t *ops, int n)
{
    replay_t rp = {NULL, 0, 0};
    ncclResult_t res = ncclSuccess;
    (void)loomGroupStart();
    for (int i = 0; i < n; i++) {
        shim_op_t *o = &ops[i];
        loomComm_t l = NULL;
        shim_stream_t st;
        ncclResult_t r = shim_comm_ready(o->comm, o->fn, &l);
        if (r == ncclSuccess)
            r = shim_stream_classify(o->stream, o->fn, &st);
        if (r == ncclSuccess && is_rooted(o->coll) && (o->root < 0 || o->root >= o->comm->nranks))
            r = shim_fail(ncclInvalidArgument, "%s: root %d out of range [0, %d)", o->fn, o->root,
                          o->comm->nranks);
        if (r == ncclSuccess)
            r = issue(o, l, &st, &rp);
        if (res == ncclSuccess)
            res = r;
    }
    const ncclResult_t end = shim_loom(loomGroupEnd());
    if (res == ncclSuccess)
        res = end;
    replay_finish(&rp);
    for (int i = 0; i < n; i++)
        shim_comm_release(ops[i].comm);
    return res;
}

void shim_ops_discard(shim_op_t *ops, int n, ncclSimInfo_t *sim)
{
    double total = 0;
    int modelled = sim != NULL && n > 0;
    for (int i = 0; i < n; i++) {
        const shim_op_t *o = &ops[i];
        loomCollective_t lc = loomNumCollectives;
        switch (o->coll) {
        case SHIM_COLL_ALLREDUCE:
            lc = o->target == SHIM_TO_ECHO ? loomNumCollectives : loomCollAllReduce;
            break;
        case SHIM_COLL_ALLGATHER:
            lc = loomCollAllGather;
            break;
        case SHIM_COLL_REDUCESCATTER:
            lc = loomCollReduceScatter;
            break;
        case SHIM_COLL_BROADCAST:
            lc = loomCollBroadcast;
            break;
        case SHIM_COLL_REDUCE:
            lc = loomCollReduce;
            break;
        case SHIM_COLL_ALLTOALL:
            lc = loomCollAllToAll;
            break;
        default:
            break; /* Gather, Scatter, Send and Recv: not modelled */
        }
        loomComm_t l = NULL;
        double us = -1;
        pthread_mutex_lock(&o->comm->lock);
        if (o->comm->state == ncclSuccess)
            l = o->comm->loom;
        pthread_mutex_unlock(&o->comm->lock);
        if (modelled &&
            (lc == loomNumCollectives || l == NULL ||
             loomCommPlan(l, lc, o->count, (loomDataType_t)o->datatype, NULL, &us) != loomSuccess ||
             us < 0))
            modelled = 0;
        total += us;
        shim_comm_release(o->comm);
    }
    if (modelled)
        sim->estimatedTime = (float)total;
}

/* ---- the entry points ------------------------------------------------------------ */

#define OP(_coll, _fn, _send, _recv, _count, _dt, _op, _root, _peer, _stream)                      \
    (shim_op_t)                                                                                    \
    {                                                                                              \
        .coll = (_coll), .fn = (_fn), .sendbuff = (_send), .recvbuff = (_recv), .count = (_count), \
        .datatype = (_dt), .op = (_op), .root = (_root), .peer = (_peer), .stream = (_stream)      \
    }

ncclResult_t shim_impl_AllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype,
                     (int)op, -1, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_ReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_REDUCESCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                     datatype, (int)op, -1, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Reduce(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, (int)op,
                     root, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_AllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                     -1, -1, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Broadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, -1,
                     root, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Bcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                             ncclComm_t comm, cudaStream_t stream)
{
    shim_op_t o =
        OP(SHIM_COLL_BROADCAST, "ncclBcast", buff, buff, count, datatype, -1, root, -1, stream);
    o.bcast = 1;
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_AlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_ALLTOALL, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, -1,
                     -1, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Gather(const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_GATHER, "ncclGather", sendbuff, recvbuff, count, datatype, -1, root,
                     -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Scatter(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream)
{
    shim_op_t o = OP(SHIM_COLL_SCATTER, "ncclScatter", sendbuff, recvbuff, count, datatype, -1,
                     root, -1, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Send(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream)
{
    shim_op_t o =
        OP(SHIM_COLL_SEND, "ncclSend", sendbuff, NULL, count, datatype, -1, -1, peer, stream);
    return coll_entry(&o, comm);
}

ncclResult_t shim_impl_Recv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream)
{
    shim_op_t o =
        OP(SHIM_COLL_RECV, "ncclRecv", NULL, recvbuff, count, datatype, -1, -1, peer, stream);
    return coll_entry(&o, comm);
}

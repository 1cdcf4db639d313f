/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_common.c - what every shm collective shares: starting a call on the
 * arena (descriptor), checking that every rank called the same thing, the
 * end of a single-copy call, the reduction loop over rank-ordered sources,
 * the copies into and out of the arena (streaming stores where the plan says),
 * the machine the plan reads, and whether a shm algorithm can run on a
 * communicator at all.
 * It holds no algorithm (shm_reduce.c, shm_move.c). Callers: those files and
 * algo_select.c (loom_shm_algo_usable).
 *
 * Mismatches: every call publishes (seq, collective, algorithm, datatype, op,
 * root, count, rounds so far); a rank compares the descriptor of every peer
 * it takes data from with its own before it reads anything of that peer, so
 * a rank that called another collective, count or root gets InvalidUsage
 * (and its peers RemoteError through the notices) instead of reading or
 * writing past a buffer.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "check.h"
#include "dtype.h"
#include "kernels.h"
#include "param.h"
#include "shm_coll.h"
#include "timer.h"

void loom_shm_machine_fill(loom_shm_machine_t *m, size_t half, int single_copy, int kernel_fast)
{
    memset(m, 0, sizeof(*m));
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    m->cpus = cpus > 0 ? (int)cpus : 0;
    m->page = (size_t)getpagesize();
    loom_shm_caches(&m->l1d, &m->l2, &m->l3);
    m->half = half;
    m->single_copy = single_copy;
    m->kernel_fast = kernel_fast;
    const long mbps = loom_param_SHM_MEMORY_MBPS();
    m->memory_ns = mbps > 0 ? 1e3 / (double)mbps : 0.0;
}

void loom_shm_machine(loom_coll_ctx_t *ctx, loom_shm_machine_t *m)
{
    const loom_arena_t *ar = loom_shm_arena(ctx);
    loom_shm_machine_fill(m, ar ? loom_arena_half_bytes(ar) : 0,
                          ar ? loom_arena_single_copy(ar) : 0, ar ? loom_arena_copy_fast(ar) : 0);
    if (m->single_copy > 0)
        m->kernel_ns = loom_arena_kernel_copy_ns();
    if (ar != NULL) { /* the probe runs here, at creation, not in a call's copy */
        m->copy_backward = loom_shm_copy_backward_near();
        if (loom_param_SHM_COPY_BACKWARD() < 0)
            loom_shm_copy_probe_result(&m->copy_forward_ns, &m->copy_backward_ns);
    }
}

void loom_shm_plan_call(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, loom_shm_plan_t *p)
{
    loom_shm_overrides_t o;
    loom_shm_overrides(&o);
    loom_shm_plan(a->kind, loom_coll_bytes(a, ctx->nranks), ctx->nranks, &ctx->shm, &o, p);
}

uint32_t loom_shm_pick(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    /* Tiny calls need nothing of the machine, and are the ones whose every ns shows. */
    if (loom_shm_is_tiny(a->kind, loom_coll_bytes(a, ctx->nranks), ctx->nranks))
        return SHM_ALGO_TINY;
    loom_shm_plan_t p;
    loom_shm_plan_call(ctx, a, &p);
    return p.variant;
}

loomResult_t loom_shm_run(loom_coll_ctx_t *ctx, const loom_coll_args_t *a, loom_algo_fn_t flat,
                          loom_algo_fn_t cico, loom_algo_fn_t cma)
{
    switch (loom_shm_pick(ctx, a)) {
    case SHM_ALGO_TINY:
        return loom_shm_tiny(ctx, a);
    case SHM_ALGO_FLAT:
        return flat != NULL ? flat(ctx, a) : cico(ctx, a);
    case SHM_ALGO_CMA:
        return cma(ctx, a);
    default:
        return cico(ctx, a);
    }
}

int loom_shm_algo_usable(loom_coll_ctx_t *ctx, const char *name)
{
    if (strncmp(name, "shm", 3) != 0)
        return 1;
    const loom_arena_t *ar = loom_shm_arena(ctx);
    if (ar == NULL)
        return 0;
    size_t len = strlen(name);
    return !(len > 4 && strcmp(name + len - 4, "_cma") == 0 && !loom_arena_single_copy(ar));
}

int loom_shm_single_copy_agreed(loom_coll_ctx_t *ctx)
{
    const loom_arena_t *ar = loom_shm_arena(ctx);
    return ar != NULL && loom_arena_single_copy(ar);
}

loomResult_t loom_shm_call_init(shm_call_t *c, loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    c->ctx = ctx;
    c->a = a;
    c->ar = loom_shm_arena(ctx);
    c->n = ctx->nranks;
    c->me = ctx->rank;
    c->seq = ctx->seq;
    c->es = loom_dtype_size(a->dt);
    c->nt_out = 0;
    c->nt_in = 0;
    memset(&c->plan, 0, sizeof(c->plan));
    if (c->ar == NULL) {
        LOOM_WARN("rank %d: %s seq %llu: shm algorithm without a shared arena", c->me,
                  loom_coll_name(a->kind), (unsigned long long)c->seq);
        return loomInternalError;
    }
    return loomSuccess;
}

void loom_shm_describe(shm_call_t *c, uint32_t algo)
{
    const loom_coll_args_t *a = c->a;
    const int reduces = a->kind == LOOM_COLL_ALLREDUCE || a->kind == LOOM_COLL_REDUCE ||
                        a->kind == LOOM_COLL_REDUCE_SCATTER || a->kind == LOOM_COLL_REDUCE_SCATTERV;
    const int rooted = a->kind == LOOM_COLL_BCAST || a->kind == LOOM_COLL_REDUCE;
    memset(&c->desc, 0, sizeof(c->desc));
    c->desc.seq = c->seq;
    c->desc.kind = (uint32_t)a->kind;
    c->desc.algo = algo;
    c->desc.dt = a->kind == LOOM_COLL_BARRIER ? 0 : (int32_t)a->dt;
    c->desc.op = reduces ? (int32_t)a->op : 0;
    c->desc.root = rooted ? a->root : 0;
    c->desc.count = a->kind == LOOM_COLL_BARRIER ? 0 : a->count;
    c->desc.send = (uint64_t)(uintptr_t)a->sendbuff;
    c->desc.recv = (uint64_t)(uintptr_t)a->recvbuff;
}

loomResult_t loom_shm_begin(shm_call_t *c, loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                            uint32_t algo)
{
    LOOM_CHECK(loom_shm_call_init(c, ctx, a));
    if (algo != SHM_ALGO_BARRIER) /* the barrier copies nothing */
        loom_shm_plan_call(ctx, a, &c->plan);
    loom_shm_describe(c, algo);
    return loom_arena_begin(c->ar, &c->desc);
}

void loom_shm_tiny_unpack(uint64_t packed, uint64_t seq, loom_arena_desc_t *d)
{
    memset(d, 0, sizeof(*d));
    d->seq = seq;
    d->kind = (uint32_t)(packed & 0xffu);
    d->algo = SHM_ALGO_TINY;
    d->dt = (int32_t)((packed >> 8) & 0xffu);
    d->op = (int32_t)((packed >> 16) & 0xffu);
    d->count = (packed >> 24) & 0xffu;
    d->root = (int32_t)(uint32_t)(packed >> 32);
}

static int desc_equal(const loom_arena_desc_t *x, const loom_arena_desc_t *y)
{
    return x->seq == y->seq && x->kind == y->kind && x->algo == y->algo && x->dt == y->dt &&
           x->op == y->op && x->root == y->root && x->count == y->count && x->round == y->round;
}

static void desc_text(const loom_arena_desc_t *d, char *buf, size_t len)
{
    const char *algo = loom_shm_algo_name(d->algo);
    snprintf(buf, len, "%s seq %llu (%s, count %llu, datatype %d, op %d, root %d, round %u)",
             loom_coll_name((loom_coll_kind_t)d->kind), (unsigned long long)d->seq, algo,
             (unsigned long long)d->count, (int)d->dt, (int)d->op, (int)d->root, d->round);
}

loomResult_t loom_shm_mismatch(shm_call_t *c, int rank, const loom_arena_desc_t *theirs)
{
    char their_text[192], mine[192], what[480];
    desc_text(theirs, their_text, sizeof(their_text));
    desc_text(&c->desc, mine, sizeof(mine));
    snprintf(what, sizeof(what),
             "mismatched collectives: rank %d called %s, this rank (%d) called %s", rank,
             their_text, c->me, mine);
    return loom_arena_mismatch(c->ar, rank, theirs, what);
}

loomResult_t loom_shm_check(shm_call_t *c, int rank)
{
    for (int i = rank < 0 ? 0 : rank; i < (rank < 0 ? c->n : rank + 1); i++) {
        if (i == c->me)
            continue;
        loom_arena_desc_t d;
        loom_arena_peer_desc(c->ar, i, &d);
        if (desc_equal(&d, &c->desc))
            continue;
        /* A peer that runs this call as a tiny one left its descriptor in a cell. */
        uint64_t packed;
        if (d.seq != c->seq && loom_arena_peer_cell(c->ar, i, c->seq, &packed))
            loom_shm_tiny_unpack(packed, c->seq, &d);
        return loom_shm_mismatch(c, i, &d);
    }
    return loomSuccess;
}

loomResult_t loom_shm_finish_single_copy(shm_call_t *c)
{
    loom_arena_post(c->ar, shm_flag(c, SHM_STEP_DONE));
    LOOM_CHECK(loom_arena_wait(c->ar, -1, shm_flag(c, SHM_STEP_DONE)));
    return loom_arena_check_peers(c->ar);
}

// ---- copies -------------------------------------------------------------------------

#if defined(__x86_64__)
/* 64 bytes from s to d: streaming stores (d 16-byte aligned) or plain ones. */
static inline void move64(uint8_t *d, const uint8_t *s, int nt)
{
    const __m128i x0 = _mm_loadu_si128((const __m128i *)s);
    const __m128i x1 = _mm_loadu_si128((const __m128i *)(s + 16));
    const __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32));
    const __m128i x3 = _mm_loadu_si128((const __m128i *)(s + 48));
    if (nt) {
        _mm_stream_si128((__m128i *)d, x0);
        _mm_stream_si128((__m128i *)(d + 16), x1);
        _mm_stream_si128((__m128i *)(d + 32), x2);
        _mm_stream_si128((__m128i *)(d + 48), x3);
    } else {
        _mm_storeu_si128((__m128i *)d, x0);
        _mm_storeu_si128((__m128i *)(d + 16), x1);
        _mm_storeu_si128((__m128i *)(d + 32), x2);
        _mm_storeu_si128((__m128i *)(d + 48), x3);
    }
}
#endif

#if defined(__x86_64__)
static void copy_backward(uint8_t *d, const uint8_t *s, size_t bytes)
{
    const size_t body = bytes & ~(size_t)63u;
    memcpy(d + body, s + body, bytes - body);
    for (size_t i = body; i > 0; i -= 64)
        move64(d + i - 64, s + i - 64, 0);
}
#endif

/* The copy-direction probe: whether near pairs (arena.h) copy faster backwards, and what it
 * measured (ns for COPY_PROBE_BYTES: the slowest forward distance, backwards). */
#define COPY_PROBE_BYTES (32u << 10)
#define COPY_PROBE_REPS  15
static pthread_once_t copy_once = PTHREAD_ONCE_INIT;
static int copy_backward_measured;
static double copy_forward_ns, copy_backward_ns;
static int copy_forced = -1; /* loom_shm_copy_force_backward */

static uint64_t best_copy(uint8_t *d, const uint8_t *s, int backward)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < COPY_PROBE_REPS; i++) {
        const uint64_t t0 = loom_now_ns();
#if defined(__x86_64__)
        if (backward)
            copy_backward(d, s, COPY_PROBE_BYTES);
        else
#endif
            memcpy(d, s, COPY_PROBE_BYTES);
        __asm__ __volatile__("" : : "r"(d) : "memory"); /* the copy is not dead */
        const uint64_t t = loom_now_ns() - t0;
        best = t < best ? t : best;
    }
    return best;
}

static void copy_probe(void)
{
#if defined(__x86_64__)
    /* Spread over the near window: 64, 320, 704 and 960 bytes for a 1 KiB one. */
    const size_t span = LOOM_ARENA_ALIAS_SPAN, w = LOOM_ARENA_ALIAS_NEAR / 16;
    const size_t near[] = {w, 5 * w, 11 * w, 15 * w};
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, span, 2 * COPY_PROBE_BYTES + 2 * span) != 0)
        return; /* no memory: forwards, as a copy with no reason to turn */
    memset(buf, 1, 2 * COPY_PROBE_BYTES + 2 * span);
    const uint8_t *s = buf;
    uint8_t *base = buf + COPY_PROBE_BYTES + span; /* page aligned, past the source */
    uint64_t forward = 0;
    for (size_t k = 0; k < sizeof(near) / sizeof(near[0]); k++) {
        const uint64_t t = best_copy(base + near[k], s, 0);
        forward = t > forward ? t : forward;
    }
    const uint64_t backward = best_copy(base + near[0], s, 1);
    free(buf);
    copy_forward_ns = (double)forward;
    copy_backward_ns = (double)backward;
    copy_backward_measured = backward < forward;
#endif
}

int loom_shm_copy_backward_near(void)
{
    const int forced = __atomic_load_n(&copy_forced, __ATOMIC_RELAXED);
    if (forced >= 0)
        return forced;
    const long p = loom_param_SHM_COPY_BACKWARD();
    if (p >= 0)
        return p > 0;
    pthread_once(&copy_once, copy_probe);
    return copy_backward_measured;
}

void loom_shm_copy_probe_result(double *forward_ns, double *backward_ns)
{
    pthread_once(&copy_once, copy_probe);
    *forward_ns = copy_forward_ns;
    *backward_ns = copy_backward_ns;
}

void loom_shm_copy_force_backward(int mode)
{
    __atomic_store_n(&copy_forced, mode < 0 ? -1 : mode > 0, __ATOMIC_RELAXED);
}

void loom_shm_copy(void *dst, const void *src, size_t bytes, int nt)
{
#if defined(__x86_64__)
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (nt && bytes >= 256) {
        const size_t head = (size_t)(-(uintptr_t)d & 15u); /* streaming stores are aligned */
        memcpy(d, s, head);
        d += head;
        s += head;
        bytes -= head;
        const size_t body = bytes & ~(size_t)63u;
        for (size_t i = 0; i < body; i += 64)
            move64(d + i, s + i, 1);
        memcpy(d + body, s + body, bytes - body);
        _mm_sfence(); /* streaming stores are weakly ordered */
        return;
    }
    /* A destination just past the source modulo the aliasing span (arena.h): a forward
     * copy's loads could wait on its own recent stores, so this copies backwards where the
     * probe found that faster (docs/shm-collectives.md, "Copy direction"). */
    if (bytes >= LOOM_ARENA_ALIAS_SPAN &&
        (((uintptr_t)d - (uintptr_t)s) & (LOOM_ARENA_ALIAS_SPAN - 1)) < LOOM_ARENA_ALIAS_NEAR &&
        loom_shm_copy_backward_near()) {
        copy_backward(d, s, bytes);
        return;
    }
#else
    (void)nt;
#endif
    memcpy(dst, src, bytes);
}

void loom_shm_copy_in(const shm_call_t *c, void *dst, const void *src, size_t bytes)
{
    loom_shm_copy(dst, src, bytes, c->nt_in);
}

void loom_shm_copy_out(const shm_call_t *c, void *dst, const void *src, size_t bytes)
{
    loom_shm_copy(dst, src, bytes, c->nt_out);
}

// ---- reduction -----------------------------------------------------------------------

size_t loom_shm_block_elems(const shm_call_t *c)
{
    size_t es = loom_dtype_size(c->a->dt), as = loom_acc_size(c->a->dt);
    size_t w = es > as ? es : as;
    return c->plan.block_bytes / (w ? w : 1);
}

loomResult_t loom_shm_scratch(shm_call_t *c, uint8_t **acc_p, uint8_t **tmp_p)
{
    uint8_t *s;
    LOOM_CHECK(loom_coll_scratch(c->ctx, 2 * c->plan.block_bytes, &s));
    *acc_p = s;
    *tmp_p = s + c->plan.block_bytes;
    return loomSuccess;
}

static int overlaps(const void *a, const void *b, size_t bytes)
{
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bytes && y < x + bytes;
}

/* 1 if the fused kernel may write dst while it reads srcs: it loads every
 * source of a step before storing, so a source may be dst itself (in place)
 * but must not overlap it otherwise. */
static int fusable(const shm_call_t *c, const void *const *srcs, size_t len, const void *dst)
{
    const size_t bytes = len * c->es;
    for (int r = 0; r < c->n; r++)
        if (srcs[r] != dst && overlaps(srcs[r], dst, bytes))
            return 0;
    return 1;
}

/* Accumulating straight into dst saves a pass over the data; it needs the
 * accumulator to be the datatype and dst not to overlap a source it would
 * clobber before reading (rank 0's source may be dst itself: init then
 * copies onto itself). */
static int acc_in_dst(const shm_call_t *c, const void *const *srcs, size_t len, const void *dst)
{
    if (!loom_acc_is_native(c->a->dt))
        return 0;
    const size_t bytes = len * c->es;
    if (srcs[0] != dst && overlaps(srcs[0], dst, bytes))
        return 0;
    for (int r = 1; r < c->n; r++)
        if (overlaps(srcs[r], dst, bytes))
            return 0;
    return 1;
}

/* Large calls are bound by passes over memory: the fused kernel reads every
 * source once and writes dst once (3 passes for 2 ranks, against 5 for init,
 * acc and finish in dst), with the same bits. Buffers that overlap partially
 * (never the case for NCCL's in-place layouts) take the unfused path. */
const void **loom_shm_srcs(int n, int rank, const void **small)
{
    const void **srcs = n <= SHM_SRCS_SMALL ? small : malloc(sizeof(*srcs) * (size_t)n);
    if (srcs == NULL)
        LOOM_WARN("rank %d: out of memory for %d sources", rank, n);
    return srcs;
}

void loom_shm_srcs_free(const void **srcs, const void **small)
{
    if (srcs != small)
        free((void *)srcs);
}

void loom_shm_reduce(const shm_call_t *c, const void *const *srcs, size_t len, void *acc, void *dst,
                     void *dst2)
{
    const loomDataType_t dt = c->a->dt;
    if (fusable(c, srcs, len, dst)) {
        loom_reduce_multi(dt, c->a->op, dst, srcs, c->n, len, c->n);
    } else {
        void *target = acc_in_dst(c, srcs, len, dst) ? dst : acc;
        loom_reduce_init(dt, target, srcs[0], len);
        for (int r = 1; r < c->n; r++)
            loom_reduce_acc(dt, c->a->op, target, srcs[r], len);
        loom_reduce_finish(dt, c->a->op, dst, target, len, c->n);
    }
    if (dst2 != NULL) /* the arena's copy, which peers read */
        loom_shm_copy_in(c, dst2, dst, len * c->es);
}

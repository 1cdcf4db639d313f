/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_probe.c - what the arena's own path costs on this machine, measured at communicator
 * creation (calibrate.c) for the prediction of the shm collectives (shm_cost.c): the time of a
 * flag round, the time per byte that a rank copies into or out of the arena, and the time of
 * one real call of every collective. The point-to-point calibration cannot stand in for it: its
 * waits sleep where ranks outnumber the CPUs, which the arena's do not, and its rings are not
 * the arena's slots.
 *
 * It runs real arena AllGathers (cico, the simplest pattern that moves bytes both ways: a rank
 * copies its block in and every other block out) of two block sizes, one round each, so
 * t(b) = flag + b (local + (n - 1) cross), and times a memcpy of the larger block for `local`:
 * a copy whose source this core wrote. `cross` is then a copy of lines another core wrote, the
 * arena's handover, which is what sets the collectives' speed in cache, while the other core
 * copies the other way; a Broadcast of the larger block (in place: the root copies in, the
 * others copy out) gives `cross1`, the handover one way.
 *
 * Then one call of each other collective and variant in probe_calls, of the same footprint
 * (the cico variants, and the flat ones that run the reductions' smaller calls), and every
 * call once more at a footprint that fills the L2. Their times price those calls directly: how
 * much a reduction's adds hide behind its reads, or a copy behind the other core's, differs
 * between collectives and machines, and no sum of the copy rates above gets it right
 * everywhere. Nor does one footprint price the others: where a rank's buffers fill its L2, the
 * lines it wrote leave for the shared cache before the other core reads them, and that read
 * can cost more or less than one from the writer's own L2, by machine. Every rank makes the
 * same calls; they take the next collective sequence numbers, one each, so the
 * communicator's own calls come after them (the arena's flags grow with the sequence number).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shm_coll.h"
#include "timer.h"

#define PROBE_REPS  15    /* calls per size; the median counts */
#define SMALL_BLOCK 1024u /* above the tiny calls' cell, far below any copy's cost */
#define BIG_BLOCK   (256u << 10)
/* Calls at the footprint that fills the L2: each moves four times the bytes of one in cache or
 * more, which makes one preempted call count for less and every call cost more at creation. */
#define PROBE_REPS_FILLED 5

/* The calls the probe times, in slot order (loom_shm_machine_t.call_ns); AllGatherV and
 * ReduceScatterV are priced as the even calls they run like. */
static const struct {
    loom_coll_kind_t kind;
    uint32_t variant;
    loom_algo_fn_t fn;
} probe_calls[LOOM_SHM_PROBE_CALLS] = {
    {LOOM_COLL_ALLGATHER, SHM_ALGO_CICO, loom_allgather_shm_cico},
    {LOOM_COLL_BCAST, SHM_ALGO_CICO, loom_bcast_shm_cico},
    {LOOM_COLL_ALLREDUCE, SHM_ALGO_CICO, loom_allreduce_shm_cico},
    {LOOM_COLL_ALLREDUCE, SHM_ALGO_FLAT, loom_allreduce_shm_flat},
    {LOOM_COLL_REDUCE_SCATTER, SHM_ALGO_CICO, loom_reduce_scatter_shm_cico},
    {LOOM_COLL_REDUCE, SHM_ALGO_CICO, loom_reduce_shm_cico},
    {LOOM_COLL_REDUCE, SHM_ALGO_FLAT, loom_reduce_shm_flat},
    {LOOM_COLL_ALLTOALL, SHM_ALGO_CICO, loom_alltoall_shm_cico},
};
enum { SLOT_ALLGATHER, SLOT_BCAST };

int loom_shm_probe_slot(loom_coll_kind_t kind, uint32_t variant)
{
    if (kind == LOOM_COLL_ALLGATHERV)
        kind = LOOM_COLL_ALLGATHER;
    else if (kind == LOOM_COLL_REDUCE_SCATTERV)
        kind = LOOM_COLL_REDUCE_SCATTER;
    for (int i = 0; i < LOOM_SHM_PROBE_CALLS; i++)
        if (probe_calls[i].kind == kind && probe_calls[i].variant == variant)
            return i;
    return -1;
}

void loom_shm_probe_call(int slot, loom_coll_kind_t *kind, uint32_t *variant)
{
    *kind = probe_calls[slot].kind;
    *variant = probe_calls[slot].variant;
}

size_t loom_shm_probe_bytes(const loom_shm_machine_t *m, int n, int slot, int tier)
{
    const size_t big = loom_shm_probe_block(m, n, tier), all = big * (size_t)n;
    if (slot == SLOT_BCAST)
        return big;
    /* A flat call fits one slot half, or it runs cico instead. */
    if (probe_calls[slot].variant == SHM_ALGO_FLAT && all > m->half)
        return m->half / 64 * 64;
    return all;
}

static int cmp_u64(const void *x, const void *y)
{
    const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The median ns of reps (at most PROBE_REPS) calls of the cico variant fn with arguments a. */
static loomResult_t time_calls(loom_coll_ctx_t *ctx, loom_algo_fn_t fn, const loom_coll_args_t *a,
                               int reps, uint64_t *ns_p)
{
    uint64_t t[PROBE_REPS];
    for (int i = 0; i < reps; i++) {
        ctx->seq++;
        const uint64_t t0 = loom_now_ns();
        LOOM_CHECK(fn(ctx, a));
        t[i] = loom_now_ns() - t0;
    }
    qsort(t, (size_t)reps, sizeof(t[0]), cmp_u64);
    *ns_p = t[reps / 2];
    LOOM_INFO(LOOM_LOG_SHM,
              "rank %d: arena probe: %s of %zu bytes%s: %.2f us (median of %d, "
              "%.2f to %.2f)",
              ctx->rank, loom_coll_name(a->kind), a->count,
              a->kind == LOOM_COLL_ALLGATHER ? " per rank" : "", (double)*ns_p / 1e3, reps,
              (double)t[0] / 1e3, (double)t[reps - 1] / 1e3);
    return loomSuccess;
}

/* Times reps of slot's call of `bytes` (as loom_coll_bytes) from send into recv, the reductions
 * on float32, the rooted calls rooted at rank 0, the Broadcast in place. */
static loomResult_t time_slot(loom_coll_ctx_t *ctx, int slot, size_t bytes, int reps, uint8_t *send,
                              uint8_t *recv, uint64_t *ns_p)
{
    const loom_coll_kind_t kind = probe_calls[slot].kind;
    const int reduces =
        kind == LOOM_COLL_ALLREDUCE || kind == LOOM_COLL_REDUCE || kind == LOOM_COLL_REDUCE_SCATTER;
    const size_t es = reduces ? sizeof(float) : 1;
    const int per_rank = kind == LOOM_COLL_ALLGATHER || kind == LOOM_COLL_REDUCE_SCATTER ||
                         kind == LOOM_COLL_ALLTOALL; /* count is per rank (loom_coll_bytes) */
    const loom_coll_args_t a = {.kind = kind,
                                .sendbuff = send,
                                .recvbuff = kind == LOOM_COLL_BCAST ? send : recv,
                                .count = bytes / es / (per_rank ? (size_t)ctx->nranks : 1),
                                .dt = reduces ? loomFloat32 : loomUint8,
                                .op = loomSum,
                                .root = 0};
    return time_calls(ctx, probe_calls[slot].fn, &a, reps, ns_p);
}

size_t loom_shm_probe_block(const loom_shm_machine_t *m, int n, int tier)
{
    /* Tier 0: one round, and every rank's n blocks within a quarter of its L2, the rate in
     * cache. Tier 1: the n blocks fill the L2, in as many rounds as that takes, the rate of
     * calls whose lines pass through the shared cache, which the cold cost extends past the
     * streaming threshold. */
    const size_t l2 = m->l2 ? m->l2 : SHM_L2_ASSUMED;
    size_t b = tier == 0 ? BIG_BLOCK : l2;
    while (b > 4 * SMALL_BLOCK &&
           (tier == 0 ? b > m->half || b * (size_t)n > l2 / 4 : b * (size_t)n > l2))
        b /= 2;
    return b;
}

/* The best of PROBE_REPS memcpys of nbytes from src to dst, ns. */
static uint64_t time_memcpy(uint8_t *dst, const uint8_t *src, size_t nbytes)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < PROBE_REPS; i++) {
        const uint64_t t0 = loom_now_ns();
        memcpy(dst, src, nbytes);
        __asm__ __volatile__("" : : "r"(dst) : "memory"); /* the copy is not dead */
        const uint64_t t = loom_now_ns() - t0;
        best = t < best ? t : best;
    }
    return best;
}

loomResult_t loom_shm_probe(loom_coll_ctx_t *ctx, loom_shm_probe_t *out)
{
    const int n = ctx->nranks;
    const size_t big = loom_shm_probe_block(&ctx->shm, n, 0);
    size_t all = 0; /* the largest call's bytes */
    for (int tier = 0; tier < LOOM_SHM_PROBE_TIERS; tier++)
        for (int slot = 0; slot < LOOM_SHM_PROBE_CALLS; slot++) {
            const size_t b = loom_shm_probe_bytes(&ctx->shm, n, slot, tier);
            all = b > all ? b : all;
        }
    uint8_t *buf = malloc(2 * all);
    if (buf == NULL) {
        LOOM_WARN("rank %d: out of memory for the arena probe (%zu bytes)", ctx->rank, 2 * all);
        return loomSystemError;
    }
    uint8_t *send = buf, *recv = buf + all;
    memset(buf, 0, 2 * all); /* faulted in before timing; zeros sum to zeros */
    uint64_t small_ns = 0, t[LOOM_SHM_PROBE_TIERS][LOOM_SHM_PROBE_CALLS] = {{0}};
    /* The ranks arrive from calibration at different times, and where they outnumber the CPUs
     * the first calls can fall into a convoy of sleeping waits that steady calls never see
     * (docs/PERFORMANCE.md, *The cost model: shared memory*). Calls before the timed ones let
     * the ranks settle into the order that steady calls run in. */
    const size_t small = SMALL_BLOCK * (size_t)n;
    loomResult_t res = time_slot(ctx, SLOT_ALLGATHER, small, PROBE_REPS, send, recv, &small_ns);
    if (res == loomSuccess)
        res = time_slot(ctx, SLOT_ALLGATHER, small, PROBE_REPS, send, recv, &small_ns);
    for (int tier = 0; tier < LOOM_SHM_PROBE_TIERS; tier++)
        for (int slot = 0; slot < LOOM_SHM_PROBE_CALLS && res == loomSuccess; slot++)
            res = time_slot(ctx, slot, loom_shm_probe_bytes(&ctx->shm, n, slot, tier),
                            tier == 0 ? PROBE_REPS : PROBE_REPS_FILLED, send, recv, &t[tier][slot]);
    const uint64_t local_ns = time_memcpy(recv, send, big);
    free(buf);
    LOOM_CHECK(res);
    const uint64_t big_ns = t[0][SLOT_ALLGATHER], bcast_ns = t[0][SLOT_BCAST];
    /* A rank copies its block in (a local copy) and n - 1 blocks out (written by other cores). */
    out->local_ns = fmax((double)local_ns / (double)big, 1e-3);
    const double per_block_byte = ((double)big_ns - (double)small_ns) / (double)(big - SMALL_BLOCK);
    out->cross_ns = fmax((per_block_byte - out->local_ns) / (n - 1), 1e-3);
    out->flag_ns = fmax((double)small_ns - SMALL_BLOCK * (out->local_ns + (n - 1) * out->cross_ns),
                        10.0); /* noise never makes bytes or flags free */
    /* The root (rank 0) measured only its copy in; the readers' time is the call's. */
    out->cross1_ns = ctx->rank == 0 ? 0.0 : fmax(((double)bcast_ns - out->flag_ns) / big, 1e-3);
    /* Rank 0's Broadcast time is its copy in, not the call's (the agreement takes the others'). */
    for (int tier = 0; tier < LOOM_SHM_PROBE_TIERS; tier++)
        for (int slot = 0; slot < LOOM_SHM_PROBE_CALLS; slot++)
            out->call_ns[tier][slot] =
                slot == SLOT_BCAST && ctx->rank == 0 ? 0.0 : (double)t[tier][slot];
    return loomSuccess;
}

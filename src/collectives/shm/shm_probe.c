/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_probe.c - what the arena's own path costs on this machine, measured at communicator
 * creation (calibrate.c) for the prediction of the shm collectives (shm_cost.c): the time of a
 * flag round and the time per byte that a rank copies into or out of the arena. The point-to-
 * point calibration cannot stand in for it: its waits sleep where ranks outnumber the CPUs,
 * which the arena's do not, and its rings are not the arena's slots.
 *
 * It runs real arena AllGathers (cico, the simplest pattern that moves bytes both ways: a rank
 * copies its block in and every other block out) of two block sizes, one round each, so
 * t(b) = flag + b (local + (n - 1) cross), and times a memcpy of the larger block for `local`:
 * a copy whose source this core wrote. `cross` is then a copy of lines another core wrote, the
 * arena's handover, which is what sets the collectives' speed in cache, while the other core
 * copies the other way; a Broadcast of the larger block (in place: the root copies in, the
 * others copy out) gives `cross1`, the handover one way. Every rank makes the same
 * calls; they take the next 4 PROBE_REPS collective sequence numbers, so the communicator's own
 * calls come after them (the arena's flags grow with the sequence number).
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

static int cmp_u64(const void *x, const void *y)
{
    const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The median ns of PROBE_REPS calls of the cico variant fn with arguments a. */
static loomResult_t time_calls(loom_coll_ctx_t *ctx, loom_algo_fn_t fn, const loom_coll_args_t *a,
                               uint64_t *ns_p)
{
    uint64_t t[PROBE_REPS];
    for (int i = 0; i < PROBE_REPS; i++) {
        ctx->seq++;
        const uint64_t t0 = loom_now_ns();
        LOOM_CHECK(fn(ctx, a));
        t[i] = loom_now_ns() - t0;
    }
    qsort(t, PROBE_REPS, sizeof(t[0]), cmp_u64);
    *ns_p = t[PROBE_REPS / 2];
    LOOM_INFO(LOOM_LOG_SHM,
              "rank %d: arena probe: %s of %zu bytes%s: %.2f us (median of %d, "
              "%.2f to %.2f)",
              ctx->rank, loom_coll_name(a->kind), a->count,
              a->kind == LOOM_COLL_ALLGATHER ? " per rank" : "", (double)*ns_p / 1e3, PROBE_REPS,
              (double)t[0] / 1e3, (double)t[PROBE_REPS - 1] / 1e3);
    return loomSuccess;
}

static loomResult_t time_allgather(loom_coll_ctx_t *ctx, uint8_t *send, uint8_t *recv, size_t block,
                                   uint64_t *ns_p)
{
    const loom_coll_args_t a = {.kind = LOOM_COLL_ALLGATHER,
                                .sendbuff = send,
                                .recvbuff = recv,
                                .count = block,
                                .dt = loomUint8,
                                .op = loomSum};
    return time_calls(ctx, loom_allgather_shm_cico, &a, ns_p);
}

size_t loom_shm_probe_block(const loom_shm_machine_t *m, int n)
{
    /* One round, and every rank's n blocks within a quarter of its L2: the rate in cache, which
     * the cold cost extends past it. */
    size_t b = BIG_BLOCK;
    const size_t l2 = m->l2 ? m->l2 : SHM_L2_ASSUMED;
    while (b > 4 * SMALL_BLOCK && (b > m->half || b * (size_t)n > l2 / 4))
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
    const size_t big = loom_shm_probe_block(&ctx->shm, n);
    uint8_t *buf = malloc(big * (size_t)(n + 1));
    if (buf == NULL) {
        LOOM_WARN("rank %d: out of memory for the arena probe (%zu bytes)", ctx->rank,
                  big * (size_t)(n + 1));
        return loomSystemError;
    }
    memset(buf, 1, big * (size_t)(n + 1)); /* faulted in before timing */
    uint64_t small_ns = 0, big_ns = 0, bcast_ns = 0;
    /* The ranks arrive from calibration at different times, and where they outnumber the CPUs
     * the first calls can fall into a convoy of sleeping waits that steady calls never see
     * (docs/PERFORMANCE.md, *The cost model: shared memory*). Calls before the timed ones let
     * the ranks settle into the order that steady calls run in. */
    loomResult_t res = time_allgather(ctx, buf, buf + big, SMALL_BLOCK, &small_ns);
    if (res == loomSuccess)
        res = time_allgather(ctx, buf, buf + big, SMALL_BLOCK, &small_ns);
    if (res == loomSuccess)
        res = time_allgather(ctx, buf, buf + big, big, &big_ns);
    /* In place, the root copies its buffer in and returns; a reader copies all of it out. */
    const loom_coll_args_t bc = {
        .kind = LOOM_COLL_BCAST, .sendbuff = buf, .recvbuff = buf, .count = big, .dt = loomUint8};
    if (res == loomSuccess)
        res = time_calls(ctx, loom_bcast_shm_cico, &bc, &bcast_ns);
    const uint64_t local_ns = time_memcpy(buf + big, buf, big);
    free(buf);
    LOOM_CHECK(res);
    /* A rank copies its block in (a local copy) and n - 1 blocks out (written by other cores). */
    out->local_ns = fmax((double)local_ns / (double)big, 1e-3);
    const double per_block_byte = ((double)big_ns - (double)small_ns) / (double)(big - SMALL_BLOCK);
    out->cross_ns = fmax((per_block_byte - out->local_ns) / (n - 1), 1e-3);
    out->flag_ns = fmax((double)small_ns - SMALL_BLOCK * (out->local_ns + (n - 1) * out->cross_ns),
                        10.0); /* noise never makes bytes or flags free */
    /* The root (rank 0) measured only its copy in; the readers' time is the call's. */
    out->cross1_ns = ctx->rank == 0 ? 0.0 : fmax(((double)bcast_ns - out->flag_ns) / big, 1e-3);
    return loomSuccess;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_copy_probe.c - how fast this machine's kernel copies between processes
 * against a plain memcpy: whether the shm collectives' single copy
 * (process_vm_readv) can beat copying twice through the arena. The kernel
 * pins every page it reads and copies with its own routine; on some machines
 * that runs near memcpy's speed, on others at a quarter of it. Measured once
 * per process; the arena's ranks agree on the answer at creation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "arena.h"
#include "debug.h"
#include "timer.h"

/* Large enough that the page pinning per call is part of the measure, small
 * enough to take about a millisecond. The best of 15 pairs: the best of a few
 * let other busy processes push a machine's ratio across FAST_RATIO now and
 * then, and two runs of one benchmark took different paths (docs/PERFORMANCE.md). */
#define PROBE_BYTES (1024u * 1024u)
#define PROBE_REPS  15
/* Single copy replaces the two copies through the arena with one kernel copy:
 * it can pay only where that copy takes less time than two memcpys. */
#define FAST_RATIO 2.0

/* The bits of the best kernel copy's time per byte (a double, ns); 0 until measured or where it
 * failed. Atomic: thread ranks may probe at once. */
static uint64_t kernel_ns_bits;

static int probe(void)
{
    uint8_t *src = malloc(2 * (size_t)PROBE_BYTES);
    if (src == NULL)
        return 0;
    uint8_t *dst = src + PROBE_BYTES;
    memset(src, 1, 2 * (size_t)PROBE_BYTES); /* both faulted in before timing */
    const pid_t me = getpid();
    uint64_t best_copy = UINT64_MAX, best_kernel = UINT64_MAX;
    int ok = 1;
    for (int i = 0; i < PROBE_REPS && ok; i++) {
        uint64_t t0 = loom_now_ns();
        memcpy(dst, src, PROBE_BYTES);
        __asm__ __volatile__("" : : "r"(dst) : "memory"); /* the copy is not dead */
        uint64_t t1 = loom_now_ns();
        struct iovec local = {.iov_base = dst, .iov_len = PROBE_BYTES};
        struct iovec remote = {.iov_base = src, .iov_len = PROBE_BYTES};
        ok = process_vm_readv(me, &local, 1, &remote, 1, 0) == (ssize_t)PROBE_BYTES;
        uint64_t t2 = loom_now_ns();
        if (t1 - t0 < best_copy)
            best_copy = t1 - t0;
        if (t2 - t1 < best_kernel)
            best_kernel = t2 - t1;
    }
    free(src);
    if (ok) {
        const double ns = (double)best_kernel / (double)PROBE_BYTES;
        uint64_t bits;
        memcpy(&bits, &ns, sizeof(bits));
        __atomic_store_n(&kernel_ns_bits, bits, __ATOMIC_RELAXED);
    }
    const int fast = ok && (double)best_kernel <= FAST_RATIO * (double)(best_copy ? best_copy : 1);
    LOOM_INFO(LOOM_LOG_SHM,
              "kernel-copy probe: process_vm_readv of %u KiB %.1f us, memcpy %.1f us (best of %d): "
              "%s",
              PROBE_BYTES >> 10, (double)best_kernel / 1e3, (double)best_copy / 1e3, PROBE_REPS,
              !ok    ? "process_vm_readv failed"
              : fast ? "fast"
                     : "slow");
    return fast;
}

int loom_arena_kernel_copy_fast(void)
{
    static int cached; /* 0: not measured; 1: slow; 2: fast */
    int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (v == 0) {
        v = probe() ? 2 : 1;
        __atomic_store_n(&cached, v, __ATOMIC_RELEASE);
    }
    return v == 2;
}

double loom_arena_kernel_copy_ns(void)
{
    (void)loom_arena_kernel_copy_fast(); /* measures once */
    const uint64_t bits = __atomic_load_n(&kernel_ns_bits, __ATOMIC_RELAXED);
    double ns;
    memcpy(&ns, &bits, sizeof(ns));
    return ns;
}

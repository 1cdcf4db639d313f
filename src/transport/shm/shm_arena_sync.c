/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_arena_sync.c - the operations of the shm collectives' arena (arena.h):
 * posting and waiting on the ranks' progress flags, the double-buffered call
 * descriptors and slot halves, and single-copy reads of a peer's memory.
 * It does not create or map the arena (shm_arena.c) and decides nothing
 * about algorithms. Callers: the shm collectives, through arena.h.
 *
 * Flags: each rank owns one 64-bit counter that only it writes, always
 * upwards ((seq << 24) | step), with a release store after the data it
 * vouches for; readers load it with acquire and compare with >=. A rank's
 * buffers are reused only once every peer posted a flag proving that it is
 * done with them (loom_arena_begin, loom_arena_half_acquire), so a call
 * waits for earlier readers only when it would otherwise overwrite what they
 * still read.
 *
 * Waiting: spin (LOOM_SPIN_US, less when ranks outnumber the CPUs), then
 * sched_yield a few times, then sleep on the rank's futex doorbell with the
 * doorbell protocol of shm_seg.c (no lost wakeup: a poster fences after its
 * store and rings only sleepers). Every wait is bounded like
 * loom_p2p_wait_all: the abort flag at every slow iteration, notices and the
 * peers' pids every CHECK_PERIOD, a peer's BROKEN/LEFT state at once, and the
 * timeout without progress of the awaited flags.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h"
#include "shm_arena.h"
#include "timer.h"

#define CHECK_PERIOD_NS 100000000ull /* notices and liveness, as loom_p2p_wait_all */
#define SLEEP_US        10000        /* one futex sleep: bounds how late an abort is seen */
#define SPIN_CHECK_MASK 63u          /* clock read every 64 spins */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* 1 while look i of a wait should only pause: the clock is read every 64 looks.
 * With no spin budget (ranks outnumber the CPUs) not even those: 63 pauses
 * before the first yield cost 1-2 us while the rank waited for may need this
 * CPU (4 ranks on 2 CPUs, 8-byte all-reduce: 6.6 -> 3.1 us). */
static inline int spin_on(const loom_arena_t *a, unsigned i)
{
    return (i & SPIN_CHECK_MASK) != 0 && a->spin_ns > 0;
}

static inline uint64_t flag_of(const loom_arena_t *a, int r)
{
    return atomic_load_explicit(&a->ctl[r].flag, memory_order_acquire);
}

uint64_t loom_arena_flag(const loom_arena_t *a, int rank)
{
    return flag_of(a, rank);
}

int loom_arena_single_copy(const loom_arena_t *a)
{
    return a->cma;
}

int loom_arena_copy_fast(const loom_arena_t *a)
{
    return a->copy_fast;
}

size_t loom_arena_half_bytes(const loom_arena_t *a)
{
    return a->slot_bytes / 2;
}

void loom_arena_wake_all(loom_arena_t *a)
{
    for (int r = 0; r < a->nranks; r++)
        if (r != a->rank)
            loom_seg_bell_notify(&a->ctl[r].bell);
}

/* Rings only the sleepers this flag can release: with many ranks on few CPUs
 * every needless wake-up is a context switch. A sleeper publishes what it
 * waits for before its fence (wait_slow), so either this rank sees it or the
 * sleeper's re-check sees the flag (the doorbell protocol of shm_seg.c).
 * That needs a full barrier between the flag's store and the loads of the
 * sleepers' words. With a->light the sleeper provides it: its
 * membarrier(GLOBAL_EXPEDITED) runs a barrier on every CPU, so either this
 * rank's store is visible to its re-check or this rank's loads come after
 * its `sleeping` store; the post itself then costs no fence, which would
 * otherwise stall until the store's cache line arrived from the peer
 * spinning on it (a fifth of an 8-byte all-reduce's time). */
void loom_arena_post(loom_arena_t *a, uint64_t flag)
{
    _Atomic uint64_t *mine = &a->ctl[a->rank].flag;
    if (a->light) {
        atomic_store_explicit(mine, flag, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst); /* keeps the loads below after it */
    } else {
        /* The store and the fence in one instruction on x86 (the peers'
         * sleep_begin fences pair with it). */
        (void)atomic_exchange_explicit(mine, flag, memory_order_seq_cst);
    }
    for (int r = 0; r < a->nranks; r++) {
        loom_arena_ctl_t *c = &a->ctl[r];
        if (r == a->rank || !atomic_load_explicit(&c->bell.sleeping, memory_order_seq_cst))
            continue;
        const int32_t wr = atomic_load_explicit(&c->wait_rank, memory_order_relaxed);
        if (wr >= 0 &&
            (wr != a->rank || flag < atomic_load_explicit(&c->wait_flag, memory_order_relaxed)))
            continue;
        loom_seg_bell_notify(&c->bell);
    }
}

// ---- waiting ------------------------------------------------------------------------

/* 1 if rank's flag (every other rank's if rank < 0) is >= flag; else the first
 * rank behind is *behind_p. */
static int reached(const loom_arena_t *a, int rank, uint64_t flag, int *behind_p)
{
    if (rank >= 0) {
        *behind_p = rank;
        return flag_of(a, rank) >= flag;
    }
    for (int i = 1; i < a->nranks; i++) {
        int r = (a->rank + i) % a->nranks;
        if (flag_of(a, r) < flag) {
            *behind_p = r;
            return 0;
        }
    }
    return 1;
}

/* 1 if rank r broke in call seq or earlier. One that broke in a later call
 * had finished this one, whatever this rank still has to do in it. */
static int broke_by(const loom_arena_t *a, int r, uint64_t seq)
{
    return atomic_load_explicit(&a->ctl[r].state, memory_order_acquire) == LOOM_ARENA_BROKEN &&
           atomic_load_explicit(&a->ctl[r].broke_seq, memory_order_relaxed) <= seq;
}

/* A peer that broke or left (it will not post again), or -1. A peer that left
 * normally matters only if it is behind what we wait for. */
static int gone_peer(const loom_arena_t *a, int rank, uint64_t flag)
{
    for (int r = 0; r < a->nranks; r++) {
        if (r == a->rank)
            continue;
        if (broke_by(a, r, flag >> 24) ||
            (atomic_load_explicit(&a->ctl[r].state, memory_order_acquire) == LOOM_ARENA_LEFT &&
             (rank < 0 || rank == r) && flag_of(a, r) < flag))
            return r;
    }
    return -1;
}

static uint64_t progress_sum(const loom_arena_t *a, int rank)
{
    if (rank >= 0)
        return flag_of(a, rank);
    uint64_t s = 0;
    for (int r = 0; r < a->nranks; r++)
        s += r == a->rank ? 0 : flag_of(a, r);
    return s;
}

static void describe_wait(const loom_arena_t *a, int behind, uint64_t flag, char *buf, size_t len)
{
    uint64_t at = flag_of(a, behind);
    snprintf(buf, len,
             "shm arena: waiting for rank %d to reach seq %llu step %llu; it is at seq %llu "
             "step %llu",
             behind, (unsigned long long)(flag >> 24),
             (unsigned long long)(flag & LOOM_ARENA_STEP_MAX), (unsigned long long)(at >> 24),
             (unsigned long long)(at & LOOM_ARENA_STEP_MAX));
}

/* The other half of a light post's bargain (loom_arena_post): a barrier on
 * every CPU that runs a rank, between this rank's `sleeping` store and its
 * re-check of the flags. 0 if it could not be issued (then do not sleep). */
static int heavy_barrier(const loom_arena_t *a)
{
    if (!a->light)
        return 1;
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0)
        return 1;
    static _Atomic int warned;
    if (!atomic_exchange(&warned, 1))
        LOOM_WARN("shm arena: membarrier(GLOBAL_EXPEDITED) failed: %s; waits yield instead of "
                  "sleeping",
                  strerror(errno));
    return 0;
}

/* Waits for the flags; start: when the caller began to wait (it may have spun
 * on something else already, which counts against the spin phase). */
static loomResult_t wait_slow(loom_arena_t *a, int rank, uint64_t flag, uint64_t start)
{
    const uint64_t timeout_ns = (uint64_t)a->timeout_ms * 1000000ull;
    uint64_t last_progress = start, last_check = start, seen = progress_sum(a, rank);
    loom_seg_bell_t *bell = &a->ctl[a->rank].bell;
    const unsigned step = (unsigned)(flag & LOOM_ARENA_STEP_MAX);
    char what[192];
    int behind = rank, yields = 0;
    for (unsigned i = 1;; i++) {
        if (reached(a, rank, flag, &behind))
            return loomSuccess;
        if (spin_on(a, i)) {
            cpu_relax();
            continue;
        }
        const uint64_t now = loom_now_ns();
        if (now - start < (uint64_t)a->spin_ns) {
            cpu_relax();
            continue;
        }
        i = SPIN_CHECK_MASK; /* past the spin: the checks below at every look */
        uint64_t sum = progress_sum(a, rank);
        if (sum != seen) {
            seen = sum;
            last_progress = now;
        }
        /* A peer that broke or left after posting what this wait needs (it went on to a
         * later call and failed there) must not fail this call: its state is read with
         * acquire, so its earlier flags are visible now and `reached` sees them. */
        int gone = gone_peer(a, rank, flag);
        if (gone >= 0 && reached(a, rank, flag, &behind))
            return loomSuccess;
        if (gone >= 0) {
            describe_wait(a, gone, flag, what, sizeof(what));
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_LEFT, gone, behind, step,
                                       loomRemoteError, start, what);
        }
        if (__atomic_load_n(a->abort_flag, __ATOMIC_ACQUIRE) ||
            now - last_check > CHECK_PERIOD_NS) {
            last_check = now;
            /* A peer may post what this wait needs, go on, fail in its next call and
             * tell us, all between two looks: look at the flags once more after
             * learning of a failure, before it can fail this call. */
            if (loom_p2p_failure_seen(a->p2p)) {
                if (reached(a, rank, flag, &behind))
                    return loomSuccess;
                describe_wait(a, behind, flag, what, sizeof(what));
                LOOM_CHECK(loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_CHECK, behind, behind, step,
                                               loomSuccess, start, what));
            }
        }
        if (now - last_progress > timeout_ns) {
            describe_wait(a, behind, flag, what, sizeof(what));
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_TIMEOUT, behind, behind, step,
                                       loomTimeout, start, what);
        }
        if (yields < a->yields) {
            yields++;
            sched_yield();
            continue;
        }
        /* Only `behind` can release this sleep: say so, then re-check; if another
         * rank is now the one behind, loop to say that instead of sleeping. */
        const int was = behind;
        atomic_store_explicit(&a->ctl[a->rank].wait_rank, (int32_t)was, memory_order_relaxed);
        atomic_store_explicit(&a->ctl[a->rank].wait_flag, flag, memory_order_relaxed);
        uint32_t snap = loom_seg_bell_sleep_begin(bell);
        loomResult_t res = loomSuccess;
        const int fenced = heavy_barrier(a);
        if (!reached(a, rank, flag, &behind) && behind == was && gone_peer(a, rank, flag) < 0)
            res = fenced ? loom_seg_bell_sleep(bell, snap, SLEEP_US) : (sched_yield(), loomSuccess);
        loom_seg_bell_sleep_end(bell);
        if (res != loomSuccess)
            return loom_arena_fail(a, res, "shm arena: futex wait failed");
    }
}

loomResult_t loom_arena_wait(loom_arena_t *a, int rank, uint64_t flag)
{
    int behind;
    if (reached(a, rank, flag, &behind))
        return loomSuccess;
    return wait_slow(a, rank, flag, loom_now_ns());
}

// ---- descriptors and slot halves -------------------------------------------------------

loomResult_t loom_arena_begin(loom_arena_t *a, loom_arena_desc_t *d)
{
    const unsigned p = (unsigned)(a->calls & 1);
    LOOM_CHECK(loom_arena_wait(a, -1, a->desc_need[p]));
    d->round = (uint32_t)a->rounds;
    a->ctl[a->rank].desc[p].d = *d;
    /* Peers read it after this call's first flag; any flag of a later call proves they did. */
    a->desc_need[p] = loom_arena_mkflag(d->seq + 1, 0);
    a->seq = d->seq;
    a->calls++;
    return loomSuccess;
}

void loom_arena_peer_desc(const loom_arena_t *a, int rank, loom_arena_desc_t *d)
{
    *d = a->ctl[rank].desc[(a->calls - 1) & 1].d;
}

int loom_arena_peer_desc_of(const loom_arena_t *a, int rank, uint64_t seq, loom_arena_desc_t *d)
{
    /* Tiny calls take no descriptor buffer, so the peer's parity may not be ours. */
    for (int b = 0; b < 2; b++) {
        if (a->ctl[rank].desc[b].d.seq == seq) {
            *d = a->ctl[rank].desc[b].d;
            return 1;
        }
    }
    return 0;
}

unsigned loom_arena_next_half(loom_arena_t *a)
{
    return (unsigned)(a->rounds++ & 1);
}

uint8_t *loom_arena_half(loom_arena_t *a, int rank, unsigned h)
{
    return a->slots + (size_t)rank * a->slot_bytes + (size_t)h * (a->slot_bytes / 2);
}

loomResult_t loom_arena_half_acquire(loom_arena_t *a, unsigned h)
{
    return loom_arena_wait(a, -1, a->half_need[h & 1]);
}

void loom_arena_half_release(loom_arena_t *a, unsigned h, uint64_t need)
{
    a->half_need[h & 1] = need;
}

// ---- tiny calls: the cell rings ----------------------------------------------------------

static loom_arena_cell_t *cell_of(const loom_arena_t *a, int rank, uint64_t seq)
{
    return &a->cells[(size_t)rank * LOOM_ARENA_CELLS + (seq & (LOOM_ARENA_CELLS - 1))];
}

void loom_arena_tiny_begin(loom_arena_t *a, uint64_t seq)
{
    a->seq = seq;
}

loomResult_t loom_arena_cell_publish(loom_arena_t *a, uint64_t desc, const void *data, size_t bytes)
{
    const unsigned i = (unsigned)(a->seq & (LOOM_ARENA_CELLS - 1));
    /* Peers are done with the cell's last call once they end it (flag step 2:
     * calls in between may post nothing: count 0, AllToAllv). Known most of
     * the time without looking at the peers' flags (a miss each): look only
     * when the last look is too old. */
    const uint64_t need = loom_arena_mkflag(a->cell_last[i], 2);
    if (a->cell_last[i] != 0 && need > a->cells_free) {
        LOOM_CHECK(loom_arena_wait(a, -1, need));
        uint64_t low = UINT64_MAX;
        for (int r = 0; r < a->nranks; r++) {
            const uint64_t at = r == a->rank ? UINT64_MAX : flag_of(a, r);
            low = at < low ? at : low;
        }
        a->cells_free = low;
    }
    a->cell_last[i] = a->seq;
    loom_arena_cell_t *c = cell_of(a, a->rank, a->seq);
    c->desc = desc;
    if (bytes > 0)
        memcpy(c->data, data, bytes < LOOM_ARENA_CELL_BYTES ? bytes : LOOM_ARENA_CELL_BYTES);
    atomic_store_explicit(&c->seq, a->seq, memory_order_release);
    loom_arena_post(a, loom_arena_mkflag(a->seq, 1));
    return loomSuccess;
}

void loom_arena_tiny_end(loom_arena_t *a)
{
    loom_arena_post(a, loom_arena_mkflag(a->seq, 2));
}

loomResult_t loom_arena_cell_wait(loom_arena_t *a, int rank, const uint8_t **data_p,
                                  uint64_t *desc_p)
{
    const loom_arena_cell_t *c = cell_of(a, rank, a->seq);
    uint64_t start = 0; /* read late: most cells are there at the first look */
    /* Spin on the cell itself: its line brings the data with the news. */
    for (unsigned i = 1; atomic_load_explicit(&c->seq, memory_order_acquire) != a->seq; i++) {
        if (spin_on(a, i)) {
            cpu_relax();
            continue;
        }
        const uint64_t now = loom_now_ns();
        if (start == 0)
            start = now;
        if (now - start >= (uint64_t)a->spin_ns) {
            /* The peer posts its flag after the cell: wait for that, with
             * every bound of a wait, then the cell must be there. */
            LOOM_CHECK(wait_slow(a, rank, loom_arena_mkflag(a->seq, 1), start));
            if (atomic_load_explicit(&c->seq, memory_order_acquire) == a->seq)
                break;
            char what[224];
            snprintf(what, sizeof(what),
                     "mismatched collectives: rank %d runs call seq %llu without a tiny-call "
                     "cell (another collective, count or algorithm than this rank's (%d) "
                     "tiny call)",
                     rank, (unsigned long long)a->seq, a->rank);
            return loom_arena_mismatch_any(a, what);
        }
        cpu_relax();
    }
    /* A rank that runs ahead (a broadcast root) has often written the next one already. */
    __builtin_prefetch(cell_of(a, rank, a->seq + 1));
    *data_p = c->data;
    *desc_p = c->desc;
    return loomSuccess;
}

int loom_arena_peer_cell(const loom_arena_t *a, int rank, uint64_t seq, uint64_t *desc_p)
{
    const loom_arena_cell_t *c = cell_of(a, rank, seq);
    if (atomic_load_explicit(&c->seq, memory_order_acquire) != seq)
        return 0;
    *desc_p = c->desc;
    return 1;
}

// ---- failures and single copy ----------------------------------------------------------

loomResult_t loom_arena_fail(loom_arena_t *a, loomResult_t res, const char *detail)
{
    return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_ERROR, a->rank, -1, 0, res, loom_now_ns(),
                               detail);
}

loomResult_t loom_arena_check_peers(loom_arena_t *a)
{
    for (int r = 0; r < a->nranks; r++) {
        if (r != a->rank && broke_by(a, r, a->seq))
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_LEFT, r, r, 0, loomRemoteError,
                                       loom_now_ns(), "shm arena: a peer broke during the call");
    }
    return loomSuccess;
}

/* After EFAULT: 1 if the peer's byte at addr cannot be read (its buffer is
 * short or unmapped), 0 if it can (then the fault was in this rank's buffer). */
static int peer_byte_unreadable(pid_t pid, uint64_t addr)
{
    uint8_t b;
    struct iovec l = {&b, 1}, r = {(void *)(uintptr_t)addr, 1};
    ssize_t got;
    do
        got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    while (got < 0 && errno == EINTR);
    return got < 0 && errno == EFAULT;
}

loomResult_t loom_arena_read(loom_arena_t *a, int rank, void *dst, uint64_t addr, size_t nbytes)
{
    uint8_t *d = dst;
    while (nbytes > 0) {
        struct iovec l = {d, nbytes}, r = {(void *)(uintptr_t)addr, nbytes};
        ssize_t got = process_vm_readv(a->pids[rank], &l, 1, &r, 1, 0);
        if (got > 0) {
            d += got;
            addr += (uint64_t)got;
            nbytes -= (size_t)got;
            continue;
        }
        int e = got < 0 ? errno : EFAULT;
        if (e == EINTR)
            continue;
        char what[256];
        snprintf(what, sizeof(what),
                 "shm arena: reading %zu bytes at 0x%llx of rank %d (pid %d) with "
                 "process_vm_readv failed: %s",
                 nbytes, (unsigned long long)addr, rank, a->pids[rank], strerror(e));
        if (e == ESRCH ||
            atomic_load_explicit(&a->ctl[rank].state, memory_order_acquire) != LOOM_ARENA_ACTIVE)
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_LEFT, rank, rank, 0, loomRemoteError,
                                       loom_now_ns(), what);
        /* The peer's buffer is shorter than the call's count says, or freed: its
         * fault, as a copy of its own would have faulted in it. */
        if (e == EFAULT && peer_byte_unreadable(a->pids[rank], addr)) {
            snprintf(
                what, sizeof(what),
                "shm arena: rank %d's buffer is not readable at 0x%llx (reading %zu bytes from "
                "there; process_vm_readv: %s): it is shorter than the call's count "
                "says, or not mapped",
                rank, (unsigned long long)addr, nbytes, strerror(e));
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_BLAME, rank, rank, 0, loomInvalidUsage,
                                       loom_now_ns(), what);
        }
        return loom_arena_fail(a, e == EFAULT ? loomInvalidUsage : loomSystemError, what);
    }
    return loomSuccess;
}

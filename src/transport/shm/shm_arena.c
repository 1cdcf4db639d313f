/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_arena.c - creation, agreement and teardown of the shared-memory arena
 * of the shm collectives: one segment per communicator whose ranks all share
 * this host over shm, beside the host's ring segment and under the same rules
 * (mode 0600, a name derived from the job secret and the ranks' pids, removed
 * as soon as every rank mapped it, removed by any rank that gives up before
 * that), and the creation-time agreement on single-copy reads.
 * It does not wait, publish or copy (shm_arena_sync.c) and knows nothing of
 * collectives. Caller: the shm collectives' owner of the arena,
 * src/collectives/shm/shm_open.c (create, destroy; break as the
 * point-to-point layer's break hook).
 *
 * Layout (offsets from the mapping):
 *   0                      header (64 bytes)
 *   64                     control blocks: nranks x 320 bytes (loom_arena_ctl_t)
 *   then                   tiny-call cells: nranks x 256 x 64 bytes (loom_arena_cell_t)
 *   page aligned + 2 KiB   data slots: nranks x slot_bytes, each two halves
 * Footprint: nranks x (slot_bytes + 16704) bytes plus at most a page and a half; slot_bytes
 * is LOOM_SHM_COLL_BYTES rounded down to 8 KiB, halved until the arena stays
 * below LOOM_SHM_SEG_MAX_BYTES.
 *
 * Creation (collective, after every connection is up): the ranks first
 * exchange LOOM_SHM_COLL over the connections (it may differ between
 * processes) and go on only if all want an arena. Then rank 0 creates,
 * sizes (allocating every page: a full /dev/shm fails here, not with SIGBUS
 * later) and initialises the segment, the others map it once it is complete
 * (magic stored last), adopting its slot size. Each rank then publishes its
 * pid and the address and value of a private probe word and posts flag 1;
 * once all did, each tries process_vm_readv of every peer's probe (EPERM
 * under Yama ptrace_scope or a container's seccomp, ESRCH across pid
 * namespaces), votes and posts flag 2; single copy is used only if every
 * rank voted yes, so the choice is the same everywhere. In the same vote each
 * rank says whether it registered for membarrier(GLOBAL_EXPEDITED); if all
 * did, posts skip their fence (shm_arena_sync.c).
 */
#include "shm_arena.h"
#include "cpus.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/membarrier.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "secret.h"
#include "timer.h"

#define ARENA_MAGIC    0x314e524153434c4cull /* "LLCSARN1" */
#define ARENA_VERSION  2u
#define SLOT_MIN_BYTES 8192u
#define SLOT_MAX_BYTES (64u << 20)
#define OPEN_CHECK_NS  100000000ull /* liveness and notices while waiting for rank 0 */
/* Ranks outnumber the CPUs: no spin at all, a wait yields at its first miss.
 * The rank waited for is often on this CPU and runs only once this one yields
 * (4 ranks on 2 CPUs, 8-byte all-reduce: 8.8 us with 2 us of spin, 6.6 us with
 * 63 pauses per wait, 3.1 us with none). */
#define OVERSUB_SPIN_NS 0
/* sched_yield before sleeping: a yield lets a peer on this CPU run without a
 * wake-up system call, but under load from other processes a yielding rank
 * waits behind all of them while a woken sleeper is scheduled at once; so a
 * few, then the futex. */
#define YIELDS 2

typedef struct {
    _Atomic uint64_t magic; /* stored last by rank 0: the segment is ready */
    uint32_t version;
    uint32_t nranks;
    uint64_t slot_bytes;
    uint64_t total_bytes;
    _Atomic uint32_t mapped; /* ranks that mapped it; the last one removes the name */
    uint8_t pad[28];
} arena_hdr_t;

_Static_assert(sizeof(arena_hdr_t) == 64, "arena header is one cache line");
_Static_assert(sizeof(loom_arena_ctl_t) == 320, "arena control block is five cache lines");
_Static_assert(offsetof(loom_arena_ctl_t, state) == 64, "the flag has a cache line of its own");
_Static_assert(sizeof(loom_arena_cell_t) == 64, "a tiny-call cell is one cache line");
_Static_assert(sizeof(loom_arena_desc_t) <= 64, "a descriptor fits a cache line");

static size_t slots_offset(int nranks)
{
    size_t meta =
        sizeof(arena_hdr_t) +
        (size_t)nranks * (sizeof(loom_arena_ctl_t) + LOOM_ARENA_CELLS * sizeof(loom_arena_cell_t));
    /* Half an aliasing span past a multiple of it (a page boundary where pages are 4 KiB): the
     * buffers users hand in are mostly page aligned or 16 bytes past it (posix_memalign,
     * glibc's mmap'd chunks), and copies between them and the slots then run forward (arena.h,
     * LOOM_ARENA_ALIAS_SPAN). */
    const size_t span = LOOM_ARENA_ALIAS_SPAN;
    return ((meta + span - 1) & ~(span - 1)) + span / 2;
}

static size_t arena_bytes(int nranks, size_t slot_bytes)
{
    return slots_offset(nranks) + (size_t)nranks * slot_bytes;
}

static size_t choose_slot_bytes(int nranks)
{
    int64_t want = loom_param_SHM_COLL_BYTES();
    size_t slot = want < SLOT_MIN_BYTES   ? SLOT_MIN_BYTES
                  : want > SLOT_MAX_BYTES ? SLOT_MAX_BYTES
                                          : (size_t)want;
    slot &= ~(size_t)(SLOT_MIN_BYTES - 1);
    while (slot > SLOT_MIN_BYTES && arena_bytes(nranks, slot) > LOOM_SHM_SEG_MAX_BYTES)
        slot /= 2;
    if ((int64_t)slot != want)
        LOOM_INFO(LOOM_LOG_SHM, "shm arena: LOOM_SHM_COLL_BYTES %lld bytes taken as %zu bytes",
                  (long long)want, slot);
    return slot;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* /loom-<pid of rank 0>-arena-<SipHash(secret, "loom-arena" || nranks || every pid)>:
 * known to every rank before it exists, so any of them can remove it. */
static loomResult_t derive_name(loom_arena_t *a, const loom_tp_init_args_t *args)
{
    size_t len = 16 + (size_t)args->nranks * 8;
    uint8_t *msg = malloc(len);
    if (msg == NULL) {
        LOOM_WARN("shm arena: out of memory (%zu bytes)", len);
        return loomSystemError;
    }
    memcpy(msg, "loom-arn", 8);
    put_le64(msg + 8, (uint64_t)args->nranks);
    for (int r = 0; r < args->nranks; r++)
        put_le64(msg + 16 + (size_t)r * 8, (uint64_t)(uint32_t)args->peers[r].pid);
    uint64_t h = loom_siphash24(args->secret, msg, len);
    free(msg);
    snprintf(a->name, sizeof(a->name), "/loom-%d-arena-%016llx", (int)args->peers[0].pid,
             (unsigned long long)h);
    return loomSuccess;
}

static void layout(loom_arena_t *a, void *base, size_t bytes, size_t slot_bytes)
{
    a->base = base;
    a->bytes = bytes;
    a->slot_bytes = slot_bytes;
    a->ctl = (loom_arena_ctl_t *)((uint8_t *)base + sizeof(arena_hdr_t));
    a->cells = (loom_arena_cell_t *)(a->ctl + a->nranks);
    a->slots = (uint8_t *)base + slots_offset(a->nranks);
}

/* Maps every rank's tiny-call cells into this process now: a ring of 256
 * cells spans four pages per rank, and each first touch in a call would be a
 * page fault (about a microsecond) on the 8-byte path. Peers' cells are only
 * read (a cell is written by its owner alone); the own ones are written in a
 * data byte, before any call (its seq is what readers look at). */
static void prefault_cells(const loom_arena_t *a)
{
    uint8_t sink = 0;
    for (int r = 0; r < a->nranks; r++) {
        loom_arena_cell_t *ring = a->cells + (size_t)r * LOOM_ARENA_CELLS;
        for (size_t k = 0; k < LOOM_ARENA_CELLS; k++) { /* every cell: rings are not page aligned */
            volatile uint8_t *b = &ring[k].data[0];
            if (r == a->rank)
                *b = 0;
            else
                sink ^= *b;
        }
    }
    (void)sink;
}

/* The rank that completes the count removes the name. */
static loomResult_t count_mapped(loom_arena_t *a)
{
    arena_hdr_t *hdr = a->base;
    a->counted = 1;
    uint32_t n = atomic_fetch_add_explicit(&hdr->mapped, 1, memory_order_acq_rel) + 1;
    return n == (uint32_t)a->nranks ? loom_seg_unlink(a->dir, a->name) : loomSuccess;
}

// ---- mapping ------------------------------------------------------------------------

static loomResult_t arena_create_file(loom_arena_t *a)
{
    char path[PATH_MAX];
    loom_seg_file_path(a->dir, a->name, path, sizeof(path));
    size_t slot = choose_slot_bytes(a->nranks), bytes = arena_bytes(a->nranks, slot);
    int fd = loom_seg_file_open(a->dir, a->name, O_RDWR | O_CREAT | O_EXCL);
    if (fd < 0) {
        LOOM_WARN("shm arena: cannot create %s: %s", path, strerror(errno));
        return loomSystemError;
    }
    int err = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    if (err != 0) {
        LOOM_WARN("shm arena: %s needs %zu bytes (%d ranks x %zu-byte slots: LOOM_SHM_COLL_BYTES) "
                  "and %s cannot provide them: %s",
                  path, bytes, a->nranks, slot, a->dir, strerror(err));
        close(fd);
        return loomSystemError;
    }
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        LOOM_WARN("shm arena: mmap of %zu bytes of %s failed: %s", bytes, path, strerror(err));
        return loomSystemError;
    }
    layout(a, base, bytes, slot);
    arena_hdr_t *hdr = base;
    hdr->version = ARENA_VERSION;
    hdr->nranks = (uint32_t)a->nranks;
    hdr->slot_bytes = slot;
    hdr->total_bytes = bytes;
    atomic_store_explicit(&hdr->magic, ARENA_MAGIC, memory_order_release);
    LOOM_INFO(LOOM_LOG_SHM, "shm arena: created %s: %zu bytes, %d ranks, %zu-byte slots", path,
              bytes, a->nranks, slot);
    return loomSuccess;
}

/* Maps rank 0's segment if it is complete; *ready_p = 0 while it is not. */
static loomResult_t arena_open_file(loom_arena_t *a, int *ready_p)
{
    char path[PATH_MAX];
    loom_seg_file_path(a->dir, a->name, path, sizeof(path));
    *ready_p = 0;
    int fd = loom_seg_file_open(a->dir, a->name, O_RDWR);
    if (fd < 0) {
        if (errno == ENOENT)
            return loomSuccess;
        LOOM_WARN("shm arena: cannot open %s: %s", path, strerror(errno));
        return loomSystemError;
    }
    struct stat st;
    int err = fstat(fd, &st) != 0 ? errno : 0;
    size_t bytes = err ? 0 : (size_t)st.st_size;
    void *base = MAP_FAILED;
    if (!err && bytes >= arena_bytes(a->nranks, SLOT_MIN_BYTES)) {
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        err = base == MAP_FAILED ? errno : 0;
    }
    close(fd);
    if (err) {
        LOOM_WARN("shm arena: cannot map %s (%zu bytes): %s", path, bytes, strerror(err));
        return loomSystemError;
    }
    if (base == MAP_FAILED)
        return loomSuccess; /* not sized yet */
    arena_hdr_t *hdr = base;
    if (atomic_load_explicit(&hdr->magic, memory_order_acquire) != ARENA_MAGIC) {
        munmap(base, bytes); /* not initialised yet */
        return loomSuccess;
    }
    size_t slot = hdr->slot_bytes;
    if (hdr->version != ARENA_VERSION || hdr->nranks != (uint32_t)a->nranks ||
        slot < SLOT_MIN_BYTES || slot > SLOT_MAX_BYTES || slot % SLOT_MIN_BYTES != 0 ||
        hdr->total_bytes != arena_bytes(a->nranks, slot) || hdr->total_bytes > bytes) {
        LOOM_WARN("shm arena: %s does not match this rank: version %u, %u ranks, %zu-byte slots, "
                  "%llu of %zu bytes (expected version %u, %d ranks)",
                  path, hdr->version, hdr->nranks, slot, (unsigned long long)hdr->total_bytes,
                  bytes, ARENA_VERSION, a->nranks);
        munmap(base, bytes);
        return loomInvalidUsage;
    }
    layout(a, base, bytes, slot);
    *ready_p = 1;
    return loomSuccess;
}

/* Waits (bounded) for rank 0 to create the segment, then maps it. */
static loomResult_t arena_map(loom_arena_t *a)
{
    uint64_t start = loom_now_ns(), last_check = start;
    for (;;) {
        int ready = 0;
        LOOM_CHECK(arena_open_file(a, &ready));
        if (ready)
            return loomSuccess;
        uint64_t now = loom_now_ns();
        const char *what = "shm arena: waiting for rank 0 to create the arena segment";
        if (now - start > (uint64_t)a->timeout_ms * 1000000ull)
            return loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_TIMEOUT, 0, 0, 0, loomTimeout, start,
                                       what);
        if (now - last_check > OPEN_CHECK_NS || __atomic_load_n(a->abort_flag, __ATOMIC_ACQUIRE)) {
            last_check = now;
            LOOM_CHECK(
                loom_p2p_wait_event(a->p2p, LOOM_P2P_EV_CHECK, 0, 0, 0, loomSuccess, start, what));
        }
        usleep(100);
    }
}

// ---- agreement on single copy ---------------------------------------------------------

static int probe_peer(loom_arena_t *a, int r, uint64_t *checked_p)
{
    const loom_arena_ctl_t *c = &a->ctl[r];
    uint64_t got = 0;
    struct iovec l = {&got, sizeof(got)};
    struct iovec rv = {(void *)(uintptr_t)c->probe_addr, sizeof(got)};
    ssize_t n = process_vm_readv((pid_t)c->pid, &l, 1, &rv, 1, 0);
    if (n == (ssize_t)sizeof(got) && got == c->probe_value) {
        (*checked_p)++;
        return 1;
    }
    LOOM_INFO(LOOM_LOG_SHM,
              "shm arena: rank %d cannot read rank %d's memory (pid %llu) with process_vm_readv: "
              "%s; the shm collectives copy through the arena",
              a->rank, r, (unsigned long long)c->pid, n < 0 ? strerror(errno) : "wrong value");
    return 0;
}

/* 1 if this process can skip the fence of its posts: registered for
 * membarrier(GLOBAL_EXPEDITED), so a sleeper's barrier reaches its CPUs. */
static int light_posts_possible(const loom_arena_t *a)
{
    /* Oversubscribed, waits sleep at once, and every sleep's barrier would
     * interrupt the CPUs running the other ranks: keep the fence. */
    if (!loom_param_SHM_MEMBARRIER() || a->oversubscribed)
        return 0;
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) != 0) {
        LOOM_INFO(LOOM_LOG_SHM,
                  "shm arena: membarrier(GLOBAL_EXPEDITED) unavailable (%s); "
                  "posts keep their fence",
                  cmds < 0 ? strerror(errno) : "not offered or not registered");
        return 0;
    }
    return 1;
}

static loomResult_t agree_single_copy(loom_arena_t *a)
{
    loom_arena_ctl_t *me = &a->ctl[a->rank];
    LOOM_CHECK(loom_random_bytes(&a->probe, sizeof(a->probe)));
    me->pid = (uint64_t)getpid();
    me->probe_addr = (uint64_t)(uintptr_t)&a->probe;
    me->probe_value = a->probe;
    loom_arena_post(a, loom_arena_mkflag(0, 1));
    LOOM_CHECK(loom_arena_wait(a, -1, loom_arena_mkflag(0, 1)));
    uint64_t ok = 0;
    /* The vote is this rank's LOOM_SHM_COLL_CMA, or 0 if it cannot read a
     * peer; the smallest vote wins so that every rank picks the same variant. */
    int vote = (int)loom_param_SHM_COLL_CMA();
    if (vote < 0)
        vote = 0;
    for (int r = 0; r < a->nranks && vote; r++)
        if (r != a->rank && !probe_peer(a, r, &ok))
            vote = 0;
    atomic_store_explicit(&me->cma_ok, (uint32_t)vote, memory_order_relaxed);
    atomic_store_explicit(&me->light_ok, (uint32_t)light_posts_possible(a), memory_order_relaxed);
    atomic_store_explicit(&me->copy_fast, (uint32_t)(vote == 1 && loom_arena_kernel_copy_fast()),
                          memory_order_relaxed);
    loom_arena_post(a, loom_arena_mkflag(0, 2));
    LOOM_CHECK(loom_arena_wait(a, -1, loom_arena_mkflag(0, 2)));
    a->cma = vote;
    a->copy_fast = 1;
    int light = 1;
    for (int r = 0; r < a->nranks; r++) {
        if (!atomic_load_explicit(&a->ctl[r].copy_fast, memory_order_relaxed))
            a->copy_fast = 0;
        a->pids[r] = (int)a->ctl[r].pid;
        const int v = (int)atomic_load_explicit(&a->ctl[r].cma_ok, memory_order_relaxed);
        if (v < a->cma)
            a->cma = v;
        if (a->pids[r] <= 0)
            a->cma = 0;
        if (!atomic_load_explicit(&a->ctl[r].light_ok, memory_order_relaxed))
            light = 0;
    }
    /* From the next post on: every post so far kept its fence. */
    a->light = light;
    return loomSuccess;
}

// ---- lifecycle ------------------------------------------------------------------------

static void arena_free(loom_arena_t *a)
{
    if (a->base != NULL) {
        const arena_hdr_t *hdr = a->base;
        /* A rank that died or gave up before the count completed: nobody else will. */
        if (atomic_load_explicit(&hdr->mapped, memory_order_acquire) < (uint32_t)a->nranks)
            (void)loom_seg_unlink(a->dir, a->name);
        if (munmap(a->base, a->bytes) != 0)
            LOOM_WARN("shm arena: munmap of %zu bytes failed: %s", a->bytes, strerror(errno));
    } else if (a->name[0] != '\0') {
        (void)loom_seg_unlink(a->dir, a->name);
    }
    free(a->pids);
    free(a);
}

/* 1 if every peer is reached over shm: then every rank is on this host, and
 * every rank comes to the same answer. */
static int all_shm(loom_p2p_t *p2p, const loom_tp_init_args_t *args)
{
    for (int r = 0; r < args->nranks; r++)
        if (r != args->rank && strcmp(loom_p2p_transport_name(p2p, r), "shm") != 0)
            return 0;
    return args->nranks > 1;
}

/* LOOM_SHM_COLL may differ between processes: the ranks exchange it (one byte
 * to and from every peer) and build the arena only if all want it. */
static loomResult_t agree_on_arena(loom_p2p_t *p2p, const loom_tp_init_args_t *args, int *all_p)
{
    const int n = args->nranks, me = args->rank;
    const uint8_t mine = loom_param_SHM_COLL() != 0;
    const uint32_t tag = loom_tag_coll(0, 1); /* seq 0: no collective uses it */
    uint8_t *theirs = calloc((size_t)n, 1);
    loom_p2p_req_t *reqs = calloc(2 * (size_t)n, sizeof(*reqs));
    loomResult_t res = loomSuccess;
    int nreq = 0;
    if (theirs == NULL || reqs == NULL) {
        LOOM_WARN("shm arena: out of memory for %d ranks", n);
        res = loomSystemError;
        goto out;
    }
    loom_p2p_set_context(p2p, "communicator creation", 0);
    for (int r = 0; r < n; r++) {
        if (r == me)
            continue;
        LOOM_CHECK_GOTO(loom_p2p_irecv(p2p, r, &theirs[r], 1, tag, &reqs[nreq++]), res, out);
        LOOM_CHECK_GOTO(loom_p2p_isend(p2p, r, &mine, 1, tag, &reqs[nreq++]), res, out);
    }
    LOOM_CHECK_GOTO(loom_p2p_wait_all(p2p, reqs, nreq), res, out);
    *all_p = mine;
    for (int r = 0; r < n; r++)
        if (r != me && !theirs[r])
            *all_p = 0;
    if (mine && !*all_p)
        LOOM_INFO(LOOM_LOG_SHM, "shm arena: rank %d: a peer has LOOM_SHM_COLL=0; no arena", me);
out:
    free(theirs);
    free(reqs);
    return res;
}

loomResult_t loom_arena_create(loom_p2p_t *p2p, const loom_tp_init_args_t *args,
                               loom_arena_t **arena_p)
{
    static const int never = 0;
    loomResult_t res = loomSuccess;
    int want = 0;
    *arena_p = NULL;
    if (!all_shm(p2p, args))
        return loomSuccess;
    LOOM_CHECK(agree_on_arena(p2p, args, &want));
    if (!want)
        return loomSuccess;
    loom_arena_t *a = calloc(1, sizeof(*a));
    if (a == NULL || (a->pids = calloc((size_t)args->nranks, sizeof(int))) == NULL) {
        LOOM_WARN("shm arena: out of memory for %d ranks", args->nranks);
        free(a);
        return loomSystemError;
    }
    a->p2p = p2p;
    a->rank = args->rank;
    a->nranks = args->nranks;
    a->abort_flag = args->abort_flag ? args->abort_flag : &never;
    a->timeout_ms = args->timeout_ms;
    a->spin_ns = (int64_t)loom_param_SPIN_US() * 1000;
    a->oversubscribed = loom_cpus_crowded(args->nranks);
    if (a->oversubscribed && a->spin_ns > OVERSUB_SPIN_NS)
        a->spin_ns = OVERSUB_SPIN_NS; /* the rank waited on needs this CPU */
    a->yields = YIELDS;
    snprintf(a->dir, sizeof(a->dir), "%s", loom_param_SHM_DIR());
    LOOM_CHECK_GOTO(derive_name(a, args), res, err);
    if (a->rank == 0)
        LOOM_CHECK_GOTO(arena_create_file(a), res, err);
    else
        LOOM_CHECK_GOTO(arena_map(a), res, err);
    LOOM_CHECK_GOTO(count_mapped(a), res, err);
    LOOM_CHECK_GOTO(agree_single_copy(a), res, err);
    prefault_cells(a);
    LOOM_INFO(LOOM_LOG_SHM, "shm arena: rank %d mapped %s: %zu bytes, %zu-byte slots, %s", a->rank,
              a->name, a->bytes, a->slot_bytes,
              a->cma == 0    ? "copies through the arena"
              : a->cma == 2  ? "single copy (process_vm_readv) always"
              : a->copy_fast ? "single copy (process_vm_readv) where the plan's rules say it pays"
                             : "single copy (process_vm_readv) where the plan's rules say it pays: "
                               "nowhere, the kernel's copy is slower than two memcpys");
    *arena_p = a;
    return loomSuccess;
err:
    arena_free(a);
    return res;
}

void loom_arena_break(loom_arena_t *a, uint64_t seq)
{
    if (a == NULL)
        return;
    a->broken = 1;
    atomic_store_explicit(&a->ctl[a->rank].broke_seq, seq, memory_order_relaxed);
    atomic_store_explicit(&a->ctl[a->rank].state, LOOM_ARENA_BROKEN, memory_order_seq_cst);
    loom_arena_wake_all(a);
}

int loom_arena_broken(const loom_arena_t *a)
{
    return a->broken;
}

loomResult_t loom_arena_destroy(loom_arena_t *a)
{
    if (a == NULL)
        return loomSuccess;
    _Atomic uint32_t *state = &a->ctl[a->rank].state;
    if (atomic_load_explicit(state, memory_order_relaxed) == LOOM_ARENA_ACTIVE) {
        atomic_store_explicit(state, LOOM_ARENA_LEFT, memory_order_seq_cst);
        loom_arena_wake_all(a);
    }
    arena_free(a);
    return loomSuccess;
}

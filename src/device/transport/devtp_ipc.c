/* SPDX-License-Identifier: Apache-2.0
 *
 * devtp_ipc.c - the ipc device transport (devtp.h): every rank of the
 * communicator on this host reads its peers' device scratch buffers directly
 * (IPC mappings between processes, plain pointers between threads of one
 * process) and orders itself with flag words in a shared-memory segment.
 * This file sets it up, releases and tears it down; devtp_ipc_run.c queues
 * the calls.
 *
 * Set-up (open, collective): each rank checks that its runtime has the
 * stream memory operations (memops_ok), allocates a scratch buffer of
 * LOOM_DEVICE_IPC_BYTES on its device and exports it; rank 0 creates the
 * flags segment in LOOM_SHM_DIR (mode 0600, a random name, O_EXCL, every
 * flag initialised) and the ranks exchange {process, device, scratch address
 * and handle, segment name} with loomAllGather on the host communicator.
 * Each rank then maps the segment (the loom_seg_file_open rules: no symbolic
 * link, a regular file of this user), makes it addressable by its streams
 * (host_map) and maps every peer's scratch: the pointer itself for a rank of
 * this process, ipc_open otherwise. An agreement (every rank's result and
 * reason, gathered) ends each phase, so all ranks return alike and with the
 * first failing rank's reason; rank 0 removes the name once every rank has
 * mapped it or given up. Ranks of one process on different devices are
 * refused: their kernels would read peer memory without peer access.
 *
 * Flags: in rank r's block, ready[p] ("p's scratch holds p's current chunk")
 * and done[p] ("p finished reading r's scratch"), both written by p's stream
 * and reset by r's; r's stream alone waits on them. At rest ready = 0 and
 * done = 1 (open stores these values), which is also the state every call
 * leaves behind: a call's queued work uses constant values only, so the same
 * work captured into a CUDA graph is correct at every replay.
 *
 * Protocol of one chunk on rank r (n ranks, all on r's stream s, in order):
 *   (a) for every peer p: wait done_r[p] >= 1, then write done_r[p] = 0;
 *   (b) copy r's input of the chunk into scratch_r;
 *   (c) for every peer p: write ready_p[r] = 1;
 *   (d) for every peer p: wait ready_r[p] >= 1, then write ready_r[p] = 0;
 *   (e) the work, reading scratch_p of every rank p (devtp_ipc_run.c);
 *   (f) for every peer p: write done_p[r] = 1.
 * write_u32 stores only after all earlier work of its stream has completed
 * and is visible (devrt.h), so each set publishes what precedes it.
 *
 * Why it is race free (chunk k, ranks r and p; "set" = a write of 1):
 *  1. scratch_r is rewritten at (b) of chunk k+1 only after r saw done_r[p]
 *     set by every p at (f) of chunk k, which p's stream writes after its
 *     reads of (e) completed: no peer still reads chunk k. The first chunk
 *     finds done pre-set (nobody read anything yet).
 *  2. Each done_r[p] is set once per chunk and r resets it in between: the
 *     set of chunk k happens after r's reset at (a) of chunk k, because p
 *     sets it at (f) of chunk k after passing (d), which needs ready_p[r]
 *     that r sets at (c) of chunk k, after that reset. So a reset never
 *     erases a set it has not consumed, and the set r consumes at (a) of
 *     chunk k+1 is chunk k's.
 *  3. The same for ready_r[p]: p sets it at (c) of chunk k+1 only after
 *     passing its (a) of chunk k+1, i.e. after done_p[r] set by r at (f) of
 *     chunk k, which r's stream writes after its reset of ready_r[p] at (d)
 *     of chunk k. So the ready r consumes at (d) of chunk k is p's set of
 *     chunk k, published after scratch_p holds chunk k (p's (b) precedes its
 *     (c)): r reads complete data, never the next chunk's.
 *  4. A peer may run ahead at most into (a)/(b) of its next chunk: it cannot
 *     touch its scratch (1.) nor signal ready (it has not passed (a)), so a
 *     slow reader never sees a newer chunk. Calls are chunks in a row, so
 *     the argument holds across calls, and across replays of a graph.
 *  5. Deadlock freedom: every rank's (a) of chunk k+1 waits for (f) of chunk
 *     k, which follows (d) of chunk k, which waits only for the (c)s of chunk
 *     k, which every rank reaches once its own (a) of chunk k passed; by
 *     induction every rank passes every step provided all ranks queue the
 *     same calls in the same order (devtp.h) and this transport's calls of a
 *     communicator run in issue order on the device (one stream, or streams
 *     the caller orders: two streams of one communicator running at once
 *     would interleave their flag operations).
 * release() stores LOOM_DEV_FLAG_ABORT (above every value waited for) in all
 * of this rank's words, so every wait of r's stream passes; since r's stream
 * resets a word right after waiting on it, a later queued wait on the same
 * word would block again, so a keeper thread stores the abort value again
 * every IPC_KEEP_US until close. After a release the calls in flight give
 * undefined results (the watchdog reports the communicator's error).
 * Ranks that are threads of one process share its device: a call that
 * synchronizes the whole device (cudaFree, the emulation's mem_free) made by
 * one rank while another rank's stream waits in this protocol for it would
 * deadlock; run() makes none, and a caller must not make one while a peer's
 * stream may still wait for this rank's next call.
 * close() waits (bounded by the timeout) for the work this rank queued and
 * for every peer's done word of this rank (peers no longer read its scratch)
 * before it frees anything; what a stream that never finishes might still
 * touch is leaked with a WARN rather than freed under it.
 */
#include "devtp_ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "param.h"
#include "secret.h"
#include "shm/shm_seg.h"

#define IPC_MAGIC            0x3150494456454d4cull /* "LMEVDIP1" */
#define IPC_VERSION          1u
#define IPC_KEEP_US          200
#define IPC_MIN_BYTES        4096u
#define IPC_CLOSE_ABORTED_MS 2000 /* the wait of close after a release */

typedef struct {
    _Atomic uint64_t magic; /* stored last by rank 0: the segment is ready */
    uint32_t version;
    uint32_t nranks;
    uint64_t bytes;
    uint8_t pad[40];
} ipc_hdr_t;

_Static_assert(sizeof(ipc_hdr_t) <= IPC_FLAGS_OFF, "the header fits before the flags");

/* What each rank tells the others at open. */
typedef struct {
    uint64_t proc;    /* this process's random token: equal only within one process */
    int32_t pid;      /* for messages */
    int32_t device;   /* dc->device */
    uint64_t scratch; /* the scratch's address in this process */
    uint64_t offset;  /* scratch - its allocation's base */
    uint64_t bytes;   /* scratch bytes */
    loom_dev_ipc_t handle;
    char seg_name[64]; /* rank 0's */
} ipc_entry_t;

/* A random token of this process: ranks with equal tokens share an address
 * space (pids alone may repeat across pid namespaces). A child made by fork
 * draws a new one: it inherits the variable, not the parent's address space. */
static pthread_mutex_t proc_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t proc_token;
static pid_t proc_token_pid;

static uint64_t process_token(void)
{
    pthread_mutex_lock(&proc_lock);
    if (proc_token_pid != getpid()) {
        if (loom_random_bytes(&proc_token, sizeof(proc_token)) != loomSuccess)
            proc_token = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
        proc_token_pid = getpid();
    }
    uint64_t t = proc_token;
    pthread_mutex_unlock(&proc_lock);
    return t;
}

static size_t seg_bytes_for(int nranks)
{
    size_t b = IPC_FLAGS_OFF + (size_t)nranks * IPC_BLOCK_WORDS * sizeof(uint32_t);
    return (b + 4095) & ~(size_t)4095;
}

static void store_flag(uint32_t *w, uint32_t v)
{
    __atomic_store_n(w, v, __ATOMIC_SEQ_CST);
}

// ---- the flags segment ----------------------------------------------------------

/* Makes the mapped segment addressable by this process's streams. */
static loomResult_t seg_map_device(ipc_state_t *st, char *why, size_t why_len)
{
    void *dev = NULL;
    loomResult_t r = st->rt->host_map(st->seg, st->seg_bytes, &dev);
    if (r != loomSuccess) {
        loom_devtp_why(why, why_len, "cannot map the flags segment for the device: %s",
                       loomGetLastError(NULL));
        return r;
    }
    st->seg_dev = dev;
    return loomSuccess;
}

/* Rank 0: creates, sizes and initialises the segment under a fresh name. */
static loomResult_t seg_create(ipc_state_t *st, char *why, size_t why_len)
{
    const char *dir = loom_param_SHM_DIR();
    uint8_t rnd[12];
    LOOM_CHECK(loom_random_bytes(rnd, sizeof(rnd)));
    int o = snprintf(st->seg_name, sizeof(st->seg_name), "/loom-%d-devipc-", (int)getpid());
    for (size_t i = 0; i < sizeof(rnd) && o + 2 < (int)sizeof(st->seg_name); i++, o += 2)
        snprintf(st->seg_name + o, sizeof(st->seg_name) - (size_t)o, "%02x", rnd[i]);
    char path[PATH_MAX];
    loom_seg_file_path(dir, st->seg_name, path, sizeof(path));
    size_t bytes = seg_bytes_for(st->nranks);
    int fd = loom_seg_file_open(dir, st->seg_name, O_RDWR | O_CREAT | O_EXCL);
    if (fd < 0) {
        loom_devtp_why(why, why_len, "cannot create the flags segment %s: %s", path,
                       strerror(errno));
        return loomSystemError;
    }
    st->seg_owner = 1;
    int err = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    void *base = MAP_FAILED;
    if (err == 0) {
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        err = base == MAP_FAILED ? errno : 0;
    }
    close(fd);
    if (err != 0) {
        loom_devtp_why(why, why_len, "cannot size and map the flags segment %s (%zu bytes): %s",
                       path, bytes, strerror(err));
        return loomSystemError;
    }
    st->seg = base;
    st->seg_bytes = bytes;
    for (int r = 0; r < st->nranks; r++)
        for (int p = 0; p < st->nranks; p++) {
            store_flag(ipc_flag_host(st, r, IPC_READY, p), 0);
            store_flag(ipc_flag_host(st, r, IPC_DONE, p), 1);
        }
    ipc_hdr_t *hdr = base;
    hdr->version = IPC_VERSION;
    hdr->nranks = (uint32_t)st->nranks;
    hdr->bytes = bytes;
    atomic_store_explicit(&hdr->magic, IPC_MAGIC, memory_order_release);
    /* Listed before the exchange names it, so that ranks of this process find it. */
    LOOM_CHECK(seg_map_device(st, why, why_len));
    st->seg_shared = loom_ipc_share_add(st->seg_name, st->seg, st->seg_bytes, st->seg_dev);
    return loomSuccess;
}

/* The other ranks: maps rank 0's segment (complete before the exchange). */
static loomResult_t seg_open(ipc_state_t *st, const char *name, char *why, size_t why_len)
{
    const char *dir = loom_param_SHM_DIR();
    char path[PATH_MAX];
    snprintf(st->seg_name, sizeof(st->seg_name), "%s", name);
    loom_seg_file_path(dir, st->seg_name, path, sizeof(path));
    int fd = loom_seg_file_open(dir, st->seg_name, O_RDWR);
    if (fd < 0) {
        loom_devtp_why(why, why_len, "cannot open the flags segment %s: %s", path, strerror(errno));
        return loomSystemError;
    }
    size_t bytes = seg_bytes_for(st->nranks);
    void *shared = NULL, *shared_dev = NULL;
    if (loom_ipc_share_find(st->seg_name, bytes, &shared, &shared_dev)) {
        close(fd);
        st->seg = shared;
        st->seg_dev = shared_dev;
        st->seg_bytes = bytes;
        st->seg_shared = 1;
        return loomSuccess;
    }
    struct stat sb;
    int err = fstat(fd, &sb) != 0 ? errno : 0;
    void *base = MAP_FAILED;
    if (err == 0 && (size_t)sb.st_size == bytes) {
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        err = base == MAP_FAILED ? errno : 0;
    } else if (err == 0) {
        err = EINVAL;
    }
    close(fd);
    if (err != 0) {
        loom_devtp_why(why, why_len, "cannot map the flags segment %s (%zu bytes expected): %s",
                       path, bytes, strerror(err));
        return loomSystemError;
    }
    ipc_hdr_t *hdr = base;
    if (atomic_load_explicit(&hdr->magic, memory_order_acquire) != IPC_MAGIC ||
        hdr->version != IPC_VERSION || hdr->nranks != (uint32_t)st->nranks || hdr->bytes != bytes) {
        munmap(base, bytes);
        loom_devtp_why(why, why_len, "the flags segment %s is not this communicator's", path);
        return loomInvalidUsage;
    }
    st->seg = base;
    st->seg_bytes = bytes;
    LOOM_CHECK(seg_map_device(st, why, why_len));
    st->seg_shared = loom_ipc_share_add(st->seg_name, st->seg, st->seg_bytes, st->seg_dev);
    return loomSuccess;
}

static void seg_unlink(ipc_state_t *st)
{
    if (st->seg_owner && st->seg_name[0] != '\0')
        loom_seg_unlink(loom_param_SHM_DIR(), st->seg_name);
    st->seg_owner = 0;
}

// ---- release --------------------------------------------------------------------

static void store_abort(ipc_state_t *st)
{
    for (int p = 0; p < st->nranks; p++) {
        store_flag(ipc_flag_host(st, st->rank, IPC_READY, p), LOOM_DEV_FLAG_ABORT);
        store_flag(ipc_flag_host(st, st->rank, IPC_DONE, p), LOOM_DEV_FLAG_ABORT);
    }
}

static void *keeper_main(void *arg)
{
    ipc_state_t *st = arg;
    while (!__atomic_load_n(&st->stop_keeper, __ATOMIC_ACQUIRE)) {
        store_abort(st);
        struct timespec ts = {0, IPC_KEEP_US * 1000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

void loom_devtp_ipc_release(loom_dev_comm_t *dc, void *state)
{
    (void)dc;
    ipc_state_t *st = state;
    if (st == NULL || st->seg == NULL)
        return;
    __atomic_store_n(&st->released, 1, __ATOMIC_RELEASE);
    store_abort(st);
    pthread_mutex_lock(&st->keeper_lock);
    if (!st->keeper_started && !__atomic_load_n(&st->stop_keeper, __ATOMIC_ACQUIRE)) {
        if (pthread_create(&st->keeper, NULL, keeper_main, st) == 0)
            st->keeper_started = 1;
        else
            LOOM_WARN("ipc device transport: cannot start the thread that keeps this rank's flags "
                      "released; a second queued wait on one of them may block");
    }
    pthread_mutex_unlock(&st->keeper_lock);
}

// ---- teardown -------------------------------------------------------------------

/* 1 once every peer's done word of this rank is set: no peer reads this
 * rank's scratch any more (or the words hold the abort value). */
static int peers_done(const ipc_state_t *st)
{
    for (int p = 0; p < st->nranks; p++)
        if (p != st->rank &&
            __atomic_load_n(ipc_flag_host(st, st->rank, IPC_DONE, p), __ATOMIC_ACQUIRE) == 0)
            return 0;
    return 1;
}

static int wait_peers_done(const ipc_state_t *st, int64_t timeout_ms)
{
    int64_t end = loom_devtp_now_ms() + timeout_ms;
    while (!peers_done(st)) {
        if (loom_devtp_now_ms() >= end ||
            (st->abort_flag && __atomic_load_n(st->abort_flag, __ATOMIC_ACQUIRE)))
            return 0;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* Frees everything; with leak_device set, what a stream may still touch
 * (scratch, output staging, peers' mappings, the mapped flags) is left. */
static void ipc_free(ipc_state_t *st, int leak_device)
{
    const loom_devrt_t *rt = st->rt;
    pthread_mutex_lock(&st->keeper_lock);
    __atomic_store_n(&st->stop_keeper, 1, __ATOMIC_RELEASE);
    int joined = st->keeper_started;
    st->keeper_started = 0;
    pthread_mutex_unlock(&st->keeper_lock);
    if (joined)
        pthread_join(st->keeper, NULL);
    seg_unlink(st);
    if (!leak_device) {
        for (int p = 0; p < st->nranks; p++)
            if (st->peer_map[p] != NULL)
                rt->ipc_close(st->peer_map[p]);
        /* A mapping shared with ranks of this process goes with the last of them. */
        if (st->seg != NULL && (!st->seg_shared || loom_ipc_share_drop(st->seg))) {
            if (st->seg_dev != NULL)
                rt->host_unmap(st->seg);
            munmap(st->seg, st->seg_bytes);
        }
        if (st->out != NULL)
            rt->mem_free(st->out);
        if (st->scratch != NULL)
            rt->mem_free(st->scratch);
        loom_devtp_track_fini(&st->track, rt);
    }
    pthread_mutex_destroy(&st->keeper_lock);
    free(st);
}

static void ipc_close(loom_dev_comm_t *dc, void *state)
{
    ipc_state_t *st = state;
    if (st == NULL)
        return;
    int64_t timeout = dc->timeout_ms > 0 ? dc->timeout_ms : 0;
    int released = __atomic_load_n(&st->released, __ATOMIC_ACQUIRE);
    int idle = loom_devtp_track_wait(&st->track, st->rt, released ? IPC_CLOSE_ABORTED_MS : timeout);
    if (idle && !released)
        idle = wait_peers_done(st, timeout);
    if (!idle && !released) {
        LOOM_WARN("ipc device transport: rank %d: work queued on the device or a peer's reads of "
                  "this rank's scratch did not finish within %lld ms of close; releasing them",
                  st->rank, (long long)timeout);
        loom_devtp_ipc_release(dc, st);
        idle = loom_devtp_track_wait(&st->track, st->rt, IPC_CLOSE_ABORTED_MS);
    }
    if (!idle)
        LOOM_WARN("ipc device transport: rank %d: a stream still runs this transport's work; its "
                  "device scratch and mappings are left allocated rather than freed under it",
                  st->rank);
    ipc_free(st, !idle);
}

// ---- set-up ---------------------------------------------------------------------

static size_t scratch_bytes_param(void)
{
    int64_t b = loom_param_DEVICE_IPC_BYTES();
    size_t v = b < (int64_t)IPC_MIN_BYTES ? IPC_MIN_BYTES : (size_t)b;
    return v & ~(size_t)(IPC_MIN_BYTES - 1);
}

/* Phase 1, local: scratch, its export, the segment on rank 0. */
static loomResult_t setup_local(loom_dev_comm_t *dc, ipc_state_t *st, ipc_entry_t *me, char *why,
                                size_t why_len)
{
    const loom_devrt_t *rt = dc->rt;
    char memops[LOOM_DEVTP_WHY_BYTES] = "";
    if (rt->memops_ok != NULL && !rt->memops_ok(memops, sizeof(memops))) {
        loom_devtp_why(why, why_len, "the flag protocol needs stream memory operations: %s",
                       memops);
        return loomInvalidUsage;
    }
    me->proc = process_token();
    me->pid = (int32_t)getpid();
    me->device = dc->device;
    size_t bytes = scratch_bytes_param();
    loomResult_t r = rt->mem_alloc(&st->scratch, bytes);
    if (r != loomSuccess) {
        loom_devtp_why(why, why_len, "cannot allocate %zu bytes of device scratch: %s", bytes,
                       loomGetLastError(NULL));
        return r;
    }
    st->out_bytes = bytes < IPC_OUT_MAX_BYTES ? bytes : IPC_OUT_MAX_BYTES;
    if ((r = rt->mem_alloc(&st->out, st->out_bytes)) != loomSuccess) {
        loom_devtp_why(why, why_len, "cannot allocate %zu bytes of device memory: %s",
                       st->out_bytes, loomGetLastError(NULL));
        return r;
    }
    void *base = NULL;
    size_t size = 0;
    if ((r = rt->ptr_base(st->scratch, &base, &size)) == loomSuccess)
        r = rt->ipc_export(base, &me->handle);
    if (r != loomSuccess) {
        loom_devtp_why(why, why_len, "cannot export the device scratch for IPC: %s",
                       loomGetLastError(NULL));
        return r;
    }
    me->scratch = (uint64_t)(uintptr_t)st->scratch;
    me->offset = (uint64_t)((uintptr_t)st->scratch - (uintptr_t)base);
    me->bytes = bytes;
    if (dc->rank == 0) {
        LOOM_CHECK(seg_create(st, why, why_len));
        snprintf(me->seg_name, sizeof(me->seg_name), "%s", st->seg_name);
    }
    return loomSuccess;
}

/* Phase 2, local: the segment and every peer's scratch, as this rank sees them. */
static loomResult_t setup_peers(loom_dev_comm_t *dc, ipc_state_t *st, const ipc_entry_t *all,
                                char *why, size_t why_len)
{
    const loom_devrt_t *rt = dc->rt;
    const ipc_entry_t *me = &all[dc->rank];
    st->chunk_bytes = (size_t)me->bytes;
    for (int p = 0; p < dc->nranks; p++) {
        if (all[p].proc == me->proc && all[p].device != me->device) {
            loom_devtp_why(why, why_len,
                           "ranks %d and %d are threads of one process on devices %d and %d: the "
                           "ipc transport needs them on one device",
                           dc->rank, p, me->device, all[p].device);
            return loomInvalidUsage;
        }
        if (all[p].bytes < st->chunk_bytes)
            st->chunk_bytes = (size_t)all[p].bytes;
    }
    if (dc->rank != 0) {
        char name[sizeof(all[0].seg_name)];
        memcpy(name, all[0].seg_name, sizeof(name));
        name[sizeof(name) - 1] = '\0';
        LOOM_CHECK(seg_open(st, name, why, why_len));
    }
    loomResult_t r = loomSuccess;
    for (int p = 0; p < dc->nranks; p++) {
        if (p == dc->rank) {
            st->peer[p] = st->scratch;
        } else if (all[p].proc == me->proc) {
            st->peer[p] = (void *)(uintptr_t)all[p].scratch;
        } else {
            void *m = NULL;
            if ((r = rt->ipc_open(&all[p].handle, &m)) != loomSuccess) {
                loom_devtp_why(why, why_len,
                               "cannot open rank %d's device scratch (process %d) over IPC: %s", p,
                               (int)all[p].pid, loomGetLastError(NULL));
                return r;
            }
            st->peer_map[p] = m;
            st->peer[p] = (char *)m + all[p].offset;
        }
    }
    return loomSuccess;
}

static loomResult_t ipc_open(loom_dev_comm_t *dc, void **state, char *why, size_t why_len)
{
    *state = NULL;
    if (!dc->all_local) {
        loom_devtp_why(why, why_len, "the communicator's ranks span several hosts");
        return loomInvalidUsage;
    }
    if (dc->nranks > LOOM_DK_MAX_SRCS) {
        loom_devtp_why(why, why_len, "%d ranks: the device kernels reduce at most %d inputs",
                       dc->nranks, LOOM_DK_MAX_SRCS);
        return loomInvalidUsage;
    }
    char mine[LOOM_DEVTP_WHY_BYTES] = "";
    ipc_state_t *st = calloc(1, sizeof(*st));
    ipc_entry_t *all = calloc((size_t)dc->nranks, sizeof(*all));
    ipc_entry_t me;
    memset(&me, 0, sizeof(me));
    loomResult_t r = loomSuccess;
    if (st == NULL || all == NULL) {
        snprintf(mine, sizeof(mine), "out of memory");
        r = loomSystemError;
        free(st);
        st = NULL;
    } else {
        st->rt = dc->rt;
        st->rank = dc->rank;
        st->nranks = dc->nranks;
        st->timeout_ms = dc->timeout_ms;
        st->abort_flag = dc->abort_flag;
        pthread_mutex_init(&st->keeper_lock, NULL);
        loom_devtp_track_init(&st->track);
        r = setup_local(dc, st, &me, mine, sizeof(mine));
    }
    loomResult_t agreed = loom_devtp_agree(dc, r, mine, why, why_len);
    if (agreed == loomSuccess)
        agreed = loom_devtp_allgather(dc, &me, all, sizeof(me), why, why_len);
    if (agreed == loomSuccess) {
        r = setup_peers(dc, st, all, mine, sizeof(mine));
        agreed = loom_devtp_agree(dc, r, mine, why, why_len);
    }
    free(all);
    if (st != NULL)
        seg_unlink(st); /* every rank mapped it or gave up: the name is no longer needed */
    if (agreed != loomSuccess) {
        if (st != NULL)
            ipc_free(st, 0);
        return agreed;
    }
    LOOM_INFO(LOOM_LOG_TRANSPORT,
              "ipc device transport: rank %d of %d, %zu-byte scratch chunks, flags segment %s",
              dc->rank, dc->nranks, st->chunk_bytes, st->seg_name);
    *state = st;
    return loomSuccess;
}

const loom_devtp_t loom_devtp_ipc = {
    .name = "ipc",
    .capturable = 1,
    .open = ipc_open,
    .close = ipc_close,
    .handles = loom_devtp_ipc_handles,
    .run = loom_devtp_ipc_run,
    .release = loom_devtp_ipc_release,
};

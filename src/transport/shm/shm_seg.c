/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_seg.c - creation, mapping and layout of the per-host shared-memory
 * segment, plus the single-producer/single-consumer byte rings and futex
 * doorbells inside it.
 * It does not decide names, leaders or who connects to whom (shm.c does),
 * and it never trusts the segment: every counter read from it is bounded
 * by the ring size before it is used. Caller: shm/shm.c.
 */
#include "shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"

/* Segment layout (offsets from the mapping's base; every part 64-byte
 * aligned, ring data page aligned):
 *   0                  header (64 bytes)
 *   64                 doorbells: n_local x 64 bytes
 *   64 + 64*n_local    ring controls: n_rings x 192 bytes (tail, head, flags
 *                      on three cache lines)
 *   page aligned       ring data: n_rings x ring_bytes
 * with n_rings = n_local * (n_local - 1), one per ordered pair of local
 * ranks; ring (from, to) has index from * (n_local - 1) + (to < from ? to : to - 1).
 *
 * Ring protocol (single producer, single consumer): tail and head count bytes
 * ever written / read, so tail - head is the fill level (never above size)
 * and pos & (size - 1) the offset. The writer copies, then publishes tail
 * with a release store; the reader loads tail with acquire, copies out, then
 * publishes head with release; each side loads the other's counter with
 * acquire before reusing or reading bytes. Large copies are published every
 * PUBLISH_BYTES so the reader starts while the writer is still copying.
 *
 * Doorbell protocol (no lost wakeups): the sleeper sets `sleeping`, issues a
 * full fence, snapshots `seq`, re-checks its rings, then FUTEX_WAITs on seq
 * with the snapshot. A notifier publishes its counter, issues a full fence
 * and, only if it sees `sleeping`, bumps seq and FUTEX_WAKEs. The two fences
 * order "store, then load" on both sides, so either the notifier sees
 * `sleeping` (then the bumped seq makes FUTEX_WAIT return or the wake
 * arrives) or the sleeper's re-check sees the published bytes. A busy peer
 * thus costs a fence and a load per ring update, never a syscall. The
 * futexes are shared (not FUTEX_PRIVATE): the words live in a mapping shared
 * between processes. */

#define SEG_MAGIC     0x314753534d4f4f4cull /* "LOOMSSG1" */
#define SEG_VERSION   1u
#define PUBLISH_BYTES (64u * 1024u)

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "shared-memory rings need lock-free 32- and 64-bit atomics");

struct loom_seg_hdr {
    _Atomic uint64_t magic; /* stored last by the creator: the segment is ready */
    uint32_t version;
    uint32_t n_local;
    uint64_t ring_bytes;
    uint64_t total_bytes;
    _Atomic uint32_t mapped; /* ranks that mapped it; the last one unlinks the name */
    uint8_t pad[28];
};

_Static_assert(sizeof(struct loom_seg_hdr) == 64, "segment header is one cache line");
_Static_assert(sizeof(loom_seg_bell_t) == 64, "doorbell is one cache line");
_Static_assert(sizeof(loom_seg_ring_ctl_t) == 192, "ring control is three cache lines");

static size_t n_rings(int n_local)
{
    return (size_t)n_local * (size_t)(n_local - 1);
}

static size_t data_offset(int n_local)
{
    size_t meta = sizeof(loom_seg_hdr_t) + (size_t)n_local * sizeof(loom_seg_bell_t) +
                  n_rings(n_local) * sizeof(loom_seg_ring_ctl_t);
    return (meta + 4095) & ~(size_t)4095;
}

size_t loom_seg_bytes(int n_local, uint64_t ring_bytes)
{
    return data_offset(n_local) + n_rings(n_local) * (size_t)ring_bytes;
}

uint64_t loom_seg_ring_bytes(int n_local, int64_t requested)
{
    uint64_t bytes = LOOM_SHM_RING_MIN_BYTES;
    while (bytes < (uint64_t)requested && bytes < LOOM_SHM_SEG_MAX_BYTES)
        bytes <<= 1;
    while (bytes > LOOM_SHM_RING_MIN_BYTES &&
           loom_seg_bytes(n_local, bytes) > LOOM_SHM_SEG_MAX_BYTES)
        bytes >>= 1;
    return bytes;
}

static void seg_layout(loom_seg_t *seg, void *base, size_t bytes, int n_local, uint64_t ring_bytes)
{
    seg->base = base;
    seg->bytes = bytes;
    seg->n_local = n_local;
    seg->ring_bytes = ring_bytes;
    seg->hdr = base;
    seg->bells = (loom_seg_bell_t *)((char *)base + sizeof(loom_seg_hdr_t));
    seg->ctls = (loom_seg_ring_ctl_t *)(seg->bells + n_local);
    seg->data = (uint8_t *)base + data_offset(n_local);
}

// ---- files ------------------------------------------------------------------

static int dir_is_dev_shm(const char *dir)
{
    return strcmp(dir, "/dev/shm") == 0 || strcmp(dir, "/dev/shm/") == 0;
}

static void seg_path(const char *dir, const char *name, char *path, size_t len)
{
    size_t dl = strlen(dir);
    snprintf(path, len, "%.*s%s", (int)(dl > 0 && dir[dl - 1] == '/' ? dl - 1 : dl), dir, name);
}

/* shm_open when the directory is /dev/shm (its mount is found by glibc),
 * a plain file elsewhere (LOOM_SHM_DIR on another tmpfs or a disk).
 * O_NOFOLLOW: a symbolic link at the name is refused (ELOOP), never followed. */
static int seg_open_fd(const char *dir, const char *name, int flags)
{
    if (dir_is_dev_shm(dir))
        return shm_open(name, flags | O_CLOEXEC | O_NOFOLLOW, 0600);
    char path[PATH_MAX];
    seg_path(dir, name, path, sizeof(path));
    return open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0600);
}

/* Opens a segment another rank created, for mapping: *fd_p = -1 (Success)
 * while the name does not exist. The name is derived from the job secret, but
 * LOOM_SHM_DIR may be a directory other users write to: what is found there is
 * used only if it is no symbolic link and is a regular file (or shm object)
 * that this user owns, so that nobody else's file becomes this job's memory.
 * Errors (WARNed, naming the path): SystemError. */
static loomResult_t seg_open_existing(const char *dir, const char *name, const char *path,
                                      int *fd_p, struct stat *st_p)
{
    *fd_p = -1;
    int fd = seg_open_fd(dir, name, O_RDWR);
    if (fd < 0) {
        if (errno == ENOENT)
            return loomSuccess;
        if (errno == ELOOP)
            LOOM_WARN("shm: %s is a symbolic link: refused, not followed (another user may have "
                      "planted it in LOOM_SHM_DIR %s)",
                      path, dir);
        else
            LOOM_WARN("shm: cannot open %s: %s", path, strerror(errno));
        return loomSystemError;
    }
    const char *bad = NULL;
    if (fstat(fd, st_p) != 0) {
        LOOM_WARN("shm: fstat of %s failed: %s", path, strerror(errno));
        close(fd);
        return loomSystemError;
    }
    if (!S_ISREG(st_p->st_mode))
        bad = "is not a regular file";
    else if (st_p->st_uid != geteuid())
        bad = "is owned by another user";
    if (bad != NULL) {
        LOOM_WARN("shm: %s %s (mode %06o, uid %u; this process runs as uid %u): refused (another "
                  "user may have planted it in LOOM_SHM_DIR %s)",
                  path, bad, (unsigned)st_p->st_mode, (unsigned)st_p->st_uid, (unsigned)geteuid(),
                  dir);
        close(fd);
        return loomSystemError;
    }
    *fd_p = fd;
    return loomSuccess;
}

int loom_seg_file_open(const char *dir, const char *name, int flags)
{
    if (flags & O_CREAT)
        return seg_open_fd(dir, name, flags);
    char path[PATH_MAX];
    struct stat st;
    int fd = -1;
    seg_path(dir, name, path, sizeof(path));
    if (seg_open_existing(dir, name, path, &fd, &st) != loomSuccess) {
        errno = EPERM; /* WARNed with the cause above */
        return -1;
    }
    if (fd < 0)
        errno = ENOENT;
    return fd;
}

void loom_seg_file_path(const char *dir, const char *name, char *path, size_t len)
{
    seg_path(dir, name, path, len);
}

loomResult_t loom_seg_unlink(const char *dir, const char *name)
{
    char path[PATH_MAX];
    seg_path(dir, name, path, sizeof(path));
    int rc = dir_is_dev_shm(dir) ? shm_unlink(name) : unlink(path);
    if (rc != 0 && errno != ENOENT) {
        LOOM_WARN("shm: unlink of segment %s failed: %s", path, strerror(errno));
        return loomSystemError;
    }
    return loomSuccess;
}

/* The rank that completes the count removes the name: from then on nothing
 * of this job is left in the directory, whatever happens to the processes. */
static loomResult_t count_mapped(loom_seg_t *seg, const char *dir, const char *name)
{
    uint32_t n = atomic_fetch_add_explicit(&seg->hdr->mapped, 1, memory_order_acq_rel) + 1;
    if (n == (uint32_t)seg->n_local)
        return loom_seg_unlink(dir, name);
    return loomSuccess;
}

int loom_seg_all_mapped(const loom_seg_t *seg)
{
    return seg->base != NULL &&
           atomic_load_explicit(&seg->hdr->mapped, memory_order_acquire) >= (uint32_t)seg->n_local;
}

loomResult_t loom_seg_create(const char *dir, const char *name, int n_local, uint64_t ring_bytes,
                             loom_seg_t *seg_p)
{
    char path[PATH_MAX];
    loomResult_t res = loomSystemError;
    size_t bytes = loom_seg_bytes(n_local, ring_bytes);
    seg_path(dir, name, path, sizeof(path));
    int fd = seg_open_fd(dir, name, O_RDWR | O_CREAT | O_EXCL);
    if (fd < 0) {
        LOOM_WARN("shm: cannot create segment %s: %s", path, strerror(errno));
        return loomSystemError;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        LOOM_WARN("shm: cannot size segment %s to %zu bytes: %s", path, bytes, strerror(errno));
        goto err_unlink;
    }
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err != 0) {
        LOOM_WARN("shm: segment %s needs %zu bytes (%d local ranks, %llu-byte rings: "
                  "LOOM_SHM_RING_BYTES) and %s cannot provide them: %s",
                  path, bytes, n_local, (unsigned long long)ring_bytes, dir, strerror(err));
        goto err_unlink;
    }
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        LOOM_WARN("shm: mmap of %zu bytes of segment %s failed: %s", bytes, path, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    loom_seg_t seg;
    seg_layout(&seg, base, bytes, n_local, ring_bytes);
    seg.hdr->version = SEG_VERSION;
    seg.hdr->n_local = (uint32_t)n_local;
    seg.hdr->ring_bytes = ring_bytes;
    seg.hdr->total_bytes = bytes;
    atomic_store_explicit(&seg.hdr->mapped, 0, memory_order_relaxed);
    atomic_store_explicit(&seg.hdr->magic, SEG_MAGIC, memory_order_release);
    res = count_mapped(&seg, dir, name);
    if (res != loomSuccess) {
        munmap(base, bytes);
        return res;
    }
    LOOM_INFO(LOOM_LOG_SHM, "shm: created segment %s: %zu bytes, %d local ranks, %llu-byte rings",
              path, bytes, n_local, (unsigned long long)ring_bytes);
    *seg_p = seg;
    return loomSuccess;
err_unlink:
    close(fd);
    loom_seg_unlink(dir, name);
    return res;
}

loomResult_t loom_seg_open(const char *dir, const char *name, int n_local, loom_seg_t *seg_p,
                           int *ready_p)
{
    char path[PATH_MAX];
    seg_path(dir, name, path, sizeof(path));
    *ready_p = 0;
    int fd = -1;
    struct stat st;
    LOOM_CHECK(seg_open_existing(dir, name, path, &fd, &st));
    if (fd < 0)
        return loomSuccess; /* the leader has not created it yet */
    size_t bytes = (size_t)st.st_size;
    if (bytes < loom_seg_bytes(n_local, LOOM_SHM_RING_MIN_BYTES)) {
        close(fd); /* not sized yet */
        return loomSuccess;
    }
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED) {
        LOOM_WARN("shm: mmap of %zu bytes of segment %s failed: %s", bytes, path,
                  strerror(map_errno));
        return loomSystemError;
    }
    loom_seg_hdr_t *hdr = base;
    if (atomic_load_explicit(&hdr->magic, memory_order_acquire) != SEG_MAGIC) {
        munmap(base, bytes); /* not initialised yet */
        return loomSuccess;
    }
    uint64_t ring = hdr->ring_bytes;
    if (hdr->version != SEG_VERSION || hdr->n_local != (uint32_t)n_local ||
        ring < LOOM_SHM_RING_MIN_BYTES || ring > LOOM_SHM_SEG_MAX_BYTES || (ring & (ring - 1)) ||
        hdr->total_bytes != loom_seg_bytes(n_local, ring) || hdr->total_bytes > bytes) {
        LOOM_WARN("shm: segment %s does not match this rank: version %u, %u local ranks, "
                  "%llu-byte rings, %llu of %zu bytes (expected version %u, %d local ranks)",
                  path, hdr->version, hdr->n_local, (unsigned long long)ring,
                  (unsigned long long)hdr->total_bytes, bytes, SEG_VERSION, n_local);
        munmap(base, bytes);
        return loomInvalidUsage;
    }
    loom_seg_t seg;
    seg_layout(&seg, base, bytes, n_local, ring);
    loomResult_t res = count_mapped(&seg, dir, name);
    if (res != loomSuccess) {
        munmap(base, bytes);
        return res;
    }
    *seg_p = seg;
    *ready_p = 1;
    return loomSuccess;
}

loomResult_t loom_seg_unmap(loom_seg_t *seg)
{
    if (seg->base == NULL)
        return loomSuccess;
    if (munmap(seg->base, seg->bytes) != 0) {
        LOOM_WARN("shm: munmap of %zu bytes failed: %s", seg->bytes, strerror(errno));
        return loomSystemError;
    }
    seg->base = NULL;
    return loomSuccess;
}

// ---- rings --------------------------------------------------------------------

static size_t ring_index(int n_local, int from, int to)
{
    return (size_t)from * (size_t)(n_local - 1) + (size_t)(to < from ? to : to - 1);
}

loom_seg_ring_ctl_t *loom_seg_ctl(const loom_seg_t *seg, int from, int to)
{
    return &seg->ctls[ring_index(seg->n_local, from, to)];
}

void loom_seg_ring_attach(loom_seg_ring_t *r, const loom_seg_t *seg, int from, int to,
                          int is_writer, int rank, int peer)
{
    size_t i = ring_index(seg->n_local, from, to);
    r->ctl = &seg->ctls[i];
    r->data = seg->data + i * seg->ring_bytes;
    r->size = seg->ring_bytes;
    r->pos = is_writer ? atomic_load_explicit(&r->ctl->tail, memory_order_relaxed)
                       : atomic_load_explicit(&r->ctl->head, memory_order_relaxed);
    r->peer_bell = &seg->bells[is_writer ? to : from];
    r->rank = rank;
    r->peer = peer;
}

/* Copies n bytes between a linear buffer and the ring at pos, wrapping. */
static void ring_copy(const loom_seg_ring_t *r, uint64_t pos, void *buf, size_t n, int to_ring)
{
    size_t off = (size_t)(pos & (r->size - 1));
    size_t first = r->size - off < n ? r->size - off : n;
    if (to_ring) {
        memcpy(r->data + off, buf, first);
        memcpy(r->data, (char *)buf + first, n - first);
    } else {
        memcpy(buf, r->data + off, first);
        memcpy((char *)buf + first, r->data, n - first);
    }
}

static loomResult_t corrupt(const loom_seg_ring_t *r, uint64_t tail, uint64_t head)
{
    LOOM_WARN("shm: protocol error on the ring between rank %d and rank %d: tail %llu, head %llu, "
              "%llu-byte ring",
              r->rank, r->peer, (unsigned long long)tail, (unsigned long long)head,
              (unsigned long long)r->size);
    return loomRemoteError;
}

loomResult_t loom_seg_ring_write(loom_seg_ring_t *r, const struct iovec *iov, int iovcnt,
                                 size_t *nbytes_p, int *gone_errno_p)
{
    uint32_t rc = atomic_load_explicit(&r->ctl->reader_closed, memory_order_acquire);
    if (rc == LOOM_SHM_READER_DONE) {
        size_t all = 0;
        for (int i = 0; i < iovcnt; i++)
            all += iov[i].iov_len;
        *nbytes_p = all;
        return loomSuccess;
    }
    if (rc != LOOM_SHM_READER_OPEN) {
        *gone_errno_p = EPIPE;
        return loomRemoteError;
    }
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    if (r->pos - head > r->size)
        return corrupt(r, r->pos, head);
    size_t moved = 0;
    int i = 0;
    size_t in_iov = 0;
    while (i < iovcnt) {
        uint64_t space = r->size - (r->pos - head);
        if (space == 0) {
            head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
            if (r->pos - head > r->size)
                return corrupt(r, r->pos, head);
            if (r->size - (r->pos - head) == 0)
                break;
            continue;
        }
        size_t left = iov[i].iov_len - in_iov;
        size_t n = left < space ? left : (size_t)space;
        if (n > PUBLISH_BYTES)
            n = PUBLISH_BYTES;
        ring_copy(r, r->pos, (char *)iov[i].iov_base + in_iov, n, 1);
        r->pos += n;
        moved += n;
        in_iov += n;
        if (in_iov == iov[i].iov_len) {
            i++;
            in_iov = 0;
        }
        /* Publish per chunk, and always before leaving, so the reader can start. */
        if (n == PUBLISH_BYTES || i == iovcnt) {
            atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_release);
            loom_seg_bell_notify(r->peer_bell);
        }
    }
    if (moved > 0 && atomic_load_explicit(&r->ctl->tail, memory_order_relaxed) != r->pos) {
        atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_release);
        loom_seg_bell_notify(r->peer_bell);
    }
    *nbytes_p = moved;
    return loomSuccess;
}

loomResult_t loom_seg_ring_read(loom_seg_ring_t *r, const struct iovec *iov, int iovcnt,
                                size_t *nbytes_p, int *gone_errno_p)
{
    /* The closed flag is loaded before tail: bytes written before the close
     * are then visible, and are read before the close is reported. */
    int closed = atomic_load_explicit(&r->ctl->writer_closed, memory_order_acquire) != 0;
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    if (tail - r->pos > r->size)
        return corrupt(r, tail, r->pos);
    size_t moved = 0;
    int i = 0;
    size_t in_iov = 0;
    while (i < iovcnt) {
        uint64_t avail = tail - r->pos;
        if (avail == 0) {
            tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
            if (tail - r->pos > r->size)
                return corrupt(r, tail, r->pos);
            if (tail == r->pos)
                break;
            continue;
        }
        size_t left = iov[i].iov_len - in_iov;
        size_t n = left < avail ? left : (size_t)avail;
        if (n > PUBLISH_BYTES)
            n = PUBLISH_BYTES;
        ring_copy(r, r->pos, (char *)iov[i].iov_base + in_iov, n, 0);
        r->pos += n;
        moved += n;
        in_iov += n;
        if (in_iov == iov[i].iov_len) {
            i++;
            in_iov = 0;
        }
        if (n == PUBLISH_BYTES || i == iovcnt) {
            atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
            loom_seg_bell_notify(r->peer_bell);
        }
    }
    if (moved > 0 && atomic_load_explicit(&r->ctl->head, memory_order_relaxed) != r->pos) {
        atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
        loom_seg_bell_notify(r->peer_bell);
    }
    if (moved == 0 && closed) {
        *gone_errno_p = 0;
        return loomRemoteError;
    }
    *nbytes_p = moved;
    return loomSuccess;
}

int loom_seg_ring_can_write(const loom_seg_ring_t *r)
{
    if (atomic_load_explicit(&r->ctl->reader_closed, memory_order_acquire))
        return 1;
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    return r->pos - head != r->size;
}

int loom_seg_ring_can_read(const loom_seg_ring_t *r)
{
    if (atomic_load_explicit(&r->ctl->writer_closed, memory_order_acquire))
        return 1;
    return atomic_load_explicit(&r->ctl->tail, memory_order_acquire) != r->pos;
}

// ---- doorbells ------------------------------------------------------------------

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

void loom_seg_bell_notify(loom_seg_bell_t *b)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&b->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
        futex(&b->seq, FUTEX_WAKE, INT_MAX, NULL);
    }
}

uint32_t loom_seg_bell_sleep_begin(loom_seg_bell_t *b)
{
    atomic_store_explicit(&b->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&b->seq, memory_order_acquire);
}

loomResult_t loom_seg_bell_sleep(loom_seg_bell_t *b, uint32_t seen, int timeout_us)
{
    if (timeout_us <= 0)
        return loomSuccess;
    struct timespec ts = {.tv_sec = timeout_us / 1000000,
                          .tv_nsec = (timeout_us % 1000000) * 1000L};
    if (futex(&b->seq, FUTEX_WAIT, seen, &ts) != 0 && errno != EAGAIN && errno != EINTR &&
        errno != ETIMEDOUT) {
        LOOM_WARN("shm: futex wait failed: %s", strerror(errno));
        return loomSystemError;
    }
    return loomSuccess;
}

void loom_seg_bell_sleep_end(loom_seg_bell_t *b)
{
    atomic_store_explicit(&b->sleeping, 0, memory_order_relaxed);
}

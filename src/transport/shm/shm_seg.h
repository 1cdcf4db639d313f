/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_seg.h - the shared-memory segment of one host's ranks: its layout
 * (header, one doorbell per local rank, one byte ring per ordered pair of
 * local ranks), creation by the local leader, mapping by the others, and the
 * ring and doorbell primitives the shm transport moves bytes with.
 * It knows nothing of messages (wire.c frames them) or of ranks outside
 * the host. Its names start with loom_seg_ (loom_shm_ names the shm
 * collectives). Callers: shm/shm.c, and shm_arena*.c for the file and bell
 * primitives.
 */
#ifndef LOOM_SHM_SEG_H
#define LOOM_SHM_SEG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "loom.h"

#define LOOM_SHM_NAME_MAX       64
#define LOOM_SHM_SEG_MAX_BYTES  (1ull << 30) /* rings shrink to keep a segment below this */
#define LOOM_SHM_RING_MIN_BYTES 4096ull

/* Cache-line separated so that each side writes only lines it owns. */
typedef struct {
    _Atomic uint32_t seq;      /* futex word: bumped to wake the owner */
    _Atomic uint32_t sleeping; /* 1 while the owner is (about to be) in FUTEX_WAIT */
    uint8_t pad[56];
} loom_seg_bell_t;

typedef struct {
    _Atomic uint64_t tail; /* bytes ever written; the writer's line */
    uint8_t pad0[56];
    _Atomic uint64_t head; /* bytes ever read; the reader's line */
    uint8_t pad1[56];
    _Atomic uint32_t connected;     /* writer called connect() */
    _Atomic uint32_t writer_closed; /* writer closed its end */
    _Atomic uint32_t reader_closed; /* LOOM_SHM_READER_*: how the reader closed its end */
    uint8_t pad2[52];
} loom_seg_ring_ctl_t;

/* reader_closed: OPEN; FAILED (the reader's communicator broke or was
 * aborted: writes fail with RemoteError, so a writer blocked on a full ring
 * learns at once); DONE (a normal destroy: writes are accepted and dropped,
 * as a socket accepts bytes its peer will never read, so that the writer's
 * own closing notice never fails). */
#define LOOM_SHM_READER_OPEN   0u
#define LOOM_SHM_READER_FAILED 1u
#define LOOM_SHM_READER_DONE   2u

typedef struct loom_seg_hdr loom_seg_hdr_t;

/* A mapping of the segment in this process. */
typedef struct {
    void *base;
    size_t bytes; /* mapped length */
    int n_local;
    uint64_t ring_bytes; /* power of two */
    loom_seg_hdr_t *hdr;
    loom_seg_bell_t *bells;    /* [n_local] */
    loom_seg_ring_ctl_t *ctls; /* [n_local * (n_local - 1)] */
    uint8_t *data;             /* ring i at data + i * ring_bytes */
} loom_seg_t;

/* One end of a ring, private to the process using it. */
typedef struct {
    loom_seg_ring_ctl_t *ctl;
    uint8_t *data;
    uint64_t size;              /* bytes, power of two */
    uint64_t pos;               /* writer: tail; reader: head (our own counter, never re-read) */
    loom_seg_bell_t *peer_bell; /* rung after moving bytes, so a sleeping peer wakes */
    int rank, peer;             /* global ranks, for messages */
} loom_seg_ring_t;

/* Ring size for n_local ranks: requested bytes rounded up to a power of two,
 * halved until the segment fits LOOM_SHM_SEG_MAX_BYTES (not below 4 KiB). */
uint64_t loom_seg_ring_bytes(int n_local, int64_t requested);
/* Bytes of a segment for n_local ranks and rings of ring_bytes. */
size_t loom_seg_bytes(int n_local, uint64_t ring_bytes);

/* Creates, sizes (allocating every page up front: a full /dev/shm fails here
 * with SystemError, not with SIGBUS later) and maps the segment, then counts
 * this rank as mapped. dir is LOOM_SHM_DIR; name starts with '/'. */
loomResult_t loom_seg_create(const char *dir, const char *name, int n_local, uint64_t ring_bytes,
                             loom_seg_t *seg_p);
/* Maps a segment created by the leader and counts this rank as mapped.
 * *ready_p = 0 (and nothing mapped) while it does not exist or is not fully
 * initialised yet; call again. Its header is checked against n_local. A name
 * that is a symbolic link (never followed) or not a regular file owned by
 * this process's user is refused: SystemError, WARNed with path and owner. */
loomResult_t loom_seg_open(const char *dir, const char *name, int n_local, loom_seg_t *seg_p,
                           int *ready_p);
/* The segment file name in dir, opened with flags (created mode 0600), and its
 * path: also used by the collectives' arena (shm_arena.c), which follows the
 * same rules. -1 with errno set on failure. Without O_CREAT the name is opened
 * as loom_seg_open does (no symbolic link, a regular file of this user):
 * a refusal is WARNed and gives errno EPERM. */
int loom_seg_file_open(const char *dir, const char *name, int flags);
void loom_seg_file_path(const char *dir, const char *name, char *path, size_t len);
/* Removes the name; ENOENT is not an error (another rank did it). */
loomResult_t loom_seg_unlink(const char *dir, const char *name);
/* 1 once every local rank has mapped the segment (the name is then gone). */
int loom_seg_all_mapped(const loom_seg_t *seg);
loomResult_t loom_seg_unmap(loom_seg_t *seg);

/* Ring from local rank `from` to local rank `to` (from != to). */
loom_seg_ring_ctl_t *loom_seg_ctl(const loom_seg_t *seg, int from, int to);
void loom_seg_ring_attach(loom_seg_ring_t *r, const loom_seg_t *seg, int from, int to,
                          int is_writer, int rank, int peer);

/* Non-blocking copies into / out of a ring (the wire.c io contract:
 * RemoteError when the other end is closed, *gone_errno_p set; a write to a
 * reader closed with LOOM_SHM_READER_DONE is dropped and counted as moved). */
loomResult_t loom_seg_ring_write(loom_seg_ring_t *r, const struct iovec *iov, int iovcnt,
                                 size_t *nbytes_p, int *gone_errno_p);
loomResult_t loom_seg_ring_read(loom_seg_ring_t *r, const struct iovec *iov, int iovcnt,
                                size_t *nbytes_p, int *gone_errno_p);
/* Whether a write / read could move bytes now (or report the peer's close). */
int loom_seg_ring_can_write(const loom_seg_ring_t *r);
int loom_seg_ring_can_read(const loom_seg_ring_t *r);

/* Doorbells. notify wakes the bell's owner only if it is sleeping. The owner
 * sleeps with: sleep_begin, re-check its rings, sleep (skipped by passing 0
 * timeout if the re-check found work), sleep_end. No wakeup is lost: see
 * shm_seg.c. */
void loom_seg_bell_notify(loom_seg_bell_t *b);
uint32_t loom_seg_bell_sleep_begin(loom_seg_bell_t *b);
loomResult_t loom_seg_bell_sleep(loom_seg_bell_t *b, uint32_t seen, int timeout_us);
void loom_seg_bell_sleep_end(loom_seg_bell_t *b);

#endif

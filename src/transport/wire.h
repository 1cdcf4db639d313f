/* SPDX-License-Identifier: Apache-2.0
 *
 * wire.h - the message-framing engine shared by the tcp and shm transports:
 * tagged messages over one ordered byte stream per direction, with send
 * queues, posted receives, tag matching and request recycling. A wire may
 * run over several byte channels ("lanes", the tcp transport's sockets of one
 * peer): large payloads are then striped across them in fixed-size pieces.
 * It never blocks and knows nothing of sockets or rings: the transport gives
 * it a pair of non-blocking readv/writev callbacks. Callers: tcp/tcp.c,
 * shm/shm.c. Not thread safe: one thread drives a wire at a time.
 */
#ifndef LOOM_WIRE_H
#define LOOM_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "loom.h"
#include "transport.h"

#define LOOM_WIRE_MAGIC 0x4d4f4f4cu /* "LOOM" in memory order */
/* u32 magic, u32 tag, u64 payload bytes, then the call stamp (transport.h) */
#define LOOM_WIRE_STAMP_OFF 16
#define LOOM_WIRE_HDR_BYTES (LOOM_WIRE_STAMP_OFF + LOOM_TP_STAMP_BYTES)
#define LOOM_WIRE_MAX_LANES 8 /* byte channels one stream may stripe across */

/* A frame header's fields. */
typedef struct {
    uint32_t tag;
    uint64_t nbytes; /* payload bytes that follow the header */
} loom_tp_frame_header_t;

/* Encodes a header {magic, tag, nbytes} into out (little-endian), its stamp
 * zero; the stamp's bytes are at out + LOOM_WIRE_STAMP_OFF. */
void loom_tp_frame_header_encode(uint32_t tag, uint64_t nbytes, uint8_t out[LOOM_WIRE_HDR_BYTES]);
/* Decodes the first LOOM_WIRE_HDR_BYTES of buf, pure (no logging): len
 * must be exactly that and the magic right. Returns 0, -1 for a wrong length,
 * -2 for a wrong magic; *h_p is set only on success. The payload length is
 * not bounded here: the receive it is matched to bounds it. */
int loom_tp_frame_header_decode(const void *buf, size_t len, loom_tp_frame_header_t *h_p);

/* The byte channel under a stream (each lane's). chan is the lane's channel
 * pointer. Both callbacks move as much of iov as
 * they can without blocking and set *nbytes_p (0: would block). A peer that
 * is gone gives RemoteError without a WARN and *gone_errno_p = its errno
 * (0: orderly close), so that the engine names the peer rank once. Other
 * failures are WARNed by the callback, which then leaves *gone_errno_p at the
 * -1 the engine preset. */
typedef struct {
    loomResult_t (*writev)(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                           int *gone_errno_p);
    loomResult_t (*readv)(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                          int *gone_errno_p);
} loom_wire_io_t;

typedef struct loom_wire loom_wire_t;

typedef struct loom_wire_req {
    struct loom_wire_req *next;     /* posted list or free list */
    struct loom_wire_req *all_next; /* every request the stream ever allocated */
    /* Per-lane work queues: the lanes that still move bytes of this message. */
    struct loom_wire_req *lane_next[LOOM_WIRE_MAX_LANES];
    loom_wire_t *s;
    char *buf;
    size_t len;         /* send: message bytes; receive: capacity in bytes */
    size_t done;        /* payload bytes moved so far, all lanes together */
    uint64_t msg_bytes; /* receive: size of the matched message in bytes */
    uint32_t tag;
    int is_send;
    int state;                        /* internal: pending, done, failed, free */
    int lanes_left;                   /* lanes still moving bytes of this message */
    loomResult_t res;                 /* failure code once failed */
    uint8_t hdr[LOOM_WIRE_HDR_BYTES]; /* send: the frame header, written from here */
} loom_wire_req_t;

/* One byte channel of a stream. Lane 0 carries every frame header and the
 * payloads that are not striped; each lane carries its pieces of striped
 * payloads, message after message in frame order. */
typedef struct {
    void *chan;                         /* the transport's channel (io callbacks' chan) */
    loom_wire_req_t *sq_head, *sq_tail; /* sends with bytes left here, oldest first */
    size_t spos; /* bytes of sq_head's share written here (lane 0: header first) */
    loom_wire_req_t *rq_head, *rq_tail; /* matched receives with bytes left here */
    size_t rpos;                        /* payload bytes of rq_head's share read here */
} loom_wire_lane_t;

struct loom_wire {
    const loom_wire_io_t *io;
    const char *tp_name; /* for messages: "tcp", "shm" */
    int rank;            /* this rank */
    int peer;            /* rank on the other end */
    loomResult_t broken; /* != Success: the stream is dead, new requests fail with it */

    int nlanes;         /* 1 unless loom_wire_set_lanes */
    size_t piece_bytes; /* payloads longer than this are striped in pieces of this size */
    loom_wire_lane_t lanes[LOOM_WIRE_MAX_LANES];

    loom_wire_req_t *posted_head, *posted_tail; /* unmatched receives, in posting order */
    uint8_t rhdr[LOOM_WIRE_HDR_BYTES];          /* incoming header (lane 0) */
    size_t rhdr_have;                           /* bytes of rhdr read */
    int parked;                                 /* rhdr complete, no receive matched yet */
    uint32_t park_tag;
    uint64_t park_bytes;

    uint8_t *ra;   /* read-ahead of lane 0 (NULL: none): bytes read past a header */
    size_t ra_cap; /* its size in bytes */
    size_t ra_off; /* bytes of it consumed */
    size_t ra_len; /* bytes of it filled */

    const loom_tp_stamp_ops_t *stamp; /* call stamps (transport.h), NULL: none */
    int park_check;                   /* the parked frame's stamp is still to be checked */

    loom_wire_req_t *free_list;
    loom_wire_req_t *all;
    int n_pending;             /* requests queued, posted or in progress */
    volatile const int *quiet; /* non-zero (or NULL): a lost peer is INFO, not WARN */
};

/* quiet: the init args' quiet_flag (may be NULL: always WARN). chan is lane 0's. */
void loom_wire_init(loom_wire_t *s, const loom_wire_io_t *io, void *chan, const char *tp_name,
                    int rank, int peer, volatile const int *quiet);
/* Runs the stream over nlanes channels (chans[0] replaces init's chan):
 * payloads longer than piece_bytes go out in pieces of piece_bytes, piece i
 * on lane i mod nlanes. Both ends must use the same nlanes and piece_bytes.
 * Call before the first request. InvalidArgument if nlanes is outside
 * [1, LOOM_WIRE_MAX_LANES] or piece_bytes is 0 with nlanes > 1. */
loomResult_t loom_wire_set_lanes(loom_wire_t *s, int nlanes, void *const *chans,
                                 size_t piece_bytes);
/* Lets lane 0 read up to `bytes` past a frame header into a buffer of the
 * stream, so that a small message arrives with one readv. SystemError when
 * out of memory. */
loomResult_t loom_wire_set_readahead(loom_wire_t *s, size_t bytes);
/* Stamps the stream's collective frames and checks the stamps of the
 * frames that arrive (the contract in transport.h); call before the first
 * request. ops may be NULL (nothing stamped or checked). */
void loom_wire_set_stamp(loom_wire_t *s, const loom_tp_stamp_ops_t *ops);
/* Frees every request, pending or not; the stream's requests are invalid after. */
void loom_wire_fini(loom_wire_t *s);

/* Queue a send / post a receive. Never block, never move data. Errors: the
 * stream's failure (RemoteError) once broken, SystemError when out of memory. */
loomResult_t loom_wire_isend(loom_wire_t *s, const void *buf, size_t len, uint32_t tag,
                             loom_wire_req_t **req_p);
loomResult_t loom_wire_irecv(loom_wire_t *s, void *buf, size_t len, uint32_t tag,
                             loom_wire_req_t **req_p);
/* Progresses req's stream; *done_p = 1 when complete (then *nbytes_p is set
 * and req is recycled). A failed request returns its error and is recycled. */
loomResult_t loom_wire_test(loom_wire_req_t *req, int *done_p, size_t *nbytes_p);
/* Moves whatever the channels allow now. Returns the stream's failure, if any. */
loomResult_t loom_wire_progress(loom_wire_t *s);
/* Moves queued sends only (what isend may do at once to save the caller a
 * round through test). Returns the stream's failure, if any. */
loomResult_t loom_wire_push(loom_wire_t *s);

/* What the stream waits for, for the transports' wait(): sends queued, or
 * bytes wanted (a receive to fill, or a header to read for posted receives),
 * on any lane or on lane `lane`. */
int loom_wire_wants_write(const loom_wire_t *s);
int loom_wire_wants_read(const loom_wire_t *s);
int loom_wire_lane_wants_write(const loom_wire_t *s, int lane);
int loom_wire_lane_wants_read(const loom_wire_t *s, int lane);
/* 1 if bytes the stream wants are already in its read-ahead: a wait must not block. */
int loom_wire_buffered(const loom_wire_t *s);

#endif

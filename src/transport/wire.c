/* SPDX-License-Identifier: Apache-2.0
 *
 * wire.c - tagged message framing over an ordered byte stream, shared by
 * the tcp transport (one or more sockets per direction) and the shm transport
 * (a ring per direction). Sends leave in queue order, receives match by tag;
 * over several lanes, large payloads are striped in fixed-size pieces.
 * It does no I/O of its own (the transport's readv/writev callbacks do) and
 * never blocks or sleeps; waiting is the transport's wait(). Callers:
 * tcp/tcp.c and shm/shm.c, one stream per connection.
 */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "debug.h"

/* Protocol.
 * Frame on the wire: header {u32 magic, u32 tag, u64 payload bytes, 20-byte
 * call stamp} (little-endian), then the payload; 36 + len bytes per message,
 * nothing else. The stamp (transport.h) is the layer above's description of
 * the call a collective frame belongs to; other frames carry zeros there.
 *
 * Send side: requests queue in FIFO order. Each writev carries the unwritten
 * rest of the head request plus following requests (header + payload iovecs,
 * up to SEND_IOV entries), so small messages batch into one syscall and large
 * payloads go out straight from the caller's buffer (no copy in the engine).
 * The caller's buffer is read until the request completes.
 *
 * Receive side: when a header is complete the first posted receive with the
 * same tag takes the frame (equal tags match in posting order). If none is
 * posted the frame is parked: nothing more is read from the stream until such
 * a receive is posted, so a frame is never buffered inside the engine. The
 * payload is read straight into the receive's buffer; the same readv also
 * asks for the next header, which saves a syscall per small message. A frame
 * longer than the matched receive fails that receive with InvalidUsage and
 * breaks the stream (its payload cannot be skipped without a buffer).
 * Stamps: a collective frame's stamp is checked as soon as its header is
 * complete, before it may match a receive (a stamp of a later call than the
 * receiver's stays parked and is checked again at each progress and post);
 * a probe (tag LOOM_TP_TAG_PROBE, no payload) is handed to the check and
 * consumed at once, so it never parks. A failed check breaks the stream with
 * InvalidUsage.
 * Read-ahead (opt-in, the tcp transport's): a readv that ends with the next
 * header also asks for up to ra_cap more bytes into a buffer of the stream;
 * they are consumed (copied) before the channel is read again. A small
 * message then costs one readv instead of two, and a run of small ones one
 * readv for several; a large payload gets at most ra_cap bytes copied once
 * more. Only this bounded buffer ever holds frame bytes inside the engine.
 *
 * Lanes (striping). A stream may run over L byte channels. Lane 0 carries
 * every header. A payload of N <= P bytes (P = piece_bytes), or any payload
 * when L = 1, follows its header on lane 0 as above. A longer one is cut into
 * ceil(N / P) pieces of P bytes (the last one shorter); piece i travels on
 * lane i mod L, so lane 0 carries piece 0 right after the header. No piece
 * has a header of its own: both ends compute the layout from N, P and L,
 * which the transport agreed on at connection time. Each lane carries its
 * pieces message after message in frame order, so a lane's bytes always
 * belong to the oldest matched receive that still has bytes on it: each lane
 * keeps a FIFO of such receives (and the send side a FIFO of sends), and a
 * request completes when its last lane is through with it. A lane's unread
 * bytes of a frame that is not matched yet stay in its channel (in the
 * kernel for tcp), which is the same back-pressure as a parked frame.
 * Bytes on the wire: 36 + N per message whatever L is; a message costs one
 * writev and one readv per lane it touches (small ones: lane 0 only).
 *
 * Failure: a dead peer on any lane, a bad magic or a too-long frame breaks
 * the stream: every pending request fails, later ones fail at once. One WARN
 * names it. */

#define SEND_IOV 64
#define RECV_IOV 64

enum { REQ_FREE, REQ_PENDING, REQ_DONE, REQ_FAILED };

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void loom_tp_frame_header_encode(uint32_t tag, uint64_t nbytes, uint8_t out[LOOM_WIRE_HDR_BYTES])
{
    put_le32(out, LOOM_WIRE_MAGIC);
    put_le32(out + 4, tag);
    put_le64(out + 8, nbytes);
    memset(out + LOOM_WIRE_STAMP_OFF, 0, LOOM_TP_STAMP_BYTES);
}

int loom_tp_frame_header_decode(const void *buf, size_t len, loom_tp_frame_header_t *h_p)
{
    const uint8_t *p = buf;
    if (len != LOOM_WIRE_HDR_BYTES)
        return -1;
    if (get_le32(p) != LOOM_WIRE_MAGIC)
        return -2;
    h_p->tag = get_le32(p + 4);
    h_p->nbytes = get_le64(p + 8);
    return 0;
}

void loom_wire_init(loom_wire_t *s, const loom_wire_io_t *io, void *chan, const char *tp_name,
                    int rank, int peer, volatile const int *quiet)
{
    memset(s, 0, sizeof(*s));
    s->io = io;
    s->tp_name = tp_name;
    s->rank = rank;
    s->peer = peer;
    s->broken = loomSuccess;
    s->quiet = quiet;
    s->nlanes = 1;
    s->lanes[0].chan = chan;
}

loomResult_t loom_wire_set_lanes(loom_wire_t *s, int nlanes, void *const *chans, size_t piece_bytes)
{
    if (nlanes < 1 || nlanes > LOOM_WIRE_MAX_LANES || (nlanes > 1 && piece_bytes == 0)) {
        LOOM_WARN("%s: rank %d: %d lanes with %zu-byte pieces to rank %d (1 to %d lanes, pieces "
                  "of at least 1 byte)",
                  s->tp_name, s->rank, nlanes, piece_bytes, s->peer, LOOM_WIRE_MAX_LANES);
        return loomInvalidArgument;
    }
    s->nlanes = nlanes;
    s->piece_bytes = piece_bytes;
    for (int l = 0; l < nlanes; l++)
        s->lanes[l].chan = chans[l];
    return loomSuccess;
}

void loom_wire_set_stamp(loom_wire_t *s, const loom_tp_stamp_ops_t *ops)
{
    s->stamp = ops;
}

loomResult_t loom_wire_set_readahead(loom_wire_t *s, size_t bytes)
{
    uint8_t *ra = malloc(bytes);
    if (ra == NULL) {
        LOOM_WARN("%s: out of memory for a %zu-byte read-ahead from rank %d", s->tp_name, bytes,
                  s->peer);
        return loomSystemError;
    }
    free(s->ra);
    s->ra = ra;
    s->ra_cap = bytes;
    s->ra_off = s->ra_len = 0;
    return loomSuccess;
}

void loom_wire_fini(loom_wire_t *s)
{
    free(s->ra);
    loom_wire_req_t *r = s->all;
    while (r != NULL) {
        loom_wire_req_t *next = r->all_next;
        free(r);
        r = next;
    }
    memset(s, 0, sizeof(*s));
}

// ---- striping layout ----------------------------------------------------------

static int striped(const loom_wire_t *s, uint64_t n)
{
    return s->nlanes > 1 && n > s->piece_bytes;
}

/* Payload bytes of an n-byte message that travel on lane l. */
static uint64_t lane_payload(const loom_wire_t *s, uint64_t n, int l)
{
    if (!striped(s, n))
        return l == 0 ? n : 0;
    const uint64_t p = s->piece_bytes, nl = (uint64_t)s->nlanes, lane = (uint64_t)l;
    const uint64_t pieces = (n + p - 1) / p;
    if (lane >= pieces)
        return 0;
    uint64_t bytes = ((pieces - 1 - lane) / nl + 1) * p;
    if ((pieces - 1) % nl == lane)
        bytes -= pieces * p - n; /* this lane has the short last piece */
    return bytes;
}

/* Where byte `off` of lane l's share of an n-byte message lies in the
 * message (*msg_off_p), and how many bytes from there are contiguous on the
 * lane (*run_p: to the end of the piece). */
static void lane_run(const loom_wire_t *s, uint64_t n, int l, uint64_t off, uint64_t *msg_off_p,
                     uint64_t *run_p)
{
    if (!striped(s, n)) {
        *msg_off_p = off;
        *run_p = n - off;
        return;
    }
    const uint64_t p = s->piece_bytes;
    const uint64_t piece = (uint64_t)l + (off / p) * (uint64_t)s->nlanes;
    const uint64_t start = piece * p + off % p;
    const uint64_t end = piece * p + p < n ? piece * p + p : n;
    *msg_off_p = start;
    *run_p = end - start;
}

/* Bytes of request r on lane l: its payload share, plus the header on lane 0 for sends. */
static uint64_t lane_total(const loom_wire_t *s, const loom_wire_req_t *r, int l)
{
    if (r->is_send)
        return (l == 0 ? LOOM_WIRE_HDR_BYTES : 0) + lane_payload(s, r->len, l);
    return lane_payload(s, r->msg_bytes, l);
}

// ---- requests -------------------------------------------------------------------

static loomResult_t req_get(loom_wire_t *s, loom_wire_req_t **req_p)
{
    loom_wire_req_t *r = s->free_list;
    if (r != NULL) {
        s->free_list = r->next;
    } else {
        r = calloc(1, sizeof(*r));
        if (r == NULL) {
            LOOM_WARN("%s: out of memory for a request to rank %d (%zu bytes)", s->tp_name, s->peer,
                      sizeof(*r));
            return loomSystemError;
        }
        r->all_next = s->all;
        s->all = r;
        r->s = s;
    }
    r->next = NULL;
    r->done = 0;
    r->msg_bytes = 0;
    r->lanes_left = 0;
    r->state = REQ_PENDING;
    r->res = loomSuccess;
    s->n_pending++;
    *req_p = r;
    return loomSuccess;
}

static void req_put(loom_wire_req_t *r)
{
    loom_wire_t *s = r->s;
    r->state = REQ_FREE;
    r->buf = NULL;
    r->next = s->free_list;
    s->free_list = r;
}

static void req_finish(loom_wire_req_t *r, int state, loomResult_t res)
{
    r->state = state;
    r->res = res;
    r->next = NULL;
    r->s->n_pending--;
}

/* Appends r to lane l's send (is_send) or receive queue and counts the lane. */
static void lane_enqueue(loom_wire_t *s, loom_wire_req_t *r, int l)
{
    loom_wire_lane_t *ln = &s->lanes[l];
    loom_wire_req_t **head = r->is_send ? &ln->sq_head : &ln->rq_head;
    loom_wire_req_t **tail = r->is_send ? &ln->sq_tail : &ln->rq_tail;
    r->lane_next[l] = NULL;
    if (*tail != NULL)
        (*tail)->lane_next[l] = r;
    else
        *head = r;
    *tail = r;
    r->lanes_left++;
}

/* Lane l is through with the head of its queue: pops it; the last lane completes it. */
static void lane_pop(loom_wire_t *s, int l, int sending)
{
    loom_wire_lane_t *ln = &s->lanes[l];
    loom_wire_req_t **head = sending ? &ln->sq_head : &ln->rq_head;
    loom_wire_req_t **tail = sending ? &ln->sq_tail : &ln->rq_tail;
    loom_wire_req_t *r = *head;
    *head = r->lane_next[l];
    if (*head == NULL)
        *tail = NULL;
    if (sending)
        ln->spos = 0;
    else
        ln->rpos = 0;
    if (--r->lanes_left == 0)
        req_finish(r, REQ_DONE, loomSuccess);
}

/* Fails every pending request; after this the stream only reports res. */
static void wire_break(loom_wire_t *s, loomResult_t res)
{
    if (s->broken == loomSuccess)
        s->broken = res;
    for (loom_wire_req_t *r = s->all; r != NULL; r = r->all_next)
        if (r->state == REQ_PENDING)
            req_finish(r, REQ_FAILED, s->broken);
    for (int l = 0; l < s->nlanes; l++) {
        loom_wire_lane_t *ln = &s->lanes[l];
        ln->sq_head = ln->sq_tail = ln->rq_head = ln->rq_tail = NULL;
        ln->spos = ln->rpos = 0;
    }
    s->posted_head = s->posted_tail = NULL;
}

/* Names the lost peer once. While the layer above tears down (its quiet flag
 * set) peers leaving is expected: INFO then, so that a clean destroy or a
 * failure already reported does not add alarming lines. */
static void warn_gone(loom_wire_t *s, int lane, int sending, int gone_errno)
{
    char what[200], where[48] = "";
    const loom_wire_lane_t *ln = &s->lanes[lane];
    if (s->nlanes > 1)
        snprintf(where, sizeof(where), "lane %d of %d, ", lane, s->nlanes);
    if (sending) {
        const loom_wire_req_t *h = ln->sq_head;
        snprintf(what, sizeof(what), "%s%d sends pending, %zu of %zu bytes of the oldest written",
                 where, s->n_pending, h ? h->done : 0, h ? h->len : 0);
    } else {
        const loom_wire_req_t *h = ln->rq_head;
        snprintf(what, sizeof(what),
                 "%s%d receives pending, %zu of %llu bytes of the current message read", where,
                 s->n_pending, h ? h->done : 0, h ? (unsigned long long)h->msg_bytes : 0ull);
    }
    const char *dir = sending ? "to" : "from";
    const char *why = gone_errno ? strerror(gone_errno) : "closed by the peer";
    if (s->quiet != NULL && __atomic_load_n(s->quiet, __ATOMIC_ACQUIRE))
        LOOM_INFO(LOOM_LOG_TRANSPORT,
                  "%s: rank %d lost its connection %s rank %d while closing: %s (%s)", s->tp_name,
                  s->rank, dir, s->peer, why, what);
    else
        LOOM_WARN("%s: rank %d lost its connection %s rank %d: %s (%s)", s->tp_name, s->rank, dir,
                  s->peer, why, what);
}

loomResult_t loom_wire_isend(loom_wire_t *s, const void *buf, size_t len, uint32_t tag,
                             loom_wire_req_t **req_p)
{
    if (s->broken != loomSuccess)
        return s->broken;
    loom_wire_req_t *r;
    LOOM_CHECK(req_get(s, &r));
    r->is_send = 1;
    r->buf = (char *)buf;
    r->len = len;
    r->tag = tag;
    loom_tp_frame_header_encode(tag, (uint64_t)len, r->hdr);
    if (s->stamp != NULL && ((tag & LOOM_TP_TAG_COLL) != 0 || tag == LOOM_TP_TAG_PROBE))
        memcpy(r->hdr + LOOM_WIRE_STAMP_OFF, s->stamp->stamp, LOOM_TP_STAMP_BYTES);
    for (int l = 0; l < s->nlanes; l++)
        if (lane_total(s, r, l) > 0)
            lane_enqueue(s, r, l);
    *req_p = r;
    return loomSuccess;
}

/* The parked frame's stamp against this rank's call: 1 if the frame may be
 * matched, 0 if it must stay parked (a later call's, or the stream broke). */
static int parked_checked(loom_wire_t *s)
{
    if (!s->park_check)
        return 1;
    loomResult_t res =
        s->stamp->check(s->stamp->arg, s->peer, s->park_tag, s->rhdr + LOOM_WIRE_STAMP_OFF);
    if (res == loomInProgress)
        return 0;
    if (res != loomSuccess) {
        wire_break(s, loomInvalidUsage); /* the frame's payload cannot be skipped */
        return 0;
    }
    s->park_check = 0;
    return 1;
}

/* Gives a parked frame to the first posted receive of its tag, if any; the
 * lanes that carry its payload queue it. */
static void match_parked(loom_wire_t *s)
{
    if (!parked_checked(s))
        return;
    loom_wire_req_t *prev = NULL, *r = s->posted_head;
    while (r != NULL && r->tag != s->park_tag) {
        prev = r;
        r = r->next;
    }
    if (r == NULL)
        return;
    if (prev != NULL)
        prev->next = r->next;
    else
        s->posted_head = r->next;
    if (s->posted_tail == r)
        s->posted_tail = prev;
    r->next = NULL;
    s->parked = 0;
    s->rhdr_have = 0;
    r->msg_bytes = s->park_bytes;
    if (s->park_bytes > r->len) {
        loomResult_t res = loomInvalidUsage;
        if (s->stamp != NULL)
            res = s->stamp->oversize(s->stamp->arg, s->peer, s->park_tag, s->park_bytes, r->len);
        else
            LOOM_WARN("%s: rank %d received an oversized frame from rank %d: a %llu-byte "
                      "message with tag 0x%x for a %zu-byte receive",
                      s->tp_name, s->rank, s->peer, (unsigned long long)s->park_bytes, s->park_tag,
                      r->len);
        req_finish(r, REQ_FAILED, res);
        /* The payload is still in the stream and nothing can take it: the stream
         * fails with the same error, never as a peer that left. */
        wire_break(s, res);
        return;
    }
    if (s->park_bytes == 0) {
        req_finish(r, REQ_DONE, loomSuccess);
        return;
    }
    for (int l = 0; l < s->nlanes; l++)
        if (lane_payload(s, r->msg_bytes, l) > 0)
            lane_enqueue(s, r, l);
}

loomResult_t loom_wire_irecv(loom_wire_t *s, void *buf, size_t len, uint32_t tag,
                             loom_wire_req_t **req_p)
{
    if (s->broken != loomSuccess)
        return s->broken;
    loom_wire_req_t *r;
    LOOM_CHECK(req_get(s, &r));
    r->is_send = 0;
    r->buf = buf;
    r->len = len;
    r->tag = tag;
    if (s->posted_tail != NULL)
        s->posted_tail->next = r;
    else
        s->posted_head = r;
    s->posted_tail = r;
    if (s->parked)
        match_parked(s);
    *req_p = r;
    return loomSuccess;
}

// ---- moving bytes ---------------------------------------------------------------

/* Adds the iovecs of lane l's share of r from byte pos (of the lane's total,
 * header first on a send's lane 0) until the share ends or iov is full.
 * Returns the position reached. */
static uint64_t lane_iov(const loom_wire_t *s, loom_wire_req_t *r, int l, uint64_t pos,
                         struct iovec *iov, int max_iov, int *n_iov_p, size_t *total_p)
{
    const uint64_t hdr = r->is_send && l == 0 ? LOOM_WIRE_HDR_BYTES : 0;
    const uint64_t n = r->is_send ? r->len : r->msg_bytes;
    const uint64_t end = hdr + lane_payload(s, n, l);
    if (pos < hdr && *n_iov_p < max_iov) {
        iov[*n_iov_p].iov_base = r->hdr + pos;
        iov[*n_iov_p].iov_len = (size_t)(hdr - pos);
        *total_p += iov[(*n_iov_p)++].iov_len;
        pos = hdr;
    }
    while (pos < end && *n_iov_p < max_iov) {
        uint64_t msg_off, run;
        lane_run(s, n, l, pos - hdr, &msg_off, &run);
        iov[*n_iov_p].iov_base = r->buf + msg_off;
        iov[*n_iov_p].iov_len = (size_t)run;
        *total_p += iov[(*n_iov_p)++].iov_len;
        pos += run;
    }
    return pos;
}

static loomResult_t send_lane(loom_wire_t *s, int l)
{
    loom_wire_lane_t *ln = &s->lanes[l];
    while (ln->sq_head != NULL) {
        struct iovec iov[SEND_IOV];
        int n_iov = 0;
        size_t total = 0;
        uint64_t pos = ln->spos;
        for (loom_wire_req_t *r = ln->sq_head; r != NULL && n_iov < SEND_IOV;
             r = r->lane_next[l], pos = 0)
            if (lane_iov(s, r, l, pos, iov, SEND_IOV, &n_iov, &total) < lane_total(s, r, l))
                break;
        size_t n = 0;
        int gone = -1;
        loomResult_t res = s->io->writev(ln->chan, iov, n_iov, &n, &gone);
        if (res == loomRemoteError && gone >= 0)
            warn_gone(s, l, 1, gone);
        if (res != loomSuccess) {
            wire_break(s, res);
            return res;
        }
        size_t moved = n;
        while (moved > 0) {
            loom_wire_req_t *r = ln->sq_head;
            const uint64_t hdr = l == 0 ? LOOM_WIRE_HDR_BYTES : 0;
            const uint64_t left = lane_total(s, r, l) - ln->spos;
            const uint64_t take = moved < left ? moved : left;
            const uint64_t before = ln->spos > hdr ? ln->spos : hdr;
            ln->spos += take;
            if (ln->spos > before)
                r->done += (size_t)(ln->spos - before);
            moved -= (size_t)take;
            if (take == left)
                lane_pop(s, l, 1);
        }
        if (n < total)
            break;
    }
    return loomSuccess;
}

/* Parses a complete header: parks the frame, then tries to match it. */
static loomResult_t take_header(loom_wire_t *s)
{
    loom_tp_frame_header_t h;
    if (loom_tp_frame_header_decode(s->rhdr, sizeof(s->rhdr), &h) != 0) {
        LOOM_WARN("%s: protocol error on the connection from rank %d to rank %d: frame magic "
                  "0x%08x, expected 0x%08x",
                  s->tp_name, s->peer, s->rank, get_le32(s->rhdr), LOOM_WIRE_MAGIC);
        wire_break(s, loomRemoteError);
        return loomRemoteError;
    }
    if (s->stamp != NULL && h.tag == LOOM_TP_TAG_PROBE && h.nbytes == 0) {
        s->rhdr_have = 0; /* consumed here: a probe never parks */
        if (s->stamp->check(s->stamp->arg, s->peer, h.tag, s->rhdr + LOOM_WIRE_STAMP_OFF) ==
            loomInvalidUsage)
            wire_break(s, loomInvalidUsage);
        return s->broken;
    }
    s->park_tag = h.tag;
    s->park_bytes = h.nbytes;
    s->parked = 1;
    s->park_check = s->stamp != NULL && (h.tag & LOOM_TP_TAG_COLL) != 0;
    match_parked(s);
    return s->broken;
}

/* Copies the read-ahead's unconsumed bytes into iov, in order; returns how many. */
static size_t ra_copy(loom_wire_t *s, const struct iovec *iov, int n_iov)
{
    size_t n = 0;
    for (int i = 0; i < n_iov && s->ra_off < s->ra_len; i++) {
        const size_t have = s->ra_len - s->ra_off;
        const size_t take = iov[i].iov_len < have ? iov[i].iov_len : have;
        memcpy(iov[i].iov_base, s->ra + s->ra_off, take);
        s->ra_off += take;
        n += take;
    }
    return n;
}

/* Reads what lane l can take now: the shares of its matched receives, and on
 * lane 0 the next header (in the same readv as the payload before it, which
 * saves a syscall per small message), then what follows it into the
 * read-ahead, if the stream has one. Bytes already in the read-ahead are
 * consumed first. A readv that returns less than it asked for, with no
 * payload left to read on the lane, drained the channel: no second one
 * follows in this call (it would only find nothing). With a payload still
 * arriving the loop reads on until the channel is empty: returning would
 * send the caller to sleep once per readv. */
static loomResult_t recv_lane(loom_wire_t *s, int l)
{
    loom_wire_lane_t *ln = &s->lanes[l];
    int drained = 0;
    for (;;) {
        if (s->broken != loomSuccess)
            return s->broken;
        struct iovec iov[RECV_IOV];
        int n_iov = 0, with_hdr = 0;
        size_t total = 0;
        int all_queued = 1; /* the iovecs reach the end of the last queued share */
        uint64_t pos = ln->rpos;
        for (loom_wire_req_t *r = ln->rq_head; r != NULL; r = r->lane_next[l], pos = 0) {
            if (n_iov == RECV_IOV - 2 ||
                lane_iov(s, r, l, pos, iov, RECV_IOV - 2, &n_iov, &total) < lane_total(s, r, l)) {
                all_queued = 0;
                break;
            }
        }
        if (l == 0 && all_queued && !s->parked &&
            (n_iov > 0 || s->posted_head != NULL || s->rhdr_have > 0)) {
            iov[n_iov].iov_base = s->rhdr + s->rhdr_have;
            iov[n_iov].iov_len = LOOM_WIRE_HDR_BYTES - s->rhdr_have;
            total += iov[n_iov++].iov_len;
            with_hdr = 1;
        }
        if (n_iov == 0)
            return loomSuccess;
        size_t n = 0;
        int short_read = -1; /* -1: the bytes came from the read-ahead */
        if (l == 0 && s->ra_off < s->ra_len) {
            n = ra_copy(s, iov, n_iov);
        } else {
            if (drained)
                return loomSuccess;
            size_t asked = total;
            if (with_hdr && s->ra != NULL) {
                iov[n_iov].iov_base = s->ra;
                iov[n_iov++].iov_len = s->ra_cap;
                asked += s->ra_cap;
            }
            int gone = -1;
            loomResult_t res = s->io->readv(ln->chan, iov, n_iov, &n, &gone);
            if (res == loomRemoteError && gone >= 0)
                warn_gone(s, l, 0, gone);
            if (res != loomSuccess) {
                wire_break(s, res);
                return res;
            }
            if (n == 0)
                return loomSuccess;
            short_read = n < asked;
            if (n > total) { /* the rest went to the read-ahead */
                s->ra_off = 0;
                s->ra_len = n - total;
                n = total;
            }
        }
        size_t moved = n;
        while (moved > 0 && ln->rq_head != NULL) {
            loom_wire_req_t *r = ln->rq_head;
            const uint64_t left = lane_total(s, r, l) - ln->rpos;
            const uint64_t take = moved < left ? moved : left;
            ln->rpos += take;
            r->done += (size_t)take;
            moved -= (size_t)take;
            if (take == left)
                lane_pop(s, l, 0);
        }
        if (moved > 0) { /* lane 0 only: the header iovec took the rest */
            s->rhdr_have += moved;
            if (s->rhdr_have == LOOM_WIRE_HDR_BYTES)
                LOOM_CHECK(take_header(s));
        }
        /* While a payload streams in, its sender is likely writing more: read on. */
        if (short_read >= 0)
            drained = short_read && ln->rq_head == NULL;
    }
}

loomResult_t loom_wire_push(loom_wire_t *s)
{
    if (s->broken != loomSuccess)
        return s->broken;
    for (int l = 0; l < s->nlanes; l++)
        LOOM_CHECK(send_lane(s, l));
    return loomSuccess;
}

loomResult_t loom_wire_progress(loom_wire_t *s)
{
    LOOM_CHECK(loom_wire_push(s));
    if (s->parked && s->park_check)
        match_parked(s); /* a later call's frame: this rank may be in that call now */
    /* Lane 0 first: the headers it reads give the other lanes their work. */
    for (int l = 0; l < s->nlanes; l++)
        LOOM_CHECK(recv_lane(s, l));
    return loomSuccess;
}

loomResult_t loom_wire_test(loom_wire_req_t *req, int *done_p, size_t *nbytes_p)
{
    if (req->state == REQ_PENDING)
        (void)loom_wire_progress(req->s); /* a failure lands in the requests' states */
    if (req->state == REQ_DONE) {
        *done_p = 1;
        *nbytes_p = req->is_send ? req->len : (size_t)req->msg_bytes;
        req_put(req);
        return loomSuccess;
    }
    if (req->state == REQ_FAILED) {
        loomResult_t res = req->res;
        req_put(req);
        return res;
    }
    *done_p = 0;
    return loomSuccess;
}

int loom_wire_lane_wants_write(const loom_wire_t *s, int lane)
{
    return s->broken == loomSuccess && s->lanes[lane].sq_head != NULL;
}

int loom_wire_lane_wants_read(const loom_wire_t *s, int lane)
{
    if (s->broken != loomSuccess)
        return 0;
    if (s->lanes[lane].rq_head != NULL)
        return 1;
    return lane == 0 && !s->parked && (s->posted_head != NULL || s->rhdr_have > 0);
}

int loom_wire_buffered(const loom_wire_t *s)
{
    return s->ra_off < s->ra_len && loom_wire_lane_wants_read(s, 0);
}

int loom_wire_wants_write(const loom_wire_t *s)
{
    for (int l = 0; l < s->nlanes; l++)
        if (loom_wire_lane_wants_write(s, l))
            return 1;
    return 0;
}

int loom_wire_wants_read(const loom_wire_t *s)
{
    for (int l = 0; l < s->nlanes; l++)
        if (loom_wire_lane_wants_read(s, l))
            return 1;
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * stream.c - tagged message framing over an ordered byte stream, shared by
 * the tcp transport (a socket per direction) and the shm transport (a ring
 * per direction). Sends leave in queue order, receives match by tag.
 * It does no I/O of its own (the transport's readv/writev callbacks do) and
 * never blocks or sleeps; waiting is the transport's wait(). Callers:
 * tcp/tcp.c and shm/shm.c, one stream per connection.
 */
#include "stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "debug.h"

/* Protocol.
 * Frame on the wire: header {u32 magic, u32 tag, u64 payload bytes}
 * (little-endian), then the payload; 16 + len bytes per message, nothing else.
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
 *
 * Failure: a dead peer, a bad magic or a too-long frame breaks the stream:
 * every pending request fails, later ones fail at once. One WARN names it. */

#define SEND_IOV 64

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

void loom_tp_frame_header_encode(uint32_t tag, uint64_t nbytes,
                                 uint8_t out[LOOM_TP_STREAM_HDR_BYTES])
{
    put_le32(out, LOOM_TP_STREAM_MAGIC);
    put_le32(out + 4, tag);
    put_le64(out + 8, nbytes);
}

int loom_tp_frame_header_decode(const void *buf, size_t len, loom_tp_frame_header_t *h_p)
{
    const uint8_t *p = buf;
    if (len != LOOM_TP_STREAM_HDR_BYTES)
        return -1;
    if (get_le32(p) != LOOM_TP_STREAM_MAGIC)
        return -2;
    h_p->tag = get_le32(p + 4);
    h_p->nbytes = get_le64(p + 8);
    return 0;
}

void loom_tp_stream_init(loom_tp_stream_t *s, const loom_tp_stream_io_t *io, void *chan,
                         const char *tp_name, int rank, int peer, volatile const int *quiet)
{
    memset(s, 0, sizeof(*s));
    s->io = io;
    s->chan = chan;
    s->tp_name = tp_name;
    s->rank = rank;
    s->peer = peer;
    s->broken = loomSuccess;
    s->quiet = quiet;
}

void loom_tp_stream_fini(loom_tp_stream_t *s)
{
    loom_tp_stream_req_t *r = s->all;
    while (r != NULL) {
        loom_tp_stream_req_t *next = r->all_next;
        free(r);
        r = next;
    }
    memset(s, 0, sizeof(*s));
}

static loomResult_t req_get(loom_tp_stream_t *s, loom_tp_stream_req_t **req_p)
{
    loom_tp_stream_req_t *r = s->free_list;
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
    r->state = REQ_PENDING;
    r->res = loomSuccess;
    s->n_pending++;
    *req_p = r;
    return loomSuccess;
}

static void req_put(loom_tp_stream_req_t *r)
{
    loom_tp_stream_t *s = r->s;
    r->state = REQ_FREE;
    r->buf = NULL;
    r->next = s->free_list;
    s->free_list = r;
}

static void req_finish(loom_tp_stream_req_t *r, int state, loomResult_t res)
{
    r->state = state;
    r->res = res;
    r->next = NULL;
    r->s->n_pending--;
}

/* Fails every pending request; after this the stream only reports res. */
static void stream_break(loom_tp_stream_t *s, loomResult_t res)
{
    if (s->broken == loomSuccess)
        s->broken = res;
    loom_tp_stream_req_t *lists[2] = {s->sq_head, s->posted_head};
    for (int i = 0; i < 2; i++) {
        loom_tp_stream_req_t *r = lists[i];
        while (r != NULL) {
            loom_tp_stream_req_t *next = r->next;
            req_finish(r, REQ_FAILED, s->broken);
            r = next;
        }
    }
    if (s->cur != NULL)
        req_finish(s->cur, REQ_FAILED, s->broken);
    s->sq_head = s->sq_tail = NULL;
    s->posted_head = s->posted_tail = NULL;
    s->cur = NULL;
}

/* Names the lost peer once. While the layer above tears down (its quiet flag
 * set) peers leaving is expected: INFO then, so that a clean destroy or a
 * failure already reported does not add alarming lines. */
static void warn_gone(loom_tp_stream_t *s, int sending, int gone_errno)
{
    char what[160];
    if (sending) {
        const loom_tp_stream_req_t *h = s->sq_head;
        snprintf(what, sizeof(what), "%d sends pending, %zu of %zu bytes of the oldest written",
                 s->n_pending,
                 h ? (h->done > LOOM_TP_STREAM_HDR_BYTES ? h->done - LOOM_TP_STREAM_HDR_BYTES : 0)
                   : 0,
                 h ? h->len : 0);
    } else {
        snprintf(what, sizeof(what),
                 "%d receives pending, %zu of %llu bytes of the current message read", s->n_pending,
                 s->cur ? s->cur->done : 0, s->cur ? (unsigned long long)s->cur->msg_bytes : 0ull);
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

loomResult_t loom_tp_stream_isend(loom_tp_stream_t *s, const void *buf, size_t len, uint32_t tag,
                                  loom_tp_stream_req_t **req_p)
{
    if (s->broken != loomSuccess)
        return s->broken;
    loom_tp_stream_req_t *r;
    LOOM_CHECK(req_get(s, &r));
    r->is_send = 1;
    r->buf = (char *)buf;
    r->len = len;
    r->tag = tag;
    loom_tp_frame_header_encode(tag, (uint64_t)len, r->hdr);
    if (s->sq_tail != NULL)
        s->sq_tail->next = r;
    else
        s->sq_head = r;
    s->sq_tail = r;
    *req_p = r;
    return loomSuccess;
}

/* Gives a parked frame to the first posted receive of its tag, if any. */
static void match_parked(loom_tp_stream_t *s)
{
    loom_tp_stream_req_t *prev = NULL, *r = s->posted_head;
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
        LOOM_WARN("%s: rank %d received a %llu-byte message with tag 0x%x from rank %d into a "
                  "%zu-byte receive",
                  s->tp_name, s->rank, (unsigned long long)s->park_bytes, s->park_tag, s->peer,
                  r->len);
        req_finish(r, REQ_FAILED, loomInvalidUsage);
        /* The payload is still in the stream and nothing can take it. */
        stream_break(s, loomRemoteError);
        return;
    }
    if (s->park_bytes == 0)
        req_finish(r, REQ_DONE, loomSuccess);
    else
        s->cur = r;
}

loomResult_t loom_tp_stream_irecv(loom_tp_stream_t *s, void *buf, size_t len, uint32_t tag,
                                  loom_tp_stream_req_t **req_p)
{
    if (s->broken != loomSuccess)
        return s->broken;
    loom_tp_stream_req_t *r;
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

static loomResult_t progress_send(loom_tp_stream_t *s)
{
    while (s->sq_head != NULL) {
        struct iovec iov[SEND_IOV];
        int n_iov = 0;
        size_t total = 0;
        for (loom_tp_stream_req_t *r = s->sq_head; r != NULL && n_iov + 2 <= SEND_IOV;
             r = r->next) {
            if (r->done < LOOM_TP_STREAM_HDR_BYTES) {
                iov[n_iov].iov_base = r->hdr + r->done;
                iov[n_iov].iov_len = LOOM_TP_STREAM_HDR_BYTES - r->done;
                total += iov[n_iov++].iov_len;
            }
            size_t off =
                r->done > LOOM_TP_STREAM_HDR_BYTES ? r->done - LOOM_TP_STREAM_HDR_BYTES : 0;
            if (r->len > off) {
                iov[n_iov].iov_base = r->buf + off;
                iov[n_iov].iov_len = r->len - off;
                total += iov[n_iov++].iov_len;
            }
        }
        size_t n = 0;
        int gone = -1;
        loomResult_t res = s->io->writev(s->chan, iov, n_iov, &n, &gone);
        if (res == loomRemoteError && gone >= 0)
            warn_gone(s, 1, gone);
        if (res != loomSuccess) {
            stream_break(s, res);
            return res;
        }
        size_t moved = n;
        while (moved > 0 && s->sq_head != NULL) {
            loom_tp_stream_req_t *r = s->sq_head;
            size_t left = LOOM_TP_STREAM_HDR_BYTES + r->len - r->done;
            size_t take = moved < left ? moved : left;
            r->done += take;
            moved -= take;
            if (take == left) {
                s->sq_head = r->next;
                if (s->sq_head == NULL)
                    s->sq_tail = NULL;
                req_finish(r, REQ_DONE, loomSuccess);
            }
        }
        if (n < total)
            break;
    }
    return loomSuccess;
}

/* Parses a complete header: parks the frame, then tries to match it. */
static loomResult_t take_header(loom_tp_stream_t *s)
{
    loom_tp_frame_header_t h;
    if (loom_tp_frame_header_decode(s->rhdr, sizeof(s->rhdr), &h) != 0) {
        LOOM_WARN("%s: protocol error on the connection from rank %d to rank %d: frame magic "
                  "0x%08x, expected 0x%08x",
                  s->tp_name, s->peer, s->rank, get_le32(s->rhdr), LOOM_TP_STREAM_MAGIC);
        stream_break(s, loomRemoteError);
        return loomRemoteError;
    }
    s->park_tag = h.tag;
    s->park_bytes = h.nbytes;
    s->parked = 1;
    match_parked(s);
    return s->broken;
}

static loomResult_t progress_recv(loom_tp_stream_t *s)
{
    for (;;) {
        if (s->broken != loomSuccess)
            return s->broken;
        struct iovec iov[2];
        int n_iov = 0;
        size_t want_payload = 0;
        if (s->cur != NULL) {
            want_payload = (size_t)(s->cur->msg_bytes - s->cur->done);
            iov[n_iov].iov_base = s->cur->buf + s->cur->done;
            iov[n_iov++].iov_len = want_payload;
            iov[n_iov].iov_base = s->rhdr;
            iov[n_iov++].iov_len = LOOM_TP_STREAM_HDR_BYTES;
        } else if (s->parked) {
            return loomSuccess;
        } else if (s->posted_head != NULL || s->rhdr_have > 0) {
            iov[n_iov].iov_base = s->rhdr + s->rhdr_have;
            iov[n_iov++].iov_len = LOOM_TP_STREAM_HDR_BYTES - s->rhdr_have;
        } else {
            return loomSuccess;
        }
        size_t n = 0;
        int gone = -1;
        loomResult_t res = s->io->readv(s->chan, iov, n_iov, &n, &gone);
        if (res == loomRemoteError && gone >= 0)
            warn_gone(s, 0, gone);
        if (res != loomSuccess) {
            stream_break(s, res);
            return res;
        }
        if (n == 0)
            return loomSuccess;
        if (s->cur != NULL) {
            size_t take = n < want_payload ? n : want_payload;
            s->cur->done += take;
            s->rhdr_have = n - take;
            if (s->cur->done == s->cur->msg_bytes) {
                req_finish(s->cur, REQ_DONE, loomSuccess);
                s->cur = NULL;
            }
        } else {
            s->rhdr_have += n;
        }
        if (s->rhdr_have == LOOM_TP_STREAM_HDR_BYTES)
            LOOM_CHECK(take_header(s));
    }
}

loomResult_t loom_tp_stream_progress(loom_tp_stream_t *s)
{
    if (s->broken != loomSuccess)
        return s->broken;
    LOOM_CHECK(progress_send(s));
    return progress_recv(s);
}

loomResult_t loom_tp_stream_test(loom_tp_stream_req_t *req, int *done_p, size_t *nbytes_p)
{
    if (req->state == REQ_PENDING)
        (void)loom_tp_stream_progress(req->s); /* a failure lands in the requests' states */
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

int loom_tp_stream_wants_write(const loom_tp_stream_t *s)
{
    return s->broken == loomSuccess && s->sq_head != NULL;
}

int loom_tp_stream_wants_read(const loom_tp_stream_t *s)
{
    if (s->broken != loomSuccess)
        return 0;
    if (s->cur != NULL)
        return 1;
    return !s->parked && (s->posted_head != NULL || s->rhdr_have > 0);
}

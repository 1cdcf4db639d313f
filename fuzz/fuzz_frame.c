/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_frame.c - libFuzzer harness for the data-frame path shared by the tcp
 * and shm transports (src/transport/stream.c): the header decoder alone, and
 * the whole receive engine reading the input as the byte stream from a peer,
 * in chunks of input-chosen sizes, into receives of input-chosen tags and
 * exact-size heap buffers (so a payload written past a receive is an ASan
 * error). Every receive that completes must hold exactly the payload of the
 * frame it was matched to, found by the harness's own reading of the stream
 * (stream.h's format: u32 magic, u32 tag, u64 length, little-endian, then the
 * payload; receives of a tag take that tag's frames in the order they were
 * posted), and a decoded header encodes back to its bytes. It does not cover
 * the sockets or rings themselves. Built by fuzz/run.sh together with
 * wire.c, debug.c, log_line.c and param.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "wire.h"

#define NRECV      4
#define MAX_FRAMES 64

/* A frame of the input stream as the harness reads it; len SIZE_MAX: cut short by the end. */
typedef struct {
    uint32_t tag;
    size_t off, len;
} frame_t;

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The frames at the start of d (up to the first bad magic). */
static size_t walk(const uint8_t *d, size_t n, frame_t *f)
{
    size_t k = 0, at = 0;
    while (k < MAX_FRAMES && n - at >= LOOM_WIRE_HDR_BYTES && le(d + at, 4) == 0x4d4f4f4cu) {
        const uint64_t len = le(d + at + 8, 8);
        const size_t left = n - at - LOOM_WIRE_HDR_BYTES;
        f[k].tag = (uint32_t)le(d + at + 4, 4);
        f[k].off = at + LOOM_WIRE_HDR_BYTES;
        f[k].len = len <= left ? (size_t)len : SIZE_MAX;
        if (f[k++].len == SIZE_MAX)
            break;
        at += LOOM_WIRE_HDR_BYTES + (size_t)len;
    }
    return k;
}

/* The nth frame of tag t, or NULL. */
static const frame_t *nth_of_tag(const frame_t *f, size_t nf, uint32_t t, unsigned nth)
{
    for (size_t k = 0; k < nf; k++)
        if (f[k].tag == t && nth-- == 0)
            return &f[k];
    return NULL;
}

typedef struct {
    const uint8_t *data;
    size_t size;
    size_t off;
    uint8_t chunk; /* bytes per readv: 1 + chunk, from the input */
} chan_t;

static loomResult_t fz_writev(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                              int *gone_errno_p)
{
    (void)chan;
    (void)gone_errno_p;
    size_t n = 0;
    for (int i = 0; i < iovcnt; i++)
        n += iov[i].iov_len;
    *nbytes_p = n;
    return loomSuccess;
}

/* Moves at most 1 + chunk bytes; at the end of the input the peer has closed. */
static loomResult_t fz_readv(void *chan, const struct iovec *iov, int iovcnt, size_t *nbytes_p,
                             int *gone_errno_p)
{
    chan_t *c = chan;
    if (c->off == c->size) {
        *gone_errno_p = 0;
        return loomRemoteError;
    }
    size_t budget = (size_t)c->chunk + 1, moved = 0;
    for (int i = 0; i < iovcnt && budget > 0 && c->off < c->size; i++) {
        size_t n = iov[i].iov_len;
        if (n > budget)
            n = budget;
        if (n > c->size - c->off)
            n = c->size - c->off;
        memcpy(iov[i].iov_base, c->data + c->off, n);
        c->off += n;
        moved += n;
        budget -= n;
    }
    *nbytes_p = moved;
    return loomSuccess;
}

static const loom_wire_io_t fz_io = {.writev = fz_writev, .readv = fz_readv};

FUZZ_LOOM_LOG_OFF() /* the code under test WARNs every refusal */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 + 2 * NRECV)
        return 0;
    /* The decoder alone, on the first bytes. */
    loom_tp_frame_header_t h;
    size_t hlen = size < LOOM_WIRE_HDR_BYTES ? size : LOOM_WIRE_HDR_BYTES;
    if (loom_tp_frame_header_decode(data, hlen, &h) == 0) {
        uint8_t again[LOOM_WIRE_HDR_BYTES];
        loom_tp_frame_header_encode(h.tag, h.nbytes, again);
        /* The call stamp is the layer above's: carried as it came. */
        memcpy(again + LOOM_WIRE_STAMP_OFF, data + LOOM_WIRE_STAMP_OFF, LOOM_TP_STAMP_BYTES);
        REQUIRE(memcmp(again, data, LOOM_WIRE_HDR_BYTES) == 0);
    }

    /* The engine: receives of input-chosen tags (0..3) and sizes (0..255 bytes). */
    chan_t c = {.data = data + 2 + 2 * NRECV, .size = size - 2 - 2 * NRECV, .chunk = data[0]};
    frame_t frames[MAX_FRAMES];
    const size_t nframes = walk(c.data, c.size, frames);
    unsigned posted[4] = {0, 0, 0, 0}, nth[NRECV]; /* receives posted per tag; each one's rank */
    int failed = 0; /* once a receive fails the stream is broken: stop comparing */
    uint8_t reposts = data[1] % 16;
    loom_wire_t s;
    loom_wire_init(&s, &fz_io, &c, "fuzz", 0, 1, NULL);
    loom_wire_req_t *req[NRECV];
    uint8_t *buf[NRECV];
    size_t cap[NRECV];
    uint32_t tag[NRECV];
    int live = 0;
    for (int i = 0; i < NRECV; i++) {
        tag[i] = data[2 + 2 * i] % 4;
        cap[i] = data[3 + 2 * i];
        buf[i] = malloc(cap[i] ? cap[i] : 1);
        req[i] = NULL;
        if (buf[i] != NULL && loom_wire_irecv(&s, buf[i], cap[i], tag[i], &req[i]) == loomSuccess) {
            nth[i] = posted[tag[i]]++;
            live++;
        }
    }
    /* A send too, so the send path interleaves with the receive path. */
    loom_wire_req_t *sreq = NULL;
    (void)loom_wire_isend(&s, data, size, 7, &sreq);
    /* Until every receive is done or failed, or nothing moves any more (a frame
     * parked for a tag nobody posts waits forever, as it would in a real job). */
    while (live > 0) {
        size_t off0 = c.off;
        int progressed = 0;
        for (int i = 0; i < NRECV; i++) {
            if (req[i] == NULL)
                continue;
            int done = 0;
            size_t nbytes = 0;
            loomResult_t res = loom_wire_test(req[i], &done, &nbytes);
            if (res != loomSuccess || done) {
                failed |= res != loomSuccess;
                if (res == loomSuccess && !failed) {
                    const frame_t *f = nth_of_tag(frames, nframes, tag[i], nth[i]);
                    REQUIRE(nbytes <= cap[i]);
                    /* Past the frames read here (more than MAX_FRAMES) nothing is compared. */
                    REQUIRE(f != NULL || nframes == MAX_FRAMES);
                    if (f != NULL)
                        REQUIRE(f->len == nbytes && memcmp(buf[i], c.data + f->off, nbytes) == 0);
                }
                req[i] = NULL;
                live--;
                progressed = 1;
                if (res == loomSuccess && reposts > 0 &&
                    loom_wire_irecv(&s, buf[i], cap[i], tag[i], &req[i]) == loomSuccess) {
                    nth[i] = posted[tag[i]]++;
                    reposts--;
                    live++;
                }
            }
        }
        if (sreq != NULL) {
            int done = 0;
            size_t nbytes = 0;
            if (loom_wire_test(sreq, &done, &nbytes) != loomSuccess || done)
                sreq = NULL;
        }
        (void)loom_wire_progress(&s);
        if (!progressed && c.off == off0)
            break;
    }
    loom_wire_fini(&s);
    for (int i = 0; i < NRECV; i++)
        free(buf[i]);
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_frame.c - libFuzzer harness for the data-frame path shared by the tcp
 * and shm transports (src/transport/stream.c): the header decoder alone, and
 * the whole receive engine reading the input as the byte stream from a peer,
 * in chunks of input-chosen sizes, into receives of input-chosen tags and
 * exact-size heap buffers (so a payload written past a receive is an ASan
 * error). It does not cover the sockets or rings themselves. Built by
 * fuzz/run.sh together with stream.c, debug.c and param.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stream.h"

#define REQUIRE(_cond)                                                                             \
    do {                                                                                           \
        if (!(_cond))                                                                              \
            __builtin_trap();                                                                      \
    } while (0)

#define NRECV 4

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

static const loom_tp_stream_io_t fz_io = {.writev = fz_writev, .readv = fz_readv};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("LOOM_DEBUG", "NONE", 1); /* the engine WARNs every protocol error it sees */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 + 2 * NRECV)
        return 0;
    /* The decoder alone, on the first bytes. */
    loom_tp_frame_header_t h;
    size_t hlen = size < LOOM_TP_STREAM_HDR_BYTES ? size : LOOM_TP_STREAM_HDR_BYTES;
    if (loom_tp_frame_header_decode(data, hlen, &h) == 0) {
        uint8_t again[LOOM_TP_STREAM_HDR_BYTES];
        loom_tp_frame_header_encode(h.tag, h.nbytes, again);
        /* The call stamp is the layer above's: carried as it came. */
        memcpy(again + LOOM_TP_STREAM_STAMP_OFF, data + LOOM_TP_STREAM_STAMP_OFF,
               LOOM_TP_STAMP_BYTES);
        REQUIRE(memcmp(again, data, LOOM_TP_STREAM_HDR_BYTES) == 0);
    }

    /* The engine: receives of input-chosen tags (0..3) and sizes (0..255 bytes). */
    chan_t c = {.data = data + 2 + 2 * NRECV, .size = size - 2 - 2 * NRECV, .chunk = data[0]};
    uint8_t reposts = data[1] % 16;
    loom_tp_stream_t s;
    loom_tp_stream_init(&s, &fz_io, &c, "fuzz", 0, 1, NULL);
    loom_tp_stream_req_t *req[NRECV];
    uint8_t *buf[NRECV];
    size_t cap[NRECV];
    uint32_t tag[NRECV];
    int live = 0;
    for (int i = 0; i < NRECV; i++) {
        tag[i] = data[2 + 2 * i] % 4;
        cap[i] = data[3 + 2 * i];
        buf[i] = malloc(cap[i] ? cap[i] : 1);
        req[i] = NULL;
        if (buf[i] != NULL &&
            loom_tp_stream_irecv(&s, buf[i], cap[i], tag[i], &req[i]) == loomSuccess)
            live++;
    }
    /* A send too, so the send path interleaves with the receive path. */
    loom_tp_stream_req_t *sreq = NULL;
    (void)loom_tp_stream_isend(&s, data, size, 7, &sreq);
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
            loomResult_t res = loom_tp_stream_test(req[i], &done, &nbytes);
            if (res != loomSuccess || done) {
                if (res == loomSuccess)
                    REQUIRE(nbytes <= cap[i]);
                req[i] = NULL;
                live--;
                progressed = 1;
                if (res == loomSuccess && reposts > 0 &&
                    loom_tp_stream_irecv(&s, buf[i], cap[i], tag[i], &req[i]) == loomSuccess) {
                    reposts--;
                    live++;
                }
            }
        }
        if (sreq != NULL) {
            int done = 0;
            size_t nbytes = 0;
            if (loom_tp_stream_test(sreq, &done, &nbytes) != loomSuccess || done)
                sreq = NULL;
        }
        (void)loom_tp_stream_progress(&s);
        if (!progressed && c.off == off0)
            break;
    }
    loom_tp_stream_fini(&s);
    for (int i = 0; i < NRECV; i++)
        free(buf[i]);
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * bootstrap_wire.c - encoders and bounding decoders of the bootstrap messages
 * (HELLO, REPLY, REQ), of unique ids and of LOOM_SECRET's hex text.
 * Everything here is pure: it reads only the bytes it is given, writes only
 * its outputs, and neither logs nor allocates; callers log the reason a
 * decoder returns. Callers: bootstrap.c, api/env_init.c, fuzz/ harnesses.
 */
#include "bootstrap_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static loomResult_t refuse(loomResult_t res, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static loomResult_t refuse(loomResult_t res, char *why, size_t why_len, const char *fmt, ...)
{
    if (why != NULL && why_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return res;
}

// ---- unique id ----------------------------------------------------------------

loomResult_t loom_bs_id_decode(const void *buf, size_t len, loom_id_t *id_p, char *why,
                               size_t why_len)
{
    loom_id_t id;
    if (len < sizeof(id))
        return refuse(loomInvalidArgument, why, why_len, "unique id of %zu bytes, need %zu", len,
                      sizeof(id));
    memcpy(&id, buf, sizeof(id));
    if (id.magic != LOOM_ID_MAGIC || id.version != LOOM_ID_VERSION)
        return refuse(loomInvalidArgument, why, why_len, "magic 0x%x version %u", id.magic,
                      id.version);
    int fam = id.root.sa.sa_family;
    if (fam != AF_INET && fam != AF_INET6)
        return refuse(loomInvalidArgument, why, why_len, "root address family %d", fam);
    if ((fam == AF_INET ? id.root.sin.sin_port : id.root.sin6.sin6_port) == 0)
        return refuse(loomInvalidArgument, why, why_len, "root address without a port");
    *id_p = id;
    return loomSuccess;
}

// ---- HELLO --------------------------------------------------------------------

void loom_bs_hello_encode(const loom_bs_hello_t *h, uint8_t out[LOOM_BS_HELLO_BYTES])
{
    put_le32(out, h->magic);
    put_le32(out + 4, (uint32_t)h->rank);
    put_le32(out + 8, (uint32_t)h->nranks);
    put_le32(out + 12, h->pid);
}

loomResult_t loom_bs_hello_decode(const void *buf, size_t len, int known_nranks,
                                  const uint8_t *joined, loom_bs_hello_t *h_p, char *why,
                                  size_t why_len)
{
    const uint8_t *p = buf;
    if (len != LOOM_BS_HELLO_BYTES)
        return refuse(loomInvalidUsage, why, why_len, "hello of %zu bytes, expected %d", len,
                      LOOM_BS_HELLO_BYTES);
    loom_bs_hello_t h = {.magic = get_le32(p),
                         .rank = (int32_t)get_le32(p + 4),
                         .nranks = (int32_t)get_le32(p + 8),
                         .pid = get_le32(p + 12)};
    if (h.magic != LOOM_BS_HELLO_MAGIC)
        return refuse(loomInvalidUsage, why, why_len, "bad hello magic 0x%08x", h.magic);
    if (h.nranks < 1 || h.nranks > LOOM_BOOTSTRAP_MAX_RANKS)
        return refuse(loomInvalidUsage, why, why_len, "nranks %d out of range [1, %d]", h.nranks,
                      LOOM_BOOTSTRAP_MAX_RANKS);
    if (known_nranks > 0 && h.nranks != known_nranks)
        return refuse(loomInvalidUsage, why, why_len, "rank %d says nranks %d, others said %d",
                      h.rank, h.nranks, known_nranks);
    if (h.rank < 0 || h.rank >= h.nranks)
        return refuse(loomInvalidUsage, why, why_len, "rank %d out of range for nranks %d", h.rank,
                      h.nranks);
    if (known_nranks > 0 && joined != NULL && joined[h.rank])
        return refuse(loomInvalidUsage, why, why_len,
                      "rank %d joined twice (the second from pid %u)", h.rank, h.pid);
    *h_p = h;
    return loomSuccess;
}

// ---- REPLY --------------------------------------------------------------------

void loom_bs_reply_encode(loomResult_t status, uint64_t len, uint8_t out[LOOM_BS_REPLY_BYTES])
{
    put_le32(out, (uint32_t)status);
    put_le32(out + 4, 0);
    put_le64(out + 8, len);
}

loomResult_t loom_bs_reply_decode(const void *buf, size_t len, uint64_t expect_len,
                                  loom_bs_reply_t *r_p, char *why, size_t why_len)
{
    const uint8_t *p = buf;
    if (len != LOOM_BS_REPLY_BYTES)
        return refuse(loomRemoteError, why, why_len, "reply header of %zu bytes, expected %d", len,
                      LOOM_BS_REPLY_BYTES);
    loom_bs_reply_t r = {.status = get_le32(p), .len = get_le64(p + 8)};
    if (r.status != loomSuccess) {
        loomResult_t st = r.status < loomNumResults && r.status != loomInProgress
                              ? (loomResult_t)r.status
                              : loomRemoteError;
        if (r.len > LOOM_BS_TEXT_MAX - 1)
            r.len = LOOM_BS_TEXT_MAX - 1;
        *r_p = r;
        return refuse(st, why, why_len, "the root reports status %u", r.status);
    }
    if (r.len != expect_len)
        return refuse(loomRemoteError, why, why_len, "the root sent %llu bytes, expected %llu",
                      (unsigned long long)r.len, (unsigned long long)expect_len);
    *r_p = r;
    return loomSuccess;
}

// ---- REQ ----------------------------------------------------------------------

void loom_bs_req_encode(const loom_bs_req_t *q, uint8_t out[LOOM_BS_REQ_BYTES])
{
    put_le32(out, q->type);
    put_le32(out + 4, q->len);
}

loomResult_t loom_bs_req_decode(const void *buf, size_t len, int nranks, const loom_bs_req_t *first,
                                loom_bs_req_t *q_p, char *why, size_t why_len)
{
    const uint8_t *p = buf;
    if (len != LOOM_BS_REQ_BYTES)
        return refuse(loomInvalidUsage, why, why_len, "request of %zu bytes, expected %d", len,
                      LOOM_BS_REQ_BYTES);
    if (nranks < 1 || nranks > LOOM_BOOTSTRAP_MAX_RANKS)
        return refuse(loomInvalidUsage, why, why_len, "nranks %d out of range", nranks);
    loom_bs_req_t q = {.type = get_le32(p), .len = get_le32(p + 4)};
    if (q.type != LOOM_BS_REQ_ALLGATHER && q.type != LOOM_BS_REQ_BYE)
        return refuse(loomInvalidUsage, why, why_len, "unknown request type %u", q.type);
    if (q.type == LOOM_BS_REQ_BYE && q.len != 0)
        return refuse(loomInvalidUsage, why, why_len, "bye with %u payload bytes", q.len);
    if (q.len > LOOM_BOOTSTRAP_MAX_PAYLOAD)
        return refuse(loomInvalidUsage, why, why_len,
                      "all-gather of %u bytes per rank exceeds the %u byte limit", q.len,
                      LOOM_BOOTSTRAP_MAX_PAYLOAD);
    if ((uint64_t)q.len * (uint64_t)nranks > LOOM_BOOTSTRAP_MAX_TOTAL)
        return refuse(loomInvalidUsage, why, why_len,
                      "all-gather of %u bytes from %d ranks exceeds the %llu byte limit", q.len,
                      nranks, (unsigned long long)LOOM_BOOTSTRAP_MAX_TOTAL);
    if (first != NULL && (q.type != first->type || q.len != first->len))
        return refuse(loomInvalidUsage, why, why_len,
                      "request %u of %u bytes, the first rank sent %u of %u bytes", q.type, q.len,
                      first->type, first->len);
    *q_p = q;
    return loomSuccess;
}

// ---- LOOM_SECRET --------------------------------------------------------------

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

loomResult_t loom_secret_parse_hex(const char *text, uint8_t out[LOOM_SECRET_BYTES], char *why,
                                   size_t why_len)
{
    if (text == NULL)
        return refuse(loomInvalidArgument, why, why_len, "no secret text");
    size_t n = strnlen(text, 2 * LOOM_SECRET_BYTES + 1);
    if (n != 2 * LOOM_SECRET_BYTES)
        return refuse(loomInvalidArgument, why, why_len,
                      "must be %d hex digits, got %s%zu characters", 2 * LOOM_SECRET_BYTES,
                      n > 2 * LOOM_SECRET_BYTES ? "more than " : "",
                      n > 2 * LOOM_SECRET_BYTES ? n - 1 : n);
    uint8_t v[LOOM_SECRET_BYTES];
    for (int i = 0; i < LOOM_SECRET_BYTES; i++) {
        int hi = hexval(text[2 * i]), lo = hexval(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return refuse(loomInvalidArgument, why, why_len,
                          "has a character that is not a hex digit at position %d",
                          hi < 0 ? 2 * i : 2 * i + 1);
        v[i] = (uint8_t)(hi * 16 + lo);
    }
    memcpy(out, v, sizeof(v));
    return loomSuccess;
}

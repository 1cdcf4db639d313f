/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_trace.c - LMTR v1 routing traces: encoding a header and a record, and decoding a whole
 * file with every field checked (docs/moe-trace.md). Integers are little-endian whatever the
 * host; sizes are computed in 64 bits and compared with the bytes that are there before anything
 * is allocated, so a hostile count cannot overflow or ask for more memory than the file backs.
 * Every refusal WARNs once, naming the file, the byte offset and the field, and returns
 * loomInvalidArgument. The writer appends one record per call with a single write(), and cuts a
 * failed append back off, so a file holds whole records only unless the process dies mid-write.
 */
#include "moe_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "debug.h"
#include "dtype.h"

static const uint8_t header_magic[4] = {'L', 'M', 'T', 'R'};
static const uint8_t record_magic[4] = {'L', 'M', 'R', 'C'};

// ---- Little-endian fields ----------------------------------------------------------------------

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* CRC-32 as zlib's crc32() and Python's zlib.crc32 compute it (reflected polynomial 0xedb88320),
 * four bits at a time: a 16-entry table, fast enough for traces and nothing to initialise. */
uint32_t loom_moe_trace_crc32(const void *bytes, size_t nbytes)
{
    static const uint32_t tab[16] = {0x00000000u, 0x1db71064u, 0x3b6e20c8u, 0x26d930acu,
                                     0x76dc4190u, 0x6b6b51f4u, 0x4db26158u, 0x5005713cu,
                                     0xedb88320u, 0xf00f9344u, 0xd6d6a3e8u, 0xcb61b38cu,
                                     0x9b64c2b0u, 0x86d3d2d4u, 0xa00ae278u, 0xbdbdf21cu};
    const uint8_t *p = bytes;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < nbytes; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ tab[crc & 15];
        crc = (crc >> 4) ^ tab[crc & 15];
    }
    return ~crc;
}

// ---- Sizes and checks shared by both directions ------------------------------------------------

/* Bytes of a record's arrays: fits 64 bits for any u32 T and u16 k. */
static uint64_t payload_nbytes(const loom_moe_trace_header_t *h, uint32_t num_tokens)
{
    uint64_t slots = (uint64_t)num_tokens * h->top_k;
    uint64_t n = 2 * slots;
    if (h->flags & LOOM_MOE_TRACE_WEIGHTS)
        n += 2 * slots;
    if (h->flags & LOOM_MOE_TRACE_TOKEN_IDS)
        n += 4 * (uint64_t)num_tokens;
    if (h->flags & LOOM_MOE_TRACE_TEXT_CLASS)
        n += num_tokens;
    return n;
}

uint64_t loom_moe_trace_record_nbytes(const loom_moe_trace_header_t *h, uint32_t num_tokens)
{
    return LOOM_MOE_TRACE_RECORD_BYTES + payload_nbytes(h, num_tokens) + LOOM_MOE_TRACE_CRC_BYTES;
}

static loomResult_t header_check(const loom_moe_trace_header_t *h, const char *what)
{
    if (h->num_experts < 1 || h->num_experts > LOOM_MOE_TRACE_MAX_EXPERTS) {
        LOOM_WARN("%s: %u experts, outside 1..%u", what, h->num_experts,
                  LOOM_MOE_TRACE_MAX_EXPERTS);
        return loomInvalidArgument;
    }
    if (h->top_k < 1 || h->top_k > h->num_experts) {
        LOOM_WARN("%s: top-k %u outside 1..%u (the number of experts)", what, h->top_k,
                  h->num_experts);
        return loomInvalidArgument;
    }
    if (h->flags & ~LOOM_MOE_TRACE_FLAGS_ALL) {
        LOOM_WARN("%s: flags 0x%x set bits version %d does not define (known: 0x%x)", what,
                  h->flags, LOOM_MOE_TRACE_VERSION, LOOM_MOE_TRACE_FLAGS_ALL);
        return loomInvalidArgument;
    }
    if (h->nranks < 1 || h->rank >= h->nranks) {
        LOOM_WARN("%s: rank %u of %u ranks: need 0 <= rank < nranks", what, h->rank, h->nranks);
        return loomInvalidArgument;
    }
    if (memchr(h->name, '\0', sizeof(h->name)) == NULL) {
        LOOM_WARN("%s: name not terminated within %d bytes", what, LOOM_MOE_TRACE_NAME_BYTES);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

/* Checks a batch's values against header h; `where` names the batch in messages. Duplicates are
 * found with a bitmap of E bits, set and cleared per row. */
static loomResult_t batch_check(const loom_moe_trace_header_t *h, const loom_moe_trace_batch_t *b,
                                const char *where)
{
    static const uint32_t need[] = {LOOM_MOE_TRACE_WEIGHTS, LOOM_MOE_TRACE_TOKEN_IDS,
                                    LOOM_MOE_TRACE_TEXT_CLASS};
    /* Arrays the flags do not name are not written, so not checked either. */
    const float *weight = (h->flags & LOOM_MOE_TRACE_WEIGHTS) ? b->weight : NULL;
    const uint8_t *text_class = (h->flags & LOOM_MOE_TRACE_TEXT_CLASS) ? b->text_class : NULL;
    const void *arrays[] = {b->weight, b->token_id, b->text_class};
    static const char *const names[] = {"weights", "token ids", "text classes"};
    for (int i = 0; i < 3; i++) {
        if ((h->flags & need[i]) && b->num_tokens > 0 && arrays[i] == NULL) {
            LOOM_WARN("%s: the header promises %s but the batch has none", where, names[i]);
            return loomInvalidArgument;
        }
    }
    const uint32_t k = h->top_k, e = h->num_experts;
    uint64_t seen[(LOOM_MOE_TRACE_MAX_EXPERTS + 64) / 64] = {0};
    loomResult_t res = loomSuccess;
    for (uint32_t t = 0; t < b->num_tokens && res == loomSuccess; t++) {
        const int32_t *row = b->topk + (size_t)t * k;
        uint32_t j = 0;
        for (; j < k; j++) {
            int32_t id = row[j];
            if (id == -1)
                continue;
            if (id < -1 || (uint32_t)id >= e) {
                LOOM_WARN("%s: token %u slot %u: expert id %d outside [0, %u) and not -1", where, t,
                          j, (int)id, e);
                res = loomInvalidArgument;
                break;
            }
            if (seen[id / 64] >> (id % 64) & 1) {
                LOOM_WARN("%s: token %u selects expert %d twice", where, t, (int)id);
                res = loomInvalidArgument;
                break;
            }
            seen[id / 64] |= 1ull << (id % 64);
        }
        for (uint32_t i = 0; i < j; i++)
            if (row[i] >= 0)
                seen[row[i] / 64] = 0;
    }
    if (res != loomSuccess)
        return res;
    for (uint64_t s = 0; weight && s < (uint64_t)b->num_tokens * k; s++) {
        if ((loom_f16_encode(weight[s]) & 0x7c00u) == 0x7c00u) {
            LOOM_WARN("%s: token %llu slot %u: weight %g is not finite in fp16", where,
                      (unsigned long long)(s / k), (unsigned)(s % k), (double)weight[s]);
            return loomInvalidArgument;
        }
    }
    for (uint32_t t = 0; text_class && t < b->num_tokens; t++) {
        if (text_class[t] >= LOOM_MOE_TRACE_TEXT_CLASSES) {
            LOOM_WARN("%s: token %u has text class %u, outside 0..%d", where, t, text_class[t],
                      LOOM_MOE_TRACE_TEXT_CLASSES - 1);
            return loomInvalidArgument;
        }
    }
    return loomSuccess;
}

// ---- Encoding ----------------------------------------------------------------------------------

loomResult_t loom_moe_trace_header_encode(const loom_moe_trace_header_t *h,
                                          uint8_t out[LOOM_MOE_TRACE_HEADER_BYTES])
{
    loomResult_t res = header_check(h, "trace header");
    if (res != loomSuccess)
        return res;
    memset(out, 0, LOOM_MOE_TRACE_HEADER_BYTES);
    memcpy(out, header_magic, 4);
    put_u32(out + 4, LOOM_MOE_TRACE_VERSION);
    put_u32(out + 8, LOOM_MOE_TRACE_HEADER_BYTES);
    put_u32(out + 12, h->num_experts);
    put_u16(out + 16, (uint16_t)h->top_k);
    put_u16(out + 18, (uint16_t)h->flags);
    put_u32(out + 20, h->nranks);
    put_u32(out + 24, h->rank);
    memcpy(out + 28, h->name, strlen(h->name)); /* the rest stays zero: one encoding per name */
    return loomSuccess;
}

loomResult_t loom_moe_trace_batch_encode(const loom_moe_trace_header_t *h,
                                         const loom_moe_trace_batch_t *b, uint8_t *out,
                                         size_t out_nbytes)
{
    loomResult_t res = header_check(h, "trace header");
    if (res != loomSuccess)
        return res;
    uint64_t payload = payload_nbytes(h, b->num_tokens);
    if (payload > UINT32_MAX) {
        LOOM_WARN("trace batch: %u tokens x top-k %u need %llu bytes, over the 4 GiB a record "
                  "holds",
                  b->num_tokens, h->top_k, (unsigned long long)payload);
        return loomInvalidArgument;
    }
    uint64_t total = loom_moe_trace_record_nbytes(h, b->num_tokens);
    if (out_nbytes < total) {
        LOOM_WARN("trace batch: %zu bytes of room, the record needs %llu", out_nbytes,
                  (unsigned long long)total);
        return loomInvalidArgument;
    }
    if (b->num_tokens > 0 && b->topk == NULL) {
        LOOM_WARN("trace batch: %u tokens but no top-k ids", b->num_tokens);
        return loomInvalidArgument;
    }
    char where[64];
    snprintf(where, sizeof(where), "trace batch of step %u, layer %u", b->step, b->layer);
    res = batch_check(h, b, where);
    if (res != loomSuccess)
        return res;
    memcpy(out, record_magic, 4);
    put_u32(out + 4, b->step);
    put_u32(out + 8, b->layer);
    put_u32(out + 12, b->num_tokens);
    put_u32(out + 16, (uint32_t)payload);
    uint8_t *p = out + LOOM_MOE_TRACE_RECORD_BYTES;
    const size_t slots = (size_t)b->num_tokens * h->top_k;
    for (size_t s = 0; s < slots; s++, p += 2)
        put_u16(p, (uint16_t)(int16_t)b->topk[s]);
    for (size_t s = 0; (h->flags & LOOM_MOE_TRACE_WEIGHTS) && s < slots; s++, p += 2)
        put_u16(p, loom_f16_encode(b->weight[s]));
    for (uint32_t t = 0; (h->flags & LOOM_MOE_TRACE_TOKEN_IDS) && t < b->num_tokens; t++, p += 4)
        put_u32(p, b->token_id[t]);
    if (h->flags & LOOM_MOE_TRACE_TEXT_CLASS) {
        if (b->num_tokens > 0)
            memcpy(p, b->text_class, b->num_tokens);
        p += b->num_tokens;
    }
    put_u32(p, loom_moe_trace_crc32(out, (size_t)(p - out)));
    return loomSuccess;
}

// ---- Decoding ----------------------------------------------------------------------------------

static loomResult_t header_decode(const uint8_t *p, size_t n, const char *what,
                                  loom_moe_trace_header_t *h)
{
    if (n < LOOM_MOE_TRACE_HEADER_BYTES) {
        LOOM_WARN("%s: %zu bytes, shorter than the %d-byte header", what, n,
                  LOOM_MOE_TRACE_HEADER_BYTES);
        return loomInvalidArgument;
    }
    if (memcmp(p, header_magic, 4) != 0) {
        LOOM_WARN("%s: not an LMTR trace (magic %02x %02x %02x %02x)", what, p[0], p[1], p[2],
                  p[3]);
        return loomInvalidArgument;
    }
    uint32_t version = get_u32(p + 4), header_bytes = get_u32(p + 8);
    if (version != LOOM_MOE_TRACE_VERSION || header_bytes != LOOM_MOE_TRACE_HEADER_BYTES) {
        LOOM_WARN("%s: version %u with a %u-byte header; this reader knows version %d with %d "
                  "bytes",
                  what, version, header_bytes, LOOM_MOE_TRACE_VERSION, LOOM_MOE_TRACE_HEADER_BYTES);
        return loomInvalidArgument;
    }
    memset(h, 0, sizeof(*h));
    h->num_experts = get_u32(p + 12);
    h->top_k = get_u16(p + 16);
    h->flags = get_u16(p + 18);
    h->nranks = get_u32(p + 20);
    h->rank = get_u32(p + 24);
    memcpy(h->name, p + 28, LOOM_MOE_TRACE_NAME_BYTES);
    /* After the name's end and in the padding only zeros: a header has one encoding. */
    for (size_t i = 28 + strlen(h->name); i < LOOM_MOE_TRACE_HEADER_BYTES; i++) {
        if (p[i] != 0) {
            LOOM_WARN("%s: header byte %zu is 0x%02x; bytes after the name must be zero", what, i,
                      p[i]);
            return loomInvalidArgument;
        }
    }
    return header_check(h, what);
}

/* Checks the framing of the record at byte `at` (n bytes left from p) and returns its size. */
static loomResult_t record_frame(const loom_moe_trace_header_t *h, const uint8_t *p, size_t n,
                                 const char *what, size_t at, size_t *rec_nbytes_p)
{
    if (n < LOOM_MOE_TRACE_RECORD_BYTES) {
        LOOM_WARN("%s: record at byte %zu cut short: %zu bytes left, its fixed part has %d", what,
                  at, n, LOOM_MOE_TRACE_RECORD_BYTES);
        return loomInvalidArgument;
    }
    if (memcmp(p, record_magic, 4) != 0) {
        LOOM_WARN("%s: no record magic at byte %zu (%02x %02x %02x %02x)", what, at, p[0], p[1],
                  p[2], p[3]);
        return loomInvalidArgument;
    }
    uint32_t num_tokens = get_u32(p + 12), payload = get_u32(p + 16);
    uint64_t expect = payload_nbytes(h, num_tokens);
    if (payload != expect) {
        LOOM_WARN("%s: record at byte %zu: %u tokens x top-k %u with flags 0x%x need %llu bytes, "
                  "the record says %u",
                  what, at, num_tokens, h->top_k, h->flags, (unsigned long long)expect, payload);
        return loomInvalidArgument;
    }
    size_t body = LOOM_MOE_TRACE_RECORD_BYTES + (size_t)payload;
    if (n - LOOM_MOE_TRACE_RECORD_BYTES < (size_t)payload + LOOM_MOE_TRACE_CRC_BYTES) {
        LOOM_WARN("%s: record at byte %zu cut short: %zu bytes left, it has %llu", what, at, n,
                  (unsigned long long)body + LOOM_MOE_TRACE_CRC_BYTES);
        return loomInvalidArgument;
    }
    uint32_t crc = loom_moe_trace_crc32(p, body), stored = get_u32(p + body);
    if (crc != stored) {
        LOOM_WARN("%s: record at byte %zu: CRC-32 0x%08x, computed 0x%08x", what, at, stored, crc);
        return loomInvalidArgument;
    }
    *rec_nbytes_p = body + LOOM_MOE_TRACE_CRC_BYTES;
    return loomSuccess;
}

static void batch_release(loom_moe_trace_batch_t *b)
{
    free(b->topk);
    free(b->weight);
    free(b->token_id);
    free(b->text_class);
}

/* Decodes a framed record's arrays into b (allocations sized by the record's own bytes). */
static loomResult_t record_decode(const loom_moe_trace_header_t *h, const uint8_t *p,
                                  loom_moe_trace_batch_t *b)
{
    memset(b, 0, sizeof(*b));
    b->step = get_u32(p + 4);
    b->layer = get_u32(p + 8);
    b->num_tokens = get_u32(p + 12);
    const size_t t = b->num_tokens, slots = t * h->top_k;
    const int w = !!(h->flags & LOOM_MOE_TRACE_WEIGHTS),
              ids = !!(h->flags & LOOM_MOE_TRACE_TOKEN_IDS),
              cls = !!(h->flags & LOOM_MOE_TRACE_TEXT_CLASS);
    b->topk = malloc(slots ? slots * sizeof(*b->topk) : 1);
    b->weight = w ? malloc(slots ? slots * sizeof(*b->weight) : 1) : NULL;
    b->token_id = ids ? malloc(t ? t * sizeof(*b->token_id) : 1) : NULL;
    b->text_class = cls ? malloc(t ? t : 1) : NULL;
    if (!b->topk || (w && !b->weight) || (ids && !b->token_id) || (cls && !b->text_class)) {
        LOOM_WARN("trace: out of memory for a record of %zu tokens x top-k %u", t, h->top_k);
        batch_release(b);
        return loomSystemError;
    }
    p += LOOM_MOE_TRACE_RECORD_BYTES;
    for (size_t s = 0; s < slots; s++, p += 2)
        b->topk[s] = (int16_t)get_u16(p);
    for (size_t s = 0; w && s < slots; s++, p += 2)
        b->weight[s] = loom_f16_decode(get_u16(p));
    for (size_t i = 0; ids && i < t; i++, p += 4)
        b->token_id[i] = get_u32(p);
    if (cls && t > 0)
        memcpy(b->text_class, p, t);
    return loomSuccess;
}

void loom_moe_trace_free(loom_moe_trace_t *trace)
{
    if (trace == NULL)
        return;
    for (size_t i = 0; i < trace->num_batches; i++)
        batch_release(&trace->batches[i]);
    free(trace->batches);
    free(trace);
}

static loomResult_t decode_named(const uint8_t *p, size_t n, const char *what,
                                 loom_moe_trace_t **trace_p)
{
    loom_moe_trace_t *tr = calloc(1, sizeof(*tr));
    if (tr == NULL) {
        LOOM_WARN("%s: out of memory", what);
        return loomSystemError;
    }
    loomResult_t res = header_decode(p, n, what, &tr->header);
    size_t cap = 0, at = LOOM_MOE_TRACE_HEADER_BYTES;
    while (res == loomSuccess && at < n) {
        size_t rec = 0;
        res = record_frame(&tr->header, p + at, n - at, what, at, &rec);
        if (res != loomSuccess)
            break;
        if (tr->num_batches == cap) {
            /* Every record has at least 24 bytes, so the array stays within the file's size. */
            cap = cap ? 2 * cap : 8;
            void *grown = realloc(tr->batches, cap * sizeof(*tr->batches));
            if (grown == NULL) {
                LOOM_WARN("%s: out of memory for %zu records", what, cap);
                res = loomSystemError;
                break;
            }
            tr->batches = grown;
        }
        loom_moe_trace_batch_t *b = &tr->batches[tr->num_batches];
        res = record_decode(&tr->header, p + at, b);
        if (res != loomSuccess)
            break;
        char where[384];
        snprintf(where, sizeof(where), "%s: record at byte %zu", what, at);
        res = batch_check(&tr->header, b, where);
        if (res != loomSuccess) {
            batch_release(b);
            break;
        }
        tr->num_batches++;
        at += rec;
    }
    if (res != loomSuccess) {
        loom_moe_trace_free(tr);
        return res;
    }
    *trace_p = tr;
    return loomSuccess;
}

loomResult_t loom_moe_trace_decode(const void *bytes, size_t nbytes, loom_moe_trace_t **trace_p)
{
    return decode_named(bytes, nbytes, "trace", trace_p);
}

/* Reads the whole of fd (of the size fstat gives) into a fresh buffer. */
static loomResult_t slurp(int fd, const char *path, uint8_t **buf_p, size_t *nbytes_p)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOOM_WARN("trace %s: fstat failed: %s", path, strerror(errno));
        return loomSystemError;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL) {
        LOOM_WARN("trace %s: out of memory for %zu bytes", path, n);
        return loomSystemError;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            LOOM_WARN("trace %s: read failed at byte %zu of %zu: %s", path, got, n,
                      r < 0 ? strerror(errno) : "the file shrank");
            free(buf);
            return loomSystemError;
        }
        got += (size_t)r;
    }
    *buf_p = buf;
    *nbytes_p = n;
    return loomSuccess;
}

loomResult_t loom_moe_trace_read(const char *path, loom_moe_trace_t **trace_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        LOOM_WARN("trace %s: cannot open: %s", path, strerror(errno));
        return loomSystemError;
    }
    uint8_t *buf = NULL;
    size_t n = 0;
    loomResult_t res = slurp(fd, path, &buf, &n);
    close(fd);
    if (res != loomSuccess)
        return res;
    char what[320];
    snprintf(what, sizeof(what), "trace %s", path);
    res = decode_named(buf, n, what, trace_p);
    free(buf);
    return res;
}

// ---- Appending writer --------------------------------------------------------------------------

struct loom_moe_trace_writer {
    int fd;
    loom_moe_trace_header_t header;
    char path[256];
};

static int header_equal(const loom_moe_trace_header_t *a, const loom_moe_trace_header_t *b)
{
    return a->num_experts == b->num_experts && a->top_k == b->top_k && a->flags == b->flags &&
           a->nranks == b->nranks && a->rank == b->rank && strcmp(a->name, b->name) == 0;
}

/* Writes all n bytes at the end of the file (O_APPEND), retrying short writes. */
static loomResult_t write_all(int fd, const uint8_t *p, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            LOOM_WARN("trace %s: write of %zu bytes failed: %s", path, n,
                      w < 0 ? strerror(errno) : "no progress");
            return loomSystemError;
        }
        p += w;
        n -= (size_t)w;
    }
    return loomSuccess;
}

/* An existing file: decoded whole (so every record is checked) and its header compared. */
static loomResult_t writer_check_existing(int fd, const char *path,
                                          const loom_moe_trace_header_t *h)
{
    uint8_t *buf = NULL;
    size_t n = 0;
    loomResult_t res = slurp(fd, path, &buf, &n);
    if (res != loomSuccess || n == 0) {
        free(buf);
        return res;
    }
    char what[320];
    snprintf(what, sizeof(what), "trace %s", path);
    loom_moe_trace_t *tr = NULL;
    res = decode_named(buf, n, what, &tr);
    free(buf);
    if (res != loomSuccess)
        return res;
    if (!header_equal(&tr->header, h)) {
        LOOM_WARN("trace %s: cannot append: the file has E %u, k %u, flags 0x%x, rank %u of %u, "
                  "name '%s'; the writer E %u, k %u, flags 0x%x, rank %u of %u, name '%s'",
                  path, tr->header.num_experts, tr->header.top_k, tr->header.flags, tr->header.rank,
                  tr->header.nranks, tr->header.name, h->num_experts, h->top_k, h->flags, h->rank,
                  h->nranks, h->name);
        res = loomInvalidArgument;
    }
    loom_moe_trace_free(tr);
    return res;
}

loomResult_t loom_moe_trace_writer_open(const char *path, const loom_moe_trace_header_t *h,
                                        loom_moe_trace_writer_t **writer_p)
{
    uint8_t head[LOOM_MOE_TRACE_HEADER_BYTES];
    loomResult_t res = loom_moe_trace_header_encode(h, head);
    if (res != loomSuccess)
        return res;
    loom_moe_trace_writer_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        LOOM_WARN("trace %s: out of memory", path);
        return loomSystemError;
    }
    w->header = *h;
    snprintf(w->path, sizeof(w->path), "%s", path);
    w->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        LOOM_WARN("trace %s: cannot open for appending: %s", path, strerror(errno));
        free(w);
        return loomSystemError;
    }
    struct stat st;
    if (fstat(w->fd, &st) != 0) {
        LOOM_WARN("trace %s: fstat failed: %s", path, strerror(errno));
        res = loomSystemError;
    } else if (st.st_size == 0) {
        res = write_all(w->fd, head, sizeof(head), path);
    } else {
        res = writer_check_existing(w->fd, path, h);
    }
    if (res != loomSuccess) {
        close(w->fd);
        free(w);
        return res;
    }
    *writer_p = w;
    return loomSuccess;
}

loomResult_t loom_moe_trace_writer_append(loom_moe_trace_writer_t *w,
                                          const loom_moe_trace_batch_t *b)
{
    uint64_t total = loom_moe_trace_record_nbytes(&w->header, b->num_tokens);
    if (total > (uint64_t)UINT32_MAX + LOOM_MOE_TRACE_RECORD_BYTES + LOOM_MOE_TRACE_CRC_BYTES) {
        LOOM_WARN("trace %s: %u tokens x top-k %u need %llu bytes, over the 4 GiB a record holds",
                  w->path, b->num_tokens, w->header.top_k, (unsigned long long)total);
        return loomInvalidArgument;
    }
    uint8_t *rec = malloc((size_t)total);
    if (rec == NULL) {
        LOOM_WARN("trace %s: out of memory for a %llu-byte record", w->path,
                  (unsigned long long)total);
        return loomSystemError;
    }
    loomResult_t res = loom_moe_trace_batch_encode(&w->header, b, rec, (size_t)total);
    off_t end = -1;
    if (res == loomSuccess) {
        end = lseek(w->fd, 0, SEEK_END);
        res = end < 0 ? loomSystemError : write_all(w->fd, rec, (size_t)total, w->path);
        if (end < 0)
            LOOM_WARN("trace %s: lseek failed: %s", w->path, strerror(errno));
    }
    if (res == loomSystemError && end >= 0 && ftruncate(w->fd, end) != 0)
        LOOM_WARN("trace %s: cannot cut a failed append back to %lld bytes: %s", w->path,
                  (long long)end, strerror(errno));
    free(rec);
    return res;
}

loomResult_t loom_moe_trace_writer_close(loom_moe_trace_writer_t *w)
{
    if (w == NULL)
        return loomSuccess;
    loomResult_t res = loomSuccess;
    if (close(w->fd) != 0) {
        LOOM_WARN("trace %s: close failed: %s", w->path, strerror(errno));
        res = loomSystemError;
    }
    free(w);
    return res;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_trace.h - routing traces in LMTR v1 (docs/moe-trace.md has the format byte by byte): a
 * 64-byte header, then one record per routing batch (step, layer, the top-k expert ids of every
 * token, and optionally their weights, token ids and text classes), each with its CRC-32.
 * A writer appends one batch at a time and can reopen a file to append more; a reader checks
 * every field and every count against the bytes there are, so that a bad file is refused with
 * loomInvalidArgument and a message (loomGetLastError), never a crash or an allocation that
 * the file's size does not back. Used by the MoE benchmark, the tests and the generators'
 * callers; knows nothing of communicators. Not thread-safe per writer; separate writers and
 * readers are independent.
 */
#ifndef LOOM_MOE_TRACE_H
#define LOOM_MOE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_MOE_TRACE_VERSION      1
#define LOOM_MOE_TRACE_HEADER_BYTES 64
#define LOOM_MOE_TRACE_RECORD_BYTES 20 /* a record's fixed part: magic, step, layer, T, payload */
#define LOOM_MOE_TRACE_CRC_BYTES    4
#define LOOM_MOE_TRACE_NAME_BYTES   32
#define LOOM_MOE_TRACE_MAX_EXPERTS  32767 /* expert ids are int16 in the file */
#define LOOM_MOE_TRACE_TEXT_CLASSES 14    /* text classes 0..13 (moe_gen.h's featuriser) */

/* Header flags: which optional arrays every record carries. */
#define LOOM_MOE_TRACE_WEIGHTS    (1u << 0) /* fp16 weight per selection */
#define LOOM_MOE_TRACE_TOKEN_IDS  (1u << 1) /* u32 token id per token */
#define LOOM_MOE_TRACE_TEXT_CLASS (1u << 2) /* u8 text class per token */
#define LOOM_MOE_TRACE_FLAGS_ALL                                                                   \
    (LOOM_MOE_TRACE_WEIGHTS | LOOM_MOE_TRACE_TOKEN_IDS | LOOM_MOE_TRACE_TEXT_CLASS)

typedef struct loom_moe_trace_header {
    uint32_t num_experts;                     /* E, 1..LOOM_MOE_TRACE_MAX_EXPERTS */
    uint32_t top_k;                           /* k, 1..E (u16 in the file) */
    uint32_t flags;                           /* LOOM_MOE_TRACE_* (u16 in the file) */
    uint32_t nranks;                          /* ranks whose files form the set, >= 1 */
    uint32_t rank;                            /* the rank that wrote this file, < nranks */
    char name[LOOM_MOE_TRACE_NAME_BYTES + 1]; /* free text, NUL-terminated: at most 32 bytes */
} loom_moe_trace_header_t;

/* One routing batch: the tokens one layer routed at one step. */
typedef struct loom_moe_trace_batch {
    uint32_t step;
    uint32_t layer;
    uint32_t num_tokens; /* T */
    int32_t *topk;      /* (T, k) expert ids in [0, E) or -1 (no selection); no id twice in a row */
    float *weight;      /* (T, k) finite, stored as fp16 (rounded to nearest even); or NULL */
    uint32_t *token_id; /* (T), or NULL */
    uint8_t *text_class; /* (T) each < LOOM_MOE_TRACE_TEXT_CLASSES, or NULL */
} loom_moe_trace_batch_t;

/* A whole file in memory. */
typedef struct loom_moe_trace {
    loom_moe_trace_header_t header;
    size_t num_batches;
    loom_moe_trace_batch_t *batches; /* (num_batches); each batch's arrays its own allocations */
} loom_moe_trace_t;

typedef struct loom_moe_trace_writer loom_moe_trace_writer_t;

/* ---- Encoding (pure; the writer and the fuzz harness build on these) ------------------------ */

/* CRC-32 of nbytes (zlib's crc32(), polynomial 0xedb88320): what a record's last 4 bytes hold. */
uint32_t loom_moe_trace_crc32(const void *bytes, size_t nbytes);

/* Bytes of one record of num_tokens tokens under header h: fixed part, arrays and CRC. */
uint64_t loom_moe_trace_record_nbytes(const loom_moe_trace_header_t *h, uint32_t num_tokens);

/* Writes h's 64 bytes to out. loomInvalidArgument if a field is out of range. */
loomResult_t loom_moe_trace_header_encode(const loom_moe_trace_header_t *h,
                                          uint8_t out[LOOM_MOE_TRACE_HEADER_BYTES]);

/* Writes batch b as one record to out, which has loom_moe_trace_record_nbytes(h, T) bytes.
 * loomInvalidArgument if an id is out of range or repeated in a row, a weight is not finite in
 * fp16, a text class is out of range, an array the flags name is NULL, or the record's arrays
 * pass 4 GiB. */
loomResult_t loom_moe_trace_batch_encode(const loom_moe_trace_header_t *h,
                                         const loom_moe_trace_batch_t *b, uint8_t *out,
                                         size_t out_nbytes);

/* ---- Reading ------------------------------------------------------------------------------- */

/* Decodes a whole trace held in memory; *trace_p is set only on success (free with
 * loom_moe_trace_free). Memory is bounded by a small multiple of nbytes. */
loomResult_t loom_moe_trace_decode(const void *bytes, size_t nbytes, loom_moe_trace_t **trace_p);
/* The same from a file. loomSystemError if it cannot be opened or read. */
loomResult_t loom_moe_trace_read(const char *path, loom_moe_trace_t **trace_p);
void loom_moe_trace_free(loom_moe_trace_t *trace);

/* ---- Writing ------------------------------------------------------------------------------- */

/* Opens path for appending batches. A missing or empty file gets header h. An existing file is
 * checked whole first and must carry the same header (every field, the name included): anything
 * else is loomInvalidArgument and the file is left as it was. */
loomResult_t loom_moe_trace_writer_open(const char *path, const loom_moe_trace_header_t *h,
                                        loom_moe_trace_writer_t **writer_p);
/* Appends one record. On failure the file is cut back to its last whole record. */
loomResult_t loom_moe_trace_writer_append(loom_moe_trace_writer_t *w,
                                          const loom_moe_trace_batch_t *b);
/* Closes the file (no fsync); loomSystemError if close reports a failed write. */
loomResult_t loom_moe_trace_writer_close(loom_moe_trace_writer_t *w);

#endif

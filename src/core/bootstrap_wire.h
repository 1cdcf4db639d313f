/* SPDX-License-Identifier: Apache-2.0
 *
 * bootstrap_wire.h - the bootstrap's messages and the text forms of its
 * inputs, as pure functions: encoders, and decoders that bound every field
 * before anything uses it and say why a message is refused. No I/O, no
 * logging, no allocation, so that the fuzzers in fuzz/ run exactly the code
 * the library runs. Callers: bootstrap.c (root and ranks), api/env_init.c
 * (LOOM_SECRET), tests/security and fuzz/.
 */
#ifndef LOOM_BOOTSTRAP_WIRE_H
#define LOOM_BOOTSTRAP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "secret.h"
#include "socket.h"

/* Upper bounds applied to everything a peer sends before it is used. */
#define LOOM_BOOTSTRAP_MAX_RANKS   (1 << 20)
#define LOOM_BOOTSTRAP_MAX_PAYLOAD (1u << 20)   /* bytes one rank adds to an all-gather */
#define LOOM_BOOTSTRAP_MAX_TOTAL   (1ull << 30) /* bytes of one all-gather result */
#define LOOM_BS_TEXT_MAX           512          /* bytes of a failure text a rank reads */

/* Wire format, integers little-endian; every connection first passes the
 * secret handshake of secret.c with role LOOM_BS_ROLE:
 *   rank -> root  HELLO  16 bytes {u32 magic "LMHE", i32 rank, i32 nranks, u32 pid}
 *   root -> rank  REPLY  16 bytes {u32 status, u32 0, u64 len} + len bytes
 *                 (status 0: success and len payload bytes; else a loomResult_t
 *                 and a NUL-terminated text naming the cause)
 *   rank -> root  REQ     8 bytes {u32 type, u32 len} + len bytes (ALLGATHER or BYE) */
#define LOOM_BS_ROLE          0x424f4f54u /* "BOOT" */
#define LOOM_BS_HELLO_MAGIC   0x4c4d4845u /* "LMHE" */
#define LOOM_BS_HELLO_BYTES   16
#define LOOM_BS_REPLY_BYTES   16
#define LOOM_BS_REQ_BYTES     8
#define LOOM_BS_REQ_ALLGATHER 1u
#define LOOM_BS_REQ_BYE       2u

/* What the 128-byte loomUniqueId holds (host byte order: an id only travels
 * between processes of one job, out of band). */
typedef struct {
    uint32_t magic;   /* LOOM_ID_MAGIC */
    uint32_t version; /* LOOM_ID_VERSION */
    uint8_t secret[LOOM_SECRET_BYTES];
    loom_sockaddr_t root; /* address of the root service */
} loom_id_t;

#define LOOM_ID_MAGIC   0x4c4f4f4du /* "LOOM" */
#define LOOM_ID_VERSION 1u

typedef struct {
    uint32_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t pid;
} loom_bs_hello_t;

typedef struct {
    uint32_t status; /* loomResult_t as sent */
    uint64_t len;    /* payload bytes that follow */
} loom_bs_reply_t;

typedef struct {
    uint32_t type; /* LOOM_BS_REQ_* */
    uint32_t len;  /* payload bytes that follow */
} loom_bs_req_t;

/* Every decoder below returns Success or an error code, and on error writes a
 * lower-case reason (no trailing period) into why[why_len] when why != NULL.
 * Outputs are set only on success unless said otherwise. */

/* Checks a unique id's bytes (len >= sizeof(loom_id_t)): magic, version, an
 * IPv4 or IPv6 root address with a port. Errors: InvalidArgument. */
loomResult_t loom_bs_id_decode(const void *buf, size_t len, loom_id_t *id_p, char *why,
                               size_t why_len);

void loom_bs_hello_encode(const loom_bs_hello_t *h, uint8_t out[LOOM_BS_HELLO_BYTES]);
/* A HELLO at the root. known_nranks is the size the first accepted rank
 * announced (0: none yet); joined[known_nranks] marks ranks already present
 * (NULL when known_nranks is 0). Refuses a wrong length or magic, nranks
 * outside [1, LOOM_BOOTSTRAP_MAX_RANKS] or unlike known_nranks, rank outside
 * [0, nranks), and a rank already joined. Errors: InvalidUsage. */
loomResult_t loom_bs_hello_decode(const void *buf, size_t len, int known_nranks,
                                  const uint8_t *joined, loom_bs_hello_t *h_p, char *why,
                                  size_t why_len);

void loom_bs_reply_encode(loomResult_t status, uint64_t len, uint8_t out[LOOM_BS_REPLY_BYTES]);
/* A REPLY header at a rank that expects expect_len payload bytes. Success:
 * status 0 and len == expect_len. A failure status returns that code (an
 * unknown one RemoteError) with r_p->len set to the text bytes to read, at
 * most LOOM_BS_TEXT_MAX - 1. Status 0 with another length: RemoteError. */
loomResult_t loom_bs_reply_decode(const void *buf, size_t len, uint64_t expect_len,
                                  loom_bs_reply_t *r_p, char *why, size_t why_len);

void loom_bs_req_encode(const loom_bs_req_t *q, uint8_t out[LOOM_BS_REQ_BYTES]);
/* A REQ at the root of an nranks rendezvous. first is the request of the
 * first rank in this round (NULL for that rank itself): every rank must send
 * the same type and length. Refuses unknown types, a BYE with a payload, a
 * length over LOOM_BOOTSTRAP_MAX_PAYLOAD and a result (len * nranks) over
 * LOOM_BOOTSTRAP_MAX_TOTAL. Errors: InvalidUsage. */
loomResult_t loom_bs_req_decode(const void *buf, size_t len, int nranks, const loom_bs_req_t *first,
                                loom_bs_req_t *q_p, char *why, size_t why_len);

/* LOOM_SECRET: exactly 2 * LOOM_SECRET_BYTES hex digits, either case.
 * Errors: InvalidArgument. */
loomResult_t loom_secret_parse_hex(const char *text, uint8_t out[LOOM_SECRET_BYTES], char *why,
                                   size_t why_len);

#endif

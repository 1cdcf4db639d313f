/* SPDX-License-Identifier: Apache-2.0
 *
 * secret.h - job secrets and the keyed MAC that proves them on every
 * connection. The MAC is SipHash-2-4 (Aumasson and Bernstein,
 * https://www.aumasson.jp/siphash/siphash.pdf), keyed with the 128-bit secret.
 * A connection is accepted only after the connector answers a fresh random
 * challenge with the right MAC, so the secret itself never crosses the wire.
 */
#ifndef LOOM_SECRET_H
#define LOOM_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_SECRET_BYTES 16
#define LOOM_NONCE_BYTES  16
#define LOOM_MAC_BYTES    16

/* Fills buf with bytes from the kernel's CSPRNG (getrandom). */
loomResult_t loom_random_bytes(void *buf, size_t len);
/* Zeroes len bytes of secret material in a way the compiler keeps. */
void loom_secret_wipe(void *buf, size_t len);
/* SipHash-2-4 of msg under a 16-byte key. */
uint64_t loom_siphash24(const uint8_t key[16], const void *msg, size_t len);
/* 16-byte MAC of (nonce, role) under the secret; role separates the two ends. */
void loom_mac_compute(const uint8_t secret[LOOM_SECRET_BYTES],
                      const uint8_t nonce[LOOM_NONCE_BYTES], uint32_t role,
                      uint8_t mac[LOOM_MAC_BYTES]);
/* The job secret from a file (LOOM_SECRET_FILE): the file must be a regular
 * file, not a symbolic link (opened with O_NOFOLLOW), owned by this process's
 * effective uid, with no group or other permission bits, and hold exactly the
 * text LOOM_SECRET takes (32 hex digits, either case), optionally followed by
 * one newline. On failure *why (never the content) completes a sentence that
 * starts with the path: InvalidArgument for a file that breaks these rules or
 * cannot be opened, SystemError when reading it fails. */
loomResult_t loom_secret_read_file(const char *path, uint8_t secret[LOOM_SECRET_BYTES], char *why,
                                   size_t why_len);
/* Constant-time comparison; 1 if equal. */
int loom_mac_equal(const uint8_t a[LOOM_MAC_BYTES], const uint8_t b[LOOM_MAC_BYTES]);

/* The challenge-response handshake on a connected blocking-with-deadline
 * socket. The acceptor sends a nonce; the connector answers with
 * MAC(nonce, role) and its own nonce; the acceptor answers that. Both ends
 * thus prove the secret. Returns RemoteError on a wrong or missing proof. */
loomResult_t loom_handshake_accept(int fd, const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                   uint64_t deadline_ns);
loomResult_t loom_handshake_connect(int fd, const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                    uint64_t deadline_ns);

/* role (< 0x80000000, one value per protocol) names what the listener serves:
 * a connector expecting another role fails before any proof is computed.
 * The same handshake driven without ever waiting, for callers that must not
 * block (the tcp transport's connect and accept, where two ranks waiting on
 * each other's handshake would deadlock, and the bootstrap root, which serves
 * many connections at once). loom_handshake_step moves what the socket allows
 * now; *done_p = 1 once both ends are proven. Errors as above; the caller then
 * closes fd. A failure is WARNed once by the handshake, unless the caller set
 * `quiet` (listeners facing stray traffic log through their own rate limit);
 * either way `why` names the cause and `fail` its kind.
 * An acceptor that refuses a proof first tells the connector so (a fixed
 * 16-byte REFUSED in place of its own proof): a connector can then tell a
 * wrong secret (fail = REFUSED, do not retry) from a listener that shed the
 * connection under load (fail = CLOSED, worth a new connection). */
enum {
    LOOM_HS_FAIL_NONE = 0,
    LOOM_HS_FAIL_CLOSED,  /* the peer closed or reset the connection before the end */
    LOOM_HS_FAIL_PROOF,   /* the peer sent a wrong proof, magic, version or role */
    LOOM_HS_FAIL_REFUSED, /* connector: the listener refused this end's proof */
    LOOM_HS_FAIL_SYSTEM   /* a local failure (socket error, randomness) */
};

typedef struct {
    int fd;
    int acceptor; /* 1: the listening end */
    int quiet;    /* 1: do not WARN failures; the caller logs `why` */
    uint32_t role;
    int state;   /* internal step of the exchange */
    size_t have; /* bytes of the current message moved so far */
    int fail;    /* LOOM_HS_FAIL_* once a step failed */
    char why[160];
    uint8_t secret[LOOM_SECRET_BYTES];
    uint8_t nonce[LOOM_NONCE_BYTES]; /* this end's challenge */
    uint8_t msg[32];                 /* the message being sent or received */
} loom_handshake_t;

loomResult_t loom_handshake_init(loom_handshake_t *hs, int fd,
                                 const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                 int acceptor);
loomResult_t loom_handshake_step(loom_handshake_t *hs, int *done_p);
/* poll() events the handshake is waiting for (POLLIN or POLLOUT). */
short loom_handshake_events(const loom_handshake_t *hs);
/* Bytes this end has received from the peer so far (0: the peer said nothing). */
size_t loom_handshake_received(const loom_handshake_t *hs);
/* Wipes the secret copy; call when done or abandoned. */
void loom_handshake_clear(loom_handshake_t *hs);

#endif

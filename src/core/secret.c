/* SPDX-License-Identifier: Apache-2.0
 *
 * secret.c - randomness, SipHash-2-4, the 16-byte MAC and the challenge-
 * response handshake that every loom connection (bootstrap and tcp) runs
 * before anything else is read from it, and the reading of a secret file.
 * It does not choose or store secrets (the bootstrap does) and it encrypts
 * nothing: the handshake only proves that both ends hold the job secret.
 * Callers: bootstrap.c (blocking form), tcp/tcp.c (non-blocking form),
 * api/env_init.c (LOOM_SECRET_FILE).
 */
#include "secret.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap_wire.h"
#include "check.h"
#include "debug.h"
#include "socket.h"
#include "timer.h"

loomResult_t loom_random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            LOOM_WARN("getrandom of %zu bytes failed: %s", len, strerror(errno));
            return loomSystemError;
        }
        p += n;
        len -= (size_t)n;
    }
    return loomSuccess;
}

// ---- SipHash-2-4 -------------------------------------------------------------
/* Straight from the paper (https://www.aumasson.jp/siphash/siphash.pdf,
 * section 2): four 64-bit lanes initialised from the key and the constants
 * "somepseudorandomlygeneratedbytes"; each little-endian 8-byte word m is
 * absorbed as v3 ^= m, 2 SipRounds, v0 ^= m; the last word carries the
 * remaining bytes and len mod 256 in its top byte; finalisation is v2 ^= 0xff
 * and 4 SipRounds, and the output is v0 ^ v1 ^ v2 ^ v3. */

static inline uint64_t rotl64(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline void store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl64(v1, 13);                                                                       \
        v1 ^= v0;                                                                                  \
        v0 = rotl64(v0, 32);                                                                       \
        v2 += v3;                                                                                  \
        v3 = rotl64(v3, 16);                                                                       \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl64(v3, 21);                                                                       \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl64(v1, 17);                                                                       \
        v1 ^= v2;                                                                                  \
        v2 = rotl64(v2, 32);                                                                       \
    } while (0)

uint64_t loom_siphash24(const uint8_t key[16], const void *msg, size_t len)
{
    const uint8_t *m = msg;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull;
    uint64_t v3 = k1 ^ 0x7465646279746573ull;
    size_t full = len & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t w = load_le64(m + i);
        v3 ^= w;
        SIPROUND;
        SIPROUND;
        v0 ^= w;
    }
    uint64_t b = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)m[full + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* MAC = SipHash(secret, 0x01 || nonce || le32(role)) || SipHash(secret, 0x02 || ...):
 * two independent 64-bit halves, separated by the leading domain byte. */
void loom_mac_compute(const uint8_t secret[LOOM_SECRET_BYTES],
                      const uint8_t nonce[LOOM_NONCE_BYTES], uint32_t role,
                      uint8_t mac[LOOM_MAC_BYTES])
{
    uint8_t msg[1 + LOOM_NONCE_BYTES + 4];
    memcpy(msg + 1, nonce, LOOM_NONCE_BYTES);
    store_le32(msg + 1 + LOOM_NONCE_BYTES, role);
    msg[0] = 0x01;
    store_le64(mac, loom_siphash24(secret, msg, sizeof(msg)));
    msg[0] = 0x02;
    store_le64(mac + 8, loom_siphash24(secret, msg, sizeof(msg)));
}

int loom_mac_equal(const uint8_t a[LOOM_MAC_BYTES], const uint8_t b[LOOM_MAC_BYTES])
{
    volatile uint8_t diff = 0;
    for (int i = 0; i < LOOM_MAC_BYTES; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

// ---- handshake -------------------------------------------------------------
/* Wire format (integers little-endian), 80 bytes in all:
 *   acceptor -> connector  CHALLENGE 32 bytes: u32 magic "LMHS", u32 version,
 *                                   u32 role, u32 zero, nonce_a[16]
 *   connector -> acceptor  RESPONSE  32 bytes: MAC(nonce_a, role), nonce_c[16]
 *   acceptor -> connector  CONFIRM   16 bytes: MAC(nonce_c, role | ACCEPTOR_BIT)
 *                          or REFUSED 16 bytes "LMHS-REFUSED" + 4 zero bytes when
 *                          the RESPONSE was wrong (sent once, best effort, then
 *                          the acceptor closes)
 * The acceptor reads exactly the 32-byte RESPONSE before it has verified the
 * connector, so an unauthenticated peer can make it read nothing more. The
 * direction bit keeps a connector from reflecting the acceptor's own proof.
 * REFUSED carries nothing secret; a real CONFIRM equals it with probability
 * 2^-128. It lets a connector tell "wrong secret" (give up) from a listener
 * that dropped the connection under load (connect again).
 * The role in the CHALLENGE lets a connector refuse a listener of another
 * kind before computing anything. */

#define HS_MAGIC           0x53484d4cu /* "LMHS" */
#define HS_VERSION         1u
#define HS_ACCEPTOR_BIT    0x80000000u
#define HS_CHALLENGE_BYTES 32
#define HS_RESPONSE_BYTES  32
#define HS_CONFIRM_BYTES   16

static const uint8_t hs_refused[HS_CONFIRM_BYTES] = "LMHS-REFUSED";

enum {
    HS_SEND_CHALLENGE, /* acceptor */
    HS_RECV_RESPONSE,
    HS_SEND_CONFIRM,
    HS_RECV_CHALLENGE, /* connector */
    HS_SEND_RESPONSE,
    HS_RECV_CONFIRM,
    HS_DONE
};

static const char *step_name(int state)
{
    switch (state) {
    case HS_SEND_CHALLENGE:
        return "sending the challenge";
    case HS_RECV_RESPONSE:
        return "waiting for the connector's proof";
    case HS_SEND_CONFIRM:
        return "sending this end's proof";
    case HS_RECV_CHALLENGE:
        return "waiting for the listener's challenge";
    case HS_SEND_RESPONSE:
        return "sending this end's proof";
    default:
        return "waiting for the listener's proof";
    }
}

static const char *fd_peer(int fd, char *buf, size_t len)
{
    loom_sockaddr_t peer;
    socklen_t plen = sizeof(peer);
    memset(&peer, 0, sizeof(peer));
    if (getpeername(fd, &peer.sa, &plen) != 0) {
        snprintf(buf, len, "socket %d", fd);
        return buf;
    }
    return loom_sockaddr_str(&peer, buf, len);
}

/* Records why the handshake failed and WARNs it unless the caller logs. */
static loomResult_t hs_fail(loom_handshake_t *hs, int kind, loomResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static loomResult_t hs_fail(loom_handshake_t *hs, int kind, loomResult_t res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hs->why, sizeof(hs->why), fmt, ap);
    va_end(ap);
    hs->fail = kind;
    if (!hs->quiet)
        LOOM_WARN("%s", hs->why);
    return res;
}

loomResult_t loom_handshake_init(loom_handshake_t *hs, int fd,
                                 const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                 int acceptor)
{
    memset(hs, 0, sizeof(*hs));
    hs->fd = fd;
    hs->acceptor = acceptor;
    hs->role = role & ~HS_ACCEPTOR_BIT;
    memcpy(hs->secret, secret, LOOM_SECRET_BYTES);
    LOOM_CHECK(loom_random_bytes(hs->nonce, LOOM_NONCE_BYTES));
    if (acceptor) {
        store_le32(hs->msg, HS_MAGIC);
        store_le32(hs->msg + 4, HS_VERSION);
        store_le32(hs->msg + 8, hs->role);
        store_le32(hs->msg + 12, 0);
        memcpy(hs->msg + 16, hs->nonce, LOOM_NONCE_BYTES);
        hs->state = HS_SEND_CHALLENGE;
    } else {
        hs->state = HS_RECV_CHALLENGE;
    }
    return loomSuccess;
}

void loom_secret_wipe(void *buf, size_t len)
{
    volatile uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = 0;
}

// ---- secret file -------------------------------------------------------------
/* The rules are ssh's for private keys: a file that another user could have
 * written, swapped or read holds no secret. O_NOFOLLOW refuses a symbolic link
 * planted at the path (the directories above it are the user's to choose), and
 * O_NONBLOCK keeps a FIFO there from holding the open until someone writes. */

#define SECRET_FILE_MAX_BYTES (2 * LOOM_SECRET_BYTES + 1) /* the digits and one newline */

loomResult_t loom_secret_read_file(const char *path, uint8_t secret[LOOM_SECRET_BYTES], char *why,
                                   size_t why_len)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            snprintf(why, why_len, "is a symbolic link, which loom does not follow");
        else
            snprintf(why, why_len, "cannot be opened: %s", strerror(errno));
        return loomInvalidArgument;
    }
    loomResult_t res = loomInvalidArgument;
    char text[SECRET_FILE_MAX_BYTES + 2];
    size_t len = 0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cannot be examined (fstat): %s", strerror(errno));
        res = loomSystemError;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "is not a regular file (mode %06o)", (unsigned)st.st_mode);
        goto out;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "is owned by uid %u, not by this user (uid %u)", (unsigned)st.st_uid,
                 (unsigned)geteuid());
        goto out;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(why, why_len,
                 "has mode %04o: group and others must have no permission on it (chmod 600)",
                 (unsigned)(st.st_mode & 07777));
        goto out;
    }
    /* One byte more than a valid file holds, so that a longer one is seen. */
    while (len < SECRET_FILE_MAX_BYTES + 1) {
        ssize_t n = read(fd, text + len, SECRET_FILE_MAX_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, why_len, "cannot be read: %s", strerror(errno));
            res = loomSystemError;
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len == SECRET_FILE_MAX_BYTES && text[len - 1] == '\n')
        len--;
    text[len] = '\0';
    if (len != 2 * LOOM_SECRET_BYTES || memchr(text, '\0', len) != NULL) {
        snprintf(why, why_len,
                 "holds %s%zu bytes: it must hold %d hex digits, optionally followed by one "
                 "newline",
                 len > SECRET_FILE_MAX_BYTES ? "more than " : "",
                 len > SECRET_FILE_MAX_BYTES ? (size_t)SECRET_FILE_MAX_BYTES : len,
                 2 * LOOM_SECRET_BYTES);
        goto out;
    }
    res = loom_secret_parse_hex(text, secret, why, why_len);
out:
    loom_secret_wipe(text, sizeof(text));
    close(fd);
    return res;
}

void loom_handshake_clear(loom_handshake_t *hs)
{
    loom_secret_wipe(hs->secret, sizeof(hs->secret));
}

size_t loom_handshake_received(const loom_handshake_t *hs)
{
    switch (hs->state) {
    case HS_SEND_CHALLENGE:
        return 0;
    case HS_RECV_CHALLENGE:
    case HS_RECV_RESPONSE:
        return hs->have;
    case HS_SEND_CONFIRM:
        return HS_RESPONSE_BYTES;
    case HS_SEND_RESPONSE:
        return HS_CHALLENGE_BYTES;
    case HS_RECV_CONFIRM:
        return HS_CHALLENGE_BYTES + hs->have;
    default:
        return hs->acceptor ? HS_RESPONSE_BYTES : HS_CHALLENGE_BYTES + HS_CONFIRM_BYTES;
    }
}

short loom_handshake_events(const loom_handshake_t *hs)
{
    switch (hs->state) {
    case HS_SEND_CHALLENGE:
    case HS_SEND_CONFIRM:
    case HS_SEND_RESPONSE:
        return POLLOUT;
    default:
        return POLLIN;
    }
}

static size_t msg_bytes(int state)
{
    switch (state) {
    case HS_SEND_CHALLENGE:
    case HS_RECV_CHALLENGE:
        return HS_CHALLENGE_BYTES;
    case HS_RECV_RESPONSE:
    case HS_SEND_RESPONSE:
        return HS_RESPONSE_BYTES;
    default:
        return HS_CONFIRM_BYTES;
    }
}

/* Runs once the message of the current receive state is complete. */
static loomResult_t hs_consume(loom_handshake_t *hs)
{
    char pbuf[96];
    uint8_t mac[LOOM_MAC_BYTES];
    switch (hs->state) {
    case HS_RECV_CHALLENGE: {
        uint32_t magic = load_le32(hs->msg);
        uint32_t version = load_le32(hs->msg + 4);
        uint32_t role = load_le32(hs->msg + 8);
        if (magic != HS_MAGIC)
            return hs_fail(hs, LOOM_HS_FAIL_PROOF, loomRemoteError,
                           "%s is not a loom listener (handshake magic 0x%08x)",
                           fd_peer(hs->fd, pbuf, sizeof(pbuf)), magic);
        if (version != HS_VERSION || role != hs->role)
            return hs_fail(
                hs, LOOM_HS_FAIL_PROOF, loomRemoteError,
                "listener %s speaks handshake version %u role %u, this end version %u role %u",
                fd_peer(hs->fd, pbuf, sizeof(pbuf)), version, role, HS_VERSION, hs->role);
        uint8_t nonce_a[LOOM_NONCE_BYTES];
        memcpy(nonce_a, hs->msg + 16, LOOM_NONCE_BYTES);
        loom_mac_compute(hs->secret, nonce_a, hs->role, hs->msg);
        memcpy(hs->msg + LOOM_MAC_BYTES, hs->nonce, LOOM_NONCE_BYTES);
        hs->state = HS_SEND_RESPONSE;
        return loomSuccess;
    }
    case HS_RECV_RESPONSE:
        loom_mac_compute(hs->secret, hs->nonce, hs->role, mac);
        if (!loom_mac_equal(mac, hs->msg)) {
            /* Best effort: one non-blocking send into a socket that has sent
             * only the challenge, so its buffer has room; then the caller closes. */
            size_t sent = 0;
            (void)loom_socket_send_some(hs->fd, hs_refused, sizeof(hs_refused), &sent);
            return hs_fail(hs, LOOM_HS_FAIL_PROOF, loomRemoteError,
                           "connection from %s refused: it did not prove the job secret",
                           fd_peer(hs->fd, pbuf, sizeof(pbuf)));
        }
        {
            uint8_t nonce_c[LOOM_NONCE_BYTES];
            memcpy(nonce_c, hs->msg + LOOM_MAC_BYTES, LOOM_NONCE_BYTES);
            loom_mac_compute(hs->secret, nonce_c, hs->role | HS_ACCEPTOR_BIT, hs->msg);
        }
        hs->state = HS_SEND_CONFIRM;
        return loomSuccess;
    case HS_RECV_CONFIRM:
        loom_mac_compute(hs->secret, hs->nonce, hs->role | HS_ACCEPTOR_BIT, mac);
        if (memcmp(hs->msg, hs_refused, sizeof(hs_refused)) == 0)
            return hs_fail(hs, LOOM_HS_FAIL_REFUSED, loomRemoteError,
                           "listener %s refused this end's proof: it holds another job secret",
                           fd_peer(hs->fd, pbuf, sizeof(pbuf)));
        if (!loom_mac_equal(mac, hs->msg))
            return hs_fail(hs, LOOM_HS_FAIL_PROOF, loomRemoteError,
                           "listener %s did not prove the job secret",
                           fd_peer(hs->fd, pbuf, sizeof(pbuf)));
        hs->state = HS_DONE;
        return loomSuccess;
    default:
        return hs_fail(hs, LOOM_HS_FAIL_SYSTEM, loomInternalError, "handshake consumed in state %d",
                       hs->state);
    }
}

loomResult_t loom_handshake_step(loom_handshake_t *hs, int *done_p)
{
    char pbuf[96];
    while (hs->state != HS_DONE) {
        size_t want = msg_bytes(hs->state);
        int sending = loom_handshake_events(hs) == POLLOUT;
        size_t n = 0;
        loomResult_t res =
            sending ? loom_socket_send_some(hs->fd, hs->msg + hs->have, want - hs->have, &n)
                    : loom_socket_recv_some(hs->fd, hs->msg + hs->have, want - hs->have, &n);
        if (res == loomRemoteError)
            return hs_fail(hs, LOOM_HS_FAIL_CLOSED, res,
                           "handshake with %s failed: connection closed or reset by the peer "
                           "while %s (%zu of %zu bytes moved)",
                           fd_peer(hs->fd, pbuf, sizeof(pbuf)), step_name(hs->state), hs->have,
                           want);
        if (res != loomSuccess) {
            hs->fail = LOOM_HS_FAIL_SYSTEM; /* WARNed by the socket layer */
            snprintf(hs->why, sizeof(hs->why), "socket error during the handshake");
            return res;
        }
        if (n == 0) {
            *done_p = 0;
            return loomSuccess;
        }
        hs->have += n;
        if (hs->have < want)
            continue;
        hs->have = 0;
        if (hs->state == HS_SEND_CHALLENGE)
            hs->state = HS_RECV_RESPONSE;
        else if (hs->state == HS_SEND_RESPONSE)
            hs->state = HS_RECV_CONFIRM;
        else if (hs->state == HS_SEND_CONFIRM)
            hs->state = HS_DONE;
        else {
            loomResult_t res2 = hs_consume(hs);
            if (res2 != loomSuccess)
                return res2;
        }
    }
    *done_p = 1;
    return loomSuccess;
}

static loomResult_t handshake_blocking(int fd, const uint8_t secret[LOOM_SECRET_BYTES],
                                       uint32_t role, uint64_t deadline_ns, int acceptor)
{
    loom_handshake_t hs;
    char pbuf[96];
    loomResult_t res = loom_handshake_init(&hs, fd, secret, role, acceptor);
    while (res == loomSuccess) {
        int done = 0;
        res = loom_handshake_step(&hs, &done);
        if (res != loomSuccess || done)
            break;
        uint64_t now = loom_now_ns();
        if (now >= deadline_ns) {
            LOOM_WARN("handshake with %s timed out", fd_peer(fd, pbuf, sizeof(pbuf)));
            res = loomTimeout;
            break;
        }
        uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
        struct pollfd pfd = {.fd = fd, .events = loom_handshake_events(&hs)};
        if (poll(&pfd, 1, left_ms > 60000 ? 60000 : (int)left_ms) < 0 && errno != EINTR) {
            LOOM_WARN("poll during the handshake with %s failed: %s",
                      fd_peer(fd, pbuf, sizeof(pbuf)), strerror(errno));
            res = loomSystemError;
        }
    }
    loom_handshake_clear(&hs);
    return res;
}

loomResult_t loom_handshake_accept(int fd, const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                   uint64_t deadline_ns)
{
    return handshake_blocking(fd, secret, role, deadline_ns, 1);
}

loomResult_t loom_handshake_connect(int fd, const uint8_t secret[LOOM_SECRET_BYTES], uint32_t role,
                                    uint64_t deadline_ns)
{
    return handshake_blocking(fd, secret, role, deadline_ns, 0);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_env_parsers.c - libFuzzer harness for the parsers of configuration
 * text that comes from the environment or a launcher, each checked against a
 * small parser of the harness's own written from the documented syntax, and
 * what they accept written back out and parsed again: sizes (loom_parse_size,
 * every size tunable: digits after optional blanks and sign, an optional
 * k/m/g, then an optional b), LOOM_SECRET hex (loom_secret_parse_hex: exactly 32
 * hex digits), host:port addresses (loom_sockaddr_split, and
 * loom_sockaddr_parse when the host is numeric so that nothing is looked up
 * in DNS) and LOOM_SOCKET_IFNAME lists (loom_ifname_matches: name prefixes,
 * '^' excludes, '=' exact). LOOM_NET lists are parsed inside p2p.c and not
 * separable yet. Built by fuzz/run.sh with param.c, debug.c, log_line.c,
 * socket.c and bootstrap_wire.c.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "fuzz_check.h"
#include "param.h"
#include "socket.h"

FUZZ_LOOM_LOG_OFF() /* the code under test WARNs every refusal */

static int numeric_host(const char *host)
{
    unsigned char a[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

/* Sizes by the documented syntax: strtoll's number (blanks, a sign, decimal digits; in range),
 * not negative, then an optional binary multiplier [kKmMgG] with an optional [bB] after it, then
 * the end; the result must fit in int64. */
static int ref_size(const char *s, int64_t *out)
{
    const char *p = s;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    int neg = 0;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    if (*p < '0' || *p > '9')
        return -1;
    unsigned __int128 v = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((v = v * 10 + (unsigned)(*p - '0')) > (unsigned __int128)INT64_MAX + 1)
            return -1; /* strtoll: out of range */
    if (v > (unsigned __int128)INT64_MAX && !neg)
        return -1;
    if (neg && v != 0)
        return -1;
    int shift = 0;
    if (*p == 'k' || *p == 'K')
        shift = 10, p++;
    else if (*p == 'm' || *p == 'M')
        shift = 20, p++;
    else if (*p == 'g' || *p == 'G')
        shift = 30, p++;
    if (shift > 0 && (*p == 'b' || *p == 'B')) /* "4KB", but not "4B" */
        p++;
    if (*p != '\0' || (v << shift) > (unsigned __int128)INT64_MAX)
        return -1;
    *out = (int64_t)(v << shift);
    return 0;
}

static void fuzz_size(const char *text)
{
    int64_t v = -1, r = -2;
    const int rc = loom_parse_size(text, &v);
    REQUIRE(rc == ref_size(text, &r));
    if (rc == 0) {
        REQUIRE(v == r && v >= 0);
        char again[32]; /* written back in bytes, read back the same */
        snprintf(again, sizeof(again), "%" PRId64, v);
        int64_t back = -1;
        REQUIRE(loom_parse_size(again, &back) == 0 && back == v);
    }
}

static int hexval(char c)
{
    static const char digits[] = "0123456789abcdef0123456789ABCDEF";
    const char *at = c ? strchr(digits, c) : NULL;
    return at ? (int)((at - digits) % 16) : -1;
}

/* LOOM_SECRET: exactly 32 hex digits, either case; what is accepted is those 16 bytes. */
static void fuzz_secret(const char *text)
{
    uint8_t secret[LOOM_SECRET_BYTES], want[LOOM_SECRET_BYTES];
    char why[128] = "";
    const loomResult_t rc = loom_secret_parse_hex(text, secret, why, sizeof(why));
    int ok = strlen(text) == 2 * LOOM_SECRET_BYTES;
    for (int i = 0; ok && i < LOOM_SECRET_BYTES; i++) {
        const int hi = hexval(text[2 * i]), lo = hexval(text[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        want[i] = (uint8_t)(hi * 16 + lo);
    }
    REQUIRE((rc == loomSuccess) == ok);
    if (!ok) {
        REQUIRE(rc == loomInvalidArgument && why[0] != '\0');
        return;
    }
    REQUIRE(memcmp(secret, want, sizeof(want)) == 0);
    char again[2 * LOOM_SECRET_BYTES + 1]; /* written back in lower case, read back the same */
    for (int i = 0; i < LOOM_SECRET_BYTES; i++)
        snprintf(again + 2 * i, 3, "%02x", secret[i]);
    uint8_t back[LOOM_SECRET_BYTES];
    REQUIRE(loom_secret_parse_hex(again, back, why, sizeof(why)) == loomSuccess);
    REQUIRE(memcmp(back, secret, sizeof(back)) == 0);
}

/* LOOM_SOCKET_IFNAME by its documentation: a comma list of name prefixes; a leading '^'
 * excludes the listed names, and a '=' (after the optional '^') makes them exact. */
static int ref_ifname(const char *spec, const char *name)
{
    int exclude = 0, exact = 0, hit = 0;
    if (*spec == '^')
        exclude = 1, spec++;
    if (*spec == '=')
        exact = 1, spec++;
    char item[256];
    size_t k = 0;
    for (const char *p = spec;; p++) {
        if (*p != ',' && *p != '\0') {
            if (k < sizeof(item) - 1)
                item[k] = *p;
            k++;
            continue;
        }
        if (k > 0 && k < sizeof(item)) { /* an empty item names nothing */
            item[k] = '\0';
            hit |= exact ? strcmp(name, item) == 0 : strncmp(name, item, k) == 0;
        }
        k = 0;
        if (*p == '\0')
            break;
    }
    return exclude ? !hit : hit;
}

static void fuzz_addr(const char *text, size_t host_cap)
{
    /* An exact-size host buffer: a byte written past it is an ASan error. */
    char *host = malloc(host_cap);
    if (host == NULL)
        return;
    int port = -1;
    int rc = loom_sockaddr_split(text, host, host_cap, &port);
    if (rc == 0) {
        REQUIRE(port >= 0 && port <= 65535);
        REQUIRE(strlen(host) > 0 && strlen(host) < host_cap);
        /* The text ends with the port's 1 to 5 digits after a ':'. */
        const char *colon = strrchr(text, ':');
        REQUIRE(colon != NULL && strlen(colon + 1) >= 1 && strlen(colon + 1) <= 5);
        REQUIRE(strspn(colon + 1, "0123456789") == strlen(colon + 1) && atoi(colon + 1) == port);
        /* Written back out (brackets around a host with a colon), split back the same. */
        if (strpbrk(host, "[]") == NULL) {
            const size_t cap = strlen(host) + 16;
            char *again = malloc(cap), *host2 = malloc(host_cap);
            int port2 = -1;
            if (again != NULL && host2 != NULL) {
                snprintf(again, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
                REQUIRE(loom_sockaddr_split(again, host2, host_cap, &port2) == 0);
                REQUIRE(strcmp(host2, host) == 0 && port2 == port);
            }
            free(again);
            free(host2);
        }
        if (numeric_host(host)) {
            loom_sockaddr_t a;
            if (loom_sockaddr_parse(text, &a) == loomSuccess) {
                char buf[96];
                loom_sockaddr_str(&a, buf, sizeof(buf));
                REQUIRE(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6);
            }
        }
    } else {
        REQUIRE(rc == -1 || rc == -2);
    }
    free(host);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t mode = data[0], arg = data[1];
    char *text = malloc(size - 1);
    if (text == NULL)
        return 0;
    memcpy(text, data + 2, size - 2);
    text[size - 2] = '\0';
    switch (mode % 4) {
    case 0:
        fuzz_size(text);
        break;
    case 1:
        fuzz_secret(text);
        break;
    case 2:
        fuzz_addr(text, (size_t)arg + 1);
        break;
    default: {
        /* spec and interface name, split at the first '/' (which no name has) */
        char *slash = strchr(text, '/');
        const char *name = "eth0";
        if (slash != NULL) {
            *slash = '\0';
            name = slash + 1;
        }
        int hit = loom_ifname_matches(text, name);
        REQUIRE(hit == ref_ifname(text, name));
        break;
    }
    }
    free(text);
    return 0;
}

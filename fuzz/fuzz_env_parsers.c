/* SPDX-License-Identifier: Apache-2.0
 *
 * fuzz_env_parsers.c - libFuzzer harness for the parsers of configuration
 * text that comes from the environment or a launcher: sizes (loom_parse_size,
 * every size tunable), LOOM_SECRET hex (loom_secret_parse_hex), host:port
 * addresses (loom_sockaddr_split, and loom_sockaddr_parse when the host is
 * numeric so that nothing is looked up in DNS) and LOOM_SOCKET_IFNAME lists
 * (loom_ifname_matches). LOOM_NET lists are parsed inside p2p.c and not
 * separable yet. Built by fuzz/run.sh with param.c, debug.c, socket.c and
 * bootstrap_wire.c.
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_wire.h"
#include "param.h"
#include "socket.h"

#define REQUIRE(_cond)                                                                             \
    do {                                                                                           \
        if (!(_cond))                                                                              \
            __builtin_trap();                                                                      \
    } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("LOOM_DEBUG", "NONE", 1); /* the address parser WARNs every refusal */
    return 0;
}

static int numeric_host(const char *host)
{
    unsigned char a[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
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
    case 0: {
        int64_t v = -1;
        if (loom_parse_size(text, &v) == 0)
            REQUIRE(v >= 0);
        break;
    }
    case 1: {
        uint8_t secret[LOOM_SECRET_BYTES];
        char why[128];
        (void)loom_secret_parse_hex(text, secret, why, sizeof(why));
        break;
    }
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
        REQUIRE(hit == 0 || hit == 1);
        break;
    }
    }
    free(text);
    return 0;
}

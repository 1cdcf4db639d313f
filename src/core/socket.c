/* SPDX-License-Identifier: Apache-2.0
 *
 * socket.c - the TCP socket helpers of socket.h: address parsing, interface
 * choice from LOOM_SOCKET_IFNAME, non-blocking listen/connect/accept,
 * deadline-bounded full reads and writes built on poll(), and the refused-
 * connection log that keeps stray traffic from flooding the log.
 * It carries no protocol and keeps no state: framing lives in the transports,
 * authentication in secret.c. Callers: bootstrap.c, tcp/tcp.c, secret.c.
 */
#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "debug.h"
#include "param.h"
#include "timer.h"

// ---- addresses -------------------------------------------------------------

socklen_t loom_sockaddr_len(const loom_sockaddr_t *addr)
{
    return addr->sa.sa_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                          : (socklen_t)sizeof(struct sockaddr_in);
}

const char *loom_sockaddr_str(const loom_sockaddr_t *addr, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (addr->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &addr->sin6.sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, (unsigned)ntohs(addr->sin6.sin6_port));
    } else if (addr->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &addr->sin.sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(addr->sin.sin_port));
    } else {
        snprintf(buf, len, "<address family %d>", (int)addr->sa.sa_family);
    }
    return buf;
}

int loom_sockaddr_split(const char *text, char *host, size_t host_len, int *port_p)
{
    const char *port_s;
    size_t n;
    if (text == NULL || host == NULL || host_len == 0)
        return -1;
    if (text[0] == '[') {
        /* "[v6]:port": the brackets keep the address's colons apart from the port's. */
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':')
            return -1;
        n = (size_t)(close - text - 1);
        if (n >= host_len)
            return -1;
        memcpy(host, text + 1, n);
        port_s = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (colon == NULL)
            return -1;
        n = (size_t)(colon - text);
        if (n >= host_len)
            return -1;
        memcpy(host, text, n);
        port_s = colon + 1;
    }
    host[n] = '\0';
    if (n == 0)
        return -1;
    /* Digits only: strtol would also take spaces, signs and overflow quietly. */
    long port = 0;
    size_t digits = 0;
    for (const char *p = port_s; *p != '\0'; p++, digits++) {
        if (*p < '0' || *p > '9' || digits >= 5)
            return -2;
        port = port * 10 + (*p - '0');
    }
    if (digits == 0 || port > 65535)
        return -2;
    *port_p = (int)port;
    return 0;
}

loomResult_t loom_sockaddr_parse(const char *text, loom_sockaddr_t *addr_p)
{
    char host[256];
    int port = 0;
    if (text == NULL || text[0] == '\0') {
        LOOM_WARN("empty socket address");
        return loomInvalidArgument;
    }
    int rc = loom_sockaddr_split(text, host, sizeof(host), &port);
    if (rc == -2) {
        LOOM_WARN("socket address '%s' has an invalid port (expected 0 to 65535)", text);
        return loomInvalidArgument;
    }
    if (rc != 0) {
        LOOM_WARN("socket address '%s' is not %s", text,
                  text[0] == '[' ? "[ipv6]:port" : "host:port");
        return loomInvalidArgument;
    }

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        LOOM_WARN("cannot resolve host '%s' of socket address '%s': %s", host, text,
                  gai_strerror(rc));
        return loomInvalidArgument;
    }
    loom_sockaddr_t addr;
    memset(&addr, 0, sizeof(addr));
    const struct addrinfo *ai;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6)
            break;
    }
    if (ai == NULL) {
        freeaddrinfo(res);
        LOOM_WARN("host '%s' of socket address '%s' has no IPv4 or IPv6 address", host, text);
        return loomInvalidArgument;
    }
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(res);
    if (addr.sa.sa_family == AF_INET6)
        addr.sin6.sin6_port = htons((uint16_t)port);
    else
        addr.sin.sin_port = htons((uint16_t)port);
    *addr_p = addr;
    return loomSuccess;
}

// ---- interface choice ------------------------------------------------------

/* LOOM_SOCKET_IFNAME follows NCCL_SOCKET_IFNAME: a comma list of name
 * prefixes; a leading '^' turns the whole list into exclusions and a '='
 * (after the optional '^') makes the names exact. */
int loom_ifname_matches(const char *spec, const char *name)
{
    int exclude = 0, exact = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    int hit = 0;
    while (*spec != '\0' && !hit) {
        const char *comma = strchr(spec, ',');
        size_t n = comma ? (size_t)(comma - spec) : strlen(spec);
        if (n > 0) {
            if (exact)
                hit = strlen(name) == n && strncmp(name, spec, n) == 0;
            else
                hit = strncmp(name, spec, n) == 0;
        }
        spec += n + (comma ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

static int ifaddr_usable(const struct ifaddrs *ifa)
{
    if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP))
        return 0;
    if (ifa->ifa_addr->sa_family == AF_INET)
        return 1;
    if (ifa->ifa_addr->sa_family == AF_INET6) {
        /* Link-local addresses only work with the local scope id, which a
         * remote peer does not share. */
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ifa->ifa_addr;
        return !IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr);
    }
    return 0;
}

loomResult_t loom_socket_pick_addr(loom_sockaddr_t *addr_p, char *ifname, size_t ifname_len)
{
    const char *spec = loom_param_SOCKET_IFNAME();
    int have_spec = spec != NULL && spec[0] != '\0';
    struct ifaddrs *list = NULL;
    LOOM_SYSCHECK(getifaddrs(&list), "getifaddrs");

    const struct ifaddrs *pick = NULL;
    /* Pass 0: IPv4 before IPv6 on the same terms; pass 1 (default only): loopback. */
    for (int pass = 0; pass < (have_spec ? 1 : 2) && pick == NULL; pass++) {
        for (int fam = 0; fam < 2 && pick == NULL; fam++) {
            int want = fam == 0 ? AF_INET : AF_INET6;
            for (const struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
                if (!ifaddr_usable(ifa) || ifa->ifa_addr->sa_family != want)
                    continue;
                int loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
                if (have_spec ? !loom_ifname_matches(spec, ifa->ifa_name)
                              : (loopback != (pass == 1)))
                    continue;
                pick = ifa;
                break;
            }
        }
    }
    if (pick == NULL) {
        freeifaddrs(list);
        if (have_spec)
            LOOM_WARN("no interface that is up matches LOOM_SOCKET_IFNAME=%s", spec);
        else
            LOOM_WARN("no network interface that is up has an IPv4 or IPv6 address");
        return loomSystemError;
    }
    loom_sockaddr_t addr;
    memset(&addr, 0, sizeof(addr));
    if (pick->ifa_addr->sa_family == AF_INET6)
        memcpy(&addr.sin6, pick->ifa_addr, sizeof(addr.sin6));
    else
        memcpy(&addr.sin, pick->ifa_addr, sizeof(addr.sin));
    if (ifname != NULL && ifname_len > 0)
        snprintf(ifname, ifname_len, "%s", pick->ifa_name);
    char buf[96];
    LOOM_INFO(LOOM_LOG_TCP | LOOM_LOG_BOOTSTRAP, "using interface %s address %s", pick->ifa_name,
              loom_sockaddr_str(&addr, buf, sizeof(buf)));
    freeifaddrs(list);
    *addr_p = addr;
    return loomSuccess;
}

// ---- listen, connect, accept ----------------------------------------------

loomResult_t loom_socket_listen(loom_sockaddr_t *addr, int *fd_p)
{
    char buf[96];
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        LOOM_WARN("socket for listening on %s failed: %s",
                  loom_sockaddr_str(addr, buf, sizeof(buf)), strerror(errno));
        return loomSystemError;
    }
    int one = 1;
    loom_sockaddr_t bound = *addr;
    socklen_t blen = sizeof(bound);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, &addr->sa, loom_sockaddr_len(addr)) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, &bound.sa, &blen) != 0) {
        int e = errno;
        close(fd);
        LOOM_WARN("listening on %s failed: %s", loom_sockaddr_str(addr, buf, sizeof(buf)),
                  strerror(e));
        return loomSystemError;
    }
    *addr = bound;
    *fd_p = fd;
    return loomSuccess;
}

loomResult_t loom_socket_connect_start(const loom_sockaddr_t *addr, int *fd_p)
{
    char buf[96];
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        LOOM_WARN("socket for connecting to %s failed: %s",
                  loom_sockaddr_str(addr, buf, sizeof(buf)), strerror(errno));
        return loomSystemError;
    }
    int rc;
    do {
        rc = connect(fd, &addr->sa, loom_sockaddr_len(addr));
    } while (rc != 0 && errno == EINTR);
    /* A refusal can be reported at once on loopback. The socket is then left
     * unconnected, and loom_socket_connect_poll reports ECONNREFUSED for it,
     * so that callers retry through one path. */
    if (rc != 0 && errno != EINPROGRESS && errno != ECONNREFUSED) {
        int e = errno;
        close(fd);
        LOOM_WARN("connecting to %s failed: %s", loom_sockaddr_str(addr, buf, sizeof(buf)),
                  strerror(e));
        return loomSystemError;
    }
    *fd_p = fd;
    return loomSuccess;
}

loomResult_t loom_socket_connect_poll(int fd, int *done_p, int *errno_p)
{
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int rc;
    do {
        rc = poll(&pfd, 1, 0);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        LOOM_WARN("poll of a connecting socket failed: %s", strerror(errno));
        return loomSystemError;
    }
    if (rc == 0) {
        *done_p = 0;
        return loomSuccess;
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) {
        LOOM_WARN("getsockopt(SO_ERROR) of a connecting socket failed: %s", strerror(errno));
        return loomSystemError;
    }
    if (err == 0) {
        /* Ready without a pending error but not connected: the connect failed
         * inside connect() itself (see loom_socket_connect_start). */
        loom_sockaddr_t peer;
        socklen_t plen = sizeof(peer);
        if (getpeername(fd, &peer.sa, &plen) != 0)
            err = errno == ENOTCONN ? ECONNREFUSED : errno;
    }
    if (err != 0) {
        *errno_p = err;
        return loomSystemError;
    }
    *done_p = 1;
    return loomSuccess;
}

loomResult_t loom_socket_accept(int listen_fd, int *fd_p)
{
    int fd;
    do {
        fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        /* A connection that died in the backlog is not this side's failure. */
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) {
            *fd_p = -1;
            return loomSuccess;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            *fd_p = -1;
            return loomInProgress;
        }
        LOOM_WARN("accept on listening socket %d failed: %s", listen_fd, strerror(errno));
        return loomSystemError;
    }
    *fd_p = fd;
    return loomSuccess;
}

loomResult_t loom_socket_tune(int fd, int64_t sockbuf_bytes)
{
    int one = 1;
    int flags;
    LOOM_SYSCHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)),
                  "setsockopt(TCP_NODELAY)");
    LOOM_SYSCHECK(fcntl(fd, F_SETFD, FD_CLOEXEC), "fcntl(FD_CLOEXEC)");
    LOOM_SYSCHECK(flags = fcntl(fd, F_GETFL), "fcntl(F_GETFL)");
    LOOM_SYSCHECK(fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(O_NONBLOCK)");
    if (sockbuf_bytes > 0) {
        int sz = sockbuf_bytes > (1 << 30) ? (1 << 30) : (int)sockbuf_bytes;
        LOOM_SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)),
                      "setsockopt(SO_SNDBUF)");
        LOOM_SYSCHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)),
                      "setsockopt(SO_RCVBUF)");
    }
    return loomSuccess;
}

// ---- data ------------------------------------------------------------------

/* *_some do not WARN when the peer is gone: their callers know which rank is
 * on the other end and say so. Any other failure is WARNed here. */
static int peer_gone(int e)
{
    return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ETIMEDOUT ||
           e == EHOSTUNREACH || e == ENETUNREACH || e == ENOTCONN;
}

/* One non-blocking send or recv. *gone_errno_p gets the cause when the peer
 * is gone (0: orderly close). */
static loomResult_t xfer_some(int fd, void *buf, size_t len, int sending, size_t *nbytes_p,
                              int *gone_errno_p)
{
    if (len == 0) {
        *nbytes_p = 0;
        return loomSuccess;
    }
    ssize_t n;
    do {
        n = sending ? send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, buf, len, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n == 0 && !sending) {
        *gone_errno_p = 0;
        return loomRemoteError;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *nbytes_p = 0;
            return loomSuccess;
        }
        if (peer_gone(errno)) {
            *gone_errno_p = errno;
            return loomRemoteError;
        }
        LOOM_WARN("%s of %zu bytes on socket %d failed: %s", sending ? "send" : "recv", len, fd,
                  strerror(errno));
        return loomSystemError;
    }
    *nbytes_p = (size_t)n;
    return loomSuccess;
}

loomResult_t loom_socket_send_some(int fd, const void *buf, size_t len, size_t *nbytes_p)
{
    int gone = 0;
    return xfer_some(fd, (void *)buf, len, 1, nbytes_p, &gone);
}

loomResult_t loom_socket_recv_some(int fd, void *buf, size_t len, size_t *nbytes_p)
{
    int gone = 0;
    return xfer_some(fd, buf, len, 0, nbytes_p, &gone);
}

const char *loom_socket_peer_str(int fd, char *buf, size_t len)
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

loomResult_t loom_pollset_add(loom_pollset_t *ps, int fd, short events)
{
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 64;
        struct pollfd *p = realloc(ps->fds, cap * sizeof(*p));
        if (p == NULL) {
            LOOM_WARN("out of memory for %zu poll entries", cap);
            return loomSystemError;
        }
        ps->fds = p;
        ps->cap = cap;
    }
    ps->fds[ps->n++] = (struct pollfd){.fd = fd, .events = events, .revents = 0};
    return loomSuccess;
}

/* Waits for fd to become ready for events before deadline_ns: 1 ready, 0 timed out. */
static loomResult_t wait_ready(int fd, short events, uint64_t deadline_ns, int *ready_p)
{
    for (;;) {
        uint64_t now = loom_now_ns();
        if (now >= deadline_ns) {
            *ready_p = 0;
            return loomSuccess;
        }
        uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, left_ms > 60000 ? 60000 : (int)left_ms);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0) {
            LOOM_WARN("poll on socket %d failed: %s", fd, strerror(errno));
            return loomSystemError;
        }
        if (rc > 0) {
            *ready_p = 1;
            return loomSuccess;
        }
    }
}

static loomResult_t xfer_all(int fd, char *buf, size_t len, uint64_t deadline_ns, int sending)
{
    const char *what = sending ? "send" : "receive";
    size_t done = 0;
    char pbuf[96];
    while (done < len) {
        size_t n = 0;
        int gone = 0;
        loomResult_t res = xfer_some(fd, buf + done, len - done, sending, &n, &gone);
        if (res == loomRemoteError) {
            LOOM_WARN("%s of %zu bytes %s %s failed after %zu bytes: %s", what, len,
                      sending ? "to" : "from", loom_socket_peer_str(fd, pbuf, sizeof(pbuf)), done,
                      gone != 0 ? strerror(gone) : "connection closed by peer");
            return res;
        }
        if (res != loomSuccess)
            return res;
        done += n;
        if (n == 0) {
            int ready = 0;
            LOOM_CHECK(wait_ready(fd, sending ? POLLOUT : POLLIN, deadline_ns, &ready));
            if (!ready) {
                LOOM_WARN("%s of %zu bytes %s %s timed out after %zu bytes", what, len,
                          sending ? "to" : "from", loom_socket_peer_str(fd, pbuf, sizeof(pbuf)),
                          done);
                return loomTimeout;
            }
        }
    }
    return loomSuccess;
}

loomResult_t loom_socket_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    return xfer_all(fd, (char *)buf, len, deadline_ns, 1);
}

loomResult_t loom_socket_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    return xfer_all(fd, (char *)buf, len, deadline_ns, 0);
}

// ---- refused connections ---------------------------------------------------

void loom_stray_init(loom_stray_log_t *log, const char *who, uint32_t subsys)
{
    memset(log, 0, sizeof(*log));
    snprintf(log->who, sizeof(log->who), "%s", who);
    log->subsys = subsys;
}

void loom_stray_note_at(loom_stray_log_t *log, const char *file, int line, const char *why)
{
    log->count++;
    if (log->count == 1)
        loom_log(LOOM_LOG_WARN, LOOM_LOG_ALL, file, line,
                 "%s: %s (later refusals are logged at INFO and counted)", log->who, why);
    else
        loom_log(LOOM_LOG_INFO, log->subsys, file, line, "%s: %s (refusal %llu)", log->who, why,
                 (unsigned long long)log->count);
}

void loom_stray_refuse_at(loom_stray_log_t *log, const char *file, int line, int fd, int nproven)
{
    char peer[96], why[192];
    snprintf(why, sizeof(why), "refused a connection from %s: %d proven connections are pending",
             loom_socket_peer_str(fd, peer, sizeof(peer)), nproven);
    loom_stray_note_at(log, file, line, why);
    close(fd);
}

void loom_stray_summary(loom_stray_log_t *log)
{
    if (log->count > 1)
        LOOM_WARN("%s: refused %llu connections in all that did not prove the job secret (stray "
                  "or hostile traffic on its port)",
                  log->who, (unsigned long long)log->count);
    log->count = 0;
}

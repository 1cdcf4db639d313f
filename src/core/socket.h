/* SPDX-License-Identifier: Apache-2.0
 *
 * socket.h - TCP socket helpers shared by the bootstrap and the tcp transport:
 * address parsing and formatting, interface choice (LOOM_SOCKET_IFNAME),
 * non-blocking listen/connect/accept, and deadline-bounded full reads and
 * writes. No protocol lives here.
 */
#ifndef LOOM_SOCKET_H
#define LOOM_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "loom.h"

/* An IPv4 or IPv6 address with port, as stored in unique ids and handles. */
typedef union {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
} loom_sockaddr_t;

/* "host:port" or "[v6]:port"; host may be a name. */
loomResult_t loom_sockaddr_parse(const char *text, loom_sockaddr_t *addr_p);
/* Writes "ip:port" into buf (>= 64 bytes). Returns buf. */
const char *loom_sockaddr_str(const loom_sockaddr_t *addr, char *buf, size_t len);
socklen_t loom_sockaddr_len(const loom_sockaddr_t *addr);

/* The address (port 0) of the interface to use, from LOOM_SOCKET_IFNAME, else
 * the first non-loopback interface that is up, else loopback. *ifname_p gets
 * its name (>= 64 bytes). */
loomResult_t loom_socket_pick_addr(loom_sockaddr_t *addr_p, char *ifname, size_t ifname_len);

/* Creates a non-blocking listening socket bound to *addr (port 0 = any);
 * updates addr with the bound port. */
loomResult_t loom_socket_listen(loom_sockaddr_t *addr, int *fd_p);
/* Starts a non-blocking connect; *fd_p is valid even if the connection is
 * still in progress. */
loomResult_t loom_socket_connect_start(const loom_sockaddr_t *addr, int *fd_p);
/* *done_p = 1 when the connect finished (0 while in progress); an error
 * (e.g. ECONNREFUSED) returns SystemError with *errno_p set and no WARN, so
 * that callers may retry. */
loomResult_t loom_socket_connect_poll(int fd, int *done_p, int *errno_p);
/* Non-blocking accept: *fd_p = -1 if nothing is pending. */
loomResult_t loom_socket_accept(int listen_fd, int *fd_p);

/* Sets TCP_NODELAY, close-on-exec, non-blocking, and buffer sizes when > 0. */
loomResult_t loom_socket_tune(int fd, int64_t sockbuf_bytes);

/* Reads/writes exactly len bytes before deadline_ns (loom_now_ns clock).
 * Errors: RemoteError (peer closed or reset), Timeout, SystemError. */
loomResult_t loom_socket_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
loomResult_t loom_socket_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns);
/* One non-blocking attempt: *nbytes_p = bytes moved (0 if it would block).
 * Peer closed gives RemoteError. */
loomResult_t loom_socket_send_some(int fd, const void *buf, size_t len, size_t *nbytes_p);
loomResult_t loom_socket_recv_some(int fd, void *buf, size_t len, size_t *nbytes_p);

#endif

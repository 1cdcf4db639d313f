/* SPDX-License-Identifier: Apache-2.0
 *
 * socket.h - TCP socket helpers shared by the bootstrap and the transports:
 * address parsing and formatting, interface choice (LOOM_SOCKET_IFNAME),
 * non-blocking listen/connect/accept, deadline-bounded full reads and
 * writes, a growing poll() array, and the rate-limited log of refused
 * connections that every listener uses. No protocol lives here.
 */
#ifndef LOOM_SOCKET_H
#define LOOM_SOCKET_H

#include <netinet/in.h>
#include <poll.h>
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

/* "host:port" or "[v6]:port"; host may be a name (resolved with getaddrinfo). */
loomResult_t loom_sockaddr_parse(const char *text, loom_sockaddr_t *addr_p);
/* The syntax half of loom_sockaddr_parse, pure (no resolution, no logging):
 * copies the host part (without brackets) into host and the port into
 * *port_p. Returns 0, -1 when text is not host:port or [v6]:port (or the
 * host is empty or longer than host_len - 1), -2 when the port is not a
 * decimal number in [0, 65535]. */
int loom_sockaddr_split(const char *text, char *host, size_t host_len, int *port_p);
/* Writes "ip:port" into buf (>= 64 bytes). Returns buf. */
const char *loom_sockaddr_str(const loom_sockaddr_t *addr, char *buf, size_t len);
socklen_t loom_sockaddr_len(const loom_sockaddr_t *addr);

/* LOOM_SOCKET_IFNAME matching, pure: 1 if interface name passes spec, a comma
 * list of name prefixes; a leading '^' excludes the listed names and a '='
 * (after the optional '^') makes them exact. */
int loom_ifname_matches(const char *spec, const char *name);

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
/* Non-blocking accept: *fd_p = -1 if nothing is pending. When the process or
 * system is out of descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM)
 * it returns InProgress with *fd_p = -1 and logs nothing: the connection
 * stays queued, and the caller frees a descriptor or backs off (and logs). */
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
/* "ip:port" of fd's peer into buf, or "socket N" when it has none. Returns buf. */
const char *loom_socket_peer_str(int fd, char *buf, size_t len);

/* A growing poll() array, rebuilt (n = 0) before every wait. */
typedef struct {
    struct pollfd *fds;
    size_t n;   /* entries in use */
    size_t cap; /* entries allocated */
} loom_pollset_t;

/* Appends one entry (grows the array). */
loomResult_t loom_pollset_add(loom_pollset_t *ps, int fd, short events);

/* Connections a listener refused before they proved the job secret (scanners,
 * health checks, other jobs, attacks), logged so that a flood of them cannot
 * flood the log: the first refusal is a WARN, later ones are INFO lines under
 * `subsys`, and loom_stray_summary WARNs the total once if there was more than
 * one. One per listener, used by one thread at a time. */
typedef struct {
    char who[64];    /* who refuses: "bootstrap root", "tcp: rank 3" */
    uint32_t subsys; /* LOOM_LOG_* of the INFO lines */
    uint64_t count;  /* refusals so far */
} loom_stray_log_t;

void loom_stray_init(loom_stray_log_t *log, const char *who, uint32_t subsys);
/* Logs one refusal; why names the peer and the cause. The macro gives the
 * log line the caller's file and line. */
void loom_stray_note_at(loom_stray_log_t *log, const char *file, int line, const char *why);
#define LOOM_STRAY_NOTE(_log, _why) loom_stray_note_at((_log), __FILE__, __LINE__, (_why))
/* Closes fd, accepted while the listener is full of nproven connections that
 * all proved the secret (none to evict), and logs the refusal. */
void loom_stray_refuse_at(loom_stray_log_t *log, const char *file, int line, int fd, int nproven);
#define LOOM_STRAY_REFUSE(_log, _fd, _nproven)                                                     \
    loom_stray_refuse_at((_log), __FILE__, __LINE__, (_fd), (_nproven))
/* WARNs the count when more than one refusal was noted; then counts anew. */
void loom_stray_summary(loom_stray_log_t *log);

#endif

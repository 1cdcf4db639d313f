/* SPDX-License-Identifier: Apache-2.0
 *
 * tcp_bw.c - the TCP loopback limit that TCP collectives run into: throughput
 * of one connected socket pair on 127.0.0.1, one direction, then both
 * directions at once. Each end is one thread pinned to its own CPU (as loomrun
 * deals ranks) that drives its socket with non-blocking send/recv and poll(),
 * as a rank without a progress thread does; socket buffers are left to the
 * kernel's autotuning unless -B sets them, as loom's LOOM_TCP_SOCKBUF (0 by
 * default) does. It measures nothing of loom; bench/compare runs
 * it next to the collectives. Every wait is bounded (30 s without progress).
 * Usage: tcp_bw [-s BYTES] [-c CHUNK] [-B SOCKBUF] [-r REPS] [-J FILE]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STALL_MS 30000
#define MAX_REPS 1000

typedef struct end {
    pthread_t tid;
    int fd, cpu;
    size_t to_send, to_recv; /* this repetition's bytes */
    char *sbuf, *rbuf;
    int failed;
} end_t;

static struct {
    size_t bytes, chunk, sockbuf;
    int reps;
    pthread_barrier_t start, done;
} g = {.bytes = 1u << 30, .chunk = 1u << 20, .sockbuf = 0, .reps = 3};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "tcp_bw: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void set_opts(int fd)
{
    int one = 1, buf = (int)g.sockbuf;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
        die("TCP_NODELAY");
    if (buf && (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf)) ||
                setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf))))
        die("SO_SNDBUF/SO_RCVBUF");
}

/* A connected pair on 127.0.0.1; the listener is closed once accepted. */
static void socket_pair(int *a_p, int *b_p)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&addr, &len))
        die("listen on 127.0.0.1");
    int a = socket(AF_INET, SOCK_STREAM, 0);
    if (a < 0)
        die("socket");
    set_opts(a); /* before connect, so the window scale fits the buffers */
    if (connect(a, (struct sockaddr *)&addr, sizeof(addr)))
        die("connect");
    int b = accept(lfd, NULL, NULL);
    if (b < 0)
        die("accept");
    set_opts(b);
    close(lfd);
    *a_p = a;
    *b_p = b;
}

/* Moves to_send and to_recv bytes through one non-blocking socket. */
static int pump(end_t *e)
{
    size_t sent = 0, got = 0;
    while (sent < e->to_send || got < e->to_recv) {
        struct pollfd p = {
            .fd = e->fd,
            .events = (short)((sent < e->to_send ? POLLOUT : 0) | (got < e->to_recv ? POLLIN : 0))};
        int n = poll(&p, 1, STALL_MS);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "tcp_bw: cpu %d: %s after %zu of %zu bytes sent, %zu of %zu received\n",
                    e->cpu, n ? strerror(errno) : "no progress for 30 s", sent, e->to_send, got,
                    e->to_recv);
            return -1;
        }
        if ((p.revents & (POLLOUT | POLLERR | POLLHUP)) && sent < e->to_send) {
            size_t left = e->to_send - sent;
            ssize_t w = send(e->fd, e->sbuf, left < g.chunk ? left : g.chunk, MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN && errno != EINTR) {
                fprintf(stderr, "tcp_bw: send: %s\n", strerror(errno));
                return -1;
            }
            sent += w > 0 ? (size_t)w : 0;
        }
        if ((p.revents & (POLLIN | POLLERR | POLLHUP)) && got < e->to_recv) {
            size_t left = e->to_recv - got;
            ssize_t r = recv(e->fd, e->rbuf, left < g.chunk ? left : g.chunk, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                fprintf(stderr, "tcp_bw: recv: %s\n", r ? strerror(errno) : "peer closed");
                return -1;
            }
            got += r > 0 ? (size_t)r : 0;
        }
    }
    return 0;
}

static void *work(void *arg)
{
    end_t *e = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(e->cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    for (int r = 0; r < g.reps; r++) {
        pthread_barrier_wait(&g.start);
        if (!e->failed && pump(e))
            e->failed = 1;
        pthread_barrier_wait(&g.done);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One mode: both = 0 sends a -> b only; both = 1 sends each way at once.
 * Writes the median and best GB/s of the bytes that crossed in all directions. */
static int measure(end_t *ends, int both, double *median_p, double *best_p)
{
    double secs[MAX_REPS];
    ends[0].to_send = g.bytes;
    ends[0].to_recv = both ? g.bytes : 0;
    ends[1].to_send = both ? g.bytes : 0;
    ends[1].to_recv = g.bytes;
    if (pthread_barrier_init(&g.start, NULL, 3) || pthread_barrier_init(&g.done, NULL, 3))
        die("pthread_barrier_init");
    for (int i = 0; i < 2; i++)
        if ((errno = pthread_create(&ends[i].tid, NULL, work, &ends[i])))
            die("pthread_create");
    for (int r = 0; r < g.reps; r++) {
        pthread_barrier_wait(&g.start);
        double t0 = now_s();
        pthread_barrier_wait(&g.done);
        secs[r] = now_s() - t0;
    }
    for (int i = 0; i < 2; i++)
        pthread_join(ends[i].tid, NULL);
    pthread_barrier_destroy(&g.start);
    pthread_barrier_destroy(&g.done);
    if (ends[0].failed || ends[1].failed)
        return -1;
    qsort(secs, (size_t)g.reps, sizeof(double), cmp_double);
    double bytes = (double)g.bytes * (both ? 2 : 1);
    double mid = g.reps % 2 ? secs[g.reps / 2] : (secs[g.reps / 2 - 1] + secs[g.reps / 2]) / 2;
    *median_p = bytes / mid / 1e9;
    *best_p = bytes / secs[0] / 1e9;
    return 0;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double mult = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1;
    if (end == s || (mult > 1 && end[1]) || (mult == 1 && *end) || v < 0 || v * mult > 1e13) {
        fprintf(stderr, "tcp_bw: bad size '%s' (bytes, optional K, M or G)\n", s);
        exit(2);
    }
    return (size_t)(v * mult);
}

int main(int argc, char **argv)
{
    const char *json_path = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!v) {
            fprintf(stderr, "usage: tcp_bw [-s BYTES] [-c CHUNK] [-B SOCKBUF] [-r REPS] [-J "
                            "FILE]\n");
            return 2;
        }
        if (!strcmp(a, "-s"))
            g.bytes = parse_size(v);
        else if (!strcmp(a, "-c"))
            g.chunk = parse_size(v);
        else if (!strcmp(a, "-B"))
            g.sockbuf = parse_size(v);
        else if (!strcmp(a, "-r"))
            g.reps = atoi(v);
        else if (!strcmp(a, "-J"))
            json_path = v;
        else {
            fprintf(stderr, "tcp_bw: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (g.reps < 1 || g.reps > MAX_REPS || g.chunk < 1 || g.bytes < 1 || g.sockbuf > 1u << 30) {
        fprintf(stderr, "tcp_bw: -r wants 1 to %d, -s and -c at least 1 byte, -B at most 1G\n",
                MAX_REPS);
        return 2;
    }
    cpu_set_t set;
    int cpus[2], n = 0;
    if (sched_getaffinity(0, sizeof(set), &set))
        die("sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    if (n == 1)
        cpus[1] = cpus[0];

    end_t ends[2] = {{.cpu = cpus[0]}, {.cpu = cpus[1]}};
    socket_pair(&ends[0].fd, &ends[1].fd);
    for (int i = 0; i < 2; i++)
        if (!(ends[i].sbuf = calloc(1, g.chunk)) || !(ends[i].rbuf = malloc(g.chunk)))
            die("malloc");

    double one_med, one_best, both_med, both_best;
    if (measure(ends, 0, &one_med, &one_best) || measure(ends, 1, &both_med, &both_best))
        return 1;
    printf("# tcp loopback, one socket pair, cpus %d and %d, %zu bytes per direction, chunk %zu, "
           "sockbuf %zu, %d repetitions\n",
           cpus[0], cpus[1], g.bytes, g.chunk, g.sockbuf, g.reps);
    printf("# direction       median GB/s  best GB/s  (both: sum of the two directions)\n");
    printf("  one way         %11.2f  %9.2f\n", one_med, one_best);
    printf("  both ways       %11.2f  %9.2f\n", both_med, both_best);
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f)
            die(json_path);
        fprintf(f,
                "{\"bytes_per_direction\":%zu,\"chunk\":%zu,\"sockbuf\":%zu,\"reps\":%d,"
                "\"one_way\":{\"median_gbps\":%.3f,\"best_gbps\":%.3f},"
                "\"both_ways\":{\"median_gbps\":%.3f,\"best_gbps\":%.3f}}\n",
                g.bytes, g.chunk, g.sockbuf, g.reps, one_med, one_best, both_med, both_best);
        fclose(f);
    }
    for (int i = 0; i < 2; i++) {
        close(ends[i].fd);
        free(ends[i].sbuf);
        free(ends[i].rbuf);
    }
    return 0;
}

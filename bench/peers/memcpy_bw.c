/* SPDX-License-Identifier: Apache-2.0
 *
 * memcpy_bw.c - the memory-copy limit that shared-memory collectives run
 * into: memcpy bandwidth of 1 and 2 threads, each pinned to its own CPU (as
 * loomrun deals ranks) and copying its own SIZE-byte buffer. It reports bytes
 * copied per second (each byte is read once and written once), the median and
 * the best of the repetitions, on stdout and optionally as JSON. Each worker
 * reads the clock around its own copy and a repetition lasts from the first
 * worker's start to the last one's end: a timer in the main thread, which the
 * busy workers keep off every CPU until they are done, started its clock late
 * and reported up to four times the real rate with 2 threads on 2 CPUs. It
 * measures nothing of loom; bench/compare runs it next to the collectives.
 * Usage: memcpy_bw [-s SIZE] [-t THREADS,...] [-r REPS] [-J FILE]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64
#define MAX_REPS    1000

typedef struct worker {
    pthread_t tid;
    int cpu;
    char *src, *dst;
    double start[MAX_REPS], end[MAX_REPS]; /* this worker's copy of each repetition */
} worker_t;

static struct {
    size_t bytes;
    int reps;
    pthread_barrier_t start, done;
} g = {.bytes = 128u << 20, .reps = 5};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "memcpy_bw: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* The CPUs this process may use, in order; worker i runs on cpus[i mod n]. */
static int affinity_cpus(int *cpus, int max)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof(set), &set))
        die("sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

static void *work(void *arg)
{
    worker_t *w = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(w->cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    /* Touch the pages on this CPU first, and copy once untimed. */
    memset(w->src, 1, g.bytes);
    memset(w->dst, 2, g.bytes);
    memcpy(w->dst, w->src, g.bytes);
    for (int r = 0; r < g.reps; r++) {
        pthread_barrier_wait(&g.start);
        w->start[r] = now_s();
        memcpy(w->dst, w->src, g.bytes);
        w->end[r] = now_s();
        pthread_barrier_wait(&g.done);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs `nthreads` copiers; writes the median and best GB/s. */
static void measure(int nthreads, const int *cpus, int ncpus, double *median_p, double *best_p)
{
    static worker_t w[MAX_THREADS];
    double secs[MAX_REPS];
    if (pthread_barrier_init(&g.start, NULL, (unsigned)nthreads + 1) ||
        pthread_barrier_init(&g.done, NULL, (unsigned)nthreads + 1))
        die("pthread_barrier_init");
    for (int i = 0; i < nthreads; i++) {
        w[i].cpu = cpus[i % ncpus];
        w[i].src = malloc(g.bytes);
        w[i].dst = malloc(g.bytes);
        if (!w[i].src || !w[i].dst)
            die("malloc");
        if ((errno = pthread_create(&w[i].tid, NULL, work, &w[i])))
            die("pthread_create");
    }
    for (int r = 0; r < g.reps; r++) {
        pthread_barrier_wait(&g.start);
        pthread_barrier_wait(&g.done);
    }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].tid, NULL);
        free(w[i].src);
        free(w[i].dst);
    }
    for (int r = 0; r < g.reps; r++) {
        double first = w[0].start[r], last = w[0].end[r];
        for (int i = 1; i < nthreads; i++) {
            first = w[i].start[r] < first ? w[i].start[r] : first;
            last = w[i].end[r] > last ? w[i].end[r] : last;
        }
        secs[r] = last - first;
    }
    pthread_barrier_destroy(&g.start);
    pthread_barrier_destroy(&g.done);
    qsort(secs, (size_t)g.reps, sizeof(double), cmp_double);
    double bytes = (double)g.bytes * nthreads;
    double mid = g.reps % 2 ? secs[g.reps / 2] : (secs[g.reps / 2 - 1] + secs[g.reps / 2]) / 2;
    *median_p = bytes / mid / 1e9;
    *best_p = bytes / secs[0] / 1e9;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double mult = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1;
    if (end == s || (mult > 1 && end[1]) || (mult == 1 && *end) || v < 1 || v * mult > 1e12) {
        fprintf(stderr, "memcpy_bw: bad size '%s' (bytes, optional K, M or G)\n", s);
        exit(2);
    }
    return (size_t)(v * mult);
}

int main(int argc, char **argv)
{
    const char *threads = "1,2", *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: memcpy_bw [-s SIZE] [-t THREADS,...] [-r REPS] [-J FILE]\n");
            return 2;
        }
        if (!strcmp(a, "-s"))
            g.bytes = parse_size(v);
        else if (!strcmp(a, "-t"))
            threads = v;
        else if (!strcmp(a, "-r"))
            g.reps = atoi(v);
        else if (!strcmp(a, "-J"))
            json_path = v;
        else {
            fprintf(stderr, "memcpy_bw: unknown option '%s'\n", a);
            return 2;
        }
        i++;
    }
    if (g.reps < 1 || g.reps > MAX_REPS) {
        fprintf(stderr, "memcpy_bw: -r wants 1 to %d repetitions\n", MAX_REPS);
        return 2;
    }
    int cpus[MAX_THREADS];
    int ncpus = affinity_cpus(cpus, MAX_THREADS);
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json)
        die(json_path);
    if (json)
        fprintf(json, "{\"bytes_per_thread\":%zu,\"reps\":%d,\"results\":[", g.bytes, g.reps);
    printf("# memcpy bandwidth, %zu bytes per thread, %d repetitions, %d cpus\n", g.bytes, g.reps,
           ncpus);
    printf("# threads  median GB/s  best GB/s\n");
    int first = 1;
    for (const char *p = threads; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || n > MAX_THREADS || (*end && *end != ',')) {
            fprintf(stderr, "memcpy_bw: -t wants thread counts from 1 to %d, e.g. 1,2\n",
                    MAX_THREADS);
            return 2;
        }
        double median, best;
        measure((int)n, cpus, ncpus, &median, &best);
        printf("%9ld  %11.2f  %9.2f\n", n, median, best);
        if (json)
            fprintf(json, "%s{\"threads\":%ld,\"median_gbps\":%.3f,\"best_gbps\":%.3f}",
                    first ? "" : ",", n, median, best);
        first = 0;
        p = *end ? end + 1 : end;
    }
    if (json) {
        fprintf(json, "]}\n");
        fclose(json);
    }
    return 0;
}

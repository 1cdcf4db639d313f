/* SPDX-License-Identifier: Apache-2.0
 *
 * micro.c - the shared helpers of micro.h.
 */
#include "micro.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Noreturn void micro_die(const char *prog, const char *what, const char *hint)
{
    fprintf(stderr, "%s: %s\nHINT: %s\n", prog, what, hint);
    exit(2);
}

size_t micro_parse_size(const char *prog, const char *s)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        micro_die(prog, "bad size", "sizes look like 4096, 8K or 64M");
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end != '\0' || v == 0)
        micro_die(prog, "bad size", "sizes look like 4096, 8K or 64M");
    return (size_t)v;
}

void micro_each(char *list, void *ctx, void (*one)(void *ctx, const char *token))
{
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save))
        one(ctx, tok);
}

/* CPU time of this thread, not wall time: on a shared machine the time the
 * thread spends descheduled would otherwise count as the kernel's. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double micro_best_gbps(double bytes, double min_ms, void (*run)(const void *arg), const void *arg)
{
    long batch = 1;
    for (;;) {
        double t0 = cpu_ms();
        for (long k = 0; k < batch; k++)
            run(arg);
        if (cpu_ms() - t0 >= 1.0 || batch >= (1L << 24))
            break;
        batch *= 2;
    }
    double best = 0;
    for (int trial = 0; trial < 5; trial++) {
        long iters = 0;
        double t0 = cpu_ms(), t;
        do {
            for (long k = 0; k < batch; k++)
                run(arg);
            iters += batch;
            t = cpu_ms() - t0;
        } while (t < min_ms);
        double gbps = bytes * (double)iters / (t * 1e6);
        best = gbps > best ? gbps : best;
    }
    return best;
}

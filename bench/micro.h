/* SPDX-License-Identifier: Apache-2.0
 *
 * micro.h - what the single-thread kernel benchmarks (kernels_perf, q4_perf)
 * share: failing with a hint, size and list parsing, and the timing loop
 * (the best of five trials, on the thread's CPU time).
 */
#ifndef LOOM_BENCH_MICRO_H
#define LOOM_BENCH_MICRO_H

#include <stddef.h>

/* Prints "PROG: what" and a hint to stderr and exits 2. */
_Noreturn void micro_die(const char *prog, const char *what, const char *hint);
/* "4096", "8K" or "64M" in bytes; dies on anything else (or 0). */
size_t micro_parse_size(const char *prog, const char *s);
/* Splits a comma list in place and calls one(ctx, token) for each. */
void micro_each(char *list, void *ctx, void (*one)(void *ctx, const char *token));
/* Best GB/s of `bytes` per call of run(arg) over five trials of at least
 * min_ms of this thread's CPU time each. The clock is read once per batch of
 * calls sized to take about a millisecond: reading the thread's CPU time is a
 * system call, as long as an L1-sized call itself. */
double micro_best_gbps(double bytes, double min_ms, void (*run)(const void *arg), const void *arg);

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * options.h - the benchmarks' flags, as parsed by options.c and read by the
 * driver in common.c. Not used by the per-collective files.
 */
#ifndef LOOM_BENCH_OPTIONS_H
#define LOOM_BENCH_OPTIONS_H

#include <stddef.h>

typedef struct bench_opts {
    size_t min_bytes, max_bytes; /* -b, -e: first and last row size, bytes */
    size_t step_bytes;           /* -i: added per row when step_factor is 1 */
    size_t step_factor;          /* -f: multiplied per row when > 1 */
    int iters, warmup_iters;     /* -n, -w */
    int agg_iters;               /* -m: operations per iteration, in one group */
    int check;                   /* -c: check iterations; 0 disables */
    int blocking;          /* -z: 0 stream, 1 NULL stream + barrier per iteration, 2 NULL stream */
    int unalign;           /* -u: elements */
    int timeout_s;         /* -T: 0 disables */
    int average;           /* -a: 0 rank 0, 1 avg, 2 min, 3 max */
    int dtype, op, root;   /* -d, -o, -r; -1 means all */
    const char *json_path; /* -J; NULL disables */
    int model;             /* -M: 1 adds the algorithm loom runs and the model's prediction */
} bench_opts_t;

/* Sets *opts to the defaults, then applies argv. Prints the usage and exits
 * on -h; prints what is wrong and a HINT line and exits on misuse. */
void bench_opts_parse(int argc, char **argv, const char *prog, bench_opts_t *opts);

/* Prints "prog: <message>" and, when hint is not NULL, "HINT: <hint>" to
 * stderr, then exits with EXIT_FAILURE. */
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 2, 3)))
#endif
void bench_die(const char *hint, const char *fmt, ...);

#endif /* LOOM_BENCH_OPTIONS_H */

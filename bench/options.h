/* SPDX-License-Identifier: Apache-2.0
 *
 * options.h - the benchmarks' flags, as parsed by options.c and read by the
 * driver in common.c; the parsers of single values, for programs with flags of
 * their own. Not used by the per-collective files.
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
    int device;            /* -G: 1 puts the buffers in device memory (loomMemAlloc) */
} bench_opts_t;

/* Sets *opts to the defaults, then applies argv. Prints the usage and exits
 * on -h; prints what is wrong and a HINT line and exits on misuse. */
void bench_opts_parse(int argc, char **argv, const char *prog, bench_opts_t *opts);

/* The row after `size`: times -f when above 1, else plus -i; (size_t)-1 when that would
 * not grow (a size of 0 times a factor, a step of 0, overflow), which ends a sweep. */
size_t bench_next_size(const bench_opts_t *o, size_t size);

/* One flag's value, exiting with bench_die's message on misuse: a size in bytes with an
 * optional binary K, M or G suffix (nccl-tests' parsesize); an integer from min to 1e9. */
size_t bench_parse_size(const char *flag, const char *value);
int bench_parse_int(const char *flag, const char *value, int min);
/* A comma list of names (any case) into a bit set, bit i for names[i] (n <= 32); an
 * unknown one exits with "<flag>: unknown <what> '<name>'" and hint, an empty list too. */
unsigned bench_parse_names(const char *flag, const char *value, const char *what, const char *hint,
                           const char *const *names, int n);

/* The program name bench_die prints (bench_opts_parse sets it too). */
void bench_set_prog(const char *prog);

/* Prints "prog: <message>" and, when hint is not NULL, "HINT: <hint>" to
 * stderr, then exits with EXIT_FAILURE. */
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 2, 3)))
#endif
void bench_die(const char *hint, const char *fmt, ...);

#endif /* LOOM_BENCH_OPTIONS_H */

/* SPDX-License-Identifier: Apache-2.0
 *
 * common.h - the shared driver of the *_perf benchmarks (nccl-tests' shape).
 *
 * Each bench/<coll>.c describes one collective with a bench_coll_t (buffer
 * counts, verifiable inputs, expected output, bandwidth formula, the call) and
 * hands it to bench_main(), which owns flags, launch, timing, checking and the
 * output table. Nothing here knows a particular collective; nothing here is
 * part of libloom. Only include/loom.h is used. The last section is what the
 * programs with drivers of their own share with this one (launch.c, json.c,
 * report.c). The V collectives' count arrays are counts.c's.
 */
#ifndef LOOM_BENCH_COMMON_H
#define LOOM_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

/* Buffer shape of one measurement, in elements (nccl-tests' getCollByteCount). */
typedef struct bench_counts {
    size_t send_count;       /* elements this rank sends from */
    size_t recv_count;       /* elements this rank receives into (and checks) */
    size_t param_count;      /* the count argument of the call; the table's "count" */
    size_t send_inplace_off; /* in place: sendbuff = recvbuff + rank * this */
    size_t recv_inplace_off; /* in place: recvbuff = recvbuff + rank * this */
} bench_counts_t;

/* What one measurement is about; handed to the table's callbacks. */
typedef struct bench_ctx {
    int rank;              /* this rank in the communicator */
    int nranks;            /* ranks in the communicator */
    loomDataType_t dtype;  /* element type */
    size_t elt_size;       /* bytes per element */
    loomRedOp_t op;        /* reduction (ignored by non-reducing collectives) */
    int root;              /* root rank, or -1 for rootless collectives */
    uint64_t seed;         /* selects the input values; new for every check */
    bench_counts_t counts; /* buffer shape */
} bench_ctx_t;

#define BENCH_REDUCES    (1u << 0) /* takes an op: -o applies, the redop column names it */
#define BENCH_ROOTED     (1u << 1) /* takes a root: -r applies, the root column shows it */
#define BENCH_NO_INPLACE (1u << 2) /* no in-place form: in-place columns print N/A */

/* One collective, as nccl-tests' struct testColl. Every member is required
 * but inplace_at and lossy_bound. */
typedef struct bench_coll {
    const char *name; /* e.g. "AllReduce"; used in the JSON records */
    unsigned flags;   /* BENCH_* */
    /* Buffer shape for a row of `count` elements of elt_size bytes over nranks. */
    void (*get_counts)(size_t count, size_t elt_size, int nranks, bench_counts_t *c);
    /* Writes this rank's inputs (ctx->counts.send_count elements) to sendbuff. */
    void (*init_data)(const bench_ctx_t *ctx, void *sendbuff);
    /* Writes what this rank must find in its receive buffer to expected and
     * returns how many elements to compare (0: nothing to check on this rank). */
    size_t (*expected)(const bench_ctx_t *ctx, void *expected);
    /* Bytes that define algbw (algbw = bytes / 1e9 / seconds) and busbw/algbw. */
    void (*get_bw)(size_t count, size_t elt_size, int nranks, double *bytes, double *factor);
    /* Issues one operation (NCCL argument order); stream NULL means blocking. */
    loomResult_t (*run)(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream);
    /* Optional: the element offset of this rank's in-place buffer within recvbuff (sendbuff
     * for send_inplace, recvbuff otherwise), for shapes where it is not rank x the counts'
     * offsets (the uneven collectives); NULL: those offsets. */
    size_t (*inplace_at)(const bench_ctx_t *ctx, int send_inplace);
    /* 0: results are exact and the check counts wrong elements. > 0: results
     * are approximate (a compressed collective): the check reports the relative
     * L2 error against the exact result in the #wrong column ("relerr" in JSON)
     * and fails a measurement whose error exceeds this bound. */
    double lossy_bound;
} bench_coll_t;

/* Parses flags, creates the communicator, runs the sweep, prints the table and
 * returns the process exit status (non-zero if any element was wrong). */
int bench_main(int argc, char **argv, const bench_coll_t *coll);

/* ---- Types and verifiable data (verifiable.c) ---------------------------- */

/* nccl-tests' names, indexed by loomDataType_t / loomRedOp_t. */
extern const char *const bench_type_names[loomNumTypes];
extern const char *const bench_op_names[loomNumOps];
size_t bench_type_size(loomDataType_t dtype);

/* Inputs are small integers (prod: +-1 and +-2) drawn from a hash of (seed,
 * rank, index), in ranges chosen per type and op so that sums over up to 64
 * ranks are exact or rounded exactly once; the expected results are rounded
 * with the benchmark's own float16/bfloat16/fp8 conversions (round to nearest
 * even, fp8 saturating). Collectives that do not reduce pass op = loomNumOps. */

/* buf[i] = the input of rank `rank` at element index offset + i, i < count. */
void bench_fill_input(const bench_ctx_t *ctx, void *buf, size_t count, int rank, size_t offset);
/* buf[i] = ctx->op over every rank r of the input of r at offset + i, rounded
 * as loom.h specifies (accumulate in float32 for 8/16-bit floats, avg divides
 * the sum once by nranks). */
void bench_fill_reduced(const bench_ctx_t *ctx, void *buf, size_t count, size_t offset);
/* buf[i] = v in dtype, rounded to nearest even for the narrow floats (v exact in float32). */
void bench_store(loomDataType_t dtype, void *buf, size_t i, double v);
/* Element i of a float32/float64/float16/bfloat16 buffer as a double (0 for
 * other types). */
double bench_load_float(loomDataType_t dtype, const void *buf, size_t i);
/* The common init_data: this rank's inputs at indices 0 .. send_count-1. */
void bench_init_rank_input(const bench_ctx_t *ctx, void *sendbuff);

/* The shape of an all-reduce (all_reduce_perf, echo_perf): count elements in
 * and out, the exact sum as expected result, algbw bytes count x size and
 * busbw factor 2(n-1)/n. */
void bench_allreduce_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c);
size_t bench_allreduce_expected(const bench_ctx_t *ctx, void *out);
void bench_allreduce_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor);

/* Two arrays of n counts, v[0..n) and v[n..2n), filled by fill(v, n, param) for comm's n and
 * kept between calls: a call queued on a stream reads them later, so one of another param
 * waits for the stream first. Shared by the V collectives' programs (one kind per program). */
loomResult_t bench_kept_arrays(loomComm_t comm, loomStream_t stream, size_t param,
                               void (*fill)(size_t *v, int n, size_t param), size_t **v_p,
                               int *n_p);

/* The uneven pattern of all_gatherv_perf and reduce_scatterv_perf: of a row's count elements,
 * rank r's block is (r+1) units, a unit being count / (n(n+1)/2) rounded down to 16 bytes, so
 * rank r holds (r+1)/(1+2+...+n) of the total; blocks packed in rank order. */
size_t bench_v_unit(size_t count, size_t elt_size, int nranks);
static inline size_t bench_v_block(size_t unit, int r)
{
    return (size_t)(r + 1) * unit;
}
static inline size_t bench_v_displ(size_t unit, int r)
{
    return unit * (size_t)r * (size_t)(r + 1) / 2;
}
/* The counts and displacements of a call of `unit` on comm (bench_kept_arrays) and this
 * rank. */
loomResult_t bench_v_arrays(loomComm_t comm, loomStream_t stream, size_t unit,
                            const size_t **counts, const size_t **displs, int *rank);

/* Element count rounded down to a multiple of 16 bytes (nccl-tests' per-rank
 * rounding for AllGather, ReduceScatter and AlltoAll). */
static inline size_t bench_round16(size_t count, size_t elt_size)
{
    return count & ~(16 / elt_size - 1);
}

/* ---- Shared by every benchmark program (launch.c, json.c, report.c) ----- */

/* Whether a launcher started this process as a rank: loomrun, torchrun, Open MPI or a
 * multi-task Slurm step. */
int bench_launched(void);
/* This process's communicator: from the launcher's environment when bench_launched(), else
 * a lone rank. *hint is what to tell the user if it fails (NULL: nothing to add). */
loomResult_t bench_comm_create(loomComm_t *comm, const char **hint);

/* JSON values, written the same way in every -J file: a string with quotes, backslashes and
 * control characters escaped; a number ("nan" and "inf" as strings); the local time. */
void bench_json_str(FILE *f, const char *s);
void bench_json_double(FILE *f, double v);
void bench_json_now(FILE *f);

/* The median of v[0..n) (v is left as it is; 0 for n <= 0). */
double bench_median(const double *v, int n);
/* The CPU's model name from /proc/cpuinfo, else "unknown CPU". */
void bench_cpu_model(char *buf, size_t len);

#endif /* LOOM_BENCH_COMMON_H */

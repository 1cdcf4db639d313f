/* SPDX-License-Identifier: Apache-2.0
 *
 * q4_perf.c - speed of the 4-bit block codec (src/quant/q4.h) itself, one
 * thread, no communicator: for each datatype and array size, the GB/s of
 * encode (plain, and with the error-feedback residual in place, err_in ==
 * err_out), decode, and decode_acc (float32 accumulator, shown on the float
 * rows) on every instruction set this CPU runs. GB/s counts the unquantized
 * side, n * element size, per second of the thread's CPU time (best of 5
 * trials); code bytes and residual traffic come on top. Like kernels_perf it
 * reads library internals and links the modules statically. It does not
 * check results: tests/unit/test_q4.cc does, bit for bit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "kernels.h"
#include "micro.h"
#include "q4.h"

#define MAX_LIST 16

enum { OP_ENCODE, OP_ENCODE_RES, OP_DECODE, OP_DECODE_ACC, NUM_OPS };
static const char *const op_names[NUM_OPS] = {"encode", "encode+res", "decode", "decode_acc"};

struct options {
    loomDataType_t types[MAX_LIST];
    int ntypes;
    int isa_on[LOOM_KERNELS_NUM_ISA]; /* 1: measure this set (if the CPU has it) */
    int isa_given;
    size_t sizes[MAX_LIST]; /* bytes of the unquantized array */
    int nsizes;
    double min_ms; /* time per trial */
};

static void usage(FILE *out)
{
    fprintf(out, "usage: q4_perf [-t types] [-k isas] [-s sizes] [-m ms] [-q] [-h]\n"
                 "  -t  comma list of datatypes: float, half, bfloat16 (default all three; 'all')\n"
                 "  -k  comma list of instruction sets: scalar, avx2, avx512 (default every one\n"
                 "      this CPU runs; 'all')\n"
                 "  -s  comma list of array sizes in bytes of unquantized values, K/M suffix\n"
                 "      (default 4M,64M: cache- and memory-resident)\n"
                 "  -m  milliseconds per trial, best of 5 trials reported (default 60)\n"
                 "  -q  quick: 256K and 4M only, 2 ms trials\n");
}

static void add_type(void *ctx, const char *name)
{
    struct options *o = ctx;
    if (strcmp(name, "all") == 0) {
        const loomDataType_t all[] = {loomFloat32, loomFloat16, loomBfloat16};
        for (int t = 0; t < 3 && o->ntypes < MAX_LIST; t++)
            o->types[o->ntypes++] = all[t];
        return;
    }
    int t = loom_dtype_parse(name);
    if (t < 0 || !loom_q4_dtype_ok((loomDataType_t)t))
        micro_die("q4_perf", "datatype the codec does not take", "use float, half or bfloat16");
    if (o->ntypes < MAX_LIST)
        o->types[o->ntypes++] = (loomDataType_t)t;
}

static void add_isa(void *ctx, const char *name)
{
    struct options *o = ctx;
    o->isa_given = 1;
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++)
        if (strcmp(name, "all") == 0 ||
            strcmp(name, loom_kernels_isa_name((loom_kernels_isa_t)isa)) == 0) {
            o->isa_on[isa] = 1;
            if (strcmp(name, "all") != 0)
                return;
        }
    if (strcmp(name, "all") != 0)
        micro_die("q4_perf", "unknown instruction set", "use scalar, avx2, avx512 or all");
}

static void add_size(void *ctx, const char *s)
{
    struct options *o = ctx;
    if (o->nsizes < MAX_LIST)
        o->sizes[o->nsizes++] = micro_parse_size("q4_perf", s);
}

/* Roughly N(0, 1) values (sum of four uniforms), cheap to make in bulk: the
 * codec's speed does not depend on the distribution, only on blocks being
 * finite and not all zero. */
static void fill_gauss(loomDataType_t dt, void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        float sum = 0;
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            sum += (float)(s >> 40) * 0x1p-24f;
        }
        float v = (sum - 2.0f) * 1.7320508f;
        if (dt == loomFloat32)
            ((float *)buf)[i] = v;
        else if (dt == loomBfloat16)
            ((uint16_t *)buf)[i] = loom_f32_to_bf16(v);
        else
            ((uint16_t *)buf)[i] = loom_f32_to_f16(v);
    }
}

struct arrays {
    void *src;  /* n values of the datatype */
    float *err; /* residuals, in place */
    uint8_t *q; /* loom_q4_bytes(n) */
    void *out;  /* decoded values of the datatype */
    float *acc; /* decode_acc's accumulator */
    size_t n;
};

static void run_once(loom_kernels_isa_t isa, loomDataType_t dt, int op, const struct arrays *a)
{
    switch (op) {
    case OP_ENCODE:
        loom_q4_encode_isa(isa, a->src, dt, NULL, NULL, a->n, a->q);
        break;
    case OP_ENCODE_RES:
        loom_q4_encode_isa(isa, a->src, dt, a->err, a->err, a->n, a->q);
        break;
    case OP_DECODE:
        loom_q4_decode_isa(isa, a->q, a->n, a->out, dt);
        break;
    default:
        loom_q4_decode_acc_isa(isa, a->q, a->n, a->acc);
        break;
    }
}

struct call {
    loom_kernels_isa_t isa;
    loomDataType_t dt;
    int op;
    const struct arrays *a;
};

static void run_call(const void *arg)
{
    const struct call *c = arg;
    run_once(c->isa, c->dt, c->op, c->a);
}

/* Best GB/s of unquantized bytes (micro_best_gbps). */
static double measure(const struct options *o, loom_kernels_isa_t isa, loomDataType_t dt, int op,
                      const struct arrays *a)
{
    const double bytes = (double)a->n * (double)(op == OP_DECODE_ACC ? 4 : loom_dtype_size(dt));
    const struct call c = {isa, dt, op, a};
    return micro_best_gbps(bytes, o->min_ms, run_call, &c);
}

static void *alloc_or_die(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == NULL)
        micro_die("q4_perf", "out of memory", "use smaller -s sizes");
    return p;
}

static void run_size(const struct options *o, loomDataType_t dt, size_t bytes)
{
    struct arrays a = {.n = bytes / loom_dtype_size(dt)};
    if (a.n == 0)
        return;
    a.src = alloc_or_die(a.n * loom_dtype_size(dt));
    a.out = alloc_or_die(a.n * loom_dtype_size(dt));
    a.err = alloc_or_die(a.n * sizeof(float));
    a.acc = alloc_or_die(a.n * sizeof(float));
    a.q = alloc_or_die(loom_q4_bytes(a.n));
    fill_gauss(dt, a.src, a.n, 1);
    memset(a.err, 0, a.n * sizeof(float));
    memset(a.acc, 0, a.n * sizeof(float));
    /* A valid stream for the decoders before any encode is timed. */
    loom_q4_encode_isa(LOOM_KERNELS_SCALAR, a.src, dt, NULL, NULL, a.n, a.q);

    for (int op = 0; op < NUM_OPS; op++) {
        if (op == OP_DECODE_ACC && dt != loomFloat32)
            continue; /* the accumulator is float32 whatever the datatype */
        printf("%-9s %9zu  %-10s", loom_dtype_name(dt), bytes, op_names[op]);
        for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
            if (!o->isa_on[isa] || !loom_kernels_isa_available((loom_kernels_isa_t)isa))
                printf("  %8s", "n/a");
            else
                printf("  %8.2f", measure(o, (loom_kernels_isa_t)isa, dt, op, &a));
            fflush(stdout);
        }
        printf("\n");
    }
    free(a.src);
    free(a.out);
    free(a.err);
    free(a.acc);
    free(a.q);
}

int main(int argc, char **argv)
{
    struct options o = {.min_ms = 60};
    int quick = 0, opt;
    while ((opt = getopt(argc, argv, "t:k:s:m:qh")) != -1) {
        switch (opt) {
        case 't':
            micro_each(optarg, &o, add_type);
            break;
        case 'k':
            micro_each(optarg, &o, add_isa);
            break;
        case 's':
            micro_each(optarg, &o, add_size);
            break;
        case 'm':
            o.min_ms = atof(optarg);
            if (!(o.min_ms > 0))
                micro_die("q4_perf", "bad -m", "give the milliseconds per trial, e.g. -m 50");
            break;
        case 'q':
            quick = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (o.ntypes == 0)
        add_type(&o, "all");
    if (!o.isa_given)
        add_isa(&o, "all");
    if (o.nsizes == 0) {
        if (quick)
            add_size(&o, "256K");
        add_size(&o, "4M");
        if (!quick)
            add_size(&o, "64M");
    }
    if (quick)
        o.min_ms = 2;

    printf("# q4_perf: GB/s of unquantized bytes (n * element size) per second of thread CPU "
           "time, one thread, best of 5 trials of %.0f ms\n",
           o.min_ms);
    printf("# encode+res: err_in == err_out (error feedback); decode_acc: float32 acc += D\n");
    printf("# default kernels here: %s\n", loom_kernels_isa_name(loom_kernels_isa()));
    printf("%-9s %9s  %-10s", "# type", "bytes", "op");
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++)
        printf("  %8s", loom_kernels_isa_name((loom_kernels_isa_t)isa));
    printf("\n");
    for (int t = 0; t < o.ntypes; t++)
        for (int s = 0; s < o.nsizes; s++)
            run_size(&o, o.types[t], o.sizes[s]);
    return 0;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * kernels_perf.c - speed of the reduction kernels themselves, one process, no
 * communicator: for each datatype, op and array size, the GB/s of
 * loom_reduce_acc (one source into an accumulator array) and of
 * loom_reduce_multi (nsrc sources into dst in one pass) on every instruction
 * set this CPU runs (scalar, avx2, avx512). GB/s counts the datatype bytes
 * read from the sources per second of the thread's CPU time (the best of 5
 * trials); the accumulator and dst traffic comes on top. Unlike the other
 * *_perf programs it reads library internals (kernels.h), so it links the
 * modules statically. It does not check results: tests/unit does that, bit
 * for bit against the scalar table.
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

#define MAX_LIST 16

struct options {
    loomDataType_t types[MAX_LIST];
    int ntypes;
    loomRedOp_t ops[MAX_LIST];
    int nops;
    size_t sizes[MAX_LIST]; /* bytes of one source array */
    int nsizes;
    int nsrc;      /* sources of loom_reduce_multi */
    double min_ms; /* time per trial */
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kernels_perf [-t types] [-o ops] [-s sizes] [-n nsrc] [-m ms] [-q] [-h]\n"
            "  -t  comma list of datatypes (default float,double,int32,uint64,half,bfloat16,"
            "f8e4m3,f8e5m2; 'all')\n"
            "  -o  comma list of ops (default sum; 'all')\n"
            "  -s  comma list of source array sizes in bytes, K/M suffix (default 8K,256K,64M:\n"
            "      L1-, L2- and memory-resident)\n"
            "  -n  sources of loom_reduce_multi (default 4)\n"
            "  -m  milliseconds per trial, best of 5 trials reported (default 60)\n"
            "  -q  quick: 8K and 256K only, 2 ms trials\n");
}

static void add_type(void *ctx, const char *name)
{
    struct options *o = ctx;
    if (strcmp(name, "all") == 0) {
        for (int t = 0; t < loomNumTypes && o->ntypes < MAX_LIST; t++)
            o->types[o->ntypes++] = (loomDataType_t)t;
        return;
    }
    int t = loom_dtype_parse(name);
    if (t < 0)
        micro_die("kernels_perf", "unknown datatype",
                  "use names like float, half, bfloat16, int32, f8e4m3");
    if (o->ntypes < MAX_LIST)
        o->types[o->ntypes++] = (loomDataType_t)t;
}

static void add_op(void *ctx, const char *name)
{
    struct options *o = ctx;
    if (strcmp(name, "all") == 0) {
        for (int op = 0; op < loomNumOps && o->nops < MAX_LIST; op++)
            o->ops[o->nops++] = (loomRedOp_t)op;
        return;
    }
    int op = loom_redop_parse(name);
    if (op < 0)
        micro_die("kernels_perf", "unknown op", "use sum, prod, max, min or avg");
    if (o->nops < MAX_LIST)
        o->ops[o->nops++] = (loomRedOp_t)op;
}

static void add_size(void *ctx, const char *s)
{
    struct options *o = ctx;
    if (o->nsizes < MAX_LIST)
        o->sizes[o->nsizes++] = micro_parse_size("kernels_perf", s);
}

/* Values +-1 in the datatype: sums stay small and products stay +-1, so no
 * trial slows down on infinities or subnormals. */
static void fill_ones(loomDataType_t dt, void *buf, size_t n, unsigned seed)
{
    size_t sz = loom_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        float f = ((i * 2654435761u + seed) >> 7) & 1 ? 1.0f : -1.0f;
        unsigned char *p = (unsigned char *)buf + i * sz;
        uint16_t h;
        uint8_t b;
        int32_t i32 = (int32_t)f;
        int64_t i64 = (int64_t)f;
        int8_t i8 = (int8_t)f;
        double d = f;
        switch (dt) {
        case loomFloat16:
            h = loom_f32_to_f16(f);
            memcpy(p, &h, 2);
            break;
        case loomBfloat16:
            h = loom_f32_to_bf16(f);
            memcpy(p, &h, 2);
            break;
        case loomFloat8e4m3:
            b = loom_f32_to_e4m3(f);
            memcpy(p, &b, 1);
            break;
        case loomFloat8e5m2:
            b = loom_f32_to_e5m2(f);
            memcpy(p, &b, 1);
            break;
        case loomFloat32:
            memcpy(p, &f, 4);
            break;
        case loomFloat64:
            memcpy(p, &d, 8);
            break;
        case loomInt32:
        case loomUint32:
            memcpy(p, &i32, 4);
            break;
        case loomInt64:
        case loomUint64:
            memcpy(p, &i64, 8);
            break;
        default:
            memcpy(p, &i8, 1);
            break;
        }
    }
}

struct arrays {
    void *src[64];
    void *acc;
    void *dst;
    size_t n;
};

static void run_once(const struct options *o, loomDataType_t dt, loomRedOp_t op,
                     const struct arrays *a, int multi)
{
    if (multi)
        loom_reduce_multi(dt, op, a->dst, (const void *const *)a->src, o->nsrc, a->n, o->nsrc);
    else
        loom_reduce_acc(dt, op, a->acc, a->src[1], a->n);
}

struct call {
    const struct options *o;
    loomDataType_t dt;
    loomRedOp_t op;
    const struct arrays *a;
    int multi;
};

static void run_call(const void *arg)
{
    const struct call *c = arg;
    run_once(c->o, c->dt, c->op, c->a, c->multi);
}

/* Best GB/s of source bytes (micro_best_gbps). */
static double measure(const struct options *o, loomDataType_t dt, loomRedOp_t op,
                      const struct arrays *a, int multi)
{
    const double bytes = (double)a->n * (double)loom_dtype_size(dt) * (multi ? o->nsrc : 1);
    const struct call c = {o, dt, op, a, multi};
    return micro_best_gbps(bytes, o->min_ms, run_call, &c);
}

static void run_row(const struct options *o, loomDataType_t dt, loomRedOp_t op, size_t bytes)
{
    struct arrays a = {.n = bytes / loom_dtype_size(dt)};
    if (a.n == 0)
        return;
    for (int j = 0; j < o->nsrc; j++) {
        a.src[j] = aligned_alloc(64, a.n * loom_dtype_size(dt) + 64);
        if (a.src[j] == NULL)
            micro_die("kernels_perf", "out of memory", "use smaller -s sizes or fewer -n sources");
        fill_ones(dt, a.src[j], a.n, (unsigned)j);
    }
    a.acc = aligned_alloc(64, a.n * loom_acc_size(dt) + 64);
    a.dst = aligned_alloc(64, a.n * loom_dtype_size(dt) + 64);
    if (a.acc == NULL || a.dst == NULL)
        micro_die("kernels_perf", "out of memory", "use smaller -s sizes or fewer -n sources");

    double acc_gbps[LOOM_KERNELS_NUM_ISA], multi_gbps[LOOM_KERNELS_NUM_ISA];
    loom_kernels_isa_t prev = loom_kernels_isa();
    for (int isa = 0; isa < LOOM_KERNELS_NUM_ISA; isa++) {
        acc_gbps[isa] = multi_gbps[isa] = -1;
        if (loom_kernels_use((loom_kernels_isa_t)isa) != loomSuccess)
            continue;
        loom_reduce_init(dt, a.acc, a.src[0], a.n);
        acc_gbps[isa] = measure(o, dt, op, &a, 0);
        multi_gbps[isa] = measure(o, dt, op, &a, 1);
    }
    loom_kernels_use(prev);

    printf("%-9s %-5s %9zu ", loom_dtype_name(dt), loom_redop_name(op), bytes);
    for (int k = 0; k < 2 * LOOM_KERNELS_NUM_ISA; k++) {
        double v = k < LOOM_KERNELS_NUM_ISA ? acc_gbps[k] : multi_gbps[k - LOOM_KERNELS_NUM_ISA];
        printf("%s", k == LOOM_KERNELS_NUM_ISA ? "   " : "");
        if (v < 0)
            printf("  %7s", "n/a");
        else
            printf("  %7.2f", v);
    }
    printf("\n");
    fflush(stdout);

    for (int j = 0; j < o->nsrc; j++)
        free(a.src[j]);
    free(a.acc);
    free(a.dst);
}

int main(int argc, char **argv)
{
    struct options o = {.nsrc = 4, .min_ms = 60};
    int quick = 0, opt;
    while ((opt = getopt(argc, argv, "t:o:s:n:m:qh")) != -1) {
        switch (opt) {
        case 't':
            micro_each(optarg, &o, add_type);
            break;
        case 'o':
            micro_each(optarg, &o, add_op);
            break;
        case 's':
            micro_each(optarg, &o, add_size);
            break;
        case 'n':
            o.nsrc = atoi(optarg);
            if (o.nsrc < 2 || o.nsrc > 64)
                micro_die("kernels_perf", "bad -n",
                          "loom_reduce_multi is measured with 2 to 64 sources");
            break;
        case 'm':
            o.min_ms = atof(optarg);
            if (!(o.min_ms > 0))
                micro_die("kernels_perf", "bad -m", "give the milliseconds per trial, e.g. -m 50");
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
    if (o.ntypes == 0) {
        char def[] = "float,double,int32,uint64,half,bfloat16,f8e4m3,f8e5m2";
        micro_each(def, &o, add_type);
    }
    if (o.nops == 0)
        add_op(&o, "sum");
    if (o.nsizes == 0) {
        add_size(&o, "8K");
        add_size(&o, "256K");
        if (!quick)
            add_size(&o, "64M");
    }
    if (quick)
        o.min_ms = 2;

    printf("# kernels_perf: GB/s of source bytes read per second of thread CPU time (best of 5 "
           "trials of %.0f ms)\n",
           o.min_ms);
    printf("# acc: loom_reduce_acc, one source into an accumulator array; multi: "
           "loom_reduce_multi of %d sources into dst\n",
           o.nsrc);
    printf("# default kernels here: %s\n", loom_kernels_isa_name(loom_kernels_isa()));
    printf("%-9s %-5s %9s   %7s  %7s  %7s     %7s  %7s  %7s\n", "# type", "op", "bytes", "acc:scl",
           "avx2", "avx512", "mul:scl", "avx2", "avx512");
    for (int t = 0; t < o.ntypes; t++)
        for (int k = 0; k < o.nops; k++)
            for (int s = 0; s < o.nsizes; s++)
                run_row(&o, o.types[t], o.ops[k], o.sizes[s]);
    return 0;
}

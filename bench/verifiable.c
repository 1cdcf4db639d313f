/* SPDX-License-Identifier: Apache-2.0
 *
 * verifiable.c - inputs whose collective results the benchmarks can predict
 * bit for bit, and those predicted results, after nccl-tests' verifiable/.
 * Values are small integers from a hash of (seed, rank, index); results are
 * computed here in int64/double and rounded with this file's own float16,
 * bfloat16 and fp8 conversions, never with libloom's. It does not run any
 * collective: bench/<coll>.c calls it from init_data/expected, and common.c
 * uses the type tables.
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const bench_type_names[loomNumTypes] = {
    [loomInt8] = "int8",         [loomUint8] = "uint8",       [loomInt32] = "int32",
    [loomUint32] = "uint32",     [loomInt64] = "int64",       [loomUint64] = "uint64",
    [loomFloat16] = "half",      [loomFloat32] = "float",     [loomFloat64] = "double",
    [loomBfloat16] = "bfloat16", [loomFloat8e4m3] = "f8e4m3", [loomFloat8e5m2] = "f8e5m2",
};

const char *const bench_op_names[loomNumOps] = {
    [loomSum] = "sum", [loomProd] = "prod", [loomMax] = "max", [loomMin] = "min", [loomAvg] = "avg",
};

size_t bench_type_size(loomDataType_t dtype)
{
    switch (dtype) {
    case loomInt8:
    case loomUint8:
    case loomFloat8e4m3:
    case loomFloat8e5m2:
        return 1;
    case loomFloat16:
    case loomBfloat16:
        return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
        return 4;
    default:
        return 8;
    }
}

// ---- Narrow floats ------------------------------------------------------------

typedef struct minifloat {
    int ebits, mbits; /* exponent and mantissa field widths */
    uint32_t max;     /* encoding of the largest finite value */
    int saturate;     /* overflow gives +-max (OCP fp8 as loom converts) instead of +-inf */
} minifloat_t;

static const minifloat_t k_half = {5, 10, 0x7bff, 0};
static const minifloat_t k_bf16 = {8, 7, 0x7f7f, 0};
static const minifloat_t k_e4m3 = {4, 3, 0x7e, 1}; /* 448: exponent field 15 is finite */
static const minifloat_t k_e5m2 = {5, 2, 0x7b, 1}; /* 57344 */

/* The encoding of finite x, rounded to nearest with ties to even, by integer
 * operations on x's float32 bits (every value converted here is a float32). */
static uint32_t minifloat_bits(float x, const minifloat_t *f)
{
    uint32_t b;
    memcpy(&b, &x, sizeof(b));
    uint32_t sign = (b >> 31) << (f->ebits + f->mbits);
    uint32_t exp32 = (b >> 23) & 0xff;
    uint32_t man = b & 0x7fffff;
    if (exp32 == 0 && man == 0)
        return sign;
    int bias = (1 << (f->ebits - 1)) - 1;
    int e = exp32 ? (int)exp32 - 127 : -126; /* x = man32 * 2^(e - 23) */
    uint32_t man32 = exp32 ? man | 0x800000 : man;
    int biased = e + bias; /* target exponent field if normal */
    int shift = 23 - f->mbits + (biased < 1 ? 1 - biased : 0);
    if (shift > 25)
        return sign; /* below half the smallest subnormal */
    uint32_t q = man32 >> shift;
    uint32_t rem = man32 & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    /* normal: (biased - 1) << mbits plus q with its implicit bit; a carry out of
     * the mantissa bumps the exponent. Subnormal: q itself. */
    uint32_t code = biased >= 1 ? ((uint32_t)(biased - 1) << f->mbits) + q : q;
    if (code > f->max)
        code = f->saturate ? f->max : ((1u << f->ebits) - 1) << f->mbits;
    return sign | code;
}

/* buf[i] = v in dtype; integers wrap modulo 2^bits as loom's integer ops do.
 * For float and the narrow floats v is exactly a float32 here: small integers,
 * or an average already computed in float32. */
void bench_store(loomDataType_t dtype, void *buf, size_t i, double v)
{
    char *p = (char *)buf + i * bench_type_size(dtype);
    uint64_t u = (uint64_t)(int64_t)v;
    uint8_t u8 = (uint8_t)u;
    uint16_t u16;
    uint32_t u32 = (uint32_t)u;
    float f32 = (float)v;
    switch (dtype) {
    case loomInt8:
    case loomUint8:
        memcpy(p, &u8, 1);
        break;
    case loomInt32:
    case loomUint32:
        memcpy(p, &u32, 4);
        break;
    case loomInt64:
    case loomUint64:
        memcpy(p, &u, 8);
        break;
    case loomFloat32:
        memcpy(p, &f32, 4);
        break;
    case loomFloat64:
        memcpy(p, &v, 8);
        break;
    case loomFloat16:
    case loomBfloat16:
        u16 = (uint16_t)minifloat_bits(f32, dtype == loomFloat16 ? &k_half : &k_bf16);
        memcpy(p, &u16, 2);
        break;
    case loomFloat8e4m3:
    case loomFloat8e5m2:
        u8 = (uint8_t)minifloat_bits(f32, dtype == loomFloat8e4m3 ? &k_e4m3 : &k_e5m2);
        memcpy(p, &u8, 1);
        break;
    default:
        break;
    }
}

double bench_load_float(loomDataType_t dtype, const void *buf, size_t i)
{
    const char *p = (const char *)buf + i * bench_type_size(dtype);
    float f32;
    double f64;
    uint16_t h;
    uint32_t u;
    switch (dtype) {
    case loomFloat32:
        memcpy(&f32, p, 4);
        return f32;
    case loomFloat64:
        memcpy(&f64, p, 8);
        return f64;
    case loomBfloat16:
        memcpy(&h, p, 2);
        u = (uint32_t)h << 16;
        memcpy(&f32, &u, 4);
        return f32;
    case loomFloat16: {
        memcpy(&h, p, 2);
        const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        const double sign = (h & 0x8000) ? -1.0 : 1.0;
        if (e == 0)
            return sign * ldexp((double)m, -24);
        if (e == 31)
            return m ? NAN : sign * INFINITY;
        return sign * ldexp((double)(m | 0x400), e - 25);
    }
    default:
        return 0.0;
    }
}

/* An integer reduced in dtype's own width (two's complement wrap), as int64. */
static int64_t wrap(loomDataType_t dtype, int64_t v)
{
    switch (dtype) {
    case loomInt8:
        return (int8_t)(uint8_t)v;
    case loomUint8:
        return (uint8_t)v;
    case loomInt32:
        return (int32_t)(uint32_t)v;
    case loomUint32:
        return (uint32_t)v;
    default:
        return v;
    }
}

static int is_unsigned(loomDataType_t t)
{
    return t == loomUint8 || t == loomUint32 || t == loomUint64;
}

static int is_integer(loomDataType_t t)
{
    return t <= loomUint64;
}

// ---- Value generator ----------------------------------------------------------

/* Largest |value| for ops that do not grow values (copies, min, max): every
 * integer up to it is exact in the type. */
static int64_t wide_limit(loomDataType_t t)
{
    switch (t) {
    case loomInt8:
        return 127;
    case loomUint8:
        return 255;
    case loomFloat16:
        return 2048;
    case loomBfloat16:
        return 256;
    case loomFloat8e4m3:
        return 16;
    case loomFloat8e5m2:
        return 8;
    default:
        return 1 << 20;
    }
}

/* For sum/avg: the largest |value|, so that |sum over nranks| stays within the
 * type's exact integers (and int8/uint8 do not wrap). fp8 allows so few that
 * beyond a few ranks its sums round; the check then verifies that rounding. */
static int64_t sum_limit(loomDataType_t t, int nranks)
{
    switch (t) {
    case loomInt8:
    case loomUint8:
    case loomFloat16:
    case loomBfloat16:
    case loomFloat8e4m3:
    case loomFloat8e5m2:
        break;
    default:
        return 1000; /* sums of thousands are exact in 32- and 64-bit types */
    }
    int64_t lim = wide_limit(t) / nranks;
    return lim > 1 ? lim : 1;
}

typedef struct gen {
    int64_t lo;    /* values lo .. lo + span - 1 */
    uint64_t span; /* < 2^32 */
    int prod;      /* values +-1 and +-2 (2 only on ranks 0..7: products stay <= 256) */
    int negatives; /* prod: the type has negative values */
} gen_t;

static gen_t gen_make(const bench_ctx_t *ctx)
{
    gen_t g = {.prod = ctx->op == loomProd, .negatives = !is_unsigned(ctx->dtype)};
    int64_t hi = ctx->op == loomSum || ctx->op == loomAvg ? sum_limit(ctx->dtype, ctx->nranks)
                                                          : wide_limit(ctx->dtype);
    g.lo = is_unsigned(ctx->dtype) ? 0 : -hi;
    g.span = (uint64_t)(hi - g.lo + 1);
    return g;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rank_key(uint64_t seed, int rank)
{
    return mix64(seed * 0x9e3779b97f4a7c15ull + (uint64_t)rank + 1);
}

static int64_t gen_value(const gen_t *g, uint64_t key, int rank, size_t i)
{
    uint64_t h = mix64(key ^ ((uint64_t)i * 0xd1b54a32d192ed03ull));
    if (g->prod) {
        int64_t mag = rank < 8 && (h & 3) == 0 ? 2 : 1;
        return g->negatives && ((h >> 2) & 7) == 0 ? -mag : mag;
    }
    return g->lo + (int64_t)(((h >> 32) * g->span) >> 32); /* uniform in span, no division */
}

// ---- Public helpers -----------------------------------------------------------

void bench_fill_input(const bench_ctx_t *ctx, void *buf, size_t count, int rank, size_t offset)
{
    gen_t g = gen_make(ctx);
    uint64_t key = rank_key(ctx->seed, rank);
    for (size_t i = 0; i < count; i++)
        bench_store(ctx->dtype, buf, i, (double)gen_value(&g, key, rank, offset + i));
}

void bench_init_rank_input(const bench_ctx_t *ctx, void *sendbuff)
{
    bench_fill_input(ctx, sendbuff, ctx->counts.send_count, ctx->rank, 0);
}

/* The op's exact result of the inputs at one index, rounded as loom.h says. */
static double reduce_one(const bench_ctx_t *ctx, const gen_t *g, const uint64_t *keys, size_t i)
{
    int64_t acc = gen_value(g, keys[0], 0, i);
    for (int r = 1; r < ctx->nranks; r++) {
        int64_t v = gen_value(g, keys[r], r, i);
        switch (ctx->op) {
        case loomProd:
            acc *= v;
            break;
        case loomMax:
            acc = v > acc ? v : acc;
            break;
        case loomMin:
            acc = v < acc ? v : acc;
            break;
        default:
            acc += v;
            break;
        }
    }
    if (ctx->op != loomAvg)
        return (double)acc;
    if (is_integer(ctx->dtype))
        return (double)(wrap(ctx->dtype, acc) / ctx->nranks); /* C division truncates */
    if (ctx->dtype == loomFloat64)
        return (double)acc / ctx->nranks;
    return (double)((float)acc / (float)ctx->nranks); /* float32 accumulator, one division */
}

void bench_fill_reduced(const bench_ctx_t *ctx, void *buf, size_t count, size_t offset)
{
    gen_t g = gen_make(ctx);
    uint64_t *keys = malloc((size_t)ctx->nranks * sizeof(*keys));
    if (!keys) {
        fprintf(stderr, "bench: out of memory for %d rank keys\n", ctx->nranks);
        exit(EXIT_FAILURE);
    }
    for (int r = 0; r < ctx->nranks; r++)
        keys[r] = rank_key(ctx->seed, r);
    for (size_t i = 0; i < count; i++)
        bench_store(ctx->dtype, buf, i, reduce_one(ctx, &g, keys, offset + i));
    free(keys);
}

void bench_allreduce_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    (void)elt_size;
    (void)nranks;
    *c = (bench_counts_t){.send_count = count, .recv_count = count, .param_count = count};
}

size_t bench_allreduce_expected(const bench_ctx_t *ctx, void *out)
{
    bench_fill_reduced(ctx, out, ctx->counts.recv_count, 0);
    return ctx->counts.recv_count;
}

/* Every rank sends and receives 2(n-1)/n of the data in the best algorithm. */
void bench_allreduce_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)count * (double)elt_size;
    *factor = 2.0 * (nranks - 1) / nranks;
}

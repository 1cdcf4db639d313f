/* SPDX-License-Identifier: Apache-2.0
 *
 * route_prog.c - one rank of the drop-in library's route-mode test, a program written against
 * nccl.h alone. It issues a random sequence of collectives (the same on every rank: seeded by
 * ROUTE_SEED), some inside groups, and Send/Recv rings, on host buffers, and checks every
 * result against a reference of its own that follows loom's documented semantics (contributions
 * combined in rank order 0..n-1 in float32 for float16/bfloat16, in the datatype otherwise,
 * rounded once; integers wrap; avg divides once, truncating for integers). A result that is not
 * bitwise exact is accepted only for a sum AllReduce of a float type within Echo's bound (relative
 * L2 error 0.16, docs/echo.md). For every call it prints one line,
 *   CALL <i> <function> dtype=<d> op=<o> count=<n> group=<0|1> backend=<nccl|shim>
 *        result=<exact|approx> hash=<hex|->
 * where backend says whether the real library's counter of that function moved (the library
 * LOOM_NCCL_LIBRARY names is the test's fake NCCL, whose fakeNcclCallCount the program finds
 * with dlopen of the same path), so that the test can hold it against the library's trace.
 *
 * Environment: ROUTE_RANK, ROUTE_NRANKS, ROUTE_DIR (where rank 0 leaves the unique id),
 * ROUTE_SEED, ROUTE_CALLS, ROUTE_COMM_NAME (ncclConfig_t.commName, default "world"),
 * ROUTE_EXPECT_INVALID=1 (the library must refuse LOOM_NCCL_ROUTE: the communicator's creation
 * or its first collective fails with ncclInvalidArgument; prints INVALID <where>: <last error>).
 * Exit status 0 when every check held.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prog_util.h"

static int g_rank = -1, g_nranks;

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "rank %d: ", g_rank);                                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

#define NCCL_OK(call)                                                                              \
    do {                                                                                           \
        ncclResult_t rc_ = (call);                                                                 \
        if (rc_ != ncclSuccess)                                                                    \
            DIE("%s failed: %s (%s)", #call, ncclGetErrorString(rc_), ncclGetLastError(NULL));     \
    } while (0)

/* ---- deterministic values ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t state;
} rng_t;

static uint64_t below(rng_t *r, uint64_t n)
{
    return mix64(r->state++) % n;
}

/* ---- half and bfloat16, round to nearest even ---------------------------------------------- */

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static float from_half(uint16_t h)
{
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float r;
    if (e == 0) {
        r = ldexpf((float)m, -24);
    } else if (e == 31) {
        uint32_t u = 0x7f800000u | (m << 13);
        memcpy(&r, &u, 4);
    } else {
        r = ldexpf((float)(m | 0x400), (int)e - 25);
    }
    return (h & 0x8000) ? -r : r;
}

/* ---- datatypes ----------------------------------------------------------------------------- */

static const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                        ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                        ncclFloat64, ncclBfloat16};

static int is_float(ncclDataType_t dt)
{
    return dt == ncclFloat16 || dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16;
}

/* Element i of rank's input of the call keyed `key`. Floats are exact in every float type:
 * k/64 with |k| < 256, or for prod one of +-0.5, +-1, +-2 (so that products stay exact). */
static uint64_t in_bits(uint64_t key, int rank, size_t i)
{
    return mix64(key ^ mix64(((uint64_t)rank << 48) ^ (uint64_t)i));
}

static double in_float(uint64_t key, int op, int rank, size_t i)
{
    const uint64_t h = in_bits(key, rank, i);
    if (op == ncclProd) {
        static const double v[] = {0.5, 1, 2, -0.5, -1, -2};
        return v[h % 6];
    }
    return (double)((int)(h % 511) - 255) / 64.0;
}

static void store(void *buf, size_t j, ncclDataType_t dt, double f, uint64_t bits)
{
    switch (dt) {
    case ncclFloat16: {
        uint16_t v = to_half((float)f);
        memcpy((char *)buf + 2 * j, &v, 2);
        break;
    }
    case ncclBfloat16: {
        uint16_t v = to_bf16((float)f);
        memcpy((char *)buf + 2 * j, &v, 2);
        break;
    }
    case ncclFloat32: {
        float v = (float)f;
        memcpy((char *)buf + 4 * j, &v, 4);
        break;
    }
    case ncclFloat64:
        memcpy((char *)buf + 8 * j, &f, 8);
        break;
    default:
        memcpy((char *)buf + prog_type_size(dt) * j, &bits, prog_type_size(dt)); /* little endian */
        break;
    }
}

static double load_float(const void *buf, size_t j, ncclDataType_t dt)
{
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case ncclFloat16:
        memcpy(&h, (const char *)buf + 2 * j, 2);
        return from_half(h);
    case ncclBfloat16:
        memcpy(&h, (const char *)buf + 2 * j, 2);
        return from_bf16(h);
    case ncclFloat32:
        memcpy(&f, (const char *)buf + 4 * j, 4);
        return f;
    default:
        memcpy(&d, (const char *)buf + 8 * j, 8);
        return d;
    }
}

/* Elements [first, first + n) of rank's input into buf[0, n). */
static void fill(void *buf, ncclDataType_t dt, int op, uint64_t key, int rank, size_t first,
                 size_t n)
{
    for (size_t j = 0; j < n; j++)
        store(buf, j, dt, is_float(dt) ? in_float(key, op, rank, first + j) : 0,
              in_bits(key, rank, first + j));
}

/* The reduction over every rank of elements [first, first + n), as loom defines it. */
static void expect_reduce(void *buf, ncclDataType_t dt, int op, uint64_t key, size_t first,
                          size_t n)
{
    for (size_t j = 0; j < n; j++) {
        const size_t i = first + j;
        if (is_float(dt)) {
            /* the inputs are exact in float, so reading them as double loses nothing */
            double acc64 = in_float(key, op, 0, i);
            float acc32 = (float)acc64;
            for (int r = 1; r < g_nranks; r++) {
                const double v = in_float(key, op, r, i);
                if (dt == ncclFloat64) {
                    acc64 = op == ncclProd  ? acc64 * v
                            : op == ncclMax ? (v > acc64 ? v : acc64)
                            : op == ncclMin ? (v < acc64 ? v : acc64)
                                            : acc64 + v;
                } else {
                    const float w = (float)v;
                    acc32 = op == ncclProd  ? acc32 * w
                            : op == ncclMax ? (w > acc32 ? w : acc32)
                            : op == ncclMin ? (w < acc32 ? w : acc32)
                                            : acc32 + w;
                }
            }
            if (op == ncclAvg) {
                acc64 /= g_nranks;
                acc32 /= (float)g_nranks;
            }
            store(buf, j, dt, dt == ncclFloat64 ? acc64 : (double)acc32, 0);
            continue;
        }
        const int bits = (int)prog_type_size(dt) * 8;
        const uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
        const int is_signed = dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64;
        /* a value of the datatype, sign-extended for comparisons and the division */
#define SIGNED(u) (bits == 64 ? (int64_t)(u) : (int64_t)((u) << (64 - bits)) >> (64 - bits))
        uint64_t acc = in_bits(key, 0, i) & mask;
        for (int r = 1; r < g_nranks; r++) {
            const uint64_t v = in_bits(key, r, i) & mask;
            int greater = is_signed ? SIGNED(v) > SIGNED(acc) : v > acc;
            int less = is_signed ? SIGNED(v) < SIGNED(acc) : v < acc;
            acc = op == ncclProd  ? acc * v
                  : op == ncclMax ? (greater ? v : acc)
                  : op == ncclMin ? (less ? v : acc)
                                  : acc + v;
            acc &= mask;
        }
        if (op == ncclAvg)
            acc =
                (is_signed ? (uint64_t)(SIGNED(acc) / g_nranks) : acc / (uint64_t)g_nranks) & mask;
#undef SIGNED
        store(buf, j, dt, 0, acc);
    }
}

/* ---- one call ------------------------------------------------------------------------------ */

typedef enum {
    C_ALLREDUCE,
    C_ALLGATHER,
    C_REDUCESCATTER,
    C_BROADCAST,
    C_BCAST,
    C_REDUCE,
    C_ALLTOALL,
    C_GATHER,
    C_SCATTER,
    C_SENDRECV,
    C_NUM
} kind_t;
static const char *const kFunctions[C_NUM] = {
    "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Bcast",
    "Reduce",    "AlltoAll",  "Gather",        "Scatter",   "Send"};

typedef struct {
    kind_t kind;
    ncclDataType_t dt;
    int op; /* -1 for the collectives without one */
    size_t count;
    int root;
    int in_place;
    uint64_t key;
    void *send, *recv, *expect;
    size_t recv_elems;
    long moved[2]; /* calls the fake counted: of the function, and of Recv */
} call_t;

static long (*fake_count)(const char *);

static size_t random_count(rng_t *r, ncclDataType_t dt, int allow_large)
{
    switch (below(r, allow_large ? 4 : 3)) {
    case 0:
        return below(r, 4); /* 0 to 3 elements */
    case 1:
        return 1 + below(r, 3000);
    case 2:
        return 1 + below(r, (256 << 10) / prog_type_size(dt));
    default: /* 1 to 2 MiB: the size of the default rules */
        return ((1 << 20) + below(r, 1 << 20)) / prog_type_size(dt);
    }
}

static void make_call(rng_t *r, call_t *c, int index, uint64_t seed, int grouped)
{
    memset(c, 0, sizeof(*c));
    static const kind_t kinds[] = {C_ALLREDUCE,     C_ALLREDUCE, C_ALLREDUCE, C_ALLGATHER,
                                   C_REDUCESCATTER, C_BROADCAST, C_BCAST,     C_REDUCE,
                                   C_ALLTOALL,      C_GATHER,    C_SCATTER};
    c->kind = kinds[below(r, sizeof(kinds) / sizeof(kinds[0]))];
    c->dt = kTypes[below(r, sizeof(kTypes) / sizeof(kTypes[0]))];
    c->key = mix64(seed * 1000003u + (uint64_t)index);
    if (c->kind == C_ALLREDUCE && below(r, 3) == 0) {
        /* what Echo takes, large enough for the default rules */
        static const ncclDataType_t echo_types[] = {ncclBfloat16, ncclFloat16, ncclFloat32};
        c->dt = echo_types[below(r, 3)];
        c->op = ncclSum;
        c->count = random_count(r, c->dt, !grouped);
        if (!grouped && below(r, 2))
            c->count = ((1 << 20) + below(r, 1 << 20)) / prog_type_size(c->dt);
    } else {
        c->op = (c->kind == C_ALLREDUCE || c->kind == C_REDUCESCATTER || c->kind == C_REDUCE)
                    ? (int)below(r, 5)
                    : -1;
        c->count = random_count(r, c->dt, !grouped && c->kind == C_ALLREDUCE);
    }
    c->root = (int)below(r, (uint64_t)g_nranks);
    c->in_place = (int)below(r, 3) == 0;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        DIE("out of memory (%zu bytes)", n);
    memset(p, 0xcd, n ? n : 1);
    return p;
}

/* Allocates and fills the buffers and the expected result of c on this rank. */
static void prepare(call_t *c)
{
    const size_t es = prog_type_size(c->dt), n = c->count, P = (size_t)g_nranks;
    const int op = c->op < 0 ? ncclSum : c->op;
    size_t send_elems = n;
    c->recv_elems = n;
    switch (c->kind) {
    case C_ALLGATHER:
        c->recv_elems = n * P;
        break;
    case C_REDUCESCATTER:
    case C_ALLTOALL:
        send_elems = n * P;
        c->recv_elems = n * P;
        if (c->kind == C_REDUCESCATTER)
            c->recv_elems = n;
        break;
    case C_GATHER:
        c->recv_elems = n * P; /* read on the root only */
        break;
    case C_SCATTER:
        send_elems = n * P; /* read on the root only */
        break;
    default:
        break;
    }
    c->send = xmalloc(send_elems * es);
    c->recv = xmalloc(c->recv_elems * es);
    c->expect = xmalloc(c->recv_elems * es);
    fill(c->send, c->dt, op, c->key, g_rank, 0, send_elems);
    switch (c->kind) {
    case C_ALLREDUCE:
        expect_reduce(c->expect, c->dt, op, c->key, 0, n);
        break;
    case C_REDUCE:
        if (g_rank == c->root)
            expect_reduce(c->expect, c->dt, op, c->key, 0, n);
        else
            c->recv_elems = 0; /* recvbuff means nothing off the root */
        break;
    case C_REDUCESCATTER:
        expect_reduce(c->expect, c->dt, op, c->key, (size_t)g_rank * n, n);
        break;
    case C_ALLGATHER:
        for (int k = 0; k < g_nranks; k++)
            fill((char *)c->expect + (size_t)k * n * es, c->dt, op, c->key, k, 0, n);
        break;
    case C_BROADCAST:
    case C_BCAST:
        fill(c->expect, c->dt, op, c->key, c->root, 0, n);
        if (c->kind == C_BCAST && g_rank != c->root)
            memset(c->send, 0xee, n * es); /* Bcast's one buffer: only the root's is read */
        break;
    case C_ALLTOALL:
        for (int k = 0; k < g_nranks; k++)
            fill((char *)c->expect + (size_t)k * n * es, c->dt, op, c->key, k, (size_t)g_rank * n,
                 n);
        break;
    case C_GATHER:
        for (int k = 0; k < g_nranks; k++)
            fill((char *)c->expect + (size_t)k * n * es, c->dt, op, c->key, k, 0, n);
        break;
    case C_SCATTER:
        fill(c->expect, c->dt, op, c->key, c->root, (size_t)g_rank * n, n);
        break;
    case C_SENDRECV:
        fill(c->expect, c->dt, op, c->key, (g_rank + g_nranks - 1) % g_nranks, 0, n);
        break;
    default:
        break;
    }
    /* in place: the input goes where the output will be */
    if (c->in_place && c->kind == C_ALLREDUCE) {
        memcpy(c->recv, c->send, n * es);
    } else if (c->in_place && c->kind == C_ALLGATHER) {
        memcpy((char *)c->recv + (size_t)g_rank * n * es, c->send, n * es);
    } else if (c->in_place && c->kind == C_GATHER && g_rank == c->root) {
        memcpy((char *)c->recv + (size_t)g_rank * n * es, c->send, n * es);
    } else if (c->in_place &&
               (c->kind == C_REDUCESCATTER || (c->kind == C_SCATTER && g_rank == c->root))) {
        free(c->recv);
        c->recv = NULL; /* recvbuff is inside sendbuff */
    }
    if (c->kind == C_GATHER && g_rank != c->root)
        c->recv_elems = 0; /* recvbuff means nothing off the root */
}

static void *recv_ptr(const call_t *c)
{
    if (c->in_place && c->kind == C_REDUCESCATTER)
        return (char *)c->send + (size_t)g_rank * c->count * prog_type_size(c->dt);
    if (c->in_place && c->kind == C_SCATTER && g_rank == c->root)
        return (char *)c->send + (size_t)g_rank * c->count * prog_type_size(c->dt);
    return c->recv;
}

static const void *send_ptr(const call_t *c)
{
    if (c->in_place && c->kind == C_ALLREDUCE)
        return c->recv;
    if (c->in_place && (c->kind == C_ALLGATHER || (c->kind == C_GATHER && g_rank == c->root)))
        return (char *)c->recv + (size_t)g_rank * c->count * prog_type_size(c->dt);
    return c->send;
}

static ncclResult_t issue_call(call_t *c, ncclComm_t comm)
{
    const ncclDataType_t dt = c->dt;
    const size_t n = c->count;
    switch (c->kind) {
    case C_ALLREDUCE:
        return ncclAllReduce(send_ptr(c), recv_ptr(c), n, dt, (ncclRedOp_t)c->op, comm, NULL);
    case C_ALLGATHER:
        return ncclAllGather(send_ptr(c), recv_ptr(c), n, dt, comm, NULL);
    case C_REDUCESCATTER:
        return ncclReduceScatter(send_ptr(c), recv_ptr(c), n, dt, (ncclRedOp_t)c->op, comm, NULL);
    case C_BROADCAST:
        return ncclBroadcast(send_ptr(c), recv_ptr(c), n, dt, c->root, comm, NULL);
    case C_BCAST:
        return ncclBcast(c->send, n, dt, c->root, comm, NULL);
    case C_REDUCE:
        return ncclReduce(send_ptr(c), recv_ptr(c), n, dt, (ncclRedOp_t)c->op, c->root, comm, NULL);
    case C_ALLTOALL:
        return ncclAlltoAll(send_ptr(c), recv_ptr(c), n, dt, comm, NULL);
    case C_GATHER:
        return ncclGather(send_ptr(c), recv_ptr(c), n, dt, c->root, comm, NULL);
    case C_SCATTER:
        return ncclScatter(send_ptr(c), recv_ptr(c), n, dt, c->root, comm, NULL);
    case C_SENDRECV: {
        ncclResult_t rc = ncclSend(c->send, n, dt, (g_rank + 1) % g_nranks, comm, NULL);
        if (rc != ncclSuccess)
            return rc;
        return ncclRecv(c->recv, n, dt, (g_rank + g_nranks - 1) % g_nranks, comm, NULL);
    }
    default:
        return ncclInvalidUsage;
    }
}

/* Issues c and notes how far the fake's counters of its functions moved meanwhile (the fake
 * counts a call when it is made, also inside a group). */
static ncclResult_t issue(call_t *c, ncclComm_t comm)
{
    const long send0 = fake_count(kFunctions[c->kind]), recv0 = fake_count("Recv");
    const ncclResult_t rc = issue_call(c, comm);
    c->moved[0] = fake_count(kFunctions[c->kind]) - send0;
    c->moved[1] = fake_count("Recv") - recv0;
    return rc;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    uint64_t h = 0x12345678u;
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Checks c's result and prints its line; group says whether it was issued inside a group. */
static void finish(call_t *c, int index, int group)
{
    const size_t es = prog_type_size(c->dt), n = c->count;
    const void *out = c->kind == C_BCAST ? c->send : recv_ptr(c);
    const size_t bytes = c->recv_elems * es;
    const int exact = memcmp(out, c->expect, bytes) == 0;
    double err = 0;
    if (!exact) {
        const int echo_ok = c->kind == C_ALLREDUCE && c->op == ncclSum &&
                            (c->dt == ncclFloat32 || c->dt == ncclFloat16 || c->dt == ncclBfloat16);
        double num = 0, den = 0;
        size_t first_bad = 0;
        for (size_t j = 0; j < c->recv_elems; j++)
            if (memcmp((const char *)out + j * es, (const char *)c->expect + j * es, es) != 0) {
                first_bad = j;
                break;
            }
        if (!echo_ok)
            DIE("call %d (%s dtype=%d op=%d count=%zu root=%d in_place=%d): element %zu differs "
                "from the reference",
                index, kFunctions[c->kind], (int)c->dt, c->op, n, c->root, c->in_place, first_bad);
        for (size_t j = 0; j < c->recv_elems; j++) {
            const double e = load_float(c->expect, j, c->dt), a = load_float(out, j, c->dt);
            num += (a - e) * (a - e);
            den += e * e;
        }
        err = den > 0 ? sqrt(num / den) : INFINITY;
        if (!(err <= 0.16))
            DIE("call %d (AllReduce sum dtype=%d count=%zu): relative L2 error %.4f is past "
                "Echo's bound 0.16",
                index, (int)c->dt, n, err);
    }
    const long moved = c->moved[0];
    if (c->kind == C_SENDRECV && c->moved[1] != moved)
        DIE("call %d: Send and Recv went to different backends", index);
    if (moved != 0 && moved != 1)
        DIE("call %d: the fake counted %ld calls of %s", index, moved, kFunctions[c->kind]);
    /* AllReduce, AllGather and the broadcasts end with the same bytes on every rank */
    const int same_everywhere = c->kind == C_ALLREDUCE || c->kind == C_ALLGATHER ||
                                c->kind == C_BROADCAST || c->kind == C_BCAST;
    char hash[32] = "-";
    if (same_everywhere)
        snprintf(hash, sizeof(hash), "%016llx", (unsigned long long)hash_bytes(out, bytes));
    printf("CALL %d %s dtype=%d op=%d count=%zu group=%d backend=%s result=%s", index,
           kFunctions[c->kind], (int)c->dt, c->op, n, group, moved ? "nccl" : "shim",
           exact ? "exact" : "approx");
    if (!exact)
        printf(" err=%.4f", err);
    printf(" hash=%s\n", hash);
    fflush(stdout);
    free(c->send);
    free(c->recv);
    free(c->expect);
}

/* ---- set-up -------------------------------------------------------------------------------- */

static int env_int(const char *name, int def)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : def;
}

static void share_id(ncclUniqueId *id, const char *dir)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/nccl-id", dir);
    if (g_rank == 0) {
        NCCL_OK(ncclGetUniqueId(id));
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (f == NULL || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0)
            DIE("cannot write %s: %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0)
            DIE("cannot rename %s: %s", tmp, strerror(errno));
        return;
    }
    for (int waited_ms = 0; waited_ms < 30000; waited_ms += 5) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof(*id), 1, f);
            fclose(f);
            if (got == 1)
                return;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    DIE("rank 0 left no id in %s within 30 s", path);
}

int main(void)
{
    g_rank = env_int("ROUTE_RANK", -1);
    g_nranks = env_int("ROUTE_NRANKS", 0);
    const char *dir = getenv("ROUTE_DIR");
    const uint64_t seed = (uint64_t)env_int("ROUTE_SEED", 1);
    const int ncalls = env_int("ROUTE_CALLS", 40);
    const int expect_invalid = env_int("ROUTE_EXPECT_INVALID", 0);
    if (g_rank < 0 || g_nranks < 1 || g_rank >= g_nranks || dir == NULL)
        DIE("set ROUTE_RANK, ROUTE_NRANKS and ROUTE_DIR");

    ncclUniqueId id;
    share_id(&id, dir);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.commName = getenv("ROUTE_COMM_NAME") ? getenv("ROUTE_COMM_NAME") : "world";
    ncclComm_t comm = NULL;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &config);
    if (expect_invalid && rc != ncclSuccess) {
        printf("INVALID init %d: %s\n", (int)rc, ncclGetLastError(NULL));
        return rc == ncclInvalidArgument ? 0 : 1;
    }
    if (rc != ncclSuccess)
        DIE("ncclCommInitRankConfig failed: %s (%s)", ncclGetErrorString(rc),
            ncclGetLastError(NULL));

    /* the real library is open now: find the fake's counters in the same object */
    const char *real = getenv("LOOM_NCCL_LIBRARY");
    void *lib = real ? dlopen(real, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (lib)
        fake_count = (long (*)(const char *))dlsym(lib, "fakeNcclCallCount");
    if (fake_count == NULL)
        DIE("the fake NCCL (LOOM_NCCL_LIBRARY=%s) is not loaded or has no fakeNcclCallCount",
            real ? real : "(unset)");

    if (expect_invalid) {
        float x = 1, y = 0;
        rc = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
        printf("INVALID call %d: %s\n", (int)rc, ncclGetLastError(comm));
        ncclCommDestroy(comm);
        return rc == ncclInvalidArgument ? 0 : 1;
    }

    rng_t r = {seed};
    call_t calls[4];
    for (int index = 0; index < ncalls;) {
        const uint64_t what = below(&r, 10);
        if (what < 7) { /* one collective alone; a seventh of them the default rules' kind */
            make_call(&r, &calls[0], index, seed, 0);
            if (what == 0) {
                static const ncclDataType_t halfs[] = {ncclBfloat16, ncclFloat16};
                calls[0].kind = C_ALLREDUCE;
                calls[0].dt = halfs[below(&r, 2)];
                calls[0].op = ncclSum;
                calls[0].count = ((1 << 20) + below(&r, 1 << 20)) / 2;
            }
            prepare(&calls[0]);
            NCCL_OK(issue(&calls[0], comm));
            finish(&calls[0], index++, 0);
        } else if (what < 9) { /* a group of 2 or 3 collectives, sometimes with a ring in it */
            const int n = 2 + (int)below(&r, 2);
            for (int k = 0; k < n; k++) {
                make_call(&r, &calls[k], index + k, seed, 1);
                if (k == n - 1 && below(&r, 2)) {
                    calls[k].kind = C_SENDRECV;
                    calls[k].op = -1;
                }
                prepare(&calls[k]);
            }
            NCCL_OK(ncclGroupStart());
            for (int k = 0; k < n; k++)
                NCCL_OK(issue(&calls[k], comm));
            NCCL_OK(ncclGroupEnd());
            for (int k = 0; k < n; k++)
                finish(&calls[k], index + k, 1);
            index += n;
        } else { /* a ring of Send/Recv in a group of its own */
            make_call(&r, &calls[0], index, seed, 1);
            calls[0].kind = C_SENDRECV;
            calls[0].op = -1;
            prepare(&calls[0]);
            NCCL_OK(ncclGroupStart());
            NCCL_OK(issue(&calls[0], comm));
            NCCL_OK(ncclGroupEnd());
            finish(&calls[0], index++, 1);
        }
    }
    NCCL_OK(ncclCommDestroy(comm));
    printf("DONE %d calls\n", ncalls);
    return 0;
}

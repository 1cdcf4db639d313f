/* SPDX-License-Identifier: Apache-2.0
 *
 * device_ranks_cases.c - the cases of device_ranks (device_ranks.h): every
 * collective and Echo, run twice on each rank - on host buffers with the NULL
 * stream (the reference: loom's results do not depend on where the buffers are)
 * and on device buffers (loomMemAlloc) queued on the rank's stream - and compared
 * bit for bit, bytes the call must leave alone included. Where every rank gets
 * the same result, the ranks also compare hashes of theirs. Inputs are random
 * finite values of each type, different on every rank.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ranks.h"
#include "loom_echo.h"

#define POISON 0x5a /* every byte of a receive buffer before the call */

typedef enum {
    K_ALLREDUCE,
    K_ALLREDUCE_IN_PLACE,
    K_ALLGATHER,
    K_REDUCESCATTER,
    K_BROADCAST,
    K_REDUCE,
    K_ALLTOALL,
    K_ALLTOALLV,
    K_ALLGATHERV,
    K_REDUCESCATTERV,
    K_SENDRECV,
    K_ECHO,
} kind_t;

static const char *const kind_names[] = {
    "AllReduce", "AllReduce in place", "AllGather",  "ReduceScatter",  "Broadcast", "Reduce",
    "AllToAll",  "AllToAllv",          "AllGatherV", "ReduceScatterV", "Send/Recv", "Echo"};

typedef struct {
    kind_t kind;
    loomDataType_t dt;
    loomRedOp_t op;
    int large; /* count * 9216 + 3 elements instead of count: past the transports' chunks */
} dcase_t;

static const dcase_t cases[] = {
    {K_ALLREDUCE, loomFloat32, loomSum, 0},     {K_ALLREDUCE, loomFloat32, loomProd, 0},
    {K_ALLREDUCE, loomFloat32, loomMax, 0},     {K_ALLREDUCE, loomFloat32, loomMin, 0},
    {K_ALLREDUCE, loomFloat32, loomAvg, 0},     {K_ALLREDUCE, loomFloat16, loomSum, 0},
    {K_ALLREDUCE, loomFloat16, loomProd, 0},    {K_ALLREDUCE, loomFloat16, loomMax, 0},
    {K_ALLREDUCE, loomFloat16, loomMin, 0},     {K_ALLREDUCE, loomFloat16, loomAvg, 0},
    {K_ALLREDUCE, loomBfloat16, loomSum, 0},    {K_ALLREDUCE, loomBfloat16, loomProd, 0},
    {K_ALLREDUCE, loomBfloat16, loomMax, 0},    {K_ALLREDUCE, loomBfloat16, loomMin, 0},
    {K_ALLREDUCE, loomBfloat16, loomAvg, 0},    {K_ALLREDUCE, loomInt32, loomSum, 0},
    {K_ALLREDUCE, loomInt32, loomProd, 0},      {K_ALLREDUCE, loomInt32, loomMax, 0},
    {K_ALLREDUCE, loomInt32, loomMin, 0},       {K_ALLREDUCE, loomInt32, loomAvg, 0},
    {K_ALLREDUCE, loomFloat32, loomSum, 1},     {K_ALLREDUCE_IN_PLACE, loomBfloat16, loomSum, 0},
    {K_ALLGATHER, loomFloat32, loomSum, 0},     {K_ALLGATHER, loomBfloat16, loomSum, 0},
    {K_REDUCESCATTER, loomFloat32, loomSum, 0}, {K_REDUCESCATTER, loomBfloat16, loomAvg, 0},
    {K_BROADCAST, loomInt32, loomSum, 0},       {K_REDUCE, loomFloat32, loomMax, 0},
    {K_ALLTOALL, loomFloat16, loomSum, 0},      {K_ALLTOALLV, loomFloat32, loomSum, 0},
    {K_ALLGATHERV, loomBfloat16, loomSum, 0},   {K_REDUCESCATTERV, loomFloat32, loomSum, 0},
    {K_SENDRECV, loomFloat32, loomSum, 0},      {K_ECHO, loomFloat32, loomSum, 0},
    {K_ECHO, loomBfloat16, loomSum, 0},         {K_ECHO, loomBfloat16, loomSum, 1},
};

static size_t dt_size(loomDataType_t dt)
{
    return dt == loomFloat32 || dt == loomInt32 ? 4 : 2;
}

static const char *dt_name(loomDataType_t dt)
{
    return dt == loomFloat32    ? "float32"
           : dt == loomFloat16  ? "float16"
           : dt == loomBfloat16 ? "bfloat16"
                                : "int32";
}

static const char *op_name(loomRedOp_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}

// ---- Shapes ------------------------------------------------------------------------

/* One case's buffers on one rank, in elements; the V collectives' count arrays. */
typedef struct {
    size_t send_n, recv_n;
    size_t *counts, *displs;   /* recvcounts/displs (V), recvcounts/rdispls (AllToAllv) */
    size_t *scounts, *sdispls; /* AllToAllv's send side */
    int shared;                /* every rank's result is the same */
    int checks;                /* this rank has a result (Reduce: the root only) */
    int root;
} shape_t;

/* AllToAllv: rank a sends rank b c + a + b elements. */
static size_t a2av_count(size_t c, int a, int b)
{
    return c + (size_t)a + (size_t)b;
}

static int shape_make(shape_t *s, kind_t k, size_t c, int rank, int n)
{
    memset(s, 0, sizeof(*s));
    s->counts = calloc((size_t)n, sizeof(size_t));
    s->displs = calloc((size_t)n, sizeof(size_t));
    s->scounts = calloc((size_t)n, sizeof(size_t));
    s->sdispls = calloc((size_t)n, sizeof(size_t));
    if (!s->counts || !s->displs || !s->scounts || !s->sdispls)
        return -1;
    const size_t nn = (size_t)n;
    s->send_n = s->recv_n = c;
    s->checks = 1;
    size_t total = 0, stotal = 0;
    for (int j = 0; j < n; j++) {
        s->counts[j] = k == K_ALLTOALLV ? a2av_count(c, j, rank) : c + (size_t)j;
        s->displs[j] = total;
        total += s->counts[j];
        s->scounts[j] = a2av_count(c, rank, j);
        s->sdispls[j] = stotal;
        stotal += s->scounts[j];
    }
    switch (k) {
    case K_ALLREDUCE:
    case K_ALLREDUCE_IN_PLACE:
    case K_ECHO:
        s->shared = 1;
        break;
    case K_ALLGATHER:
        s->recv_n = c * nn;
        s->shared = 1;
        break;
    case K_REDUCESCATTER:
        s->send_n = c * nn;
        break;
    case K_BROADCAST:
        s->root = n - 1;
        s->shared = 1;
        break;
    case K_REDUCE:
        s->checks = rank == 0;
        break;
    case K_ALLTOALL:
        s->send_n = s->recv_n = c * nn;
        break;
    case K_ALLTOALLV:
        s->send_n = stotal;
        s->recv_n = total;
        break;
    case K_ALLGATHERV:
        s->send_n = s->counts[rank];
        s->recv_n = total;
        s->shared = 1;
        break;
    case K_REDUCESCATTERV:
        s->send_n = total;
        s->recv_n = s->counts[rank];
        break;
    case K_SENDRECV:
        break;
    }
    return 0;
}

static void shape_free(shape_t *s)
{
    free(s->counts);
    free(s->displs);
    free(s->scounts);
    free(s->sdispls);
}

// ---- Values ------------------------------------------------------------------------

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Finite values with exponents within a few octaves of 1 (prod of up to 64 ranks stays
 * finite in float32; float16 and bfloat16 may overflow to inf alike on both paths). */
static void fill(void *buf, size_t n, loomDataType_t dt, loomRedOp_t op, uint64_t seed, int rank)
{
    const uint64_t key = mix(seed * 0x100000001b3ull + (uint64_t)rank);
    for (size_t i = 0; i < n; i++) {
        const uint64_t h = mix(key ^ i);
        const uint32_t sign = (uint32_t)(h >> 63);
        if (dt == loomFloat32) {
            uint32_t v =
                sign << 31 | (uint32_t)(124 + h % 7) << 23 | ((uint32_t)(h >> 8) & 0x7fffff);
            memcpy((char *)buf + 4 * i, &v, 4);
        } else if (dt == loomBfloat16) {
            uint16_t v = (uint16_t)(sign << 15 | (uint32_t)(124 + h % 7) << 7 | ((h >> 8) & 0x7f));
            memcpy((char *)buf + 2 * i, &v, 2);
        } else if (dt == loomFloat16) {
            uint16_t v = (uint16_t)(sign << 15 | (uint32_t)(12 + h % 7) << 10 | ((h >> 8) & 0x3ff));
            memcpy((char *)buf + 2 * i, &v, 2);
        } else { /* int32: small, and +-1 or 2 for prod, so no product overflows */
            int32_t v = op == loomProd ? (int32_t)(h % 2 + 1) * (sign ? -1 : 1)
                                       : (int32_t)(h % 2001) - 1000;
            memcpy((char *)buf + 4 * i, &v, 4);
        }
    }
}

static uint64_t fnv1a(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

// ---- One call ------------------------------------------------------------------------

static loomResult_t issue(const dcase_t *dc, const shape_t *s, size_t c, const void *send,
                          void *recv, const dr_rank_t *r, loomStream_t st)
{
    loomComm_t comm = r->comm;
    switch (dc->kind) {
    case K_ALLREDUCE:
    case K_ALLREDUCE_IN_PLACE:
        return loomAllReduce(send, recv, c, dc->dt, dc->op, comm, st);
    case K_ALLGATHER:
        return loomAllGather(send, recv, c, dc->dt, comm, st);
    case K_REDUCESCATTER:
        return loomReduceScatter(send, recv, c, dc->dt, dc->op, comm, st);
    case K_BROADCAST:
        return loomBroadcast(send, recv, c, dc->dt, s->root, comm, st);
    case K_REDUCE:
        return loomReduce(send, recv, c, dc->dt, dc->op, 0, comm, st);
    case K_ALLTOALL:
        return loomAllToAll(send, recv, c, dc->dt, comm, st);
    case K_ALLTOALLV:
        return loomAllToAllv(send, s->scounts, s->sdispls, recv, s->counts, s->displs, dc->dt, comm,
                             st);
    case K_ALLGATHERV:
        return loomAllGatherV(send, s->send_n, recv, s->counts, s->displs, dc->dt, comm, st);
    case K_REDUCESCATTERV:
        return loomReduceScatterV(send, recv, s->counts, dc->dt, dc->op, comm, st);
    case K_SENDRECV: {
        loomResult_t res = loomGroupStart();
        if (res != loomSuccess)
            return res;
        res = loomSend(send, c, dc->dt, (r->rank + 1) % r->nranks, comm, st);
        if (res == loomSuccess)
            res = loomRecv(recv, c, dc->dt, (r->rank + r->nranks - 1) % r->nranks, comm, st);
        loomResult_t end = loomGroupEnd();
        return res != loomSuccess ? res : end;
    }
    case K_ECHO:
        return loomEchoAllReduce(send, recv, c, dc->dt, comm, NULL, st);
    }
    return loomInvalidArgument;
}

// ---- One case --------------------------------------------------------------------------

typedef struct {
    char *send, *ref, *got; /* host: input, the host call's result, the device call's */
    void *dsend, *drecv;    /* device: made once for every case (dr_run_cases) */
} bufs_t;

/* Keeps the first failure: the case, then where and what. */
static void note(dr_rank_t *r, const dcase_t *dc, size_t c, const char *where, const char *what)
{
    const int reduces = dc->kind == K_ALLREDUCE || dc->kind == K_ALLREDUCE_IN_PLACE ||
                        dc->kind == K_REDUCESCATTER || dc->kind == K_REDUCE ||
                        dc->kind == K_REDUCESCATTERV;
    if (r->first[0] == '\0')
        snprintf(r->first, sizeof(r->first), "%s %s%s%s count %zu: %s%s", kind_names[dc->kind],
                 dt_name(dc->dt), reduces ? " " : "", reduces ? op_name(dc->op) : "", c, where,
                 what);
}

/* A loom call failed: the communicator cannot be trusted to line up again. */
static int call_failed(dr_rank_t *r, const dcase_t *dc, size_t c, const char *where,
                       loomResult_t res)
{
    char detail[256];
    snprintf(detail, sizeof(detail), "%s (%s)", loomGetErrorString(res), loomGetLastError(r->comm));
    note(r, dc, c, where, detail);
    r->failed++;
    return -1;
}

static int run_case(dr_rank_t *r, const dcase_t *dc, size_t c, uint64_t seed, bufs_t *b)
{
    shape_t s;
    const size_t es = dt_size(dc->dt);
    char why[256];
    if (shape_make(&s, dc->kind, c, r->rank, r->nranks) != 0) {
        shape_free(&s);
        return call_failed(r, dc, c, "out of memory: ", loomSystemError);
    }
    const int in_place = dc->kind == K_ALLREDUCE_IN_PLACE;
    const size_t sbytes = s.send_n * es, rbytes = s.recv_n * es;
    int rc = 0;
    b->send = malloc(sbytes + 1);
    b->ref = malloc(rbytes + 1);
    b->got = malloc(rbytes + 1);
    loomResult_t res = b->send && b->ref && b->got ? loomSuccess : loomSystemError;
    if (res != loomSuccess) {
        rc = call_failed(r, dc, c, "host memory: ", res);
        goto out;
    }
    fill(b->send, s.send_n, dc->dt, dc->op, seed, r->rank);
    memset(b->ref, POISON, rbytes);
    memset(b->got, POISON, rbytes);

    /* The reference: host buffers, blocking. In place: on a copy of the input. */
    if (in_place)
        memcpy(b->ref, b->send, sbytes);
    res = issue(dc, &s, c, in_place ? b->ref : b->send, b->ref, r, NULL);
    if (res != loomSuccess) {
        rc = call_failed(r, dc, c, "on host buffers: ", res);
        goto out;
    }
    /* The same on device buffers, queued on the rank's stream. */
    void *drecv = in_place ? b->dsend : b->drecv;
    if (dr_copy(r, b->dsend, b->send, sbytes, 1, why, sizeof(why)) != 0 ||
        (!in_place && dr_copy(r, drecv, b->got, rbytes, 1, why, sizeof(why)) != 0)) {
        note(r, dc, c, "copy to the device: ", why);
        r->failed++;
        rc = -1;
        goto out;
    }
    res = issue(dc, &s, c, b->dsend, drecv, r, r->stream);
    if (res == loomSuccess)
        res = loomStreamSynchronize(r->stream);
    if (res != loomSuccess) {
        rc = call_failed(r, dc, c, "on device buffers: ", res);
        goto out;
    }
    if (dr_copy(r, b->got, drecv, rbytes, 0, why, sizeof(why)) != 0) {
        note(r, dc, c, "copy from the device: ", why);
        r->failed++;
        rc = -1;
        goto out;
    }
    r->cases++;
    int bad = 0;
    if (s.checks && memcmp(b->got, b->ref, rbytes) != 0) {
        size_t i = 0;
        while (i < s.recv_n && memcmp(b->got + i * es, b->ref + i * es, es) == 0)
            i++;
        char d[96];
        snprintf(d, sizeof(d), "element %zu of %zu differs from the host call's", i, s.recv_n);
        note(r, dc, c, "device buffers: ", d);
        bad = 1;
    }
    /* Results every rank shares: the same bits everywhere (hashes over the host path). */
    if (s.shared) {
        uint64_t mine = fnv1a(b->got, rbytes);
        uint64_t *all = calloc((size_t)r->nranks, sizeof(*all));
        res = all ? loomAllGather(&mine, all, 1, loomUint64, r->comm, NULL) : loomSystemError;
        if (res != loomSuccess) {
            free(all);
            rc = call_failed(r, dc, c, "exchanging result hashes: ", res);
            goto out;
        }
        for (int j = 0; j < r->nranks && !bad; j++)
            if (all[j] != mine) {
                char d[96];
                snprintf(d, sizeof(d), "rank %d's result differs from rank %d's", j, r->rank);
                note(r, dc, c, "across ranks: ", d);
                bad = 1;
            }
        free(all);
    }
    r->failed += bad;
out:
    free(b->send);
    free(b->ref);
    free(b->got);
    b->send = b->ref = b->got = NULL;
    shape_free(&s);
    return rc;
}

static size_t case_count(const dcase_t *dc, size_t count)
{
    return dc->large ? count * 9216 + 3 : count;
}

int dr_run_cases(dr_rank_t *r, size_t count)
{
    const size_t ncases = sizeof(cases) / sizeof(cases[0]);
    /* Device memory once for every case, freed after a barrier: freeing synchronizes the
     * device (cudaFree; the emulation alike), and ranks that are threads sharing it would then
     * wait for a peer's stream, which waits for this rank's next call. */
    size_t smax = 1, rmax = 1;
    for (size_t i = 0; i < ncases; i++) {
        shape_t s;
        if (shape_make(&s, cases[i].kind, case_count(&cases[i], count), r->rank, r->nranks) == 0) {
            const size_t es = dt_size(cases[i].dt);
            smax = s.send_n * es > smax ? s.send_n * es : smax;
            rmax = s.recv_n * es > rmax ? s.recv_n * es : rmax;
        }
        shape_free(&s);
    }
    bufs_t b = {0};
    loomResult_t res = loomMemAlloc(&b.dsend, smax);
    if (res == loomSuccess)
        res = loomMemAlloc(&b.drecv, rmax);
    int rc = 0;
    if (res != loomSuccess)
        rc = call_failed(r, &cases[0], count, "loomMemAlloc: ", res);
    for (size_t i = 0; i < ncases && rc == 0; i++)
        rc = run_case(r, &cases[i], case_count(&cases[i], count), (uint64_t)i + 1, &b);
    if (rc == 0 && (res = loomBarrier(r->comm, NULL)) != loomSuccess)
        rc = call_failed(r, &cases[ncases - 1], count, "the barrier before loomMemFree: ", res);
    if (b.dsend && (res = loomMemFree(b.dsend)) != loomSuccess && rc == 0)
        rc = call_failed(r, &cases[ncases - 1], count, "loomMemFree: ", res);
    if (b.drecv && (res = loomMemFree(b.drecv)) != loomSuccess && rc == 0)
        rc = call_failed(r, &cases[ncases - 1], count, "loomMemFree: ", res);
    return rc;
}

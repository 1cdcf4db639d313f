/* SPDX-License-Identifier: Apache-2.0
 *
 * all_gather.c - all_gather_perf: loomAllGather measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): per-rank
 * count rounded down to 16 bytes, in place at recvbuff + rank * sendcount,
 * the expected concatenation, algbw bytes (sendcount x size x n) and the busbw
 * factor (n-1)/n. Built as the all_gather_perf program by bench/meson.build,
 * and with BENCH_V as all_gatherv_perf: loomAllGatherV with the uneven pattern
 * of common.h (rank r sends (r+1) units; the "count" column is the unit, algbw
 * bytes the whole gathered vector, busbw factor (n-1)/n as for AllGather).
 */
#include "common.h"

#ifndef BENCH_V
static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    size_t base = bench_round16(count / (size_t)nranks, elt_size);
    *c = (bench_counts_t){.send_count = base,
                          .recv_count = base * (size_t)nranks,
                          .param_count = base,
                          .send_inplace_off = base};
}

/* Block r of the result is rank r's input. */
static size_t expected(const bench_ctx_t *ctx, void *out)
{
    size_t base = ctx->counts.param_count;
    for (int r = 0; r < ctx->nranks; r++)
        bench_fill_input(ctx, (char *)out + (size_t)r * base * ctx->elt_size, base, r, 0);
    return ctx->counts.recv_count;
}

/* Each rank receives the n-1 blocks it does not have. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)count * (double)elt_size * nranks;
    *factor = (double)(nranks - 1) / nranks;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)op;
    (void)root;
    return loomAllGather(sendbuff, recvbuff, count, dtype, comm, stream);
}
#else
/* The largest block is sent from (every rank fills only its own), all blocks received. */
static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    size_t unit = bench_v_unit(count, elt_size, nranks);
    *c = (bench_counts_t){.send_count = bench_v_block(unit, nranks - 1),
                          .recv_count = bench_v_displ(unit, nranks),
                          .param_count = unit};
}

static void init_data(const bench_ctx_t *ctx, void *sendbuff)
{
    bench_fill_input(ctx, sendbuff, bench_v_block(ctx->counts.param_count, ctx->rank), ctx->rank,
                     0);
}

static size_t expected(const bench_ctx_t *ctx, void *out)
{
    size_t unit = ctx->counts.param_count;
    for (int r = 0; r < ctx->nranks; r++)
        bench_fill_input(ctx, (char *)out + bench_v_displ(unit, r) * ctx->elt_size,
                         bench_v_block(unit, r), r, 0);
    return ctx->counts.recv_count;
}

static size_t inplace_at(const bench_ctx_t *ctx, int send_inplace)
{
    return send_inplace ? bench_v_displ(ctx->counts.param_count, ctx->rank) : 0;
}

/* count is the unit: the gathered vector is n(n+1)/2 units. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)bench_v_displ(count, nranks) * (double)elt_size;
    *factor = (double)(nranks - 1) / nranks;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)op;
    (void)root;
    const size_t *counts, *displs;
    int rank = 0;
    loomResult_t res = bench_v_arrays(comm, stream, count, &counts, &displs, &rank);
    if (res != loomSuccess)
        return res;
    return loomAllGatherV(sendbuff, counts[rank], recvbuff, counts, displs, dtype, comm, stream);
}
#endif

static const bench_coll_t all_gather = {
#ifdef BENCH_V
    .name = "AllGatherV",
    .init_data = init_data,
    .inplace_at = inplace_at,
#else
    .name = "AllGather",
    .init_data = bench_init_rank_input,
#endif
    .flags = 0,
    .get_counts = get_counts,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &all_gather);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce_scatter.c - reduce_scatter_perf: loomReduceScatter in nccl-tests'
 * shape. Describes the collective to the shared driver (bench/common.c):
 * per-rank count rounded down to 16 bytes, in place at sendbuff + rank *
 * recvcount, the expected reduced block, algbw bytes (recvcount x size x n)
 * and the busbw factor (n-1)/n. Built as reduce_scatter_perf by bench/meson.build,
 * and with BENCH_V as reduce_scatterv_perf: loomReduceScatterV with the uneven
 * pattern of common.h (rank r gets (r+1) units; the "count" column is the unit,
 * algbw bytes the whole input vector, busbw factor (n-1)/n as for ReduceScatter).
 */
#include "common.h"

#ifndef BENCH_V
static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    size_t base = bench_round16(count / (size_t)nranks, elt_size);
    *c = (bench_counts_t){.send_count = base * (size_t)nranks,
                          .recv_count = base,
                          .param_count = base,
                          .recv_inplace_off = base};
}

/* This rank gets block `rank` of every rank's input, reduced. */
static size_t expected(const bench_ctx_t *ctx, void *out)
{
    size_t base = ctx->counts.recv_count;
    bench_fill_reduced(ctx, out, base, (size_t)ctx->rank * base);
    return base;
}

/* Each rank sends the n-1 blocks that other ranks own. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)count * (double)elt_size * nranks;
    *factor = (double)(nranks - 1) / nranks;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)root;
    return loomReduceScatter(sendbuff, recvbuff, count, dtype, op, comm, stream);
}
#else
/* Every rank's input is the whole vector; the largest block is received into. */
static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    size_t unit = bench_v_unit(count, elt_size, nranks);
    *c = (bench_counts_t){.send_count = bench_v_displ(unit, nranks),
                          .recv_count = bench_v_block(unit, nranks - 1),
                          .param_count = unit};
}

static size_t expected(const bench_ctx_t *ctx, void *out)
{
    size_t unit = ctx->counts.param_count, mine = bench_v_block(unit, ctx->rank);
    bench_fill_reduced(ctx, out, mine, bench_v_displ(unit, ctx->rank));
    return mine;
}

static size_t inplace_at(const bench_ctx_t *ctx, int send_inplace)
{
    return send_inplace ? 0 : bench_v_displ(ctx->counts.param_count, ctx->rank);
}

/* count is the unit: the input vector is n(n+1)/2 units. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)bench_v_displ(count, nranks) * (double)elt_size;
    *factor = (double)(nranks - 1) / nranks;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)root;
    const size_t *counts, *displs;
    int rank = 0;
    loomResult_t res = bench_v_arrays(comm, stream, count, &counts, &displs, &rank);
    if (res != loomSuccess)
        return res;
    return loomReduceScatterV(sendbuff, recvbuff, counts, dtype, op, comm, stream);
}
#endif

static const bench_coll_t reduce_scatter = {
#ifdef BENCH_V
    .name = "ReduceScatterV",
    .inplace_at = inplace_at,
#else
    .name = "ReduceScatter",
#endif
    .flags = BENCH_REDUCES,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &reduce_scatter);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce_scatter.c - reduce_scatter_perf: loomReduceScatter in nccl-tests'
 * shape. Describes the collective to the shared driver (bench/common.c):
 * per-rank count rounded down to 16 bytes, in place at sendbuff + rank *
 * recvcount, the expected reduced block, algbw bytes (recvcount x size x n)
 * and the busbw factor (n-1)/n. Built as reduce_scatter_perf by bench/meson.build.
 */
#include "common.h"

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

static const bench_coll_t reduce_scatter = {
    .name = "ReduceScatter",
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

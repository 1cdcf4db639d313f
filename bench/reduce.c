/* SPDX-License-Identifier: Apache-2.0
 *
 * reduce.c - reduce_perf: loomReduce measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): counts,
 * the expected reduction (checked on the root only: other ranks' recvbuff is
 * not written), algbw bytes (count x size) and the busbw factor 1 (all data
 * enters the root through its one link). Built as reduce_perf by bench/meson.build.
 */
#include "common.h"

static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    (void)elt_size;
    (void)nranks;
    *c = (bench_counts_t){.send_count = count, .recv_count = count, .param_count = count};
}

static size_t expected(const bench_ctx_t *ctx, void *out)
{
    if (ctx->rank != ctx->root)
        return 0;
    bench_fill_reduced(ctx, out, ctx->counts.recv_count, 0);
    return ctx->counts.recv_count;
}

static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    (void)nranks;
    *bytes = (double)count * (double)elt_size;
    *factor = 1.0;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    return loomReduce(sendbuff, recvbuff, count, dtype, op, root, comm, stream);
}

static const bench_coll_t reduce = {
    .name = "Reduce",
    .flags = BENCH_REDUCES | BENCH_ROOTED,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &reduce);
}

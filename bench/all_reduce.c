/* SPDX-License-Identifier: Apache-2.0
 *
 * all_reduce.c - all_reduce_perf: loomAllReduce measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): buffer
 * counts, verifiable inputs, the expected reduction, algbw bytes (count x
 * size) and the busbw factor 2(n-1)/n. Flags, timing and output are the
 * driver's. Built as the all_reduce_perf program by bench/meson.build.
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
    bench_fill_reduced(ctx, out, ctx->counts.recv_count, 0);
    return ctx->counts.recv_count;
}

/* Every rank sends and receives 2(n-1)/n of the data in the best algorithm. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)count * (double)elt_size;
    *factor = 2.0 * (nranks - 1) / nranks;
}

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)root;
    return loomAllReduce(sendbuff, recvbuff, count, dtype, op, comm, stream);
}

static const bench_coll_t all_reduce = {
    .name = "AllReduce",
    .flags = BENCH_REDUCES,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &all_reduce);
}

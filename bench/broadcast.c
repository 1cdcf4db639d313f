/* SPDX-License-Identifier: Apache-2.0
 *
 * broadcast.c - broadcast_perf: loomBroadcast measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): counts,
 * the expected copy of the root's input, algbw bytes (count x size) and the
 * busbw factor 1 (all data leaves the root through its one link). -r picks
 * the root, or all of them. Built as broadcast_perf by bench/meson.build.
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
    bench_fill_input(ctx, out, ctx->counts.recv_count, ctx->root, 0);
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
    (void)op;
    return loomBroadcast(sendbuff, recvbuff, count, dtype, root, comm, stream);
}

static const bench_coll_t broadcast = {
    .name = "Broadcast",
    .flags = BENCH_ROOTED,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &broadcast);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * all_gather.c - all_gather_perf: loomAllGather measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): per-rank
 * count rounded down to 16 bytes, in place at recvbuff + rank * sendcount,
 * the expected concatenation, algbw bytes (sendcount x size x n) and the busbw
 * factor (n-1)/n. Built as the all_gather_perf program by bench/meson.build.
 */
#include "common.h"

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

static const bench_coll_t all_gather = {
    .name = "AllGather",
    .flags = 0,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &all_gather);
}

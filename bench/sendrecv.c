/* SPDX-License-Identifier: Apache-2.0
 *
 * sendrecv.c - sendrecv_perf: loomSend/loomRecv around a ring, in nccl-tests'
 * shape. Every rank sends to rank+1 and receives from rank-1 (mod n) inside
 * one group. Describes this to the shared driver (bench/common.c): counts,
 * the expected copy of the left neighbour's input, algbw bytes (count x size)
 * and the busbw factor 1. In place is not measured (N/A columns).
 * Built as the sendrecv_perf program by bench/meson.build.
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
    int left = (ctx->rank - 1 + ctx->nranks) % ctx->nranks;
    bench_fill_input(ctx, out, ctx->counts.recv_count, left, 0);
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
    int rank, nranks;
    loomResult_t res;
    (void)op;
    (void)root;
    if ((res = loomCommUserRank(comm, &rank)) != loomSuccess ||
        (res = loomCommCount(comm, &nranks)) != loomSuccess)
        return res;
    if ((res = loomGroupStart()) != loomSuccess)
        return res;
    res = loomSend(sendbuff, count, dtype, (rank + 1) % nranks, comm, stream);
    if (res == loomSuccess)
        res = loomRecv(recvbuff, count, dtype, (rank - 1 + nranks) % nranks, comm, stream);
    loomResult_t end = loomGroupEnd(); /* always close the group, even after a failure */
    return res != loomSuccess ? res : end;
}

static const bench_coll_t sendrecv = {
    .name = "SendRecv",
    .flags = BENCH_NO_INPLACE,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &sendrecv);
}

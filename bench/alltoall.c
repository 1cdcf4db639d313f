/* SPDX-License-Identifier: Apache-2.0
 *
 * alltoall.c - alltoall_perf: loomAllToAll measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): per-peer
 * count rounded down to 16 bytes, the expected exchanged blocks, algbw bytes
 * (count x n x size) and the busbw factor (n-1)/n. In place is not measured
 * (NCCL has no in-place all-to-all): those columns print N/A.
 * Built twice by bench/meson.build: as alltoall_perf, and with
 * BENCH_ALLTOALLV as alltoallv_perf, which makes the same exchange through
 * loomAllToAllv (every count equal, displacements packed), so that
 * AllToAllv's own algorithms can be measured against AllToAll's.
 */
#include "common.h"

static void get_counts(size_t count, size_t elt_size, int nranks, bench_counts_t *c)
{
    size_t per_peer = bench_round16(count / (size_t)nranks, elt_size);
    *c = (bench_counts_t){.send_count = per_peer * (size_t)nranks,
                          .recv_count = per_peer * (size_t)nranks,
                          .param_count = per_peer};
}

/* Block r of the result is block `rank` of rank r's input. */
static size_t expected(const bench_ctx_t *ctx, void *out)
{
    size_t per_peer = ctx->counts.param_count;
    for (int r = 0; r < ctx->nranks; r++)
        bench_fill_input(ctx, (char *)out + (size_t)r * per_peer * ctx->elt_size, per_peer, r,
                         (size_t)ctx->rank * per_peer);
    return ctx->counts.recv_count;
}

/* Each rank keeps 1/n of its data and exchanges the rest. */
static void get_bw(size_t count, size_t elt_size, int nranks, double *bytes, double *factor)
{
    *bytes = (double)count * nranks * (double)elt_size;
    *factor = (double)(nranks - 1) / nranks;
}

#ifdef BENCH_ALLTOALLV
/* Equal counts and packed displacements for n peers. */
static void fill_equal(size_t *v, int n, size_t count)
{
    for (int r = 0; r < n; r++) {
        v[r] = count;
        v[n + r] = (size_t)r * count;
    }
}

static loomResult_t run_v(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                          loomComm_t comm, loomStream_t stream)
{
    size_t *v = NULL;
    int n = 0;
    loomResult_t res = bench_kept_arrays(comm, stream, count, fill_equal, &v, &n);
    if (res != loomSuccess)
        return res;
    return loomAllToAllv(sendbuff, v, v + n, recvbuff, v, v + n, dtype, comm, stream);
}
#endif

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)op;
    (void)root;
#ifdef BENCH_ALLTOALLV
    return run_v(sendbuff, recvbuff, count, dtype, comm, stream);
#else
    return loomAllToAll(sendbuff, recvbuff, count, dtype, comm, stream);
#endif
}

static const bench_coll_t alltoall = {
#ifdef BENCH_ALLTOALLV
    .name = "AlltoAllv",
#else
    .name = "AlltoAll",
#endif
    .flags = BENCH_NO_INPLACE,
    .get_counts = get_counts,
    .init_data = bench_init_rank_input,
    .expected = expected,
    .get_bw = get_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &alltoall);
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * all_reduce.c - all_reduce_perf: loomAllReduce measured in nccl-tests' shape.
 * Describes the collective to the shared driver (bench/common.c): buffer
 * counts, verifiable inputs, the expected reduction, algbw bytes (count x
 * size) and the busbw factor 2(n-1)/n. Flags, timing and output are the
 * driver's. Built as the all_reduce_perf program by bench/meson.build.
 */
#include "common.h"

static loomResult_t run(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t dtype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream)
{
    (void)root;
    return loomAllReduce(sendbuff, recvbuff, count, dtype, op, comm, stream);
}

static const bench_coll_t all_reduce = {
    .name = "AllReduce",
    .flags = BENCH_REDUCES,
    .get_counts = bench_allreduce_counts,
    .init_data = bench_init_rank_input,
    .expected = bench_allreduce_expected,
    .get_bw = bench_allreduce_bw,
    .run = run,
};

int main(int argc, char **argv)
{
    return bench_main(argc, argv, &all_reduce);
}

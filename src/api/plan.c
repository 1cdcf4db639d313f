/* SPDX-License-Identifier: Apache-2.0
 *
 * plan.c - loomCommPlan: which algorithm a collective call would run on a
 * communicator and what the cost model predicts for it, so that benchmarks
 * can print the model next to the measurement (bench -M 1) and users can
 * see the choice without running the call.
 */
#include "comm.h"

static const loom_coll_kind_t plan_kinds[loomNumCollectives] = {
    [loomCollAllReduce] = LOOM_COLL_ALLREDUCE,
    [loomCollAllGather] = LOOM_COLL_ALLGATHER,
    [loomCollReduceScatter] = LOOM_COLL_REDUCE_SCATTER,
    [loomCollBroadcast] = LOOM_COLL_BCAST,
    [loomCollReduce] = LOOM_COLL_REDUCE,
    [loomCollAllToAll] = LOOM_COLL_ALLTOALL,
};

static loomResult_t plan(loomComm_t comm, loomCollective_t collective, size_t count,
                         loomDataType_t datatype, const char **algorithm, double *predicted_us)
{
    if ((unsigned)collective >= (unsigned)loomNumCollectives) {
        LOOM_WARN("loomCommPlan: collective %d is not one of loomCollective_t", (int)collective);
        return loomInvalidArgument;
    }
    size_t bytes = 0;
    LOOM_CHECK(
        loom_check_common(NULL, datatype, count, (size_t)comm->nranks, "loomCommPlan", &bytes));
    loom_coll_args_t a = {
        .kind = plan_kinds[collective], .count = count, .dt = datatype, .op = loomSum, .root = 0};
    double ns = 0;
    const char *name = loom_coll_plan(&comm->coll, &a, &ns);
    if (name == NULL) {
        LOOM_WARN("loomCommPlan: no algorithm can run %s", loom_coll_name(a.kind));
        return loomInternalError;
    }
    if (algorithm)
        *algorithm = name;
    if (predicted_us)
        *predicted_us = ns < 0 ? -1.0 : ns / 1e3;
    return loomSuccess;
}

LOOM_API loomResult_t loomCommPlan(loomComm_t comm, loomCollective_t collective, size_t count,
                                   loomDataType_t datatype, const char **algorithm,
                                   double *predicted_us)
{
    LOOM_WITH_COMM(comm, "loomCommPlan",
                   plan(comm, collective, count, datatype, algorithm, predicted_us));
}

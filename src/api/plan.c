/* SPDX-License-Identifier: Apache-2.0
 *
 * plan.c - loomCommPlan: which algorithm a collective call would run on a
 * communicator and what the cost model predicts for it, so that benchmarks
 * can print the model next to the measurement (bench -M 1) and users can
 * see the choice without running the call. loomCommDeviceRuntime and
 * loomCommDevicePlan: the same questions for the device path, so that a
 * layer above loom (the drop-in NCCL library) can tell before a call whether
 * loom will take its device buffers and whether a CUDA graph may capture it.
 */
#include <math.h>
#include <stdio.h>

#include "comm.h"
#include "dev_comm.h"
#include "devrt.h"
#include "dtype.h"

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
        *predicted_us = ns < 0 || !isfinite(ns) ? -1.0 : ns / 1e3;
    return loomSuccess;
}

LOOM_API loomResult_t loomCommPlan(loomComm_t comm, loomCollective_t collective, size_t count,
                                   loomDataType_t datatype, const char **algorithm,
                                   double *predicted_us)
{
    LOOM_WITH_COMM(comm, "loomCommPlan",
                   plan(comm, collective, count, datatype, algorithm, predicted_us));
}

// ---- the device path --------------------------------------------------------

static void put_why(char *why, size_t why_len, const char *text)
{
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s", text);
}

static loomResult_t device_runtime(loomComm_t comm, const char **runtime, char *why, size_t why_len)
{
    const loom_devrt_t *rt = loom_devrt();
    if (comm != NULL && __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE) == NULL) {
        *runtime = NULL;
        put_why(why, why_len, loom_dev_comm_why_none(comm));
        return loomSuccess;
    }
    /* A communicator with a device path was made with the process's runtime, the only one. */
    *runtime = rt != NULL ? rt->name : NULL;
    put_why(why, why_len, rt != NULL ? "" : loom_devrt_why_none());
    return loomSuccess;
}

LOOM_API loomResult_t loomCommDeviceRuntime(loomComm_t comm, const char **runtime, char *why,
                                            size_t whyLen)
{
    if (runtime == NULL) {
        LOOM_WARN("loomCommDeviceRuntime: runtime is NULL");
        return loomInvalidArgument;
    }
    if (comm == NULL)
        return device_runtime(NULL, runtime, why, whyLen);
    LOOM_WITH_COMM(comm, "loomCommDeviceRuntime", device_runtime(comm, runtime, why, whyLen));
}

static loomResult_t device_plan(loomComm_t comm, loomCollective_t collective,
                                loomDataType_t datatype, loomRedOp_t op, const char **transport,
                                int *capturable, char *why, size_t why_len)
{
    if ((unsigned)collective >= (unsigned)loomNumCollectives) {
        LOOM_WARN("loomCommDevicePlan: collective %d is not one of loomCollective_t",
                  (int)collective);
        return loomInvalidArgument;
    }
    if (!loom_dtype_valid(datatype)) {
        LOOM_WARN("loomCommDevicePlan: datatype %d is not valid", (int)datatype);
        return loomInvalidArgument;
    }
    const loom_coll_kind_t kind = plan_kinds[collective];
    const int reduction =
        kind == LOOM_COLL_ALLREDUCE || kind == LOOM_COLL_REDUCE_SCATTER || kind == LOOM_COLL_REDUCE;
    if (reduction && !loom_redop_valid(op)) {
        LOOM_WARN("loomCommDevicePlan: op %d is not valid", (int)op);
        return loomInvalidArgument;
    }
    loom_coll_args_t a = {
        .kind = kind, .count = 0, .dt = datatype, .op = reduction ? op : loomSum, .root = 0};
    int cap = 0;
    const char *name = loom_dev_comm_plan(comm, &a, &cap, why, why_len);
    if (transport != NULL)
        *transport = name;
    if (capturable != NULL)
        *capturable = cap;
    return loomSuccess;
}

LOOM_API loomResult_t loomCommDevicePlan(loomComm_t comm, loomCollective_t collective,
                                         loomDataType_t datatype, loomRedOp_t op,
                                         const char **transport, int *capturable, char *why,
                                         size_t whyLen)
{
    LOOM_WITH_COMM(comm, "loomCommDevicePlan",
                   device_plan(comm, collective, datatype, op, transport, capturable, why, whyLen));
}

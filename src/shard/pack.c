/* SPDX-License-Identifier: Apache-2.0
 *
 * pack.c - loomShardPack and loomShardUnpack: copies between the caller's list order
 * (parameters back to back) and the plan's full buffer, one memcpy per parameter.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "shard_plan.h"

static loomResult_t check_copy(const struct loomShardPlan *p, const void *src, const void *dst,
                               loomDataType_t dt, const char *fn)
{
    LOOM_CHECK(shard_check_plan(p, fn));
    LOOM_CHECK(shard_check_dtype(dt, fn));
    if (src == NULL || dst == NULL) {
        LOOM_WARN("%s: source %p or destination %p is NULL (%zu elements)", fn, src, dst, p->total);
        return loomInvalidArgument;
    }
    uintptr_t a = (uintptr_t)src, b = (uintptr_t)dst, n = (uintptr_t)p->total * 4;
    if (a < b + n && b < a + n) {
        LOOM_WARN("%s: source %p and destination %p overlap (%zu bytes each): out of place only",
                  fn, src, dst, (size_t)n);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static void copy_params(const struct loomShardPlan *p, const float *src, float *dst, int pack)
{
    size_t model = 0;
    for (int i = 0; i < p->nparams; i++) {
        const shard_param_t *q = &p->params[i];
        if (pack)
            memcpy(dst + q->offset, src + model, q->numel * sizeof(float));
        else
            memcpy(dst + model, src + q->offset, q->numel * sizeof(float));
        model += q->numel;
    }
}

LOOM_API loomResult_t loomShardPack(loomShardPlan_t plan, const void *model_order, void *plan_order,
                                    loomDataType_t datatype)
{
    LOOM_CHECK(check_copy(plan, model_order, plan_order, datatype, "loomShardPack"));
    copy_params(plan, model_order, plan_order, 1);
    return loomSuccess;
}

LOOM_API loomResult_t loomShardUnpack(loomShardPlan_t plan, const void *plan_order,
                                      void *model_order, loomDataType_t datatype)
{
    LOOM_CHECK(check_copy(plan, plan_order, model_order, datatype, "loomShardUnpack"));
    copy_params(plan, plan_order, model_order, 0);
    return loomSuccess;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * scale.c - loomShardScaleRows: QK-clip and the like multiply some rows of one parameter by
 * per-row factors wherever a rank holds them (the pieces of shard_plan.h). Local.
 */
#include <stdlib.h>

#include "check.h"
#include "shard_plan.h"

static loomResult_t check_scale(const struct loomShardPlan *p, int rank, const void *params,
                                unsigned int flags, int param, size_t row0, size_t n,
                                const float *scale)
{
    static const char fn[] = "loomShardScaleRows";
    LOOM_CHECK(shard_check_rank(p, rank, fn));
    if (param < 0 || param >= p->nparams) {
        LOOM_WARN("%s: param %d outside 0..%d", fn, param, p->nparams - 1);
        return loomInvalidArgument;
    }
    const shard_param_t *x = &p->params[param];
    if (row0 > x->rows || n > x->rows - row0) {
        LOOM_WARN("%s: rows [%zu, %zu + %zu) outside the %zu rows of param %d", fn, row0, row0, n,
                  x->rows, param);
        return loomInvalidArgument;
    }
    if ((flags & ~(unsigned)LOOM_SHARD_PARAMS_FULL) != 0) {
        LOOM_WARN("%s: flags 0x%x: only LOOM_SHARD_PARAMS_FULL applies", fn, flags);
        return loomInvalidArgument;
    }
    if (n > 0 && (scale == NULL || params == NULL)) {
        LOOM_WARN("%s: %zu rows but scale %p or params %p is NULL", fn, n, (const void *)scale,
                  params);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

LOOM_API loomResult_t loomShardScaleRows(loomShardPlan_t plan, int rank, void *params,
                                         unsigned int flags, int param, size_t row0, size_t n,
                                         const float *scale)
{
    LOOM_CHECK(check_scale(plan, rank, params, flags, param, row0, n, scale));
    if (n == 0)
        return loomSuccess;
    const shard_param_t *x = &plan->params[param];
    const size_t lo = x->offset + row0 * x->cols, hi = x->offset + (row0 + n) * x->cols;
    const int npcs = shard_pieces(plan, rank, x->bucket, NULL);
    shard_piece_t *pcs = malloc((size_t)(npcs > 0 ? npcs : 1) * sizeof(*pcs));
    if (pcs == NULL) {
        LOOM_WARN("loomShardScaleRows: out of memory for %d pieces", npcs);
        return loomSystemError;
    }
    shard_pieces(plan, rank, x->bucket, pcs);
    float *buf = params;
    for (int k = 0; k < npcs; k++) {
        const shard_piece_t *pc = &pcs[k];
        if (pc->param != param)
            continue;
        const size_t a = pc->full_off > lo ? pc->full_off : lo;
        const size_t e = pc->full_off + pc->len < hi ? pc->full_off + pc->len : hi;
        for (size_t i = a; i < e; i++) {
            const size_t at =
                (flags & LOOM_SHARD_PARAMS_FULL) ? i : pc->shard_off + (i - pc->full_off);
            buf[at] *= scale[(i - x->offset) / x->cols - row0];
        }
    }
    free(pcs);
    return loomSuccess;
}

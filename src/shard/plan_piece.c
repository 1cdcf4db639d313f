/* SPDX-License-Identifier: Apache-2.0
 *
 * plan_piece.c - loomShardParamPiece: where one rank holds one parameter in its packed shard.
 * Every layout gives at most one contiguous run per rank and parameter (a matrix whole on its
 * owner or a range of its rows, a range of an element-wise parameter, or all of it), so callers
 * can work per parameter on shards (a norm that skips a tied copy, masks, QK-clip) without
 * knowing the layout.
 */
#include <stdlib.h>

#include "check.h"
#include "shard_plan.h"

loomResult_t loomShardParamPiece(loomShardPlan_t plan, int rank, int param, size_t *shard_off,
                                 size_t *first, size_t *count)
{
    static const char fn[] = "loomShardParamPiece";
    LOOM_CHECK(shard_check_rank(plan, rank, fn));
    if (param < 0 || param >= plan->nparams) {
        LOOM_WARN("%s: param %d outside 0..%d of the plan", fn, param, plan->nparams - 1);
        return loomInvalidArgument;
    }
    const shard_param_t *sp = &plan->params[param];
    int n = shard_pieces(plan, rank, sp->bucket, NULL);
    shard_piece_t *pieces = malloc(sizeof(*pieces) * (size_t)(n > 0 ? n : 1));
    if (pieces == NULL) {
        LOOM_WARN("%s: out of memory for %d pieces", fn, n);
        return loomSystemError;
    }
    shard_pieces(plan, rank, sp->bucket, pieces);
    size_t off = 0, at = 0, len = 0;
    for (int k = 0; k < n; k++)
        if (pieces[k].param == param && pieces[k].len > 0) {
            off = pieces[k].shard_off;
            at = pieces[k].full_off - sp->offset;
            len = pieces[k].len;
            break;
        }
    free(pieces);
    if (shard_off)
        *shard_off = off;
    if (first)
        *first = at;
    if (count)
        *count = len;
    return loomSuccess;
}

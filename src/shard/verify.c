/* SPDX-License-Identifier: Apache-2.0
 *
 * verify.c - loomShardPlanVerify: every rank gathers every rank's (plan rank count,
 * fingerprint) with one AllGather over the communicator it has, whatever the plan says, so a
 * rank whose plan differs cannot leave the others waiting; each then finds the same differing
 * ranks (those off the fingerprint most ranks hold, or whose plan has another rank count than
 * the communicator) and returns InvalidUsage naming them. The result is needed here, so a stream is
 * waited for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "shard_plan.h"

/* The rank whose fingerprint most ranks share (the lowest such rank on a tie). */
static int majority(const uint64_t *all, int n)
{
    int best = 0, best_count = 0;
    for (int r = 0; r < n; r++) {
        int count = 0;
        for (int q = 0; q < n; q++)
            count += all[2 * q + 1] == all[2 * r + 1];
        if (count > best_count) {
            best = r;
            best_count = count;
        }
    }
    return best;
}

/* Appends the ranks whose entry differs from rank ref's (or whose rank count is not n) to buf. */
static int differing(const uint64_t *all, int n, int ref, char *buf, size_t len)
{
    int bad = 0;
    size_t at = 0;
    buf[0] = '\0';
    for (int r = 0; r < n; r++) {
        const int mismatch = all[2 * r] != (uint64_t)n || all[2 * r + 1] != all[2 * ref + 1];
        if (!mismatch)
            continue;
        if (at < len) {
            int w = snprintf(buf + at, len - at, "%s%d (%llu ranks, fingerprint %016llx)",
                             bad ? ", " : "", r, (unsigned long long)all[2 * r],
                             (unsigned long long)all[2 * r + 1]);
            at += w > 0 ? (size_t)w : 0;
        }
        bad++;
    }
    return bad;
}

LOOM_API loomResult_t loomShardPlanVerify(loomShardPlan_t plan, loomComm_t comm,
                                          loomStream_t stream)
{
    static const char fn[] = "loomShardPlanVerify";
    int n = 0, rank = -1;
    LOOM_CHECK(shard_check_plan(plan, fn));
    if (comm == NULL) {
        LOOM_WARN("%s: comm is NULL", fn);
        return loomInvalidArgument;
    }
    LOOM_CHECK(loomCommCount(comm, &n));
    LOOM_CHECK(loomCommUserRank(comm, &rank));
    uint64_t mine[2] = {(uint64_t)plan->nranks, plan->fingerprint};
    uint64_t *all = malloc(2 * (size_t)n * sizeof(uint64_t));
    if (all == NULL) {
        LOOM_WARN("%s: out of memory for %d ranks", fn, n);
        return loomSystemError;
    }
    loomResult_t res = loomAllGather(mine, all, 2, loomUint64, comm, stream);
    if (res == loomSuccess && stream != NULL)
        res = loomStreamSynchronize(stream);
    if (res == loomSuccess) {
        char names[512];
        const int ref = majority(all, n);
        const int bad = differing(all, n, ref, names, sizeof(names));
        if (bad > 0) {
            LOOM_WARN("%s: rank %d: on a communicator of %d ranks, %d rank%s differ from rank "
                      "%d's plan (%d ranks, fingerprint %016llx): %s",
                      fn, rank, n, bad, bad > 1 ? "s" : "", ref, (int)all[2 * ref],
                      (unsigned long long)all[2 * ref + 1], names);
            res = loomInvalidUsage;
        }
    }
    free(all);
    return res;
}

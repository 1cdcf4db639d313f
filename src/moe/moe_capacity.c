/* SPDX-License-Identifier: Apache-2.0
 *
 * moe_capacity.c - the static capacity modes of loomMoeLayout (docs/moe.md, "Capacity"): after
 * the count exchange every rank knows the rows it would receive; one AllGather of that number
 * gives every rank the same verdict and the same peak. Error mode refuses the layout on every
 * rank alike. Drop mode lets each overflowing receiver grant its capacity to its sources (an
 * AllToAll of one count per peer), and each source drops its lightest rows to each receiver
 * down to the grant, by a rule that depends on the routing alone, so every run and every
 * transport drops the same selections. Called by moe_layout.c; moves no rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moe_ep.h"

/* Receiver side of the grant rule: capacity cap over sources requesting req[s] rows in all
 * more than cap. Shares in proportion to the requests, rounded down; the rows left over (fewer
 * than the sources with a request, since each share lost less than one) go one each to the
 * lowest source ranks that requested any. */
static void grants_compute(const size_t *req, size_t G, size_t cap, int64_t *grant)
{
    __extension__ typedef unsigned __int128 u128;
    size_t total = 0, given = 0;
    for (size_t s = 0; s < G; s++)
        total += req[s];
    for (size_t s = 0; s < G; s++) {
        grant[s] = (int64_t)((u128)cap * req[s] / total);
        given += (size_t)grant[s];
    }
    for (size_t s = 0; s < G && given < cap; s++) {
        if (req[s] > 0) {
            grant[s]++;
            given++;
        }
    }
}

typedef struct ranked_row {
    float weight; /* the sum of the row's pair weights; NaN ranks as -infinity */
    size_t row;   /* index in wire order: token ascending (naive: then slot) */
} ranked_row_t;

/* Heaviest first; equal weights in wire order, so the lower token index wins. */
static int ranked_cmp(const void *a, const void *b)
{
    const ranked_row_t *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* The selections of row r (to rank g): all of its token's on g in dedup mode, its one slot in
 * naive mode. With drop set they become -1 and are counted; else their weights are summed in
 * top-k slot order. */
static float row_pairs(struct loomMoeHandle *h, size_t r, size_t g, int drop)
{
    const struct loomMoePlan *p = h->plan;
    size_t k = (size_t)p->top_k, t = (size_t)h->row_token[r];
    size_t j0 = h->row_slot ? (size_t)h->row_slot[r] : 0, j1 = h->row_slot ? j0 + 1 : k;
    float sum = 0.0f;
    for (size_t j = j0; j < j1; j++) {
        int32_t e = h->topk[t * k + j];
        if (e < 0 || (size_t)p->expert_rank[e] != g)
            continue;
        if (drop) {
            h->topk[t * k + j] = -1;
            h->pairs_dropped++;
        } else {
            sum += h->weights[t * k + j];
        }
    }
    return isnan(sum) ? -INFINITY : sum;
}

/* Source side: keeps the grant[g] heaviest of its rows to each rank g, drops the others. */
static loomResult_t drop_rows(struct loomMoeHandle *h, const int64_t *grant)
{
    const struct loomMoePlan *p = h->plan;
    ranked_row_t *rank = malloc((h->send_total ? h->send_total : 1) * sizeof(*rank));
    if (rank == NULL) {
        LOOM_WARN("loomMoeLayout: out of memory to rank %zu rows for dropping", h->send_total);
        return loomSystemError;
    }
    size_t first = 0;
    for (size_t g = 0; g < (size_t)p->nranks; first += h->send_rows[g], g++) {
        size_t n = h->send_rows[g];
        if (grant[g] < 0 || (size_t)grant[g] > n) {
            LOOM_WARN("loomMoeLayout: rank %zu granted %lld rows to rank %d, which asked for %zu",
                      g, (long long)grant[g], p->rank, n);
            free(rank);
            return loomRemoteError;
        }
        if ((size_t)grant[g] == n)
            continue;
        for (size_t i = 0; i < n; i++)
            rank[i] = (ranked_row_t){row_pairs(h, first + i, g, 0), first + i};
        qsort(rank, n, sizeof(*rank), ranked_cmp);
        for (size_t i = (size_t)grant[g]; i < n; i++)
            row_pairs(h, rank[i].row, g, 1);
        h->rows_dropped += n - (size_t)grant[g];
    }
    free(rank);
    return loomSuccess;
}

loomResult_t loom_moe_capacity_apply(struct loomMoePlan *p, struct loomMoeHandle *h, int *recount_p,
                                     loomResult_t *recount_status_p)
{
    size_t G = (size_t)p->nranks, cap = p->max_recv_rows;
    int64_t *need = malloc(3 * G * sizeof(int64_t));
    if (need == NULL) {
        LOOM_WARN("loomMoeLayout: out of memory for the capacity counts of %zu ranks", G);
        return loomSystemError;
    }
    int64_t mine = (int64_t)h->recv_total;
    loomResult_t res = loomAllGather(&mine, need, 1, loomInt64, p->comm, NULL);
    size_t peak = 0, over = 0;
    int peak_rank = 0;
    for (size_t s = 0; res == loomSuccess && s < G; s++) {
        if ((size_t)need[s] > peak) {
            peak = (size_t)need[s];
            peak_rank = (int)s;
        }
        over += (size_t)need[s] > cap;
    }
    h->required_rows_max = peak;
    h->overflowed = peak > cap;
    if (res != loomSuccess || !h->overflowed)
        goto out;
    if (p->capacity == loomMoeCapacityError) {
        /* Every rank saw the same counts and says the same. */
        LOOM_WARN("loomMoeLayout: rank %d needs %zu rows > max_recv_rows %zu (%zu of %zu ranks "
                  "over): every rank refuses this layout; grow max_recv_rows to %zu and route "
                  "again",
                  peak_rank, peak, cap, over, G, peak);
        h->refused = 1;
        h->need_rank = peak_rank;
        res = loomInvalidUsage;
        goto out;
    }
    int64_t *grant_out = need + G, *grant_in = need + 2 * G;
    if (h->recv_total > cap)
        grants_compute(h->recv_rows, G, cap, grant_out);
    else
        for (size_t s = 0; s < G; s++)
            grant_out[s] = (int64_t)h->recv_rows[s];
    res = loomAllToAll(grant_out, grant_in, 1, loomInt64, p->comm, NULL);
    if (res != loomSuccess)
        goto out;
    /* Every rank joins the second count exchange, even one that dropped nothing or failed here:
     * its status tells the others. */
    *recount_p = 1;
    *recount_status_p = drop_rows(h, grant_in);
    if (*recount_status_p == loomSuccess && h->rows_dropped > 0)
        LOOM_INFO(LOOM_LOG_COLL,
                  "moe layout: rank %d dropped %zu rows (%zu selections): rank %d needs %zu rows "
                  "> max_recv_rows %zu",
                  p->rank, h->rows_dropped, h->pairs_dropped, peak_rank, peak, cap);
out:
    free(need);
    return res;
}

loomResult_t loom_moe_handle_usable(const char *call, const struct loomMoeHandle *h)
{
    if (!h->refused)
        return loomSuccess;
    LOOM_WARN("%s: the handle's layout was refused on every rank (rank %d needs %zu rows > "
              "max_recv_rows %zu); only loomMoeHandleQuery and loomMoeHandleDestroy accept it",
              call, h->need_rank, h->required_rows_max, h->plan->max_recv_rows);
    return loomInvalidUsage;
}

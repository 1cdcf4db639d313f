/* SPDX-License-Identifier: Apache-2.0
 *
 * host_layout.c - which host each rank of a communicator is on, from the host
 * hashes exchanged at creation: hosts are numbered in the order of their first
 * rank and local indices follow rank order, so every rank computes the same
 * layout. The hierarchical algorithms need it, and so does Echo's.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"

loomResult_t loom_hosts_init(loom_hosts_t *h, const uint64_t *host_hash, int nranks, int rank)
{
    memset(h, 0, sizeof(*h));
    int *first = calloc((size_t)nranks, sizeof(int)); /* first rank of host k */
    int *size = calloc((size_t)nranks, sizeof(int));
    int *lidx = calloc((size_t)nranks, sizeof(int));
    h->host_of = calloc((size_t)nranks, sizeof(int));
    if (!first || !size || !lidx || !h->host_of) {
        free(first), free(size), free(lidx), free(h->host_of);
        h->host_of = NULL;
        LOOM_WARN("out of memory for the host layout of %d ranks", nranks);
        return loomSystemError;
    }
    /* Hosts are few and every rank's hash is compared with each host's first:
     * nranks * nhosts, as cheap as the exchange that delivered the hashes. */
    for (int r = 0; r < nranks; r++) {
        int k = 0;
        while (k < h->nhosts && host_hash[first[k]] != host_hash[r])
            k++;
        if (k == h->nhosts)
            first[h->nhosts++] = r;
        h->host_of[r] = k;
        lidx[r] = size[k]++;
    }
    h->host = h->host_of[rank];
    h->lrank = lidx[rank];
    h->ppn = size[0];
    for (int k = 1; k < h->nhosts; k++)
        if (size[k] != size[0])
            h->ppn = 0;
    /* Host by host: a ring in this order crosses each host boundary once. */
    h->order = malloc(sizeof(int) * (size_t)nranks);
    if (h->order == NULL) {
        free(first), free(size), free(lidx);
        loom_hosts_free(h);
        LOOM_WARN("out of memory for the host layout of %d ranks", nranks);
        return loomSystemError;
    }
    int at = 0;
    for (int k = 0; k < h->nhosts; k++)
        for (int r = first[k]; r < nranks; r++)
            if (h->host_of[r] == k) {
                if (r == rank)
                    h->pos = at;
                h->order[at++] = r;
            }
    h->contiguous = 1;
    for (int r = 0; r < nranks; r++)
        if (h->order[r] != r)
            h->contiguous = 0;
    if (h->ppn > 0) {
        h->rank_of = malloc(sizeof(int) * (size_t)nranks);
        h->rail = malloc(sizeof(int) * (size_t)h->nhosts);
        if (h->rank_of == NULL || h->rail == NULL) {
            free(first), free(size), free(lidx);
            loom_hosts_free(h);
            LOOM_WARN("out of memory for the host layout of %d ranks", nranks);
            return loomSystemError;
        }
        for (int r = 0; r < nranks; r++)
            h->rank_of[h->host_of[r] * h->ppn + lidx[r]] = r;
        for (int k = 0; k < h->nhosts; k++)
            h->rail[k] = h->rank_of[k * h->ppn + h->lrank];
    }
    free(first), free(size), free(lidx);
    return loomSuccess;
}

void loom_hosts_free(loom_hosts_t *h)
{
    free(h->host_of);
    free(h->rank_of);
    free(h->rail);
    free(h->order);
    memset(h, 0, sizeof(*h));
}

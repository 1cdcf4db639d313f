/* SPDX-License-Identifier: Apache-2.0
 *
 * echo_layout.c - which rank owns which chunk in Echo: hosts from the peers'
 * host hashes, local indices in rank order, and the chunk arithmetic shared
 * by the engine and the feedback state.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "echo.h"
#include "q4.h"

loomResult_t loom_echo_layout_init(loom_echo_layout_t *lay, const loom_peer_info_t *peers,
                                   int nranks, int rank, int hier)
{
    memset(lay, 0, sizeof(*lay));
    lay->rank = rank;
    lay->nranks = nranks;
    int *host_of = calloc((size_t)nranks, sizeof(int));
    int *lidx = calloc((size_t)nranks, sizeof(int));
    int *first = calloc((size_t)nranks, sizeof(int)); /* first rank of host h */
    int *size = calloc((size_t)nranks, sizeof(int));
    lay->rank_of = calloc((size_t)nranks, sizeof(int));
    if (!host_of || !lidx || !first || !size || !lay->rank_of) {
        free(host_of), free(lidx), free(first), free(size), free(lay->rank_of);
        lay->rank_of = NULL;
        LOOM_WARN("out of memory for the Echo layout of %d ranks", nranks);
        return loomSystemError;
    }
    int hosts = 0;
    for (int r = 0; r < nranks; r++) {
        int h = 0;
        while (h < hosts && peers[first[h]].host_hash != peers[r].host_hash)
            h++;
        if (h == hosts)
            first[hosts++] = r;
        host_of[r] = h;
        lidx[r] = size[h]++;
    }
    int even = hosts > 1 && size[0] > 1;
    for (int h = 1; h < hosts && even; h++)
        even = size[h] == size[0];
    if (hier && even) {
        lay->hosts = hosts;
        lay->local = size[0];
        for (int r = 0; r < nranks; r++)
            lay->rank_of[host_of[r] * lay->local + lidx[r]] = r;
        lay->host = host_of[rank];
        lay->lrank = lidx[rank];
    } else {
        lay->hosts = nranks;
        lay->local = 1;
        for (int r = 0; r < nranks; r++)
            lay->rank_of[r] = r;
        lay->host = rank;
        lay->lrank = 0;
    }
    free(host_of), free(lidx), free(first), free(size);
    return loomSuccess;
}

void loom_echo_layout_free(loom_echo_layout_t *lay)
{
    free(lay->rank_of);
    lay->rank_of = NULL;
}

size_t loom_echo_chunk(size_t count, int nranks)
{
    size_t per = count / (size_t)nranks + (count % (size_t)nranks != 0);
    return (per + LOOM_Q4_TILE - 1) / LOOM_Q4_TILE * LOOM_Q4_TILE;
}

int loom_echo_own_chunk(const loom_echo_layout_t *lay, size_t count, size_t *off, size_t *len)
{
    const int c = lay->lrank * lay->hosts + lay->host;
    const size_t chunk = loom_echo_chunk(count, lay->nranks);
    size_t o = (size_t)c * chunk;
    *off = o < count ? o : count;
    *len = o < count ? (count - o < chunk ? count - o : chunk) : 0;
    return c;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * echo_layout.c - which rank owns which chunk in Echo: hosts and local
 * indices from the collectives' host layout (host_layout.c), and the chunk
 * arithmetic shared by the engine and the feedback state.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "echo.h"
#include "q4.h"

loomResult_t loom_echo_layout_init(loom_echo_layout_t *lay, const loom_peer_info_t *peers,
                                   int nranks, int rank, int hier)
{
    memset(lay, 0, sizeof(*lay));
    lay->rank = rank;
    lay->nranks = nranks;
    uint64_t *hash = calloc((size_t)nranks, sizeof(*hash));
    lay->rank_of = calloc((size_t)nranks, sizeof(int));
    if (!hash || !lay->rank_of) {
        free(hash), free(lay->rank_of);
        lay->rank_of = NULL;
        LOOM_WARN("out of memory for the Echo layout of %d ranks", nranks);
        return loomSystemError;
    }
    for (int r = 0; r < nranks; r++)
        hash[r] = peers[r].host_hash;
    loom_hosts_t hs;
    loomResult_t res = loom_hosts_init(&hs, hash, nranks, rank);
    free(hash);
    if (res != loomSuccess) {
        loom_echo_layout_free(lay);
        return res;
    }
    if (hier && hs.nhosts > 1 && hs.ppn > 1) {
        lay->hosts = hs.nhosts;
        lay->local = hs.ppn;
        memcpy(lay->rank_of, hs.rank_of, sizeof(int) * (size_t)nranks);
        lay->host = hs.host;
        lay->lrank = hs.lrank;
    } else {
        lay->hosts = nranks;
        lay->local = 1;
        for (int r = 0; r < nranks; r++)
            lay->rank_of[r] = r;
        lay->host = rank;
        lay->lrank = 0;
    }
    loom_hosts_free(&hs);
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

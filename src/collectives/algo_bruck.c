/* SPDX-License-Identifier: Apache-2.0
 *
 * algo_bruck.c - Bruck's AllToAll (Bruck et al., IEEE TPDS 1997): ceil(log2 n)
 * steps instead of n-1, for small blocks where message count dominates.
 *
 * Steps, with blocks of count elements:
 *  1. rotate: tmp[i] = this rank's block for rank (r + i) mod n;
 *  2. for each bit 2^k < n: pack every tmp[i] whose index has bit k set, send
 *     the pack to rank r + 2^k, receive the same set of indices from
 *     r - 2^k and unpack it over those tmp[i]. Invariant: after bits 0..k,
 *     tmp[i] holds data from rank r - (i mod 2^(k+1)) for rank
 *     r - (i mod 2^(k+1)) + i; so at the end tmp[i] came from rank r - i;
 *  3. recvbuff block j = tmp[(r - j) mod n].
 * Bytes on the wire per rank: about ceil(log2 n) S / 2 (each block travels once
 * per set bit of its distance), plus two local copies of S (rotate, place).
 * Rounds bound the scratch: each round moves a slice of at most
 * LOOM_CHUNK_BYTES / 4 of every block (the algorithm is meant for small
 * blocks, which take one round). Scratch: n slices (tmp) and two packs of
 * ceil(n/2) slices. Not in place (as AllToAll).
 */
#include <string.h>

#include "algo_util.h"
#include "check.h"
#include "dtype.h"

loomResult_t loom_alltoall_bruck(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const int n = ctx->nranks, me = ctx->rank;
    const size_t blk = a->count * loom_dtype_size(a->dt);
    const uint8_t *send = a->sendbuff;
    uint8_t *recv = a->recvbuff;
    if (blk == 0)
        return loomSuccess;
    if (n == 1) {
        memmove(recv, send, blk);
        return loomSuccess;
    }
    const size_t half = (size_t)(n + 1) / 2;
    size_t slice = ctx->chunk_bytes / 4;
    if (slice > blk)
        slice = blk;
    size_t sizes[3] = {(size_t)n * slice, half * slice, half * slice};
    uint8_t *parts[3];
    LOOM_CHECK(loom_coll_scratch_parts(ctx, sizes, 3, parts));
    uint8_t *tmp = parts[0], *spack = parts[1], *rpack = parts[2];
    for (size_t off = 0; off < blk; off += slice) {
        const size_t len = blk - off < slice ? blk - off : slice;
        for (int i = 0; i < n; i++)
            memcpy(tmp + (size_t)i * len, send + (size_t)((me + i) % n) * blk + off, len);
        unsigned step = 1;
        for (int bit = 1; bit < n; bit <<= 1, step++) {
            size_t k = 0;
            for (int i = bit; i < n; i++)
                if (i & bit)
                    memcpy(spack + len * k++, tmp + (size_t)i * len, len);
            const uint32_t tag = loom_tag_coll(ctx->seq, step);
            loom_reqs_t q = {.n = 0};
            LOOM_CHECK(loom_reqs_recv(ctx, &q, (me - bit + n) % n, rpack, k * len, tag));
            LOOM_CHECK(loom_reqs_send(ctx, &q, (me + bit) % n, spack, k * len, tag));
            LOOM_CHECK(loom_reqs_wait(ctx, &q));
            k = 0;
            for (int i = bit; i < n; i++)
                if (i & bit)
                    memcpy(tmp + (size_t)i * len, rpack + len * k++, len);
        }
        for (int j = 0; j < n; j++)
            memcpy(recv + (size_t)j * blk + off, tmp + (size_t)((me - j + n) % n) * len, len);
    }
    return loomSuccess;
}

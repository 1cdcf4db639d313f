/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_move.c - the shm collectives that only move data: AllGather (and
 * AllGatherV), Broadcast and AllToAll, plus Barrier, over the communicator's
 * arena (shm_coll.h). B = one rank's block (AllGather, AllToAll per peer) or
 * the vector (Broadcast); H = one slot half. AllGatherV runs AllGather's
 * variants with each rank's block of its own size at its displacement: the
 * cico rounds follow the largest block (a shorter one has no part in the
 * later rounds), and single copy reads each peer's block whole.
 *
 * cico, in rounds over halves that alternate (a writer reuses a half only
 * after every reader posted a flag past the round that used it):
 *   AllGather: round k copies part k (H bytes) of the own block into the half
 *     and posts k+1; after every peer's k+1 each rank copies every peer's part
 *     straight to its place in recvbuff. Bytes per rank: B in, (n-1) B out.
 *   Broadcast: the root copies part k into its half and posts k+1 without
 *     waiting (out of place it then copies the part from the half, in cache,
 *     into its recvbuff while the others copy it out); the others wait for
 *     the root's k+1, copy out and post k+1 (the root's next use of that half
 *     waits for them). The root leaves as soon as its data is in the slot.
 *   AllToAll: the half holds one sub-block per other rank (H / (n-1) bytes each);
 *     round k copies part k of every outgoing block in, and after every
 *     peer's k+1 each rank copies its sub-block out of every peer's half.
 * cma: every rank posts ARRIVE with its buffers' addresses; a reader then
 *   pulls what it needs with process_vm_readv straight into recvbuff (every
 *   peer's block; the root's vector; its block of every peer's sendbuff) and
 *   posts DONE; a rank leaves once every rank that reads its buffers posted
 *   DONE. Single copy: (n-1) B (Broadcast: B) read per rank, nothing staged.
 * Barrier: every rank posts step 1 and waits for all.
 * Zero bytes return at once, as the point-to-point algorithms do.
 */
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "shm_coll.h"

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Where a writer's half holds the sub-block for destination j in AllToAll:
 * one per other rank, none for itself (with 2 ranks the whole half is the
 * peer's, which halves the rounds against a sub-block per rank). */
static size_t sub_index(int j, int writer)
{
    return (size_t)(j < writer ? j : j - 1);
}

/* Rank r's block of recvbuff in an AllGather (bytes each) or AllGatherV (its count at its
 * displacement): its length and where it starts, in bytes. */
static size_t block_len(const shm_call_t *c, int r, size_t bytes)
{
    return c->a->kind == LOOM_COLL_ALLGATHERV ? c->a->recvcounts[r] * c->es : bytes;
}
static size_t block_at(const shm_call_t *c, int r, size_t bytes)
{
    return c->a->kind == LOOM_COLL_ALLGATHERV ? c->a->rdispls[r] * c->es : (size_t)r * bytes;
}

/* Bytes [lo, lo + part) of a block of len bytes: how many there are. */
static size_t part_of(size_t len, size_t lo, size_t part)
{
    return lo >= len ? 0 : min_sz(part, len - lo);
}

/* The cico rounds of AllGather and AllToAll: round k moves bytes [k part,
 * (k+1) part) of every block (bytes: the largest). AllGather copies its own
 * block in once, and every peer reads it from the start of the half; AllToAll
 * copies one sub-block per destination j to sub_index(j) part, and each peer
 * reads its own. */
static loomResult_t exchange_rounds(shm_call_t *c, const uint8_t *send, uint8_t *recv, size_t bytes,
                                    size_t part, int per_peer)
{
    const size_t rounds = (bytes + part - 1) / part;
    for (size_t k = 0; k < rounds; k++) {
        const size_t lo = k * part, len = min_sz(part, bytes - lo);
        const unsigned h = loom_arena_next_half(c->ar);
        LOOM_CHECK(loom_arena_half_acquire(c->ar, h));
        uint8_t *mine = loom_arena_half(c->ar, c->me, h);
        const size_t own = per_peer ? 0 : part_of(block_len(c, c->me, bytes), lo, part);
        if (own > 0)
            loom_shm_copy_in(c, mine, send + lo, own);
        for (int j = 0; per_peer && j < c->n; j++)
            if (j != c->me)
                loom_shm_copy_in(c, mine + sub_index(j, c->me) * part,
                                 send + (size_t)j * bytes + lo, len);
        loom_arena_post(c->ar, shm_flag(c, k + 1));
        LOOM_CHECK(loom_arena_wait(c->ar, -1, shm_flag(c, k + 1)));
        if (k == 0)
            LOOM_CHECK(loom_shm_check(c, -1));
        for (int i = 1; i < c->n; i++) {
            int r = (c->me + i) % c->n;
            const size_t at = per_peer ? sub_index(c->me, r) * part : 0;
            const size_t n = per_peer ? len : part_of(block_len(c, r, bytes), lo, part);
            if (n > 0)
                loom_shm_copy_out(c, recv + block_at(c, r, bytes) + lo,
                                  loom_arena_half(c->ar, r, h) + at, n);
        }
        loom_arena_half_release(c->ar, h, shm_flag(c, k + 2));
    }
    return loom_shm_end(c);
}

/* A call of `bytes` through the arena's slot halves: *hb bytes a round, *rounds rounds of
 * per_round steps each. 0 where there is no arena or the steps would not fit (the caller then
 * takes its point-to-point algorithm, as every rank does alike). */
static int half_rounds(loom_coll_ctx_t *ctx, size_t bytes, unsigned per_round, size_t *hb,
                       size_t *rounds)
{
    const loom_arena_t *ar = loom_shm_arena(ctx);
    *hb = ar ? loom_arena_half_bytes(ar) : 0;
    *rounds = *hb ? (bytes + *hb - 1) / *hb : 0;
    return *hb != 0 && shm_rounds_fit(*rounds, per_round);
}

// ---- AllGather -----------------------------------------------------------------------

/* A rank's block in AllGather; the largest one in AllGatherV (0: nothing to move). */
static size_t gather_block(const loom_coll_args_t *a, int n)
{
    const size_t es = loom_dtype_size(a->dt);
    if (a->kind != LOOM_COLL_ALLGATHERV)
        return a->count * es;
    size_t m = 0;
    for (int r = 0; r < n && a->count > 0; r++)
        m = a->recvcounts[r] > m ? a->recvcounts[r] : m;
    return m * es;
}

loomResult_t loom_allgather_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t bytes = gather_block(a, ctx->nranks);
    if (bytes == 0)
        return loomSuccess;
    size_t hb, rounds;
    if (!half_rounds(ctx, bytes, 1, &hb, &rounds))
        return a->kind == LOOM_COLL_ALLGATHERV ? loom_allgatherv_direct(ctx, a)
                                               : loom_allgather_direct(ctx, a);
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_CICO));
    uint8_t *recv = a->recvbuff;
    const uint8_t *send = a->sendbuff;
    const size_t own = block_len(&c, c.me, bytes), at = block_at(&c, c.me, bytes);
    const size_t total = a->kind == LOOM_COLL_ALLGATHERV ? a->count * c.es : (size_t)c.n * bytes;
    /* The other blocks of recvbuff are only written: streamed when large. */
    shm_nt_out_if(&c, total - own, 0);
    shm_nt_in_if(&c, own);
    if (own > 0 && send != recv + at)
        loom_shm_copy(recv + at, send, own, c.nt_out);
    return exchange_rounds(&c, send, recv, bytes, hb, 0);
}

/* Single copy of AllGather (block = 0: every peer's whole sendbuff is its block) and AllToAll
 * (block = 1: this rank's block of every peer's sendbuff): arrive, read each peer's block into
 * place, finish. Falls back to cico where single copy was not agreed. */
static loomResult_t read_blocks_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a,
                                    loom_algo_fn_t cico, int alltoall)
{
    const size_t bytes = gather_block(a, ctx->nranks);
    if (bytes == 0)
        return loomSuccess;
    if (!loom_shm_single_copy_agreed(ctx))
        return cico(ctx, a);
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_CMA));
    uint8_t *recv = a->recvbuff;
    const size_t off = alltoall ? (size_t)c.me * bytes : 0; /* where this rank's block starts */
    loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE));
    LOOM_CHECK(loom_arena_wait(c.ar, -1, shm_flag(&c, SHM_STEP_ARRIVE)));
    LOOM_CHECK(loom_shm_check(&c, -1));
    const uint8_t *own = (const uint8_t *)a->sendbuff + off;
    const size_t mine = block_len(&c, c.me, bytes);
    if (mine > 0 && own != recv + block_at(&c, c.me, bytes))
        memcpy(recv + block_at(&c, c.me, bytes), own, mine);
    for (int i = 1; i < c.n; i++) {
        int r = (c.me + i) % c.n;
        loom_arena_desc_t d;
        loom_arena_peer_desc(c.ar, r, &d);
        if (block_len(&c, r, bytes) > 0)
            LOOM_CHECK(loom_arena_read(c.ar, r, recv + block_at(&c, r, bytes), d.send + off,
                                       block_len(&c, r, bytes)));
    }
    return loom_shm_finish_single_copy(&c);
}

loomResult_t loom_allgather_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return read_blocks_cma(ctx, a, loom_allgather_shm_cico, 0);
}

loomResult_t loom_allgather_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, NULL, loom_allgather_shm_cico, loom_allgather_shm_cma);
}

// ---- Broadcast -----------------------------------------------------------------------

/* A broadcast round is cut into BCAST_PIECES pieces (of whole cache lines, at
 * least BCAST_PIECE_MIN bytes), each posted as soon as the root copied it in:
 * the others copy piece j out while the root copies piece j + 1 in, where
 * they used to wait for the whole round (2 ranks, 64 KiB: 10.4 -> 6 us). */
#define BCAST_PIECES    4u
#define BCAST_PIECE_MIN 8192u

static size_t bcast_piece(size_t len)
{
    const size_t p = (len / BCAST_PIECES + 63) & ~(size_t)63;
    return p < BCAST_PIECE_MIN ? BCAST_PIECE_MIN : p;
}

loomResult_t loom_bcast_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    if (bytes == 0)
        return loomSuccess;
    size_t hb, rounds;
    if (!half_rounds(ctx, bytes, BCAST_PIECES, &hb, &rounds))
        return loom_bcast_direct(ctx, a);
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_CICO));
    const int root = a->root;
    uint8_t *recv = a->recvbuff;
    shm_nt_out_if(&c, bytes, 0);
    shm_nt_in_if(&c, bytes);
    const uint8_t *send = a->sendbuff;
    for (size_t k = 0; k < rounds; k++) {
        const size_t lo = k * hb, len = min_sz(hb, bytes - lo), piece = bcast_piece(len);
        const size_t pieces = (len + piece - 1) / piece;
        const unsigned h = loom_arena_next_half(c.ar);
        uint8_t *half = loom_arena_half(c.ar, root, h);
        /* Piece j of round k posts step k * BCAST_PIECES + j + 1; the others post the
         * round's last step once they copied all of it out. */
        const uint64_t step0 = k * BCAST_PIECES + 1, last = step0 + pieces - 1;
        if (c.me == root) {
            LOOM_CHECK(loom_arena_half_acquire(c.ar, h));
            for (size_t j = 0; j < pieces; j++) {
                const size_t off = j * piece, n = min_sz(piece, len - off);
                loom_shm_copy_in(&c, half + off, send + lo + off, n);
                loom_arena_post(c.ar, shm_flag(&c, step0 + j));
            }
            /* Out of place, the own copy comes from the slot (in cache) while the others
             * copy the same part out; from sendbuff where the slot was written past the
             * cache. */
            if (send != recv)
                loom_shm_copy(recv + lo, c.nt_in ? send + lo : half, len, c.nt_out);
            loom_arena_half_release(c.ar, h, shm_flag(&c, last));
            continue;
        }
        for (size_t j = 0; j < pieces; j++) {
            const size_t off = j * piece, n = min_sz(piece, len - off);
            LOOM_CHECK(loom_arena_wait(c.ar, root, shm_flag(&c, step0 + j)));
            if (k == 0 && j == 0)
                LOOM_CHECK(loom_shm_check(&c, root));
            loom_shm_copy_out(&c, recv + lo + off, half + off, n);
        }
        loom_arena_post(c.ar, shm_flag(&c, last));
    }
    return loom_shm_end(&c);
}

loomResult_t loom_bcast_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    if (bytes == 0)
        return loomSuccess;
    if (!loom_shm_single_copy_agreed(ctx))
        return loom_bcast_shm_cico(ctx, a);
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_CMA));
    const int root = a->root;
    /* Everyone arrives first, so that ranks that disagree on the root fail. */
    loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE));
    if (c.me == root) {
        if (a->sendbuff != a->recvbuff)
            memcpy(a->recvbuff, a->sendbuff, bytes);
        LOOM_CHECK(loom_arena_wait(c.ar, -1, shm_flag(&c, SHM_STEP_ARRIVE)));
        LOOM_CHECK(loom_shm_check(&c, -1));
        LOOM_CHECK(loom_arena_wait(c.ar, -1, shm_flag(&c, SHM_STEP_DONE)));
        return loom_shm_end(&c);
    }
    LOOM_CHECK(loom_arena_wait(c.ar, root, shm_flag(&c, SHM_STEP_ARRIVE)));
    LOOM_CHECK(loom_shm_check(&c, root));
    loom_arena_desc_t d;
    loom_arena_peer_desc(c.ar, root, &d);
    LOOM_CHECK(loom_arena_read(c.ar, root, a->recvbuff, d.send, bytes));
    /* The root may have failed and released its buffer while it was read. */
    LOOM_CHECK(loom_arena_check_peers(c.ar));
    loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_DONE));
    return loomSuccess;
}

loomResult_t loom_bcast_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, NULL, loom_bcast_shm_cico, loom_bcast_shm_cma);
}

// ---- AllToAll ------------------------------------------------------------------------

loomResult_t loom_alltoall_shm_cico(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    const size_t bytes = a->count * loom_dtype_size(a->dt);
    const loom_arena_t *ar = loom_shm_arena(ctx);
    const size_t others = ctx->nranks > 1 ? (size_t)ctx->nranks - 1 : 1;
    const size_t sub = ar ? loom_arena_half_bytes(ar) / others / 64 * 64 : 0;
    if (bytes == 0)
        return loomSuccess;
    if (sub == 0 || !shm_rounds_fit((bytes + sub - 1) / sub, 1))
        return loom_alltoall_pairwise(ctx, a); /* more ranks than 64-byte lines in a half */
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_CICO));
    uint8_t *recv = a->recvbuff;
    const uint8_t *send = a->sendbuff;
    /* In place, this round's copy in read the destinations just before. */
    shm_nt_out_if(&c, (size_t)c.n * bytes, (const void *)send == (const void *)recv);
    shm_nt_in_if(&c, (size_t)(c.n - 1) * bytes);
    loom_shm_copy(recv + (size_t)c.me * bytes, send + (size_t)c.me * bytes, bytes, c.nt_out);
    return exchange_rounds(&c, send, recv, bytes, sub, 1);
}

loomResult_t loom_alltoall_shm_cma(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return read_blocks_cma(ctx, a, loom_alltoall_shm_cico, 1);
}

loomResult_t loom_alltoall_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    return loom_shm_run(ctx, a, NULL, loom_alltoall_shm_cico, loom_alltoall_shm_cma);
}

// ---- Barrier -------------------------------------------------------------------------

loomResult_t loom_barrier_shm(loom_coll_ctx_t *ctx, const loom_coll_args_t *a)
{
    shm_call_t c;
    LOOM_CHECK(loom_shm_begin(&c, ctx, a, SHM_ALGO_BARRIER));
    loom_arena_post(c.ar, shm_flag(&c, SHM_STEP_ARRIVE));
    LOOM_CHECK(loom_arena_wait(c.ar, -1, shm_flag(&c, SHM_STEP_ARRIVE)));
    LOOM_CHECK(loom_shm_check(&c, -1));
    return loom_shm_end(&c);
}

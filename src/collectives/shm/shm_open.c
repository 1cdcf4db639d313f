/* SPDX-License-Identifier: Apache-2.0
 *
 * shm_open.c - the arena (arena.h) over a communicator's life, owned by its
 * collective context: created once the point-to-point layer is up
 * (loom_coll_ctx_init), broken with that layer (its break hook), destroyed
 * after it (loom_coll_ctx_close), and handed to the shm collectives only
 * while unbroken. The arena's memory, flags and waits are the transport's
 * (src/transport/shm/shm_arena*.c); this file holds no algorithm.
 * Callers: calibrate.c (open, close) and the shm collectives (the arena).
 */
#include "check.h"
#include "shm_coll.h"

/* The layer broke: so does the arena, after the notices and before the close. */
static void arena_on_break(void *arg, uint64_t seq)
{
    loom_arena_break(arg, seq);
}

loomResult_t loom_shm_open(loom_coll_ctx_t *ctx, const loom_tp_init_args_t *args)
{
    LOOM_CHECK(loom_arena_create(ctx->p2p, args, &ctx->arena));
    if (ctx->arena != NULL)
        loom_p2p_on_break(ctx->p2p, arena_on_break, ctx->arena);
    return loomSuccess;
}

loomResult_t loom_shm_close(loom_coll_ctx_t *ctx)
{
    loomResult_t res = loom_arena_destroy(ctx->arena);
    ctx->arena = NULL;
    return res;
}

loom_arena_t *loom_shm_arena(const loom_coll_ctx_t *ctx)
{
    return ctx->arena != NULL && !loom_arena_broken(ctx->arena) ? ctx->arena : NULL;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * staged_plan.c - the staging plan of a task (staged_plan.h): for each
 * operation the bytes it reads and writes, as the host collectives touch
 * them (include/loom.h's buffer sizes), kept where they are device memory,
 * then sorted and merged.
 */
#include "staged_plan.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype.h"

typedef enum { R_READ, R_WRITE, R_WRITE_PART } range_mode_t;

typedef struct {
    uintptr_t base;
    size_t len;
    range_mode_t mode;
} range_t;

typedef struct {
    const loom_devrt_t *rt;
    range_t *r;
    int n;
} ranges_t;

/* Keeps [p, p+len) when it is device memory. */
static void add(ranges_t *rs, const void *p, size_t len, range_mode_t mode)
{
    if (p == NULL || len == 0 || rs->rt->ptr_device(p) < 0)
        return;
    rs->r[rs->n++] = (range_t){.base = (uintptr_t)p, .len = len, .mode = mode};
}

/* The largest end (displacement + count) of a V collective's blocks. */
static size_t v_end(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0 && displs[i] + counts[i] > end)
            end = displs[i] + counts[i];
    return end;
}

static void coll_ranges(ranges_t *rs, const loom_coll_args_t *a, int rank, int n)
{
    const size_t es = loom_dtype_size(a->dt), c = a->count, un = (size_t)n;
    switch (a->kind) {
    case LOOM_COLL_ALLREDUCE:
        add(rs, a->sendbuff, c * es, R_READ);
        add(rs, a->recvbuff, c * es, R_WRITE);
        break;
    case LOOM_COLL_ALLGATHER:
        add(rs, a->sendbuff, c * es, R_READ);
        add(rs, a->recvbuff, c * es * un, R_WRITE);
        break;
    case LOOM_COLL_REDUCE_SCATTER:
        add(rs, a->sendbuff, c * es * un, R_READ);
        add(rs, a->recvbuff, c * es, R_WRITE);
        break;
    case LOOM_COLL_BCAST: /* sendbuff is read on the root only */
        if (rank == a->root)
            add(rs, a->sendbuff, c * es, R_READ);
        add(rs, a->recvbuff, c * es, R_WRITE);
        break;
    case LOOM_COLL_REDUCE: /* recvbuff is written on the root only */
        add(rs, a->sendbuff, c * es, R_READ);
        if (rank == a->root)
            add(rs, a->recvbuff, c * es, R_WRITE);
        break;
    case LOOM_COLL_ALLTOALL:
        add(rs, a->sendbuff, c * es * un, R_READ);
        add(rs, a->recvbuff, c * es * un, R_WRITE);
        break;
    case LOOM_COLL_ALLTOALLV: /* the blocks may leave gaps the call must not touch */
        add(rs, a->sendbuff, v_end(a->sendcounts, a->sdispls, n) * es, R_READ);
        add(rs, a->recvbuff, v_end(a->recvcounts, a->rdispls, n) * es, R_WRITE_PART);
        break;
    case LOOM_COLL_ALLGATHERV:
        add(rs, a->sendbuff, a->recvcounts[rank] * es, R_READ);
        add(rs, a->recvbuff, v_end(a->recvcounts, a->rdispls, n) * es, R_WRITE_PART);
        break;
    case LOOM_COLL_REDUCE_SCATTERV:
        add(rs, a->sendbuff, c * es, R_READ);
        add(rs, a->recvbuff, a->recvcounts[rank] * es, R_WRITE);
        break;
    default: /* the barrier touches nothing */
        break;
    }
}

static void op_ranges(ranges_t *rs, const loom_op_t *op, int rank, int n)
{
    switch (op->kind) {
    case LOOM_OP_COLL:
        coll_ranges(rs, &op->coll, rank, n);
        break;
    case LOOM_OP_SEND:
        add(rs, op->sendbuff, op->nbytes, R_READ);
        break;
    case LOOM_OP_RECV:
        add(rs, op->recvbuff, op->nbytes, R_WRITE);
        break;
    case LOOM_OP_ECHO: {
        const size_t bytes = op->echo.count * loom_dtype_size(op->echo.dt);
        add(rs, op->echo.sendbuff, bytes, R_READ);
        add(rs, op->echo.recvbuff, bytes, R_WRITE);
        break;
    }
    }
}

static int by_base(const void *x, const void *y)
{
    const range_t *a = x, *b = y;
    return a->base < b->base ? -1 : a->base > b->base;
}

loomResult_t loom_staged_plan(const loom_devrt_t *rt, const loom_task_t *t, int rank, int nranks,
                              loom_staged_plan_t **plan_p)
{
    *plan_p = NULL;
    range_t small[4];
    ranges_t rs = {.rt = rt, .r = small, .n = 0};
    const size_t max = 2 * (size_t)t->nops;
    if (max > 4 && (rs.r = malloc(max * sizeof(*rs.r))) == NULL) {
        LOOM_WARN("out of memory planning the staging of %d operations", t->nops);
        return loomSystemError;
    }
    for (int i = 0; i < t->nops; i++)
        op_ranges(&rs, &t->ops[i], rank, nranks);
    loomResult_t res = loomSuccess;
    if (rs.n == 0)
        goto out;
    qsort(rs.r, (size_t)rs.n, sizeof(*rs.r), by_base);
    loom_staged_plan_t *plan = malloc(sizeof(*plan) + (size_t)rs.n * sizeof(plan->ext[0]));
    if (plan == NULL) {
        LOOM_WARN("out of memory planning the staging of %d operations", t->nops);
        res = loomSystemError;
        goto out;
    }
    plan->n = 0;
    plan->bytes = 0;
    for (int i = 0; i < rs.n; i++) {
        const range_t *r = &rs.r[i];
        const int in = r->mode != R_WRITE, out = r->mode != R_READ;
        loom_staged_extent_t *e = plan->n > 0 ? &plan->ext[plan->n - 1] : NULL;
        /* Overlapping ranges merge; merely adjacent ones stay apart, since they may
         * be two allocations that one copy must not span. */
        if (e != NULL && r->base < e->base + e->len) {
            if (r->base + r->len > e->base + e->len)
                e->len = r->base + r->len - e->base;
            e->in |= in;
            e->out |= out;
            continue;
        }
        plan->ext[plan->n++] =
            (loom_staged_extent_t){.base = r->base, .len = r->len, .in = in, .out = out};
    }
    for (int i = 0; i < plan->n; i++) {
        plan->ext[i].off = plan->bytes;
        plan->bytes +=
            (plan->ext[i].len + LOOM_STAGED_ALIGN - 1) & ~(size_t)(LOOM_STAGED_ALIGN - 1);
    }
    *plan_p = plan;
out:
    if (rs.r != small)
        free(rs.r);
    return res;
}

/* p moved into its extent's staging copy; p itself when it is in none. */
static const void *moved(const loom_staged_plan_t *plan, const void *p, char *stage)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; p != NULL && i < plan->n; i++) {
        const loom_staged_extent_t *e = &plan->ext[i];
        if (a >= e->base && a < e->base + e->len)
            return stage + e->off + (a - e->base);
    }
    return p;
}

void loom_staged_translate(const loom_staged_plan_t *plan, const loom_task_t *t, void *stage,
                           loom_op_t *xops)
{
    for (int i = 0; i < t->nops; i++) {
        loom_op_t *x = &xops[i];
        *x = t->ops[i];
        if (plan == NULL)
            continue;
        switch (x->kind) {
        case LOOM_OP_COLL:
            x->coll.sendbuff = moved(plan, x->coll.sendbuff, stage);
            x->coll.recvbuff = (void *)(uintptr_t)moved(plan, x->coll.recvbuff, stage);
            break;
        case LOOM_OP_ECHO:
            x->echo.sendbuff = moved(plan, x->echo.sendbuff, stage);
            x->echo.recvbuff = (void *)(uintptr_t)moved(plan, x->echo.recvbuff, stage);
            break;
        case LOOM_OP_SEND:
        case LOOM_OP_RECV:
            x->sendbuff = moved(plan, x->sendbuff, stage);
            x->recvbuff = (void *)(uintptr_t)moved(plan, x->recvbuff, stage);
            break;
        }
    }
}

size_t loom_staged_plan_bytes(const loom_staged_plan_t *plan)
{
    size_t b = 0;
    for (int i = 0; plan != NULL && i < plan->n; i++)
        b += plan->ext[i].len;
    return b;
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * staged_plan.h - where a task's device memory goes in host staging
 * (staged_plan.c): the byte ranges of device memory its operations read and
 * write, merged where they overlap into extents, each with its place in the
 * staging buffer and whether it must be copied in (something reads it, or
 * the task writes only part of it: the bytes it leaves alone must come back
 * unchanged) and out (something writes it). Host memory is not staged: the
 * host collective reads and writes it where it is. Operations keep their
 * in-place layouts, since a pointer and its in-place partner fall in one
 * extent and move together.
 */
#ifndef LOOM_STAGED_PLAN_H
#define LOOM_STAGED_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "devrt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_STAGED_ALIGN 64 /* each extent starts on this many bytes of the staging */

typedef struct {
    uintptr_t base; /* device address */
    size_t len;
    size_t off; /* in the staging buffer */
    int in, out;
} loom_staged_extent_t;

typedef struct loom_staged_plan {
    int n;
    size_t bytes; /* staging the task needs */
    loom_staged_extent_t ext[];
} loom_staged_plan_t;

/* The plan of task t on rank `rank` of nranks; *plan_p NULL when t touches no
 * device memory. SystemError if out of memory. */
loomResult_t loom_staged_plan(const loom_devrt_t *rt, const loom_task_t *t, int rank, int nranks,
                              loom_staged_plan_t **plan_p);
/* xops[i] = t->ops[i] with every pointer into an extent moved to the same
 * place of its staging copy at stage. */
void loom_staged_translate(const loom_staged_plan_t *plan, const loom_task_t *t, void *stage,
                           loom_op_t *xops);
/* Bytes of device memory the task touches, for the trace. */
size_t loom_staged_plan_bytes(const loom_staged_plan_t *plan);

#ifdef __cplusplus
}
#endif

#endif

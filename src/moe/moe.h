/* SPDX-License-Identifier: Apache-2.0
 *
 * moe.h - what the MoE module's files share: the check of a top-k routing
 * table that every public entry point runs before it writes anything, and
 * the check of an extensible struct's size/magic/version header.
 * Internal to src/moe/; the public API is include/loom_moe.h.
 */
#ifndef LOOM_MOE_INTERNAL_H
#define LOOM_MOE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* Checks a [num_tokens*top_k] table over num_experts ids: E >= 1, top_k in
 * 1..E, the array non-NULL when num_tokens > 0, num_tokens*top_k without
 * overflow, each entry -1 or in [0, E), no id twice in a row. what names the
 * table in the WARN. Errors: InvalidArgument, SystemError (out of memory). */
loomResult_t loom_moe_topk_check(const char *what, const int32_t *topk, size_t num_tokens,
                                 int top_k, int num_experts);

/* Checks an extensible struct's header (init names its initializer in the WARN): magic, a size at
 * least min_size (the fields this version needs), and, when zero_tail, zero bytes past own_size.
 * Errors: InvalidArgument. */
loomResult_t loom_moe_struct_check(const char *type, const char *init, const void *s, size_t size,
                                   unsigned int magic, unsigned int want_magic, size_t min_size,
                                   size_t own_size, int zero_tail);

#endif

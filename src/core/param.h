/* SPDX-License-Identifier: Apache-2.0
 *
 * param.h - cached accessors for the LOOM_* variables listed in params.def.
 * Each value is read from the environment once (first use), logged at INFO
 * under ENV when set, and invalid values fall back to the default with a WARN.
 */
#ifndef LOOM_PARAM_H
#define LOOM_PARAM_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_PARAM_TYPE_int  int64_t
#define LOOM_PARAM_TYPE_size int64_t
#define LOOM_PARAM_TYPE_str  const char *

#define X(_name, _type, _def, _doc, _sub) LOOM_PARAM_TYPE_##_type loom_param_##_name(void);
#include "params.def"
#undef X

typedef struct {
    const char *name; /* without the LOOM_ prefix */
    const char *type; /* "int", "size" or "str" */
    const char *def;  /* default, as text */
    const char *doc;
    const char *subsys;
} loom_param_info_t;

/* The table of every parameter, for loom_info and docs; *n_p = its length. */
const loom_param_info_t *loom_param_table(int *n_p);
/* Parses "123", "4K", "2M", "1G" (binary). Returns 0 on success. */
int loom_parse_size(const char *s, int64_t *out_p);
/* Forgets cached values so the next access reads the environment again (tests). */
void loom_param_reset_cache(void);
/* Changes with every loom_param_reset_cache: caches of values derived from
 * parameters keep it and recompute when it differs. Lock-free. */
unsigned loom_param_generation(void);

#endif

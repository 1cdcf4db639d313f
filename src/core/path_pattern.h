/* SPDX-License-Identifier: Apache-2.0
 *
 * path_pattern.h - the %-expansion of file names that parameters give (LOOM_DUMP_ON_TIMEOUT,
 * LOOM_MOE_TRACE_FILE), so that every rank or process can write a file of its own. No state.
 */
#ifndef LOOM_PATH_PATTERN_H
#define LOOM_PATH_PATTERN_H

#include <stddef.h>

/* Expands "%h" (host), "%p" (this process's pid), "%r" (rank) and "%%" in
 * pattern into out (len bytes, always terminated). */
void loom_expand_path(const char *pattern, const char *host, int rank, char *out, size_t len);

#endif

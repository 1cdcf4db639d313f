/* SPDX-License-Identifier: Apache-2.0
 *
 * dump_text.h - bounded text building for the timeout dump (p2p_report.c): JSON pieces
 * appended to a fixed buffer (never past its end, silently truncated); the
 * %h/%p/%r expansion of LOOM_DUMP_ON_TIMEOUT's path is core's (path_pattern.h).
 * No state of its own.
 */
#ifndef LOOM_DUMP_TEXT_H
#define LOOM_DUMP_TEXT_H

#include <stddef.h>

#include "path_pattern.h" /* loom_expand_path, for the dump's file name */

typedef struct {
    char *buf;
    size_t cap, len;
} loom_jbuf_t;

/* Appends printf-style text. */
void loom_jput(loom_jbuf_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string: quotes, backslashes and control characters escaped. */
void loom_jstr(loom_jbuf_t *j, const char *s);

#endif

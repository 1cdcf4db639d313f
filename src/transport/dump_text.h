/* SPDX-License-Identifier: Apache-2.0
 *
 * dump_text.h - bounded text building for the timeout dump (p2p_report.c): JSON pieces
 * appended to a fixed buffer (never past its end, silently truncated) and the
 * %h/%p/%r expansion of LOOM_DUMP_ON_TIMEOUT's path. No state of its own.
 */
#ifndef LOOM_DUMP_TEXT_H
#define LOOM_DUMP_TEXT_H

#include <stddef.h>

typedef struct {
    char *buf;
    size_t cap, len;
} loom_jbuf_t;

/* Appends printf-style text. */
void loom_jput(loom_jbuf_t *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string: quotes, backslashes and control characters escaped. */
void loom_jstr(loom_jbuf_t *j, const char *s);
/* Expands "%h" (host), "%p" (this process's pid), "%r" (rank) and "%%" in
 * pattern into out (len bytes, always terminated). */
void loom_expand_path(const char *pattern, const char *host, int rank, char *out, size_t len);

#endif

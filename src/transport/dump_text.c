/* SPDX-License-Identifier: Apache-2.0
 *
 * dump_text.c - the text helpers of dump_text.h: JSON appended to a bounded
 * buffer. Caller: p2p_report.c.
 */
#include "dump_text.h"

#include <stdarg.h>
#include <stdio.h>

void loom_jput(loom_jbuf_t *j, const char *fmt, ...)
{
    if (j->len >= j->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(j->buf + j->len, j->cap - j->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        j->len = j->len + (size_t)n < j->cap ? j->len + (size_t)n : j->cap;
}

void loom_jstr(loom_jbuf_t *j, const char *s)
{
    loom_jput(j, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            loom_jput(j, "\\%c", ch);
        else if (ch < 0x20)
            loom_jput(j, "\\u%04x", ch);
        else
            loom_jput(j, "%c", ch);
    }
    loom_jput(j, "\"");
}

/* SPDX-License-Identifier: Apache-2.0
 *
 * dump_text.c - the text helpers of dump_text.h: JSON appended to a bounded
 * buffer and the timeout dump's path pattern. Caller: p2p_report.c.
 */
#include "dump_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

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

void loom_expand_path(const char *pattern, const char *host, int rank, char *out, size_t len)
{
    size_t o = 0;
    for (const char *s = pattern; *s && o + 1 < len; s++) {
        if (s[0] == '%' && (s[1] == 'h' || s[1] == 'p' || s[1] == 'r' || s[1] == '%')) {
            s++;
            if (*s == 'h')
                o += (size_t)snprintf(out + o, len - o, "%s", host);
            else if (*s == 'p')
                o += (size_t)snprintf(out + o, len - o, "%d", (int)getpid());
            else if (*s == 'r')
                o += (size_t)snprintf(out + o, len - o, "%d", rank);
            else
                out[o++] = '%';
            if (o >= len)
                o = len - 1;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
}

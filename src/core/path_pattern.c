/* SPDX-License-Identifier: Apache-2.0
 *
 * path_pattern.c - loom_expand_path (path_pattern.h). Callers: the timeout dump
 * (transport/p2p_report.c) and the MoE routing trace (moe/moe_trace_env.c).
 */
#include "path_pattern.h"

#include <stdio.h>
#include <unistd.h>

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

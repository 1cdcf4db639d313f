/* SPDX-License-Identifier: Apache-2.0
 *
 * log_line.c - parsing of LOOM_DEBUG and LOOM_DEBUG_SUBSYS, and the writing of
 * one log line, for libloom's logger and the NCCL drop-in library alike
 * (log_line.h).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log_line.h"

static const struct {
    const char *name;
    uint32_t bit;
} subsys_names[] = {
    {"INIT", LOOM_LOG_INIT},
    {"BOOTSTRAP", LOOM_LOG_BOOTSTRAP},
    {"TRANSPORT", LOOM_LOG_TRANSPORT},
    {"SHM", LOOM_LOG_SHM},
    {"TCP", LOOM_LOG_TCP},
    {"COLL", LOOM_LOG_COLL},
    {"ENV", LOOM_LOG_ENV},
    {"ALLOC", LOOM_LOG_ALLOC},
    {"CALL", LOOM_LOG_CALL},
    {"P2P", LOOM_LOG_P2P},
    {"UCX", LOOM_LOG_UCX},
    {"TOPO", LOOM_LOG_TOPO},
    {"ECHO", LOOM_LOG_ECHO},
    {"QUANT", LOOM_LOG_QUANT},
    {"SHIM", LOOM_LOG_SHIM},
    {"DEVICE", LOOM_LOG_DEVICE},
    {"ALL", LOOM_LOG_ALL},
};
#define NSUBSYS (sizeof(subsys_names) / sizeof(subsys_names[0]))

loom_log_level_t loom_log_level_parse(const char *text)
{
    if (text == NULL)
        return LOOM_LOG_WARN;
    if (strcasecmp(text, "NONE") == 0)
        return LOOM_LOG_NONE;
    if (strcasecmp(text, "VERSION") == 0)
        return LOOM_LOG_VERSION;
    if (strcasecmp(text, "INFO") == 0)
        return LOOM_LOG_INFO;
    if (strcasecmp(text, "TRACE") == 0)
        return LOOM_LOG_TRACE;
    return LOOM_LOG_WARN;
}

uint32_t loom_log_subsys_parse(const char *text, char *unknown, size_t unknown_len)
{
    unknown[0] = '\0';
    int negate = (*text == '^');
    if (negate)
        text++;
    uint32_t mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < NSUBSYS && strcasecmp(tok, subsys_names[i].name) != 0)
            i++;
        if (i < NSUBSYS)
            mask |= subsys_names[i].bit;
        else if (unknown[0] == '\0')
            snprintf(unknown, unknown_len, "%s", tok);
    }
    return negate ? ~mask : mask;
}

void loom_log_subsys_names(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NSUBSYS && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, " %s", subsys_names[i].name);
}

void loom_log_sink_open(loom_log_sink_t *sink, const char *pattern)
{
    gethostname(sink->host, sizeof(sink->host) - 1);
    char *dot = strchr(sink->host, '.');
    if (dot)
        *dot = '\0';
    if (pattern == NULL || *pattern == '\0')
        return;
    char path[512];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", sink->host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "a");
    if (f != NULL) {
        setvbuf(f, NULL, _IOLBF, 0);
        sink->file = f;
    }
}

void loom_log_sink_write(loom_log_sink_t *sink, loom_log_level_t level, int rank, const char *where,
                         const char *msg)
{
    const char *lvl = level == LOOM_LOG_WARN    ? "WARN"
                      : level == LOOM_LOG_INFO  ? "INFO"
                      : level == LOOM_LOG_TRACE ? "TRACE"
                                                : "VERSION";
    pthread_mutex_lock(&sink->lock);
    FILE *out = sink->file ? sink->file : stderr;
    if (level == LOOM_LOG_WARN)
        fprintf(out, "%s:%d:%d [%d] %s LOOM WARN %s\n", sink->host, (int)getpid(),
                (int)syscall(SYS_gettid), rank, where ? where : "loom", msg);
    else
        fprintf(out, "%s:%d:%d [%d] LOOM %s %s\n", sink->host, (int)getpid(),
                (int)syscall(SYS_gettid), rank, lvl, msg);
    fflush(out);
    pthread_mutex_unlock(&sink->lock);
}

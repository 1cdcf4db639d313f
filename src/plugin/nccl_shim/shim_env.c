/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_env.c - the mode of libloom-nccl.so (LOOM_NCCL_MODE) and its log lines.
 * libloom.so does not export its logger, so the few lines here write loom's
 * format themselves (src/core/debug.c): "host:pid:tid [rank] LOOM LEVEL msg",
 * WARN with the component in place of file:line. The settings are loom's:
 * LOOM_DEBUG (NONE, VERSION, WARN, INFO, TRACE; default WARN), LOOM_DEBUG_SUBSYS
 * (the INFO and TRACE lines need SHIM or ALL in it; ^ negates the list) and
 * LOOM_DEBUG_FILE (%h host, %p pid). The per-call trace is on from INFO up:
 * SHIM must be named anyway, so a second knob would only add a way to get
 * nothing. The shim knows no rank: lines carry [-1], as loom's do before a
 * communicator exists.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = SHIM_LOG_WARN; /* highest shim_log_level_t printed; 0: none */
static int log_subsys;                /* SHIM named (or ALL) in LOOM_DEBUG_SUBSYS */
static FILE *log_file;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether the comma list names SHIM (ALL counts; a leading ^ negates). */
static int subsys_names_shim(const char *list)
{
    int negate = (*list == '^');
    if (negate)
        list++;
    int named = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (strcasecmp(tok, "SHIM") == 0 || strcasecmp(tok, "ALL") == 0)
            named = 1;
    return negate ? !named : named;
}

static void open_log_file(const char *pattern)
{
    char path[512];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", log_host);
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
        log_file = f;
    }
}

static void log_init(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *lvl = getenv("LOOM_DEBUG");
    if (lvl == NULL || *lvl == '\0')
        log_level = SHIM_LOG_WARN;
    else if (strcasecmp(lvl, "NONE") == 0 || strcasecmp(lvl, "VERSION") == 0)
        log_level = 0;
    else if (strcasecmp(lvl, "INFO") == 0)
        log_level = SHIM_LOG_INFO;
    else if (strcasecmp(lvl, "TRACE") == 0)
        log_level = SHIM_LOG_TRACE;
    else
        log_level = SHIM_LOG_WARN; /* loom itself warns about a bad value */
    const char *subsys = getenv("LOOM_DEBUG_SUBSYS");
    log_subsys = subsys != NULL && subsys_names_shim(subsys);
    const char *file = getenv("LOOM_DEBUG_FILE");
    if (file && *file)
        open_log_file(file);
}

/* Whether a line of this level is printed. */
static int log_enabled(shim_log_level_t level)
{
    pthread_once(&log_once, log_init);
    if (level == SHIM_LOG_WARN)
        return log_level >= SHIM_LOG_WARN;
    return log_level >= SHIM_LOG_INFO && log_subsys;
}

int shim_trace_enabled(void)
{
    return log_enabled(SHIM_LOG_TRACE);
}

void shim_log(shim_log_level_t level, const char *fmt, ...)
{
    if (!log_enabled(level))
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *name = level == SHIM_LOG_WARN   ? "libloom-nccl LOOM WARN"
                       : level == SHIM_LOG_INFO ? "LOOM INFO"
                                                : "LOOM TRACE";
    pthread_mutex_lock(&log_lock);
    FILE *out = log_file ? log_file : stderr;
    fprintf(out, "%s:%d:%d [-1] %s %s\n", log_host, (int)getpid(), (int)syscall(SYS_gettid), name,
            msg);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
}

static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
static shim_mode_t mode = SHIM_MODE_ROUTE;

static void mode_init(void)
{
    const char *s = getenv("LOOM_NCCL_MODE");
    if (s == NULL || *s == '\0' || strcasecmp(s, "route") == 0)
        mode = SHIM_MODE_ROUTE;
    else if (strcasecmp(s, "forward") == 0)
        mode = SHIM_MODE_FORWARD;
    else if (strcasecmp(s, "loom") == 0)
        mode = SHIM_MODE_LOOM;
    else
        shim_log(SHIM_LOG_WARN, "LOOM_NCCL_MODE=%s is not forward, route or loom; using route", s);
    shim_log(SHIM_LOG_INFO, "NCCL shim: mode %s", shim_mode_name(mode));
}

shim_mode_t shim_mode(void)
{
    pthread_once(&mode_once, mode_init);
    return mode;
}

const char *shim_mode_name(shim_mode_t m)
{
    switch (m) {
    case SHIM_MODE_FORWARD:
        return "forward";
    case SHIM_MODE_ROUTE:
        return "route";
    case SHIM_MODE_LOOM:
        return "loom";
    }
    return "unknown";
}

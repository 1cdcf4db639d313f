/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_env.c - the mode of libloom-nccl.so (LOOM_NCCL_MODE) and its log lines.
 * libloom.so does not export its logger, so the lines are written through
 * the part of it that both link, src/core/log_line.c: loom's format,
 * "host:pid:tid [rank] LOOM LEVEL msg", WARN with the component in place of
 * file:line. The settings are loom's:
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
#include <strings.h>

#include "log_line.h"
#include "shim.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static loom_log_level_t log_level = LOOM_LOG_WARN;
static int log_subsys; /* SHIM named (or ALL) in LOOM_DEBUG_SUBSYS */
static loom_log_sink_t log_sink = LOOM_LOG_SINK_INITIALIZER;

static void log_init(void)
{
    const char *lvl = getenv("LOOM_DEBUG");
    log_level = loom_log_level_parse(lvl);
    const char *subsys = getenv("LOOM_DEBUG_SUBSYS");
    char unknown[64]; /* loom itself warns about an unknown name */
    log_subsys = subsys != NULL &&
                 (loom_log_subsys_parse(subsys, unknown, sizeof(unknown)) & LOOM_LOG_SHIM) != 0;
    loom_log_sink_open(&log_sink, getenv("LOOM_DEBUG_FILE"));
}

static loom_log_level_t loom_level(shim_log_level_t level)
{
    return level == SHIM_LOG_WARN   ? LOOM_LOG_WARN
           : level == SHIM_LOG_INFO ? LOOM_LOG_INFO
                                    : LOOM_LOG_TRACE;
}

/* Whether a line of this level is printed. */
static int log_enabled(shim_log_level_t level)
{
    pthread_once(&log_once, log_init);
    if (level == SHIM_LOG_WARN)
        return log_level >= LOOM_LOG_WARN;
    return log_level >= LOOM_LOG_INFO && log_subsys;
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
    loom_log_sink_write(&log_sink, loom_level(level), -1, "libloom-nccl", msg);
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

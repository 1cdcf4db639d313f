/* SPDX-License-Identifier: Apache-2.0
 *
 * debug.c - the logger and the per-thread last-error text.
 * LOOM_DEBUG picks the level (default WARN), LOOM_DEBUG_SUBSYS the
 * subsystems printed at INFO (default INIT,ENV; ^ negates; ALL), and
 * LOOM_DEBUG_FILE a file (%h host, %p pid) instead of stderr. Every WARN is
 * also stored as the calling thread's last error, whether printed or not.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"
#include "log_line.h"
#include "param.h"

#define LAST_ERROR_BYTES 1024

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static loom_log_level_t log_level = LOOM_LOG_WARN;
int loom_log_gate = LOOM_LOG_TRACE;
static uint32_t log_subsys = LOOM_LOG_INIT | LOOM_LOG_ENV;
static loom_log_sink_t log_sink = LOOM_LOG_SINK_INITIALIZER;

static __thread char last_error[LAST_ERROR_BYTES];
static __thread int thread_rank = -1;
static int process_rank = -1;

/* Writes one formatted line; the caller has decided it is enabled. */
static void log_print(loom_log_level_t level, const char *file, int line, const char *msg)
{
    char where[128];
    const char *base = strrchr(file, '/');
    snprintf(where, sizeof(where), "%s:%d", base ? base + 1 : file, line);
    loom_log_sink_write(&log_sink, level, loom_debug_get_rank(), where, msg);
}

static void log_init(void)
{
    const char *lvl = loom_param_DEBUG();
    log_level = loom_log_level_parse(lvl);
    __atomic_store_n(&loom_log_gate, (int)log_level, __ATOMIC_RELAXED);
    char unknown[64];
    log_subsys = loom_log_subsys_parse(loom_param_DEBUG_SUBSYS(), unknown, sizeof(unknown));
    loom_log_sink_open(&log_sink, loom_param_DEBUG_FILE());
    if (unknown[0] != '\0' && log_level >= LOOM_LOG_WARN) {
        /* Printed here: loom_log would wait on the once this function runs under. */
        char names[256], msg[LAST_ERROR_BYTES];
        loom_log_subsys_names(names, sizeof(names));
        snprintf(msg, sizeof(msg), "LOOM_DEBUG_SUBSYS: unknown subsystem '%s' ignored; known:%s",
                 unknown, names);
        log_print(LOOM_LOG_WARN, __FILE__, __LINE__, msg);
    }
}

void loom_debug_set_rank(int rank)
{
    /* Every call names its rank: plain loads first, so that the common case (the same rank
     * as the last call, the process already named) costs no store and no locked instruction. */
    if (thread_rank != rank)
        thread_rank = rank;
    /* The first communicator made in the process names it. Several may be made at once on
     * threads of their own (the NCCL drop-in library's grouped inits do), hence the atomics. */
    int unset = -1;
    if (__atomic_load_n(&process_rank, __ATOMIC_RELAXED) == -1)
        __atomic_compare_exchange_n(&process_rank, &unset, rank, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
}

int loom_debug_get_rank(void)
{
    return thread_rank >= 0 ? thread_rank : __atomic_load_n(&process_rank, __ATOMIC_RELAXED);
}

int loom_log_enabled(loom_log_level_t level, uint32_t subsys)
{
    pthread_once(&log_once, log_init);
    if (level > log_level)
        return 0;
    return level <= LOOM_LOG_WARN || (subsys & log_subsys) != 0;
}

void loom_log(loom_log_level_t level, uint32_t subsys, const char *file, int line, const char *fmt,
              ...)
{
    pthread_once(&log_once, log_init);
    if (level != LOOM_LOG_WARN && !loom_log_enabled(level, subsys))
        return; /* a disabled INFO costs no formatting (one per call on the hot path) */
    char msg[LAST_ERROR_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == LOOM_LOG_WARN)
        snprintf(last_error, sizeof(last_error), "%s", msg);
    if (loom_log_enabled(level, subsys))
        log_print(level, file, line, msg);
}

void loom_set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

const char *loom_last_error(void)
{
    return last_error;
}

void loom_clear_last_error(void)
{
    last_error[0] = '\0';
}

void loom_debug_abort(void)
{
    abort();
}

LOOM_API const char *loomGetLastError(loomComm_t comm)
{
    (void)comm; /* the text is per thread: the thread that saw the failure reads it */
    return last_error;
}

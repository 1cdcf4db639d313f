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
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "debug.h"
#include "param.h"

#define LAST_ERROR_BYTES 1024

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static loom_log_level_t log_level = LOOM_LOG_WARN;
int loom_log_gate = LOOM_LOG_TRACE;
static uint32_t log_subsys = LOOM_LOG_INIT | LOOM_LOG_ENV;
static FILE *log_file;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread char last_error[LAST_ERROR_BYTES];
static __thread int thread_rank = -1;
static int process_rank = -1;

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
    {"ALL", LOOM_LOG_ALL},
};
#define NSUBSYS (sizeof(subsys_names) / sizeof(subsys_names[0]))

/* The mask of a LOOM_DEBUG_SUBSYS list. The first name it does not know goes
 * to unknown (empty if none): the caller warns once the logger is set up. */
static uint32_t parse_subsys(const char *s, char *unknown, size_t unknown_len)
{
    unknown[0] = '\0';
    int negate = (*s == '^');
    if (negate)
        s++;
    uint32_t mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
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

/* Writes one formatted line; the caller has decided it is enabled. */
static void log_print(loom_log_level_t level, const char *file, int line, const char *msg)
{
    const char *lvl = level == LOOM_LOG_WARN    ? "WARN"
                      : level == LOOM_LOG_INFO  ? "INFO"
                      : level == LOOM_LOG_TRACE ? "TRACE"
                                                : "VERSION";
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    pthread_mutex_lock(&log_lock);
    FILE *out = log_file ? log_file : stderr;
    if (level == LOOM_LOG_WARN)
        fprintf(out, "%s:%d:%d [%d] %s:%d LOOM WARN %s\n", log_host, (int)getpid(),
                (int)syscall(SYS_gettid), loom_debug_get_rank(), base, line, msg);
    else
        fprintf(out, "%s:%d:%d [%d] LOOM %s %s\n", log_host, (int)getpid(),
                (int)syscall(SYS_gettid), loom_debug_get_rank(), lvl, msg);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
}

static void log_init(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *lvl = loom_param_DEBUG();
    if (strcasecmp(lvl, "NONE") == 0)
        log_level = LOOM_LOG_NONE;
    else if (strcasecmp(lvl, "VERSION") == 0)
        log_level = LOOM_LOG_VERSION;
    else if (strcasecmp(lvl, "INFO") == 0)
        log_level = LOOM_LOG_INFO;
    else if (strcasecmp(lvl, "TRACE") == 0)
        log_level = LOOM_LOG_TRACE;
    else
        log_level = LOOM_LOG_WARN;
    __atomic_store_n(&loom_log_gate, (int)log_level, __ATOMIC_RELAXED);
    char unknown[64];
    log_subsys = parse_subsys(loom_param_DEBUG_SUBSYS(), unknown, sizeof(unknown));
    const char *file = loom_param_DEBUG_FILE();
    if (file && *file)
        open_log_file(file);
    if (unknown[0] != '\0' && log_level >= LOOM_LOG_WARN) {
        /* Printed here: loom_log would wait on the once this function runs under. */
        char msg[LAST_ERROR_BYTES];
        size_t o = (size_t)snprintf(
            msg, sizeof(msg), "LOOM_DEBUG_SUBSYS: unknown subsystem '%s' ignored; known:", unknown);
        for (size_t i = 0; i < NSUBSYS && o < sizeof(msg); i++)
            o += (size_t)snprintf(msg + o, sizeof(msg) - o, " %s", subsys_names[i].name);
        log_print(LOOM_LOG_WARN, __FILE__, __LINE__, msg);
    }
}

void loom_debug_set_rank(int rank)
{
    thread_rank = rank;
    /* The first communicator made in the process names it. Several may be made at once on
     * threads of their own (the NCCL drop-in library's grouped inits do), hence the atomics. */
    int unset = -1;
    __atomic_compare_exchange_n(&process_rank, &unset, rank, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
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

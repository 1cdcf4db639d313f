/* SPDX-License-Identifier: Apache-2.0
 *
 * log_line.h - loom's log line and its settings, shared by libloom's logger
 * (debug.c) and by the NCCL drop-in library (libloom-nccl.so), which cannot
 * call that logger (libloom.so does not export it) yet must read the same
 * variables and write the same lines. Nothing here keeps state of its own or
 * calls the logger, so that the drop-in library can link this file alone.
 * Line format: host:pid:tid [rank] LOOM LEVEL message; WARN puts where the
 * line comes from (file:line) before LOOM.
 */
#ifndef LOOM_LOG_LINE_H
#define LOOM_LOG_LINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "debug.h"

/* LOOM_DEBUG's value as a level: NONE, VERSION, WARN, INFO or TRACE, in any
 * case; NULL, empty or anything else is WARN (debug.c warns about the last). */
loom_log_level_t loom_log_level_parse(const char *text);
/* The LOOM_LOG_* mask of a LOOM_DEBUG_SUBSYS list (comma-separated names, ALL,
 * a leading ^ negates). The first name it does not know goes to unknown
 * (empty if none). */
uint32_t loom_log_subsys_parse(const char *text, char *unknown, size_t unknown_len);
/* " INIT BOOTSTRAP ..." : the known names, for the message about an unknown one. */
void loom_log_subsys_names(char *buf, size_t len);

/* Where lines go: stderr, or the file LOOM_DEBUG_FILE names. */
typedef struct {
    pthread_mutex_t lock;
    FILE *file; /* NULL: stderr */
    char host[64];
} loom_log_sink_t;
#define LOOM_LOG_SINK_INITIALIZER                                                                  \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, NULL,                                                           \
        {                                                                                          \
            0                                                                                      \
        }                                                                                          \
    }

/* Fills in the host name and opens the file of pattern (%h host, %p pid),
 * appending; pattern NULL or empty, or a file that cannot be opened, leaves
 * stderr. Call once, before any write. */
void loom_log_sink_open(loom_log_sink_t *sink, const char *pattern);
/* Writes one line; where (file:line, or a component's name) is printed on
 * WARN lines only and may be NULL there. */
void loom_log_sink_write(loom_log_sink_t *sink, loom_log_level_t level, int rank, const char *where,
                         const char *msg);

#endif

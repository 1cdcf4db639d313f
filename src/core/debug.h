/* SPDX-License-Identifier: Apache-2.0
 *
 * debug.h - logging (LOOM_DEBUG, LOOM_DEBUG_SUBSYS, LOOM_DEBUG_FILE) and the
 * per-thread "last error" text that loomGetLastError returns.
 * Line format: host:pid:tid [rank] LOOM LEVEL message; WARN adds file:line.
 */
#ifndef LOOM_DEBUG_H
#define LOOM_DEBUG_H

#include <stdint.h>

#include "loom.h"

typedef enum {
    LOOM_LOG_NONE = 0,
    LOOM_LOG_VERSION = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_INFO = 3,
    LOOM_LOG_TRACE = 4
} loom_log_level_t;

/* Subsystems (bit flags) for LOOM_DEBUG_SUBSYS: a line names the module it
 * comes from. P2P is the point-to-point layer above the transports (src/transport/p2p*.c);
 * TRANSPORT is which transport reaches which peer and the framing they share. SHIM is
 * libloom-nccl.so's: it writes its lines itself, in this format, and is named here so that
 * LOOM_DEBUG_SUBSYS=SHIM is no unknown name to loom. DEVICE is the device path's entry
 * (src/device/transport: each communicator's device transports and calls). */
#define LOOM_LOG_INIT      (1u << 0)
#define LOOM_LOG_BOOTSTRAP (1u << 1)
#define LOOM_LOG_TRANSPORT (1u << 2)
#define LOOM_LOG_SHM       (1u << 3)
#define LOOM_LOG_TCP       (1u << 4)
#define LOOM_LOG_COLL      (1u << 5)
#define LOOM_LOG_ENV       (1u << 6)
#define LOOM_LOG_ALLOC     (1u << 7)
#define LOOM_LOG_CALL      (1u << 8)
#define LOOM_LOG_P2P       (1u << 9)
#define LOOM_LOG_UCX       (1u << 10)
#define LOOM_LOG_TOPO      (1u << 11)
#define LOOM_LOG_ECHO      (1u << 12)
#define LOOM_LOG_QUANT     (1u << 13)
#define LOOM_LOG_SHIM      (1u << 14)
#define LOOM_LOG_DEVICE    (1u << 15)
#define LOOM_LOG_ALL       (~0u)

/* The rank printed in log lines of the calling thread (-1: none). */
void loom_debug_set_rank(int rank);
int loom_debug_get_rank(void);

void loom_log(loom_log_level_t level, uint32_t subsys, const char *file, int line, const char *fmt,
              ...) __attribute__((format(printf, 5, 6)));
/* True if a message at this level and subsystem would be printed. */
int loom_log_enabled(loom_log_level_t level, uint32_t subsys);

/* Records a failure message as the thread's last error without printing it
 * (callers that return an error to the user but must not log, e.g. probes). */
void loom_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *loom_last_error(void);
void loom_clear_last_error(void);

/* Ends the process after an invariant failed (LOOM_ASSERT only). */
void loom_debug_abort(void) __attribute__((noreturn));

/* WARN always records the message as the last error, even when not printed. */
#define LOOM_WARN(...) loom_log(LOOM_LOG_WARN, LOOM_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)
/* INFO and TRACE lines reach loom_log only at or below this level: LOOM_LOG_TRACE
 * until the settings are read, then LOOM_DEBUG's level. A disabled line on the
 * per-call path costs one load instead of a call. */
extern int loom_log_gate;
#define LOOM_LOG_GATED(_level, _subsys, ...)                                                       \
    do {                                                                                           \
        if ((int)(_level) <= __atomic_load_n(&loom_log_gate, __ATOMIC_RELAXED))                    \
            loom_log((_level), (_subsys), __FILE__, __LINE__, __VA_ARGS__);                        \
    } while (0)
#define LOOM_INFO(_subsys, ...) LOOM_LOG_GATED(LOOM_LOG_INFO, (_subsys), __VA_ARGS__)
#ifdef LOOM_ENABLE_TRACE
#define LOOM_TRACE(_subsys, ...) LOOM_LOG_GATED(LOOM_LOG_TRACE, (_subsys), __VA_ARGS__)
#else
#define LOOM_TRACE(_subsys, ...)                                                                   \
    do {                                                                                           \
    } while (0)
#endif

#endif

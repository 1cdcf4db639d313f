/* SPDX-License-Identifier: Apache-2.0
 *
 * check.h - the check macros every loom source uses to propagate loomResult_t.
 * WARN is logged where an error is first detected (by the callee); these
 * macros only add a file:line breadcrumb at INFO while unwinding.
 */
#ifndef LOOM_CHECK_H
#define LOOM_CHECK_H

#include <errno.h>
#include <string.h>

#include "debug.h"

/* Propagate a failing call to the caller. */
#define LOOM_CHECK(_call)                                                                          \
    do {                                                                                           \
        loomResult_t _r = (_call);                                                                 \
        if (_r != loomSuccess) {                                                                   \
            LOOM_INFO(LOOM_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)_r);                   \
            return _r;                                                                             \
        }                                                                                          \
    } while (0)

/* Jump to a cleanup label, keeping the result in _res. */
#define LOOM_CHECK_GOTO(_call, _res, _label)                                                       \
    do {                                                                                           \
        (_res) = (_call);                                                                          \
        if ((_res) != loomSuccess) {                                                               \
            LOOM_INFO(LOOM_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(_res));               \
            goto _label;                                                                           \
        }                                                                                          \
    } while (0)

/* During cleanup: run the call, keep the first error in _res, go on. */
#define LOOM_CHECK_IGNORE(_call, _res)                                                             \
    do {                                                                                           \
        loomResult_t _r = (_call);                                                                 \
        if (_r != loomSuccess && (_res) == loomSuccess)                                            \
            (_res) = _r;                                                                           \
    } while (0)

/* A system call returning -1 on error: retried on EINTR only, WARN with errno text. */
#define LOOM_SYSCHECK(_expr, _name)                                                                \
    do {                                                                                           \
        int _ret;                                                                                  \
        do {                                                                                       \
            _ret = (int)(_expr);                                                                   \
        } while (_ret == -1 && errno == EINTR);                                                    \
        if (_ret == -1) {                                                                          \
            LOOM_WARN("%s failed: %s", _name, strerror(errno));                                    \
            return loomSystemError;                                                                \
        }                                                                                          \
    } while (0)

/* A pthread call returning an errno value. */
#define LOOM_PTHREADCHECK(_expr, _name)                                                            \
    do {                                                                                           \
        int _ret = (_expr);                                                                        \
        if (_ret != 0) {                                                                           \
            LOOM_WARN("%s failed: %s", _name, strerror(_ret));                                     \
            return loomSystemError;                                                                \
        }                                                                                          \
    } while (0)

/* Invariants only: logs and aborts, also in release builds. */
#define LOOM_ASSERT(_cond)                                                                         \
    do {                                                                                           \
        if (!(_cond)) {                                                                            \
            LOOM_WARN("assertion failed: %s", #_cond);                                             \
            loom_debug_abort();                                                                    \
        }                                                                                          \
    } while (0)

#endif

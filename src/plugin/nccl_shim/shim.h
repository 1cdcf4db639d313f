/* SPDX-License-Identifier: Apache-2.0
 *
 * shim.h - what the files of libloom-nccl.so (SONAME libnccl.so.2) share.
 *
 * The library exports every function of NCCL 2.28.9 (shim_api.def) and runs
 * in one of three modes, LOOM_NCCL_MODE:
 *   forward  every call goes to the real libnccl.so.2 (shim_real.c);
 *   route    (default) communicators are paired: a real NCCL one and a loom
 *            one; each call goes where the rules of LOOM_NCCL_ROUTE send it
 *            (shim_route.c), the rest to NCCL; without a real library it
 *            behaves as loom;
 *   loom     loom handles everything; no real library is opened.
 * The exported entry points (shim_exports.c) send forward-mode calls to the
 * real library and every other call to shim_impl_<Name> (shim_impl_*.c).
 * Handles the shim did not create are passed to the real library untouched.
 */
#ifndef LOOM_NCCL_SHIM_H
#define LOOM_NCCL_SHIM_H

#include <nccl.h>
#include <stdarg.h>

#include "loom.h"

/* C spellings of the device API's types (nccl_device/core.h is C++): the
 * shim only passes them through, so all but ncclTeam_t stay opaque. */
typedef struct {
    int nRanks, rank, stride;
} shim_team_t; /* layout of struct ncclTeam */
typedef struct shim_dev_comm shim_dev_comm_t;
typedef struct shim_dev_comm_requirements shim_dev_comm_requirements_t;
typedef struct shim_dev_resource_requirements shim_dev_resource_requirements_t;
typedef struct shim_barrier_handle shim_barrier_handle_t;
typedef struct shim_lla2a_handle shim_lla2a_handle_t;

/* ---- shim_env.c: mode, logging, call trace ------------------------------ */

typedef enum { SHIM_MODE_FORWARD, SHIM_MODE_ROUTE, SHIM_MODE_LOOM } shim_mode_t;
/* LOOM_NCCL_MODE, read once (thread safe); an unknown value is a WARN and
 * means route. */
shim_mode_t shim_mode(void);
const char *shim_mode_name(shim_mode_t mode);

typedef enum { SHIM_LOG_WARN = 1, SHIM_LOG_INFO = 2, SHIM_LOG_TRACE = 3 } shim_log_level_t;
/* One line on stderr (or LOOM_DEBUG_FILE) in loom's log format, subsystem
 * SHIM, when LOOM_DEBUG allows the level (WARN by default) and, for INFO and
 * TRACE, LOOM_DEBUG_SUBSYS names SHIM (or ALL). */
void shim_log(shim_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether LOOM_DEBUG_SUBSYS=SHIM asked for the per-call trace. */
int shim_trace_enabled(void);

/* ---- shim_errors.c: NCCL's texts, the last error, loom's results -------- */

/* NCCL 2.28.9's fixed text for a result code. */
const char *shim_error_string(ncclResult_t result);
/* Stores the calling thread's last-error text (what ncclGetLastError returns
 * for calls the shim or loom handled) and logs it as a WARN. */
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The calling thread's last-error text; "" if none. */
const char *shim_last_error(void);
/* Empties it: a call that failed inside the real library makes the real
 * library's text the one ncclGetLastError should return. */
void shim_clear_last_error(void);
/* Maps a loom result to NCCL's (loomTimeout -> ncclRemoteError) and, when it
 * is a failure, copies loomGetLastError(NULL) into the last-error text. */
ncclResult_t shim_from_loom(loomResult_t result);

/* ---- shim_real.c: the real libnccl.so.2 ---------------------------------- */

typedef struct {
#define SHIM_FN(ret, name, params, args) ret(*name) params;
#define SHIM_FN_VOID(name, params, args) void(*name) params;
#include "shim_api.def"
#undef SHIM_FN
#undef SHIM_FN_VOID
    int version;      /* its ncclGetVersion */
    const char *path; /* the file opened */
} shim_real_t;

/* The real library, opened on first use (LOOM_NCCL_LIBRARY, else found beside
 * the CUDA toolkit; never this library itself) with RTLD_DEEPBIND so that its
 * own internal calls bind to itself; functions are taken by their pnccl
 * names. NULL when it cannot be opened, or in loom mode; shim_real_why() then
 * says why. Thread safe. */
const shim_real_t *shim_real(void);
const char *shim_real_why(void);

/* ---- shim_impl_*.c: route and loom modes -------------------------------- */

/* One per exported function, same signature; called by the exported entry
 * point in every mode but forward. */
#define SHIM_FN(ret, name, params, args) ret shim_impl_##name params;
#define SHIM_FN_VOID(name, params, args) void shim_impl_##name params;
#include "shim_api.def"
#undef SHIM_FN
#undef SHIM_FN_VOID

#endif

/* SPDX-License-Identifier: Apache-2.0
 *
 * error.c - names and texts of loomResult_t, from one X-macro list (libuv's
 * pattern), so the code, its name and its message cannot drift apart.
 * loomGetLastError lives in debug.c next to the buffer it reads.
 */
#include <assert.h>

#include "debug.h"
#include "loom.h"

#define LOOM_RESULT_MAP(X)                                                                         \
    X(loomSuccess, "no error")                                                                     \
    X(loomUnhandledDeviceError, "unhandled device error (details in loomGetLastError)")            \
    X(loomSystemError, "unhandled system error (details in loomGetLastError)")                     \
    X(loomInternalError, "internal error - please report this issue to the loom developers")       \
    X(loomInvalidArgument, "invalid argument (details in loomGetLastError)")                       \
    X(loomInvalidUsage, "invalid usage (details in loomGetLastError)")                             \
    X(loomRemoteError, "remote process exited or there was a network error")                       \
    X(loomInProgress, "loom operation in progress")                                                \
    X(loomTimeout, "operation timed out (see LOOM_TIMEOUT_MS)")

#define X_TEXT(_code, _text) _text,
static const char *const result_text[] = {LOOM_RESULT_MAP(X_TEXT)};
#undef X_TEXT

static_assert(sizeof(result_text) / sizeof(result_text[0]) == loomNumResults,
              "every loomResult_t needs a text");

LOOM_API const char *loomGetErrorString(loomResult_t result)
{
    if ((int)result < 0 || result >= loomNumResults)
        return "unknown result code";
    return result_text[result];
}

LOOM_API loomResult_t loomGetVersion(int *version)
{
    if (version == NULL) {
        LOOM_WARN("loomGetVersion: version is NULL");
        return loomInvalidArgument;
    }
    *version = LOOM_VERSION_CODE;
    return loomSuccess;
}

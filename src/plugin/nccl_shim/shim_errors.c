/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_errors.c - NCCL's result texts, the per-thread last error of the calls
 * the shim or loom handled (what ncclGetLastError returns for them), and the
 * mapping of loom's results onto NCCL's.
 */
#include <stdarg.h>
#include <stdio.h>

#include "shim.h"

static __thread char last_error[1024];

const char *shim_error_string(ncclResult_t result)
{
    /* NCCL 2.28.9's texts, word for word: frameworks print them and users
     * search for them. */
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

void shim_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    shim_log(SHIM_LOG_WARN, "%s", last_error);
}

const char *shim_last_error(void)
{
    return last_error;
}

void shim_clear_last_error(void)
{
    last_error[0] = '\0';
}

ncclResult_t shim_from_loom(loomResult_t result)
{
    if (result == loomSuccess || result == loomInProgress)
        return (ncclResult_t)result;
    const char *text = loomGetLastError(NULL);
    snprintf(last_error, sizeof(last_error), "%s", text ? text : "");
    if (result == loomTimeout)
        return ncclRemoteError; /* NCCL has no timeout code: a peer that never came is remote */
    if ((int)result < 0 || result >= loomTimeout)
        return ncclInternalError;
    return (ncclResult_t)result; /* 1..6 mean the same in both */
}

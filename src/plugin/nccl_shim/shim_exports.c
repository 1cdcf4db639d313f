/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_exports.c - the functions libloom-nccl.so exports: for every entry of
 * shim_api.def a strong pncclX and a weak alias ncclX, as NCCL itself exports
 * them (a tool that defines ncclX and calls pncclX keeps working), plus
 * NCCL's ncclResetDebugInitInternal and the NCCL 2.29 additions, which answer
 * ncclInvalidUsage. In forward mode a call goes to the real library's pncclX;
 * in every other mode to shim_impl_X. Declaring nccl.h first makes the
 * compiler check each definition against NCCL's own prototype.
 */
#include <stdint.h>
#include <string.h>

#include "shim.h"

#define SHIM_EXPORT __attribute__((visibility("default")))

/* Forwarded calls in progress on this thread. A call that arrives while one
 * is running came from inside the real library (its own calls to its API,
 * when RTLD_DEEPBIND could not keep them inside it); it is forwarded like any
 * other, and the trace says so. */
static __thread int in_real;

static void trace_forward(const char *name)
{
    if (shim_trace_enabled())
        shim_log(SHIM_LOG_TRACE, "%s -> nccl (forward%s)", name,
                 in_real ? "; re-entered from the real library, passed through" : "");
}

/* Why a forwarded call cannot be made, as the last error, and its result. */
static ncclResult_t forward_fail(const shim_real_t *r, const char *name)
{
    if (r == NULL) {
        shim_warn("%s: LOOM_NCCL_MODE=forward but the real NCCL library is not available: %s", name,
                  shim_real_why());
        return ncclSystemError;
    }
    shim_warn("%s: the real NCCL library %s (version %d) does not export p%s", name, r->path,
              r->version, name);
    return ncclInvalidUsage;
}

/* The results of the generic entry points: ncclResult_t ones carry the
 * failure; the others (teams, ranks, slot counts) can only answer zero. */
_Static_assert(_Generic((int *)0, ncclResult_t * : 0, default : 1),
               "ncclResult_t must not be int for the selections below");
static void set_result(ncclResult_t *out, ncclResult_t r)
{
    *out = r;
}
static void set_nothing(void *out, ncclResult_t r)
{
    (void)out;
    (void)r;
}
#define SHIM_SET_FAILED(out, r)                                                                    \
    _Generic((out), ncclResult_t * : set_result, default : set_nothing)(out, r)

/* A call that failed inside the real library: its text, not an older one of
 * the shim's, is what ncclGetLastError must give. */
static void note_result(const ncclResult_t *r)
{
    if (*r != ncclSuccess && *r != ncclInProgress)
        shim_clear_last_error();
}
static void note_nothing(const void *out)
{
    (void)out;
}
#define SHIM_NOTE(out) _Generic((out), ncclResult_t * : note_result, default : note_nothing)(out)

/* ncclGetErrorString and ncclGetLastError are written out below: their
 * forward mode is not a plain call. SHIM_HAND_<name> expands to two tokens,
 * which moves the 1 into the place SHIM_SECOND picks; every other name leaves
 * the 0 there. */
#define SHIM_HAND_GetErrorString ~, 1
#define SHIM_HAND_GetLastError   ~, 1
#define SHIM_SECOND(a, b, ...)   b
#define SHIM_SECOND_(...)        SHIM_SECOND(__VA_ARGS__)
#define SHIM_IS_HAND(name)       SHIM_SECOND_(SHIM_HAND_##name, 0, ~)
#define SHIM_CAT_(a, b)          a##b
#define SHIM_CAT(a, b)           SHIM_CAT_(a, b)

#define SHIM_EXPORT_1(ret, name, params, args)
#define SHIM_EXPORT_0(ret, name, params, args)                                                     \
    SHIM_EXPORT ret pnccl##name params                                                             \
    {                                                                                              \
        if (shim_mode() != SHIM_MODE_FORWARD)                                                      \
            return shim_impl_##name args;                                                          \
        const shim_real_t *r = shim_real();                                                        \
        ret out;                                                                                   \
        if (r == NULL || r->name == NULL) {                                                        \
            memset(&out, 0, sizeof(out));                                                          \
            SHIM_SET_FAILED(&out, forward_fail(r, "nccl" #name));                                  \
            return out;                                                                            \
        }                                                                                          \
        trace_forward("nccl" #name);                                                               \
        in_real++;                                                                                 \
        out = r->name args;                                                                        \
        in_real--;                                                                                 \
        SHIM_NOTE(&out);                                                                           \
        return out;                                                                                \
    }                                                                                              \
    SHIM_EXPORT ret nccl##name params __attribute__((weak, alias("pnccl" #name)));
#define SHIM_FN(ret, name, params, args)                                                           \
    SHIM_CAT(SHIM_EXPORT_, SHIM_IS_HAND(name))(ret, name, params, args)
#define SHIM_FN_VOID(name, params, args) /* the two void ones are written out below */
#include "shim_api.def"
#undef SHIM_FN
#undef SHIM_FN_VOID

SHIM_EXPORT const char *pncclGetErrorString(ncclResult_t result)
{
    if (shim_mode() != SHIM_MODE_FORWARD)
        return shim_impl_GetErrorString(result);
    const shim_real_t *r = shim_real();
    if (r == NULL || r->GetErrorString == NULL)
        return shim_error_string(result); /* the same fixed texts */
    trace_forward("ncclGetErrorString");
    in_real++;
    const char *text = r->GetErrorString(result);
    in_real--;
    return text;
}
SHIM_EXPORT const char *ncclGetErrorString(ncclResult_t result)
    __attribute__((weak, alias("pncclGetErrorString")));

SHIM_EXPORT const char *pncclGetLastError(ncclComm_t comm)
{
    if (shim_mode() != SHIM_MODE_FORWARD)
        return shim_impl_GetLastError(comm);
    /* The shim's own text while it is the newest failure: that of a call it
     * could not forward, or of a 2.29 function. */
    const char *own = shim_last_error();
    const shim_real_t *r = shim_real();
    if (own[0] != '\0' || r == NULL || r->GetLastError == NULL)
        return own;
    trace_forward("ncclGetLastError");
    in_real++;
    const char *text = r->GetLastError(comm);
    in_real--;
    return text;
}
SHIM_EXPORT const char *ncclGetLastError(ncclComm_t comm)
    __attribute__((weak, alias("pncclGetLastError")));

/* Whether a void function can be forwarded; if not, the last error says why. */
static int forward_void_ok(const shim_real_t *r, void (*fn)(void), const char *name)
{
    if (r == NULL || fn == NULL) {
        forward_fail(r, name);
        return 0;
    }
    trace_forward(name);
    return 1;
}

SHIM_EXPORT void pncclResetDebugInit(void)
{
    if (shim_mode() != SHIM_MODE_FORWARD) {
        shim_impl_ResetDebugInit();
        return;
    }
    const shim_real_t *r = shim_real();
    if (forward_void_ok(r, r ? r->ResetDebugInit : NULL, "ncclResetDebugInit")) {
        in_real++;
        r->ResetDebugInit();
        in_real--;
    }
}
SHIM_EXPORT void ncclResetDebugInit(void) __attribute__((weak, alias("pncclResetDebugInit")));

/* NCCL has this one only under its own name, strong. */
SHIM_EXPORT void ncclResetDebugInitInternal(void)
{
    if (shim_mode() != SHIM_MODE_FORWARD) {
        shim_impl_ResetDebugInitInternal();
        return;
    }
    const shim_real_t *r = shim_real();
    if (forward_void_ok(r, r ? r->ResetDebugInitInternal : NULL, "ncclResetDebugInitInternal")) {
        in_real++;
        r->ResetDebugInitInternal();
        in_real--;
    }
}

/* ---- NCCL 2.29's additions ----------------------------------------------
 * Present so that programs and bindings built against 2.29 headers load;
 * this library implements 2.28.9, so each answers ncclInvalidUsage in every
 * mode (forwarding would need 2.29's types, which the 2.28 headers lack).
 * Types only 2.29 defines have their C equivalents: ncclCommMemStat_t is an
 * enum (passed as int) and ncclWaitSignalDesc_t is only pointed to. */
typedef struct shim_wait_signal_desc shim_wait_signal_desc_t;

static ncclResult_t newer_api(const char *name)
{
    if (shim_trace_enabled())
        shim_log(SHIM_LOG_TRACE, "%s -> refused (NCCL 2.29 API)", name);
    shim_warn("%s is NCCL 2.29 API; this library implements NCCL 2.28.9", name);
    return ncclInvalidUsage;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define SHIM_NEWER(name, params)                                                                   \
    SHIM_EXPORT ncclResult_t pnccl##name params                                                    \
    {                                                                                              \
        return newer_api("nccl" #name);                                                            \
    }                                                                                              \
    SHIM_EXPORT ncclResult_t nccl##name params __attribute__((weak, alias("pnccl" #name)));
SHIM_NEWER(CommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId))
SHIM_NEWER(CommGrow, (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                      ncclComm_t *newcomm, ncclConfig_t *config))
SHIM_NEWER(CommSuspend, (ncclComm_t comm, int flags))
SHIM_NEWER(CommResume, (ncclComm_t comm))
SHIM_NEWER(CommMemStats, (ncclComm_t comm, int stat, uint64_t *value))
SHIM_NEWER(WinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void **outUserPtr))
SHIM_NEWER(PutSignal, (const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                       unsigned int flags, ncclComm_t comm, cudaStream_t stream))
SHIM_NEWER(Signal, (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                    cudaStream_t stream))
SHIM_NEWER(WaitSignal,
           (int nDesc, shim_wait_signal_desc_t *signalDescs, ncclComm_t comm, cudaStream_t stream))
#pragma GCC diagnostic pop

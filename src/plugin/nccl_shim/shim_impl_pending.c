/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_impl_pending.c - route and loom modes until their implementation is
 * built in: every shim_impl_X refuses with ncclInvalidUsage and says so
 * (functions that return no ncclResult_t answer zero, NULL or nothing).
 * Forward mode does not come here.
 */
#include <string.h>

#include "shim.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

static ncclResult_t pending(const char *name)
{
    shim_warn("%s: route and loom modes are not built in this library yet (LOOM_NCCL_MODE=forward "
              "forwards to the real NCCL)",
              name);
    return ncclInvalidUsage;
}
static void set_result(ncclResult_t *out, ncclResult_t r)
{
    *out = r;
}
static void set_nothing(void *out, ncclResult_t r)
{
    (void)out;
    (void)r;
}

/* Functions that return an ncclResult_t carry the refusal; the others answer zero. */
#define SET_RESULT(out, r)                                                                         \
    _Generic((out), ncclResult_t * : set_result, default : set_nothing)(out, r)

#define SHIM_FN(ret, name, params, args)                                                           \
    ret shim_impl_##name params                                                                    \
    {                                                                                              \
        ret out;                                                                                   \
        memset(&out, 0, sizeof(out));                                                              \
        SET_RESULT(&out, pending("nccl" #name));                                                   \
        return out;                                                                                \
    }
#define SHIM_FN_VOID(name, params, args)                                                           \
    void shim_impl_##name params                                                                   \
    {                                                                                              \
        pending("nccl" #name);                                                                     \
    }
#include "shim_api.def"

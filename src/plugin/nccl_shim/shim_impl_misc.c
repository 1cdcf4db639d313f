/* SPDX-License-Identifier: Apache-2.0
 *
 * shim_impl_misc.c - version, error texts, memory, registration and the host
 * functions of NCCL's device API, in route and loom modes.
 *
 * Loom mode: ncclMemAlloc is loomMemAlloc, device memory, where the process
 * has a device runtime (loomCommDeviceRuntime); without one it returns
 * page-aligned host memory (what loom's host path uses; the page alignment
 * is what NCCL's window registration asks of a buffer), unless the CUDA
 * driver is loaded: a program that uses CUDA asks for device memory, and
 * host memory would fail it later and far from the cause. ncclMemFree frees
 * the host memory it gave out and hands everything else to loomMemFree,
 * which refuses what loomMemAlloc did not give. Registrations are tokens
 * (shim_token.h). The device API has no
 * loom counterpart: its calls fail with InvalidUsage, ncclTeam* return a team
 * of zeros, ncclTeamRankTo* -1 (no such rank) and ncclLLA2ACalcSlots 0 (no
 * slots), each leaving the reason as the last error.
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim_buffers.h"
#include "shim_comm.h"
#include "shim_premul.h"
#include "shim_token.h"

/* ---- version and errors -------------------------------------------------------- */

ncclResult_t shim_impl_GetVersion(int *version)
{
    if (version == NULL)
        return shim_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    if (shim_paired())
        return SHIM_REAL(GetVersion, (version));
    *version = NCCL_VERSION_CODE; /* the API this library implements */
    return ncclSuccess;
}

const char *shim_impl_GetErrorString(ncclResult_t result)
{
    return shim_error_string(result);
}

const char *shim_impl_GetLastError(ncclComm_t comm)
{
    if (shim_paired() && shim_last_failure_real() && shim_real()->GetLastError != NULL)
        return shim_real()->GetLastError(comm);
    return shim_last_error();
}

void shim_impl_ResetDebugInit(void)
{
    const shim_real_t *real = shim_real();
    if (real != NULL && real->ResetDebugInit != NULL)
        real->ResetDebugInit();
}

void shim_impl_ResetDebugInitInternal(void)
{
    const shim_real_t *real = shim_real();
    if (real != NULL && real->ResetDebugInitInternal != NULL)
        real->ResetDebugInitInternal();
}

/* ---- memory ---------------------------------------------------------------------- */

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static void **mem;
static int mem_n, mem_cap;

ncclResult_t shim_impl_MemAlloc(void **ptr, size_t size)
{
    if (shim_paired())
        return SHIM_REAL(MemAlloc, (ptr, size));
    if (ptr == NULL)
        return shim_fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    const char *runtime = NULL;
    char why[256] = "";
    if (loomCommDeviceRuntime(NULL, &runtime, why, sizeof(why)) == loomSuccess && runtime != NULL)
        return shim_loom(loomMemAlloc(ptr, size));
    if (shim_cuda_loaded())
        return shim_fail(ncclInvalidUsage,
                         "ncclMemAlloc: this process uses CUDA, but loom has no device runtime to "
                         "allocate device memory with: %s",
                         why);
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    void *p = NULL;
    const size_t n = size ? size : 1;
    if (posix_memalign(&p, (size_t)page, n) != 0)
        return shim_fail(ncclSystemError, "ncclMemAlloc: out of memory for %zu bytes", size);
    pthread_mutex_lock(&mem_lock);
    if (mem_n == mem_cap) {
        int cap = mem_cap ? 2 * mem_cap : 16;
        void **m = realloc(mem, (size_t)cap * sizeof(*m));
        if (m == NULL) {
            pthread_mutex_unlock(&mem_lock);
            free(p);
            return shim_fail(ncclSystemError, "ncclMemAlloc: out of memory");
        }
        mem = m;
        mem_cap = cap;
    }
    mem[mem_n++] = p;
    pthread_mutex_unlock(&mem_lock);
    *ptr = p;
    return ncclSuccess;
}

ncclResult_t shim_impl_MemFree(void *ptr)
{
    if (shim_paired())
        return SHIM_REAL(MemFree, (ptr));
    if (ptr == NULL)
        return ncclSuccess;
    pthread_mutex_lock(&mem_lock);
    int i = 0;
    while (i < mem_n && mem[i] != ptr)
        i++;
    const int found = i < mem_n;
    if (found)
        mem[i] = mem[--mem_n];
    if (mem_n == 0) {
        free(mem);
        mem = NULL;
        mem_cap = 0;
    }
    pthread_mutex_unlock(&mem_lock);
    if (found) {
        free(ptr);
        return ncclSuccess;
    }
    const char *runtime = NULL;
    if (loomCommDeviceRuntime(NULL, &runtime, NULL, 0) == loomSuccess && runtime != NULL)
        return shim_loom(loomMemFree(ptr)); /* refuses what loomMemAlloc did not give */
    return shim_fail(ncclInvalidArgument,
                     "ncclMemFree: %p was not allocated by ncclMemAlloc "
                     "(or was freed already)",
                     ptr);
}

/* ---- registration ---------------------------------------------------------------- */

void shim_tokens_free_all(shim_comm_t *c)
{
    while (c->tokens != NULL) {
        shim_token_t *t = c->tokens;
        c->tokens = t->next;
        free(t);
    }
}

static ncclResult_t not_ours(ncclComm_t comm, const char *fn)
{
    return shim_fail(ncclInvalidArgument,
                     "%s: %p is not a communicator of this library (destroyed, never created, "
                     "or made by another library)",
                     fn, (void *)comm);
}

static ncclResult_t token_add(ncclComm_t comm, shim_token_kind_t kind, void *buff, size_t size,
                              int flags, void **out, const char *fn)
{
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return not_ours(comm, fn);
    ncclResult_t r = ncclSuccess;
    shim_token_t *t = NULL;
    if (out == NULL)
        r = shim_fail(ncclInvalidArgument, "%s: the handle pointer is NULL", fn);
    else if ((t = calloc(1, sizeof(*t))) == NULL)
        r = shim_fail(ncclSystemError, "%s: out of memory", fn);
    if (r == ncclSuccess) {
        *t = (shim_token_t){kind, buff, size, flags, NULL};
        pthread_mutex_lock(&c->lock);
        t->next = c->tokens;
        c->tokens = t;
        pthread_mutex_unlock(&c->lock);
        *out = t;
    }
    shim_comm_release(c);
    return r;
}

static ncclResult_t token_remove(ncclComm_t comm, shim_token_kind_t kind, const void *token,
                                 const char *fn)
{
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return not_ours(comm, fn);
    pthread_mutex_lock(&c->lock);
    shim_token_t **pp = &c->tokens;
    while (*pp != NULL && ((const void *)*pp != token || (*pp)->kind != kind))
        pp = &(*pp)->next;
    shim_token_t *t = *pp;
    if (t != NULL)
        *pp = t->next;
    pthread_mutex_unlock(&c->lock);
    shim_comm_release(c);
    if (t == NULL)
        return shim_fail(ncclInvalidArgument,
                         "%s: %p is not a %s of communicator %p (deregistered already, or made "
                         "on another communicator)",
                         fn, token, kind == SHIM_TOKEN_WINDOW ? "window" : "registration",
                         (void *)comm);
    free(t);
    return ncclSuccess;
}

ncclResult_t shim_impl_CommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    if (shim_paired())
        return SHIM_REAL(CommRegister, (comm, buff, size, handle));
    return token_add(comm, SHIM_TOKEN_REGISTER, buff, size, 0, handle, "ncclCommRegister");
}

ncclResult_t shim_impl_CommDeregister(const ncclComm_t comm, void *handle)
{
    if (shim_paired())
        return SHIM_REAL(CommDeregister, (comm, handle));
    return token_remove(comm, SHIM_TOKEN_REGISTER, handle, "ncclCommDeregister");
}

ncclResult_t shim_impl_CommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                          ncclWindow_t *win, int winFlags)
{
    if (shim_paired())
        return SHIM_REAL(CommWindowRegister, (comm, buff, size, win, winFlags));
    void *t = NULL;
    ncclResult_t r = token_add(comm, SHIM_TOKEN_WINDOW, buff, size, winFlags,
                               win != NULL ? &t : NULL, "ncclCommWindowRegister");
    if (r == ncclSuccess)
        *win = (ncclWindow_t)t;
    return r;
}

ncclResult_t shim_impl_CommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    if (shim_paired())
        return SHIM_REAL(CommWindowDeregister, (comm, win));
    return token_remove(comm, SHIM_TOKEN_WINDOW, (const void *)win, "ncclCommWindowDeregister");
}

/* ---- PreMulSum ops ------------------------------------------------------------------ */

ncclResult_t shim_impl_RedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                            ncclScalarResidence_t residence, ncclComm_t comm)
{
    static const char fn[] = "ncclRedOpCreatePreMulSum";
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(RedOpCreatePreMulSum, (op, scalar, datatype, residence, comm))
                      : not_ours(comm, fn);
    ncclResult_t r = ncclSuccess;
    if (op == NULL || scalar == NULL)
        r = shim_fail(ncclInvalidArgument, "%s: %s is NULL", fn, op == NULL ? "op" : "scalar");
    else if (shim_dtype_size(datatype) == 0)
        r = shim_fail(ncclInvalidArgument, "%s: datatype %d is not valid", fn, (int)datatype);
    else if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        r = shim_fail(ncclInvalidArgument, "%s: residence %d is not valid", fn, (int)residence);
    int id = -1;
    if (r == ncclSuccess && paired) {
        /* Both backends must know the op by one id: the real library's. */
        ncclRedOp_t real_op;
        r = SHIM_REAL(RedOpCreatePreMulSum, (&real_op, scalar, datatype, residence, c->real));
        id = (int)real_op;
    }
    if (r == ncclSuccess) {
        r = shim_premul_create(c, id, scalar, datatype, residence, op);
        if (r != ncclSuccess && paired)
            (void)SHIM_REAL(RedOpDestroy, ((ncclRedOp_t)id, c->real));
    }
    shim_comm_release(c);
    return r;
}

ncclResult_t shim_impl_RedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    const int paired = shim_paired();
    shim_comm_t *c = shim_comm_find(comm);
    if (c == NULL)
        return paired ? SHIM_REAL(RedOpDestroy, (op, comm)) : not_ours(comm, "ncclRedOpDestroy");
    ncclResult_t r = shim_premul_destroy(c, op);
    if (r == ncclSuccess && paired)
        r = SHIM_REAL(RedOpDestroy, (op, c->real));
    shim_comm_release(c);
    return r;
}

/* ---- the device API's host functions ---------------------------------------------- */

static ncclResult_t no_device_api(const char *fn)
{
    if (shim_paired())
        return ncclInvalidUsage; /* device_api named the real library's missing function */
    return shim_fail(ncclInvalidUsage, "%s: NCCL's device API is not provided by loom", fn);
}

static const shim_real_t *device_api(const char *fn, const void *have)
{
    if (!shim_paired())
        return NULL;
    if (have == NULL) {
        (void)shim_fail(ncclInvalidUsage, "%s: the real library %s does not export it", fn,
                        shim_real()->path);
        return NULL;
    }
    return shim_real();
}

#define DEVICE_API(_name)                                                                          \
    device_api("nccl" #_name, shim_paired() ? (void *)shim_real()->_name : NULL)

ncclResult_t shim_impl_DevCommCreate(ncclComm_t comm, const shim_dev_comm_requirements_t *reqs,
                                     shim_dev_comm_t *outDevComm)
{
    const shim_real_t *real = DEVICE_API(DevCommCreate);
    return real ? shim_real_result(real->DevCommCreate(comm, reqs, outDevComm))
                : no_device_api("ncclDevCommCreate");
}

ncclResult_t shim_impl_DevCommDestroy(ncclComm_t comm, const shim_dev_comm_t *devComm)
{
    const shim_real_t *real = DEVICE_API(DevCommDestroy);
    return real ? shim_real_result(real->DevCommDestroy(comm, devComm))
                : no_device_api("ncclDevCommDestroy");
}

static shim_team_t no_team(const char *fn)
{
    (void)no_device_api(fn);
    const shim_team_t zero = {0, 0, 0};
    return zero;
}

shim_team_t shim_impl_TeamWorld(ncclComm_t comm)
{
    const shim_real_t *real = DEVICE_API(TeamWorld);
    return real ? real->TeamWorld(comm) : no_team("ncclTeamWorld");
}

shim_team_t shim_impl_TeamLsa(ncclComm_t comm)
{
    const shim_real_t *real = DEVICE_API(TeamLsa);
    return real ? real->TeamLsa(comm) : no_team("ncclTeamLsa");
}

shim_team_t shim_impl_TeamRail(ncclComm_t comm)
{
    const shim_real_t *real = DEVICE_API(TeamRail);
    return real ? real->TeamRail(comm) : no_team("ncclTeamRail");
}

int shim_impl_TeamRankToWorld(ncclComm_t comm, shim_team_t team, int rank)
{
    const shim_real_t *real = DEVICE_API(TeamRankToWorld);
    if (real != NULL)
        return real->TeamRankToWorld(comm, team, rank);
    (void)no_device_api("ncclTeamRankToWorld");
    return -1;
}

int shim_impl_TeamRankToLsa(ncclComm_t comm, shim_team_t team, int rank)
{
    const shim_real_t *real = DEVICE_API(TeamRankToLsa);
    if (real != NULL)
        return real->TeamRankToLsa(comm, team, rank);
    (void)no_device_api("ncclTeamRankToLsa");
    return -1;
}

ncclResult_t shim_impl_LsaBarrierCreateRequirement(shim_team_t team, int nBarriers,
                                                   shim_barrier_handle_t *outHandle,
                                                   shim_dev_resource_requirements_t *outReq)
{
    const shim_real_t *real = DEVICE_API(LsaBarrierCreateRequirement);
    return real ? shim_real_result(
                      real->LsaBarrierCreateRequirement(team, nBarriers, outHandle, outReq))
                : no_device_api("ncclLsaBarrierCreateRequirement");
}

ncclResult_t shim_impl_GinBarrierCreateRequirement(ncclComm_t comm, shim_team_t team, int nBarriers,
                                                   shim_barrier_handle_t *outHandle,
                                                   shim_dev_resource_requirements_t *outReq)
{
    const shim_real_t *real = DEVICE_API(GinBarrierCreateRequirement);
    return real ? shim_real_result(
                      real->GinBarrierCreateRequirement(comm, team, nBarriers, outHandle, outReq))
                : no_device_api("ncclGinBarrierCreateRequirement");
}

int shim_impl_LLA2ACalcSlots(int maxElts, int maxEltSize)
{
    const shim_real_t *real = DEVICE_API(LLA2ACalcSlots);
    if (real != NULL)
        return real->LLA2ACalcSlots(maxElts, maxEltSize);
    (void)no_device_api("ncclLLA2ACalcSlots");
    return 0;
}

ncclResult_t shim_impl_LLA2ACreateRequirement(int nBlocks, int nSlots,
                                              shim_lla2a_handle_t *outHandle,
                                              shim_dev_resource_requirements_t *outReq)
{
    const shim_real_t *real = DEVICE_API(LLA2ACreateRequirement);
    return real ? shim_real_result(real->LLA2ACreateRequirement(nBlocks, nSlots, outHandle, outReq))
                : no_device_api("ncclLLA2ACreateRequirement");
}

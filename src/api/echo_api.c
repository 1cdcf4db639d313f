/* SPDX-License-Identifier: Apache-2.0
 *
 * echo_api.c - the public entry points of Echo (include/loom_echo.h): the
 * feedback state's life, argument checks, and the queued call, which runs in
 * its communicator's order like every collective (src/echo/echo_run.c). A
 * state is used only under a reference taken from the registry of live states
 * (registry.h): loomEchoDestroy takes it out and drops the user's reference,
 * and the state is freed when the calls still holding it let go.
 *
 * A call on device buffers (or a device stream) goes through the device path's
 * host-staged transport like a group does (src/device/transport): its buffers are
 * copied to pinned host memory and the 4-bit codec then runs on the CPU, with the
 * same bytes as for host buffers.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm.h"
#include "echo.h"
#include "loom_echo.h"
#include "q4.h"
#include "registry.h"

static loom_registry_t states =
    LOOM_REGISTRY_INITIALIZER("Echo state", "destroyed, or not made by loomEchoCreate");

loomResult_t loom_comm_echo(struct loomComm *comm, loom_echo_ctx_t **ctx_p)
{
    loom_echo_ctx_t *ctx = __atomic_load_n(&comm->echo, __ATOMIC_ACQUIRE);
    if (ctx == NULL) {
        loom_echo_ctx_t *made = NULL;
        LOOM_CHECK(loom_echo_ctx_create(comm->peers, comm->nranks, comm->rank, &made));
        if (__atomic_compare_exchange_n(&comm->echo, &ctx, made, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            ctx = made;
        else
            loom_echo_ctx_free(made); /* another thread made it first: ctx is theirs */
    }
    *ctx_p = ctx;
    return loomSuccess;
}

static void state_free(struct loomEchoState *s)
{
    free(s->e1);
    free(s->e2);
    free(s);
}

void loom_echo_state_release(struct loomEchoState *s)
{
    if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        state_free(s);
}

/* Runs `call` holding a reference on the state s. */
#define WITH_STATE(s, fn, call)                                                                    \
    LOOM_WITH_REF(loom_registry_acquire(&states, (s), (fn)), loom_echo_state_release(s), call)

static loomResult_t check_dtype(loomDataType_t dt, const char *fn)
{
    if (!loom_q4_dtype_ok(dt)) {
        LOOM_WARN("%s: datatype %d is not float32, float16 or bfloat16", fn, (int)dt);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

static loomResult_t echo_create(loomComm_t comm, size_t count, loomDataType_t dt,
                                loomEchoState_t *state)
{
    const char *fn = "loomEchoCreate";
    if (state == NULL) {
        LOOM_WARN("%s: state is NULL", fn);
        return loomInvalidArgument;
    }
    *state = NULL;
    LOOM_CHECK(check_dtype(dt, fn));
    size_t state_bytes; /* the state keeps a float32 residual per value */
    LOOM_CHECK(loom_check_common(NULL, loomFloat32, count, 1, fn, &state_bytes));
    loom_echo_ctx_t *ctx;
    LOOM_CHECK(loom_comm_echo(comm, &ctx));
    struct loomEchoState *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto oom;
    s->comm = comm;
    s->count = count;
    s->dt = dt;
    s->refs = 1;
    (void)loom_echo_own_chunk(&ctx->lay, count, &s->own_off, &s->own_len);
    s->e1 = calloc(count ? count : 1, sizeof(float));
    s->e2 = calloc(s->own_len ? s->own_len : 1, sizeof(float));
    if (s->e1 == NULL || s->e2 == NULL) {
        state_free(s);
        goto oom;
    }
    loomResult_t res = loom_registry_add(&states, s, &s->refs);
    if (res != loomSuccess) {
        state_free(s);
        return res;
    }
    *state = s;
    return loomSuccess;
oom:
    LOOM_WARN("%s: out of memory for the residuals of %zu values", fn, count);
    return loomSystemError;
}

LOOM_API loomResult_t loomEchoCreate(loomComm_t comm, size_t count, loomDataType_t datatype,
                                     loomEchoState_t *state)
{
    LOOM_WITH_COMM(comm, "loomEchoCreate", echo_create(comm, count, datatype, state));
}

static loomResult_t reset(struct loomEchoState *state)
{
    memset(state->e1, 0, state->count * sizeof(float));
    memset(state->e2, 0, state->own_len * sizeof(float));
    return loomSuccess;
}

LOOM_API loomResult_t loomEchoReset(loomEchoState_t state)
{
    WITH_STATE(state, "loomEchoReset", reset(state));
}

LOOM_API loomResult_t loomEchoDestroy(loomEchoState_t state)
{
    if (state == NULL)
        return loomSuccess;
    /* Of two racing destroys only one finds it listed; calls that hold it keep it alive. */
    LOOM_CHECK(loom_registry_remove(&states, state, "loomEchoDestroy"));
    loom_echo_state_release(state);
    return loomSuccess;
}

static loomResult_t residual_of(struct loomEchoState *state, float *residual)
{
    if (residual == NULL && state->count > 0) {
        LOOM_WARN("loomEchoResidual: residual is NULL");
        return loomInvalidArgument;
    }
    if (state->count > 0)
        memcpy(residual, state->e1, state->count * sizeof(float));
    for (size_t i = 0; i < state->own_len; i++)
        residual[state->own_off + i] += state->e2[i];
    return loomSuccess;
}

LOOM_API loomResult_t loomEchoResidual(loomEchoState_t state, float *residual)
{
    WITH_STATE(state, "loomEchoResidual", residual_of(state, residual));
}

static loomResult_t echo_all_reduce(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t dt, loomComm_t comm, loomEchoState_t state,
                                    loomStream_t stream)
{
    const char *fn = "loomEchoAllReduce";
    size_t bytes;
    LOOM_CHECK(check_dtype(dt, fn));
    LOOM_CHECK(loom_check_common(stream, dt, count, 1, fn, &bytes));
    LOOM_CHECK(loom_check_buf(sendbuff, bytes, "sendbuff", fn));
    LOOM_CHECK(loom_check_buf(recvbuff, bytes, "recvbuff", fn));
    LOOM_CHECK(loom_check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn));
    if (state != NULL) {
        /* The reference taken here is the queued call's (the op's, released with it). */
        LOOM_CHECK(loom_registry_acquire(&states, state, fn));
        if (state->comm != comm || state->count != count || state->dt != dt) {
            LOOM_WARN("%s: the state was made for %zu values of datatype %d on communicator %p, "
                      "the call has %zu of datatype %d on %p",
                      fn, state->count, (int)state->dt, state->comm, count, (int)dt, (void *)comm);
            loom_echo_state_release(state);
            return loomInvalidArgument;
        }
    }
    loom_op_t op;
    memset(&op, 0, sizeof(op));
    op.kind = LOOM_OP_ECHO;
    op.echo = (loom_echo_args_t){
        .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count, .dt = dt, .state = state};
    return loom_enqueue(comm, &op, stream);
}

LOOM_API loomResult_t loomEchoAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                        loomDataType_t datatype, loomComm_t comm,
                                        loomEchoState_t state, loomStream_t stream)
{
    LOOM_WITH_COMM(comm, "loomEchoAllReduce",
                   echo_all_reduce(sendbuff, recvbuff, count, datatype, comm, state, stream));
}

static loomResult_t get_counters(loomComm_t comm, loomEchoCounters_t *c)
{
    if (c == NULL) {
        LOOM_WARN("loomEchoGetCounters: counters is NULL");
        return loomInvalidArgument;
    }
    memset(c, 0, sizeof(*c));
    loom_echo_ctx_t *ctx = __atomic_load_n(&comm->echo, __ATOMIC_ACQUIRE);
    if (ctx == NULL)
        return loomSuccess;
    c->calls = __atomic_load_n(&ctx->counters.calls, __ATOMIC_RELAXED);
    c->bytes_sent = __atomic_load_n(&ctx->counters.bytes_sent, __ATOMIC_RELAXED);
    c->values_sent_q4 = __atomic_load_n(&ctx->counters.values_sent_q4, __ATOMIC_RELAXED);
    c->values_owner_q4 = __atomic_load_n(&ctx->counters.values_owner_q4, __ATOMIC_RELAXED);
    c->values_exact = __atomic_load_n(&ctx->counters.values_exact, __ATOMIC_RELAXED);
    c->hierarchical = __atomic_load_n(&ctx->counters.hierarchical, __ATOMIC_RELAXED);
    return loomSuccess;
}

LOOM_API loomResult_t loomEchoGetCounters(loomComm_t comm, loomEchoCounters_t *counters)
{
    LOOM_WITH_COMM(comm, "loomEchoGetCounters", get_counters(comm, counters));
}

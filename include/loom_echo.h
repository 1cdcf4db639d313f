/* SPDX-License-Identifier: Apache-2.0
 *
 * loom_echo.h - Echo, loom's 4-bit all-reduce with error feedback
 * (docs/echo.md).
 *
 * loomEchoAllReduce sums like loomAllReduce(..., loomSum, ...) but sends
 * 4.5 bits per value: each rank quantizes the chunks that other ranks own
 * once and sends them straight to their owners; an owner adds them in
 * float32, in rank order, quantizes the sum once and sends it to every rank.
 * Every value is quantized at most twice per call, for any rank count, and
 * every rank ends with the same bytes. Across hosts (LOOM_HOST_ID or real
 * hosts, the same number of ranks on each) the ranks of a host first reduce
 * in full precision over shared memory, only the hosts' two-shot exchange is
 * 4-bit, and the quantized sums are forwarded unchanged inside each host.
 *
 * Error feedback: a state object keeps the rounding error this rank
 * injected and adds it to the next call on that state, so over K calls the
 * sum of the outputs equals the exact sum of the inputs up to one call's
 * error instead of K calls' errors. Key a state to what the outputs are
 * summed into: one residual stream across a forward pass's layers (tensor
 * parallelism), or one gradient bucket across steps. Passing NULL sends
 * without feedback.
 *
 * Datatypes: loomFloat32, loomFloat16, loomBfloat16. The result is lossy:
 * about 0.12-0.14 relative L2 error per call for Gaussian data (bounded, not
 * growing with the rank count). Non-finite inputs make their 32-value block
 * NaN in the output.
 */
#ifndef LOOM_ECHO_H
#define LOOM_ECHO_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loomEchoState *loomEchoState_t;

/* A feedback state for calls of count elements of datatype on comm, with
 * zero residuals. Local (not collective); memory: 4 bytes per element plus 4
 * per element of this rank's chunk. Errors: InvalidArgument (comm not live,
 * NULL state, unsupported datatype), SystemError (out of memory). */
LOOM_API loomResult_t loomEchoCreate(loomComm_t comm, size_t count, loomDataType_t datatype,
                                     loomEchoState_t *state);
/* Zeroes the residuals (a new stream, a new step). Waits for nothing: do not
 * reset a state that a queued call still uses. Errors: InvalidArgument. */
LOOM_API loomResult_t loomEchoReset(loomEchoState_t state);
/* Frees the state once the calls queued on it have run. NULL is a no-op.
 * Later calls with the handle return InvalidArgument. Errors:
 * InvalidArgument (not a live state). */
LOOM_API loomResult_t loomEchoDestroy(loomEchoState_t state);

/* recvbuff[i] ~= sum over ranks of sendbuff[i]; bitwise identical on every
 * rank. In place if sendbuff == recvbuff. state may be NULL (no feedback);
 * otherwise it must have been created for this comm, count and datatype,
 * and calls on one state must be issued in the same order on every rank
 * (like every collective). Blocking when stream is NULL, else queued.
 * Errors: those of loomAllReduce, and InvalidArgument for a datatype other
 * than float32/float16/bfloat16 or a state of another shape. */
LOOM_API loomResult_t loomEchoAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                        loomDataType_t datatype, loomComm_t comm,
                                        loomEchoState_t state, loomStream_t stream);

/* This rank's share of the pending residual, in float32 at the elements'
 * positions (count values): the feedback the next call on the state will add.
 * The sum of all ranks' shares is the total error the outputs still owe; adding
 * it to the last output closes a stream exactly (as in a telescoping sum).
 * Call it when no call on the state is queued. Errors: InvalidArgument. */
LOOM_API loomResult_t loomEchoResidual(loomEchoState_t state, float *residual);

/* What Echo did on a communicator since its creation (for tests and tuning). */
typedef struct {
    uint64_t calls;           /* loomEchoAllReduce calls that ran */
    uint64_t bytes_sent;      /* bytes this rank handed its transports for them */
    uint64_t values_sent_q4;  /* values this rank quantized for other owners (first quantization) */
    uint64_t values_owner_q4; /* values this rank quantized as an owner (second quantization) */
    uint64_t values_exact;    /* values sent in full precision inside a host */
    uint64_t hierarchical;    /* calls that ran the per-host variant */
} loomEchoCounters_t;

/* Copies comm's counters. Errors: InvalidArgument. */
LOOM_API loomResult_t loomEchoGetCounters(loomComm_t comm, loomEchoCounters_t *counters);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_ECHO_H */

/* SPDX-License-Identifier: Apache-2.0
 *
 * shard_kernels.h - the optimizer's pieces, split so that every layout runs
 * the same code: the Rows layout updates momentum on its local rows, gathers
 * the update, runs Newton-Schulz on the whole matrix and applies only its own
 * rows; Owner and Replicated run the three pieces back to back
 * (loomMuonUpdate). Element-wise code is built without contraction into
 * fused multiply-adds, so a piece that starts at any offset gives the bits
 * of the whole.
 */
#ifndef LOOM_SHARD_KERNELS_H
#define LOOM_SHARD_KERNELS_H

#include <stddef.h>

#include "loom_shard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks size, magic, version (major and minor), ns_steps >= 1, step >= 1,
 * the two enums, ns_eps > 0 and finite, threads >= 1; InvalidUsage with a
 * message naming the field otherwise (InvalidArgument for NULL). fn: the
 * caller's name, for the message. */
loomResult_t loom_muon_config_check(const loomMuonConfig_t *cfg, const char *fn);

/* Momentum and Nesterov on n elements: updates momentum from grad and writes
 * the pre-Newton-Schulz update to u (u may equal grad, not momentum). */
void loom_muon_momentum(float *u, const float *grad, float *momentum, size_t n,
                        const loomMuonConfig_t *cfg);

/* The multiplier of the orthogonalised update for a rows x cols matrix:
 * lr * scale(rows, cols) under cfg->lr_scale. */
float loom_muon_step_size(size_t rows, size_t cols, const loomMuonConfig_t *cfg);

/* Decoupled weight decay, then param -= step * x, on n elements (a whole
 * matrix or some of its rows). */
void loom_muon_apply(float *param, const float *x, size_t n, float step,
                     const loomMuonConfig_t *cfg);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_SHARD_KERNELS_H */

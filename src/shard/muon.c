/* SPDX-License-Identifier: Apache-2.0
 *
 * muon.c - the optimizer's element-wise pieces and the two one-tensor updates built from them:
 * Muon's momentum, Nesterov, step size and decoupled decay (shard_kernels.h, shared by every
 * layout's step), loomMuonUpdate (those around Newton-Schulz, ns.c) and loomAdamWUpdate. Built
 * with -ffp-contract=off: every multiply and add rounds on its own, so the bits of an element do
 * not depend on where the piece that holds it starts (docs/shard.md, "Kernels").
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "loom_shard.h"
#include "shard_kernels.h"

loomResult_t loom_muon_config_check(const loomMuonConfig_t *cfg, const char *fn)
{
    if (cfg == NULL) {
        LOOM_WARN("%s: config is NULL (start from LOOM_MUON_CONFIG_INITIALIZER)", fn);
        return loomInvalidArgument;
    }
    if (cfg->size != sizeof(loomMuonConfig_t) || cfg->magic != LOOM_MUON_CONFIG_MAGIC) {
        LOOM_WARN("%s: loomMuonConfig_t was not initialized with LOOM_MUON_CONFIG_INITIALIZER "
                  "(size %zu, magic 0x%x; this library needs size %zu, magic 0x%x)",
                  fn, cfg->size, cfg->magic, sizeof(loomMuonConfig_t), LOOM_MUON_CONFIG_MAGIC);
        return loomInvalidUsage;
    }
    /* LOOM_VERSION(X, Y, Z) = X*10000 + Y*100 + Z: a patch release keeps the struct. */
    if (cfg->version / 100 != LOOM_VERSION_CODE / 100) {
        LOOM_WARN("%s: loomMuonConfig_t comes from headers of version %u; this library is %u "
                  "(the major and minor versions must match)",
                  fn, cfg->version, (unsigned)LOOM_VERSION_CODE);
        return loomInvalidUsage;
    }
    if (cfg->ns_steps < 1) {
        LOOM_WARN("%s: loomMuonConfig_t ns_steps %d must be >= 1", fn, cfg->ns_steps);
        return loomInvalidUsage;
    }
    if (cfg->step < 1) {
        LOOM_WARN("%s: loomMuonConfig_t step %ld must be >= 1 (1-based, for AdamW's bias "
                  "correction)",
                  fn, cfg->step);
        return loomInvalidUsage;
    }
    if ((unsigned)cfg->momentum_form > (unsigned)loomMuonAccumulate) {
        LOOM_WARN("%s: loomMuonConfig_t momentum_form %d is neither loomMuonLerp (0) nor "
                  "loomMuonAccumulate (1)",
                  fn, (int)cfg->momentum_form);
        return loomInvalidUsage;
    }
    if ((unsigned)cfg->lr_scale > (unsigned)loomMuonScaleNone) {
        LOOM_WARN("%s: loomMuonConfig_t lr_scale %d is out of range (0..3)", fn,
                  (int)cfg->lr_scale);
        return loomInvalidUsage;
    }
    if (!(cfg->ns_eps > 0.0f) || isinf(cfg->ns_eps)) {
        LOOM_WARN("%s: loomMuonConfig_t ns_eps %g must be positive and finite", fn,
                  (double)cfg->ns_eps);
        return loomInvalidUsage;
    }
    if (cfg->threads < 1) {
        LOOM_WARN("%s: loomMuonConfig_t threads %d must be >= 1", fn, cfg->threads);
        return loomInvalidUsage;
    }
    return loomSuccess;
}

void loom_muon_momentum(float *u, const float *grad, float *momentum, size_t n,
                        const loomMuonConfig_t *cfg)
{
    const float mu = cfg->momentum;
    if (cfg->momentum_form == loomMuonLerp) {
        const float w = 1.0f - mu;
        for (size_t i = 0; i < n; i++) {
            float g = grad[i];
            float b = momentum[i] + w * (g - momentum[i]);
            momentum[i] = b;
            u[i] = cfg->nesterov ? g + mu * (b - g) : b;
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float b = mu * momentum[i] + g;
        momentum[i] = b;
        u[i] = cfg->nesterov ? g + mu * b : b;
    }
}

float loom_muon_step_size(size_t rows, size_t cols, const loomMuonConfig_t *cfg)
{
    const double r = (double)rows, c = (double)cols;
    double scale = 1.0;
    switch (cfg->lr_scale) {
    case loomMuonScaleOriginal:
        scale = sqrt(r / c > 1.0 ? r / c : 1.0);
        break;
    case loomMuonScaleMatchAdamW:
        scale = 0.2 * sqrt(r > c ? r : c);
        break;
    case loomMuonScaleSpectral:
        scale = sqrt(r / c);
        break;
    case loomMuonScaleNone:
        break;
    }
    return (float)((double)cfg->lr * scale);
}

void loom_muon_apply(float *param, const float *x, size_t n, float step,
                     const loomMuonConfig_t *cfg)
{
    const float decay = (float)(1.0 - (double)cfg->lr * cfg->weight_decay);
    for (size_t i = 0; i < n; i++) {
        float w = param[i] * decay;
        param[i] = w - step * x[i];
    }
}

/* Checks the pointers and the shape shared by both updates; n: the elements. */
static loomResult_t update_check(const char *fn, const void *p0, const void *p1, const void *p2,
                                 const void *p3, size_t n)
{
    if (p0 == NULL || p1 == NULL || p2 == NULL || p3 == NULL) {
        LOOM_WARN("%s: a NULL pointer (%p, %p, %p, %p)", fn, p0, p1, p2, p3);
        return loomInvalidArgument;
    }
    if (n == 0) {
        LOOM_WARN("%s: no elements to update", fn);
        return loomInvalidArgument;
    }
    return loomSuccess;
}

loomResult_t loomMuonUpdate(float *param, const float *grad, float *momentum, size_t rows,
                            size_t cols, const loomMuonConfig_t *config, float *work)
{
    size_t ws = loomNewtonSchulzWorkspace(rows, cols);
    if (ws == 0) {
        LOOM_WARN("loomMuonUpdate: a %zu x %zu matrix: both sides must be >= 1 and fit BLAS", rows,
                  cols);
        return loomInvalidArgument;
    }
    const size_t n = rows * cols;
    LOOM_CHECK(update_check("loomMuonUpdate", param, grad, momentum, work, n));
    LOOM_CHECK(loom_muon_config_check(config, "loomMuonUpdate"));
    float *u = work;
    loom_muon_momentum(u, grad, momentum, n, config);
    LOOM_CHECK(loomNewtonSchulz(u, u, rows, cols, config->ns_steps, config->ns_coeffs,
                                config->ns_eps, work + n));
    loom_muon_apply(param, u, n, loom_muon_step_size(rows, cols, config), config);
    return loomSuccess;
}

loomResult_t loomAdamWUpdate(float *param, const float *grad, float *m, float *v, size_t n,
                             const loomMuonConfig_t *config)
{
    LOOM_CHECK(update_check("loomAdamWUpdate", param, grad, m, v, n));
    LOOM_CHECK(loom_muon_config_check(config, "loomAdamWUpdate"));
    const float b1 = config->adam_beta1, b2 = config->adam_beta2, eps = config->adam_eps;
    /* The scalars in double, as torch computes them in Python, then rounded once. */
    const double t = (double)config->step;
    const float decay = (float)(1.0 - (double)config->adam_lr * config->adam_weight_decay);
    const float step_size = (float)((double)config->adam_lr / (1.0 - pow(b1, t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    const float w1 = 1.0f - b1, w2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float w = param[i] * decay;
        float mi = m[i] + w1 * (g - m[i]);
        float vi = b2 * v[i] + w2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = w - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
    return loomSuccess;
}

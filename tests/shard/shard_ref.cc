// SPDX-License-Identifier: Apache-2.0
//
// shard_ref.cc - the float64 references of the shard kernel tests (shard_ref.h). Deliberately
// naive: plain loops in the order the definitions are written, no BLAS, so that they share no
// code and no rounding with the library.
#include "shard_ref.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace shardtest {

std::vector<float> Uniform(size_t n, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-0.5f, 0.5f);
    std::vector<float> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}

std::vector<float> Gaussian(size_t n, uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}

std::vector<float> Transpose(const std::vector<float> &a, size_t rows, size_t cols)
{
    std::vector<float> t(a.size());
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            t[j * rows + i] = a[i * cols + j];
    return t;
}

std::vector<double> ToDouble(const std::vector<float> &a)
{
    return std::vector<double>(a.begin(), a.end());
}

double RelL2(const std::vector<float> &got, const std::vector<double> &want)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    if (den == 0.0)
        return std::sqrt(num);
    return std::sqrt(num / den);
}

// c = a (n x k) * b (k x m), row-major.
static std::vector<double> MatMul(const std::vector<double> &a, const std::vector<double> &b,
                                  size_t n, size_t k, size_t m)
{
    std::vector<double> c(n * m, 0.0);
    for (size_t i = 0; i < n; i++)
        for (size_t l = 0; l < k; l++)
            for (size_t j = 0; j < m; j++)
                c[i * m + j] += a[i * k + l] * b[l * m + j];
    return c;
}

static std::vector<double> TransposeD(const std::vector<double> &a, size_t rows, size_t cols)
{
    std::vector<double> t(a.size());
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++)
            t[j * rows + i] = a[i * cols + j];
    return t;
}

std::vector<double> NewtonSchulz(const std::vector<double> &u, size_t rows, size_t cols, int steps,
                                 const float *coeffs, double eps)
{
    static const float kDefault[3] = {3.4445f, -4.7750f, 2.0315f};
    bool tall = rows > cols;
    size_t m = tall ? cols : rows, n = tall ? rows : cols;
    std::vector<double> x = tall ? TransposeD(u, rows, cols) : u;
    double ss = 0.0;
    for (double v : x)
        ss += v * v;
    double d = std::max(std::sqrt(ss), eps);
    for (double &v : x)
        v /= d;
    for (int s = 0; s < steps; s++) {
        const float *c = coeffs ? coeffs + 3 * s : kDefault;
        std::vector<double> a = MatMul(x, TransposeD(x, m, n), m, n, m);
        std::vector<double> aa = MatMul(a, a, m, m, m);
        std::vector<double> b(m * m);
        for (size_t i = 0; i < m * m; i++)
            b[i] = (double)c[1] * a[i] + (double)c[2] * aa[i];
        std::vector<double> bx = MatMul(b, x, m, m, n);
        for (size_t i = 0; i < m * n; i++)
            x[i] = (double)c[0] * x[i] + bx[i];
    }
    return tall ? TransposeD(x, m, n) : x;
}

void MuonStep(MuonState &s, const std::vector<float> &grad, const loomMuonConfig_t &cfg)
{
    const size_t n = s.rows * s.cols;
    const double mu = cfg.momentum;
    std::vector<double> u(n);
    for (size_t i = 0; i < n; i++) {
        double g = grad[i], &b = s.momentum[i];
        if (cfg.momentum_form == loomMuonLerp) {
            b = b + (1.0 - mu) * (g - b);
            u[i] = cfg.nesterov ? g + mu * (b - g) : b;
        } else {
            b = mu * b + g;
            u[i] = cfg.nesterov ? g + mu * b : b;
        }
    }
    std::vector<double> x =
        NewtonSchulz(u, s.rows, s.cols, cfg.ns_steps, cfg.ns_coeffs, (double)cfg.ns_eps);
    double r = (double)s.rows, c = (double)s.cols, scale = 1.0;
    switch (cfg.lr_scale) {
    case loomMuonScaleOriginal:
        scale = std::sqrt(std::max(1.0, r / c));
        break;
    case loomMuonScaleMatchAdamW:
        scale = 0.2 * std::sqrt(std::max(r, c));
        break;
    case loomMuonScaleSpectral:
        scale = std::sqrt(r / c);
        break;
    case loomMuonScaleNone:
        break;
    }
    const double lr = cfg.lr;
    for (size_t i = 0; i < n; i++) {
        s.param[i] *= 1.0 - lr * (double)cfg.weight_decay;
        s.param[i] -= lr * scale * x[i];
    }
}

void AdamWStep(AdamState &s, const std::vector<float> &grad, const loomMuonConfig_t &cfg)
{
    const double lr = cfg.adam_lr, b1 = cfg.adam_beta1, b2 = cfg.adam_beta2, eps = cfg.adam_eps;
    const double t = (double)cfg.step;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (size_t i = 0; i < s.param.size(); i++) {
        double g = grad[i];
        s.param[i] *= 1.0 - lr * (double)cfg.adam_weight_decay;
        s.m[i] += (1.0 - b1) * (g - s.m[i]);
        s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
        s.param[i] -= (lr / bc1) * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + eps);
    }
}

std::vector<double> SymmetricEigenvalues(std::vector<double> a, size_t n)
{
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (size_t p = 0; p < n; p++)
            for (size_t q = p + 1; q < n; q++)
                off += a[p * n + q] * a[p * n + q];
        if (off < 1e-24)
            break;
        for (size_t p = 0; p < n; p++) {
            for (size_t q = p + 1; q < n; q++) {
                double apq = a[p * n + q];
                if (std::fabs(apq) < 1e-300)
                    continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                double t =
                    (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
                double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
                // a <- J^T a J, rotating rows and columns p and q.
                for (size_t k = 0; k < n; k++) {
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (size_t k = 0; k < n; k++) {
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
        }
    }
    std::vector<double> ev(n);
    for (size_t i = 0; i < n; i++)
        ev[i] = a[i * n + i];
    std::sort(ev.begin(), ev.end());
    return ev;
}

} // namespace shardtest

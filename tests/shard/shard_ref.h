// SPDX-License-Identifier: Apache-2.0
//
// shard_ref.h - what the shard kernel tests share: seeded inputs, the relative L2 distance, and
// float64 restatements of Newton-Schulz, torch.optim.Muon's step and torch.optim.AdamW's step
// written from their definitions (docs/shard.md, "Kernels"), plus the eigenvalues of a symmetric
// matrix (cyclic Jacobi) for the singular-value window. Used by test_shard_ns.cc and
// test_shard_update.cc.
#ifndef LOOM_TESTS_SHARD_REF_H
#define LOOM_TESTS_SHARD_REF_H

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom_shard.h"

namespace shardtest {

// Uniform in [-0.5, 0.5] from a seed.
std::vector<float> Uniform(size_t n, uint64_t seed);
// Standard normal from a seed.
std::vector<float> Gaussian(size_t n, uint64_t seed);
// Row-major rows x cols -> cols x rows.
std::vector<float> Transpose(const std::vector<float> &a, size_t rows, size_t cols);

// ||got - want|| / ||want|| in float64 (||got|| when want is zero).
double RelL2(const std::vector<float> &got, const std::vector<double> &want);

// Newton-Schulz as its definition reads: the transpose when rows > cols, X = U / max(||U||, eps),
// `steps` times A = X X^T, B = b A + c A A, X = a X + B X, transposed back. coeffs: NULL for the
// default (3.4445, -4.7750, 2.0315) every step.
std::vector<double> NewtonSchulz(const std::vector<double> &u, size_t rows, size_t cols, int steps,
                                 const float *coeffs, double eps);

// One matrix under torch.optim.Muon's step (cfg's momentum form, Nesterov, lr scale, decay).
struct MuonState {
    size_t rows, cols;
    std::vector<double> param, momentum;
};
void MuonStep(MuonState &s, const std::vector<float> &grad, const loomMuonConfig_t &cfg);

// n elements under torch.optim.AdamW's step, cfg.step for the bias correction.
struct AdamState {
    std::vector<double> param, m, v;
};
void AdamWStep(AdamState &s, const std::vector<float> &grad, const loomMuonConfig_t &cfg);

// Eigenvalues of the symmetric n x n matrix a (row-major), ascending.
std::vector<double> SymmetricEigenvalues(std::vector<double> a, size_t n);

std::vector<double> ToDouble(const std::vector<float> &a);

} // namespace shardtest

#endif

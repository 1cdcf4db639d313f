// SPDX-License-Identifier: Apache-2.0
//
// test_shard_ns.cc - loomNewtonSchulz (S1 of the shard tests): against a float64 restatement of
// the iteration on wide, tall, square and degenerate shapes (rel L2 <= 1e-5), per-step
// coefficients, a tall input bitwise the transpose of its transpose's result, in place equal to
// out of place, a zero input giving zeros, repeat calls bitwise equal, and the singular values
// of a 64 x 256 Gaussian input after five steps inside [0.6, 1.25].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "loom_shard.h"
#include "shard_ref.h"

namespace {

using shardtest::Gaussian;
using shardtest::RelL2;
using shardtest::ToDouble;
using shardtest::Transpose;

struct Shape {
    size_t rows, cols;
};
const Shape kShapes[] = {{1, 1}, {1, 17}, {17, 1}, {7, 13}, {13, 7}, {97, 3}, {64, 256}, {256, 64}};

std::vector<float> RunNs(const std::vector<float> &in, size_t rows, size_t cols, int steps = 5,
                         const float *coeffs = nullptr, float eps = 1e-7f)
{
    std::vector<float> out(in.size(), -1.0f);
    std::vector<float> work(loomNewtonSchulzWorkspace(rows, cols));
    EXPECT_EQ(loomNewtonSchulz(out.data(), in.data(), rows, cols, steps, coeffs, eps, work.data()),
              loomSuccess)
        << rows << " x " << cols << ": " << loomGetLastError(nullptr);
    return out;
}

std::string Name(const Shape &s)
{
    return std::to_string(s.rows) + " x " + std::to_string(s.cols);
}

TEST(ShardNs, WorkspaceIsTwoSquaresOfTheShortSideAndTwoMatrices)
{
    EXPECT_EQ(loomNewtonSchulzWorkspace(7, 13), 2u * 7 * 7 + 2u * 7 * 13);
    EXPECT_EQ(loomNewtonSchulzWorkspace(13, 7), 2u * 7 * 7 + 2u * 7 * 13);
    EXPECT_EQ(loomNewtonSchulzWorkspace(1, 1), 4u);
    EXPECT_EQ(loomNewtonSchulzWorkspace(0, 5), 0u);
    EXPECT_EQ(loomNewtonSchulzWorkspace(5, 0), 0u);
    EXPECT_EQ(loomNewtonSchulzWorkspace((size_t)1 << 40, 2), 0u); // beyond BLAS's int
}

TEST(ShardNs, MatchesFloat64ReferenceOnEveryShape)
{
    uint64_t seed = 100;
    for (const Shape &s : kShapes) {
        std::vector<float> u = Gaussian(s.rows * s.cols, seed++);
        std::vector<float> got = RunNs(u, s.rows, s.cols);
        std::vector<double> want =
            shardtest::NewtonSchulz(ToDouble(u), s.rows, s.cols, 5, nullptr, 1e-7);
        EXPECT_LE(RelL2(got, want), 1e-5) << Name(s);
    }
}

// A norm below eps: the divisor is eps itself (torch's clamp), not the norm plus eps.
TEST(ShardNs, InputWithNormBelowEpsIsDividedByEps)
{
    const size_t rows = 7, cols = 13;
    std::vector<float> u = Gaussian(rows * cols, 5);
    double ss = 0.0;
    for (float x : u)
        ss += (double)x * x;
    for (float &x : u)
        x = (float)(x * (2e-8 / std::sqrt(ss))); // ||u|| = 2e-8, eps = 1e-7
    for (int steps : {1, 5}) {
        std::vector<float> got = RunNs(u, rows, cols, steps);
        std::vector<double> want =
            shardtest::NewtonSchulz(ToDouble(u), rows, cols, steps, nullptr, 1e-7);
        EXPECT_LE(RelL2(got, want), 1e-5) << steps << " steps";
    }
}

TEST(ShardNs, PerStepCoefficients)
{
    // Dion's first and last tuned quintic, then Keller's: a different (a, b, c) each step.
    const float coeffs[3 * 3] = {4.0848f, -6.8946f, 2.9270f,  2.8366f, -3.0525f,
                                 1.2012f, 3.4445f,  -4.7750f, 2.0315f};
    for (const Shape &s : {Shape{7, 13}, Shape{64, 256}, Shape{256, 64}}) {
        std::vector<float> u = Gaussian(s.rows * s.cols, 7);
        std::vector<float> got = RunNs(u, s.rows, s.cols, 3, coeffs);
        std::vector<double> want =
            shardtest::NewtonSchulz(ToDouble(u), s.rows, s.cols, 3, coeffs, 1e-7);
        EXPECT_LE(RelL2(got, want), 1e-5) << Name(s);
        // The default coefficients give another result: the per-step ones were used.
        std::vector<double> dflt =
            shardtest::NewtonSchulz(ToDouble(u), s.rows, s.cols, 3, nullptr, 1e-7);
        EXPECT_GT(RelL2(got, dflt), 1e-3) << Name(s);
    }
}

TEST(ShardNs, TallIsBitwiseTheTransposeOfWide)
{
    uint64_t seed = 200;
    for (const Shape &s : kShapes) {
        if (s.rows <= s.cols)
            continue;
        std::vector<float> u = Gaussian(s.rows * s.cols, seed++);
        std::vector<float> tall = RunNs(u, s.rows, s.cols);
        std::vector<float> wide = RunNs(Transpose(u, s.rows, s.cols), s.cols, s.rows);
        std::vector<float> back = Transpose(wide, s.cols, s.rows);
        EXPECT_EQ(std::memcmp(tall.data(), back.data(), tall.size() * sizeof(float)), 0) << Name(s);
    }
}

TEST(ShardNs, InPlaceEqualsOutOfPlaceAndRepeatsAreBitwiseEqual)
{
    uint64_t seed = 300;
    for (const Shape &s : kShapes) {
        std::vector<float> u = Gaussian(s.rows * s.cols, seed++);
        std::vector<float> first = RunNs(u, s.rows, s.cols);
        std::vector<float> again = RunNs(u, s.rows, s.cols);
        EXPECT_EQ(std::memcmp(first.data(), again.data(), u.size() * sizeof(float)), 0) << Name(s);
        std::vector<float> inplace = u;
        std::vector<float> work(loomNewtonSchulzWorkspace(s.rows, s.cols));
        ASSERT_EQ(loomNewtonSchulz(inplace.data(), inplace.data(), s.rows, s.cols, 5, nullptr,
                                   1e-7f, work.data()),
                  loomSuccess);
        EXPECT_EQ(std::memcmp(first.data(), inplace.data(), u.size() * sizeof(float)), 0)
            << Name(s);
    }
}

TEST(ShardNs, ZeroInputGivesZeroOutput)
{
    for (const Shape &s : kShapes) {
        std::vector<float> zero(s.rows * s.cols, 0.0f);
        std::vector<float> got = RunNs(zero, s.rows, s.cols);
        for (size_t i = 0; i < got.size(); i++)
            ASSERT_EQ(got[i], 0.0f) << Name(s) << " element " << i;
    }
}

TEST(ShardNs, SingularValuesOf64x256AfterFiveStepsLieInTheWindow)
{
    const size_t rows = 64, cols = 256;
    for (uint64_t seed : {1u, 2u, 3u}) {
        std::vector<float> x = RunNs(Gaussian(rows * cols, seed), rows, cols);
        // sigma_i^2 are the eigenvalues of X X^T, formed in float64 from the float32 result.
        std::vector<double> s(rows * rows, 0.0);
        double trace = 0.0, frob2 = 0.0;
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < rows; j++) {
                double acc = 0.0;
                for (size_t k = 0; k < cols; k++)
                    acc += (double)x[i * cols + k] * (double)x[j * cols + k];
                s[i * rows + j] = acc;
                frob2 += acc * acc;
                trace += i == j ? acc : 0.0;
            }
        std::vector<double> ev = shardtest::SymmetricEigenvalues(s, rows);
        double sum = 0.0, sum2 = 0.0;
        for (double e : ev) {
            sum += e;
            sum2 += e * e;
        }
        // The eigen-solver converged: the spectrum keeps the trace and the Frobenius norm.
        ASSERT_NEAR(sum, trace, 1e-9 * trace);
        ASSERT_NEAR(sum2, frob2, 1e-9 * frob2);
        double smin = std::sqrt(std::max(ev.front(), 0.0)), smax = std::sqrt(ev.back());
        EXPECT_GE(smin, 0.6) << "seed " << seed;
        EXPECT_LE(smax, 1.25) << "seed " << seed;
    }
}

} // namespace

/* SPDX-License-Identifier: Apache-2.0
 *
 * test_ops.cc - checks of the trainer's numeric kernels (trainer/ops.h). Every backward is
 * compared with central finite differences of its forward in double; forwards are compared with
 * naive re-implementations written here; the blocked attention must give the same answer in any
 * block order and with zigzag (ring attention) positions as in one block and as a naive dense
 * softmax; a one-layer transformer built from the kernels is gradient-checked end to end; the
 * float kernels must agree with the double ones; AdamW is checked against hand computations.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

extern "C" {
#include "ops.h"
}

namespace {

using Vec = std::vector<double>;
using FVec = std::vector<float>;
using Pos = std::vector<int32_t>;

constexpr double kInf = std::numeric_limits<double>::infinity();

Vec Random(size_t n, std::mt19937_64 &rng, double lo = -1, double hi = 1)
{
    std::uniform_real_distribution<double> u(lo, hi);
    Vec v(n);
    for (auto &x : v)
        x = u(rng);
    return v;
}

// Values exactly representable in float, so that float and double kernels see the same inputs.
Vec RandomF(size_t n, std::mt19937_64 &rng, double lo = -1, double hi = 1)
{
    Vec v = Random(n, rng, lo, hi);
    for (auto &x : v)
        x = static_cast<float>(x);
    return v;
}

FVec ToF(const Vec &v)
{
    return FVec(v.begin(), v.end());
}

Vec ToD(const FVec &v)
{
    return Vec(v.begin(), v.end());
}

double MaxAbs(const Vec &v)
{
    double m = 0;
    for (double x : v)
        m = std::max(m, std::fabs(x));
    return m;
}

// Largest difference, relative to the reference's largest magnitude: elementwise relative error
// is meaningless for entries that cancel to near zero.
double MaxRelErr(const Vec &got, const Vec &want)
{
    EXPECT_EQ(got.size(), want.size());
    double d = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        if (std::isnan(got[i]) != std::isnan(want[i]))
            return kInf;
        d = std::max(d, std::fabs(got[i] - want[i]));
    }
    return d / std::max(MaxAbs(want), 1e-300);
}

double Dot(const Vec &a, const Vec &b)
{
    double s = 0;
    for (size_t i = 0; i < a.size(); i++)
        s += a[i] * b[i];
    return s;
}

// Compares analytic derivatives ana[i] of f with central differences in x[i], for i in idx
// (all of x when idx is empty). x is restored. Each entry must agree to tol relative to itself,
// or to a hundredth of the largest probed derivative for entries near zero; the largest must
// not be zero, or the check would be vacuous.
void ExpectGradient(const char *what, Vec &x, const Vec &ana, const std::function<double()> &f,
                    std::vector<size_t> idx = {}, double tol = 1e-6)
{
    // Near the optimum for central differences in double (cube root of epsilon, times the
    // inputs' unit scale): truncation and rounding errors are both around 1e-10.
    const double h = 5e-6;
    if (idx.empty())
        for (size_t i = 0; i < x.size(); i++)
            idx.push_back(i);
    Vec num(idx.size());
    for (size_t t = 0; t < idx.size(); t++) {
        size_t i = idx[t];
        double save = x[i];
        x[i] = save + h;
        double fp = f();
        x[i] = save - h;
        double fm = f();
        x[i] = save;
        num[t] = (fp - fm) / (2 * h);
    }
    double big = MaxAbs(num);
    ASSERT_GT(big, 1e-6) << what << ": every probed derivative is zero";
    for (size_t t = 0; t < idx.size(); t++) {
        double a = ana[idx[t]];
        double allowed = tol * std::max(std::fabs(num[t]), 1e-2 * big);
        EXPECT_NEAR(a, num[t], allowed) << what << "[" << idx[t] << "]";
    }
}

std::vector<size_t> SomeIndices(size_t n, size_t count, std::mt19937_64 &rng)
{
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; i++)
        all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min(n, count));
    return all;
}

/* ---------------------------------------------------------------------------------------------
 * Linear */

Vec NaiveMatmul(const Vec &x, const Vec &w, int n, int in, int out)
{
    Vec y(static_cast<size_t>(n) * out, 0.0);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++)
            for (int c = 0; c < in; c++)
                y[i * out + o] += x[i * in + c] * w[c * out + o];
    return y;
}

TEST(TrainerOpsLinear, ForwardIsXTimesW)
{
    std::mt19937_64 rng(1);
    const int n = 5, in = 11, out = 6;
    Vec x = Random(n * in, rng), w = Random(in * out, rng);
    Vec want = NaiveMatmul(x, w, n, in, out);
    Vec y(n * out, std::nan(""));
    linear_fwd_d(y.data(), x.data(), w.data(), n, in, out, 0);
    EXPECT_LE(MaxRelErr(y, want), 1e-14);

    Vec y0 = Random(n * out, rng), y1 = y0;
    linear_fwd_d(y1.data(), x.data(), w.data(), n, in, out, 1);
    for (size_t i = 0; i < y0.size(); i++)
        want[i] += y0[i];
    EXPECT_LE(MaxRelErr(y1, want), 1e-14);
}

TEST(TrainerOpsLinear, BackwardMatchesFiniteDifferences)
{
    std::mt19937_64 rng(2);
    const int n = 4, in = 9, out = 7;
    Vec x = Random(n * in, rng), w = Random(in * out, rng), r = Random(n * out, rng);
    auto loss = [&] {
        Vec y(n * out);
        linear_fwd_d(y.data(), x.data(), w.data(), n, in, out, 0);
        return Dot(y, r);
    };
    Vec dw0 = Random(in * out, rng), dw = dw0, dx(n * in, std::nan(""));
    linear_bwd_d(dx.data(), dw.data(), r.data(), x.data(), w.data(), n, in, out);
    Vec dw_added(dw.size());
    for (size_t i = 0; i < dw.size(); i++)
        dw_added[i] = dw[i] - dw0[i];
    ExpectGradient("dx", x, dx, loss);
    ExpectGradient("dW", w, dw_added, loss);

    // Without dx only dW moves, and it accumulates again.
    Vec dw2 = dw;
    linear_bwd_d(nullptr, dw2.data(), r.data(), x.data(), w.data(), n, in, out);
    for (size_t i = 0; i < dw.size(); i++)
        EXPECT_NEAR(dw2[i], dw[i] + dw_added[i], 1e-13);
}

/* ---------------------------------------------------------------------------------------------
 * LayerNorm */

TEST(TrainerOpsLayerNorm, ForwardMatchesDefinition)
{
    std::mt19937_64 rng(3);
    const int n = 3, c = 10;
    Vec x = Random(n * c, rng, 2, 5), g = Random(c, rng), b = Random(c, rng);
    Vec y(n * c), mean(n), rstd(n);
    layernorm_fwd_d(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), n, c);
    for (int i = 0; i < n; i++) {
        double mu = 0, var = 0;
        for (int j = 0; j < c; j++)
            mu += x[i * c + j] / c;
        for (int j = 0; j < c; j++)
            var += (x[i * c + j] - mu) * (x[i * c + j] - mu) / c; // biased, as PyTorch
        EXPECT_NEAR(mean[i], mu, 1e-14);
        EXPECT_NEAR(rstd[i], 1 / std::sqrt(var + 1e-5), 1e-12);
        for (int j = 0; j < c; j++)
            EXPECT_NEAR(y[i * c + j], (x[i * c + j] - mu) / std::sqrt(var + 1e-5) * g[j] + b[j],
                        1e-12);
    }
}

TEST(TrainerOpsLayerNorm, BackwardAccumulatesAndMatchesFiniteDifferences)
{
    std::mt19937_64 rng(4);
    const int n = 4, c = 13;
    Vec x = Random(n * c, rng, -2, 3), g = Random(c, rng), b = Random(c, rng);
    Vec r = Random(n * c, rng);
    auto loss = [&] {
        Vec y(n * c), mean(n), rstd(n);
        layernorm_fwd_d(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), n, c);
        return Dot(y, r);
    };
    Vec y(n * c), mean(n), rstd(n);
    layernorm_fwd_d(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), n, c);
    Vec dx0 = Random(n * c, rng), dg0 = Random(c, rng), db0 = Random(c, rng);
    Vec dx = dx0, dg = dg0, db = db0;
    layernorm_bwd_d(dx.data(), dg.data(), db.data(), r.data(), x.data(), mean.data(), rstd.data(),
                    g.data(), n, c);
    for (size_t i = 0; i < dx.size(); i++)
        dx[i] -= dx0[i];
    for (int j = 0; j < c; j++) {
        dg[j] -= dg0[j];
        db[j] -= db0[j];
    }
    ExpectGradient("dx", x, dx, loss);
    ExpectGradient("dg", g, dg, loss);
    ExpectGradient("db", b, db, loss);
}

/* ---------------------------------------------------------------------------------------------
 * GELU */

double GeluRef(double x)
{
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(TrainerOpsGelu, ForwardIsTheTanhApproximation)
{
    Vec x = {-30, -9, -5, -2.5, -1, -0.3, -1e-9, 0, 1e-9, 0.2, 0.7, 1, 3, 6, 40};
    Vec y(x.size());
    gelu_fwd_d(y.data(), x.data(), x.size());
    for (size_t i = 0; i < x.size(); i++)
        EXPECT_NEAR(y[i], GeluRef(x[i]), 1e-15 + 1e-14 * std::fabs(GeluRef(x[i]))) << x[i];
    FVec xf = ToF(x), yf(x.size());
    gelu_fwd_f(yf.data(), xf.data(), xf.size());
    for (size_t i = 0; i < x.size(); i++)
        EXPECT_NEAR(yf[i], GeluRef(x[i]), 1e-6 * std::max(1.0, std::fabs(x[i]))) << x[i];
}

TEST(TrainerOpsGelu, BackwardMatchesFiniteDifferences)
{
    std::mt19937_64 rng(5);
    Vec x = Random(40, rng, -5, 5), r = Random(40, rng);
    x.push_back(0);
    r.push_back(0.5);
    auto loss = [&] {
        Vec y(x.size());
        gelu_fwd_d(y.data(), x.data(), x.size());
        return Dot(y, r);
    };
    Vec dx(x.size(), std::nan(""));
    gelu_bwd_d(dx.data(), r.data(), x.data(), x.size());
    ExpectGradient("dx", x, dx, loss);

    // Far tails: derivative 0 and 1, never NaN (the float exp overflows there).
    FVec xf = {-100, -20, 20, 100}, dyf = {1, 1, 1, 1}, dxf(4);
    gelu_bwd_f(dxf.data(), dyf.data(), xf.data(), 4);
    EXPECT_NEAR(dxf[0], 0, 1e-30);
    EXPECT_NEAR(dxf[1], 0, 1e-30);
    EXPECT_EQ(dxf[2], 1);
    EXPECT_EQ(dxf[3], 1);
}

/* ---------------------------------------------------------------------------------------------
 * Embedding */

TEST(TrainerOpsEmbed, ForwardAndBackward)
{
    std::mt19937_64 rng(6);
    const int vocab = 256, npos = 5, n = 7, c = 3;
    std::vector<uint8_t> tok = {3, 255, 3, 0, 200, 255, 7}; // repeats, and ids above 127
    Pos pos = {0, 1, 2, 3, 4, 0, 2};
    Vec wte = Random(vocab * c, rng), wpe = Random(npos * c, rng);
    Vec x(n * c);
    embed_fwd_d(x.data(), tok.data(), pos.data(), wte.data(), wpe.data(), n, c);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++)
            EXPECT_EQ(x[i * c + j], wte[tok[i] * c + j] + wpe[pos[i] * c + j]);

    Vec r = Random(n * c, rng);
    auto loss = [&] {
        Vec y(n * c);
        embed_fwd_d(y.data(), tok.data(), pos.data(), wte.data(), wpe.data(), n, c);
        return Dot(y, r);
    };
    Vec dwte0 = Random(vocab * c, rng), dwpe0 = Random(npos * c, rng);
    Vec dwte = dwte0, dwpe = dwpe0;
    embed_bwd_d(dwte.data(), dwpe.data(), r.data(), tok.data(), pos.data(), n, c);
    for (size_t i = 0; i < dwte.size(); i++)
        dwte[i] -= dwte0[i];
    for (size_t i = 0; i < dwpe.size(); i++)
        dwpe[i] -= dwpe0[i];
    ExpectGradient("dwte", wte, dwte, loss);
    ExpectGradient("dwpe", wpe, dwpe, loss);
}

/* ---------------------------------------------------------------------------------------------
 * Cross-entropy */

double XentRef(const Vec &logits, const std::vector<uint8_t> &t, int n, int v)
{
    double total = 0;
    for (int i = 0; i < n; i++) {
        double z = 0;
        for (int j = 0; j < v; j++)
            z += std::exp(logits[i * v + j]);
        total += -std::log(std::exp(logits[i * v + t[i]]) / z);
    }
    return total;
}

TEST(TrainerOpsXent, ValueAndGradient)
{
    std::mt19937_64 rng(7);
    const int n = 4, v = 9;
    const double scale = 0.25;
    std::vector<uint8_t> t = {0, 8, 3, 3};
    Vec logits = Random(n * v, rng, -3, 3);
    Vec g = logits;
    double got = xent_fwd_bwd_d(g.data(), t.data(), n, v, scale);
    EXPECT_NEAR(got, scale * XentRef(logits, t, n, v), 1e-13);
    auto loss = [&] {
        Vec tmp = logits;
        return xent_fwd_bwd_d(tmp.data(), t.data(), n, v, scale);
    };
    ExpectGradient("dlogits", logits, g, loss);
    for (int i = 0; i < n; i++) { // each row of the gradient sums to zero
        double s = 0;
        for (int j = 0; j < v; j++)
            s += g[i * v + j];
        EXPECT_NEAR(s, 0, 1e-15);
    }
}

TEST(TrainerOpsXent, HugeLogitsStayFinite)
{
    std::vector<uint8_t> t = {0, 1};
    Vec l = {1000, -1000, 0, 1000, -1000, 0};
    double loss = xent_fwd_bwd_d(l.data(), t.data(), 2, 3, 1.0);
    EXPECT_NEAR(loss, 2000, 1e-9); // row 0: p(target) = 1; row 1: -log p = 2000
    Vec want = {0, 0, 0, 1, -1, 0};
    for (size_t i = 0; i < l.size(); i++)
        EXPECT_NEAR(l[i], want[i], 1e-300);
    FVec lf = {1000, -1000, 0, 1000, -1000, 0};
    EXPECT_NEAR(xent_fwd_bwd_f(lf.data(), t.data(), 2, 3, 1.0), 2000, 1e-9);
    for (size_t i = 0; i < lf.size(); i++)
        EXPECT_EQ(lf[i], want[i]);
}

/* ---------------------------------------------------------------------------------------------
 * Attention */

// Dense softmax attention straight from the definition. q is [nq][nh*hd], k and v [nk][nh*hd];
// o [nq][nh*hd], lse [nq][nh] (-inf and o = 0 where a query sees nothing).
void RefAttention(const Vec &q, const Vec &k, const Vec &v, const Pos &qpos, const Pos &kpos,
                  int nh, int hd, Vec *o, Vec *lse)
{
    const int nq = static_cast<int>(qpos.size()), nk = static_cast<int>(kpos.size());
    const int c = nh * hd;
    o->assign(nq * c, 0);
    lse->assign(nq * nh, -kInf);
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++) {
            Vec s(nk, -kInf);
            double mx = -kInf;
            for (int j = 0; j < nk; j++)
                if (kpos[j] <= qpos[i]) {
                    s[j] = 0;
                    for (int d = 0; d < hd; d++)
                        s[j] += q[i * c + h * hd + d] * k[j * c + h * hd + d];
                    s[j] /= std::sqrt(static_cast<double>(hd));
                    mx = std::max(mx, s[j]);
                }
            if (mx == -kInf)
                continue;
            double z = 0;
            for (int j = 0; j < nk; j++)
                z += s[j] == -kInf ? 0 : std::exp(s[j] - mx);
            for (int j = 0; j < nk; j++) {
                if (s[j] == -kInf)
                    continue;
                double p = std::exp(s[j] - mx) / z;
                for (int d = 0; d < hd; d++)
                    (*o)[i * c + h * hd + d] += p * v[j * c + h * hd + d];
            }
            (*lse)[i * nh + h] = mx + std::log(z);
        }
}

// The textbook softmax backward on the dense probability matrix (no lse, no delta).
void RefAttentionBwd(const Vec &q, const Vec &k, const Vec &v, const Pos &qpos, const Pos &kpos,
                     int nh, int hd, const Vec &dout, Vec *dq, Vec *dk, Vec *dv)
{
    const int nq = static_cast<int>(qpos.size()), nk = static_cast<int>(kpos.size());
    const int c = nh * hd;
    const double sc = 1 / std::sqrt(static_cast<double>(hd));
    dq->assign(nq * c, 0);
    dk->assign(nk * c, 0);
    dv->assign(nk * c, 0);
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++) {
            Vec p(nk, 0), dp(nk, 0);
            double mx = -kInf, z = 0;
            for (int j = 0; j < nk; j++)
                if (kpos[j] <= qpos[i]) {
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += q[i * c + h * hd + d] * k[j * c + h * hd + d];
                    p[j] = s * sc;
                    mx = std::max(mx, p[j]);
                }
            if (mx == -kInf)
                continue;
            for (int j = 0; j < nk; j++)
                if (kpos[j] <= qpos[i]) {
                    p[j] = std::exp(p[j] - mx);
                    z += p[j];
                }
            double pdp = 0;
            for (int j = 0; j < nk; j++) {
                p[j] /= z;
                for (int d = 0; d < hd; d++)
                    dp[j] += dout[i * c + h * hd + d] * v[j * c + h * hd + d];
                pdp += p[j] * dp[j];
            }
            for (int j = 0; j < nk; j++) {
                double ds = p[j] * (dp[j] - pdp) * sc;
                for (int d = 0; d < hd; d++) {
                    (*dv)[j * c + h * hd + d] += p[j] * dout[i * c + h * hd + d];
                    (*dq)[i * c + h * hd + d] += ds * k[j * c + h * hd + d];
                    (*dk)[j * c + h * hd + d] += ds * q[i * c + h * hd + d];
                }
            }
        }
}

// Copies rows of a compact [.][c] array into columns [col, col+c) of rows with stride ld.
void Scatter(Vec *dst, int ld, int col, const Vec &src, const std::vector<int> &rows, int c)
{
    for (size_t t = 0; t < rows.size(); t++)
        for (int j = 0; j < c; j++)
            (*dst)[t * ld + col + j] = src[rows[t] * c + j];
}

Vec Gather(const Vec &src, int ld, int col, int nrows, int c)
{
    Vec out(nrows * c);
    for (int i = 0; i < nrows; i++)
        for (int j = 0; j < c; j++)
            out[i * c + j] = src[i * ld + col + j];
    return out;
}

TEST(TrainerOpsAttention, OneBlockMatchesReferenceAndFiniteDifferences)
{
    std::mt19937_64 rng(8);
    const int n = 7, nh = 2, hd = 10, c = nh * hd, ld = 3 * c; // q, k, v side by side, as qkv
    const int ldo = c + 3, lddo = c + 5;
    Pos pos(n);
    for (int i = 0; i < n; i++)
        pos[i] = i;
    Vec qkv = Random(n * ld, rng);
    Vec dout(n * lddo);
    Vec r = Random(n * c, rng);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++)
            dout[i * lddo + j] = r[i * c + j];

    auto forward = [&](Vec *o, Vec *lse) {
        Vec acc(n * ldo, 0), m(n * nh, -kInf), l(n * nh, 0);
        lse->assign(n * nh, 0);
        attn_fwd_block_d(acc.data(), m.data(), l.data(), ldo, qkv.data(), ld, pos.data(), n,
                         qkv.data() + c, ld, qkv.data() + 2 * c, ld, pos.data(), n, nh, hd);
        // In place, as the trainer does it.
        attn_fwd_finish_d(acc.data(), ldo, lse->data(), acc.data(), ldo, m.data(), l.data(), n, nh,
                          hd);
        *o = acc;
    };
    auto loss = [&] {
        Vec o, lse;
        forward(&o, &lse);
        return Dot(Gather(o, ldo, 0, n, c), r);
    };

    Vec o, lse, ro, rlse;
    forward(&o, &lse);
    RefAttention(Gather(qkv, ld, 0, n, c), Gather(qkv, ld, c, n, c), Gather(qkv, ld, 2 * c, n, c),
                 pos, pos, nh, hd, &ro, &rlse);
    EXPECT_LE(MaxRelErr(Gather(o, ldo, 0, n, c), ro), 1e-14);
    EXPECT_LE(MaxRelErr(lse, rlse), 1e-14);

    Vec delta(n * nh), dqkv(n * ld, 0);
    attn_bwd_delta_d(delta.data(), dout.data(), lddo, o.data(), ldo, n, nh, hd);
    attn_bwd_block_d(dqkv.data(), ld, dqkv.data() + c, ld, dqkv.data() + 2 * c, ld, dout.data(),
                     lddo, lse.data(), delta.data(), qkv.data(), ld, pos.data(), n, qkv.data() + c,
                     ld, qkv.data() + 2 * c, ld, pos.data(), n, nh, hd);
    ExpectGradient("dqkv", qkv, dqkv, loss);
}

// The same, fed as three blocks that take the kernels' three paths for these queries (positions
// 8 to 13): keys 14 to 17 all masked (skipped), keys 8 to 13 mixed (row by row), keys 0 to 7
// all visible (BLAS). Gradients of the masked keys must be zero.
TEST(TrainerOpsAttention, BlockwiseMatchesFiniteDifferencesOnEveryPath)
{
    std::mt19937_64 rng(15);
    const int nq = 6, nk = 18, nh = 2, hd = 5, c = nh * hd;
    Pos qpos(nq), kpos(nk);
    for (int i = 0; i < nq; i++)
        qpos[i] = 8 + i;
    for (int j = 0; j < nk; j++)
        kpos[j] = j;
    Vec q = Random(nq * c, rng, -2, 2), k = Random(nk * c, rng, -2, 2), v = Random(nk * c, rng);
    Vec r = Random(nq * c, rng);
    const int starts[3] = {14, 8, 0}, counts[3] = {4, 6, 8};
    auto forward = [&](Vec *o, Vec *lse) {
        Vec m(nq * nh, -kInf), l(nq * nh, 0);
        o->assign(nq * c, 0);
        lse->assign(nq * nh, 0);
        for (int b = 0; b < 3; b++)
            attn_fwd_block_d(o->data(), m.data(), l.data(), c, q.data(), c, qpos.data(), nq,
                             k.data() + starts[b] * c, c, v.data() + starts[b] * c, c,
                             kpos.data() + starts[b], counts[b], nh, hd);
        attn_fwd_finish_d(o->data(), c, lse->data(), o->data(), c, m.data(), l.data(), nq, nh, hd);
    };
    auto loss = [&] {
        Vec o, lse;
        forward(&o, &lse);
        return Dot(o, r);
    };
    Vec o, lse, ro, rlse;
    forward(&o, &lse);
    RefAttention(q, k, v, qpos, kpos, nh, hd, &ro, &rlse);
    EXPECT_LE(MaxRelErr(o, ro), 1e-14);
    EXPECT_LE(MaxRelErr(lse, rlse), 1e-14);

    Vec delta(nq * nh), dq(nq * c, 0), dk(nk * c, 0), dv(nk * c, 0);
    attn_bwd_delta_d(delta.data(), r.data(), c, o.data(), c, nq, nh, hd);
    for (int b = 0; b < 3; b++)
        attn_bwd_block_d(dq.data(), c, dk.data() + starts[b] * c, c, dv.data() + starts[b] * c, c,
                         r.data(), c, lse.data(), delta.data(), q.data(), c, qpos.data(), nq,
                         k.data() + starts[b] * c, c, v.data() + starts[b] * c, c,
                         kpos.data() + starts[b], counts[b], nh, hd);
    for (int j = 14 * c; j < nk * c; j++) {
        EXPECT_EQ(dk[j], 0);
        EXPECT_EQ(dv[j], 0);
    }
    ExpectGradient("dq", q, dq, loss);
    ExpectGradient("dk", k, dk, loss);
    ExpectGradient("dv", v, dv, loss);
}

// Ring attention's view: this rank holds chunks 0 and 3 of a 16-token sequence cut in 4 (the
// zigzag layout), and receives the keys and values in blocks, in an order it does not choose.
TEST(TrainerOpsAttention, ZigzagBlocksInAnyOrderMatchOneBlock)
{
    std::mt19937_64 rng(9);
    const int ntok = 16, nh = 3, hd = 6, c = nh * hd;
    Vec Q = Random(ntok * c, rng), K = Random(ntok * c, rng), V = Random(ntok * c, rng);
    Vec DO = Random(ntok * c, rng);
    Pos all(ntok);
    for (int i = 0; i < ntok; i++)
        all[i] = i;

    const std::vector<int> qrows = {0, 1, 2, 3, 12, 13, 14, 15};
    const int nq = static_cast<int>(qrows.size()), ldq = c + 2, ldo = c + 1;
    Pos qpos(qrows.begin(), qrows.end());
    Vec q(nq * ldq, std::nan("")), dout(nq * ldo, std::nan(""));
    Scatter(&q, ldq, 0, Q, qrows, c);
    Scatter(&dout, ldo, 0, DO, qrows, c);
    Vec qc(nq * c), doc(nq * c); // the same, compact, for the references
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < c; j++) {
            qc[i * c + j] = Q[qrows[i] * c + j];
            doc[i * c + j] = DO[qrows[i] * c + j];
        }

    // Blocks as a ring would deliver them: k and v side by side in one buffer per block.
    const std::vector<std::vector<int>> brows = {
        {0, 1, 2, 3, 12, 13, 14, 15}, {4, 5, 6}, {7, 8, 9, 10, 11}};
    struct Block {
        Pos pos;
        Vec kv, dkv;
    };
    std::vector<Block> blocks;
    for (const auto &rows : brows) {
        Block b;
        b.pos.assign(rows.begin(), rows.end());
        b.kv.assign(rows.size() * 2 * c, 0);
        Scatter(&b.kv, 2 * c, 0, K, rows, c);
        Scatter(&b.kv, 2 * c, c, V, rows, c);
        blocks.push_back(b);
    }

    // One block, keys in natural order, compact strides.
    Vec o1(nq * c, 0), m1(nq * nh, -kInf), l1(nq * nh, 0), lse1(nq * nh);
    attn_fwd_block_d(o1.data(), m1.data(), l1.data(), c, qc.data(), c, qpos.data(), nq, K.data(), c,
                     V.data(), c, all.data(), ntok, nh, hd);
    attn_fwd_finish_d(o1.data(), c, lse1.data(), o1.data(), c, m1.data(), l1.data(), nq, nh, hd);
    Vec delta1(nq * nh), dq1(nq * c, 0), dk1(ntok * c, 0), dv1(ntok * c, 0);
    attn_bwd_delta_d(delta1.data(), doc.data(), c, o1.data(), c, nq, nh, hd);
    attn_bwd_block_d(dq1.data(), c, dk1.data(), c, dv1.data(), c, doc.data(), c, lse1.data(),
                     delta1.data(), qc.data(), c, qpos.data(), nq, K.data(), c, V.data(), c,
                     all.data(), ntok, nh, hd);

    Vec ro, rlse, rdq, rdk, rdv;
    RefAttention(qc, K, V, qpos, all, nh, hd, &ro, &rlse);
    RefAttentionBwd(qc, K, V, qpos, all, nh, hd, doc, &rdq, &rdk, &rdv);
    EXPECT_LE(MaxRelErr(o1, ro), 1e-13);
    EXPECT_LE(MaxRelErr(lse1, rlse), 1e-13);
    EXPECT_LE(MaxRelErr(dq1, rdq), 1e-13);
    EXPECT_LE(MaxRelErr(dk1, rdk), 1e-13);
    EXPECT_LE(MaxRelErr(dv1, rdv), 1e-13);

    std::vector<int> order = {0, 1, 2};
    int orders = 0;
    do {
        SCOPED_TRACE(testing::Message() << "order " << order[0] << order[1] << order[2]);
        Vec acc(nq * ldo, std::nan("")), m(nq * nh, -kInf), l(nq * nh, 0), lse(nq * nh);
        for (int b : order) {
            const Block &B = blocks[b];
            attn_fwd_block_d(acc.data(), m.data(), l.data(), ldo, q.data(), ldq, qpos.data(), nq,
                             B.kv.data(), 2 * c, B.kv.data() + c, 2 * c, B.pos.data(),
                             static_cast<int>(B.pos.size()), nh, hd);
        }
        Vec o(nq * ldo, 0);
        attn_fwd_finish_d(o.data(), ldo, lse.data(), acc.data(), ldo, m.data(), l.data(), nq, nh,
                          hd);
        EXPECT_LE(MaxRelErr(Gather(o, ldo, 0, nq, c), o1), 1e-12);
        EXPECT_LE(MaxRelErr(lse, lse1), 1e-12);

        Vec delta(nq * nh), dq(nq * ldq, 0);
        attn_bwd_delta_d(delta.data(), dout.data(), ldo, o.data(), ldo, nq, nh, hd);
        for (auto &B : blocks)
            B.dkv.assign(B.pos.size() * 2 * c, 0);
        for (int b : order) {
            Block &B = blocks[b];
            attn_bwd_block_d(dq.data(), ldq, B.dkv.data(), 2 * c, B.dkv.data() + c, 2 * c,
                             dout.data(), ldo, lse.data(), delta.data(), q.data(), ldq, qpos.data(),
                             nq, B.kv.data(), 2 * c, B.kv.data() + c, 2 * c, B.pos.data(),
                             static_cast<int>(B.pos.size()), nh, hd);
        }
        Vec dk(ntok * c, std::nan("")), dv(ntok * c, std::nan(""));
        for (const auto &B : blocks)
            for (size_t t = 0; t < B.pos.size(); t++)
                for (int j = 0; j < c; j++) {
                    dk[B.pos[t] * c + j] = B.dkv[t * 2 * c + j];
                    dv[B.pos[t] * c + j] = B.dkv[t * 2 * c + c + j];
                }
        EXPECT_LE(MaxRelErr(Gather(dq, ldq, 0, nq, c), dq1), 1e-12);
        EXPECT_LE(MaxRelErr(dk, dk1), 1e-12);
        EXPECT_LE(MaxRelErr(dv, dv1), 1e-12);
        orders++;
    } while (std::next_permutation(order.begin(), order.end()));
    EXPECT_EQ(orders, 6);
}

// Long blocks take every path of the kernels: key tiles wholly visible to a tile of queries
// (BLAS), mixed tiles near the diagonal (row by row), wholly masked tiles (skipped); a large head
// takes fewer query rows per tile. The later keys come first, so that the earlier keys' block
// brings new maxima and the running state is rescaled.
TEST(TrainerOpsAttention, LongBlocksMatchReference)
{
    std::mt19937_64 rng(10);
    const int nk = 600;
    Pos kpos(nk), qpos;
    for (int j = 0; j < nk; j++)
        kpos[j] = j;
    for (int i = 300; i < 430; i++)
        qpos.push_back(i);
    for (int p : {0, 255, 256, 599})
        qpos.push_back(p);
    const int nq = static_cast<int>(qpos.size());
    for (auto [nh, hd] : {std::pair{2, 8}, std::pair{1, 80}}) {
        const int c = nh * hd;
        Vec K = Random(nk * c, rng, -1.5, 1.5), V = Random(nk * c, rng);
        Vec q = Random(nq * c, rng, -1.5, 1.5), dout = Random(nq * c, rng);
        Vec ro, rlse, rdq, rdk, rdv;
        RefAttention(q, K, V, qpos, kpos, nh, hd, &ro, &rlse);
        RefAttentionBwd(q, K, V, qpos, kpos, nh, hd, dout, &rdq, &rdk, &rdv);
        for (int split : {nk, 300, 17}) {
            SCOPED_TRACE(testing::Message() << "hd " << hd << " split " << split);
            Vec acc(nq * c, 0), m(nq * nh, -kInf), l(nq * nh, 0), lse(nq * nh);
            const int starts[2] = {split, 0}, counts[2] = {nk - split, split};
            for (int b = 0; b < 2; b++)
                attn_fwd_block_d(acc.data(), m.data(), l.data(), c, q.data(), c, qpos.data(), nq,
                                 K.data() + starts[b] * c, c, V.data() + starts[b] * c, c,
                                 kpos.data() + starts[b], counts[b], nh, hd);
            attn_fwd_finish_d(acc.data(), c, lse.data(), acc.data(), c, m.data(), l.data(), nq, nh,
                              hd);
            EXPECT_LE(MaxRelErr(acc, ro), 1e-13);
            EXPECT_LE(MaxRelErr(lse, rlse), 1e-13);

            Vec delta(nq * nh), dq(nq * c, 0), dk(nk * c, 0), dv(nk * c, 0);
            attn_bwd_delta_d(delta.data(), dout.data(), c, acc.data(), c, nq, nh, hd);
            for (int b = 0; b < 2; b++)
                attn_bwd_block_d(dq.data(), c, dk.data() + starts[b] * c, c,
                                 dv.data() + starts[b] * c, c, dout.data(), c, lse.data(),
                                 delta.data(), q.data(), c, qpos.data(), nq,
                                 K.data() + starts[b] * c, c, V.data() + starts[b] * c, c,
                                 kpos.data() + starts[b], counts[b], nh, hd);
            EXPECT_LE(MaxRelErr(dq, rdq), 1e-12);
            EXPECT_LE(MaxRelErr(dk, rdk), 1e-12);
            EXPECT_LE(MaxRelErr(dv, rdv), 1e-12);
        }
    }
}

TEST(TrainerOpsAttention, MaskedKeysContributeNothing)
{
    const int nh = 1, hd = 3, nk = 6;
    const double nan = std::nan("");
    // Query at position 0; every key but key 0 is in its future and holds NaN.
    Vec q = {0.3, -0.2, 0.9};
    Vec k(nk * hd, nan), v(nk * hd, nan);
    Vec k0 = {0.5, 0.1, -0.4}, v0 = {1.5, -2.0, 0.25};
    std::copy(k0.begin(), k0.end(), k.begin());
    std::copy(v0.begin(), v0.end(), v.begin());
    Pos qpos = {0}, kpos = {0, 1, 2, 3, 4, 5};

    // Garbage in acc and l: a row whose m is -inf starts empty.
    Vec acc(hd, nan), m = {-kInf}, l = {nan}, lse(1), o(hd);
    attn_fwd_block_d(acc.data(), m.data(), l.data(), hd, q.data(), hd, qpos.data(), 1, k.data(), hd,
                     v.data(), hd, kpos.data(), nk, nh, hd);
    attn_fwd_finish_d(o.data(), hd, lse.data(), acc.data(), hd, m.data(), l.data(), 1, nh, hd);
    EXPECT_EQ(o, v0); // one visible key: its value, exactly
    EXPECT_NEAR(lse[0], (0.3 * 0.5 - 0.2 * 0.1 - 0.9 * 0.4) / std::sqrt(3.0), 1e-15);

    Vec dout = {0.7, 0.1, -1.1}, delta(1), dq(hd, 0), dk(nk * hd, 0), dv(nk * hd, 0);
    attn_bwd_delta_d(delta.data(), dout.data(), hd, o.data(), hd, 1, nh, hd);
    attn_bwd_block_d(dq.data(), hd, dk.data(), hd, dv.data(), hd, dout.data(), hd, lse.data(),
                     delta.data(), q.data(), hd, qpos.data(), 1, k.data(), hd, v.data(), hd,
                     kpos.data(), nk, nh, hd);
    // The output is v0 whatever q and k0 are: no gradient reaches them.
    EXPECT_EQ(dq, Vec(hd, 0));
    EXPECT_EQ(dk, Vec(nk * hd, 0));
    for (int j = 0; j < nk; j++)
        for (int d = 0; d < hd; d++)
            EXPECT_EQ(dv[j * hd + d], j == 0 ? dout[d] : 0.0);

    // A block entirely in the future leaves the state alone; a row that never saw a key
    // finishes as o = 0, lse = -inf, and its backward adds nothing.
    Vec acc2(hd, 0), m2 = {-kInf}, l2 = {0};
    attn_fwd_block_d(acc2.data(), m2.data(), l2.data(), hd, q.data(), hd, qpos.data(), 1,
                     k.data() + hd, hd, v.data() + hd, hd, kpos.data() + 1, nk - 1, nh, hd);
    EXPECT_EQ(m2[0], -kInf);
    EXPECT_EQ(l2[0], 0);
    Vec o2(hd, nan), lse2(1, 0);
    attn_fwd_finish_d(o2.data(), hd, lse2.data(), acc2.data(), hd, m2.data(), l2.data(), 1, nh, hd);
    EXPECT_EQ(o2, Vec(hd, 0));
    EXPECT_EQ(lse2[0], -kInf);
    Vec dq2(hd, 7), dk2(nk * hd, 0), dv2(nk * hd, 0), delta2 = {0};
    std::mt19937_64 rng(11);
    Vec k2 = Random(nk * hd, rng), v2 = Random(nk * hd, rng);
    attn_bwd_block_d(dq2.data(), hd, dk2.data(), hd, dv2.data(), hd, dout.data(), hd, lse2.data(),
                     delta2.data(), q.data(), hd, qpos.data(), 1, k2.data(), hd, v2.data(), hd,
                     kpos.data(), nk, nh, hd);
    EXPECT_EQ(dq2, Vec(hd, 7));
    EXPECT_EQ(dk2, Vec(nk * hd, 0));
    EXPECT_EQ(dv2, Vec(nk * hd, 0));
}

/* ---------------------------------------------------------------------------------------------
 * A one-layer GPT built from the kernels, checked end to end. */

// Zeroed gradients shaped like params, in *grads.
std::vector<Vec> &ZeroGrads(std::vector<Vec> *grads, const std::vector<Vec *> &params)
{
    grads->clear();
    for (Vec *p : params)
        grads->emplace_back(p->size(), 0.0);
    return *grads;
}

struct TinyGpt {
    static constexpr int V = 13, T = 6, C = 8, NH = 2, HD = 4, F = 4 * C;
    std::vector<uint8_t> tok, tgt;
    Pos pos;
    // Parameters, in a fixed order (Params()).
    Vec wte, wpe, ln1g, ln1b, wqkv, wo, ln2g, ln2b, wfc, wproj, lnfg, lnfb;

    explicit TinyGpt(std::mt19937_64 &rng)
    {
        std::uniform_int_distribution<int> tk(0, V - 1);
        for (int i = 0; i < T; i++) {
            tok.push_back(static_cast<uint8_t>(tk(rng)));
            tgt.push_back(static_cast<uint8_t>(tk(rng)));
            pos.push_back(i);
        }
        wte = Random(V * C, rng);
        wpe = Random(T * C, rng);
        ln1g = Random(C, rng, 0.5, 1.5);
        ln1b = Random(C, rng, -0.2, 0.2);
        wqkv = Random(C * 3 * C, rng, -0.7, 0.7);
        wo = Random(C * C, rng, -0.5, 0.5);
        ln2g = Random(C, rng, 0.5, 1.5);
        ln2b = Random(C, rng, -0.2, 0.2);
        wfc = Random(C * F, rng, -0.5, 0.5);
        wproj = Random(F * C, rng, -0.3, 0.3);
        lnfg = Random(C, rng, 0.5, 1.5);
        lnfb = Random(C, rng, -0.2, 0.2);
    }
    std::vector<Vec *> Params()
    {
        return {&wte, &wpe, &ln1g, &ln1b, &wqkv, &wo, &ln2g, &ln2b, &wfc, &wproj, &lnfg, &lnfb};
    }

    // Returns the mean loss; with grads (same order as Params(), zeroed here) also the gradient.
    double Run(std::vector<Vec> *grads)
    {
        const int n = T;
        // forward
        Vec x0(n * C), h1(n * C), mean1(n), rstd1(n);
        embed_fwd_d(x0.data(), tok.data(), pos.data(), wte.data(), wpe.data(), n, C);
        layernorm_fwd_d(h1.data(), mean1.data(), rstd1.data(), x0.data(), ln1g.data(), ln1b.data(),
                        n, C);
        Vec qkv(n * 3 * C);
        linear_fwd_d(qkv.data(), h1.data(), wqkv.data(), n, C, 3 * C, 0);
        Vec att(n * C, 0), m(n * NH, -kInf), l(n * NH, 0), lse(n * NH);
        attn_fwd_block_d(att.data(), m.data(), l.data(), C, qkv.data(), 3 * C, pos.data(), n,
                         qkv.data() + C, 3 * C, qkv.data() + 2 * C, 3 * C, pos.data(), n, NH, HD);
        attn_fwd_finish_d(att.data(), C, lse.data(), att.data(), C, m.data(), l.data(), n, NH, HD);
        Vec x1 = x0;
        linear_fwd_d(x1.data(), att.data(), wo.data(), n, C, C, 1);
        Vec h2(n * C), mean2(n), rstd2(n);
        layernorm_fwd_d(h2.data(), mean2.data(), rstd2.data(), x1.data(), ln2g.data(), ln2b.data(),
                        n, C);
        Vec fc(n * F), ge(n * F);
        linear_fwd_d(fc.data(), h2.data(), wfc.data(), n, C, F, 0);
        gelu_fwd_d(ge.data(), fc.data(), fc.size());
        Vec x2 = x1;
        linear_fwd_d(x2.data(), ge.data(), wproj.data(), n, F, C, 1);
        Vec h3(n * C), mean3(n), rstd3(n);
        layernorm_fwd_d(h3.data(), mean3.data(), rstd3.data(), x2.data(), lnfg.data(), lnfb.data(),
                        n, C);
        // Tied head: logits = h3 wte^T; linear_fwd wants [in][out], so a transposed copy.
        Vec wteT(C * V);
        for (int t = 0; t < V; t++)
            for (int j = 0; j < C; j++)
                wteT[j * V + t] = wte[t * C + j];
        Vec logits(n * V);
        linear_fwd_d(logits.data(), h3.data(), wteT.data(), n, C, V, 0);
        double loss = xent_fwd_bwd_d(logits.data(), tgt.data(), n, V, 1.0 / n);
        if (!grads)
            return loss;

        // backward
        auto &g = ZeroGrads(grads, Params());
        Vec &dwte = g[0], &dwpe = g[1], &dln1g = g[2], &dln1b = g[3], &dwqkv = g[4], &dwo = g[5];
        Vec &dln2g = g[6], &dln2b = g[7], &dwfc = g[8], &dwproj = g[9], &dlnfg = g[10];
        Vec &dlnfb = g[11];
        Vec dh3(n * C), dwteT(C * V, 0);
        linear_bwd_d(dh3.data(), dwteT.data(), logits.data(), h3.data(), wteT.data(), n, C, V);
        for (int t = 0; t < V; t++)
            for (int j = 0; j < C; j++)
                dwte[t * C + j] += dwteT[j * V + t];
        Vec dx2(n * C, 0);
        layernorm_bwd_d(dx2.data(), dlnfg.data(), dlnfb.data(), dh3.data(), x2.data(), mean3.data(),
                        rstd3.data(), lnfg.data(), n, C);
        Vec dx1 = dx2, dge(n * F), dfc(n * F), dh2(n * C);
        linear_bwd_d(dge.data(), dwproj.data(), dx2.data(), ge.data(), wproj.data(), n, F, C);
        gelu_bwd_d(dfc.data(), dge.data(), fc.data(), dfc.size());
        linear_bwd_d(dh2.data(), dwfc.data(), dfc.data(), h2.data(), wfc.data(), n, C, F);
        layernorm_bwd_d(dx1.data(), dln2g.data(), dln2b.data(), dh2.data(), x1.data(), mean2.data(),
                        rstd2.data(), ln2g.data(), n, C);
        Vec dx0 = dx1, datt(n * C);
        linear_bwd_d(datt.data(), dwo.data(), dx1.data(), att.data(), wo.data(), n, C, C);
        Vec delta(n * NH), dqkv(n * 3 * C, 0);
        attn_bwd_delta_d(delta.data(), datt.data(), C, att.data(), C, n, NH, HD);
        attn_bwd_block_d(dqkv.data(), 3 * C, dqkv.data() + C, 3 * C, dqkv.data() + 2 * C, 3 * C,
                         datt.data(), C, lse.data(), delta.data(), qkv.data(), 3 * C, pos.data(), n,
                         qkv.data() + C, 3 * C, qkv.data() + 2 * C, 3 * C, pos.data(), n, NH, HD);
        Vec dh1(n * C);
        linear_bwd_d(dh1.data(), dwqkv.data(), dqkv.data(), h1.data(), wqkv.data(), n, C, 3 * C);
        layernorm_bwd_d(dx0.data(), dln1g.data(), dln1b.data(), dh1.data(), x0.data(), mean1.data(),
                        rstd1.data(), ln1g.data(), n, C);
        embed_bwd_d(dwte.data(), dwpe.data(), dx0.data(), tok.data(), pos.data(), n, C);
        return loss;
    }
};

// Gradient-checks every parameter of a model composed of the kernels (Params(), Run(grads)) at
// the indices pick(p) gives for parameter p; returns the loss.
template <class Model>
double CheckComposed(Model &model, const std::vector<const char *> &names,
                     const std::function<std::vector<size_t>(size_t)> &pick)
{
    std::vector<Vec> grads;
    double loss = model.Run(&grads);
    EXPECT_TRUE(std::isfinite(loss));
    auto params = model.Params();
    for (size_t p = 0; p < params.size(); p++)
        ExpectGradient(
            names[p], *params[p], grads[p], [&] { return model.Run(nullptr); }, pick(p), 1e-5);
    return loss;
}

TEST(TrainerOpsComposed, OneLayerTransformerGradientCheck)
{
    std::mt19937_64 rng(12);
    TinyGpt gpt(rng);
    auto params = gpt.Params();
    double loss = CheckComposed(gpt,
                                {"wte", "wpe", "ln1g", "ln1b", "wqkv", "wo", "ln2g", "ln2b", "wfc",
                                 "wproj", "lnfg", "lnfb"},
                                [&](size_t p) {
                                    std::vector<size_t> idx =
                                        SomeIndices(params[p]->size(), 6, rng);
                                    // wte's rows of the batch's tokens: reached both by the
                                    // embedding and by the head.
                                    if (p == 0)
                                        for (int j = 0; j < 3; j++)
                                            idx.push_back(gpt.tok[j] * TinyGpt::C + j);
                                    return idx;
                                });
    EXPECT_GT(loss, 0);
}

/* ---------------------------------------------------------------------------------------------
 * The mixture-of-experts layer (trainer/moe.c) built from the kernels: router, top-k,
 * renormalised weights, the load-balancing loss, one GELU MLP per expert, checked end to end. */

TEST(TrainerOpsRouter, TopKRenormalisedAndTiesToTheLowerId)
{
    // Row 0: probabilities ordered 2 > 0 > 1 = 3; row 1: all equal, so ids 0 and 1 win.
    const int n = 2, e = 4, k = 2;
    Vec logits = {1.0, 0.5, 2.0, 0.5, 0.3, 0.3, 0.3, 0.3};
    Vec probs(n * e), w(n * k);
    std::vector<int32_t> idx(n * k);
    router_fwd_d(probs.data(), idx.data(), w.data(), logits.data(), n, e, k);
    double z = std::exp(1.0) + 2 * std::exp(0.5) + std::exp(2.0);
    EXPECT_NEAR(probs[2], std::exp(2.0) / z, 1e-15);
    EXPECT_EQ(idx, (std::vector<int32_t>{2, 0, 0, 1}));
    EXPECT_NEAR(w[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-15);
    EXPECT_NEAR(w[0] + w[1], 1.0, 1e-15);
    EXPECT_EQ(w[2], 0.5);
    EXPECT_EQ(w[3], 0.5);
    // The load-balancing loss: coef exactly when routing and probabilities are uniform (row 1
    // alone selects experts 0 and 1 only, so use two rows that cover all four).
    Vec uni(2 * e, 0.25), dprob(e);
    std::vector<int32_t> cover = {0, 1, 2, 3};
    EXPECT_NEAR(moe_aux_d(dprob.data(), uni.data(), cover.data(), 2, e, k, 0.01, 1.0), 0.01, 1e-15);
    EXPECT_NEAR(dprob[0], 0.01 * e * 0.25 / 2, 1e-15);
    // All on expert 0 and 1 with their probabilities: E * (f . P) = 4 * (0.5 * 0.5 * 2) = 2.
    Vec skew = {0.5, 0.5, 0, 0, 0.5, 0.5, 0, 0};
    std::vector<int32_t> two = {0, 1, 1, 0};
    EXPECT_NEAR(moe_aux_d(dprob.data(), skew.data(), two.data(), 2, e, k, 1.0, 3.0), 6.0, 1e-14);
    EXPECT_EQ(dprob[2], 0.0);
}

struct TinyMoe {
    static constexpr int N = 5, C = 6, E = 4, K = 2, F = 4 * C;
    static constexpr double kCoef = 0.3, kScale = 0.7;
    Vec x, wr, wup, wdown, r; // r: the fixed projection the loss takes of the output

    explicit TinyMoe(std::mt19937_64 &rng)
    {
        x = Random(N * C, rng);
        wr = Random(C * E, rng, -1.5, 1.5);
        wup = Random(E * C * F, rng, -0.5, 0.5);
        wdown = Random(E * F * C, rng, -0.3, 0.3);
        r = Random(N * C, rng);
    }
    std::vector<Vec *> Params()
    {
        return {&x, &wr, &wup, &wdown};
    }

    // loss = <y, r> + scale * aux; with grads (in Params() order) also the gradient.
    double Run(std::vector<Vec> *grads)
    {
        Vec logits(N * E), probs(N * E), w(N * K), auxg(E);
        std::vector<int32_t> idx(N * K);
        linear_fwd_d(logits.data(), x.data(), wr.data(), N, C, E, 0);
        router_fwd_d(probs.data(), idx.data(), w.data(), logits.data(), N, E, K);
        double loss = moe_aux_d(auxg.data(), probs.data(), idx.data(), N, E, K, kCoef, kScale);
        // One slot per (token, selection), as the dispatch lays them out.
        Vec up(N * K * F), ge(N * K * F), out(N * K * C);
        for (int s = 0; s < N * K; s++) {
            int t = s / K, ex = idx[s];
            linear_fwd_d(&up[s * F], &x[t * C], &wup[ex * C * F], 1, C, F, 0);
            gelu_fwd_d(&ge[s * F], &up[s * F], F);
            linear_fwd_d(&out[s * C], &ge[s * F], &wdown[ex * F * C], 1, F, C, 0);
            for (int c = 0; c < C; c++)
                loss += w[s] * out[s * C + c] * r[t * C + c];
        }
        if (!grads)
            return loss;
        auto &g = ZeroGrads(grads, Params());
        // Combine's backward: the weights' gradients and each slot's output gradient.
        Vec dw(N * K), dout(C), dge(F), dup(F), dxs(C);
        for (int s = 0; s < N * K; s++) {
            int t = s / K, ex = idx[s];
            for (int c = 0; c < C; c++) {
                dw[s] += r[t * C + c] * out[s * C + c];
                dout[c] = w[s] * r[t * C + c];
            }
            linear_bwd_d(dge.data(), &g[3][ex * F * C], dout.data(), &ge[s * F], &wdown[ex * F * C],
                         1, F, C);
            gelu_bwd_d(dup.data(), dge.data(), &up[s * F], F);
            linear_bwd_d(dxs.data(), &g[2][ex * C * F], dup.data(), &x[t * C], &wup[ex * C * F], 1,
                         C, F);
            for (int c = 0; c < C; c++)
                g[0][t * C + c] += dxs[c];
        }
        Vec dlogits(N * E), dxr(N * C);
        router_bwd_d(dlogits.data(), dw.data(), probs.data(), idx.data(), w.data(), auxg.data(), N,
                     E, K);
        linear_bwd_d(dxr.data(), g[1].data(), dlogits.data(), x.data(), wr.data(), N, C, E);
        for (size_t i = 0; i < dxr.size(); i++)
            g[0][i] += dxr[i];
        return loss;
    }
};

TEST(TrainerOpsComposed, MixtureOfExpertsGradientCheck)
{
    std::mt19937_64 rng(21);
    TinyMoe moe(rng);
    auto params = moe.Params();
    // The input and the router everywhere; the experts' weights at random places (an expert's
    // weights that no token reaches have a zero gradient, which is checked too).
    CheckComposed(moe, {"x", "wr", "wup", "wdown"}, [&](size_t p) {
        return p < 2 ? std::vector<size_t>{} : SomeIndices(params[p]->size(), 40, rng);
    });
}

/* ---------------------------------------------------------------------------------------------
 * float against double */

TEST(TrainerOpsFloat, AgreesWithDouble)
{
    std::mt19937_64 rng(13);
    const double tol = 1e-5;
    { // linear
        const int n = 9, in = 64, out = 24;
        Vec x = RandomF(n * in, rng), w = RandomF(in * out, rng), dy = RandomF(n * out, rng);
        Vec yd(n * out), dxd(n * in), dwd(in * out, 0);
        FVec xf = ToF(x), wf = ToF(w), dyf = ToF(dy), yf(n * out), dxf(n * in), dwf(in * out, 0);
        linear_fwd_d(yd.data(), x.data(), w.data(), n, in, out, 0);
        linear_fwd_f(yf.data(), xf.data(), wf.data(), n, in, out, 0);
        linear_bwd_d(dxd.data(), dwd.data(), dy.data(), x.data(), w.data(), n, in, out);
        linear_bwd_f(dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), n, in, out);
        EXPECT_LE(MaxRelErr(ToD(yf), yd), tol);
        EXPECT_LE(MaxRelErr(ToD(dxf), dxd), tol);
        EXPECT_LE(MaxRelErr(ToD(dwf), dwd), tol);
    }
    { // layernorm
        const int n = 5, c = 96;
        Vec x = RandomF(n * c, rng, -3, 4), g = RandomF(c, rng), b = RandomF(c, rng);
        Vec dy = RandomF(n * c, rng);
        Vec yd(n * c), md(n), rd(n), dxd(n * c, 0), dgd(c, 0), dbd(c, 0);
        FVec yf(n * c), mf(n), rf(n), dxf(n * c, 0), dgf(c, 0), dbf(c, 0);
        FVec xf = ToF(x), gf = ToF(g), bf = ToF(b), dyf = ToF(dy);
        layernorm_fwd_d(yd.data(), md.data(), rd.data(), x.data(), g.data(), b.data(), n, c);
        layernorm_fwd_f(yf.data(), mf.data(), rf.data(), xf.data(), gf.data(), bf.data(), n, c);
        layernorm_bwd_d(dxd.data(), dgd.data(), dbd.data(), dy.data(), x.data(), md.data(),
                        rd.data(), g.data(), n, c);
        layernorm_bwd_f(dxf.data(), dgf.data(), dbf.data(), dyf.data(), xf.data(), mf.data(),
                        rf.data(), gf.data(), n, c);
        EXPECT_LE(MaxRelErr(ToD(yf), yd), tol);
        EXPECT_LE(MaxRelErr(ToD(rf), rd), tol);
        EXPECT_LE(MaxRelErr(ToD(dxf), dxd), tol);
        EXPECT_LE(MaxRelErr(ToD(dgf), dgd), tol);
        EXPECT_LE(MaxRelErr(ToD(dbf), dbd), tol);
    }
    { // gelu
        const size_t n = 1000;
        Vec x = RandomF(n, rng, -8, 8), dy = RandomF(n, rng);
        Vec yd(n), dxd(n);
        FVec xf = ToF(x), dyf = ToF(dy), yf(n), dxf(n);
        gelu_fwd_d(yd.data(), x.data(), n);
        gelu_fwd_f(yf.data(), xf.data(), n);
        gelu_bwd_d(dxd.data(), dy.data(), x.data(), n);
        gelu_bwd_f(dxf.data(), dyf.data(), xf.data(), n);
        EXPECT_LE(MaxRelErr(ToD(yf), yd), tol);
        EXPECT_LE(MaxRelErr(ToD(dxf), dxd), tol);
    }
    { // cross-entropy
        const int n = 6, v = 256;
        Vec lg = RandomF(n * v, rng, -8, 8);
        std::vector<uint8_t> t = {0, 255, 17, 17, 128, 3};
        FVec lf = ToF(lg);
        double ld = xent_fwd_bwd_d(lg.data(), t.data(), n, v, 1.0 / n);
        double lfl = xent_fwd_bwd_f(lf.data(), t.data(), n, v, 1.0 / n);
        EXPECT_NEAR(lfl, ld, tol * std::fabs(ld));
        EXPECT_LE(MaxRelErr(ToD(lf), lg), tol);
    }
    // attention: two blocks in reverse order; the queries' positions leave key tiles wholly
    // visible (BLAS), mixed and masked
    for (auto [nq, nh, hd] : {std::tuple{40, 2, 16}, std::tuple{70, 1, 80}}) {
        SCOPED_TRACE(testing::Message() << "attention hd " << hd);
        const int nk = 700, c = nh * hd;
        Vec q = RandomF(nq * c, rng, -2, 2), K = RandomF(nk * c, rng, -2, 2);
        Vec V = RandomF(nk * c, rng), dout = RandomF(nq * c, rng);
        Pos qpos(nq), kpos(nk);
        for (int i = 0; i < nq; i++)
            qpos[i] = 250 + i * 6;
        for (int j = 0; j < nk; j++)
            kpos[j] = j;
        const int split = 400;
        const int starts[2] = {split, 0}, counts[2] = {nk - split, split};
        FVec qf = ToF(q), Kf = ToF(K), Vf = ToF(V), dof = ToF(dout);

        Vec accd(nq * c, 0), md(nq * nh, -kInf), ldd(nq * nh, 0), lsed(nq * nh);
        FVec accf(nq * c, 0), mf(nq * nh, -INFINITY), lf(nq * nh, 0), lsef(nq * nh);
        for (int b = 0; b < 2; b++) {
            const int j0 = starts[b], cnt = counts[b];
            attn_fwd_block_d(accd.data(), md.data(), ldd.data(), c, q.data(), c, qpos.data(), nq,
                             K.data() + j0 * c, c, V.data() + j0 * c, c, kpos.data() + j0, cnt, nh,
                             hd);
            attn_fwd_block_f(accf.data(), mf.data(), lf.data(), c, qf.data(), c, qpos.data(), nq,
                             Kf.data() + j0 * c, c, Vf.data() + j0 * c, c, kpos.data() + j0, cnt,
                             nh, hd);
        }
        attn_fwd_finish_d(accd.data(), c, lsed.data(), accd.data(), c, md.data(), ldd.data(), nq,
                          nh, hd);
        attn_fwd_finish_f(accf.data(), c, lsef.data(), accf.data(), c, mf.data(), lf.data(), nq, nh,
                          hd);
        EXPECT_LE(MaxRelErr(ToD(accf), accd), tol);
        EXPECT_LE(MaxRelErr(ToD(lsef), lsed), tol);

        Vec deltad(nq * nh), dqd(nq * c, 0), dkd(nk * c, 0), dvd(nk * c, 0);
        FVec deltaf(nq * nh), dqf(nq * c, 0), dkf(nk * c, 0), dvf(nk * c, 0);
        attn_bwd_delta_d(deltad.data(), dout.data(), c, accd.data(), c, nq, nh, hd);
        attn_bwd_delta_f(deltaf.data(), dof.data(), c, accf.data(), c, nq, nh, hd);
        attn_bwd_block_d(dqd.data(), c, dkd.data(), c, dvd.data(), c, dout.data(), c, lsed.data(),
                         deltad.data(), q.data(), c, qpos.data(), nq, K.data(), c, V.data(), c,
                         kpos.data(), nk, nh, hd);
        attn_bwd_block_f(dqf.data(), c, dkf.data(), c, dvf.data(), c, dof.data(), c, lsef.data(),
                         deltaf.data(), qf.data(), c, qpos.data(), nq, Kf.data(), c, Vf.data(), c,
                         kpos.data(), nk, nh, hd);
        EXPECT_LE(MaxRelErr(ToD(dqf), dqd), tol);
        EXPECT_LE(MaxRelErr(ToD(dkf), dkd), tol);
        EXPECT_LE(MaxRelErr(ToD(dvf), dvd), tol);
    }
    { // adamw
        const size_t n = 100;
        Vec p = RandomF(n, rng), m(n, 0), v(n, 0);
        FVec pf = ToF(p), mf(n, 0), vf(n, 0);
        for (int64_t step = 1; step <= 3; step++) {
            Vec g = RandomF(n, rng);
            FVec gf = ToF(g);
            adamw_d(p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step,
                    0.5);
            adamw_f(pf.data(), gf.data(), mf.data(), vf.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step,
                    0.5);
        }
        EXPECT_LE(MaxRelErr(ToD(pf), p), tol);
        EXPECT_LE(MaxRelErr(ToD(mf), m), tol);
        EXPECT_LE(MaxRelErr(ToD(vf), v), tol);
    }
}

/* ---------------------------------------------------------------------------------------------
 * AdamW */

// With a constant gradient the bias-corrected moments are exactly g and g^2, so each step is
// p <- p (1 - lr wd) - lr g / (|g| + eps): a closed form that fails if the bias correction,
// the order of the decay or the gradient scale is wrong.
TEST(TrainerOpsAdamW, ConstantGradientClosedForm)
{
    const double lr = 0.1, wd = 0.1, eps = 1e-8, gscale = 0.5;
    Vec p = {1.0, -2.0}, g = {0.5, -3.0}, m = {0, 0}, v = {0, 0};
    Vec want = p;
    for (int64_t step = 1; step <= 3; step++) {
        adamw_d(p.data(), g.data(), m.data(), v.data(), 2, lr, 0.9, 0.999, eps, wd, step, gscale);
        for (int i = 0; i < 2; i++) {
            double gg = g[i] * gscale;
            want[i] = want[i] * (1 - lr * wd) - lr * gg / (std::fabs(gg) + eps);
            EXPECT_NEAR(p[i], want[i], 1e-14) << "step " << step;
        }
    }
    // Step 1 by hand: 1 * 0.99 - 0.1 * 0.25 / (0.25 + 1e-8).
    Vec p1 = {1.0}, g1 = {0.5}, m1 = {0}, v1 = {0};
    adamw_d(p1.data(), g1.data(), m1.data(), v1.data(), 1, lr, 0.9, 0.999, eps, wd, 1, gscale);
    EXPECT_NEAR(p1[0], 0.890000004, 1e-15);
    EXPECT_NEAR(m1[0], 0.025, 1e-16);
    EXPECT_NEAR(v1[0], 0.001 * 0.0625, 1e-18);
}

// Three steps with changing gradients against PyTorch's formulation of the step
// (step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps).
TEST(TrainerOpsAdamW, ThreeStepsMatchPyTorchFormulation)
{
    const double lr = 3e-3, b1 = 0.8, b2 = 0.9, eps = 1e-6, wd = 0.5, gscale = 0.7;
    std::mt19937_64 rng(14);
    const size_t n = 7;
    Vec p = Random(n, rng), m(n, 0), v(n, 0);
    Vec wp = p, wm = m, wv = v;
    for (int64_t step = 1; step <= 3; step++) {
        Vec g = Random(n, rng, -2, 2);
        adamw_d(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step, gscale);
        const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        for (size_t i = 0; i < n; i++) {
            double gg = g[i] * gscale;
            wp[i] *= 1 - lr * wd;
            wm[i] = wm[i] * b1 + gg * (1 - b1);
            wv[i] = wv[i] * b2 + gg * gg * (1 - b2);
            double denom = std::sqrt(wv[i]) / std::sqrt(bc2) + eps;
            wp[i] += -(lr / bc1) * wm[i] / denom;
        }
        EXPECT_LE(MaxRelErr(p, wp), 1e-14) << "step " << step;
        EXPECT_LE(MaxRelErr(m, wm), 1e-14) << "step " << step;
        EXPECT_LE(MaxRelErr(v, wv), 1e-14) << "step " << step;
    }
}

} // namespace

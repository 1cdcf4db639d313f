// SPDX-License-Identifier: Apache-2.0
//
// test_shard_update.cc - loomMuonUpdate and loomAdamWUpdate (S2 of the shard tests): ten steps
// against float64 restatements of torch.optim.Muon and torch.optim.AdamW for every lr scale,
// both momentum forms, Nesterov on and off, with and without weight decay (rel L2 <= 1e-5 on the
// parameters' change and on the state); and the element-wise pieces (momentum, decay and step,
// AdamW) run in two parts split at an odd offset give the bits of one run over the whole.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "loom_shard.h"
#include "shard_kernels.h"
#include "shard_ref.h"

namespace {

using shardtest::RelL2;
using shardtest::ToDouble;
using shardtest::Uniform;

constexpr int kSteps = 10;

// ||(got - start) - (want - start)|| / ||want - start||: the change the steps made, which a
// comparison of the parameters themselves would hide under their starting values.
double RelChange(const std::vector<float> &got, const std::vector<double> &want,
                 const std::vector<float> &start)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        double dwant = want[i] - (double)start[i];
        double d = ((double)got[i] - (double)start[i]) - dwant;
        num += d * d;
        den += dwant * dwant;
    }
    return std::sqrt(num / den);
}

// Starting parameters in [-0.05, 0.05]: ten steps then move them by about their own size, so
// that the float32 spacing of the parameters, which no kernel can beat, stays far below 1e-5 of
// the change.
std::vector<float> Small(size_t n, uint64_t seed)
{
    std::vector<float> v = Uniform(n, seed);
    for (float &x : v)
        x *= 0.1f;
    return v;
}

std::string Describe(const loomMuonConfig_t &c, size_t rows, size_t cols)
{
    static const char *scales[] = {"Original", "MatchAdamW", "Spectral", "None"};
    return std::to_string(rows) + " x " + std::to_string(cols) + " " + scales[c.lr_scale] +
           (c.momentum_form == loomMuonLerp ? " Lerp" : " Accumulate") +
           (c.nesterov ? " nesterov" : "") + " wd " + std::to_string(c.weight_decay);
}

TEST(ShardUpdate, MuonTenStepsMatchFloat64Reference)
{
    struct Shape {
        size_t rows, cols;
    };
    const Shape shapes[] = {{24, 40}, {40, 24}, {1, 9}};
    uint64_t seed = 1000;
    for (int scale = loomMuonScaleOriginal; scale <= loomMuonScaleNone; scale++)
        for (int form = loomMuonLerp; form <= loomMuonAccumulate; form++)
            for (int nesterov = 0; nesterov <= 1; nesterov++)
                for (const Shape &sh : shapes) {
                    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
                    cfg.lr_scale = (loomMuonLrScale_t)scale;
                    cfg.momentum_form = (loomMuonMomentum_t)form;
                    cfg.nesterov = nesterov;
                    cfg.momentum = form == loomMuonLerp ? 0.95f : 0.9f;
                    cfg.weight_decay = (scale + nesterov) % 2 ? 0.1f : 0.0f;
                    const size_t n = sh.rows * sh.cols;
                    std::vector<float> param = Small(n, seed++), mom(n, 0.0f);
                    const std::vector<float> start = param;
                    shardtest::MuonState ref{sh.rows, sh.cols, ToDouble(param),
                                             std::vector<double>(n, 0.0)};
                    std::vector<float> work(n + loomNewtonSchulzWorkspace(sh.rows, sh.cols));
                    for (int t = 1; t <= kSteps; t++) {
                        cfg.step = t;
                        std::vector<float> grad = Uniform(n, seed++);
                        ASSERT_EQ(loomMuonUpdate(param.data(), grad.data(), mom.data(), sh.rows,
                                                 sh.cols, &cfg, work.data()),
                                  loomSuccess)
                            << loomGetLastError(nullptr);
                        shardtest::MuonStep(ref, grad, cfg);
                    }
                    EXPECT_LE(RelChange(param, ref.param, start), 1e-5)
                        << Describe(cfg, sh.rows, sh.cols);
                    EXPECT_LE(RelL2(mom, ref.momentum), 1e-5) << Describe(cfg, sh.rows, sh.cols);
                }
}

TEST(ShardUpdate, AdamWTenStepsMatchFloat64Reference)
{
    const size_t n = 1031;
    uint64_t seed = 2000;
    for (float wd : {0.0f, 0.1f}) {
        for (float beta2 : {0.95f, 0.999f}) {
            loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
            // lr 1e-2: the float32 rounding of the factor 1 - lr*wd (3e-8) stays far below 1e-5
            // of one step's change.
            cfg.adam_lr = 1e-2f;
            cfg.adam_weight_decay = wd;
            cfg.adam_beta2 = beta2;
            std::vector<float> param = Small(n, seed++), m(n, 0.0f), v(n, 0.0f);
            const std::vector<float> start = param;
            shardtest::AdamState ref{ToDouble(param), std::vector<double>(n, 0.0),
                                     std::vector<double>(n, 0.0)};
            for (int t = 1; t <= kSteps; t++) {
                cfg.step = t;
                std::vector<float> grad = Uniform(n, seed++);
                ASSERT_EQ(loomAdamWUpdate(param.data(), grad.data(), m.data(), v.data(), n, &cfg),
                          loomSuccess)
                    << loomGetLastError(nullptr);
                shardtest::AdamWStep(ref, grad, cfg);
            }
            std::string what = "wd " + std::to_string(wd) + " beta2 " + std::to_string(beta2);
            EXPECT_LE(RelChange(param, ref.param, start), 1e-5) << what;
            EXPECT_LE(RelL2(m, ref.m), 1e-5) << what;
            EXPECT_LE(RelL2(v, ref.v), 1e-5) << what;
        }
    }
}

bool SameBits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The pieces a sharded step runs on a rank's slice start anywhere: split at an odd offset that
// leaves no piece a multiple of a vector width, the bits must be those of the whole.
TEST(ShardUpdate, PiecesAtAnOddSplitGiveTheBitsOfTheWhole)
{
    const size_t n = 1001, split = 333;
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    cfg.weight_decay = 0.1f;
    cfg.adam_weight_decay = 0.1f;
    const std::vector<float> p0 = Uniform(n, 1), m0 = Uniform(n, 2), v0 = Uniform(n, 3);
    std::vector<float> v0abs(n);
    for (size_t i = 0; i < n; i++)
        v0abs[i] = std::fabs(v0[i]);

    for (int t = 1; t <= 3; t++) {
        cfg.step = t;
        const std::vector<float> g = Uniform(n, 10 + t);

        // AdamW
        std::vector<float> pw = p0, mw = m0, vw = v0abs, pp = p0, mp = m0, vp = v0abs;
        ASSERT_EQ(loomAdamWUpdate(pw.data(), g.data(), mw.data(), vw.data(), n, &cfg), loomSuccess);
        ASSERT_EQ(loomAdamWUpdate(pp.data(), g.data(), mp.data(), vp.data(), split, &cfg),
                  loomSuccess);
        ASSERT_EQ(loomAdamWUpdate(pp.data() + split, g.data() + split, mp.data() + split,
                                  vp.data() + split, n - split, &cfg),
                  loomSuccess);
        EXPECT_TRUE(SameBits(pw, pp) && SameBits(mw, mp) && SameBits(vw, vp)) << "AdamW step " << t;

        // Muon's momentum (both forms, Nesterov on and off), then decay and step
        for (int form = loomMuonLerp; form <= loomMuonAccumulate; form++)
            for (int nesterov = 0; nesterov <= 1; nesterov++) {
                cfg.momentum_form = (loomMuonMomentum_t)form;
                cfg.nesterov = nesterov;
                std::vector<float> bw = m0, uw(n), bp = m0, up(n);
                loom_muon_momentum(uw.data(), g.data(), bw.data(), n, &cfg);
                loom_muon_momentum(up.data(), g.data(), bp.data(), split, &cfg);
                loom_muon_momentum(up.data() + split, g.data() + split, bp.data() + split,
                                   n - split, &cfg);
                EXPECT_TRUE(SameBits(bw, bp) && SameBits(uw, up))
                    << "momentum form " << form << " nesterov " << nesterov;
                // u may be grad itself (the step reuses the gradient buffer).
                std::vector<float> gu = g, bg = m0;
                loom_muon_momentum(gu.data(), gu.data(), bg.data(), n, &cfg);
                EXPECT_TRUE(SameBits(gu, uw) && SameBits(bg, bw));

                const float step = loom_muon_step_size(40, 24, &cfg);
                std::vector<float> aw = p0, ap = p0;
                loom_muon_apply(aw.data(), uw.data(), n, step, &cfg);
                loom_muon_apply(ap.data(), uw.data(), split, step, &cfg);
                loom_muon_apply(ap.data() + split, uw.data() + split, n - split, step, &cfg);
                EXPECT_TRUE(SameBits(aw, ap)) << "apply";
            }
    }
}

TEST(ShardUpdate, StepSizeFollowsTheLrScale)
{
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    cfg.lr = 0.5f;
    const struct {
        loomMuonLrScale_t scale;
        size_t rows, cols;
        double want;
    } cases[] = {
        {loomMuonScaleOriginal, 400, 100, 0.5 * 2.0},
        {loomMuonScaleOriginal, 100, 400, 0.5},
        {loomMuonScaleMatchAdamW, 100, 400, 0.5 * 4.0},
        {loomMuonScaleMatchAdamW, 400, 100, 2.0},
        {loomMuonScaleSpectral, 100, 400, 0.5 * 0.5},
        {loomMuonScaleSpectral, 400, 100, 1.0},
        {loomMuonScaleNone, 400, 100, 0.5},
    };
    for (const auto &c : cases) {
        cfg.lr_scale = c.scale;
        EXPECT_FLOAT_EQ(loom_muon_step_size(c.rows, c.cols, &cfg), (float)c.want)
            << c.scale << " " << c.rows << " x " << c.cols;
    }
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_shard_errors.cc - the kernels' bad input: NULL pointers, empty or oversized shapes, a
// bad step count or eps, overlapping buffers give loomInvalidArgument; a Muon config with a
// wrong size, magic or version, ns_steps < 1, step < 1 or an out-of-range enum gives
// loomInvalidUsage; every refusal names what was wrong and leaves the outputs untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "loom_shard.h"
#include "shard_ref.h"

namespace {

void ExpectMessage(const char *want)
{
    std::string msg = loomGetLastError(nullptr);
    EXPECT_NE(msg.find(want), std::string::npos) << "message: " << msg;
}

TEST(ShardErrors, NewtonSchulzRejectsBadArguments)
{
    const size_t r = 4, c = 6;
    std::vector<float> in = shardtest::Uniform(r * c, 1), out(r * c, 7.0f);
    std::vector<float> work(loomNewtonSchulzWorkspace(r, c));
    float *o = out.data(), *w = work.data();
    const float *i = in.data();
    EXPECT_EQ(loomNewtonSchulz(nullptr, i, r, c, 5, nullptr, 1e-7f, w), loomInvalidArgument);
    ExpectMessage("NULL");
    EXPECT_EQ(loomNewtonSchulz(o, nullptr, r, c, 5, nullptr, 1e-7f, w), loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, 5, nullptr, 1e-7f, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, 0, c, 5, nullptr, 1e-7f, w), loomInvalidArgument);
    ExpectMessage("0 x 6");
    EXPECT_EQ(loomNewtonSchulz(o, i, r, 0, 5, nullptr, 1e-7f, w), loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, (size_t)1 << 40, 2, 5, nullptr, 1e-7f, w),
              loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, 0, nullptr, 1e-7f, w), loomInvalidArgument);
    ExpectMessage("steps 0");
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, -3, nullptr, 1e-7f, w), loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, 5, nullptr, 0.0f, w), loomInvalidArgument);
    ExpectMessage("eps");
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, 5, nullptr, -1.0f, w), loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(o, i, r, c, 5, nullptr, NAN, w), loomInvalidArgument);
    // work inside the input or the output, and out shifted against in
    std::vector<float> big(r * c + work.size());
    EXPECT_EQ(loomNewtonSchulz(o, big.data(), r, c, 5, nullptr, 1e-7f, big.data() + 1),
              loomInvalidArgument);
    ExpectMessage("overlaps");
    EXPECT_EQ(loomNewtonSchulz(big.data(), i, r, c, 5, nullptr, 1e-7f, big.data() + r * c - 1),
              loomInvalidArgument);
    EXPECT_EQ(loomNewtonSchulz(big.data() + 1, big.data(), r, c, 5, nullptr, 1e-7f, w),
              loomInvalidArgument);
    for (float x : out)
        ASSERT_EQ(x, 7.0f); // nothing was written
}

TEST(ShardErrors, UpdatesRejectNullPointersAndEmptyShapes)
{
    const size_t r = 3, c = 5, n = r * c;
    loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
    std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    std::vector<float> work(n + loomNewtonSchulzWorkspace(r, c));
    EXPECT_EQ(loomMuonUpdate(nullptr, g.data(), m.data(), r, c, &cfg, work.data()),
              loomInvalidArgument);
    ExpectMessage("NULL");
    EXPECT_EQ(loomMuonUpdate(p.data(), nullptr, m.data(), r, c, &cfg, work.data()),
              loomInvalidArgument);
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), nullptr, r, c, &cfg, work.data()),
              loomInvalidArgument);
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), r, c, &cfg, nullptr),
              loomInvalidArgument);
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), 0, c, &cfg, work.data()),
              loomInvalidArgument);
    ExpectMessage("0 x 5");
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), r, 0, &cfg, work.data()),
              loomInvalidArgument);
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), r, c, nullptr, work.data()),
              loomInvalidArgument);
    ExpectMessage("config is NULL");

    EXPECT_EQ(loomAdamWUpdate(nullptr, g.data(), m.data(), v.data(), n, &cfg), loomInvalidArgument);
    EXPECT_EQ(loomAdamWUpdate(p.data(), nullptr, m.data(), v.data(), n, &cfg), loomInvalidArgument);
    EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), nullptr, v.data(), n, &cfg), loomInvalidArgument);
    EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), m.data(), nullptr, n, &cfg), loomInvalidArgument);
    EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), m.data(), v.data(), 0, &cfg),
              loomInvalidArgument);
    ExpectMessage("no elements");
    EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, nullptr),
              loomInvalidArgument);
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(p[i] == 1.0f && m[i] == 0.0f && v[i] == 0.0f);
}

TEST(ShardErrors, BadConfigIsInvalidUsageNamingTheField)
{
    struct Case {
        const char *what;
        void (*spoil)(loomMuonConfig_t &);
    };
    const Case cases[] = {
        {"size", [](loomMuonConfig_t &c) { c.size -= 4; }},
        {"magic", [](loomMuonConfig_t &c) { c.magic ^= 1; }},
        {"version", [](loomMuonConfig_t &c) { c.version += 100; }},
        {"version", [](loomMuonConfig_t &c) { c.version = 0; }},
        {"version", [](loomMuonConfig_t &c) { c.version += 10000; }},
        {"ns_steps 0", [](loomMuonConfig_t &c) { c.ns_steps = 0; }},
        {"step 0", [](loomMuonConfig_t &c) { c.step = 0; }},
        {"step -2", [](loomMuonConfig_t &c) { c.step = -2; }},
        {"momentum_form 2", [](loomMuonConfig_t &c) { c.momentum_form = (loomMuonMomentum_t)2; }},
        {"lr_scale 4", [](loomMuonConfig_t &c) { c.lr_scale = (loomMuonLrScale_t)4; }},
        {"ns_eps", [](loomMuonConfig_t &c) { c.ns_eps = 0.0f; }},
        {"threads 0", [](loomMuonConfig_t &c) { c.threads = 0; }},
    };
    const size_t r = 3, c = 5, n = r * c;
    std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
    std::vector<float> work(n + loomNewtonSchulzWorkspace(r, c));
    for (const Case &k : cases) {
        loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
        k.spoil(cfg);
        EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), r, c, &cfg, work.data()),
                  loomInvalidUsage)
            << k.what;
        ExpectMessage(k.what);
        EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, &cfg),
                  loomInvalidUsage)
            << k.what;
        ExpectMessage(k.what);
    }
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(p[i] == 1.0f && m[i] == 0.0f && v[i] == 0.0f);
    // The initializer's config is accepted, also from headers of another patch release.
    loomMuonConfig_t ok = LOOM_MUON_CONFIG_INITIALIZER;
    ok.version += 1;
    EXPECT_EQ(loomMuonUpdate(p.data(), g.data(), m.data(), r, c, &ok, work.data()), loomSuccess);
    EXPECT_EQ(loomAdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, &ok), loomSuccess);
}

} // namespace

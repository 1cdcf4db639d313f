/* SPDX-License-Identifier: Apache-2.0
 *
 * test_cost_constants.cc - unit tests of where the cost model's constants
 * come from (cost_model.h): measured values rounded to powers of 2^(1/4), so
 * that ranks and reruns whose measurements differ by a few per cent get the
 * same constants; the source each constant records (builtin, measured,
 * topology, env) and how loom_link_cost_describe reports it; and the
 * precedence LOOM_COST_<CLASS> > the link's rate > measured > builtin.
 * Single process, no peers; meson's 'unit' suite.
 */
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "cost_model.h"
extern "C" {
#include "param.h"
}

namespace {

// The grid, written out: 2^(k/4) for k = 0..4, and around 100 (2^6.75 = 107.6, 2^6.5 = 90.5).
TEST(CostConstants, RoundsToQuarterPowersOfTwo)
{
    EXPECT_DOUBLE_EQ(loom_cost_round(1.0), 1.0);
    EXPECT_DOUBLE_EQ(loom_cost_round(1.1892071150027210), 1.1892071150027210);
    EXPECT_DOUBLE_EQ(loom_cost_round(1.41421356237), std::sqrt(2.0));
    EXPECT_DOUBLE_EQ(loom_cost_round(2.0), 2.0);
    EXPECT_DOUBLE_EQ(loom_cost_round(1.08), 1.0);                // below 2^(1/8) = 1.0905
    EXPECT_DOUBLE_EQ(loom_cost_round(1.10), 1.1892071150027210); // above it
    EXPECT_DOUBLE_EQ(loom_cost_round(100.0), 107.63474115247546);
    EXPECT_DOUBLE_EQ(loom_cost_round(95.0), 90.509667991878089);
    EXPECT_DOUBLE_EQ(loom_cost_round(0.3), 0.29730177875068026); // 2^(-7/4)
    EXPECT_EQ(loom_cost_round(0.0), 0.0);
    EXPECT_EQ(loom_cost_round(-5.0), 0.0);
}

// Within 9 % of a grid point every value gives that point: two ranks, or two runs, whose
// measurements differ by a few per cent get identical constants.
TEST(CostConstants, NearbyMeasurementsGiveTheSameConstants)
{
    for (int k = -40; k <= 80; k++) {
        const double g = std::pow(2.0, k / 4.0);
        for (double f : {0.93, 0.97, 1.0, 1.03, 1.08})
            EXPECT_EQ(loom_cost_round(g * f), loom_cost_round(g)) << g << " x " << f;
        EXPECT_NEAR(loom_cost_round(g), g, g * 1e-12);
    }
    const double a[6] = {7300, 8.3, 0.031, 2900, 4.3, 0.063},
                 b[6] = {7100, 8.1, 0.030, 3000, 4.1, 0.061};
    const loom_link_cost_t la = loom_link_cost_measured(LOOM_LINK_TCP, a);
    const loom_link_cost_t lb = loom_link_cost_measured(LOOM_LINK_TCP, b);
    EXPECT_EQ(la.alpha_ns, lb.alpha_ns);
    EXPECT_EQ(la.beta_ns, lb.beta_ns);
    EXPECT_EQ(la.gamma_ns, lb.gamma_ns);
    EXPECT_EQ(la.o_ns, lb.o_ns);
    EXPECT_EQ(la.beta_one_ns, lb.beta_one_ns);
    EXPECT_EQ(la.cold_ns, lb.cold_ns);
}

class CostEnv : public ::testing::Test {
  protected:
    void TearDown() override
    {
        for (const char *v : {"LOOM_COST_SHM", "LOOM_COST_TCP", "LOOM_COST_UCX"})
            unsetenv(v);
        loom_param_reset_cache();
    }
    static void Set(const char *name, const char *value)
    {
        setenv(name, value, 1);
        loom_param_reset_cache();
    }
};

TEST_F(CostEnv, MeasuredValuesAreRoundedAndMarked)
{
    const double v[6] = {7300, 8.3, -1, 2900, -1, -1}; // gamma, one way, cold not measured
    const loom_link_cost_t l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    EXPECT_EQ(l.cls, LOOM_LINK_TCP);
    EXPECT_DOUBLE_EQ(l.alpha_ns, std::pow(2.0, 51 / 4.0)); // 7300 = 2^12.83 -> 2^12.75
    EXPECT_DOUBLE_EQ(l.beta_ns, 8.0);
    EXPECT_EQ(l.gamma_ns, loom_link_cost_builtin(LOOM_LINK_TCP).gamma_ns);
    EXPECT_DOUBLE_EQ(l.o_ns, std::pow(2.0, 46 / 4.0)); // 2900 = 2^11.50 -> 2^11.5
    EXPECT_EQ(l.src[LOOM_COST_ALPHA], LOOM_COST_SRC_MEASURED);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_MEASURED);
    EXPECT_EQ(l.src[LOOM_COST_GAMMA], LOOM_COST_SRC_BUILTIN);
    EXPECT_EQ(l.src[LOOM_COST_O], LOOM_COST_SRC_MEASURED);
    EXPECT_EQ(l.beta_one_ns, l.beta_ns); // one way as both ways: nothing says otherwise
    EXPECT_EQ(l.src[LOOM_COST_BETA_ONE], LOOM_COST_SRC_MEASURED);
    const loom_link_cost_t b = loom_link_cost_default(LOOM_LINK_SHM);
    for (int k = 0; k < LOOM_COST_NCONST; k++)
        EXPECT_EQ(b.src[k], LOOM_COST_SRC_BUILTIN) << k;
}

// LOOM_COST_<CLASS> wins over measured constants; o, when it leaves it out, stays measured.
TEST_F(CostEnv, EnvironmentWinsOverMeasurement)
{
    const double v[6] = {7300, 8.3, 0.031, 2900, 4.3, 0.04};
    Set("LOOM_COST_TCP", "7,0.5,0.125");
    loom_link_cost_t l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    EXPECT_EQ(l.alpha_ns, 7000.0);
    EXPECT_EQ(l.beta_ns, 0.5);
    EXPECT_EQ(l.gamma_ns, 0.125);
    EXPECT_DOUBLE_EQ(l.o_ns, std::pow(2.0, 11.5));
    EXPECT_EQ(l.src[LOOM_COST_ALPHA], LOOM_COST_SRC_ENV);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_ENV);
    EXPECT_EQ(l.src[LOOM_COST_GAMMA], LOOM_COST_SRC_ENV);
    EXPECT_EQ(l.src[LOOM_COST_O], LOOM_COST_SRC_MEASURED);
    EXPECT_EQ(l.beta_one_ns, 0.5); // one rate given: the link is full duplex
    EXPECT_EQ(l.src[LOOM_COST_BETA_ONE], LOOM_COST_SRC_ENV);
    Set("LOOM_COST_TCP", "7,0.5,0.125,3");
    l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    EXPECT_EQ(l.o_ns, 3000.0);
    EXPECT_EQ(l.src[LOOM_COST_O], LOOM_COST_SRC_ENV);
    Set("LOOM_COST_TCP", "7,0.5,0.125,3,0.25");
    l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    EXPECT_EQ(l.beta_one_ns, 0.25);
    EXPECT_EQ(l.src[LOOM_COST_BETA_ONE], LOOM_COST_SRC_ENV);
    // Another class's variable changes nothing here; an invalid one is ignored.
    Set("LOOM_COST_TCP", "seven");
    Set("LOOM_COST_SHM", "1,1,1,1");
    l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    EXPECT_DOUBLE_EQ(l.alpha_ns, std::pow(2.0, 51 / 4.0));
    EXPECT_EQ(l.src[LOOM_COST_ALPHA], LOOM_COST_SRC_MEASURED);
}

// The link's rate: a floor under a measured tcp beta, the value of ucx's; never over the
// environment's.
TEST_F(CostEnv, RateBoundsMeasuredBetaUnlessTheEnvironmentSetsIt)
{
    const double v[6] = {7300, 0.3, 0.031, 2900, 0.15, 0.04};
    const loom_link_cost_t tcp = loom_link_cost_measured(LOOM_LINK_TCP, v);
    loom_link_cost_t l = loom_link_cost_with_rate(tcp, 8.0); // 1 Gbit/s interface
    EXPECT_EQ(l.beta_ns, 8.0);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_TOPOLOGY);
    EXPECT_EQ(l.beta_one_ns, 8.0); // an interface is full duplex
    EXPECT_EQ(l.src[LOOM_COST_BETA_ONE], LOOM_COST_SRC_TOPOLOGY);
    EXPECT_EQ(l.alpha_ns, tcp.alpha_ns);
    EXPECT_EQ(l.src[LOOM_COST_ALPHA], LOOM_COST_SRC_MEASURED);
    l = loom_link_cost_with_rate(tcp, 0.08); // faster than measured: the measurement stands
    EXPECT_EQ(l.beta_ns, tcp.beta_ns);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_MEASURED);
    l = loom_link_cost_with_rate(tcp, 0); // unknown
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_MEASURED);
    const loom_link_cost_t ucx = loom_link_cost_measured(LOOM_LINK_UCX, v);
    l = loom_link_cost_with_rate(ucx, 0.08); // 100 Gbit/s port
    EXPECT_EQ(l.beta_ns, 0.08);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_TOPOLOGY);
    Set("LOOM_COST_TCP", "7,0.5,0.125");
    l = loom_link_cost_with_rate(loom_link_cost_measured(LOOM_LINK_TCP, v), 8.0);
    EXPECT_EQ(l.beta_ns, 0.5);
    EXPECT_EQ(l.src[LOOM_COST_BETA], LOOM_COST_SRC_ENV);
}

TEST_F(CostEnv, DescribeNamesEverySource)
{
    EXPECT_STREQ(loom_cost_src_name(LOOM_COST_SRC_BUILTIN), "builtin");
    EXPECT_STREQ(loom_cost_src_name(LOOM_COST_SRC_MEASURED), "measured");
    EXPECT_STREQ(loom_cost_src_name(LOOM_COST_SRC_TOPOLOGY), "topology");
    EXPECT_STREQ(loom_cost_src_name(LOOM_COST_SRC_ENV), "env");
    const double v[6] = {-1, 0.3, 0.0625, 2048, 0.125, 0.0625};
    Set("LOOM_COST_TCP", "");
    loom_link_cost_t l = loom_link_cost_with_rate(loom_link_cost_measured(LOOM_LINK_TCP, v), 8);
    char text[256];
    loom_link_cost_describe(&l, text, sizeof(text));
    EXPECT_EQ(std::string(text), "alpha 120 us (builtin), o 2.05 us (measured), beta 8 ns/B "
                                 "(topology), one way 8 ns/B (topology), gamma 0.0625 ns/B "
                                 "(measured), cold 0.0625 ns/B (measured)");
    Set("LOOM_COST_TCP", "5,0.25,0.5,1");
    l = loom_link_cost_measured(LOOM_LINK_TCP, v);
    loom_link_cost_describe(&l, text, sizeof(text));
    EXPECT_EQ(std::string(text),
              "alpha 5 us (env), o 1 us (env), beta 0.25 ns/B (env), one way 0.25 ns/B (env), "
              "gamma 0.5 ns/B (env), cold 0 ns/B (env)");
}

// One way costs at most what both ways cost: a noisy measurement above beta is beta.
TEST_F(CostEnv, OneWayIsMeasuredAndNeverAboveBeta)
{
    const double half[6] = {7300, 0.25, 0.031, 2900, 0.125, -1};
    loom_link_cost_t l = loom_link_cost_measured(LOOM_LINK_TCP, half);
    EXPECT_EQ(l.beta_ns, 0.25);
    EXPECT_EQ(l.beta_one_ns, 0.125);
    EXPECT_EQ(l.src[LOOM_COST_BETA_ONE], LOOM_COST_SRC_MEASURED);
    const double above[6] = {7300, 0.25, 0.031, 2900, 0.5, -1};
    l = loom_link_cost_measured(LOOM_LINK_TCP, above);
    EXPECT_EQ(l.beta_one_ns, 0.25);
    loom_link_cost_t p = loom_link_cost_builtin(LOOM_LINK_TCP);
    ASSERT_EQ(loom_link_cost_parse("1,0.5,0,1,2", &p), 0);
    EXPECT_EQ(p.beta_one_ns, 0.5);
}

} // namespace

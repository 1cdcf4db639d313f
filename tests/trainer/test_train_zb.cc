// SPDX-License-Identifier: Apache-2.0
//
// test_train_zb.cc - the zero-bubble pipeline schedules (--pp-schedule zb-h1, zb-h2) end to end
// through loomrun: on pp2, pp4 and dp2 x pp2 with 4 and 8 micro-batches, every step's loss and the
// final parameters bitwise those of 1F1B on the same layout and within 1e-5 of one process, the
// same collectives as 1F1B, the micro-batches in flight and the memory the deferred W's keep
// against their closed forms, the --schedule alias, and the refused combinations. The programs'
// paths come in LOOMRUN and LOOM_TRAIN.
#include "train_run.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

// Four layers, so that pp4 has a block per stage.
constexpr int kLayers = 4;
const std::string kL4 = "--layers 4";

size_t Floats()
{
    return EmbFloats() + kLayers * BlockFloats() + 2 * kC;
}

// The "comm" object of the summary: every purpose.kind with its calls and bytes.
std::string CommObject(const TrainRun &r)
{
    size_t p = r.summary.find("\"comm\":{");
    return p == std::string::npos ? "" : r.summary.substr(p, r.summary.find('}', p) - p + 1);
}

struct Layout {
    const char *name;
    int ranks, dp, pp, micro;
};

class ZeroBubble : public ::testing::TestWithParam<Layout> {};

// What one micro-batch's deferred W keeps on stage `stage` (zb.h): per block the gradients of its
// output, of the MLP's hidden layer after GELU, of x2 and of q, k, v; on the first stage the
// gradient of the embeddings' output.
double KeepFloatsPerMicro(const Layout &l, int stage)
{
    const double n = double(8 / l.dp / l.micro) * kT, C = kC;
    return double(kLayers / l.pp) * (2 * n * C + n * 4 * C + 3 * n * C) + (stage == 0 ? n * C : 0);
}

// The zero-bubble schedules change when each weight gradient is computed, not what is computed
// nor in which order it accumulates: W's run the products of the combined backward on the same
// operands, in micro-batch order. So every loss and every parameter is bitwise 1F1B's, and, as
// 1F1B, within 1e-5 of one process accumulating the same micro-batches (first loss bitwise).
TEST_P(ZeroBubble, BitwiseEqualTo1F1BAndAsOneProcess)
{
    const Layout &l = GetParam();
    const std::string grid = kL4 + " --dp " + std::to_string(l.dp) + " --pp " +
                             std::to_string(l.pp) + " --micro " + std::to_string(l.micro);
    const std::string tag = std::string(l.name) + "-";
    TrainRun base = Train(tag + "1f1b", l.ranks, grid + " --pp-schedule 1f1b");
    ASSERT_TRUE(Complete(base, Floats()));
    const TrainRun &ref = Reference(l.dp * l.micro, kL4 + " ");
    ASSERT_TRUE(Complete(ref, Floats()));
    for (const char *sched : {"zb-h1", "zb-h2"}) {
        const std::string name = tag + sched;
        TrainRun r = Train(name, l.ranks, grid + " --pp-schedule " + sched);
        ASSERT_TRUE(Complete(r, Floats()));
        EXPECT_NE(r.summary.find(std::string("\"schedule\":\"") + sched + "\""), std::string::npos);
        EXPECT_TRUE(Compare(r, base).bitwise) << name;
        ASSERT_EQ(r.losses.size(), base.losses.size());
        EXPECT_EQ(memcmp(r.losses.data(), base.losses.data(), r.losses.size() * sizeof(double)), 0)
            << name << ": a step's loss differs from 1F1B's";
        ExpectAsOneProcess(r, ref, name.c_str(), true);
        // Rank 0's collectives, calls and bytes, are 1F1B's: m activations out and m gradients
        // in per step (and m activations for the validation batch), the tie's sum, DP's
        // reductions, the norm and the loss.
        EXPECT_EQ(CommObject(r), CommObject(base)) << name;
        EXPECT_EQ(Comm(r, "pp.send").first, double(kSteps + 1) * l.micro) << name;
        EXPECT_EQ(Comm(r, "pp.recv").first, double(kSteps) * l.micro) << name;
        // Per rank: at most pp (ZB-H1) or 2pp - 1 (ZB-H2) micro-batches between their F and
        // their W; stage s defers at most s + 1 (2s + 1) W's, each keeping KeepFloatsPerMicro.
        bool h2 = std::string(sched) == "zb-h2";
        std::vector<std::vector<double>> zb = SummaryRows(r, "zb", 6);
        ASSERT_EQ(zb.size(), size_t(l.ranks)) << r.summary;
        for (int k = 0; k < l.ranks; k++) {
            int stage = k / l.dp; // pp is the grid's outermost dimension (comm.c)
            double inflight = std::min(l.micro, h2 ? 2 * l.pp - 1 : l.pp);
            double pending = std::min(l.micro, h2 ? 2 * stage + 1 : stage + 1);
            EXPECT_EQ(zb[k][3], inflight) << name << " rank " << k;
            EXPECT_EQ(zb[k][4], pending) << name << " rank " << k;
            EXPECT_EQ(zb[k][5], pending * KeepFloatsPerMicro(l, stage) * 4)
                << name << " rank " << k;
            if (!h2) {
                EXPECT_LE(zb[k][3], l.pp) << name << " rank " << k;
            }
            for (int p = 0; p < 3; p++)
                EXPECT_GT(zb[k][p], 0) << name << " rank " << k << ": the F, B and W times";
        }
        // Activations are what 1F1B holds: every micro-batch's, on every rank.
        EXPECT_EQ(Mem(r), Mem(base)) << name;
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroBubble,
                         ::testing::Values(Layout{"pp2m4", 2, 1, 2, 4}, Layout{"pp2m8", 2, 1, 2, 8},
                                           Layout{"pp4m4", 4, 1, 4, 4}, Layout{"pp4m8", 4, 1, 4, 8},
                                           Layout{"dp2pp2m4", 4, 2, 2, 4},
                                           Layout{"dp2pp2m2", 4, 2, 2, 2}),
                         [](const ::testing::TestParamInfo<Layout> &i) {
                             return std::string(i.param.name);
                         });

// --schedule is --pp-schedule under its old name; with tensor parallelism, ring and Ulysses
// context parallelism and MoE blocks the split backward keeps its communication in B and still
// gives 1F1B's bits.
TEST(ZeroBubbleModes, AliasTpCpAndMoeAreBitwise1F1B)
{
    struct Case {
        const char *name;
        int ranks;
        std::string args;
        size_t floats;
    };
    const size_t moe = Floats() + kLayers * (size_t(3) * 8 * kC * kC + size_t(kC) * 4);
    for (const Case &c : {Case{"alias", 2, kL4 + " --pp 2 --micro 4", Floats()},
                          Case{"tp2pp2", 4, kL4 + " --tp 2 --pp 2 --micro 4", Floats()},
                          Case{"cp2pp2", 4, kL4 + " --cp 2 --pp 2 --micro 4", Floats()},
                          Case{"sp2pp2", 4, kL4 + " --sp 2 --pp 2 --micro 4", Floats()},
                          Case{"moe-pp2", 2, kL4 + " --moe 4:2 --pp 2 --micro 4", moe}}) {
        std::string name = std::string("zbm-") + c.name;
        TrainRun base = Train(name + "-1f1b", c.ranks, c.args);
        TrainRun zb = Train(name, c.ranks, c.args + " --schedule zb-h1");
        ASSERT_TRUE(Complete(base, c.floats));
        ASSERT_TRUE(Complete(zb, c.floats));
        EXPECT_NE(zb.summary.find("\"schedule\":\"zb-h1\""), std::string::npos) << c.name;
        EXPECT_TRUE(Compare(zb, base).bitwise) << c.name;
        EXPECT_EQ(zb.losses, base.losses) << c.name;
        EXPECT_EQ(CommObject(zb), CommObject(base)) << c.name;
    }
}

TEST(ZeroBubbleModes, UnsupportedCombinationsAreRefused)
{
    struct Case {
        int ranks;
        const char *args, *message;
    };
    for (const Case &c : {
             Case{1, "--pp-schedule zb-h1 --zero 2", "--pp-schedule zb-h1 with --zero 2 is not"},
             Case{1, "--pp-schedule zb-h2 --zero 3", "--pp-schedule zb-h2 with --zero 3 is not"},
             Case{2, "--pp 2 --pp-schedule zb-h1 --zero 1", "--zero with --pp > 1 is not"},
             Case{1, "--pp-schedule zb-h3", "bad value 'zb-h3' for --pp-schedule"},
         }) {
        TrainRun r = Train("zb-bad", c.ranks, c.args);
        EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.log;
        EXPECT_NE(r.log.find(c.message), std::string::npos) << c.args << "\n" << r.log;
    }
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_train_dualpipe.cc - loom-train's --pp-schedule dualpipe (trainer/schedule_dualpipe.c)
// against one process and against 1F1B: every step's loss and the final parameters within 1e-5
// of one process, the first loss bitwise equal to one process's and to 1F1B's, and the whole run
// bitwise equal to 1F1B with --grad-halves (each half of the micro-batches accumulated apart, as
// the two copies do). Then what each rank holds (both copies of its two stages) and calls per
// step, from the summary, against closed forms; the schedule's ideal bubble; the refusals.
#include "train_run.h"

#include <algorithm>

namespace {

// The tiny model with L layers: the global parameter count.
size_t Floats(int layers)
{
    return EmbFloats() + size_t(layers) * BlockFloats() + 2 * kC;
}

struct DualMode {
    const char *name;
    int ranks;
    int layers;
    std::string grid;       // --pp, --dp, --tp, --cp and --micro
    int ref_micro;          // one process accumulating the same micro-batches
    bool first_bitwise_one; // the first loss is bitwise one process's (DP and PP only)
};

std::string Layers(int l)
{
    return "--layers " + std::to_string(l);
}

class DualEquivalence : public ::testing::TestWithParam<DualMode> {};

TEST_P(DualEquivalence, AsOneProcessAndBitwiseAs1F1BWithHalves)
{
    const DualMode &m = GetParam();
    const std::string base = Layers(m.layers) + " " + m.grid;
    TrainRun dual = Train(std::string("dual-") + m.name, m.ranks, base + " --pp-schedule dualpipe");
    TrainRun halves = Train(std::string("halves-") + m.name, m.ranks, base + " --grad-halves");
    TrainRun plain = Train(std::string("1f1b-") + m.name, m.ranks, base + " --pp-schedule 1f1b");
    const size_t floats = Floats(m.layers);
    ASSERT_TRUE(Complete(dual, floats));
    ASSERT_TRUE(Complete(halves, floats));
    ASSERT_TRUE(Complete(plain, floats));
    EXPECT_NE(dual.summary.find("\"schedule\":\"dualpipe\""), std::string::npos);
    const TrainRun &ref = Reference(m.ref_micro, m.layers == kL ? "" : Layers(m.layers) + " ");
    ASSERT_TRUE(Complete(ref, floats));
    ExpectAsOneProcess(dual, ref, m.name, m.first_bitwise_one);

    // The same micro-batches through the same stages: the first loss is 1F1B's, bit for bit.
    EXPECT_EQ(memcmp(&dual.losses[0], &plain.losses[0], sizeof(double)), 0)
        << m.name << " first loss " << Exact(dual.losses[0]) << ", 1F1B " << Exact(plain.losses[0]);
    Diff dp = Compare(dual, plain);
    printf("[ measured ] %-14s against 1F1B: loss rel %.2e  params rel %.2e%s\n", m.name,
           dp.loss_rel, dp.param_rel, dp.bitwise ? "  (bitwise)" : "");
    EXPECT_LE(dp.loss_rel, 1e-5);
    EXPECT_LE(dp.param_rel, 1e-5);

    // Each stage's gradient is (first half) + (second half) in both: the whole run is bitwise.
    Diff dh = Compare(dual, halves);
    EXPECT_TRUE(dh.bitwise) << m.name << ": params rel " << dh.param_rel << " max abs "
                            << dh.param_abs;
    ASSERT_EQ(dual.losses.size(), halves.losses.size());
    for (size_t i = 0; i < dual.losses.size(); i++)
        EXPECT_EQ(memcmp(&dual.losses[i], &halves.losses[i], sizeof(double)), 0)
            << m.name << " step " << i + 1 << ": " << Exact(dual.losses[i]) << " against "
            << Exact(halves.losses[i]);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, DualEquivalence,
    ::testing::Values(DualMode{"pp2_m4", 2, 2, "--pp 2 --micro 4", 4, true},
                      DualMode{"pp2_m8", 2, 2, "--pp 2 --micro 8", 8, true},
                      DualMode{"pp4_m4", 4, 4, "--pp 4 --micro 4", 4, true},
                      DualMode{"pp4_m8", 4, 4, "--pp 4 --micro 8", 8, true},
                      DualMode{"dp2xpp2_m2", 4, 2, "--dp 2 --pp 2 --micro 2", 4, true},
                      DualMode{"dp2xpp2_m4", 4, 2, "--dp 2 --pp 2 --micro 4", 8, true},
                      DualMode{"tp2xpp2_m4", 4, 2, "--tp 2 --pp 2 --micro 4", 4, false},
                      DualMode{"cp2xpp2_m4", 4, 2, "--cp 2 --pp 2 --micro 4", 4, false},
                      DualMode{"sp2xpp2_m4", 4, 2, "--sp 2 --pp 2 --micro 4", 4, false}),
    [](const ::testing::TestParamInfo<DualMode> &i) { return std::string(i.param.name); });

// Per rank: both copies' parameters, gradients and AdamW moments (rank k holds 1F1B's stage k and
// stage pp-1-k), the activations of half of the micro-batches in each copy plus one gradient
// buffer of a stage's output per micro-batch; per step two mirror all-reduces of everything it
// holds, no tie all-reduce, and m sends and m receives on rank 0.
TEST(DualPipe, HoldsBothCopiesAndCallsWhatItMust)
{
    for (int pp : {2, 4}) {
        const int layers = pp == 2 ? 2 : 4, micro = 4, steps = kSteps, val = 1;
        const std::string base =
            Layers(layers) + " --pp " + std::to_string(pp) + " --micro " + std::to_string(micro);
        TrainRun dual =
            Train("mem-dual-pp" + std::to_string(pp), pp, base + " --pp-schedule dualpipe");
        TrainRun one = Train("mem-1f1b-pp" + std::to_string(pp), pp, base);
        ASSERT_TRUE(Complete(dual, Floats(layers)));
        ASSERT_TRUE(Complete(one, Floats(layers)));
        auto dm = Mem(dual), om = Mem(one);
        ASSERT_EQ(dm.size(), size_t(pp));
        ASSERT_EQ(om.size(), size_t(pp));
        // activations' floats per micro-batch of 1F1B's stage k; the output gradient's floats
        const double io = double(kT) * kC * (8 / micro);
        for (int k = 0; k < pp; k++) {
            const int q = pp - 1 - k;
            for (int f : {0, 1, 2, 5})
                EXPECT_EQ(dm[k][f], om[k][f] + om[q][f])
                    << "pp " << pp << " rank " << k << " field " << f;
            EXPECT_EQ(dm[k][4], (om[k][4] + om[q][4]) / 2 + micro * io * 4)
                << "pp " << pp << " rank " << k << " activations";
        }
        if (pp == 2) { // every rank holds the whole model and the head's copy of wte
            for (int k = 0; k < pp; k++)
                EXPECT_EQ(dm[k][0], 4.0 * (Floats(layers) + size_t(kV) * kC));
        }
        // every rank's pipeline wait, a share of the timed steps
        size_t w = dual.summary.find("\"pp_wait_ranks\":[");
        ASSERT_NE(w, std::string::npos) << dual.summary;
        std::string waits = dual.summary.substr(w, dual.summary.find(']', w) - w);
        EXPECT_EQ(std::count(waits.begin(), waits.end(), ','), pp - 1) << waits;
        EXPECT_EQ(Comm(dual, "mirror.allreduce").first, 2 * steps);
        EXPECT_EQ(Comm(dual, "mirror.allreduce").second, steps * dm[0][1]);
        EXPECT_EQ(Comm(dual, "tie.allreduce").first, 0);
        EXPECT_EQ(Comm(dual, "data.allreduce").first, 0);
        EXPECT_EQ(Comm(dual, "misc.allreduce").first, steps);
        EXPECT_EQ(Comm(dual, "misc.allgather").first, steps + val);
        // rank 0: copy A's first stage sends activations and gets gradients, copy B's last stage
        // gets activations and sends gradients; validation runs the forwards only
        const double io_bytes = io * 4;
        EXPECT_EQ(Comm(dual, "pp.send").first, steps * micro + val * micro / 2);
        EXPECT_EQ(Comm(dual, "pp.recv").first, steps * micro + val * micro / 2);
        EXPECT_EQ(Comm(dual, "pp.send").second, (steps * micro + val * micro / 2) * io_bytes);
    }
    // With the data group: the copies' sum, then one all-reduce per copy over the data group.
    TrainRun dp = Train("cnt-dual-dp2", 4, "--dp 2 --pp 2 --micro 2 --pp-schedule dualpipe");
    ASSERT_TRUE(Complete(dp));
    EXPECT_EQ(Comm(dp, "mirror.allreduce").first, 2 * kSteps);
    EXPECT_EQ(Comm(dp, "data.allreduce").first, 2 * kSteps);
}

// The summary's ideal bubble: none with two stages (each rank is the first stage of one copy and
// the last of the other), and deeper at least the bound (pp/2 - 1)/(m + pp/2 - 1) and below
// 1F1B's (pp - 1)/(m + pp - 1). pp 6 and 8 also show that the deeper programs run to the end.
TEST(DualPipe, IdealBubbleIsBelow1F1B)
{
    for (int pp : {2, 4, 6, 8})
        for (int micro : {4, 8}) {
            TrainRun r = Train("bubble-pp" + std::to_string(pp) + "-m" + std::to_string(micro), pp,
                               Layers(8) + " --batch 16 --pp " + std::to_string(pp) + " --micro " +
                                   std::to_string(micro) + " --pp-schedule dualpipe");
            ASSERT_TRUE(Complete(r, Floats(8)));
            double b = JsonNum(r.summary, "ideal_bubble");
            double lower = double(pp / 2 - 1) / (micro + pp / 2 - 1);
            double f1b = double(pp - 1) / (micro + pp - 1);
            printf("[ measured ] pp %d m %d: ideal bubble %.4f (bound %.4f, 1F1B %.4f)\n", pp,
                   micro, b, lower, f1b);
            EXPECT_GE(b, lower - 1e-4);
            EXPECT_LT(b, f1b);
            if (pp == 2) {
                EXPECT_EQ(b, 0);
            }
        }
}

// The first step's reduced gradients (--dump-grads, from copy A, which holds each stage once over
// the ranks): the copies' sum and the tie's are 1F1B --grad-halves's, bit for bit.
TEST(DualPipe, FirstStepGradientsAreTheSumOfTheHalves)
{
    const std::string g = TmpDir() + "/grads-";
    TrainRun dual = Train("grads-dual", 4,
                          Layers(4) + " --pp 4 --micro 4 --pp-schedule dualpipe --dump-grads " + g +
                              "dual.bin");
    TrainRun halves =
        Train("grads-halves", 4,
              Layers(4) + " --pp 4 --micro 4 --grad-halves --dump-grads " + g + "halves.bin");
    ASSERT_TRUE(Complete(dual, Floats(4)));
    ASSERT_TRUE(Complete(halves, Floats(4)));
    std::string a = Slurp(g + "dual.bin"), b = Slurp(g + "halves.bin");
    EXPECT_EQ(a.size(), Floats(4) * sizeof(float));
    EXPECT_TRUE(a == b) << "the first step's gradients differ";
}

TEST(DualPipe, UnsupportedCombinationsAreRefused)
{
    struct Case {
        int ranks;
        std::string args, want;
    };
    for (const Case &c :
         {Case{3, "--layers 3 --pp 3 --micro 2 --pp-schedule dualpipe", "even --pp"},
          Case{1, "--pp-schedule dualpipe --micro 2", "even --pp"},
          Case{2, "--pp 2 --micro 3 --batch 6 --pp-schedule dualpipe", "even --micro"},
          Case{2, "--pp 2 --micro 2 --zero 1 --pp-schedule dualpipe", "--zero"},
          Case{2, "--pp 2 --micro 2 --optim muon --pp-schedule dualpipe", "--optim muon"},
          Case{2, "--pp 2 --micro 2 --moe 4:2 --pp-schedule dualpipe", "--moe"},
          Case{4, "--tp 2 --pp 2 --micro 2 --tp-allreduce echo --pp-schedule dualpipe", "echo"},
          Case{2, "--pp 2 --micro 2 --save x --pp-schedule dualpipe", "--save"},
          Case{2, "--pp 2 --micro 2 --grad-halves --pp-schedule dualpipe", "--grad-halves"},
          Case{2, "--pp 2 --micro 3 --batch 6 --grad-halves", "--grad-halves"},
          Case{2, "--pp 2 --micro 2 --grad-halves --pp-schedule zb-h1", "--grad-halves"},
          Case{2, "--pp 2 --micro 2 --pp-schedule zigzag", "bad value"}}) {
        TrainRun r = Train("refuse", c.ranks, c.args);
        EXPECT_NE(r.rc, 0) << c.args;
        EXPECT_LT(r.rc, 128) << c.args << ": crashed\n" << r.log;
        EXPECT_NE(r.log.find(c.want), std::string::npos) << c.args << ":\n" << r.log;
    }
}

} // namespace

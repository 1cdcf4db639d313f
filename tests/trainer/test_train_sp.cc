// SPDX-License-Identifier: Apache-2.0
//
// test_train_sp.cc - loom-train's Ulysses sequence parallelism (--sp) end to end, through loomrun:
// each grid against one process (losses at every step and final parameters), what each rank holds,
// the all-to-alls it issues (calls and bytes against their closed forms) and the combinations it
// refuses. The programs' paths come in LOOMRUN and LOOM_TRAIN.
#include "train_run.h"

#include <string>
#include <vector>

namespace {

struct SpMode {
    const char *name;
    int ranks;
    const char *args;
    int ref_micro; // one process accumulating the same micro-batches
};

class SpEquivalence : public ::testing::TestWithParam<SpMode> {};

// Ulysses computes each head's attention over the whole sequence on one rank, in the zigzag order
// of the chunks (the causal mask follows the positions, not the rows), so only the order of the
// sums over keys differs from one process: rounding, far below the 1e-5 bound of the other modes.
// Measured on an AMD EPYC (OpenBLAS 0.3.21): at most 7.9e-10 in the loss, 1.4e-8 in
// ||dp||/||p|| and 6.9e-8 in any parameter.
TEST_P(SpEquivalence, SameLossesAndParametersAsOneProcess)
{
    const SpMode &m = GetParam();
    const TrainRun &ref = Reference(m.ref_micro);
    ASSERT_TRUE(Complete(ref));
    TrainRun r = Train(m.name, m.ranks, m.args);
    ASSERT_TRUE(Complete(r));
    ExpectAsOneProcess(r, ref, m.name, false);
    static const TrainRun init = Train("sp-init", 1, "--steps 0");
    ASSERT_EQ(init.rc, 0) << init.log;
    EXPECT_GT(Compare(r, init).param_rel, 1e-3);
    // The summary names the mode: the sequence split is Ulysses', not the ring's.
    EXPECT_GE(JsonNum(r.summary, "sp"), 2) << r.summary;
    EXPECT_EQ(JsonNum(r.summary, "cp"), 1) << r.summary;
    EXPECT_EQ(Comm(r, "cp.send").first, 0) << r.summary;
}

INSTANTIATE_TEST_SUITE_P(Modes, SpEquivalence,
                         ::testing::Values(SpMode{"sp2", 2, "--sp 2", 1},
                                           SpMode{"sp4", 4, "--sp 4", 1},
                                           SpMode{"dp2xsp2", 4, "--dp 2 --sp 2", 2},
                                           SpMode{"tp2xsp2", 4, "--tp 2 --sp 2", 1},
                                           SpMode{"sp2xpp2", 4, "--sp 2 --pp 2 --micro 2", 2},
                                           SpMode{"zero3_sp2", 4, "--zero 3 --dp 2 --sp 2", 2}),
                         [](const ::testing::TestParamInfo<SpMode> &i) {
                             return std::string(i.param.name);
                         });

// Muon steps the replicated weights with gradients reduced over the data group (dp x sp): the
// plan spans the SP ranks as it spans CP's. Measured: 3.8e-10 in the loss, 1.8e-7 in
// ||dp||/||p|| (Newton-Schulz mixes a whole matrix, see trainer/README.md).
TEST(Sp, MuonAsOneProcess)
{
    const std::string muon = "--optim muon ";
    const TrainRun &ref = Reference(1, muon);
    ASSERT_TRUE(Complete(ref));
    TrainRun r = Train("sp2-muon", 2, muon + "--sp 2");
    ASSERT_TRUE(Complete(r));
    ExpectAsOneProcess(r, ref, "sp2 muon", false);
}

// Each rank holds every weight (replicated over the SP group) and the activations of its 1/sp of
// every sequence: the head-sharded Q, K, V and log-sum-exp the backward reuses take exactly the
// floats of the sequence-sharded ones they replace.
TEST(Sp, EachRankHoldsItsShareOfTheActivations)
{
    const TrainRun &ref = Reference(1);
    ASSERT_TRUE(Complete(ref));
    auto rm = Mem(ref);
    ASSERT_EQ(rm.size(), 1u);
    for (int sp : {2, 4}) {
        TrainRun r = Train("sp-mem" + std::to_string(sp), sp, "--sp " + std::to_string(sp));
        ASSERT_TRUE(Complete(r));
        auto mm = Mem(r);
        ASSERT_EQ(mm.size(), size_t(sp));
        for (auto &m : mm) {
            EXPECT_EQ(m[4], rm[0][4] / sp) << "sp " << sp;
            EXPECT_EQ(m[0], rm[0][0]) << "sp " << sp; // parameters: replicated
        }
    }
}

// Per block and micro-batch Ulysses issues 4 all-to-alls on the SP group: Q, K, V in and the
// output out in the forward, the output's gradient (with the softmax's row terms) in and dq, dk, dv
// out in the backward; a validation forward issues the first 2. With n = the rank's tokens of a
// micro-batch (sequences x T / sp), cl = C / tp and hl = H / tp, the bytes counted (each call's
// whole send buffer, the rank's own block included) are per block and micro-batch
//   forward  (3 n cl + n cl) x 4,  backward (n (cl + hl) + 3 n cl) x 4,
// of which (sp - 1) / sp cross to other ranks. Gradients are all-reduced over the data group
// (dp x sp) once per unit and step, as CP's are.
TEST(Sp, AllToAllsMatchTheirClosedForms)
{
    const double steps = kSteps, units = kL + 2;
    struct Case {
        const char *name;
        int ranks, dp, tp, sp, micro;
        std::string args;
    };
    for (const Case &c : {Case{"sp-coll2", 2, 1, 1, 2, 1, "--sp 2"},
                          Case{"sp-coll4", 4, 1, 1, 4, 2, "--sp 4 --micro 2"},
                          Case{"sp-coll-tp", 4, 1, 2, 2, 1, "--tp 2 --sp 2"},
                          Case{"sp-coll-dp", 4, 2, 1, 2, 2, "--dp 2 --sp 2 --micro 2"}}) {
        TrainRun r = Train(c.name, c.ranks, c.args);
        ASSERT_TRUE(Complete(r));
        const double m = c.micro, val_batches = 1;
        const double n = (8.0 / c.dp / c.micro) * kT / c.sp, cl = double(kC) / c.tp,
                     hl = 4.0 / c.tp;
        const double fwd = 4 * (3 * n * cl + n * cl), bwd = 4 * (n * (cl + hl) + 3 * n * cl);
        auto a2a = Comm(r, "sp.alltoall");
        EXPECT_EQ(a2a.first, steps * m * kL * 4 + val_batches * m * kL * 2) << c.name;
        EXPECT_EQ(a2a.second, steps * m * kL * (fwd + bwd) + val_batches * m * kL * fwd) << c.name;
        EXPECT_EQ(Comm(r, "data.allreduce").first, steps * units) << c.name;
        EXPECT_EQ(Comm(r, "cp.send").first, 0) << c.name;
        EXPECT_EQ(Comm(r, "cp.recv").first, 0) << c.name;
        // TP keeps its 2 + 2 all-reduces per block and step, 2 per block for validation.
        EXPECT_EQ(Comm(r, "tp.allreduce").first, c.tp > 1 ? steps * 4 * kL + 2 * kL : 0) << c.name;
        EXPECT_EQ(JsonNum(r.summary, "sp"), c.sp) << c.name;
    }
}

TEST(Sp, RefusedCombinationsGetAClearMessage)
{
    struct Case {
        int ranks;
        const char *args, *message;
    };
    for (const Case &c : {
             Case{2, "--sp 8",
                  "--sp 8 must divide the heads per tensor-parallel rank (--heads 4 "
                  "/ --tp 1 = 4)"},
             Case{4, "--tp 2 --sp 4", "--sp 4 must divide the heads per tensor-parallel rank"},
             Case{4, "--sp 2 --cp 2", "--sp with --cp > 1 is not supported"},
             Case{2, "--sp 2 --moe 4:2", "--sp with --moe is not supported"},
             Case{2, "--sp 2 --ctx 6", "--ctx 6 must be a multiple of 2 * --sp (4)"},
             Case{1, "--sp 0", "--sp must be >= 1"},
             Case{3, "--sp 2", "--cp (or --sp) 2 must equal the 3 ranks"},
         }) {
        TrainRun r = Train("sp-bad", c.ranks, c.args);
        EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.log;
        EXPECT_NE(r.log.find(c.message), std::string::npos) << c.args << "\n" << r.log;
    }
}

} // namespace

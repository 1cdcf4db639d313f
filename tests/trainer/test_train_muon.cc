// SPDX-License-Identifier: Apache-2.0
//
// test_train_muon.cc - loom-train's --optim muon through loomrun: owner-sharded Muon (each matrix
// whole on one rank of the data group) against one process, the three loom_shard layouts (owner,
// rows, none = DDP Muon) bitwise equal to each other, what each layout holds and sends per rank
// against the closed forms of docs/shard.md, the collectives each calls, and bad options.
#include "train_run.h"

#include <algorithm>
#include <string>
#include <vector>

namespace {

const std::string kMuon = "--optim muon ";

// The elements of the tiny model's Muon matrices (wq, wk, wv, wo, wup, wdown of every block) and
// of the rest, stepped by AdamW.
size_t MatrixFloats()
{
    return size_t(kL) * 12 * kC * kC;
}
size_t ElementwiseFloats()
{
    return GlobalFloats() - MatrixFloats();
}

// Per rank, from the summary: {bytes sent, bytes received, step collectives, state floats,
// Newton-Schulz multiply-adds per step}.
std::vector<std::vector<double>> ShardFigures(const TrainRun &r)
{
    return SummaryRows(r, "shard_figures", 5);
}

struct MuonMode {
    const char *name;
    int ranks;
    const char *args;
    int ref_micro; // one process accumulating the same micro-batches
};

class MuonEquivalence : public ::testing::TestWithParam<MuonMode> {};

// Muon with each layout and grid trains as one process running Muon on the same micro-batches,
// within the 1e-5 of the AdamW modes: the gradients are summed in another order (each rank's part
// first), and nothing else differs. The first loss is bitwise one process's (the same parameters
// on the same micro-batches). Newton-Schulz amplifies nothing here: it normalises the update.
TEST_P(MuonEquivalence, SameLossesAndParametersAsOneProcessMuon)
{
    const MuonMode &m = GetParam();
    const TrainRun &ref = Reference(m.ref_micro, kMuon);
    ASSERT_TRUE(Complete(ref));
    TrainRun r = Train(m.name, m.ranks, kMuon + m.args);
    ASSERT_TRUE(Complete(r));
    ExpectAsOneProcess(r, ref, m.name, true);
    // Muon is not AdamW: the same run with AdamW ends elsewhere.
    EXPECT_GT(Compare(r, Reference(m.ref_micro)).param_rel, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MuonEquivalence,
    ::testing::Values(MuonMode{"muon_owner_dp2", 2, "--dp 2", 2},
                      MuonMode{"muon_owner_dp4", 4, "--dp 4", 4},
                      MuonMode{"muon_rows_dp2", 2, "--dp 2 --shard rows", 2},
                      MuonMode{"muon_none_dp2", 2, "--dp 2 --shard none", 2},
                      MuonMode{"muon_owner_pp2", 2, "--pp 2 --micro 4", 4},
                      MuonMode{"muon_owner_dp2pp2", 4, "--dp 2 --pp 2 --micro 2", 4}),
    [](const ::testing::TestParamInfo<MuonMode> &i) { return std::string(i.param.name); });

// The three layouts run the same kernels on the same reduced gradients, summed in rank order by
// loom's deterministic reductions: owner, rows and DDP Muon give the same bits, at dp 2 and dp 4.
// Clipping is off: the global norm is summed shard by shard, and the shards differ by layout.
TEST(Muon, LayoutsAreBitwiseEqual)
{
    for (int dp : {2, 4}) {
        std::string g = kMuon + "--clip 0 --dp " + std::to_string(dp) + " --shard ";
        std::string n = std::to_string(dp);
        TrainRun owner = Train("muon-bw-owner" + n, dp, g + "owner");
        TrainRun rows = Train("muon-bw-rows" + n, dp, g + "rows");
        TrainRun none = Train("muon-bw-none" + n, dp, g + "none");
        ASSERT_TRUE(Complete(owner));
        ASSERT_TRUE(Complete(rows));
        ASSERT_TRUE(Complete(none));
        EXPECT_TRUE(Compare(owner, rows).bitwise) << "dp " << dp;
        EXPECT_TRUE(Compare(owner, none).bitwise) << "dp " << dp;
        EXPECT_EQ(owner.losses, rows.losses);
        EXPECT_EQ(owner.losses, none.losses);
    }
}

// Per rank: owner holds each matrix's momentum on one rank and splits AdamW's two moments, so the
// ranks' state adds up to one process's; DDP Muon holds all of it on every rank. Parameters and
// gradients are whole on every rank (the gradients' reduced shard besides). Owner and DDP send
// 2 (P - 1) N floats per step over all ranks (a reduce-scatter and an all-gather, or an
// all-reduce); rows adds the all-gather of the matrices' updates inside the step.
TEST(Muon, EachLayoutHoldsAndSendsItsClosedForm)
{
    const double N = double(GlobalFloats()), M = double(MatrixFloats()),
                 E = double(ElementwiseFloats()), steps = kSteps;
    for (int dp : {2, 4}) {
        TrainRun owner = Train("muon-mem-owner" + std::to_string(dp), dp,
                               kMuon + "--dp " + std::to_string(dp) + " --shard owner");
        TrainRun none = Train("muon-mem-none" + std::to_string(dp), dp,
                              kMuon + "--dp " + std::to_string(dp) + " --shard none");
        ASSERT_TRUE(Complete(owner));
        ASSERT_TRUE(Complete(none));
        auto fo = ShardFigures(owner), fn = ShardFigures(none);
        auto mo = Mem(owner);
        ASSERT_EQ(fo.size(), size_t(dp)) << owner.summary;
        ASSERT_EQ(fn.size(), size_t(dp)) << none.summary;
        ASSERT_EQ(mo.size(), size_t(dp));
        double state = 0, sent = 0, ns_max = 0, ns_sum = 0;
        for (int k = 0; k < dp; k++) {
            state += fo[k][3];
            sent += fo[k][0];
            ns_max = std::max(ns_max, fo[k][4]);
            ns_sum += fo[k][4];
            EXPECT_EQ(fo[k][2], 0) << "owner's step communicates on rank " << k;
            EXPECT_EQ(fn[k][2], 0) << "DDP Muon's step communicates on rank " << k;
            EXPECT_EQ(fn[k][3], M + 2 * E) << "rank " << k;
            EXPECT_EQ(mo[k][0], N * 4) << "rank " << k;
            EXPECT_EQ(mo[k][2], fo[k][3] * 4) << "rank " << k;
        }
        EXPECT_EQ(state, M + 2 * E) << "dp " << dp;
        EXPECT_EQ(sent, steps * 2 * (dp - 1) * N * 4) << "dp " << dp;
        double dsent = 0;
        for (auto &f : fn)
            dsent += f[0];
        EXPECT_EQ(dsent, steps * 2 * (dp - 1) * N * 4) << "dp " << dp;
        // Owner runs each matrix's Newton-Schulz once in all; the blocks' matrices balance
        // within the list-scheduling bound, and every rank gets some.
        EXPECT_GT(fo[dp - 1][4], 0);
        EXPECT_LE(ns_max, ns_sum / dp * 1.5) << "dp " << dp;
    }
}

// Rank 0's counters over 5 steps: one ReduceGrads per unit and one GatherParams per step; the
// owner's step issues no collective, rows' one all-gather per block (the matrices' updates, one
// per bucket); DDP Muon reduces each unit and gathers nothing.
TEST(Muon, EachLayoutCallsWhatItMust)
{
    const double units = kL + 2, steps = kSteps;
    TrainRun owner = Train("muon-coll-owner", 2, kMuon + "--dp 2 --shard owner");
    TrainRun rows = Train("muon-coll-rows", 2, kMuon + "--dp 2 --shard rows");
    TrainRun none = Train("muon-coll-none", 2, kMuon + "--dp 2 --shard none");
    ASSERT_TRUE(Complete(owner));
    ASSERT_TRUE(Complete(rows));
    ASSERT_TRUE(Complete(none));
    EXPECT_EQ(Comm(owner, "data.shardreduce").first, steps * units) << owner.summary;
    EXPECT_EQ(Comm(owner, "data.shardgather").first, steps) << owner.summary;
    EXPECT_EQ(Comm(owner, "data.shardstep").first, 0) << owner.summary;
    EXPECT_EQ(Comm(owner, "data.allreduce").first, 0) << owner.summary;
    EXPECT_EQ(Comm(rows, "data.shardreduce").first, steps * units) << rows.summary;
    EXPECT_EQ(Comm(rows, "data.shardstep").first, steps * kL) << rows.summary;
    EXPECT_EQ(Comm(none, "data.shardreduce").first, steps * units) << none.summary;
    EXPECT_EQ(Comm(none, "data.shardgather").first, 0) << none.summary;
}

// A checkpoint holds Muon's state (loom_shard's, this rank's share): a run resumed from step 3 goes
// on bit for bit as the uninterrupted one. One saved with AdamW, or with another shard layout,
// is refused with a message.
TEST(Muon, ResumeEqualsAnUninterruptedRun)
{
    for (const std::string shard : {"owner", "rows"}) {
        std::string grid = kMuon + "--dp 2 --shard " + shard, ck = TmpDir() + "/ckpt-muon-" + shard;
        TrainRun whole = Train("muon-ck-whole-" + shard, 2, grid);
        TrainRun first = Train("muon-ck-first-" + shard, 2, grid + " --steps 3 --save " + ck);
        TrainRun rest = Train("muon-ck-rest-" + shard, 2, grid + " --resume " + ck);
        ASSERT_TRUE(Complete(whole));
        ASSERT_EQ(first.rc, 0) << first.log;
        ASSERT_EQ(rest.rc, 0) << rest.log;
        ASSERT_EQ(rest.losses.size(), 2u) << rest.log;
        EXPECT_EQ(rest.losses[0], whole.losses[3]) << shard;
        EXPECT_EQ(rest.losses[1], whole.losses[4]) << shard;
        EXPECT_TRUE(Compare(rest, whole).bitwise) << shard;
    }
    std::string ck = TmpDir() + "/ckpt-muon-owner";
    for (const std::string &other : {std::string("--dp 2"), kMuon + "--dp 2 --shard none"}) {
        TrainRun wrong = Train("muon-ck-wrong", 2, other + " --resume " + ck);
        EXPECT_NE(wrong.rc, 0) << other;
        EXPECT_NE(wrong.log.find("another model or parallel layout"), std::string::npos)
            << other << "\n"
            << wrong.log;
    }
}

TEST(Muon, BadOptionsGetAClearError)
{
    struct Case {
        int ranks;
        const char *args, *message;
    };
    for (const Case &c : {
             Case{2, "--shard owner", "need --optim muon"},
             Case{2, "--optim muon --zero 1", "not with ZeRO"},
             Case{2, "--optim muon --shard zero1", "not with ZeRO"},
             Case{2, "--optim muon --tp 2", "--optim muon with --tp is not supported"},
             Case{2, "--optim muon --moe 4:2 --ep 2", "--optim muon with --ep > 1"},
             Case{1, "--optim sgd", "bad value 'sgd' for --optim"},
             Case{1, "--optim muon --shard cols", "bad value 'cols' for --shard"},
             Case{1, "--muon-lr 0.1", "need --optim muon"},
             Case{1, "--optim muon --muon-momentum 1", "must be < 1"},
         }) {
        TrainRun r = Train("muon-bad", c.ranks, c.args);
        EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.log;
        EXPECT_NE(r.log.find(c.message), std::string::npos) << c.args << "\n" << r.log;
    }
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_train.cc - loom-train end to end, through loomrun: every parallel mode and the listed
// combinations against one process (losses at every step and final parameters), what each mode
// holds per rank and which collectives it calls, checkpoint resume, Echo on the TP all-reduces,
// the PyTorch reference (when torch is installed) and bad options. The programs' paths come in
// LOOMRUN, LOOM_TRAIN, MOE_PERF and TORCH_REF.
#include "train_run.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Mode {
    const char *name;
    int ranks;
    const char *args;
    int ref_micro;    // the reference with the same gradient accumulation
    bool split_batch; // only splits the batch (DP, ZeRO, PP): the first loss is bitwise equal
};

class Equivalence : public ::testing::TestWithParam<Mode> {};

// Each mode, from the same initialisation on the same global batches, gives the losses and the
// final parameters of one process within 1e-5 relative. Reduction order is the only difference:
// a split sum adds each part before the parts (float rounding), so they are not bitwise equal.
// Measured with OpenBLAS's Cooperlake, SkylakeX, Haswell, Zen, Sandybridge and Prescott kernels:
// at most 7.4e-10 in the loss, 1.4e-8 in ||dp||/||p|| and 9.7e-8 in any parameter; 1e-5 is far
// above that rounding (a change of BLAS kernels changes which bits round, not how much), and far
// below what a wrong shard, a lost micro-batch or a mis-scaled gradient does: the first AdamW steps
// move every parameter by about the learning rate (3e-4 .. 3e-3), and such a bug changes those
// moves. Modes that only split the batch see the same parameters on the same micro-batches in the
// first step and add the micro-batch losses in one process's order: that loss is bitwise equal.
// From the first update on, the accumulation order of the gradients differs (see
// trainer/README.md).
TEST_P(Equivalence, SameLossesAndParametersAsOneProcess)
{
    const Mode &m = GetParam();
    const TrainRun &ref = Reference(m.ref_micro);
    ASSERT_TRUE(Complete(ref));
    TrainRun r = Train(m.name, m.ranks, m.args);
    ASSERT_TRUE(Complete(r));
    ExpectAsOneProcess(r, ref, m.name, m.split_batch);
    // Training moved the parameters: the comparison is not between two initialisations.
    static const TrainRun init = Train("init", 1, "--steps 0");
    ASSERT_EQ(init.rc, 0) << init.log;
    EXPECT_GT(Compare(r, init).param_rel, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, Equivalence,
    ::testing::Values(Mode{"dp2", 2, "--dp 2", 2, true}, Mode{"zero1x2", 2, "--zero 1", 2, true},
                      Mode{"zero2x2", 2, "--zero 2", 2, true},
                      Mode{"zero3x2", 2, "--zero 3", 2, true}, Mode{"tp2", 2, "--tp 2", 1, false},
                      Mode{"pp2_1f1b", 2, "--pp 2 --micro 4 --schedule 1f1b", 4, true},
                      Mode{"pp2_gpipe", 2, "--pp 2 --micro 4 --schedule gpipe", 4, true},
                      Mode{"cp2", 2, "--cp 2", 1, false},
                      Mode{"dp2xtp2", 4, "--dp 2 --tp 2", 2, false},
                      Mode{"tp2xpp2", 4, "--tp 2 --pp 2 --micro 4", 4, false},
                      Mode{"dp2xpp2", 4, "--dp 2 --pp 2 --micro 2", 4, true},
                      Mode{"cp2xtp2", 4, "--cp 2 --tp 2", 1, false},
                      Mode{"zero3_cp2", 4, "--zero 3 --dp 2 --cp 2", 2, false},
                      Mode{"dp2tp2pp2", 8, "--dp 2 --tp 2 --pp 2 --micro 2", 4, false}),
    [](const ::testing::TestParamInfo<Mode> &i) { return std::string(i.param.name); });

// GPipe and 1F1B run the same backwards in the same order: bitwise equal results.
TEST(Trainer, GPipeAnd1F1BAreBitwiseEqual)
{
    TrainRun a = Train("sched-1f1b", 2, "--pp 2 --micro 4 --schedule 1f1b");
    TrainRun b = Train("sched-gpipe", 2, "--pp 2 --micro 4 --schedule gpipe");
    ASSERT_TRUE(Complete(a));
    ASSERT_TRUE(Complete(b));
    EXPECT_TRUE(Compare(a, b).bitwise);
    EXPECT_EQ(a.losses, b.losses);
}

// The step's loss adds the micro-batch losses in one process's order on every layout. With dp 2 and
// 2 micro-batches per rank, a sum over ranks would give (l0 + l1) + (l2 + l3) instead of
// ((l0 + l1) + l2) + l3, which differs in the last bit for about half of the seeds (2, 6, 10,
// 11 and 12 of the first 12 on the CPU this was written on): the first step's loss, the same
// parameters on the same micro-batches, is bitwise that of one process for each seed.
TEST(Trainer, FirstLossIsAddedInOneProcessOrder)
{
    for (int seed = 1; seed <= 12; seed++) {
        std::string s = " --steps 1 --val-batches 0 --seed " + std::to_string(seed);
        TrainRun one = Train("order-one", 1, "--micro 4" + s);
        TrainRun dp = Train("order-dp2", 2, "--dp 2 --micro 2" + s);
        ASSERT_EQ(one.rc, 0) << one.log;
        ASSERT_EQ(dp.rc, 0) << dp.log;
        ASSERT_EQ(one.losses.size(), 1u);
        ASSERT_EQ(dp.losses.size(), 1u);
        EXPECT_EQ(memcmp(&one.losses[0], &dp.losses[0], sizeof(double)), 0)
            << "seed " << seed << ": one process " << Exact(one.losses[0]) << ", dp 2 "
            << Exact(dp.losses[0]);
    }
}

// Reducing gradients on a stream during the backward changes when, not what: bitwise equal.
TEST(Trainer, OverlapDoesNotChangeResults)
{
    TrainRun a = Train("overlap", 2, "--dp 2");
    TrainRun b = Train("no-overlap", 2, "--dp 2 --no-overlap");
    ASSERT_TRUE(Complete(a));
    ASSERT_TRUE(Complete(b));
    EXPECT_TRUE(Compare(a, b).bitwise);
}

// ---- Mixture of experts and expert parallelism
// ---------------------------------------------------

// --moe 4:2 in both blocks of the tiny model: the MLP's wup and wdown once per expert, plus the
// router wr[C][E].
constexpr int kE = 4;
const std::string kMoe = "--moe 4:2 ";

size_t MoeFloats()
{
    return GlobalFloats() + kL * (size_t(kE - 1) * 8 * kC * kC + size_t(kC) * kE);
}

const TrainRun &MoeReference(int micro)
{
    static std::map<int, TrainRun> refs;
    if (!refs.count(micro))
        refs[micro] =
            Train("moe-ref" + std::to_string(micro), 1, kMoe + "--micro " + std::to_string(micro));
    return refs[micro];
}

// The per-step number under key, from the step lines of the run's JSON log.
std::vector<double> StepField(const TrainRun &r, const std::string &key)
{
    std::vector<double> out;
    std::istringstream js(Slurp(TmpDir() + "/" + r.name + ".json"));
    for (std::string line; std::getline(js, line);)
        if (line.find("\"step\"") != std::string::npos)
            out.push_back(JsonNum(line, key));
    return out;
}

struct MoeMode {
    const char *name;
    int ranks;
    const char *args;
    int ref_micro; // one process accumulating the same micro-batches
};

class MoeEquivalence : public ::testing::TestWithParam<MoeMode> {};

// MoE blocks under DP, ZeRO-3 and PP (experts whole on every rank), and experts spread over the EP
// group (and replicated over its copies) train as one process holding every expert on the same
// micro-batches, within the 1e-5 of the other modes. With EP, each token meets
// the same experts with the same weights, so only rounding differs (an expert's rows from several
// ranks go through one matrix product; its gradients add over them before the replicas'
// all-reduce). Routing is not replayed: a flipped top-k choice would move its token's output by
// far more than 1e-5, but the closest choice of these runs (one process, micro-batches 1, 2, 4)
// has its k-th and (k+1)-th probabilities 4.8e-6 apart relative to the k-th, while the layouts
// differ by rounding only, about 1e-7 relative in the parameters after 5 steps. Measured: at most
// 3.5e-10 in the loss, 1.8e-8 in ||dp||/||p|| and 1.6e-7 in any parameter.
TEST_P(MoeEquivalence, SameLossesAndParametersAsOneProcess)
{
    const MoeMode &m = GetParam();
    const TrainRun &ref = MoeReference(m.ref_micro);
    ASSERT_TRUE(Complete(ref, MoeFloats()));
    TrainRun r = Train(m.name, m.ranks, kMoe + m.args);
    ASSERT_TRUE(Complete(r, MoeFloats()));
    ExpectAsOneProcess(r, ref, m.name, false);
    static const TrainRun init = Train("moe-init", 1, kMoe + "--steps 0");
    ASSERT_EQ(init.rc, 0) << init.log;
    EXPECT_GT(Compare(r, init).param_rel, 1e-3);
    // Every selection is counted once, on the rank of its token: 2 per token and MoE block.
    for (double sel : StepField(r, "moe_selections"))
        EXPECT_EQ(sel, 8.0 * kT * 2 * kL) << m.name;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MoeEquivalence,
    ::testing::Values(MoeMode{"moe_dp2", 2, "--dp 2", 2}, MoeMode{"moe_zero3", 2, "--zero 3", 2},
                      MoeMode{"moe_pp2", 2, "--pp 2 --micro 4", 4},
                      MoeMode{"moe_ep2", 2, "--ep 2", 2}, MoeMode{"moe_ep4", 4, "--ep 4", 4},
                      MoeMode{"moe_dp2xep2", 4, "--ep 2", 4}),
    [](const ::testing::TestParamInfo<MoeMode> &i) { return std::string(i.param.name); });

// Naive dispatch (a row per token and expert) and dedup (a row per token and rank) move different
// rows and give the same bits (loom's combine adds in a fixed order in both); the log says what
// each moved: naive sends every selection of a remote expert, dedup that less what it saved.
TEST(Moe, NaiveAndDedupAreBitwiseEqualAndCountTheirRows)
{
    TrainRun naive = Train("moe-naive", 2, kMoe + "--ep 2 --moe-mode naive");
    TrainRun dedup = Train("moe-dedup", 2, kMoe + "--ep 2 --moe-mode dedup");
    ASSERT_TRUE(Complete(naive, MoeFloats()));
    ASSERT_TRUE(Complete(dedup, MoeFloats()));
    EXPECT_TRUE(Compare(naive, dedup).bitwise);
    EXPECT_EQ(naive.losses, dedup.losses);
    auto ns = StepField(naive, "moe_rows_sent"), ds = StepField(dedup, "moe_rows_sent");
    auto saved = StepField(dedup, "moe_rows_saved"), hits = StepField(dedup, "moe_local_hits");
    auto sel = StepField(dedup, "moe_selections"), ms = StepField(dedup, "moe_a2a_ms");
    ASSERT_EQ(ns.size(), size_t(kSteps));
    ASSERT_EQ(ds.size(), size_t(kSteps));
    double total_saved = 0;
    for (int i = 0; i < kSteps; i++) {
        EXPECT_EQ(ns[i], sel[i] - hits[i]) << "step " << i;
        EXPECT_EQ(ds[i] + saved[i], ns[i]) << "step " << i;
        EXPECT_GT(hits[i], 0);
        EXPECT_LT(hits[i], sel[i]);
        EXPECT_GT(ms[i], 0);
        total_saved += saved[i];
    }
    EXPECT_GT(total_saved, 0);
    // One rank holds every expert: every selection is a local hit, nothing goes on the wire.
    const TrainRun &one = MoeReference(1);
    auto ohits = StepField(one, "moe_local_hits"), osent = StepField(one, "moe_rows_sent");
    ASSERT_EQ(ohits.size(), size_t(kSteps));
    for (int i = 0; i < kSteps; i++) {
        EXPECT_EQ(ohits[i], 8.0 * kT * 2 * kL);
        EXPECT_EQ(osent[i], 0);
    }
}

// --moe-every 2: only the second block is a mixture; the first keeps its MLP.
TEST(Moe, EveryOtherBlockHasTheGlobalLayoutOfOneProcess)
{
    TrainRun one = Train("moe-every-one", 1, kMoe + "--moe-every 2 --micro 2");
    TrainRun ep = Train("moe-every-ep2", 2, kMoe + "--moe-every 2 --ep 2");
    size_t floats = GlobalFloats() + size_t(kE - 1) * 8 * kC * kC + size_t(kC) * kE;
    ASSERT_TRUE(Complete(one, floats));
    ASSERT_TRUE(Complete(ep, floats));
    Diff d = Compare(ep, one);
    EXPECT_LE(d.loss_rel, 1e-5);
    EXPECT_LE(d.param_rel, 1e-5);
    EXPECT_LE(d.param_abs, 1e-5);
    for (double sel : StepField(ep, "moe_selections"))
        EXPECT_EQ(sel, 8.0 * kT * 2);
}

// --moe-place coselect:N re-places the experts after every N-th step from the co-selections the
// routers saw (loom's placement), moving each moved expert's parameters and AdamW moments to its
// new rank. Training goes on bit for bit as with the static placement: an expert sees the same
// rows in the same order on any rank, its replicas are reduced in the same order, and with k = 2
// each token's combine and dispatch-backward sums have at most two terms, whose float sum does
// not depend on which rank adds first. Both a relabelling of the same halves (4 experts on 2
// ranks; the placement's rank numbers are its own) and new groups (8 experts, dp 2 x ep 2) move
// experts here.
TEST(Moe, PlacementMovesExpertsAndChangesNoBit)
{
    struct Case {
        const char *name;
        int ranks, experts, every;
    };
    for (const Case &c : {Case{"moe-place-ep2", 2, 4, 3}, Case{"moe-place-dp2xep2", 4, 8, 2}}) {
        std::string args = "--moe " + std::to_string(c.experts) + ":2 --ep 2";
        TrainRun placed =
            Train(c.name, c.ranks, args + " --moe-place coselect:" + std::to_string(c.every));
        TrainRun fixed = Train(std::string(c.name) + "-static", c.ranks, args);
        size_t floats =
            GlobalFloats() + kL * (size_t(c.experts - 1) * 8 * kC * kC + size_t(kC) * c.experts);
        ASSERT_TRUE(Complete(placed, floats));
        ASSERT_TRUE(Complete(fixed, floats));
        EXPECT_TRUE(Compare(placed, fixed).bitwise) << c.name;
        EXPECT_EQ(placed.losses, fixed.losses) << c.name;
        if (c.experts == kE) { // and so within 1e-5 of one process holding every expert
            Diff d = Compare(placed, MoeReference(2));
            EXPECT_LE(d.param_rel, 1e-5);
            EXPECT_LE(d.loss_rel, 1e-5);
        }
        auto moved = StepField(placed, "moe_moved");
        ASSERT_EQ(moved.size(), size_t(kSteps));
        for (int i = 0; i < kSteps; i++) {
            if ((i + 1) % c.every)
                EXPECT_EQ(moved[i], 0) << c.name << " step " << i + 1;
            else
                EXPECT_GT(moved[i], 0) << c.name << " step " << i + 1;
        }
    }
}

// --moe-trace writes each rank's routing, one LMTR v1 record per MoE block and training forward
// (24 bytes, then k int16 ids and k fp16 weights per token and a u32 token id, then the CRC; 64
// bytes of header), and moe_perf replays the file through loom's dispatch and combine.
TEST(Moe, TraceRecordsTheRoutingAndMoePerfReplaysIt)
{
    const char *moe_perf = getenv("MOE_PERF"), *loomrun = getenv("LOOMRUN");
    ASSERT_NE(moe_perf, nullptr) << "MOE_PERF must name bench/moe_perf";
    std::string prefix = TmpDir() + "/moe-trace";
    TrainRun r = Train("moe-trace", 2, kMoe + "--ep 2 --moe-trace " + prefix);
    ASSERT_TRUE(Complete(r, MoeFloats()));
    const size_t tokens = 4 * kT, record = 24 + tokens * (2 * 2 * 2 + 4);
    for (int rank = 0; rank < 2; rank++) {
        std::string file = prefix + ".rank" + std::to_string(rank) + ".lmtr";
        EXPECT_EQ(Slurp(file).size(), 64 + kSteps * kL * record) << file;
    }
    std::string out = TmpDir() + "/moe-trace-replay.log";
    std::string cmd = std::string("timeout 120 ") + loomrun + " -n 2 " + moe_perf + " --trace " +
                      prefix + ".rank0.lmtr -n 1 -w 0 -c 1 > " + out + " 2>&1";
    int st = system(cmd.c_str());
    std::string log = Slurp(out);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log;
    EXPECT_NE(log.find("#wrong total: 0"), std::string::npos) << log;
    EXPECT_NE(log.find("    4   2 "), std::string::npos) << log; // E and k from the trace
}

// --moe-replay forces a recorded routing: ep2 at the default learning rate replaying one
// process's trace of a run at 10 times that rate routes as ep2 at that rate does (the same local
// hits every step), not as it would by itself (other hits from step 2 on, once the faster run's
// router has moved); and a trace of other micro-batches is refused with a message.
TEST(Moe, ReplayForcesTheRecordedRouting)
{
    std::string prefix = TmpDir() + "/moe-replay-src";
    TrainRun src = Train("moe-replay-src", 1, kMoe + "--micro 2 --lr 0.03 --moe-trace " + prefix);
    ASSERT_TRUE(Complete(src, MoeFloats()));
    std::string file = prefix + ".rank0.lmtr";
    TrainRun replayed = Train("moe-replayed", 2, kMoe + "--ep 2 --moe-replay " + file);
    TrainRun fast = Train("moe-replay-fast", 2, kMoe + "--ep 2 --lr 0.03");
    TrainRun own = Train("moe-replay-own", 2, kMoe + "--ep 2");
    ASSERT_TRUE(Complete(replayed, MoeFloats()));
    ASSERT_TRUE(Complete(fast, MoeFloats()));
    ASSERT_TRUE(Complete(own, MoeFloats()));
    auto hr = StepField(replayed, "moe_local_hits"), hf = StepField(fast, "moe_local_hits"),
         ho = StepField(own, "moe_local_hits");
    EXPECT_EQ(hr, hf);
    EXPECT_NE(hr, ho);
    EXPECT_EQ(hr[0], ho[0]); // the first step's routing is the same in all three
    TrainRun wrong = Train("moe-replay-wrong", 1, kMoe + "--micro 4 --moe-replay " + file);
    EXPECT_EQ(wrong.rc, 1);
    EXPECT_NE(wrong.log.find("has no routing of these 32 tokens"), std::string::npos) << wrong.log;
}

// ---- What each mode holds per rank --------------------------------------------------------------

TEST(Distribution, EachModeHoldsItsShare)
{
    const TrainRun &ref = Reference();
    ASSERT_TRUE(Complete(ref));
    auto rm = Mem(ref);
    ASSERT_EQ(rm.size(), 1u);
    const double P = double(GlobalFloats()) * 4, slack = 4.0 * 4 * (kL + 2) * 8;
    EXPECT_EQ(rm[0][0], P);
    EXPECT_EQ(rm[0][1], P);
    EXPECT_EQ(rm[0][2], 2 * P);

    struct Case {
        const char *name, *args;
        double params, grads, opt; // fractions of one process's
    };
    for (const Case &c :
         {Case{"mem-zero1", "--zero 1", 1, 1.5, 0.5}, Case{"mem-zero2", "--zero 2", 1, 0.5, 0.5},
          Case{"mem-zero3", "--zero 3", 0.5, 0.5, 0.5}}) {
        TrainRun r = Train(c.name, 2, c.args);
        ASSERT_TRUE(Complete(r));
        auto m = Mem(r);
        ASSERT_EQ(m.size(), 2u);
        for (int k = 0; k < 2; k++) {
            EXPECT_TRUE(Near(m[k][0], c.params * P, slack))
                << c.name << " rank " << k << " params " << m[k][0];
            EXPECT_TRUE(Near(m[k][1], c.grads * P, slack))
                << c.name << " rank " << k << " grads " << m[k][1];
            EXPECT_TRUE(Near(m[k][2], c.opt * 2 * P, slack))
                << c.name << " rank " << k << " opt " << m[k][2];
            // ZeRO-2/3 hold a whole unit only while it is in use: at most the embedding (kept
            // from its use to the tied head), one block and the final LayerNorm at once, for
            // parameters (ZeRO-3) and for gradients.
            double units = (EmbFloats() + BlockFloats() + 2.0 * kC) * 4;
            if (c.params < 1 || c.grads < 1) {
                EXPECT_GT(m[k][3], 0) << c.name;
                EXPECT_LE(m[k][3], (c.params < 1 ? 2 : 1) * units + slack) << c.name;
            }
        }
    }
    // TP: the split matrices are halved, the embeddings and LayerNorms replicated.
    TrainRun tp = Train("mem-tp2", 2, "--tp 2");
    ASSERT_TRUE(Complete(tp));
    size_t split = size_t(kL) * 12 * kC * kC;
    for (auto &m : Mem(tp))
        EXPECT_EQ(m[5], double(GlobalFloats() - split + split / 2));
    // PP: each stage holds its layers; the last one also the final LayerNorm and wte's copy.
    TrainRun pp = Train("mem-pp2", 2, "--pp 2 --micro 2");
    ASSERT_TRUE(Complete(pp));
    auto pm = Mem(pp);
    ASSERT_EQ(pm.size(), 2u);
    EXPECT_EQ(pm[0][5], double(EmbFloats() + BlockFloats()));
    EXPECT_EQ(pm[1][5], double(BlockFloats() + 2 * kC + size_t(kV) * kC));
    // CP: each rank's activations are those of its half of every sequence.
    TrainRun cp = Train("mem-cp2", 2, "--cp 2");
    ASSERT_TRUE(Complete(cp));
    for (auto &m : Mem(cp))
        EXPECT_EQ(m[4], rm[0][4] / 2);
}

// ---- Which collectives each mode calls (rank 0's counters over 5 steps + 1 validation) ----------

TEST(Collectives, EachModeCallsWhatItMust)
{
    const double units = kL + 2, steps = kSteps;
    struct Want {
        const char *key;
        double calls;
    };
    struct Case {
        const char *name;
        int ranks;
        const char *args;
        std::vector<Want> want;
    };
    const std::vector<Case> cases = {
        {"coll-dp2",
         2,
         "--dp 2",
         // misc: the gradient norm per step (all-reduce) and the loss per step and per
         // validation batch (all-gather, so that it is added in one process's order).
         {{"data.allreduce", steps * units},
          {"misc.allreduce", steps},
          {"misc.allgather", steps + 1}}},
        {"coll-zero1",
         2,
         "--zero 1",
         {{"data.reducescatter", steps * units},
          {"data.allgather", steps * units},
          {"data.allreduce", 0}}},
        {"coll-zero2",
         2,
         "--zero 2 --micro 2",
         {{"data.reducescatter", 2 * steps * units}, {"data.allgather", steps * units}}},
        // ZeRO-3 gathers every unit before its forward and before its backward (and for the
        // validation forward); the embedding stays gathered from its use to the tied head.
        {"coll-zero3",
         2,
         "--zero 3",
         {{"data.allgather", 2 * steps * units + units}, {"data.reducescatter", steps * units}}},
        // TP: one all-reduce per row-parallel layer forward, one per column-parallel input
        // backward: 2 + 2 per block and step; 2 per block for the validation forward.
        {"coll-tp2", 2, "--tp 2", {{"tp.allreduce", steps * 4 * kL + 2 * kL}, {"tp.echo", 0}}},
        {"coll-tp2-echo",
         2,
         "--tp 2 --tp-allreduce echo",
         {{"tp.echo", steps * 2 * kL}, {"tp.allreduce", steps * 2 * kL + 2 * kL}}},
        // PP with 4 micro-batches: the first stage sends 4 activations and receives 4
        // gradients per step; the tied embedding is summed once per step.
        {"coll-pp2",
         2,
         "--pp 2 --micro 4",
         {{"pp.send", steps * 4 + 4}, {"pp.recv", steps * 4}, {"tie.allreduce", steps}}},
        // CP ring: per block, 1 key/value block forward; 2 turns (keys/values and their
        // gradients) backward; 1 for the validation forward.
        {"coll-cp2",
         2,
         "--cp 2",
         {{"cp.send", steps * kL * 5 + kL}, {"cp.recv", steps * kL * 5 + kL}}},
    };
    for (const Case &c : cases) {
        TrainRun r = Train(c.name, c.ranks, c.args);
        ASSERT_TRUE(Complete(r));
        for (const Want &w : c.want)
            EXPECT_EQ(Comm(r, w.key).first, w.calls) << c.name << " " << w.key << "\n" << r.summary;
    }
    // Bytes: plain DP all-reduces every gradient once per step.
    TrainRun dp = Train("coll-dp2-bytes", 2, "--dp 2");
    ASSERT_TRUE(Complete(dp));
    EXPECT_TRUE(
        Near(Comm(dp, "data.allreduce").second, steps * GlobalFloats() * 4, steps * units * 4))
        << Comm(dp, "data.allreduce").second;
}

// ---- Checkpoints
// ---------------------------------------------------------------------------------

TEST(Checkpoint, ResumeEqualsAnUninterruptedRun)
{
    for (const std::string grid : {"", "--zero 3 --dp 2", "--tp 2", "--moe 4:2 --ep 2"}) {
        int n = grid.empty() ? 1 : 2;
        bool moe = grid.find("moe") != std::string::npos;
        std::string tag = grid.empty()                             ? "one"
                          : grid.find("zero") != std::string::npos ? "zero3"
                          : moe                                    ? "ep2"
                                                                   : "tp2";
        std::string ck = TmpDir() + "/ckpt-" + tag;
        TrainRun whole = Train("ck-whole-" + tag, n, grid);
        TrainRun first = Train("ck-first-" + tag, n, grid + " --steps 3 --save " + ck);
        TrainRun rest = Train("ck-rest-" + tag, n, grid + " --resume " + ck);
        ASSERT_TRUE(Complete(whole, moe ? MoeFloats() : GlobalFloats()));
        ASSERT_EQ(first.rc, 0) << first.log;
        ASSERT_EQ(rest.rc, 0) << rest.log;
        ASSERT_EQ(rest.losses.size(), 2u) << rest.log;
        EXPECT_EQ(rest.losses[0], whole.losses[3]) << tag;
        EXPECT_EQ(rest.losses[1], whole.losses[4]) << tag;
        EXPECT_TRUE(Compare(rest, whole).bitwise) << tag;
    }
    // A checkpoint of another layout is refused with a message, not loaded.
    std::string ck = TmpDir() + "/ckpt-one";
    TrainRun wrong = Train("ck-wrong", 1, "--d 64 --resume " + ck);
    EXPECT_NE(wrong.rc, 0);
    EXPECT_NE(wrong.log.find("another model or parallel layout"), std::string::npos) << wrong.log;
}

// ---- Echo on the TP all-reduces -----------------------------------------------------------------

// 200 steps of tp2 (L2 C64 T32, batch 8, learning rate 1e-3) with Echo's 4-bit forward
// all-reduces against the same with fp32 ones, for seeds 1..4: Echo must not end worse than fp32
// by more than fp32 itself varies from seed to seed. The final validation loss (16 batches, 4096
// tokens; validation runs exact all-reduces, so a model spoiled by a bad codec shows) per seed,
// measured with OpenBLAS's Prescott, Haswell and Sandybridge kernels (seeds 1..6):
//   fp32 from seed to seed:              sd 1.4 % (2.88 .. 2.98); the same seed with other
//                                        kernels: within 0.015 %
//   Echo - fp32, the same seed:          mean +0.4 .. +0.5 %, sd 0.5 .. 0.85 %, -0.9 .. +1.3 %;
//                                        mean of seeds 1..4 +0.2 .. +0.4 %, also with Zen's,
//                                        SkylakeX's and Cooperlake's kernels
//   3 codec levels instead of 15:        +20 .. +24 %
//   the decoder's scale halved:          +11 .. +15 %
//   codes read unsigned:                 the loss becomes NaN (null in the log: JsonNum's NAN)
// The check is one-sided (Echo may end better), on the mean over the 4 seeds, with the bound
// 2 %: 1.5 times fp32's seed-to-seed sd, and 3.7 sd of the 4-seed mean (0.85 % / 2) above Echo's
// cost, so a correct Echo passes with any kernels while a broken codec fails by far. (Without
// error feedback Echo costs about 1 % here, -0.8 .. +3.6 %: at 2 layers that is not reliably
// visible; the echo suite's Echo.ResidualStreamErrorDoesNotGrowWithDepth checks the feedback.)
// Not the trainer's default learning rate, 3e-3: 200 steps at this batch size are chaotic there,
// and any perturbation, Echo or only another BLAS kernel rounding differently, ends on another
// trajectory: Echo - fp32 from -4.2 % to +6.6 % per seed (sd 1.8 .. 4.3 %), fp32 from seed to
// seed sd 1.8 .. 2.6 %; the single-seed check once written with a two-sided 2 % bound failed on
// the next CPU.
TEST(Echo, Tp2TrainsAsWellAsFp32OverFourSeeds)
{
    constexpr int kSeeds = 4;
    constexpr double kBound = 0.02;
    const std::string args = "--tp 2 --steps 200 --layers 2 --d 64 --ctx 32 --lr 1e-3 "
                             "--val-batches 16 --seed ";
    auto tail = [](const TrainRun &r) {
        double s = 0;
        for (size_t i = 180; i < 200; i++)
            s += r.losses[i];
        return s / 20;
    };
    double sum = 0;
    for (int seed = 1; seed <= kSeeds; seed++) {
        const std::string a = args + std::to_string(seed), tag = std::to_string(seed);
        TrainRun fp = Train("echo-fp32-" + tag, 2, a);
        TrainRun ec = Train("echo-echo-" + tag, 2, a + " --tp-allreduce echo");
        ASSERT_EQ(fp.rc, 0) << fp.log;
        ASSERT_EQ(ec.rc, 0) << ec.log;
        ASSERT_EQ(fp.losses.size(), 200u);
        ASSERT_EQ(ec.losses.size(), 200u);
        for (double l : ec.losses)
            ASSERT_TRUE(std::isfinite(l) && l < 6.0) << "Echo diverged with seed " << seed;
        EXPECT_LT(tail(fp), 0.75 * fp.losses[0]) << "fp32 did not train with seed " << seed;
        EXPECT_GT(Comm(ec, "tp.echo").first, 0);
        double vf = JsonNum(fp.summary, "val_loss"), ve = JsonNum(ec.summary, "val_loss");
        ASSERT_TRUE(std::isfinite(vf) && std::isfinite(ve)) << fp.summary << "\n" << ec.summary;
        sum += (ve - vf) / vf;
        printf("[ measured ] seed %d, 200 steps tp2: val loss fp32 %.4f echo %.4f (%+.2f%%); "
               "mean loss of the last 20 steps fp32 %.4f echo %.4f\n",
               seed, vf, ve, 100 * (ve - vf) / vf, tail(fp), tail(ec));
    }
    printf("[ measured ] Echo's validation loss against fp32, mean over %d seeds: %+.2f%% (bound "
           "%+.1f%%)\n",
           kSeeds, 100 * sum / kSeeds, 100 * kBound);
    EXPECT_LE(sum / kSeeds, kBound);
}

// ---- The PyTorch reference --------------------------------------------------------------------

TEST(TorchReference, LossAndGradientsMatchInEveryMode)
{
    const char *ref = getenv("TORCH_REF");
    ASSERT_NE(ref, nullptr) << "TORCH_REF must name tests/trainer/torch_ref.py";
    // The first Python that has torch: the PATH's, else the system's (python3-torch).
    std::string py;
    for (const char *cand : {"python3", "/usr/bin/python3"})
        if (py.empty() &&
            system((std::string(cand) + " -c 'import torch' > /dev/null 2>&1").c_str()) == 0)
            py = cand;
    if (py.empty())
        GTEST_SKIP() << "PyTorch is not installed (python3-torch): the torch comparison is skipped";
    std::string d = TmpDir();
    TrainRun init = Train("torch-init", 1, "--steps 0");
    ASSERT_EQ(init.rc, 0) << init.log;
    for (auto [name, n, args] :
         std::vector<std::tuple<std::string, int, std::string>>{{"one", 1, ""},
                                                                {"tp2", 2, "--tp 2"},
                                                                {"cp2", 2, "--cp 2"},
                                                                {"pp2", 2, "--pp 2 --micro 4"},
                                                                {"zero3", 2, "--zero 3"}}) {
        std::string p = d + "/torch-" + name;
        TrainRun r = Train("torch-" + name, n,
                           args + " --steps 1 --dump-grads " + p + ".g --dump-batch " + p + ".b");
        ASSERT_EQ(r.rc, 0) << r.log;
        std::string cmd = py + " " + ref + " --layers 2 --d 32 --heads 4 --ctx 16 " +
                          "--batch 8 --params " + d + "/torch-init.bin --batch-file " + p +
                          ".b --grads " + p + ".g --log " + d + "/torch-" + name + ".json > " + p +
                          ".out 2>&1";
        int st = system(cmd.c_str());
        std::string out = Slurp(p + ".out");
        size_t verdict = out.rfind("torch reference");
        if (verdict != std::string::npos)
            printf("[ measured ] %s: %s", name.c_str(), out.substr(verdict).c_str());
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << name << "\n" << out;
    }
}

// ---- Bad options
// ---------------------------------------------------------------------------------

TEST(Options, BadOptionsGetAClearErrorAndNoCrash)
{
    struct Case {
        int ranks;
        const char *args, *message;
    };
    for (const Case &c : {
             Case{2, "--tp 3", "must equal the 2 ranks"},
             Case{2, "--tp 2 --heads 3 --d 33", "must divide --heads"},
             Case{1, "--heads 5", "not a multiple of --heads"},
             Case{2, "--pp 2 --zero 2", "not supported"},
             Case{1, "--layers 2 --pp 1 --batch 3 --micro 2", "must be a multiple of"},
             Case{2, "--cp 2 --ctx 6", "multiple of 2 * --cp"},
             Case{1, "--data /nonexistent/corpus", "cannot open the corpus"},
             Case{1, "--lr -1", "bad value '-1' for --lr"},
             Case{1, "--zero 7", "--zero 0..3"},
             Case{1, "--schedule zigzag", "bad value 'zigzag' for --schedule"},
             Case{1, "--frobnicate", "unrecognized option"},
             Case{2, "--moe 4:2 --tp 2", "--moe with --tp or --cp is not supported"},
             Case{2, "--ep 2", "--ep > 1, --moe-trace and --moe-replay need --moe"},
             Case{2, "--moe 4:2 --ep 2 --zero 1", "--ep > 1 with --pp or --zero is not supported"},
             Case{1, "--moe 4:5", "bad value '4:5' for --moe"},
             Case{2, "--moe 4:2 --ep 4", "--ep 4 must divide the data-parallel degree 2"},
             Case{4, "--moe 2:1 --ep 4", "--ep 4 is larger than the 2 experts"},
             Case{1, "--moe 4:2 --moe-mode fast", "bad value 'fast' for --moe-mode"},
             Case{1, "--moe 4:2 --moe-place often", "bad value 'often' for --moe-place"},
             Case{2, "--moe 4:2 --pp 2 --moe-place coselect", "--moe-place coselect needs --moe"},
         }) {
        TrainRun r = Train("bad", c.ranks, c.args);
        EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.log;
        EXPECT_NE(r.log.find(c.message), std::string::npos) << c.args << "\n" << r.log;
    }
    // A corpus too small for one sequence.
    std::string tiny = TmpDir() + "/tiny.txt";
    FILE *f = fopen(tiny.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("too short", f);
    fclose(f);
    TrainRun r = Train("bad-tiny", 1, "--data " + tiny);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.log.find("too small"), std::string::npos) << r.log;
}

} // namespace

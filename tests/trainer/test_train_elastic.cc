// SPDX-License-Identifier: Apache-2.0
//
// test_train_elastic.cc - loom-train --elastic: a rank of a dp4 run kills itself in the middle of
// a step's gradient reduction (--elastic-kill-rank/-step) under loomrun --keep-going; the three
// survivors shrink the world, rebuild the grid as dp3, restore the state and finish. Their
// remaining steps and final parameters must equal, bit for bit, a clean dp3 run resumed from the
// state they restored: in memory under plain DP (a checkpoint an uninterrupted dp4 run saved at
// that step), the layout-independent checkpoint under ZeRO-1 (written by dp4, read by dp3), the
// initial state under ZeRO-3 without a checkpoint. Also the "elastic" log event, the counters
// and memory after the shrink (the resumed run's), no hang, and the refusals: a TP grid losing a
// rank, a batch the new dp does not divide, options --elastic does not support.

#include "train_run.h"

#include <chrono>
#include <csignal>

namespace {

// One step line of the log.
struct Step {
    int step;
    double loss;
};

// A run that may lose a rank: its log lines in order, split by kind.
struct ElasticRun {
    int rc = -1;
    double wall_s = 0;
    std::string log, summary;
    std::vector<Step> steps;         // every step line, repeated steps included
    std::vector<std::string> events; // "elastic" lines
    std::vector<float> params;
    TrainRun plain; // the same as a TrainRun (losses: the steps after the last event)
};

ElasticRun RunElastic(const std::string &name, int nranks, const std::string &args)
{
    ElasticRun r;
    const char *loomrun = getenv("LOOMRUN"), *train = getenv("LOOM_TRAIN");
    if (!loomrun || !train) {
        ADD_FAILURE() << "LOOMRUN and LOOM_TRAIN must name the programs";
        return r;
    }
    const std::string d = TmpDir() + "/" + name;
    // --keep-going: a dead rank must not take the survivors down; --timeout: no hang passes.
    const std::string cmd = std::string("timeout 150 ") + loomrun +
                            " --keep-going --timeout 120 -n " + std::to_string(nranks) + " " +
                            train + " " + kModel + " --steps " + std::to_string(kSteps) +
                            " --quiet --log-json " + d + ".json --dump-params " + d + ".bin " +
                            args + " > " + d + ".log 2>&1";
    const auto t0 = std::chrono::steady_clock::now();
    const int st = system(cmd.c_str());
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.log = Slurp(d + ".log");
    std::istringstream js(Slurp(d + ".json"));
    for (std::string line; std::getline(js, line);) {
        if (line.find("\"summary\"") != std::string::npos) {
            r.summary = line;
        } else if (line.find("\"elastic\"") != std::string::npos) {
            r.events.push_back(line);
            r.plain.losses.clear();
        } else if (line.find("\"step\"") != std::string::npos) {
            r.steps.push_back({int(JsonNum(line, "step")), JsonNum(line, "loss")});
            r.plain.losses.push_back(r.steps.back().loss);
        }
    }
    const std::string bin = Slurp(d + ".bin");
    r.params.resize(bin.size() / sizeof(float));
    if (!r.params.empty())
        memcpy(r.params.data(), bin.data(), r.params.size() * sizeof(float));
    r.plain.rc = r.rc, r.plain.log = r.log, r.plain.summary = r.summary, r.plain.params = r.params;
    r.plain.name = name;
    return r;
}

std::string JsonStr(const std::string &line, const std::string &key)
{
    const std::string tag = "\"" + key + "\":\"";
    size_t p = line.find(tag);
    if (p == std::string::npos)
        return "";
    p += tag.size();
    return line.substr(p, line.find('"', p) - p);
}

// Steps [from, to] of run r, in order, each once.
::testing::AssertionResult StepsAre(const ElasticRun &r, const std::vector<int> &want)
{
    std::vector<int> got;
    for (const Step &s : r.steps)
        got.push_back(s.step);
    if (got == want)
        return ::testing::AssertionSuccess();
    auto str = [](const std::vector<int> &v) {
        std::string o;
        for (int x : v)
            o += std::to_string(x) + " ";
        return o;
    };
    return ::testing::AssertionFailure()
           << "steps logged: " << str(got) << "want " << str(want) << "\n"
           << r.log;
}

// The run lost rank `victim` to its own SIGKILL and the survivors finished: loomrun reports the
// victim only, and the run ended well inside the timeout.
void ExpectSurvived(const ElasticRun &r, int victim)
{
    EXPECT_EQ(r.rc, 128 + SIGKILL) << r.log; // loomrun --keep-going: the victim's status
    EXPECT_NE(r.log.find("loomrun: rank " + std::to_string(victim) + " (pid "), std::string::npos)
        << r.log;
    EXPECT_NE(r.log.find("killed by signal SIGKILL"), std::string::npos) << r.log;
    EXPECT_EQ(r.log.find("exited with status"), std::string::npos) << r.log;
    EXPECT_LT(r.wall_s, 60) << r.log;
    ASSERT_FALSE(r.summary.empty()) << r.log;
    EXPECT_EQ(JsonNum(r.summary, "ranks"), 3);
    EXPECT_EQ(JsonNum(r.summary, "dp"), 3);
    EXPECT_EQ(JsonNum(r.summary, "recoveries"), 1);
    EXPECT_EQ(r.params.size(), GlobalFloats());
}

// The single "elastic" event: the failed step, the worlds, the lost rank, the path and the step
// the run went on from.
void ExpectEvent(const ElasticRun &r, int failed, int lost, const std::string &path, int resume)
{
    ASSERT_EQ(r.events.size(), 1u) << r.log;
    const std::string &e = r.events[0];
    EXPECT_EQ(JsonNum(e, "failed_step"), failed) << e;
    EXPECT_EQ(JsonNum(e, "old_world"), 4) << e;
    EXPECT_EQ(JsonNum(e, "new_world"), 3) << e;
    EXPECT_EQ(JsonNum(e, "dp"), 3) << e;
    EXPECT_NE(e.find("\"lost\":[" + std::to_string(lost) + "]"), std::string::npos) << e;
    EXPECT_EQ(JsonStr(e, "path"), path) << e;
    EXPECT_EQ(JsonNum(e, "resume_step"), resume) << e;
    const double rec = JsonNum(e, "recovery_s"), shrink = JsonNum(e, "shrink_s");
    EXPECT_GT(rec, 0) << e;
    EXPECT_LE(shrink, rec) << e;
    EXPECT_LT(rec, 10) << e;
    printf("[ measured ] recovery %.1f ms (shrink %.1f ms), path %s\n", rec * 1e3, shrink * 1e3,
           path.c_str());
}

// After the recovery the elastic run is the resumed clean dp3 run: the same losses and final
// parameters bit for bit, the same counters and memory per rank.
void ExpectSameAsResumed(const ElasticRun &el, const ElasticRun &clean, size_t steps_after)
{
    ASSERT_EQ(clean.rc, 0) << clean.log;
    ASSERT_EQ(el.plain.losses.size(), steps_after) << el.log;
    ASSERT_EQ(clean.plain.losses.size(), steps_after) << clean.log;
    for (size_t i = 0; i < steps_after; i++)
        EXPECT_EQ(memcmp(&el.plain.losses[i], &clean.plain.losses[i], sizeof(double)), 0)
            << "step " << kSteps - steps_after + i + 1 << ": elastic " << Exact(el.plain.losses[i])
            << ", resumed dp3 " << Exact(clean.plain.losses[i]);
    Diff d = Compare(el.plain, clean.plain);
    printf("[ measured ] elastic vs resumed dp3: loss rel %.2e  params rel %.2e%s\n", d.loss_rel,
           d.param_rel, d.bitwise ? "  (bitwise)" : "");
    EXPECT_TRUE(d.bitwise);
    for (const char *k : {"data.allreduce", "data.reducescatter", "data.allgather",
                          "misc.allreduce", "misc.allgather"}) {
        EXPECT_EQ(Comm(el.plain, k), Comm(clean.plain, k)) << k;
    }
    EXPECT_EQ(Mem(el.plain), Mem(clean.plain));
    EXPECT_EQ(Mem(el.plain).size(), 3u);
}

const std::string kBatch = " --batch 12"; // divisible by dp 4 and dp 3

// Plain DP: the survivors redo the failed step from the state in memory.
TEST(Elastic, PlainDpGoesOnFromMemory)
{
    ElasticRun el = RunElastic("dp4-kill2", 4,
                               kBatch + " --elastic --elastic-kill-rank 2 --elastic-kill-step 4");
    ExpectSurvived(el, 2);
    ExpectEvent(el, 4, 2, "in-memory", 3);
    EXPECT_TRUE(StepsAre(el, {1, 2, 3, 4, 5}));
    // What the survivors held: the state after step 3, as an uninterrupted dp4 run saves it.
    const std::string ck = TmpDir() + "/dp4-step3";
    ElasticRun upto = RunElastic("dp4-upto3", 4, kBatch + " --elastic --steps 3 --save " + ck);
    ASSERT_EQ(upto.rc, 0) << upto.log;
    ASSERT_TRUE(StepsAre(upto, {1, 2, 3}));
    for (int i = 0; i < 3; i++)
        EXPECT_EQ(memcmp(&upto.steps[i].loss, &el.steps[i].loss, sizeof(double)), 0) << i;
    // --elastic changes nothing while no rank dies.
    ElasticRun plain = RunElastic("dp4-plain3", 4, kBatch + " --steps 3");
    ASSERT_EQ(plain.rc, 0) << plain.log;
    EXPECT_TRUE(Compare(plain.plain, upto.plain).bitwise);
    ElasticRun clean = RunElastic("dp3-from3", 3, kBatch + " --resume " + ck);
    EXPECT_TRUE(StepsAre(clean, {4, 5}));
    ExpectSameAsResumed(el, clean, 2);
}

// ZeRO-1: the state is sharded over four ranks, so the survivors reload the last
// layout-independent checkpoint (step 2, written by dp4) as dp3 and redo step 3 onwards; rank 0,
// the checkpoint writer and logger, is the one that dies.
TEST(Elastic, Zero1ReloadsTheCheckpointWrittenByDp4)
{
    const std::string ck = TmpDir() + "/z1-el";
    ElasticRun el = RunElastic("z1-kill0", 4,
                               kBatch + " --zero 1 --elastic --save " + ck +
                                   " --save-every 2 --elastic-kill-rank 0 --elastic-kill-step 4");
    ExpectSurvived(el, 0);
    ExpectEvent(el, 4, 0, "checkpoint", 2);
    EXPECT_TRUE(StepsAre(el, {1, 2, 3, 3, 4, 5}));
    // The same batch of step 3 on dp4 and dp3: equal but for the order of the sums.
    EXPECT_LE(std::fabs(el.steps[2].loss - el.steps[3].loss) / el.steps[2].loss, 1e-5);
    // The checkpoint the survivors reloaded, from an uninterrupted dp4 run.
    const std::string ck2 = TmpDir() + "/z1-step2";
    ElasticRun upto =
        RunElastic("z1-upto2", 4, kBatch + " --zero 1 --elastic --steps 2 --save " + ck2);
    ASSERT_EQ(upto.rc, 0) << upto.log;
    ElasticRun clean = RunElastic("z1-dp3-from2", 3, kBatch + " --zero 1 --resume " + ck2);
    EXPECT_TRUE(StepsAre(clean, {3, 4, 5}));
    ExpectSameAsResumed(el, clean, 3);
    // The elastic run's own checkpoint holds its final state: a dp2 run resumes it.
    ElasticRun again = RunElastic("z1-dp2-after", 2, kBatch + " --zero 1 --steps 6 --resume " + ck);
    ASSERT_EQ(again.rc, 0) << again.log;
    EXPECT_TRUE(StepsAre(again, {6}));
}

// ZeRO-3 without --save: nothing to reload, so the survivors start again from the initial state
// (step 0) as dp3, which is a clean dp3 run.
TEST(Elastic, Zero3WithoutCheckpointStartsAgain)
{
    ElasticRun el = RunElastic(
        "z3-kill1", 4, kBatch + " --zero 3 --elastic --elastic-kill-rank 1 --elastic-kill-step 3");
    ExpectSurvived(el, 1);
    ExpectEvent(el, 3, 1, "initial", 0);
    EXPECT_TRUE(StepsAre(el, {1, 2, 1, 2, 3, 4, 5}));
    ElasticRun clean = RunElastic("z3-dp3", 3, kBatch + " --zero 3");
    ExpectSameAsResumed(el, clean, 5);
}

// A survivor that cannot go on says why and stops; every survivor does, without a hang.
void ExpectRefused(const ElasticRun &r, int victim, const std::string &why)
{
    EXPECT_EQ(r.rc, 128 + SIGKILL) << r.log;
    EXPECT_LT(r.wall_s, 60) << r.log;
    EXPECT_TRUE(r.events.empty()) << r.log;
    int said = 0, exited = 0;
    for (size_t p = 0; (p = r.log.find("elastic: cannot go on without rank " +
                                           std::to_string(victim) + " (world 4 -> 3): " + why,
                                       p)) != std::string::npos;
         p++)
        said++;
    for (size_t p = 0; (p = r.log.find(") exited with status 3", p)) != std::string::npos; p++)
        exited++;
    EXPECT_EQ(said, 3) << r.log;
    EXPECT_EQ(exited, 3) << r.log;
}

TEST(Elastic, RefusesWhatItCannotRebuild)
{
    // tp2 x dp2 losing a rank: its TP partner would have to join another group.
    ExpectRefused(RunElastic("tp2dp2-kill1", 4,
                             "--tp 2 --elastic --elastic-kill-rank 1 --elastic-kill-step 2"),
                  1, "the grid has tp 2 x pp 1 x cp 1, so a tensor-, pipeline- or");
    // batch 8 over dp 3
    ExpectRefused(RunElastic("dp4-b8-kill3", 4,
                             "--zero 2 --elastic --elastic-kill-rank 3 --elastic-kill-step 2"),
                  3, "--batch 8 is not a multiple of the new dp 3 x --micro 1");
    // options --elastic does not take, at parse time
    const std::pair<std::string, std::string> bad[] = {
        {"--elastic --optim muon", "--elastic with --optim muon is not supported"},
        {"--elastic --moe 4:2", "--elastic with --moe is not supported"},
        {"--elastic-kill-step 2", "--elastic-kill-rank and --elastic-kill-step need --elastic"},
        {"--save-every 2", "--save-every needs --save PREFIX"},
        {"--elastic --diloco 2", "--elastic with --diloco is not supported"},
        {"--elastic --pp 2 --micro 2 --pp-schedule dualpipe",
         "--elastic with --pp-schedule dualpipe is not"},
    };
    for (const auto &b : bad) {
        ElasticRun r = RunElastic("refused", 1, b.first);
        EXPECT_EQ(r.rc, 2) << b.first << "\n" << r.log;
        EXPECT_NE(r.log.find("loom-train: " + b.second), std::string::npos) << r.log;
    }
}

} // namespace

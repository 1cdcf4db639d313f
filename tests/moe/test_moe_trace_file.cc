// SPDX-License-Identifier: Apache-2.0
//
// test_moe_trace_file.cc - LOOM_MOE_TRACE_FILE on forked ranks (2 ranks, shm; rank 1 has no
// tokens): every layout of two plans appends its routing to the rank's own file (%r), read back
// with the trace reader equal to the ids and weights (fp16) given, steps and layers as documented;
// LOOM_MOE_TRACE_EVERY=2 records every other layout; a file that cannot be written WARNs once
// and no layout fails; a name without %r on two ranks writes nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "loom_moe.h"
#include "moe_ref.h"
#include "mp_fixture.h"

extern "C" {
#include "dtype.h"
#include "moe_trace.h"
}

using moetest::Batch;
using moetest::Shape;

namespace {

constexpr int kRanks = 2;

const Shape kShapes[] = {{6, 3, 4, loomFloat32, true, false, 51},
                         {6, 3, 4, loomFloat32, false, false, 52},
                         {6, 3, 4, loomFloat32, true, false, 53},
                         {6, 3, 4, loomFloat32, false, false, 54},
                         {6, 3, 4, loomFloat32, true, false, 55}};

std::string TracePath(int rank)
{
    return loomtest::RunDir() + "/moe." + std::to_string(rank) + ".lmtr";
}

// Layouts of kShapes[i] for i in order, each on plan A except the second, which goes to plan B
// (created second: layer 1).
void Layouts(loomComm_t comm, int rank)
{
    loomMoeConfig_t cfg = moetest::Config(kShapes[0], {}, false, loomMoeModeDedup);
    loomMoePlan_t a = nullptr, b = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&a, &cfg, comm));
    XT_CHECK_LOOM(loomMoePlanCreate(&b, &cfg, comm));
    for (size_t i = 0; i < std::size(kShapes); i++) {
        Batch batch = moetest::MakeBatch(kShapes[i], rank, kRanks);
        loomMoeHandle_t h = nullptr;
        XT_CHECK_LOOM(loomMoeLayout(i == 1 ? b : a, batch.topk.data(), batch.weights.data(),
                                    batch.tokens, &h, nullptr));
        XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    }
    XT_CHECK_LOOM(loomMoePlanDestroy(a));
    XT_CHECK_LOOM(loomMoePlanDestroy(b));
}

// The records of layouts `want` (indices into kShapes), in order, with their step and layer.
void CheckTrace(int rank, const std::vector<size_t> &want)
{
    loom_moe_trace_t *tr = nullptr;
    XT_CHECK_LOOM(loom_moe_trace_read(TracePath(rank).c_str(), &tr));
    XT_CHECK_EQ(tr->header.num_experts, 6u);
    XT_CHECK_EQ(tr->header.top_k, 3u);
    XT_CHECK_EQ(tr->header.flags, (uint32_t)LOOM_MOE_TRACE_WEIGHTS);
    XT_CHECK_EQ(tr->header.nranks, (uint32_t)kRanks);
    XT_CHECK_EQ(tr->header.rank, (uint32_t)rank);
    XT_CHECK_EQ(tr->num_batches, want.size());
    for (size_t n = 0; n < want.size(); n++) {
        size_t i = want[n];
        loomtest::SetContext("record " + std::to_string(n) + ", layout " + std::to_string(i));
        const loom_moe_trace_batch_t &rec = tr->batches[n];
        Batch batch = moetest::MakeBatch(kShapes[i], rank, kRanks);
        // Plan A's layouts are its steps 0, 1, 2, 3 (layouts 0, 2, 3, 4); plan B's one is step 0.
        XT_CHECK_EQ(rec.layer, i == 1 ? 1u : 0u);
        XT_CHECK_EQ(rec.step, (uint32_t)(i == 1 ? 0 : i == 0 ? 0 : i - 1));
        XT_CHECK_EQ(rec.num_tokens, batch.tokens);
        for (size_t j = 0; j < batch.topk.size(); j++) {
            XT_CHECK_EQ(rec.topk[j], batch.topk[j]);
            float w = batch.topk[j] < 0 ? 0.0f : loom_f16_decode(loom_f16_encode(batch.weights[j]));
            XT_CHECK_EQ(rec.weight[j], w);
        }
    }
    loom_moe_trace_free(tr);
}

void EveryLayout(int rank, int, loomComm_t comm)
{
    Layouts(comm, rank);
    CheckTrace(rank, {0, 1, 2, 3, 4});
}

void EveryOther(int rank, int, loomComm_t comm)
{
    Layouts(comm, rank);
    // Plan A records its steps 0 and 2 (layouts 0 and 3), plan B its step 0 (layout 1).
    CheckTrace(rank, {0, 1, 3});
}

size_t LogLinesWith(int rank, const std::string &word)
{
    std::ifstream log(loomtest::RunDir() + "/rank" + std::to_string(rank) + ".log");
    size_t n = 0;
    for (std::string line; std::getline(log, line);)
        n += line.find(word) != std::string::npos;
    return n;
}

void Unwritable(int rank, int, loomComm_t comm)
{
    Layouts(comm, rank);
    XT_CHECK_EQ(LogLinesWith(rank, "stops tracing"), 2u); // once per plan, not per layout
    XT_CHECK_EQ(LogLinesWith(rank, "cannot open"), 2u);
}

void NoRankInName(int rank, int, loomComm_t comm)
{
    Layouts(comm, rank);
    struct stat st;
    XT_CHECK(stat((loomtest::RunDir() + "/moe.lmtr").c_str(), &st) != 0);
    XT_CHECK_EQ(LogLinesWith(rank, "has no %r"), 2u);
}

loomtest::RunOptions TraceOptions(const std::string &name, const char *every)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}};
    opts.rank_env = [name, every](int) {
        loomtest::EnvList env = {{"LOOM_MOE_TRACE_FILE", loomtest::RunDir() + "/" + name}};
        if (every != nullptr)
            env.push_back({"LOOM_MOE_TRACE_EVERY", every});
        return env;
    };
    return opts;
}

TEST(MoeTraceFile, EveryLayoutIsRecorded)
{
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, EveryLayout, TraceOptions("moe.%r.lmtr", nullptr)));
}

TEST(MoeTraceFile, EveryTwoRecordsEveryOtherLayout)
{
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, EveryOther, TraceOptions("moe.%r.lmtr", "2")));
}

TEST(MoeTraceFile, FailuresWarnOnceAndNeverFailTheLayout)
{
    XT_ASSERT_RUN(
        loomtest::RunRanks(kRanks, Unwritable, TraceOptions("missing/moe.%r.lmtr", nullptr)));
    XT_ASSERT_RUN(loomtest::RunRanks(kRanks, NoRankInName, TraceOptions("moe.lmtr", nullptr)));
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_fault_shard.cc - S16: SIGKILL of one rank inside loomShardReduceGrads with agree = 1,
// over shm and tcp. The victim (rank 3) dies on reading the middle of its gradient buffer while
// the uneven reduce-scatters of the owner layout send it. Every survivor must return
// loomRemoteError within 2 s naming rank 3 (from the reduce-scatter, or, on a survivor whose
// own block arrived whole before the victim died, from the agreement that follows it), so that
// no survivor steps: its parameters and optimizer state stay bitwise what they were. Nothing
// may stay in /dev/shm. Run by meson's 'fault' suite.

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "loom_shard.h"
#include "mp_fixture.h"
#include "tripwire.h"

namespace {

constexpr int kRanks = 4;
constexpr int kVictim = 3;

void KillBody(int rank, loomComm_t comm)
{
    std::vector<loomShardParam_t> list;
    for (int i = 0; i < 4; i++)
        list.push_back({256, 256, loomShardMatrix, -1, 0});
    list.push_back({4096, 1, loomShardElementwise, -1, 0});
    loomShardConfig_t sc = LOOM_SHARD_CONFIG_INITIALIZER;
    sc.agree = 1;
    loomShardPlan_t plan = nullptr;
    XT_CHECK_LOOM(loomShardPlanCreate(&plan, list.data(), (int)list.size(), kRanks, &sc));
    XT_CHECK_LOOM(loomShardPlanVerify(plan, comm, nullptr));
    loomShardStats_t st;
    XT_CHECK_LOOM(loomShardStats(plan, &st));
    const size_t N = st.total_elems, bytes = N * sizeof(float);
    loomtest::TripBuffer grads(bytes);
    float *g = reinterpret_cast<float *>(grads.data());
    std::vector<float> params(N), state(loomShardStateElems(plan, rank), 0.25f);
    for (size_t i = 0; i < N; i++) {
        g[i] = static_cast<float>((i + (size_t)rank) % 13) * 0.125f;
        params[i] = static_cast<float>(i % 7) * 0.5f;
    }
    const std::vector<float> params0 = params, state0 = state;
    if (rank == kVictim) {
        usleep(20 * 1000); /* let the others enter the reduce-scatters first */
        grads.Arm(bytes / 2, SIGKILL);
    }
    const double t0 = loomtest::NowSec();
    const loomResult_t r =
        loomShardReduceGrads(plan, -1, g, g, loomFloat32, loomAvg, comm, nullptr);
    const double secs = loomtest::NowSec() - t0;
    XT_CHECK_MSG(rank != kVictim, "the victim's ReduceGrads returned instead of dying");
    const std::string msg = loomGetLastError(nullptr);
    fprintf(stderr, "rank %d: ReduceGrads returned %s after %.1f ms: %s\n", rank,
            loomtest::Show(r).c_str(), secs * 1e3, msg.c_str());
    if (r == loomSuccess) {
        loomMuonConfig_t cfg = LOOM_MUON_CONFIG_INITIALIZER;
        XT_CHECK_LOOM(loomShardStep(plan, rank, -1, params.data(), g, state.data(),
                                    LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL, &cfg, nullptr,
                                    nullptr));
    }
    XT_CHECK_LOOM_RES(r, loomRemoteError);
    XT_CHECK_MSG(secs < 2.0, "detection took " + std::to_string(secs) + " s");
    XT_CHECK_NAMES_RANK(kVictim, "");
    XT_CHECK_MSG(msg.find("reducescatterv") != std::string::npos ||
                     msg.find("allreduce") != std::string::npos,
                 "the error names neither the reduce-scatter nor the agreement: " + msg);
    XT_CHECK(std::memcmp(params.data(), params0.data(), N * sizeof(float)) == 0);
    XT_CHECK(std::memcmp(state.data(), state0.data(), state.size() * sizeof(float)) == 0);
    XT_CHECK_LOOM(loomShardPlanDestroy(plan));
}

class KillMidShardReduce : public ::testing::TestWithParam<std::string> {};

TEST_P(KillMidShardReduce, SurvivorsFailTogetherAndDoNotStep)
{
    XT_ASSERT_RUN(
        loomtest::RunWithVictim(GetParam(), kRanks, kVictim, {},
                                [](int rank, int, loomComm_t comm) { KillBody(rank, comm); }));
}

INSTANTIATE_TEST_SUITE_P(Layouts, KillMidShardReduce, ::testing::Values("shm", "tcp"),
                         [](const auto &info) { return info.param; });

} // namespace

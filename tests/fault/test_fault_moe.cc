// SPDX-License-Identifier: Apache-2.0
//
// test_fault_moe.cc - SIGKILL of one rank in the middle of an MoE dispatch (loom_moe.h), over
// shm, over tcp and per host (two modelled hosts of two ranks). The victim (rank 3) dies while
// it packs its rows, halfway through its tokens, after the layout every rank completed: its
// peers are already in, or on their way to, the dispatch's exchange. Every survivor must return
// loomRemoteError within 2 s naming rank 3, write nothing into its receive buffer, refuse the
// combine on the same handle and later calls on the communicator, and release its handle and
// plan; nothing may stay in /dev/shm. Run by meson's 'fault' suite.

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "loom_moe.h"
#include "mp_fixture.h"
#include "tripwire.h"

namespace {

constexpr int kRanks = 4;
constexpr int kVictim = 3;
constexpr int kExperts = 8, kTopK = 2;
constexpr size_t kHidden = 1024, kTokens = 256; // 1 MiB of float32 rows per rank
constexpr unsigned char kCanary = 0xa5;

void KillBody(int rank, loomComm_t comm)
{
    loomMoeConfig_t cfg = LOOM_MOE_CONFIG_INITIALIZER;
    cfg.num_experts = kExperts;
    cfg.top_k = kTopK;
    cfg.hidden = kHidden;
    cfg.datatype = loomFloat32;
    loomMoePlan_t plan = nullptr;
    XT_CHECK_LOOM(loomMoePlanCreate(&plan, &cfg, comm));
    // Token t picks experts t and t + 1 (mod E): every rank sends rows to its neighbours.
    std::vector<int32_t> topk(kTokens * kTopK);
    std::vector<float> weights(kTokens * kTopK, 0.5f);
    for (size_t t = 0; t < kTokens; t++) {
        topk[t * kTopK] = static_cast<int32_t>((t + static_cast<size_t>(rank)) % kExperts);
        topk[t * kTopK + 1] = static_cast<int32_t>((t + static_cast<size_t>(rank) + 1) % kExperts);
    }
    loomMoeHandle_t h = nullptr;
    loomMoeLayoutInfo_t info = LOOM_MOE_LAYOUT_INFO_INITIALIZER;
    XT_CHECK_LOOM(loomMoeLayout(plan, topk.data(), weights.data(), kTokens, &h, &info));
    const size_t x_bytes = kTokens * kHidden * sizeof(float);
    loomtest::TripBuffer x(x_bytes);
    for (size_t i = 0; i < kTokens * kHidden; i++)
        reinterpret_cast<float *>(x.data())[i] = static_cast<float>(i % 17);
    std::vector<unsigned char> recv(info.recv_slots * kHidden * sizeof(float), kCanary);
    if (rank == kVictim) {
        usleep(20 * 1000); /* let the others enter the dispatch first */
        x.Arm(x_bytes / 2, SIGKILL);
    }
    XT_CHECK_SURVIVOR_OF(rank, kVictim, "dispatch", "alltoallv",
                         [&] { return loomMoeDispatch(h, x.data(), recv.data()); });
    for (size_t i = 0; i < recv.size(); i++)
        XT_CHECK_MSG(recv[i] == kCanary, "recv_x was written at byte " + std::to_string(i));
    std::vector<float> out(info.recv_slots * kHidden), y(kTokens * kHidden);
    XT_CHECK_MSG(loomMoeCombine(h, out.data(), y.data()) != loomSuccess,
                 "a combine after the dead rank succeeded");
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage);
    XT_CHECK_LOOM(loomMoeHandleDestroy(h));
    XT_CHECK_LOOM(loomMoePlanDestroy(plan));
}

class KillMidMoeDispatch : public ::testing::TestWithParam<std::string> {};

TEST_P(KillMidMoeDispatch, SurvivorsFailFastNamingTheDeadRank)
{
    XT_ASSERT_RUN(
        loomtest::RunWithVictim(GetParam(), kRanks, kVictim, {},
                                [](int rank, int, loomComm_t comm) { KillBody(rank, comm); }));
}

INSTANTIATE_TEST_SUITE_P(Layouts, KillMidMoeDispatch, ::testing::Values("shm", "tcp", "hosts"),
                         [](const auto &info) { return info.param; });

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_fault_echo.cc - SIGKILL of one rank in the middle of an Echo all-reduce, flat over shm
// and over tcp and per host (two modelled hosts of two ranks). The victim (rank 3) dies at a
// tripwire halfway through its input, after it has sent the first segments, so its peers hold
// part of its data when it dies. Every survivor must return loomRemoteError within 2 s, name
// rank 3 and the operation, leave its send buffer untouched and refuse later calls; nothing may
// stay in /dev/shm. Run by meson's 'fault' suite.

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "loom_echo.h"
#include "mp_fixture.h"
#include "tripwire.h"

namespace {

constexpr int kRanks = 4;
constexpr int kVictim = 3;
constexpr size_t kCount = 4 * 2048 * 16; // 16 segments of 2048 values per owner chunk

void KillBody(int rank, loomComm_t comm)
{
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    if (rank == kVictim)
        usleep(20 * 1000); /* let the others leave the barrier first */
    loomtest::TripBuffer send(kCount * 4);
    float *x = reinterpret_cast<float *>(send.data());
    for (size_t i = 0; i < kCount; i++)
        x[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank)) % 13) - 6.0f;
    const std::vector<unsigned char> before(send.data(), send.data() + kCount * 4);
    std::vector<float> recv(kCount);
    if (rank == kVictim)
        send.Arm(kCount * 2, SIGKILL); /* half of its input */
    XT_CHECK_SURVIVOR_OF(rank, kVictim, "echo", "echo allreduce", [&] {
        return loomEchoAllReduce(x, recv.data(), kCount, loomFloat32, comm, nullptr, nullptr);
    });
    XT_CHECK_MSG(memcmp(before.data(), send.data(), before.size()) == 0,
                 "the send buffer was written");
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage);
}

class KillMidEcho : public ::testing::TestWithParam<std::string> {};

TEST_P(KillMidEcho, SurvivorsFailFastNamingTheDeadRank)
{
    XT_ASSERT_RUN(
        loomtest::RunWithVictim(GetParam(), kRanks, kVictim, {{"LOOM_ECHO_SEGMENT", "2048"}},
                                [](int rank, int, loomComm_t comm) { KillBody(rank, comm); }));
}

INSTANTIATE_TEST_SUITE_P(Layouts, KillMidEcho, ::testing::Values("shm", "tcp", "hosts"),
                         [](const auto &info) { return info.param; });

} // namespace

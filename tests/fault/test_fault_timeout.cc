// SPDX-License-Identifier: Apache-2.0
//
// test_fault_timeout.cc - the peer that is alive but silent, and the one that is only slow.
// A rank stopped by SIGSTOP in the middle of an all-reduce, or at the head of a send/recv chain
// (where the last rank waits on a live peer that waits on the stopped one), must make every
// other rank return loomTimeout no earlier than LOOM_TIMEOUT_MS (1.5 s) and within a second
// after it, naming the stalled rank; the harness kills the stopped rank afterwards. A rank that
// joins 0.8 s late under a 2 s timeout is not declared dead. A timeout writes the dump of
// LOOM_DUMP_ON_TIMEOUT (one JSON object) and, at LOOM_DEBUG=INFO, logs it. Run by meson's
// 'fault' suite.

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fault_util.h"
#include "loom.h"
#include "mp_fixture.h"
#include "tripwire.h"
#include "verify.h"

namespace {

using loomtest::TripBuffer;
using Bytes = std::vector<unsigned char>;

constexpr int kRanks = 3;
constexpr int kStopped = 2;
constexpr int kTimeoutMs = 1500;
constexpr size_t kChunk = 65536;
constexpr size_t kMsg = 1u << 20;

std::string ReadFile(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// ---- SIGSTOP --------------------------------------------------------------------------------

enum class Shape { AllReduce, Chain };

void StopBody(Shape shape, int rank, loomComm_t comm)
{
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    const bool victim = rank == kStopped;
    loomResult_t r;
    double t0;
    std::string op;
    if (shape == Shape::AllReduce) {
        op = "allreduce";
        const size_t count = kRanks * 4 * (kChunk / 4);
        TripBuffer send(count * 4);
        loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, rank, 3, 0, count);
        Bytes recv(count * 4);
        if (victim)
            send.Arm(2 * kChunk, SIGSTOP);
        t0 = loomtest::NowSec();
        r = loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    } else { // 2 -> 1 -> 0: rank 0 waits on rank 1, which waits on the stopped rank 2
        op = "send/recv";
        TripBuffer buf(kMsg);
        if (victim) {
            loomtest::FillPattern(buf.data(), kMsg, rank, 1);
            buf.Arm(kMsg / 2, SIGSTOP);
            r = loomSend(buf.data(), kMsg, loomUint8, rank - 1, comm, nullptr);
            loomtest::Fail(__FILE__, __LINE__, "the stopped rank's send returned");
        }
        t0 = loomtest::NowSec();
        r = loomRecv(buf.data(), kMsg, loomUint8, rank + 1, comm, nullptr);
    }
    const double s = loomtest::NowSec() - t0;
    if (victim)
        loomtest::Fail(__FILE__, __LINE__, "the stopped rank's call returned");
    fprintf(stderr, "rank %d: %s returned %s after %.1f ms: %s\n", rank, op.c_str(),
            loomtest::Show(r).c_str(), s * 1e3, loomGetLastError(nullptr));
    XT_CHECK_LOOM_RES(r, loomTimeout);
    XT_CHECK_MSG(s >= kTimeoutMs / 1e3, "timed out early: " + std::to_string(s) + " s");
    XT_CHECK_MSG(s < kTimeoutMs / 1e3 + 1.0, "timed out late: " + std::to_string(s) + " s");
    // In the chain, rank 0 waits on rank 1 only: it names rank 2 if rank 1 timed out first
    // and told it, else rank 1. Everyone else waits on the stopped rank itself.
    if (shape == Shape::Chain && rank == 0 &&
        std::string(loomGetLastError(nullptr)).find("rank 2 (host ") == std::string::npos)
        XT_CHECK_NAMES_RANK(1, op);
    else
        XT_CHECK_NAMES_RANK(kStopped, op);
}

class StoppedPeer : public ::testing::TestWithParam<std::tuple<Shape, std::string>> {};

TEST_P(StoppedPeer, TimesOutAfterTheTimeoutNotBefore)
{
    const Shape shape = std::get<0>(GetParam());
    std::vector<int> pids;
    loomtest::RunOptions opts;
    opts.env = loomtest::FaultEnv(std::get<1>(GetParam()), kTimeoutMs);
    // Every rank waits on the stopped one directly in "direct"; in chained algorithms (ring,
    // recursive doubling) all ranks time out at once and one may name the live neighbour it
    // waited on (docs/reliability.md, "Not covered").
    opts.env.push_back({"LOOM_ALGO", "direct"});
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    opts.kill_when_others_exit = {kStopped};
    opts.pids_out = &pids;
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks, [shape](int rank, int, loomComm_t comm) { StopBody(shape, rank, comm); }, opts));
    const std::vector<std::string> left = loomtest::ShmLeftovers(pids);
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left.front();
}

INSTANTIATE_TEST_SUITE_P(All, StoppedPeer,
                         ::testing::Combine(::testing::Values(Shape::AllReduce, Shape::Chain),
                                            ::testing::Values("shm", "tcp")),
                         [](const auto &info) {
                             return std::string(std::get<0>(info.param) == Shape::AllReduce
                                                    ? "allreduce_"
                                                    : "chain_") +
                                    std::get<1>(info.param);
                         });

// ---- a slow peer is not a dead one -----------------------------------------------------------

class SlowPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(SlowPeer, JoiningAtFortyPercentOfTheTimeoutSucceeds)
{
    loomtest::RunOptions opts;
    opts.env = loomtest::FaultEnv(GetParam(), 2000);
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [](int rank, int n, loomComm_t comm) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            if (rank == kRanks - 1)
                usleep(800 * 1000); // the point of the test: 40 % of the timeout
            const size_t count = kRanks * 4 * (kChunk / 4) + 7;
            Bytes send(count * 4), recv(count * 4), want(count * 4);
            loomtest::FillReduceInput(send.data(), loomFloat32, loomSum, rank, 5, 0, count);
            loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, n, 5, 0, count);
            XT_CHECK_LOOM(loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm,
                                        nullptr));
            const std::string diff =
                loomtest::CompareElements(recv.data(), want.data(), count, loomFloat32);
            XT_CHECK_MSG(diff.empty(), diff);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(All, SlowPeer, ::testing::Values("shm", "tcp"));

// ---- the timeout dump -------------------------------------------------------------------------

TEST(TimeoutDump, EachRankWritesWhatItWaitedFor)
{
    loomtest::RunOptions opts;
    opts.env = loomtest::FaultEnv("shm", 600);
    // Every rank waits on the stopped one directly in "direct"; in chained algorithms (ring,
    // recursive doubling) all ranks time out at once and one may name the live neighbour it
    // waited on (docs/reliability.md, "Not covered").
    opts.env.push_back({"LOOM_ALGO", "direct"});
    opts.expected_exit = {0, 0, 128 + SIGKILL};
    opts.kill_when_others_exit = {kStopped};
    opts.env.push_back({"LOOM_DEBUG", "INFO"});
    opts.env.push_back({"LOOM_ALGO", "allreduce:direct"}); // each rank waits on rank 2 itself
    opts.rank_env = [](int) { // RunDir() is the run's only inside the ranks
        return loomtest::EnvList{{"LOOM_DUMP_ON_TIMEOUT", loomtest::RunDir() + "/dump.%r.%p.json"}};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [](int rank, int, loomComm_t comm) {
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            if (rank == kStopped) // never joins; the harness kills it once the others are done
                for (;;)
                    pause();
            std::vector<float> send(4096, 1.0f), recv(4096);
            XT_CHECK_LOOM_RES(loomAllReduce(send.data(), recv.data(), send.size(), loomFloat32,
                                            loomSum, comm, nullptr),
                              loomTimeout);
            const std::string path = loomtest::RunDir() + "/dump." + std::to_string(rank) + "." +
                                     std::to_string(getpid()) + ".json";
            const std::string dump = ReadFile(path);
            for (const char *field :
                 {"\"event\":\"timeout\"", "\"op\":\"allreduce\"", "\"seq\":", "\"timeout_ms\":600",
                  "\"waited_ms\":", "\"pending\":[{", "\"peer\":2", "\"dir\":\"recv\"",
                  "\"bytes\":", "\"tag_kind\":\"collective\"", "\"step\":1", "\"cause\":{"})
                XT_CHECK_MSG(dump.find(field) != std::string::npos,
                             std::string("dump ") + path + " lacks " + field + ": '" + dump + "'");
            XT_CHECK(dump.front() == '{' && dump.find("}\n") == dump.size() - 2);
            const std::string log =
                ReadFile(loomtest::RunDir() + "/rank" + std::to_string(rank) + ".log");
            XT_CHECK_MSG(log.find("timeout dump: {\"event\":\"timeout\"") != std::string::npos,
                         "no dump at INFO in the log");
            XT_CHECK(log.find("timeout dump pending: {\"peer\":") != std::string::npos);
        },
        opts));
}

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_coll_hier.cc - AllToAllv whose two ends disagree on a block's size (the receiver's
// recvcounts against the sender's sendcounts), on 2 modelled hosts of 2 ranks (LOOM_HOST_ID),
// where the hierarchical algorithm carries small blocks aggregated, and with pairwise for
// comparison: the receiver gets an error naming the sizes, never a hang or a crash. A block that
// arrives shorter than expected leaves the communicator usable; one that arrives longer breaks
// it (the transport cannot skip the rest), and then every rank returns within the deadline.
// Run by meson's 'coll' suite.

#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"

namespace {

constexpr int kRanks = 4; // ranks 0, 1 on one host, 2, 3 on the other
constexpr size_t kCount = 2;

// One AllToAllv of kCount floats per pair, except that rank 2 expects `wrong` from rank 0 (both
// sizes are small, so under the hierarchy the block travels aggregated through rank 0's rail).
// Returns the result; checks the blocks that do match.
loomResult_t SkewedAllToAllv(int rank, int n, loomComm_t comm, size_t wrong)
{
    std::vector<size_t> sc(n, kCount), sd(n), rc(n, kCount), rd(n);
    for (int j = 0; j < n; j++) {
        sd[j] = kCount * j;
        rd[j] = 2 * kCount * j; // room for a larger block
    }
    if (rank == 2)
        rc[0] = wrong;
    std::vector<float> in(kCount * n), out(2 * kCount * n, -1.0f);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = static_cast<float>(100 * rank + static_cast<int>(i));
    const loomResult_t res = loomAllToAllv(in.data(), sc.data(), sd.data(), out.data(), rc.data(),
                                           rd.data(), loomFloat32, comm, nullptr);
    if (res == loomSuccess)
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < rc[j]; i++)
                XT_CHECK_EQ(out[rd[j] + i], static_cast<float>(100 * j + rank * 2 + i));
    return res;
}

loomtest::RunOptions HostOptions(const char *algo)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_ALGO", std::string("alltoallv:") + algo}, {"LOOM_TIMEOUT_MS", "20000"}};
    opts.unset_env = {"LOOM_COST_SHM", "LOOM_COST_TCP", "LOOM_CALIBRATE"};
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
    };
    opts.deadline_s = 60;
    return opts;
}

class Mismatch : public ::testing::TestWithParam<const char *> {};

// Rank 2 expects 3 floats where rank 0 sends 2: InvalidUsage with the sizes on rank 2 only, and
// the next (correct) call works on every rank.
TEST_P(Mismatch, ShorterBlockIsReported)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [](int rank, int n, loomComm_t comm) {
            const loomResult_t res = SkewedAllToAllv(rank, n, comm, kCount + 1);
            if (rank == 2) {
                XT_CHECK_EQ(res, loomInvalidUsage);
                const std::string msg = loomGetLastError(comm);
                XT_CHECK_MSG(msg.find("bytes but recvcounts says ") != std::string::npos, msg);
            } else {
                XT_CHECK_EQ(res, loomSuccess);
            }
            XT_CHECK_LOOM(SkewedAllToAllv(rank, n, comm, kCount));
        },
        HostOptions(GetParam())));
}

// Rank 2 expects 1 float where rank 0 sends 2: an error on rank 2; the others finish the call
// or learn that rank 2's communicator broke.
TEST_P(Mismatch, LongerBlockIsAnError)
{
    loomtest::RunOptions opts = HostOptions(GetParam());
    opts.create_comm = false;
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [](int rank, int n, loomComm_t) {
            loomComm_t comm = loomtest::CreateComm();
            const loomResult_t res = SkewedAllToAllv(rank, n, comm, kCount - 1);
            if (rank == 2)
                XT_CHECK_MSG(res != loomSuccess, "a block longer than recvcounts was accepted");
            else
                XT_CHECK_MSG(res == loomSuccess || res == loomRemoteError, loomGetErrorString(res));
            loomCommDestroy(comm); // may report the broken connections
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(AllToAllv, Mismatch, ::testing::Values("hier", "pairwise"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                             return std::string(info.param);
                         });

} // namespace

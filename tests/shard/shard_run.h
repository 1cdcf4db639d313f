// SPDX-License-Identifier: Apache-2.0
//
// shard_run.h - training steps through the shard API for the multi-rank tests: seeded
// parameters and per-(step, rank) gradients (small integers x 2^-8, exact in any order, or
// uniform reals), the single-process reference (a one-rank plan stepping the gradients summed in
// rank order and divided by P, as loomAvg does), a distributed run of one layout, and the
// optimizer state mapped to a canonical per-parameter order (momentum of each matrix; Adam m
// then v of each element-wise parameter) so that layouts can be compared element by element.
#ifndef LOOM_TESTS_SHARD_SHARD_RUN_H
#define LOOM_TESTS_SHARD_SHARD_RUN_H

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "loom_shard.h"

namespace shardtest {

struct Mode {
    loomShardLayout_t layout = loomShardOwner;
    int rows_bucketed = 0;
    int threads = 1;
    bool in_place = true; // else packed shards throughout (ReduceGrads and Step out of place)
    int deterministic = 1;
    std::string Name() const;
};

struct Outcome {
    std::vector<float> params;       // model order, after the last step
    std::vector<float> state;        // canonical order
    std::vector<unsigned char> held; // per canonical state element: this rank holds it
    loomShardCounters_t step1{};     // the counters of the first step (ReduceGrads+Step+Gather)
    loomShardStats_t stats{};
};

std::vector<float> InitParams(const std::vector<loomShardParam_t> &list);
std::vector<float> Grads(const std::vector<loomShardParam_t> &list, int step, int rank,
                         bool integer);
loomMuonConfig_t MuonConfig();

// The canonical state of one rank, from its state buffer.
void Canonical(loomShardPlan_t plan, const std::vector<loomShardParam_t> &list, int rank,
               const std::vector<float> &state, std::vector<float> &canon,
               std::vector<unsigned char> &held);

Outcome Reference(const std::vector<loomShardParam_t> &list, int nranks, int steps, bool integer);
// Runs inside rank `rank` of comm (checks fail the rank).
Outcome Distributed(const std::vector<loomShardParam_t> &list, const Mode &m, int rank, int nranks,
                    loomComm_t comm, int steps, bool integer);
// Params bitwise equal, and every state element the rank holds.
void ExpectSame(const Outcome &ref, const Outcome &got, const std::string &what);

// The multi-rank cases: (rank count, LOOM_NET); Run forks the ranks with one BLAS thread each.
class RanksTest : public ::testing::TestWithParam<std::tuple<int, const char *>> {
  protected:
    void Run(const std::function<void(int, int, loomComm_t)> &body,
             const std::vector<std::pair<std::string, std::string>> &env = {});
};
// "4ranks_shm"
std::string RanksName(const ::testing::TestParamInfo<std::tuple<int, const char *>> &info);

} // namespace shardtest

#endif // LOOM_TESTS_SHARD_SHARD_RUN_H

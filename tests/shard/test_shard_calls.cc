// SPDX-License-Identifier: Apache-2.0
//
// test_shard_calls.cc - the shard calls on forked ranks beyond whole-model steps: ReduceGrads
// and GatherParams of every layout against the rank-order sum (sum and avg, in place and on
// packed shards); S7 the core's count of calls unchanged by Owner and Replicated steps given a
// communicator, and one per matrix or bucket for Rows; S13 buckets
// (ReduceGrads per bucket in reverse order on a stream, Step per bucket, GatherParams per
// bucket on the stream: bitwise the whole-model calls, and each bucket's bytes the S6 formula
// on its own elements); loomShardScaleRows where each layout holds the rows, in place and on
// packed shards; S15 misuse: a communicator of another size, a bucket out of range, NULL
// buffers, a bad optimizer config, Rows stepping as another rank, and one rank building a
// different plan, which PlanVerify reports on every rank within 2 s naming that rank, with the
// communicator still working afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "loom_shard.h"
#include "mp_fixture.h"
#include "shard_lists.h"
#include "shard_run.h"

using namespace shardtest;

extern "C" uint64_t shardtest_comm_tickets(loomComm_t comm);

namespace {

class ShardCalls : public RanksTest {};

struct Held {
    loomShardPlan_t plan = nullptr;
    std::vector<float> params, grads, state;
    ~Held()
    {
        loomShardPlanDestroy(plan);
    }
};

void Setup(Held &h, const std::vector<loomShardParam_t> &list, loomShardLayout_t layout, int rank,
           int n, int agree = 1)
{
    loomShardConfig_t c = LOOM_SHARD_CONFIG_INITIALIZER;
    c.layout = layout;
    c.agree = agree;
    XT_CHECK_LOOM(loomShardPlanCreate(&h.plan, list.data(), (int)list.size(), n, &c));
    h.params.resize(Numel(list));
    h.grads.resize(Numel(list));
    h.state.assign(loomShardStateElems(h.plan, rank), 0.0f);
    XT_CHECK_LOOM(loomShardPack(h.plan, InitParams(list).data(), h.params.data(), loomFloat32));
}

uint64_t SumOverRanks(uint64_t mine, loomComm_t comm)
{
    uint64_t all = 0;
    XT_CHECK_LOOM(loomAllReduce(&mine, &all, 1, loomUint64, loomSum, comm, nullptr));
    return all;
}

void Buckets(int rank, int n, loomComm_t comm)
{
    const auto list = GptTiny();
    loomStream_t stream = nullptr;
    XT_CHECK_LOOM(loomStreamCreate(&stream));
    for (int layout = 0; layout < 3; layout++) {
        loomtest::SetContext("layout " + std::to_string(layout));
        Held whole, split;
        // Without agree, so that nothing but the step waits for the queued reductions.
        Setup(whole, list, (loomShardLayout_t)layout, rank, n, 0);
        Setup(split, list, (loomShardLayout_t)layout, rank, n, 0);
        loomShardStats_t st;
        XT_CHECK_LOOM(loomShardStats(split.plan, &st));
        loomMuonConfig_t cfg = MuonConfig();
        const unsigned full = LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL;
        loomComm_t step_comm = layout == loomShardRows ? comm : nullptr;
        for (int s = 1; s <= 3; s++) {
            cfg.step = s;
            const std::vector<float> g = Grads(list, s, rank, false);
            XT_CHECK_LOOM(loomShardPack(whole.plan, g.data(), whole.grads.data(), loomFloat32));
            XT_CHECK_LOOM(loomShardPack(split.plan, g.data(), split.grads.data(), loomFloat32));
            XT_CHECK_LOOM(loomShardReduceGrads(whole.plan, -1, whole.grads.data(),
                                               whole.grads.data(), loomFloat32, loomAvg, comm,
                                               nullptr));
            XT_CHECK_LOOM(loomShardStep(whole.plan, rank, -1, whole.params.data(),
                                        whole.grads.data(), whole.state.data(), full, &cfg,
                                        step_comm, nullptr));
            XT_CHECK_LOOM(loomShardGatherParams(whole.plan, -1, whole.params.data(),
                                                whole.params.data(), loomFloat32, comm, nullptr));
            std::vector<uint64_t> bytes((size_t)st.nbuckets);
            for (int b = st.nbuckets - 1; b >= 0; b--) {
                loomShardCounters_t c0, c1;
                XT_CHECK_LOOM(loomShardGetCounters(split.plan, &c0, 0));
                XT_CHECK_LOOM(loomShardReduceGrads(split.plan, b, split.grads.data(),
                                                   split.grads.data(), loomFloat32, loomAvg, comm,
                                                   stream));
                XT_CHECK_LOOM(loomShardGetCounters(split.plan, &c1, 0));
                bytes[(size_t)b] += c1.bytes_sent - c0.bytes_sent;
            }
            for (int b = 0; b < st.nbuckets; b++)
                XT_CHECK_LOOM(loomShardStep(split.plan, rank, b, split.params.data(),
                                            split.grads.data(), split.state.data(), full, &cfg,
                                            step_comm, stream));
            for (int b = 0; b < st.nbuckets; b++) {
                loomShardCounters_t c0, c1;
                XT_CHECK_LOOM(loomShardGetCounters(split.plan, &c0, 0));
                XT_CHECK_LOOM(loomShardGatherParams(split.plan, b, split.params.data(),
                                                    split.params.data(), loomFloat32, comm,
                                                    stream));
                XT_CHECK_LOOM(loomShardGetCounters(split.plan, &c1, 0));
                bytes[(size_t)b] += c1.bytes_sent - c0.bytes_sent;
            }
            XT_CHECK_LOOM(loomStreamSynchronize(stream));
            XT_CHECK_MSG(
                std::memcmp(whole.params.data(), split.params.data(), whole.params.size() * 4) == 0,
                "params differ after step " + std::to_string(s));
            XT_CHECK_MSG(
                std::memcmp(whole.state.data(), split.state.data(), whole.state.size() * 4) == 0,
                "state differs after step " + std::to_string(s));
            if (layout == loomShardRows)
                continue; // Rows' step gathers are counted by the step, not per bucket here
            size_t begin = 0;
            for (int b = 0; b < st.nbuckets; b++) {
                size_t nb = 0;
                for (const auto &q : list)
                    nb += q.bucket == b ? q.rows * q.cols : 0;
                begin += nb;
                XT_CHECK_EQ(SumOverRanks(bytes[(size_t)b], comm), 2 * (uint64_t)(n - 1) * nb * 4);
            }
            XT_CHECK_EQ(begin, st.total_elems);
        }
    }
    XT_CHECK_LOOM(loomStreamDestroy(stream));
}

TEST_P(ShardCalls, S13BucketsOnAStreamEqualWholeModelCalls)
{
    Run(Buckets);
}

void ScaleRows(int rank, int n, loomComm_t comm)
{
    const auto list = GptTiny();
    const int mat = 4, vec = 5; // qkv (384 x 128) and its bias (384 x 1)
    std::vector<float> scale(200);
    for (size_t i = 0; i < scale.size(); i++)
        scale[i] = 0.5f + 0.25f * (float)(i % 3);
    std::vector<float> want = InitParams(list);
    size_t at = 0;
    for (int i = 0; i < (int)list.size(); i++) {
        const size_t cols = list[(size_t)i].cols;
        if (i == mat || i == vec)
            for (size_t r = 100; r < 300; r++)
                for (size_t c = 0; c < cols; c++)
                    want[at + r * cols + c] *= scale[r - 100];
        at += list[(size_t)i].rows * cols;
    }
    for (int layout = 0; layout < 3; layout++)
        for (int packed = 0; packed < 2; packed++) {
            loomtest::SetContext("layout " + std::to_string(layout) + " packed " +
                                 std::to_string(packed));
            Held h;
            Setup(h, list, (loomShardLayout_t)layout, rank, n);
            loomShardRankInfo_t ri;
            XT_CHECK_LOOM(loomShardRankInfo(h.plan, rank, &ri));
            std::vector<float> shard(ri.shard_elems);
            float *buf = packed ? shard.data() : h.params.data();
            if (packed) { // the shard: rank 0's params plus zeros from the others, exactly
                std::vector<float> mine(h.params.size(), 0.0f);
                if (rank == 0)
                    mine = h.params;
                XT_CHECK_LOOM(loomShardReduceGrads(h.plan, -1, mine.data(), shard.data(),
                                                   loomFloat32, loomSum, comm, nullptr));
            }
            const unsigned flags = packed ? 0 : LOOM_SHARD_PARAMS_FULL;
            for (int p : {mat, vec})
                XT_CHECK_LOOM(
                    loomShardScaleRows(h.plan, rank, buf, flags, p, 100, 200, scale.data()));
            XT_CHECK_LOOM(loomShardGatherParams(h.plan, -1, buf, h.params.data(), loomFloat32, comm,
                                                nullptr));
            std::vector<float> got(h.params.size());
            XT_CHECK_LOOM(loomShardUnpack(h.plan, h.params.data(), got.data(), loomFloat32));
            XT_CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
        }
    // Out of range rows are refused.
    Held h;
    Setup(h, list, loomShardOwner, rank, n);
    XT_CHECK_LOOM_RES(loomShardScaleRows(h.plan, rank, h.params.data(), LOOM_SHARD_PARAMS_FULL, mat,
                                         300, 85, scale.data()),
                      loomInvalidArgument);
}

TEST_P(ShardCalls, ScaleRowsWhereverTheRankHoldsThem)
{
    Run(ScaleRows);
}

// ReduceGrads gives every rank the rank-order sum (or that sum / P) of exactly what it holds,
// in place and into its packed shard; GatherParams gives every rank every rank's part.
void Exchanges(int rank, int n, loomComm_t comm)
{
    const auto list = OddShapes();
    const size_t N = Numel(list);
    for (int layout = 0; layout < 3; layout++)
        for (loomRedOp_t op : {loomSum, loomAvg}) {
            loomtest::SetContext("layout " + std::to_string(layout) + " op " +
                                 std::to_string((int)op));
            Held h;
            Setup(h, list, (loomShardLayout_t)layout, rank, n);
            std::vector<float> want(N), mine(N), shard_want;
            for (int r = 0; r < n; r++) {
                const std::vector<float> g = Grads(list, 1, r, false);
                XT_CHECK_LOOM(loomShardPack(h.plan, g.data(), r == 0 ? want.data() : mine.data(),
                                            loomFloat32));
                for (size_t i = 0; r > 0 && i < N; i++)
                    want[i] += mine[i];
            }
            for (size_t i = 0; op == loomAvg && i < N; i++)
                want[i] = want[i] / (float)n;
            XT_CHECK_LOOM(loomShardPack(h.plan, Grads(list, 1, rank, false).data(), mine.data(),
                                        loomFloat32));
            loomShardRankInfo_t ri;
            XT_CHECK_LOOM(loomShardRankInfo(h.plan, rank, &ri));
            std::vector<float> shard(ri.shard_elems, -7.0f), in_place = mine;
            XT_CHECK_LOOM(loomShardReduceGrads(h.plan, -1, mine.data(), shard.data(), loomFloat32,
                                               op, comm, nullptr));
            XT_CHECK_LOOM(loomShardReduceGrads(h.plan, -1, in_place.data(), in_place.data(),
                                               loomFloat32, op, comm, nullptr));
            // The shard, spread back into a full buffer by GatherParams, must be want on every
            // rank; so must the in-place result, gathered in place.
            std::vector<float> full(N, -9.0f);
            XT_CHECK_LOOM(loomShardGatherParams(h.plan, -1, shard.data(), full.data(), loomFloat32,
                                                comm, nullptr));
            XT_CHECK_LOOM(loomShardGatherParams(h.plan, -1, in_place.data(), in_place.data(),
                                                loomFloat32, comm, nullptr));
            if (layout == loomShardReplicated) // the shard is the full buffer
                XT_CHECK(std::memcmp(shard.data(), want.data(), N * 4) == 0);
            XT_CHECK(std::memcmp(full.data(), want.data(), N * 4) == 0);
            XT_CHECK(std::memcmp(in_place.data(), want.data(), N * 4) == 0);
        }
}

TEST_P(ShardCalls, ReduceGradsAndGatherParamsExact)
{
    Run(Exchanges);
}

// S7 with a communicator at hand: Owner and Replicated steps take no ticket on it (the core's
// count of calls) and count no step collective; Rows takes one per matrix, or one per bucket
// holding matrices when bucketed, and counts the same.
void StepCollectives(int rank, int n, loomComm_t comm)
{
    const auto list = GptTiny();
    for (int layout = 0; layout < 3; layout++)
        for (int bucketed = 0; bucketed < 2; bucketed++) {
            loomtest::SetContext("layout " + std::to_string(layout) + " bucketed " +
                                 std::to_string(bucketed));
            Held h;
            loomShardConfig_t c = LOOM_SHARD_CONFIG_INITIALIZER;
            c.layout = (loomShardLayout_t)layout;
            c.rows_bucketed = bucketed;
            XT_CHECK_LOOM(loomShardPlanCreate(&h.plan, list.data(), (int)list.size(), n, &c));
            h.params = InitParams(list);
            h.grads = Grads(list, 1, rank, true);
            h.state.assign(loomShardStateElems(h.plan, rank), 0.0f);
            loomMuonConfig_t cfg = MuonConfig();
            const uint64_t t0 = shardtest_comm_tickets(comm);
            XT_CHECK_LOOM(
                loomShardStep(h.plan, rank, -1, h.params.data(), h.grads.data(), h.state.data(),
                              LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL, &cfg, comm, nullptr));
            const uint64_t taken = shardtest_comm_tickets(comm) - t0;
            loomShardCounters_t k;
            XT_CHECK_LOOM(loomShardGetCounters(h.plan, &k, 0));
            const uint64_t want = layout != loomShardRows ? 0
                                  : bucketed              ? 4
                                                          : 16; // 4 layers of 4 matrices
            XT_CHECK_EQ(taken, want);
            XT_CHECK_EQ(k.step_collectives, want);
        }
}

TEST_P(ShardCalls, S7StepCollectivesCounted)
{
    Run(StepCollectives);
}

double Seconds(std::chrono::steady_clock::time_point since)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void ExpectError(loomResult_t got, loomResult_t want, const std::string &word)
{
    const std::string msg = loomGetLastError(nullptr);
    XT_CHECK_MSG(got == want, word + ": got " + loomtest::Show(got) + " (" + msg + ")");
    XT_CHECK_MSG(msg.find(word) != std::string::npos, "'" + word + "' not in '" + msg + "'");
}

void Misuse(int rank, int n, loomComm_t comm)
{
    auto list = GptTiny();
    Held h;
    Setup(h, list, loomShardOwner, rank, n);
    const unsigned full = LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL;
    float *g = h.grads.data();
    // A plan for another rank count.
    Held other;
    Setup(other, list, loomShardOwner, rank, n + 1);
    ExpectError(loomShardReduceGrads(other.plan, -1, g, g, loomFloat32, loomSum, comm, nullptr),
                loomInvalidUsage,
                "comm has " + std::to_string(n) + " ranks but the plan was built for " +
                    std::to_string(n + 1));
    ExpectError(loomShardGatherParams(other.plan, -1, g, g, loomFloat32, comm, nullptr),
                loomInvalidUsage, "comm has");
    ExpectError(loomShardReduceGrads(h.plan, 6, g, g, loomFloat32, loomSum, comm, nullptr),
                loomInvalidUsage, "bucket 6 outside -1..5");
    ExpectError(loomShardReduceGrads(h.plan, -1, nullptr, g, loomFloat32, loomSum, comm, nullptr),
                loomInvalidArgument, "is NULL");
    ExpectError(loomShardGatherParams(h.plan, -1, nullptr, g, loomFloat32, comm, nullptr),
                loomInvalidArgument, "is NULL");
    ExpectError(loomShardReduceGrads(h.plan, -1, g, g, loomFloat32, loomMax, comm, nullptr),
                loomInvalidArgument, "op 2");
    ExpectError(loomShardReduceGrads(h.plan, -1, g, g, loomFloat16, loomSum, comm, nullptr),
                loomInvalidArgument, "datatype 6");
    ExpectError(loomShardReduceGrads(h.plan, -1, g, g, loomFloat32, loomSum, nullptr, nullptr),
                loomInvalidArgument, "comm is NULL");
    loomMuonConfig_t cfg = MuonConfig();
    ExpectError(loomShardStep(h.plan, rank, -1, h.params.data(), nullptr, h.state.data(), full,
                              &cfg, nullptr, nullptr),
                loomInvalidArgument, "is NULL");
    ExpectError(loomShardStep(h.plan, rank, -1, h.params.data(), g, h.state.data(), 0x4, &cfg,
                              nullptr, nullptr),
                loomInvalidArgument, "flags 0x4");
    ExpectError(loomShardStep(h.plan, n, -1, h.params.data(), g, h.state.data(), full, &cfg,
                              nullptr, nullptr),
                loomInvalidArgument, "rank " + std::to_string(n));
    loomMuonConfig_t bad = cfg;
    bad.step = 0;
    XT_CHECK_LOOM_RES(loomShardStep(h.plan, rank, -1, h.params.data(), g, h.state.data(), full,
                                    &bad, nullptr, nullptr),
                      loomInvalidUsage);
    bad = cfg;
    bad.magic = 7;
    XT_CHECK_LOOM_RES(loomShardStep(h.plan, rank, -1, h.params.data(), g, h.state.data(), full,
                                    &bad, nullptr, nullptr),
                      loomInvalidUsage);
    bad = cfg;
    bad.threads = 0;
    ExpectError(loomShardStep(h.plan, rank, -1, h.params.data(), g, h.state.data(), full, &bad,
                              nullptr, nullptr),
                loomInvalidUsage, "threads 0");
    if (n > 1) {
        Held rows;
        Setup(rows, list, loomShardRows, rank, n);
        const int wrong = (rank + 1) % n;
        std::vector<float> st(loomShardStateElems(rows.plan, wrong));
        ExpectError(loomShardStep(rows.plan, wrong, -1, rows.params.data(), rows.grads.data(),
                                  st.data(), full, &cfg, comm, nullptr),
                    loomInvalidUsage, "comm's rank is " + std::to_string(rank));
        ExpectError(loomShardStep(rows.plan, rank, -1, rows.params.data(), rows.grads.data(),
                                  rows.state.data(), full, &cfg, nullptr, nullptr),
                    loomInvalidArgument, "comm is NULL");
    }
    // Verify: a plan for another rank count fails on every rank; so does one rank's different
    // list; afterwards the communicator still works.
    auto t0 = std::chrono::steady_clock::now();
    ExpectError(loomShardPlanVerify(other.plan, comm, nullptr), loomInvalidUsage,
                "on a communicator of " + std::to_string(n) + " ranks");
    if (n > 1) {
        const int odd = n - 1;
        Held diff;
        if (rank == odd)
            list[6].cols += 1;
        Setup(diff, list, loomShardOwner, rank, n);
        ExpectError(loomShardPlanVerify(diff.plan, comm, nullptr), loomInvalidUsage,
                    "differ from rank 0's plan");
        const std::string msg = loomGetLastError(nullptr);
        XT_CHECK_MSG(msg.find(": " + std::to_string(odd) + " (") != std::string::npos,
                     "rank " + std::to_string(odd) + " not named in '" + msg + "'");
    }
    XT_CHECK(Seconds(t0) < 2.0);
    XT_CHECK_LOOM(loomShardPlanVerify(h.plan, comm, nullptr));
    XT_CHECK_LOOM(loomShardReduceGrads(h.plan, -1, g, g, loomFloat32, loomSum, comm, nullptr));
}

TEST_P(ShardCalls, S15MisuseFailsEveryRankWithAMessage)
{
    Run(Misuse);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardCalls,
                         ::testing::Combine(::testing::Values(1, 3),
                                            ::testing::Values("shm", "tcp")),
                         RanksName);

} // namespace

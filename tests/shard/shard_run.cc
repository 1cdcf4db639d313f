// SPDX-License-Identifier: Apache-2.0
//
// shard_run.cc - the runs of shard_run.h.
#include "shard_run.h"

#include <cstring>

#include "mp_fixture.h"
#include "shard_lists.h"

extern "C" {
#include "shard_plan.h"
}

namespace shardtest {

std::string Mode::Name() const
{
    static const char *names[] = {"owner", "rows", "replicated"};
    return std::string(names[layout]) + (rows_bucketed ? "-bucketed" : "") +
           (threads > 1 ? "-threads" + std::to_string(threads) : "") + (in_place ? "" : "-packed");
}

std::vector<float> InitParams(const std::vector<loomShardParam_t> &list)
{
    Rng rng(77);
    std::vector<float> p(Numel(list));
    for (float &x : p)
        x = (float)(rng.Uniform() * 0.2 - 0.1);
    return p;
}

std::vector<float> Grads(const std::vector<loomShardParam_t> &list, int step, int rank,
                         bool integer)
{
    Rng rng(1000003ull * (uint64_t)step + 7919ull * (uint64_t)rank + 1);
    std::vector<float> g(Numel(list));
    for (float &x : g)
        x = integer ? (float)((int)rng.Below(33) - 16) * 0x1p-8f : (float)(rng.Uniform() - 0.5);
    return g;
}

loomMuonConfig_t MuonConfig()
{
    loomMuonConfig_t c = LOOM_MUON_CONFIG_INITIALIZER;
    c.weight_decay = 0.01f;
    c.adam_weight_decay = 0.01f;
    return c;
}

void Canonical(loomShardPlan_t plan, const std::vector<loomShardParam_t> &list, int rank,
               const std::vector<float> &state, std::vector<float> &canon,
               std::vector<unsigned char> &held)
{
    std::vector<size_t> base(list.size());
    size_t n = 0;
    for (size_t i = 0; i < list.size(); i++) {
        base[i] = n;
        n += list[i].rows * list[i].cols * (list[i].kind == loomShardMatrix ? 1 : 2);
    }
    canon.assign(n, 0.0f);
    held.assign(n, 0);
    loomShardStats_t st;
    XT_CHECK_LOOM(loomShardStats(plan, &st));
    for (int b = 0; b < st.nbuckets; b++) {
        std::vector<shard_piece_t> pcs((size_t)shard_pieces(plan, rank, b, nullptr));
        shard_pieces(plan, rank, b, pcs.data());
        size_t e_len = 0;
        for (const auto &pc : pcs)
            if (list[(size_t)pc.param].kind == loomShardElementwise)
                e_len += pc.len;
        for (const auto &pc : pcs) {
            const auto &q = list[(size_t)pc.param];
            size_t off;
            XT_CHECK_LOOM(loomShardParamInfo(plan, pc.param, nullptr, &off));
            const size_t at = base[(size_t)pc.param] + (pc.full_off - off);
            for (size_t k = 0; k < pc.len; k++) {
                canon[at + k] = state[pc.state_off + k];
                held[at + k] = 1;
                if (q.kind == loomShardElementwise) {
                    canon[at + q.rows * q.cols + k] = state[pc.state_off + e_len + k];
                    held[at + q.rows * q.cols + k] = 1;
                }
            }
        }
    }
}

Outcome Reference(const std::vector<loomShardParam_t> &list, int nranks, int steps, bool integer)
{
    Outcome o;
    loomShardPlan_t plan = nullptr;
    XT_CHECK_LOOM(loomShardPlanCreate(&plan, list.data(), (int)list.size(), 1, nullptr));
    const size_t N = Numel(list);
    std::vector<float> params(N), grads(N), state(loomShardStateElems(plan, 0), 0.0f);
    XT_CHECK_LOOM(loomShardPack(plan, InitParams(list).data(), params.data(), loomFloat32));
    loomMuonConfig_t cfg = MuonConfig();
    for (int s = 1; s <= steps; s++) {
        std::vector<float> sum = Grads(list, s, 0, integer);
        for (int r = 1; r < nranks; r++) {
            const std::vector<float> g = Grads(list, s, r, integer);
            for (size_t i = 0; i < N; i++)
                sum[i] += g[i];
        }
        for (size_t i = 0; i < N; i++)
            sum[i] = sum[i] / (float)nranks;
        XT_CHECK_LOOM(loomShardPack(plan, sum.data(), grads.data(), loomFloat32));
        cfg.step = s;
        XT_CHECK_LOOM(loomShardStep(plan, 0, -1, params.data(), grads.data(), state.data(),
                                    LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL, &cfg, nullptr,
                                    nullptr));
    }
    o.params.resize(N);
    XT_CHECK_LOOM(loomShardUnpack(plan, params.data(), o.params.data(), loomFloat32));
    Canonical(plan, list, 0, state, o.state, o.held);
    XT_CHECK_LOOM(loomShardPlanDestroy(plan));
    return o;
}

// The shard of `rank` copied out of the full buffer.
static void ToShard(loomShardPlan_t plan, int rank, int nbuckets, const std::vector<float> &full,
                    std::vector<float> &shard)
{
    for (int b = 0; b < nbuckets; b++) {
        std::vector<shard_piece_t> pcs((size_t)shard_pieces(plan, rank, b, nullptr));
        shard_pieces(plan, rank, b, pcs.data());
        for (const auto &pc : pcs)
            std::memcpy(&shard[pc.shard_off], &full[pc.full_off], pc.len * sizeof(float));
    }
}

Outcome Distributed(const std::vector<loomShardParam_t> &list, const Mode &m, int rank, int nranks,
                    loomComm_t comm, int steps, bool integer)
{
    Outcome o;
    loomShardConfig_t sc = LOOM_SHARD_CONFIG_INITIALIZER;
    sc.layout = m.layout;
    sc.rows_bucketed = m.rows_bucketed;
    sc.deterministic = m.deterministic;
    loomShardPlan_t plan = nullptr;
    XT_CHECK_LOOM(loomShardPlanCreate(&plan, list.data(), (int)list.size(), nranks, &sc));
    XT_CHECK_LOOM(loomShardPlanVerify(plan, comm, nullptr));
    XT_CHECK_LOOM(loomShardStats(plan, &o.stats));
    loomShardRankInfo_t ri;
    XT_CHECK_LOOM(loomShardRankInfo(plan, rank, &ri));
    const size_t N = Numel(list);
    std::vector<float> params(N), grads(N), state(loomShardStateElems(plan, rank), 0.0f);
    std::vector<float> pshard(ri.shard_elems), gshard(ri.shard_elems);
    XT_CHECK_LOOM(loomShardPack(plan, InitParams(list).data(), params.data(), loomFloat32));
    ToShard(plan, rank, o.stats.nbuckets, params, pshard);
    // Owner and Replicated step without a communicator: they cannot communicate.
    loomComm_t step_comm = m.layout == loomShardRows ? comm : nullptr;
    loomMuonConfig_t cfg = MuonConfig();
    cfg.threads = m.threads;
    XT_CHECK_LOOM(loomShardGetCounters(plan, nullptr, 1));
    for (int s = 1; s <= steps; s++) {
        XT_CHECK_LOOM(
            loomShardPack(plan, Grads(list, s, rank, integer).data(), grads.data(), loomFloat32));
        cfg.step = s;
        if (m.in_place) {
            XT_CHECK_LOOM(loomShardReduceGrads(plan, -1, grads.data(), grads.data(), loomFloat32,
                                               loomAvg, comm, nullptr));
            XT_CHECK_LOOM(loomShardStep(plan, rank, -1, params.data(), grads.data(), state.data(),
                                        LOOM_SHARD_PARAMS_FULL | LOOM_SHARD_GRADS_FULL, &cfg,
                                        step_comm, nullptr));
            XT_CHECK_LOOM(loomShardGatherParams(plan, -1, params.data(), params.data(), loomFloat32,
                                                comm, nullptr));
        } else {
            XT_CHECK_LOOM(loomShardReduceGrads(plan, -1, grads.data(), gshard.data(), loomFloat32,
                                               loomAvg, comm, nullptr));
            XT_CHECK_LOOM(loomShardStep(plan, rank, -1, pshard.data(), gshard.data(), state.data(),
                                        0, &cfg, step_comm, nullptr));
            XT_CHECK_LOOM(loomShardGatherParams(plan, -1, pshard.data(), params.data(), loomFloat32,
                                                comm, nullptr));
        }
        if (s == 1)
            XT_CHECK_LOOM(loomShardGetCounters(plan, &o.step1, 0));
    }
    o.params.resize(N);
    XT_CHECK_LOOM(loomShardUnpack(plan, params.data(), o.params.data(), loomFloat32));
    Canonical(plan, list, rank, state, o.state, o.held);
    XT_CHECK_LOOM(loomShardPlanDestroy(plan));
    return o;
}

void ExpectSame(const Outcome &ref, const Outcome &got, const std::string &what)
{
    XT_CHECK_EQ(got.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); i++)
        XT_CHECK_MSG(std::memcmp(&ref.params[i], &got.params[i], sizeof(float)) == 0,
                     what + ": param element " + std::to_string(i) + " is " +
                         std::to_string(got.params[i]) + ", the reference " +
                         std::to_string(ref.params[i]));
    XT_CHECK_EQ(got.state.size(), ref.state.size());
    for (size_t i = 0; i < ref.state.size(); i++) {
        if (!got.held[i])
            continue;
        XT_CHECK_MSG(std::memcmp(&ref.state[i], &got.state[i], sizeof(float)) == 0,
                     what + ": canonical state element " + std::to_string(i) + " is " +
                         std::to_string(got.state[i]) + ", the reference " +
                         std::to_string(ref.state[i]));
    }
}

void RanksTest::Run(const std::function<void(int, int, loomComm_t)> &body,
                    const std::vector<std::pair<std::string, std::string>> &env)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", std::get<1>(GetParam())}, {"OPENBLAS_NUM_THREADS", "1"}};
    opts.env.insert(opts.env.end(), env.begin(), env.end());
    opts.deadline_s = 120;
    XT_ASSERT_RUN(loomtest::RunRanks(std::get<0>(GetParam()), body, opts));
}

std::string RanksName(const ::testing::TestParamInfo<std::tuple<int, const char *>> &info)
{
    return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
}

} // namespace shardtest

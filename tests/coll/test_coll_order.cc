// SPDX-License-Identifier: Apache-2.0
//
// test_coll_order.cc - the reduction order include/loom.h promises, bit for bit, across
// algorithms and transports: AllReduce, ReduceScatter, ReduceScatterV (uneven counts, a zero
// among them) and Reduce of random floats (random
// mantissas, exponents over 2^-6..2^6, so that sums round differently in every other order;
// products of factors near 1), float32, float16 and bfloat16, sum, prod and avg, over the shared
// arena, over point-to-point shared memory, over tcp, over ucx (when built) and across modelled
// hosts (2 x 2 and 3 x 2 in blocks, 2 x 2 dealt round-robin). Every algorithm of each collective
// is forced in turn by LOOM_ALGO; with LOOM_DETERMINISTIC at its default (1) each must return
// exactly ((x0 op x1) op x2) ... op x[n-1] in the accumulator type, rounded once, the
// expectation computed here element by element; those with an order of their own are replaced
// by the cost model's rank-order choice, which the COLL trace must show ("order rank"). With
// LOOM_DETERMINISTIC=0 the rank-order algorithms must still give those bits. Run by meson's
// 'coll' suite.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "coll_kind.h"
#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

constexpr loomCollective_t kReducing[] = {loomCollAllReduce, loomCollReduceScatter, loomCollReduce};
constexpr loomDataType_t kTypes[] = {loomFloat32, loomFloat16, loomBfloat16};
constexpr loomRedOp_t kOps[] = {loomSum, loomProd, loomAvg};
// Counts: one element, fewer than the ranks, and several pipeline segments of 4 KiB.
constexpr size_t kCounts[] = {1, 3, 3001};
constexpr size_t kLongCount = 70001;

uint64_t Hash(uint64_t seed, int rank, size_t i)
{
    return loomtest::Mix64(seed ^ (static_cast<uint64_t>(rank) << 48) ^
                           loomtest::Mix64(static_cast<uint64_t>(i) + 0x51ed));
}

void Store(void *buf, loomDataType_t dt, size_t j, float v)
{
    if (dt == loomFloat32)
        static_cast<float *>(buf)[j] = v;
    else if (dt == loomFloat16)
        static_cast<uint16_t *>(buf)[j] = loomtest::RefFloatToHalf(v);
    else
        static_cast<uint16_t *>(buf)[j] = loomtest::RefFloatToBf16(v);
}

// v rounded to the datatype (and widened back).
float Round(loomDataType_t dt, float v)
{
    if (dt == loomFloat16)
        return loomtest::RefHalfToFloat(loomtest::RefFloatToHalf(v));
    return dt == loomBfloat16 ? loomtest::RefBf16ToFloat(loomtest::RefFloatToBf16(v)) : v;
}

// Element i of rank's input, a value the datatype holds: for sums a random sign, mantissa and
// exponent in [-6, 6]; for products a factor in [0.75, 1.5), so that products of up to 8 of
// them neither overflow nor lose their low bits to underflow.
float InputValue(loomDataType_t dt, loomRedOp_t op, int rank, uint64_t seed, size_t i)
{
    const uint64_t h = Hash(seed, rank, i);
    const double frac = static_cast<double>(h >> 40) / std::ldexp(1.0, 24);
    if (op == loomProd)
        return Round(dt, static_cast<float>((h & 2 ? 0.75 : 1.0) * (1.0 + frac / 2)));
    return Round(dt, static_cast<float>(((h & 1) ? -1.0 : 1.0) * (1.0 + frac) *
                                        std::ldexp(1.0, static_cast<int>((h >> 4) % 13) - 6)));
}

// The contract: float32 accumulator, the ranks in order, avg one division, one rounding.
void Expected(void *out, loomDataType_t dt, loomRedOp_t op, int n, uint64_t seed, size_t first,
              size_t count)
{
    for (size_t j = 0; j < count; j++) {
        float acc = InputValue(dt, op, 0, seed, first + j);
        for (int r = 1; r < n; r++) {
            const float x = InputValue(dt, op, r, seed, first + j);
            acc = op == loomProd ? acc * x : acc + x;
        }
        Store(out, dt, j, op == loomAvg ? acc / static_cast<float>(n) : acc);
    }
}

// One call of coll; returns "" or what was wrong.
std::string RunOne(loomCollective_t coll, loomDataType_t dt, loomRedOp_t op, size_t count,
                   uint64_t seed, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(dt), un = static_cast<size_t>(n);
    const size_t in_count = coll == loomCollReduceScatter ? un * count : count;
    std::vector<unsigned char> send(in_count * es), recv(count * es, 0xEE), want(count * es);
    for (size_t i = 0; i < in_count; i++)
        Store(send.data(), dt, i, InputValue(dt, op, rank, seed, i));
    const int root = static_cast<int>(seed % un);
    loomResult_t res;
    if (coll == loomCollAllReduce)
        res = loomAllReduce(send.data(), recv.data(), count, dt, op, comm, nullptr);
    else if (coll == loomCollReduceScatter)
        res = loomReduceScatter(send.data(), recv.data(), count, dt, op, comm, nullptr);
    else
        res = loomReduce(send.data(), recv.data(), count, dt, op, root, comm, nullptr);
    if (res != loomSuccess)
        return std::string("returned ") + loomGetErrorString(res);
    if (coll == loomCollReduce && rank != root)
        return "";
    const size_t first = coll == loomCollReduceScatter ? static_cast<size_t>(rank) * count : 0;
    Expected(want.data(), dt, op, n, seed, first, count);
    const std::string diff = loomtest::CompareElements(recv.data(), want.data(), count, dt);
    return diff.empty() ? "" : "not in rank order: " + diff;
}

// ReduceScatterV with rank r's block (r + 1) * unit elements, none for rank 1 of 3 or more.
std::string RunOneV(loomDataType_t dt, loomRedOp_t op, size_t unit, uint64_t seed, int rank, int n,
                    loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(dt);
    std::vector<size_t> counts(static_cast<size_t>(n));
    size_t total = 0, first = 0;
    for (int r = 0; r < n; r++) {
        counts[static_cast<size_t>(r)] = r == 1 && n > 2 ? 0 : static_cast<size_t>(r + 1) * unit;
        if (r == rank)
            first = total;
        total += counts[static_cast<size_t>(r)];
    }
    const size_t mine = counts[static_cast<size_t>(rank)];
    std::vector<unsigned char> send(total * es), recv(mine * es, 0xEE), want(mine * es);
    for (size_t i = 0; i < total; i++)
        Store(send.data(), dt, i, InputValue(dt, op, rank, seed, i));
    const loomResult_t res =
        loomReduceScatterV(send.data(), recv.data(), counts.data(), dt, op, comm, nullptr);
    if (res != loomSuccess)
        return std::string("returned ") + loomGetErrorString(res);
    Expected(want.data(), dt, op, n, seed, first, mine);
    const std::string diff = loomtest::CompareElements(recv.data(), want.data(), mine, dt);
    return diff.empty() ? "" : "not in rank order: " + diff;
}

// Every reducing call's trace line says it added in rank order; returns how many there were.
int CountRankOrder(const std::string &path, std::string *bad)
{
    std::ifstream f(path);
    std::string line;
    int count = 0;
    while (std::getline(f, line)) {
        bool reducing = false;
        for (loomCollective_t c : kReducing)
            reducing |= line.find(std::string(" ") + loomtest::CollSpelling(c) + " seq ") !=
                        std::string::npos;
        reducing |= line.find(" reducescatterv seq ") != std::string::npos;
        if (!reducing)
            continue;
        if (line.find(" order rank ") == std::string::npos && bad->empty())
            *bad = line;
        count++;
    }
    return count;
}

void RunCases(int rank, int n, loomComm_t comm)
{
    int calls = 0, failures = 0;
    uint64_t seed = 0x0dde4;
    auto run = [&](loomCollective_t coll, loomDataType_t dt, loomRedOp_t op, size_t count) {
        seed = loomtest::Mix64(seed);
        const std::string what = RunOne(coll, dt, op, count, seed, rank, n, comm);
        calls++;
        if (!what.empty() && failures++ < 12)
            fprintf(stderr, "rank %d: FAIL %s %s %s count %zu: %s\n", rank,
                    loomtest::CollSpelling(coll), loomtest::TypeName(dt), loomtest::OpName(op),
                    count, what.c_str());
    };
    for (loomCollective_t coll : kReducing) {
        for (loomDataType_t dt : kTypes)
            for (loomRedOp_t op : kOps)
                for (size_t count : kCounts)
                    run(coll, dt, op, count);
        // Dozens of pipeline segments per rank, so that the pipelines reuse their slots.
        run(coll, loomFloat32, loomSum, kLongCount);
        run(coll, loomBfloat16, loomAvg, kLongCount);
    }
    auto run_v = [&](loomDataType_t dt, loomRedOp_t op, size_t unit) {
        seed = loomtest::Mix64(seed);
        const std::string what = RunOneV(dt, op, unit, seed, rank, n, comm);
        calls++;
        if (!what.empty() && failures++ < 12)
            fprintf(stderr, "rank %d: FAIL reducescatterv %s %s unit %zu: %s\n", rank,
                    loomtest::TypeName(dt), loomtest::OpName(op), unit, what.c_str());
    };
    for (loomDataType_t dt : kTypes)
        for (loomRedOp_t op : kOps)
            for (size_t unit : kCounts)
                run_v(dt, op, unit);
    run_v(loomFloat32, loomSum, kLongCount / 2);
    std::string bad;
    const int traced =
        CountRankOrder(loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log", &bad);
    XT_CHECK_MSG(bad.empty(), "a call did not add in rank order: " + bad);
    XT_CHECK_MSG(traced >= calls, "too few trace lines: " + std::to_string(traced));
    XT_CHECK_EQ(failures, 0);
}

// ---- Where the ranks run, and which algorithms are forced
// ----------------------------------------

struct Layout {
    const char *name;
    int nranks;
    loomtest::EnvList env;
    int hosts; // 0: one host; else LOOM_HOST_ID in blocks (cyclic: round-robin)
    bool cyclic;
    // LOOM_ALGO per run: the k-th entry of each list (the last one again when a list is short).
    std::vector<std::vector<const char *>> algos; // [allreduce, reducescatter, reduce]
};

const std::vector<const char *> kNetAllReduce{"rd", "direct", "rhd", "ring", "reduce_bcast"};
const std::vector<const char *> kNetReduceScatter{"direct", "rhd", "ring"};
const std::vector<const char *> kNetReduce{"direct", "binomial", "chain"};

std::vector<Layout> Layouts()
{
    const loomtest::EnvList p2p{{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "0"}};
    const loomtest::EnvList tcp{{"LOOM_NET", "tcp"}};
    std::vector<Layout> s;
    const std::vector<std::vector<const char *>> arena{{"shm", "shm_flat", "shm_cico", "shm_cma"},
                                                       {"shm", "shm_cico", "shm_cma"},
                                                       {"shm", "shm_flat", "shm_cico", "shm_cma"}};
    s.push_back({"arena3", 3, {{"LOOM_NET", "shm"}}, 0, false, arena});
    s.push_back({"arena4", 4, {{"LOOM_NET", "shm"}}, 0, false, arena});
    s.push_back({"p2p3", 3, p2p, 0, false, {kNetAllReduce, kNetReduceScatter, kNetReduce}});
    s.push_back({"p2p5", 5, p2p, 0, false, {kNetAllReduce, kNetReduceScatter, kNetReduce}});
    s.push_back({"tcp3", 3, tcp, 0, false, {kNetAllReduce, kNetReduceScatter, kNetReduce}});
    s.push_back({"tcp4", 4, tcp, 0, false, {kNetAllReduce, kNetReduceScatter, kNetReduce}});
#ifdef LOOM_HAVE_UCX
    s.push_back({"ucx3",
                 3,
                 {{"LOOM_NET", "ucx"}},
                 0,
                 false,
                 {kNetAllReduce, kNetReduceScatter, kNetReduce}});
#endif
    const std::vector<const char *> host_ar{"hier_chain", "hier", "direct", "ring", "rhd"};
    const std::vector<const char *> host_rs{"hier", "direct", "ring"};
    s.push_back({"hosts2x2", 4, {}, 2, false, {host_ar, host_rs, kNetReduce}});
    s.push_back({"hosts3x2", 6, {}, 3, false, {host_ar, host_rs, kNetReduce}});
    s.push_back({"hosts2x2cyclic", 4, {}, 2, true, {host_ar, host_rs, kNetReduce}});
    // Without LOOM_DETERMINISTIC the rank-order algorithms keep the order of their own accord.
    s.push_back({"tcp3free",
                 3,
                 {{"LOOM_NET", "tcp"}, {"LOOM_DETERMINISTIC", "0"}},
                 0,
                 false,
                 {{"rd", "direct", "reduce_bcast"}, {"direct"}, {"direct", "chain"}}});
    s.push_back({"hosts3x2free",
                 6,
                 {{"LOOM_DETERMINISTIC", "0"}},
                 3,
                 false,
                 {{"hier_chain"}, {"direct"}, {"chain"}}});
    return s;
}

struct Param {
    size_t setup;
    size_t run;
};

std::vector<Param> AllParams()
{
    std::vector<Param> params;
    const std::vector<Layout> layouts = Layouts();
    for (size_t i = 0; i < layouts.size(); i++) {
        size_t runs = 0;
        for (const auto &list : layouts[i].algos)
            runs = std::max(runs, list.size());
        for (size_t k = 0; k < runs; k++)
            params.push_back({i, k});
    }
    return params;
}

// The three collectives' LOOM_ALGO (the test's name).
std::string BaseSpec(const Layout &s, size_t run)
{
    std::string spec;
    for (size_t c = 0; c < 3; c++) {
        const auto &list = s.algos[c];
        spec += std::string(c ? "," : "") + loomtest::CollSpelling(kReducing[c]) + ":" +
                list[std::min(run, list.size() - 1)];
    }
    return spec;
}

// ReduceScatterV runs ReduceScatter's algorithm where it has one of that name, else direct.
std::string AlgoSpec(const Layout &s, size_t run)
{
    const std::string rs = s.algos[1][std::min(run, s.algos[1].size() - 1)];
    const bool has = rs == "direct" || rs == "ring" || rs.rfind("shm", 0) == 0;
    return BaseSpec(s, run) + ",reducescatterv:" + (has ? rs : std::string("direct"));
}

std::string ParamName(const Param &p)
{
    const Layout s = Layouts()[p.setup];
    std::string name = std::string(s.name) + "_";
    for (char ch : BaseSpec(s, p.run))
        name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    return name;
}

class Order : public ::testing::TestWithParam<Param> {};

TEST_P(Order, BitsAreTheRankOrderSum)
{
    const Layout s = Layouts()[GetParam().setup];
    loomtest::RunOptions opts;
    opts.env = s.env;
    opts.env.push_back({"LOOM_ALGO", AlgoSpec(s, GetParam().run)});
    opts.env.push_back({"LOOM_CHUNK_BYTES", "4096"});
    opts.env.push_back({"LOOM_COLL_TRACE", "1"});
    opts.env.push_back({"LOOM_DEBUG", "INFO"});
    opts.env.push_back({"LOOM_DEBUG_SUBSYS", "COLL"});
    opts.unset_env = {"LOOM_COST_SHM", "LOOM_COST_TCP", "LOOM_CALIBRATE"};
    const int hosts = s.hosts, per = s.hosts ? s.nranks / s.hosts : 0;
    const bool cyclic = s.cyclic;
    opts.rank_env = [hosts, per, cyclic](int rank) {
        loomtest::EnvList e{
            {"LOOM_DEBUG_FILE", loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log"}};
        if (hosts > 0)
            e.push_back(
                {"LOOM_HOST_ID", "host" + std::to_string(cyclic ? rank % hosts : rank / per)});
        return e;
    };
    opts.deadline_s = 90;
    XT_ASSERT_RUN(loomtest::RunRanks(s.nranks, RunCases, opts));
}

INSTANTIATE_TEST_SUITE_P(Coll, Order, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<Param> &info) {
                             return ParamName(info.param);
                         });

} // namespace

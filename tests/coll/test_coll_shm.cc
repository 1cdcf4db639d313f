// SPDX-License-Identifier: Apache-2.0
//
// test_coll_shm.cc - the shared-memory collectives (the shm_* algorithms of
// docs/shm-collectives.md), one family forced at a time through LOOM_ALGO: flat, cico (copies
// through the arena), cma (single copy), the size-based default, and cma forced where single
// copy is disabled (the model's choice runs instead), on 2, 3, 4, 5 and 8 ranks, and on 1 rank
// (no arena there: no shm algorithm runs). Each run asserts from its own LOOM_COLL_TRACE log, and
// the arena's line saying whether single copy was agreed, that the forced family is what ran;
// where process_vm_readv is refused the cma cases are reported skipped, with the reason, instead
// of passing on another family. Slots are shrunk to 16 KiB
// (8 KiB halves) so that small counts already cross round, sub-block and half boundaries;
// counts sit at 0, 1, odd, around a half and a sub-block and around the 128 KiB reduction
// block, and on 2 and 3 ranks a few calls of tens of MiB (large enough to stream their copies
// out of the arena). Every result is compared bit for bit (tests/harness/verify.h), in place
// and out of place, send buffers and guard bytes checked. Also: back-to-back calls of every
// kind and size with no barrier between them (the double-buffered descriptors and halves),
// ranks that call mismatching collectives (an error, never corrupted memory), tiny calls that
// run ahead through the cell rings, and 8 ranks on 2 cores running many small calls (no
// livelock). Run by meson's 'coll' suite.

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "coll_kind.h"
#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using loomtest::GuardedBuffer;
using Bytes = std::vector<unsigned char>;

constexpr size_t kHalf = 8192; // LOOM_SHM_COLL_BYTES=16384 below

enum class Family { kDefault, kFlat, kCico, kCma, kNoCma, kStreamIn };

const char *FamilyName(Family f)
{
    switch (f) {
    case Family::kDefault:
        return "default";
    case Family::kFlat:
        return "flat";
    case Family::kCico:
        return "cico";
    case Family::kCma:
        return "cma";
    case Family::kNoCma:
        return "nocma";
    case Family::kStreamIn:
        return "streamin";
    }
    return "?";
}

loomtest::EnvList FamilyEnv(Family f)
{
    loomtest::EnvList env = {
        {"LOOM_NET", "shm"},      {"LOOM_SHM_COLL", "1"}, {"LOOM_SHM_COLL_BYTES", "16384"},
        {"LOOM_COLL_TRACE", "1"}, {"LOOM_DEBUG", "INFO"}, {"LOOM_DEBUG_SUBSYS", "COLL,SHM"}};
    switch (f) {
    case Family::kFlat:
        env.push_back({"LOOM_ALGO", "allreduce:shm_flat,reduce:shm_flat"});
        break;
    case Family::kCico:
        env.push_back({"LOOM_ALGO", "shm_cico"});
        break;
    case Family::kCma:
        env.push_back({"LOOM_ALGO", "shm_cma"});
        break;
    case Family::kNoCma:
        env.push_back({"LOOM_ALGO", "shm_cma"});
        env.push_back({"LOOM_SHM_COLL_CMA", "0"});
        break;
    case Family::kStreamIn: // every copy into the arena past the cache
        env.push_back({"LOOM_ALGO", "shm_cico"});
        env.push_back({"LOOM_SHM_NT_STORES", "1"});
        break;
    case Family::kDefault:
        break;
    }
    return env;
}

// The reducing collectives first: MakeCases and BackToBack pick from this order.
constexpr loomCollective_t kOrder[] = {loomCollAllReduce, loomCollReduceScatter, loomCollReduce,
                                       loomCollAllGather, loomCollBroadcast,     loomCollAllToAll};

struct Case {
    loomCollective_t coll;
    loomDataType_t dt;
    loomRedOp_t op;
    size_t count; // the call's count argument
    bool inplace;
    int root;
    uint64_t seed;

    std::string Name() const
    {
        std::string s = std::string(loomtest::CollName(coll)) + " " + loomtest::TypeName(dt);
        if (loomtest::Reducing(coll))
            s += std::string(" ") + loomtest::OpName(op);
        return s + " count " + std::to_string(count) + (inplace ? " in-place" : "") + " root " +
               std::to_string(root);
    }
};

// Runs one case on this rank; returns "" or what went wrong.
std::string RunCase(const Case &c, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(c.dt), bytes = c.count * es, un = static_cast<size_t>(n);
    const size_t ur = static_cast<size_t>(rank);
    std::string fail;
    auto expect_eq = [&](const void *got, const void *want, size_t count, const char *what) {
        std::string d = loomtest::CompareElements(got, want, count, c.dt);
        if (!d.empty() && fail.empty())
            fail = std::string(what) + ": " + d;
    };
    const size_t sn =
        c.coll == loomCollReduceScatter || c.coll == loomCollAllToAll ? un * c.count : c.count;
    const size_t rn =
        c.coll == loomCollAllGather || c.coll == loomCollAllToAll ? un * c.count : c.count;
    Bytes in(sn * es);
    if (loomtest::Reducing(c.coll))
        loomtest::FillReduceInput(in.data(), c.dt, c.op, rank, c.seed, 0, sn);
    else
        loomtest::FillPattern(in.data(), in.size(), c.coll == loomCollBroadcast ? c.root : rank,
                              c.seed);
    GuardedBuffer send(in.size()), recv(rn * es);
    if (!in.empty())
        memcpy(send.data(), in.data(), in.size());
    Bytes want(rn * es);
    loomResult_t r = loomInternalError;
    unsigned char *out = recv.bytes();
    switch (c.coll) {
    case loomCollAllReduce:
        out = c.inplace ? send.bytes() : recv.bytes();
        loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, 0, c.count);
        r = loomAllReduce(send.data(), out, c.count, c.dt, c.op, comm, nullptr);
        break;
    case loomCollReduceScatter:
        out = c.inplace ? send.bytes() + ur * bytes : recv.bytes();
        loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, ur * c.count, c.count);
        r = loomReduceScatter(send.data(), out, c.count, c.dt, c.op, comm, nullptr);
        break;
    case loomCollReduce:
        out = c.inplace ? send.bytes() : recv.bytes();
        loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, 0, c.count);
        r = loomReduce(send.data(), out, c.count, c.dt, c.op, c.root, comm, nullptr);
        break;
    case loomCollAllGather: {
        const void *sp = send.data();
        if (c.inplace) {
            if (bytes > 0)
                memcpy(recv.bytes() + ur * bytes, in.data(), bytes);
            sp = recv.bytes() + ur * bytes;
        }
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, c.seed);
        r = loomAllGather(sp, recv.data(), c.count, c.dt, comm, nullptr);
        break;
    }
    case loomCollBroadcast:
        out = c.inplace ? send.bytes() : recv.bytes();
        if (c.inplace && rank != c.root && bytes > 0)
            memset(send.data(), 0xcd, bytes);
        if (bytes > 0)
            memcpy(want.data(), in.data(), bytes);
        r = loomBroadcast(send.data(), out, c.count, c.dt, c.root, comm, nullptr);
        break;
    case loomCollAllToAll:
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, c.seed,
                                  ur * bytes);
        r = loomAllToAll(send.data(), recv.data(), c.count, c.dt, comm, nullptr);
        break;
    case loomNumCollectives: // not a collective: stays loomInternalError
        break;
    }
    if (r != loomSuccess)
        return std::string("returned ") + loomGetErrorString(r) + ": " + loomGetLastError(nullptr);
    const bool has_output = c.coll != loomCollReduce || rank == c.root;
    if (has_output)
        expect_eq(out, want.data(), rn, "wrong result");
    if (!c.inplace)
        expect_eq(send.data(), in.data(), sn, "send buffer changed");
    if (!send.GuardsIntact() || !recv.GuardsIntact())
        fail = fail.empty() ? "write outside the buffers" : fail;
    return fail;
}

// Counts (the call's count argument) that put the bytes around the boundaries of the family's
// rounds: a half, a cico sub-block (a half per rank), the 128 KiB reduction block.
std::vector<size_t> Counts(loomCollective_t coll, size_t es, int n)
{
    const size_t un = static_cast<size_t>(n);
    const size_t per =
        coll == loomCollReduceScatter || coll == loomCollAllGather || coll == loomCollAllToAll
            ? 1
            : un; // AllReduce/Reduce/Broadcast: the vector is split n ways
    const size_t half = kHalf / es, sub = kHalf / un / es, block = 131072 / es;
    std::vector<size_t> v = {0, 1, 7, half - 1, half, half + 1, 3 * half + 5};
    for (size_t k : {sub, per * sub})
        if (k > 1)
            v.insert(v.end(), {k - 1, k + 1});
    v.push_back(per * block + 3);
    // Around one tiny-call cell (48 bytes of input per rank; reduce-scatter and all-to-all
    // send n blocks of count).
    const size_t cell =
        48 / es / (coll == loomCollReduceScatter || coll == loomCollAllToAll ? un : 1);
    for (size_t k : {cell - 1, cell, cell + 1})
        if (cell > 0 && k > 1 && k != 7)
            v.push_back(k);
    return v;
}

std::vector<Case> MakeCases(int n)
{
    const std::pair<loomDataType_t, loomRedOp_t> reds[] = {
        {loomFloat32, loomSum}, {loomBfloat16, loomAvg},   {loomFloat16, loomMax},
        {loomInt8, loomProd},   {loomFloat8e4m3, loomSum}, {loomFloat64, loomMin},
        {loomUint64, loomSum},  {loomInt32, loomAvg}};
    const loomDataType_t moves[] = {loomUint8, loomFloat16, loomFloat64};
    std::vector<Case> cases;
    uint64_t k = 0;
    for (int ci = 0; ci < 6; ci++) {
        const loomCollective_t coll = kOrder[ci];
        int j = 0;
        for (int t = 0; t < 3; t++) {
            const auto p = loomtest::Reducing(coll) ? reds[(t + 3 * ci) % 6]
                                                    : std::make_pair(moves[t], loomSum);
            for (size_t count : Counts(coll, loomtest::TypeSize(p.first), n)) {
                const bool inplace = coll != loomCollAllToAll && (j++ % 2) == 1;
                const int root = (j / 2) % n;
                cases.push_back({coll, p.first, p.second, count, inplace, root, ++k * 977});
            }
        }
    }
    return cases;
}

void RunAll(int rank, int n, loomComm_t comm)
{
    int failures = 0;
    for (const Case &c : MakeCases(n)) {
        loomtest::SetContext(c.Name());
        const std::string f = RunCase(c, rank, n, comm);
        if (!f.empty() && failures++ < 20)
            fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, c.Name().c_str(), f.c_str());
    }
    // Tens of MiB, many rounds of every kind: on 2 and 3 ranks only, to bound the run time.
    const size_t big = size_t{4} << 20; // elements
    const struct {
        int nranks;
        Case c;
    } large[] = {{2, {loomCollAllReduce, loomFloat32, loomSum, big, false, 0, 11}},
                 {2, {loomCollAllGather, loomFloat32, loomSum, big / 2, true, 0, 12}},
                 {2, {loomCollAllToAll, loomFloat32, loomSum, big / 2, false, 0, 16}},
                 {3, {loomCollAllReduce, loomBfloat16, loomSum, big, true, 0, 13}},
                 {3, {loomCollReduceScatter, loomFloat32, loomSum, big / 2, false, 0, 14}},
                 {3, {loomCollBroadcast, loomUint8, loomSum, big * 6, false, 2, 15}}};
    for (const auto &l : large) {
        if (l.nranks != n)
            continue;
        const Case &c = l.c;
        loomtest::SetContext(c.Name());
        const std::string f = RunCase(c, rank, n, comm);
        if (!f.empty() && failures++ < 20)
            fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, c.Name().c_str(), f.c_str());
    }
    XT_CHECK_EQ(failures, 0);
}

// ---- which family ran -------------------------------------------------------------------------

// This rank's log (LOOM_DEBUG_FILE): the trace of every call and the arena's lines.
std::string TracePath(int rank)
{
    return loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log";
}

std::vector<std::string> TraceLines(int rank)
{
    std::vector<std::string> lines;
    std::ifstream in(TracePath(rank));
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);
    return lines;
}

// The arena's line for this rank ("shm arena: rank R mapped ...: <how it copies>"), or "".
std::string ArenaLine(const std::vector<std::string> &lines, int rank)
{
    const std::string key = "shm arena: rank " + std::to_string(rank) + " mapped ";
    for (const std::string &l : lines)
        if (l.find(key) != std::string::npos)
            return l.substr(l.find(key));
    return "";
}

// The traced calls: collective and algorithm of each "<coll> seq N: ... algo <name> ..." line.
std::vector<std::pair<std::string, std::string>> TracedCalls(const std::vector<std::string> &lines)
{
    std::vector<std::pair<std::string, std::string>> calls;
    for (const std::string &l : lines) {
        const size_t seq = l.find(" seq "), algo = l.find(" algo ");
        const size_t info = l.find("LOOM INFO ");
        if (seq == std::string::npos || algo == std::string::npos || info == std::string::npos)
            continue;
        const size_t c0 = info + 10, a0 = algo + 6;
        calls.push_back({l.substr(c0, seq - c0), l.substr(a0, l.find(' ', a0) - a0)});
    }
    return calls;
}

// The collectives a family's LOOM_ALGO forces, and the algorithm each must trace.
bool Forced(Family f, const std::string &coll)
{
    if (f == Family::kFlat)
        return coll == "allreduce" || coll == "reduce";
    return coll == "allreduce" || coll == "reducescatter" || coll == "reduce" ||
           coll == "allgather" || coll == "broadcast" || coll == "alltoall";
}

const char *ForcedAlgo(Family f)
{
    switch (f) {
    case Family::kFlat:
        return "shm_flat";
    case Family::kCma:
        return "shm_cma";
    default:
        return "shm_cico"; // cico and streamin
    }
}

// The arena must say `want` of how it copies ("single copy", "always", ...). Where the ranks could
// not read each other's memory (process_vm_readv refused) the run is reported skipped instead: a
// single-copy test would pass on the arena's copies. False if the run is skipped.
bool SingleCopyAgreed(int rank, const std::string &want)
{
    const std::vector<std::string> lines = TraceLines(rank);
    const std::string arena = ArenaLine(lines, rank);
    XT_CHECK_MSG(!arena.empty(), "no arena line in " + TracePath(rank));
    if (arena.find(want) != std::string::npos)
        return true;
    XT_CHECK_MSG(arena.find("copies through the arena") != std::string::npos,
                 "the arena does not say \"" + want + "\": " + arena);
    std::string why = "single copy (process_vm_readv) was not agreed: " + arena;
    for (const std::string &l : lines)
        if (l.find("cannot read rank") != std::string::npos)
            why = "process_vm_readv refused between the ranks: " + l.substr(l.find("shm arena: "));
    loomtest::SkipRun(why);
    return false;
}

// Before the calls: shm_cma runs only where single copy was agreed (elsewhere LOOM_ALGO's
// shm_cma gives way to the model's choice). False if the run is skipped.
bool FamilyCanRun(Family f, int rank, int n)
{
    return f != Family::kCma || n < 2 || SingleCopyAgreed(rank, "single copy");
}

// Every rank logs into TracePath (COLL: the trace; SHM: the arena).
loomtest::RunOptions Traced(loomtest::EnvList env)
{
    loomtest::RunOptions opts;
    opts.env = std::move(env);
    opts.env.insert(
        opts.env.end(),
        {{"LOOM_COLL_TRACE", "1"}, {"LOOM_DEBUG", "INFO"}, {"LOOM_DEBUG_SUBSYS", "COLL,SHM"}});
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)}};
    };
    return opts;
}

// After the calls: every call of a collective the family forces traced the forced algorithm (and
// the arena agreed on what that algorithm needs); the default ran the shm row, nocma never
// shm_cma; on one rank there is no arena and no shm algorithm.
void CheckFamilyRan(Family f, int rank, int n)
{
    const std::vector<std::string> lines = TraceLines(rank);
    const std::vector<std::pair<std::string, std::string>> calls = TracedCalls(lines);
    const std::string arena = ArenaLine(lines, rank);
    XT_CHECK_MSG(calls.size() >= 20,
                 "only " + std::to_string(calls.size()) + " traced calls in " + TracePath(rank));
    if (n == 1) {
        XT_CHECK_MSG(arena.empty(), "an arena on one rank: " + arena);
        for (const auto &c : calls)
            XT_CHECK_MSG(c.second.rfind("shm", 0) != 0, c.first + " ran " + c.second);
        return;
    }
    XT_CHECK_MSG(!arena.empty(), "no arena line in " + TracePath(rank));
    if (f == Family::kNoCma)
        XT_CHECK_MSG(arena.find("copies through the arena") != std::string::npos, arena);
    int forced = 0;
    for (const auto &c : calls) {
        if (c.first == "barrier" || c.first == "alltoallv")
            continue;
        const std::string what = c.first + " ran " + c.second + " (" + FamilyName(f) + ")";
        if (f == Family::kDefault) {
            XT_CHECK_MSG(c.second == "shm", what);
        } else if (f == Family::kNoCma) {
            XT_CHECK_MSG(c.second != "shm_cma", what);
        } else if (Forced(f, c.first)) {
            XT_CHECK_MSG(c.second == ForcedAlgo(f), what);
            forced++;
        }
    }
    if (f != Family::kDefault && f != Family::kNoCma)
        XT_CHECK_MSG(forced >= 20,
                     "only " + std::to_string(forced) + " calls forced to " + ForcedAlgo(f));
}

struct Param {
    Family family;
    int nranks;
};

class ShmFamily : public ::testing::TestWithParam<Param> {};

TEST_P(ShmFamily, EveryCollectiveBitExact)
{
    const Param p = GetParam();
    loomtest::RunOptions opts;
    opts.env = FamilyEnv(p.family);
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)}};
    };
    opts.deadline_s = 90;
    const Family f = p.family;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks,
        [f](int rank, int n, loomComm_t comm) {
            if (!FamilyCanRun(f, rank, n))
                return;
            RunAll(rank, n, comm);
            CheckFamilyRan(f, rank, n);
        },
        opts));
}

// One rank has no arena (it needs peers), so no family can run there: one case checks that the
// calls still give exact results through the network algorithms.
std::vector<Param> FamilyParams()
{
    std::vector<Param> v = {{Family::kDefault, 1}};
    for (Family f : {Family::kDefault, Family::kFlat, Family::kCico, Family::kCma, Family::kNoCma})
        for (int n : {2, 3, 4, 5, 8})
            v.push_back({f, n});
    for (int n : {2, 3})
        v.push_back({Family::kStreamIn, n});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmFamily, ::testing::ValuesIn(FamilyParams()),
                         [](const ::testing::TestParamInfo<Param> &info) {
                             return std::string(FamilyName(info.param.family)) + "_" +
                                    std::to_string(info.param.nranks) + "ranks";
                         });

// ---- back to back ----------------------------------------------------------------------------

// 300 calls of every kind and of sizes that pick flat and cico (or cma, LOOM_SHM_COLL_CMA=2), with
// no barrier between them: a rank that returns early (a broadcast root, a flat all-reduce) starts
// the next call while its peers still read the previous one's slots.
void BackToBack(int rank, int n, loomComm_t comm)
{
    const size_t sizes[] = {1, 9, 300, 5000, 70000, 300001};
    int failures = 0;
    for (int i = 0; i < 300; i++) {
        const uint64_t h = loomtest::Mix64(static_cast<uint64_t>(i));
        Case c{kOrder[h % 6],
               loomFloat32,
               loomSum,
               sizes[(h >> 8) % 6],
               ((h >> 16) & 1) != 0,
               static_cast<int>((h >> 24) % static_cast<uint64_t>(n)),
               h};
        if (c.coll == loomCollAllToAll)
            c.inplace = false;
        if (c.coll != loomCollAllReduce && c.count > 70000)
            c.count /= static_cast<size_t>(n); // keep gathered buffers moderate
        if (i % 7 == 3) {
            c.dt = loomBfloat16;
            c.op = loomMax;
        }
        loomtest::SetContext("call " + std::to_string(i) + ": " + c.Name());
        const std::string f = RunCase(c, rank, n, comm);
        if (!f.empty() && failures++ < 10)
            fprintf(stderr, "rank %d: FAIL call %d %s: %s\n", rank, i, c.Name().c_str(), f.c_str());
        if (i % 50 == 49)
            XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    }
    XT_CHECK_EQ(failures, 0);
}

class ShmBackToBack : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// The cma variant needs single copy agreed ("always": LOOM_SHM_COLL_CMA=2), or it would run
// cico twice over; where process_vm_readv is refused it is reported skipped.
TEST_P(ShmBackToBack, MixedCallsNeedNoBarrier)
{
    const bool cma = std::get<1>(GetParam());
    loomtest::RunOptions opts = Traced({{"LOOM_NET", "shm"},
                                        {"LOOM_SHM_COLL", "1"},
                                        {"LOOM_SHM_COLL_BYTES", "65536"},
                                        {"LOOM_SHM_COLL_CMA", cma ? "2" : "0"}});
    opts.deadline_s = 90;
    XT_ASSERT_RUN(loomtest::RunRanks(
        std::get<0>(GetParam()),
        [cma](int rank, int n, loomComm_t comm) {
            if (SingleCopyAgreed(rank, cma ? "single copy (process_vm_readv) always"
                                           : "copies through the arena"))
                BackToBack(rank, n, comm);
        },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmBackToBack,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>> &info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    (std::get<1>(info.param) ? "cma" : "nocma");
                         });

// Ranks whose LOOM_SHM_COLL_CMA differ still pick the same variant for every call: the smallest
// value is agreed at creation (2, 1, 2: single copy inside the measured windows only).
TEST(ShmBackToBack, RanksWithDifferentCmaSettingsAgree)
{
    loomtest::RunOptions opts =
        Traced({{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_SHM_COLL_BYTES", "65536"}});
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_SHM_COLL_CMA", rank == 1 ? "1" : "2"},
                                 {"LOOM_DEBUG_FILE", TracePath(rank)}};
    };
    opts.deadline_s = 90;
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            if (SingleCopyAgreed(rank, "single copy (process_vm_readv) where the plan"))
                BackToBack(rank, n, comm);
        },
        opts));
}

// ---- flat Reduce in pieces --------------------------------------------------------------------

// A flat Reduce of 128 KiB or more goes in pieces that the root reduces as the others post them
// (the default slot: halves of 512 KiB). Calls of 2, 4 and 8 pieces, the last one partial, in
// place and not, roots first and last, back to back with no barrier (non-roots run ahead into
// the next call's half): every result exact, and every one traced as shm_flat.
void FlatReducePieces(int rank, int n, loomComm_t comm)
{
    const size_t counts[] = {32768, 50001, 131072, 100003};
    int failures = 0, calls = 0;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
            Case c{loomCollReduce,
                   i == 3 ? loomBfloat16 : loomFloat32,
                   i == 3 ? loomMax : loomSum,
                   counts[i],
                   (round + static_cast<int>(i)) % 2 == 1,
                   (round + static_cast<int>(i)) % 2 == 0 ? 0 : n - 1,
                   static_cast<uint64_t>(100 * round + i)};
            loomtest::SetContext(c.Name());
            const std::string f = RunCase(c, rank, n, comm);
            calls++;
            if (!f.empty() && failures++ < 10)
                fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, c.Name().c_str(), f.c_str());
        }
    XT_CHECK_EQ(failures, 0);
    int flat = 0;
    for (const std::string &l : TraceLines(rank))
        flat += l.find(" reduce seq ") != std::string::npos &&
                l.find(" algo shm_flat ") != std::string::npos;
    XT_CHECK_EQ(flat, calls);
}

TEST(ShmFlatReduce, PiecesArriveInOrderAndReduceExactly)
{
    for (int n : {2, 3}) {
        loomtest::RunOptions opts =
            Traced({{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_ALGO", "reduce:shm_flat"}});
        opts.deadline_s = 90;
        XT_ASSERT_RUN(loomtest::RunRanks(n, FlatReducePieces, opts));
    }
}

// ---- tiny calls ------------------------------------------------------------------------------

// 3000 calls whose data fits a cell, with no barrier: broadcast roots and reduce non-roots run
// ahead of their peers through the cell rings (256 cells), across calls that post nothing in the
// arena (count 0, AllToAllv over point-to-point) and flat all-reduces between them. Every result
// is checked.
void TinyRunAhead(int rank, int n, loomComm_t comm)
{
    int failures = 0;
    for (int i = 0; i < 3000; i++) {
        const uint64_t h = loomtest::Mix64(static_cast<uint64_t>(i) + 77);
        Case c{loomCollBroadcast,
               loomFloat32,
               loomSum,
               1 + (h >> 8) % 12,
               (h & 1) != 0,
               static_cast<int>((h >> 24) % static_cast<uint64_t>(n)),
               h};
        const unsigned kind = static_cast<unsigned>((h >> 32) % 16);
        if (kind >= 8 && kind < 12) {
            c.coll = loomCollReduce;
            c.dt = loomInt32;
        } else if (kind == 12) {
            c.coll = loomCollAllReduce;
            c.count = 300; // flat
        } else if (kind == 13) {
            c.count = 0;
        } else if (kind == 14) {
            c.coll = loomCollAllToAll;
            c.count = 1;
            c.inplace = false;
        } else if (kind == 15) {
            std::vector<size_t> counts(static_cast<size_t>(n), 1), displs(static_cast<size_t>(n));
            for (int j = 0; j < n; j++)
                displs[static_cast<size_t>(j)] = static_cast<size_t>(j);
            std::vector<int> in(static_cast<size_t>(n), rank), out(static_cast<size_t>(n), -1);
            XT_CHECK_LOOM(loomAllToAllv(in.data(), counts.data(), displs.data(), out.data(),
                                        counts.data(), displs.data(), loomInt32, comm, nullptr));
            for (int j = 0; j < n; j++)
                if (out[static_cast<size_t>(j)] != j && failures++ < 10)
                    fprintf(stderr, "rank %d: FAIL call %d alltoallv\n", rank, i);
            continue;
        }
        loomtest::SetContext("call " + std::to_string(i) + ": " + c.Name());
        const std::string f = RunCase(c, rank, n, comm);
        if (!f.empty() && failures++ < 10)
            fprintf(stderr, "rank %d: FAIL call %d %s: %s\n", rank, i, c.Name().c_str(), f.c_str());
    }
    XT_CHECK_EQ(failures, 0);
}

class ShmTiny : public ::testing::TestWithParam<int> {};

TEST_P(ShmTiny, RunAheadAcrossCallsThatPostNothing)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_TIMEOUT_MS", "20000"}};
    opts.deadline_s = 120;
    XT_ASSERT_RUN(loomtest::RunRanks(GetParam(), TinyRunAhead, opts));
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmTiny, ::testing::Values(2, 3, 8),
                         [](const ::testing::TestParamInfo<int> &info) {
                             return std::to_string(info.param) + "ranks";
                         });

// ---- mismatched calls ------------------------------------------------------------------------

// Rank 0 calls something else than its peers: every rank gets an error (the ranks that compare
// descriptors InvalidUsage, the others RemoteError through the notices), nothing is written
// outside the buffers, and the communicator is broken afterwards.
// The tiny variants: calls that fit a cell on every rank (another count, another collective),
// and one that fits on rank 0 only (a cell against the flat all-reduce's slots).
enum class Mismatch { kCount, kKind, kLargeCount, kTinyCount, kTinyKind, kTinyAgainstFlat };

void MismatchBody(Mismatch m, int rank, loomComm_t comm)
{
    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
    size_t count = 64;
    if (m == Mismatch::kCount && rank == 0)
        count = 96;
    if (m == Mismatch::kLargeCount)
        count = rank == 0 ? 100 : 3u << 20; // flat against single copy / cico
    if (m == Mismatch::kTinyCount)
        count = rank == 0 ? 3 : 5;
    if (m == Mismatch::kTinyKind)
        count = 2;
    if (m == Mismatch::kTinyAgainstFlat)
        count = rank == 0 ? 4 : 64;
    const size_t room = count * 4 * (m == Mismatch::kKind || m == Mismatch::kTinyKind ? 4 : 1);
    GuardedBuffer send(room), recv(room);
    loomtest::FillPattern(send.data(), send.size(), rank, 1);
    loomResult_t r;
    if ((m == Mismatch::kKind || m == Mismatch::kTinyKind) && rank == 0)
        r = loomAllGather(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
    else
        r = loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    const std::string msg = loomGetLastError(nullptr);
    fprintf(stderr, "rank %d: %s: %s\n", rank, loomGetErrorString(r), msg.c_str());
    XT_CHECK_MSG(r == loomInvalidUsage || r == loomRemoteError,
                 std::string("got ") + loomGetErrorString(r));
    XT_CHECK(send.GuardsIntact() && recv.GuardsIntact());
    if (r == loomInvalidUsage)
        XT_CHECK_MSG(msg.find("mismatched collectives") != std::string::npos, msg);
    XT_CHECK_LOOM_RES(loomBarrier(comm, nullptr), loomInvalidUsage);
}

class ShmMismatch : public ::testing::TestWithParam<Mismatch> {};

TEST_P(ShmMismatch, EveryRankFailsNoneCorrupts)
{
    const Mismatch m = GetParam();
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_TIMEOUT_MS", "10000"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [m](int rank, int, loomComm_t comm) { MismatchBody(m, rank, comm); }, opts));
}

std::string MismatchName(const ::testing::TestParamInfo<Mismatch> &info)
{
    static const char *const names[] = {"count",      "kind",      "large_count",
                                        "tiny_count", "tiny_kind", "tiny_against_flat"};
    return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmMismatch,
                         ::testing::Values(Mismatch::kCount, Mismatch::kKind, Mismatch::kLargeCount,
                                           Mismatch::kTinyCount, Mismatch::kTinyKind,
                                           Mismatch::kTinyAgainstFlat),
                         MismatchName);

// ---- oversubscription ------------------------------------------------------------------------

// 8 ranks on (typically) 2 cores: waits must yield and sleep rather than spin, or this crawls
// into the deadline.
TEST(ShmOversubscribed, EightRanksManySmallCalls)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}};
    opts.deadline_s = 60;
    XT_ASSERT_RUN(loomtest::RunRanks(
        8,
        [](int rank, int n, loomComm_t comm) {
            float v[16], out[16];
            for (int i = 0; i < 16; i++)
                v[i] = static_cast<float>(rank + i);
            for (int it = 0; it < 1000; it++) {
                XT_CHECK_LOOM(loomAllReduce(v, out, 16, loomFloat32, loomSum, comm, nullptr));
                XT_CHECK_EQ(out[3], static_cast<float>(n * 3 + n * (n - 1) / 2));
                if (it % 100 == 0)
                    XT_CHECK_LOOM(loomBarrier(comm, nullptr));
            }
            std::vector<float> big(1 << 16, 1.0f), bigout(1 << 16);
            for (int it = 0; it < 50; it++) {
                XT_CHECK_LOOM(loomAllReduce(big.data(), bigout.data(), big.size(), loomFloat32,
                                            loomSum, comm, nullptr));
                XT_CHECK_EQ(bigout[12345], static_cast<float>(n));
            }
        },
        opts));
}

// LOOM_SHM_COLL=0: no arena; a forced shm algorithm falls back to the default, results exact.
TEST(ShmDisabled, ForcedShmAlgorithmFallsBack)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"},
                {"LOOM_SHM_COLL", "1"},
                {"LOOM_SHM_COLL", "0"},
                {"LOOM_ALGO", "shm_cma"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            Case c{loomCollAllReduce, loomFloat32, loomSum, 100000, false, 0, 5};
            XT_CHECK_MSG(RunCase(c, rank, n, comm).empty(), "allreduce");
            c = {loomCollAllToAll, loomFloat32, loomSum, 1000, false, 0, 6};
            XT_CHECK_MSG(RunCase(c, rank, n, comm).empty(), "alltoall");
        },
        opts));
}

// LOOM_SHM_COLL=0 in one process only: the ranks agree at creation to go without an arena
// (rather than wait for a rank that never maps it).
TEST(ShmDisabled, OnOneRankOnlyMeansNoArenaAnywhere)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "shm"}, {"LOOM_SHM_COLL", "1"}, {"LOOM_TIMEOUT_MS", "20000"}};
    opts.rank_env = [](int rank) {
        return rank == 1 ? loomtest::EnvList{{"LOOM_SHM_COLL", "0"}} : loomtest::EnvList{};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            Case c{loomCollAllReduce, loomFloat32, loomSum, 5000, true, 0, 7};
            XT_CHECK_MSG(RunCase(c, rank, n, comm).empty(), "allreduce");
            c = {loomCollBroadcast, loomInt8, loomSum, 300, false, 1, 8};
            XT_CHECK_MSG(RunCase(c, rank, n, comm).empty(), "broadcast");
        },
        opts));
}

} // namespace

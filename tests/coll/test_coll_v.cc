// SPDX-License-Identifier: Apache-2.0
//
// test_coll_v.cc - the uneven collectives loomAllGatherV and loomReduceScatterV through the
// public API on forked ranks. The grid: each of the two x rank count {1,2,3,4,5,8} x transport
// {shm, tcp} (and hosts of two ranks, shm inside and tcp between, at 3 and 5; ucx at 2 and 3
// where it is built) loops over count
// patterns (uneven, zeros on some ranks, all zero, one rank only, equal), every datatype and op, in
// and out of place, checking each result bit for bit against tests/harness/verify.h (rank order),
// the send buffer unchanged, the gaps between AllGatherV's blocks and the guard bytes untouched;
// with equal counts the result must equal loomAllGather / loomReduceScatter's bit for bit. Then
// each algorithm forced (LOOM_ALGO), the calls in a group and on a stream with the caller's count
// arrays freed before they run, the algorithm in LOOM_COLL_TRACE, and every bad argument refused
// with InvalidArgument on the calling rank alone. Each algorithm also runs on two modelled hosts
// with the ranks dealt round-robin. Run by meson's 'coll' suite.

#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using loomtest::GuardedBuffer;
using Bytes = std::vector<unsigned char>;

enum class Kind { kAllGatherV, kReduceScatterV };

const char *KindName(Kind k)
{
    return k == Kind::kAllGatherV ? "AllGatherV" : "ReduceScatterV";
}

enum class Pattern { kUneven, kZeros, kAllZero, kOneRank, kEqual };

const char *PatternName(Pattern p)
{
    static const char *const names[] = {"uneven", "zeros", "all-zero", "one-rank", "equal"};
    return names[static_cast<int>(p)];
}

// Rank r's count for pattern p with unit k.
std::vector<size_t> Counts(Pattern p, int n, size_t k)
{
    std::vector<size_t> c(static_cast<size_t>(n));
    for (int r = 0; r < n; r++) {
        const size_t ur = static_cast<size_t>(r);
        switch (p) {
        case Pattern::kUneven:
            c[ur] = (ur + 1) * k;
            break;
        case Pattern::kZeros:
            c[ur] = r % 2 ? (ur + 2) * k : 0;
            break;
        case Pattern::kAllZero:
            c[ur] = 0;
            break;
        case Pattern::kOneRank:
            c[ur] = r == n - 1 ? k * static_cast<size_t>(n) + 1 : 0;
            break;
        case Pattern::kEqual:
            c[ur] = k;
            break;
        }
    }
    return c;
}

// AllGatherV's displacements: the blocks in reverse rank order with a gap of two elements
// before each, so that a block written at the wrong place or a gap written at all shows.
std::vector<size_t> Displs(const std::vector<size_t> &counts, bool packed)
{
    std::vector<size_t> d(counts.size());
    size_t at = 0;
    if (packed) {
        for (size_t r = 0; r < counts.size(); r++) {
            d[r] = at;
            at += counts[r];
        }
        return d;
    }
    for (size_t i = counts.size(); i-- > 0;) {
        at += 2;
        d[i] = at;
        at += counts[i];
    }
    return d;
}

size_t Extent(const std::vector<size_t> &counts, const std::vector<size_t> &displs)
{
    size_t e = 0;
    for (size_t r = 0; r < counts.size(); r++)
        if (counts[r])
            e = std::max(e, counts[r] + displs[r]);
    return e;
}

std::vector<size_t> Prefix(const std::vector<size_t> &counts)
{
    std::vector<size_t> p(counts.size());
    size_t at = 0;
    for (size_t r = 0; r < counts.size(); r++) {
        p[r] = at;
        at += counts[r];
    }
    return p;
}

struct Case {
    Kind kind;
    Pattern pattern;
    size_t unit;
    loomDataType_t dt;
    loomRedOp_t op;
    bool inplace;
    uint64_t seed;

    std::string Name() const
    {
        std::string s = std::string(KindName(kind)) + " " + PatternName(pattern) + " unit " +
                        std::to_string(unit) + " " + loomtest::TypeName(dt);
        if (kind == Kind::kReduceScatterV)
            s += std::string(" ") + loomtest::OpName(op);
        return s + (inplace ? " in-place" : " out-of-place");
    }
};

std::vector<Case> MakeCases(Kind kind, int nranks, bool small)
{
    std::vector<Case> cases;
    uint64_t k = 0;
    auto add = [&](Pattern p, size_t unit, loomDataType_t dt, loomRedOp_t op, bool inplace) {
        cases.push_back({kind, p, unit, dt, op, inplace,
                         loomtest::Mix64(k++ * 16 + static_cast<uint64_t>(kind) + 7)});
    };
    const Pattern patterns[] = {Pattern::kUneven, Pattern::kZeros, Pattern::kAllZero,
                                Pattern::kOneRank, Pattern::kEqual};
    int i = 0;
    for (loomDataType_t dt : loomtest::kAllTypes) {
        const int d = static_cast<int>(dt);
        if (kind == Kind::kReduceScatterV) {
            for (loomRedOp_t op : loomtest::kAllOps) {
                add(patterns[i % 5], 3, dt, op, i % 2 != 0);
                i++;
                if (!small)
                    add(patterns[(i + 2) % 5], 517, dt, op, (i + d) % 2 == 0);
            }
        } else {
            for (Pattern p : patterns) {
                add(p, 3, dt, loomSum, i % 2 != 0);
                i++;
                if (!small)
                    add(p, 517, dt, loomSum, (i + d) % 2 == 0);
            }
        }
    }
    // Larger than a pipeline chunk, so the rounds and segments of uneven blocks show.
    if (nranks <= 5) {
        add(Pattern::kUneven, 70001, loomFloat32, loomSum, false);
        add(Pattern::kZeros, 40003, loomBfloat16, loomAvg, true);
        add(Pattern::kEqual, 65537, loomFloat16, loomMax, false);
    }
    return cases;
}

// The failure of a case on this rank, "" if none.
struct Checker {
    std::string failure;
    void Expect(bool ok, const std::string &what)
    {
        if (!ok && failure.empty())
            failure = what;
    }
    void Equal(const void *got, const void *want, size_t count, loomDataType_t dt,
               const std::string &what)
    {
        const std::string diff = loomtest::CompareElements(got, want, count, dt);
        if (!diff.empty() && failure.empty())
            failure = what + ": " + diff;
    }
};

GuardedBuffer Filled(const Bytes &v)
{
    GuardedBuffer b(v.size());
    if (!v.empty())
        memcpy(b.data(), v.data(), v.size());
    return b;
}

std::string RunAllGatherV(const Case &c, int rank, int n, loomComm_t comm)
{
    Checker ck;
    const size_t es = loomtest::TypeSize(c.dt), ur = static_cast<size_t>(rank);
    const std::vector<size_t> counts = Counts(c.pattern, n, c.unit);
    const bool packed = c.pattern == Pattern::kEqual;
    const std::vector<size_t> displs = Displs(counts, packed);
    const size_t extent = Extent(counts, displs), total = Prefix(counts).back() + counts.back();
    Bytes want(extent * es, 0xcd), mine(counts[ur] * es);
    loomtest::FillPattern(mine.data(), mine.size(), rank, c.seed);
    for (int r = 0; r < n; r++) {
        const size_t q = static_cast<size_t>(r);
        if (counts[q])
            loomtest::FillPattern(want.data() + displs[q] * es, counts[q] * es, r, c.seed);
    }
    GuardedBuffer send = Filled(mine), recv(extent * es);
    const void *sendp = send.data();
    if (c.inplace) {
        if (!mine.empty())
            memcpy(recv.bytes() + displs[ur] * es, mine.data(), mine.size());
        sendp = recv.bytes() + displs[ur] * es;
    }
    void *recvp = recv.data();
    if (total == 0) // NULL buffers are legal with nothing to move
        sendp = recvp = nullptr;
    // The arrays are overwritten after the call: the call must have used them already.
    std::vector<size_t> cv = counts, dv = displs;
    XT_CHECK_LOOM(
        loomAllGatherV(sendp, counts[ur], recvp, cv.data(), dv.data(), c.dt, comm, nullptr));
    ck.Equal(recv.data(), want.data(), extent, c.dt, "wrong result");
    if (!c.inplace)
        ck.Equal(send.data(), mine.data(), counts[ur], c.dt, "send buffer changed");
    ck.Expect(send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
    if (packed && ck.failure.empty()) {
        GuardedBuffer even(extent * es);
        XT_CHECK_LOOM(loomAllGather(mine.data(), even.data(), c.unit, c.dt, comm, nullptr));
        ck.Expect(extent == 0 || memcmp(even.data(), recv.data(), extent * es) == 0,
                  "differs from loomAllGather");
    }
    return ck.failure;
}

std::string RunReduceScatterV(const Case &c, int rank, int n, loomComm_t comm)
{
    Checker ck;
    const size_t es = loomtest::TypeSize(c.dt), ur = static_cast<size_t>(rank);
    const std::vector<size_t> counts = Counts(c.pattern, n, c.unit), at = Prefix(counts);
    const size_t total = at.back() + counts.back();
    Bytes in(total * es), want(counts[ur] * es);
    loomtest::FillReduceInput(in.data(), c.dt, c.op, rank, c.seed, 0, total);
    loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, at[ur], counts[ur]);
    GuardedBuffer send = Filled(in), recv(counts[ur] * es);
    const void *sendp = send.data();
    void *outp = c.inplace ? send.bytes() + at[ur] * es : recv.bytes();
    if (total == 0)
        sendp = outp = nullptr;
    std::vector<size_t> cv = counts;
    XT_CHECK_LOOM(loomReduceScatterV(sendp, outp, cv.data(), c.dt, c.op, comm, nullptr));
    if (counts[ur])
        ck.Equal(outp, want.data(), counts[ur], c.dt, "wrong result");
    if (!c.inplace)
        ck.Equal(send.data(), in.data(), total, c.dt, "send buffer changed");
    ck.Expect(send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
    if (c.pattern == Pattern::kEqual && ck.failure.empty()) {
        GuardedBuffer even(c.unit * es);
        XT_CHECK_LOOM(loomReduceScatter(in.data(), even.data(), c.unit, c.dt, c.op, comm, nullptr));
        ck.Expect(memcmp(even.data(), outp, c.unit * es) == 0, "differs from loomReduceScatter");
    }
    return ck.failure;
}

void RunGrid(Kind kind, int rank, int n, loomComm_t comm, bool small)
{
    int failures = 0;
    const std::vector<Case> cases = MakeCases(kind, n, small);
    for (const Case &c : cases) {
        loomtest::SetContext(c.Name());
        const std::string f = kind == Kind::kAllGatherV ? RunAllGatherV(c, rank, n, comm)
                                                        : RunReduceScatterV(c, rank, n, comm);
        if (!f.empty() && failures++ < 20)
            fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, c.Name().c_str(), f.c_str());
    }
    fprintf(stderr, "rank %d: %zu cases, %d failures\n", rank, cases.size(), failures);
    XT_CHECK_EQ(failures, 0);
}

// ---- The grid ----------------------------------------------------------------------------------

struct GridParam {
    Kind kind;
    int nranks;
    const char *net;
};

std::string ParamName(const GridParam &p)
{
    return std::string(KindName(p.kind)) + "_" + std::to_string(p.nranks) + "ranks_" + p.net;
}

void PrintTo(const GridParam &p, std::ostream *os)
{
    *os << ParamName(p);
}

std::vector<GridParam> AllParams()
{
    std::vector<GridParam> params;
    for (Kind k : {Kind::kAllGatherV, Kind::kReduceScatterV})
        for (const char *net : {"shm", "tcp"})
            for (int nranks : {1, 2, 3, 4, 5, 8})
                params.push_back({k, nranks, net});
    for (Kind k : {Kind::kAllGatherV, Kind::kReduceScatterV}) {
        for (int nranks : {3, 5})
            params.push_back({k, nranks, "mixed"});
#ifdef LOOM_HAVE_UCX
        for (int nranks : {2, 3})
            params.push_back({k, nranks, "ucx"});
#endif
    }
    return params;
}

// net: "shm" and "tcp" force one transport (LOOM_NET); "mixed" models hosts of two ranks each
// (LOOM_HOST_ID, ranks in blocks), "cyclic" two hosts with the ranks dealt round-robin, where
// the ring runs in host order.
loomtest::RunOptions NetOptions(const char *net)
{
    loomtest::RunOptions opts;
    const std::string n = net;
    if (n == "mixed")
        opts.rank_env = [](int rank) {
            return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
        };
    else if (n == "cyclic")
        opts.rank_env = [](int rank) {
            return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank % 2)}};
        };
    else
        opts.env = {{"LOOM_NET", net}};
    return opts;
}

class VGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(VGrid, AllCases)
{
    const GridParam p = GetParam();
    loomtest::RunOptions opts = NetOptions(p.net);
    opts.deadline_s = 90;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks, [&](int rank, int n, loomComm_t comm) { RunGrid(p.kind, rank, n, comm, false); },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Coll, VGrid, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<GridParam> &info) {
                             return ParamName(info.param);
                         });

// ---- Each algorithm forced ----------------------------------------------------------------------

struct AlgoParam {
    Kind kind;
    const char *algo;
    int nranks;
    const char *net;
};

std::string AlgoName(const AlgoParam &p)
{
    return std::string(KindName(p.kind)) + "_" + p.algo + "_" + std::to_string(p.nranks) +
           "ranks_" + p.net;
}

void PrintTo(const AlgoParam &p, std::ostream *os)
{
    *os << AlgoName(p);
}

std::vector<AlgoParam> AlgoParams()
{
    std::vector<AlgoParam> params;
    for (Kind k : {Kind::kAllGatherV, Kind::kReduceScatterV}) {
        for (const char *algo : {"direct", "ring"})
            for (const char *net : {"shm", "tcp"})
                for (int nranks : {2, 3, 5})
                    params.push_back({k, algo, nranks, net});
        for (const char *algo : {"shm_cico", "shm_cma"})
            for (int nranks : {2, 3, 5})
                params.push_back({k, algo, nranks, "shm"});
        for (const char *algo : {"direct", "ring"})
            params.push_back({k, algo, 4, "cyclic"});
    }
    return params;
}

class VAlgo : public ::testing::TestWithParam<AlgoParam> {};

// The ring adds in an order of its own from 3 ranks: LOOM_DETERMINISTIC=0 lets it run (the
// inputs make every order exact, verify.h). Small chunks and arena slots make many rounds of
// uneven blocks; the arena's single copy is forced where the machine allows it (shm_cma falls
// back to shm_cico where it does not, which the trace would show as cico).
TEST_P(VAlgo, AllCases)
{
    const AlgoParam p = GetParam();
    loomtest::RunOptions opts = NetOptions(p.net);
    const std::string spell = p.kind == Kind::kAllGatherV ? "allgatherv:" : "reducescatterv:";
    opts.env.insert(opts.env.end(), {{"LOOM_ALGO", spell + p.algo},
                                     {"LOOM_DETERMINISTIC", "0"},
                                     {"LOOM_CHUNK_BYTES", "4096"},
                                     {"LOOM_SHM_COLL_BYTES", "16384"},
                                     {"LOOM_SHM_COLL_CMA", "2"}});
    opts.deadline_s = 90;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks, [&](int rank, int n, loomComm_t comm) { RunGrid(p.kind, rank, n, comm, true); },
        opts));
}

INSTANTIATE_TEST_SUITE_P(Coll, VAlgo, ::testing::ValuesIn(AlgoParams()),
                         [](const ::testing::TestParamInfo<AlgoParam> &info) {
                             return AlgoName(info.param);
                         });

// ---- Groups and streams: the count arrays are the library's copies ------------------------------

// Two V calls (and their equal-count checks) recorded in one group or queued on a stream, the
// caller's arrays overwritten with nonsense before they run.
void GroupedOrQueued(int rank, int n, loomComm_t comm, bool stream_mode)
{
    const size_t ur = static_cast<size_t>(rank);
    std::vector<size_t> counts = Counts(Pattern::kZeros, n, 1000);
    std::vector<size_t> displs = Displs(counts, false);
    const std::vector<size_t> at = Prefix(counts);
    const size_t extent = Extent(counts, displs), total = at.back() + counts.back();
    const uint64_t seed = 99;
    Bytes mine(counts[ur] * 4), gathered(extent * 4, 0xcd), in(total * 4),
        want_ag(extent * 4, 0xcd), want_rs(counts[ur] * 4), out(counts[ur] * 4 + 1);
    loomtest::FillPattern(mine.data(), mine.size(), rank, seed);
    for (int r = 0; r < n; r++) {
        const size_t q = static_cast<size_t>(r);
        loomtest::FillPattern(want_ag.data() + displs[q] * 4, counts[q] * 4, r, seed);
    }
    loomtest::FillReduceInput(in.data(), loomFloat32, loomSum, rank, seed, 0, total);
    loomtest::FillReduceExpected(want_rs.data(), loomFloat32, loomSum, n, seed, at[ur], counts[ur]);
    auto cv = std::make_unique<std::vector<size_t>>(counts);
    auto dv = std::make_unique<std::vector<size_t>>(displs);
    loomStream_t s = nullptr;
    if (stream_mode) {
        XT_CHECK_LOOM(loomStreamCreate(&s));
    } else {
        XT_CHECK_LOOM(loomGroupStart());
    }
    XT_CHECK_LOOM(loomAllGatherV(mine.data(), counts[ur], gathered.data(), cv->data(), dv->data(),
                                 loomFloat32, comm, s));
    XT_CHECK_LOOM(
        loomReduceScatterV(in.data(), out.data(), cv->data(), loomFloat32, loomSum, comm, s));
    std::fill(cv->begin(), cv->end(), size_t{123456789});
    std::fill(dv->begin(), dv->end(), size_t{987654321});
    cv.reset();
    dv.reset();
    if (stream_mode) {
        XT_CHECK_LOOM(loomStreamSynchronize(s));
        XT_CHECK_LOOM(loomStreamDestroy(s));
    } else {
        XT_CHECK_LOOM(loomGroupEnd());
    }
    XT_CHECK_MSG(gathered == want_ag, "AllGatherV result");
    XT_CHECK_MSG(
        loomtest::CompareElements(out.data(), want_rs.data(), counts[ur], loomFloat32).empty(),
        "ReduceScatterV result");
}

TEST(CollV, TwoCallsInOneGroup)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", "tcp"}};
    XT_ASSERT_RUN(loomtest::RunRanks(
        4, [](int rank, int n, loomComm_t comm) { GroupedOrQueued(rank, n, comm, false); }, opts));
}

TEST(CollV, OnAStream)
{
    XT_ASSERT_RUN(loomtest::RunRanks(
        3, [](int rank, int n, loomComm_t comm) { GroupedOrQueued(rank, n, comm, true); }));
}

// ---- LOOM_COLL_TRACE names the algorithm --------------------------------------------------------

std::string TracePath(int rank)
{
    return loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log";
}

TEST(CollV, TraceNamesTheAlgorithm)
{
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_COLL_TRACE", "1"},
                {"LOOM_DEBUG", "INFO"},
                {"LOOM_DEBUG_SUBSYS", "COLL"},
                {"LOOM_NET", "tcp"},
                {"LOOM_ALGO", "allgatherv:ring,reducescatterv:direct"}};
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{{"LOOM_DEBUG_FILE", TracePath(rank)}};
    };
    XT_ASSERT_RUN(loomtest::RunRanks(
        3,
        [](int rank, int n, loomComm_t comm) {
            std::vector<size_t> counts = Counts(Pattern::kUneven, n, 5),
                                displs = Displs(counts, true);
            std::vector<float> mine(counts[static_cast<size_t>(rank)], 1.0f), all(15 * 2);
            XT_CHECK_LOOM(loomAllGatherV(mine.data(), mine.size(), all.data(), counts.data(),
                                         displs.data(), loomFloat32, comm, nullptr));
            XT_CHECK_LOOM(loomReduceScatterV(all.data(), mine.data(), counts.data(), loomFloat32,
                                             loomSum, comm, nullptr));
            std::ifstream f(TracePath(rank));
            std::string line;
            bool ag = false, rs = false;
            while (std::getline(f, line)) {
                ag = ag || (line.find(" allgatherv seq ") != std::string::npos &&
                            line.find(" algo ring ") != std::string::npos);
                rs = rs || (line.find(" reducescatterv seq ") != std::string::npos &&
                            line.find(" algo direct order rank ") != std::string::npos);
            }
            XT_CHECK_MSG(ag && rs, "the trace names allgatherv ring and reducescatterv direct");
        },
        opts));
}

// ---- Bad arguments -----------------------------------------------------------------------------

// Every bad call on rank 0 alone returns InvalidArgument at once (nothing is sent, so no peer
// waits); then a good call on every rank shows the communicator still works.
void BadArguments(int rank, int n, loomComm_t comm)
{
    std::vector<size_t> counts = Counts(Pattern::kUneven, n, 4), displs = Displs(counts, true);
    const size_t total = 4 * static_cast<size_t>(n * (n + 1) / 2);
    std::vector<float> buf(total * 2, 1.0f), out(total, 0.0f);
    const size_t mine = counts[static_cast<size_t>(rank)];
    float *send = buf.data() + total; // outside out
    if (rank == 0) {
        const loomResult_t bad = loomInvalidArgument;
        // AllGatherV
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine + 1, out.data(), counts.data(), displs.data(),
                                         loomFloat32, comm, nullptr),
                          bad); // sendcount != recvcounts[rank]
        XT_CHECK_LOOM_RES(loomAllGatherV(nullptr, mine, out.data(), counts.data(), displs.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, nullptr, counts.data(), displs.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), nullptr, displs.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), counts.data(), nullptr,
                                         loomFloat32, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), counts.data(), displs.data(),
                                         static_cast<loomDataType_t>(99), comm, nullptr),
                          bad);
        std::vector<size_t> overlap = displs;
        overlap[1] = overlap[0] + counts[0] - 1; // rank 1's block starts inside rank 0's
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), counts.data(), overlap.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomAllGatherV(out.data() + 1, mine, out.data(), counts.data(),
                                         displs.data(), loomFloat32, comm, nullptr),
                          bad); // send overlaps recv without being the in-place layout
        std::vector<size_t> huge = counts;
        huge[1] = (size_t{1} << 56) / 4;
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), huge.data(), displs.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        std::vector<size_t> far = displs;
        far[1] = SIZE_MAX - 2;
        XT_CHECK_LOOM_RES(loomAllGatherV(send, mine, out.data(), counts.data(), far.data(),
                                         loomFloat32, comm, nullptr),
                          bad);
        // ReduceScatterV
        XT_CHECK_LOOM_RES(loomReduceScatterV(nullptr, out.data(), counts.data(), loomFloat32,
                                             loomSum, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), nullptr, counts.data(), loomFloat32,
                                             loomSum, comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), out.data(), nullptr, loomFloat32, loomSum,
                                             comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), out.data(), counts.data(), loomFloat32,
                                             static_cast<loomRedOp_t>(42), comm, nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), out.data(), counts.data(),
                                             static_cast<loomDataType_t>(-1), loomSum, comm,
                                             nullptr),
                          bad);
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), buf.data() + 1, counts.data(), loomFloat32,
                                             loomSum, comm, nullptr),
                          bad); // recv inside send, not at this rank's block
        std::vector<size_t> sum_over = counts;
        sum_over[0] = (size_t{1} << 56) / 8;
        sum_over[1] = (size_t{1} << 56) / 8;
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), out.data(), sum_over.data(), loomFloat64,
                                             loomSum, comm, nullptr),
                          bad); // each fits, the sum does not
        std::vector<size_t> wrap = counts;
        wrap[0] = SIZE_MAX;
        XT_CHECK_LOOM_RES(loomReduceScatterV(buf.data(), out.data(), wrap.data(), loomUint8,
                                             loomSum, comm, nullptr),
                          bad);
    }
    std::vector<float> all(total);
    XT_CHECK_LOOM(loomAllGatherV(send, mine, all.data(), counts.data(), displs.data(), loomFloat32,
                                 comm, nullptr));
    XT_CHECK_LOOM(loomReduceScatterV(buf.data(), out.data(), counts.data(), loomFloat32, loomSum,
                                     comm, nullptr));
    for (size_t i = 0; i < mine; i++)
        XT_CHECK_EQ(out[i], static_cast<float>(n));
}

TEST(CollV, BadArgumentsAreRefused)
{
    loomtest::RunOptions opts;
    opts.deadline_s = 20;
    XT_ASSERT_RUN(loomtest::RunRanks(3, BadArguments, opts));
}

} // namespace

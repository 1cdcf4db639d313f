// SPDX-License-Identifier: Apache-2.0
//
// test_coll_grid.cc - the collective grid. Each collective x rank count {1,2,3,4,5,8} x
// transport {shm, tcp} (and shm+tcp mixed at 3 and 5 ranks) is one gtest case that forks its
// ranks once and loops over many (datatype, op, count, in/out-of-place, root) cases, checking
// each result bit for bit against tests/harness/verify.h, the send buffer unchanged, guard bytes
// intact, identical outputs on every rank (one all-gather of checksums at the end) and identical
// reruns. It prunes: counts of 2^20+3 only for a few types at up to 4 ranks. It does not test
// errors (test_coll_args.cc). Run by meson's 'coll' suite.

#include <cstring>
#include <string>
#include <vector>

#include "coll_kind.h"
#include "loom.h"
#include "mp_fixture.h"
#include "verify.h"

namespace {

using loomtest::GuardedBuffer;

// Outputs that the contract makes identical on every rank.
bool SameOnAllRanks(loomCollective_t c)
{
    return c == loomCollAllReduce || c == loomCollAllGather || c == loomCollBroadcast;
}

constexpr size_t kBigCount = (size_t{1} << 20) + 3;

struct Case {
    loomCollective_t coll;
    loomDataType_t dt;
    loomRedOp_t op;
    size_t count; // per-rank count as the call takes it (recvcount for ReduceScatter)
    bool inplace;
    int root;
    bool null_ignored; // pass NULL for the buffers the contract says are ignored
    bool twice;        // run a second time and compare bitwise (run-to-run determinism)
    uint64_t seed;

    std::string Name() const
    {
        std::string s = std::string(loomtest::CollName(coll)) + " " + loomtest::TypeName(dt);
        if (loomtest::Reducing(coll))
            s += std::string(" ") + loomtest::OpName(op);
        s += " count " + std::to_string(count) + (inplace ? " in-place" : " out-of-place");
        if (loomtest::Rooted(coll))
            s += " root " + std::to_string(root) + (null_ignored ? " (NULL ignored buffer)" : "");
        return s;
    }
};

std::vector<Case> MakeCases(loomCollective_t coll, int nranks)
{
    std::vector<Case> cases;
    int k = 0;
    auto add = [&](loomDataType_t dt, loomRedOp_t op, size_t count, bool inplace) {
        Case c{coll, dt, op, count, inplace && coll != loomCollAllToAll, 0, false, false, 0};
        if (loomtest::Rooted(coll)) {
            // Pseudo-random over k / 2: an out-of-place/in-place pair shares its root, and both
            // roots meet every datatype and count.
            const uint64_t h = loomtest::Mix64(static_cast<uint64_t>(k / 2));
            c.root = h % 2 ? nranks - 1 : 0;
            c.null_ignored = !inplace && (h >> 8) % 3 == 0;
        }
        c.seed = loomtest::Mix64(static_cast<uint64_t>(k) * 64 + static_cast<uint64_t>(coll));
        k++;
        cases.push_back(c);
    };
    if (loomtest::Reducing(coll)) {
        for (loomDataType_t dt : loomtest::kAllTypes) {
            for (loomRedOp_t op : loomtest::kAllOps) {
                add(dt, op, 7, false);
                add(dt, op, 7, true);
                add(dt, op, 4097, (static_cast<int>(dt) + static_cast<int>(op)) % 2 != 0);
            }
        }
        for (loomDataType_t dt : loomtest::kAllTypes) {
            const int d = static_cast<int>(dt);
            add(dt, static_cast<loomRedOp_t>(d % 5), 0, false);
            add(dt, static_cast<loomRedOp_t>((d + 1) % 5), 1, true);
            add(dt, static_cast<loomRedOp_t>((d + 2) % 5), 1, false);
            add(dt, static_cast<loomRedOp_t>((d + 3) % 5), 0, true);
        }
        if (nranks <= 4) {
            // Three large cases per rank count, rotating through this list so that ranks
            // 1..4 cover all of it.
            const std::pair<loomDataType_t, loomRedOp_t> big[] = {
                {loomFloat32, loomSum},    {loomBfloat16, loomAvg}, {loomFloat8e4m3, loomSum},
                {loomInt64, loomProd},     {loomFloat16, loomMin},  {loomUint8, loomMax},
                {loomFloat8e5m2, loomAvg}, {loomFloat64, loomSum}};
            for (int j = 0; j < 3; j++) {
                const auto &b = big[(nranks * 3 + j) % 8];
                add(b.first, b.second, kBigCount, (nranks + j) % 2 != 0);
            }
        }
    } else {
        for (loomDataType_t dt : loomtest::kAllTypes)
            for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}})
                for (bool inplace : {false, true})
                    if (!inplace || coll != loomCollAllToAll)
                        add(dt, loomSum, count, inplace);
        if (nranks <= 4) {
            const loomDataType_t big[] = {loomInt8, loomFloat16, loomFloat32, loomFloat64};
            for (int j = 0; j < 2; j++)
                add(big[(nranks * 2 + j) % 4], loomSum, kBigCount, (nranks + j) % 2 != 0);
        }
    }
    // Determinism: one mid-size case and the first large one (or a second mid-size one).
    bool marked_mid = false, marked_big = false;
    for (Case &c : cases) {
        const bool narrow_avg =
            c.dt == loomBfloat16 && (c.op == loomAvg || !loomtest::Reducing(coll));
        if (!marked_mid && c.count == 4097 && narrow_avg) {
            c.twice = marked_mid = true;
        } else if (!marked_big && (c.count == kBigCount ||
                                   (nranks > 4 && c.count == 4097 && c.dt == loomFloat32))) {
            c.twice = marked_big = true;
        }
    }
    return cases;
}

// ---- One case on one rank -------------------------------------------------------------------

struct CaseResult {
    std::string failure; // empty if every check passed
    uint64_t checksum = 0;
};

void Expect(CaseResult &res, bool ok, const std::string &what)
{
    if (!ok && res.failure.empty())
        res.failure = what;
}

void ExpectEqual(CaseResult &res, const void *got, const void *want, size_t count,
                 loomDataType_t dt, const std::string &what)
{
    const std::string diff = loomtest::CompareElements(got, want, count, dt);
    if (!diff.empty() && res.failure.empty())
        res.failure = what + ": " + diff;
}

std::vector<unsigned char> ReduceInput(const Case &c, int rank, size_t count)
{
    std::vector<unsigned char> v(count * loomtest::TypeSize(c.dt));
    loomtest::FillReduceInput(v.data(), c.dt, c.op, rank, c.seed, 0, count);
    return v;
}

std::vector<unsigned char> Pattern(const Case &c, int rank, size_t nbytes, size_t first = 0)
{
    std::vector<unsigned char> v(nbytes);
    loomtest::FillPattern(v.data(), nbytes, rank, c.seed, first);
    return v;
}

GuardedBuffer Filled(const std::vector<unsigned char> &v)
{
    GuardedBuffer b(v.size());
    if (!v.empty())
        memcpy(b.data(), v.data(), v.size());
    return b;
}

CaseResult RunCase(const Case &c, int rank, int n, loomComm_t comm)
{
    CaseResult res;
    const size_t es = loomtest::TypeSize(c.dt);
    const size_t bytes = c.count * es;
    const size_t nsz = static_cast<size_t>(n);
    const size_t urank = static_cast<size_t>(rank);
    switch (c.coll) {
    case loomCollAllReduce: {
        const auto in = ReduceInput(c, rank, c.count);
        std::vector<unsigned char> want(bytes);
        loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, 0, c.count);
        GuardedBuffer send = Filled(in), recv(bytes);
        GuardedBuffer &out = c.inplace ? send : recv;
        XT_CHECK_LOOM(loomAllReduce(send.data(), out.data(), c.count, c.dt, c.op, comm, nullptr));
        if (!c.inplace)
            ExpectEqual(res, send.data(), in.data(), c.count, c.dt, "send buffer changed");
        ExpectEqual(res, out.data(), want.data(), c.count, c.dt, "wrong result");
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        res.checksum = loomtest::Checksum(out.data(), bytes);
        break;
    }
    case loomCollAllGather: {
        const auto mine = Pattern(c, rank, bytes);
        std::vector<unsigned char> want(nsz * bytes);
        for (int r = 0; r < n; r++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(r) * bytes, bytes, r, c.seed);
        GuardedBuffer send = Filled(mine), recv(nsz * bytes);
        const void *sendp = send.data();
        if (c.inplace) {
            if (bytes > 0)
                memcpy(recv.bytes() + urank * bytes, mine.data(), bytes);
            sendp = recv.bytes() + urank * bytes;
        }
        XT_CHECK_LOOM(loomAllGather(sendp, recv.data(), c.count, c.dt, comm, nullptr));
        if (!c.inplace)
            ExpectEqual(res, send.data(), mine.data(), c.count, c.dt, "send buffer changed");
        ExpectEqual(res, recv.data(), want.data(), nsz * c.count, c.dt, "wrong result");
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        res.checksum = loomtest::Checksum(recv.data(), nsz * bytes);
        break;
    }
    case loomCollReduceScatter: {
        const auto in = ReduceInput(c, rank, nsz * c.count);
        std::vector<unsigned char> want(bytes);
        loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, urank * c.count, c.count);
        GuardedBuffer send = Filled(in), recv(bytes);
        unsigned char *outp = c.inplace ? send.bytes() + urank * bytes : recv.bytes();
        XT_CHECK_LOOM(loomReduceScatter(send.data(), outp, c.count, c.dt, c.op, comm, nullptr));
        if (!c.inplace)
            ExpectEqual(res, send.data(), in.data(), nsz * c.count, c.dt, "send buffer changed");
        ExpectEqual(res, outp, want.data(), c.count, c.dt, "wrong result");
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        res.checksum = loomtest::Checksum(outp, bytes);
        break;
    }
    case loomCollBroadcast: {
        const auto data = Pattern(c, c.root, bytes);
        const auto other = Pattern(c, rank + 1000, bytes); // a non-root's unused send buffer
        GuardedBuffer send = Filled(rank == c.root ? data : other), recv(bytes);
        if (c.inplace && rank != c.root)
            memset(send.data(), 0xcd, bytes);
        const void *sendp = send.data();
        if (!c.inplace && rank != c.root && c.null_ignored)
            sendp = nullptr;
        void *recvp = c.inplace ? send.data() : recv.data();
        XT_CHECK_LOOM(loomBroadcast(sendp, recvp, c.count, c.dt, c.root, comm, nullptr));
        if (!c.inplace)
            ExpectEqual(res, send.data(), rank == c.root ? data.data() : other.data(), c.count,
                        c.dt, "send buffer changed");
        ExpectEqual(res, recvp, data.data(), c.count, c.dt, "wrong result");
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        res.checksum = loomtest::Checksum(recvp, bytes);
        break;
    }
    case loomCollReduce: {
        const auto in = ReduceInput(c, rank, c.count);
        std::vector<unsigned char> want(bytes);
        if (rank == c.root)
            loomtest::FillReduceExpected(want.data(), c.dt, c.op, n, c.seed, 0, c.count);
        const std::vector<unsigned char> canary(bytes, 0xcd);
        GuardedBuffer send = Filled(in), recv(bytes);
        void *recvp = c.inplace ? send.data() : recv.data();
        if (!c.inplace && rank != c.root && c.null_ignored)
            recvp = nullptr;
        XT_CHECK_LOOM(loomReduce(send.data(), recvp, c.count, c.dt, c.op, c.root, comm, nullptr));
        if (rank == c.root) {
            if (!c.inplace)
                ExpectEqual(res, send.data(), in.data(), c.count, c.dt, "send buffer changed");
            ExpectEqual(res, recvp, want.data(), c.count, c.dt, "wrong result on the root");
            res.checksum = loomtest::Checksum(recvp, bytes);
        } else {
            // recvbuff is ignored off the root, and sendbuff is never written.
            ExpectEqual(res, send.data(), in.data(), c.count, c.dt, "non-root buffer changed");
            ExpectEqual(res, recv.data(), canary.data(), c.count, c.dt,
                        "non-root recvbuff written");
        }
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        break;
    }
    case loomCollAllToAll: {
        const auto mine = Pattern(c, rank, nsz * bytes);
        std::vector<unsigned char> want(nsz * bytes);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, c.seed,
                                  urank * bytes);
        GuardedBuffer send = Filled(mine), recv(nsz * bytes);
        XT_CHECK_LOOM(loomAllToAll(send.data(), recv.data(), c.count, c.dt, comm, nullptr));
        ExpectEqual(res, send.data(), mine.data(), nsz * c.count, c.dt, "send buffer changed");
        ExpectEqual(res, recv.data(), want.data(), nsz * c.count, c.dt, "wrong result");
        Expect(res, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        res.checksum = loomtest::Checksum(recv.data(), nsz * bytes);
        break;
    }
    case loomNumCollectives: // not a collective
        Expect(res, false, "no such collective");
        break;
    }
    return res;
}

// Runs every case of one collective on one rank; failures are printed and counted so that one
// run reports all of them (the checks are local, so the ranks stay in step).
void RunGrid(loomCollective_t coll, int rank, int n, loomComm_t comm)
{
    const std::vector<Case> cases = MakeCases(coll, n);
    std::vector<uint64_t> sums;
    std::vector<size_t> sum_case;
    int failures = 0;
    auto report = [&](const Case &c, const std::string &what) {
        if (failures++ < 20)
            fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, c.Name().c_str(), what.c_str());
    };
    for (size_t k = 0; k < cases.size(); k++) {
        const Case &c = cases[k];
        loomtest::SetContext(c.Name());
        CaseResult r = RunCase(c, rank, n, comm);
        if (!r.failure.empty())
            report(c, r.failure);
        if (c.twice) {
            CaseResult again = RunCase(c, rank, n, comm);
            if (!again.failure.empty())
                report(c, "second run: " + again.failure);
            else if (again.checksum != r.checksum)
                report(c, "second run differs from the first");
        }
        if (SameOnAllRanks(coll)) {
            sums.push_back(r.checksum);
            sum_case.push_back(k);
        }
    }
    loomtest::SetContext("comparing output checksums across ranks");
    if (!sums.empty()) {
        std::vector<uint64_t> all(sums.size() * static_cast<size_t>(n));
        XT_CHECK_LOOM(
            loomAllGather(sums.data(), all.data(), sums.size(), loomUint64, comm, nullptr));
        for (size_t k = 0; k < sums.size(); k++)
            for (int r = 0; r < n; r++)
                if (all[static_cast<size_t>(r) * sums.size() + k] != sums[k])
                    report(cases[sum_case[k]], "output differs between rank " +
                                                   std::to_string(rank) + " and rank " +
                                                   std::to_string(r));
    }
    fprintf(stderr, "rank %d: %zu cases, %d failures\n", rank, cases.size(), failures);
    XT_CHECK_EQ(failures, 0);
}

// ---- The gtest grid -------------------------------------------------------------------------

struct GridParam {
    loomCollective_t coll;
    int nranks;
    const char *net;
};

std::string ParamName(const GridParam &p)
{
    return std::string(loomtest::CollName(p.coll)) + "_" + std::to_string(p.nranks) + "ranks_" +
           p.net;
}

void PrintTo(const GridParam &p, std::ostream *os)
{
    *os << ParamName(p);
}

// net: "shm" and "tcp" force one transport (LOOM_NET); "mixed" models hosts of two ranks each
// (LOOM_HOST_ID), so ranks on one "host" use shared memory and the others TCP.
std::vector<GridParam> AllParams()
{
    std::vector<GridParam> params;
    for (loomCollective_t coll : {loomCollAllReduce, loomCollAllGather, loomCollReduceScatter,
                                  loomCollBroadcast, loomCollReduce, loomCollAllToAll}) {
        for (const char *net : {"shm", "tcp"})
            for (int nranks : {1, 2, 3, 4, 5, 8})
                params.push_back({coll, nranks, net});
        for (int nranks : {3, 5})
            params.push_back({coll, nranks, "mixed"});
    }
    return params;
}

class Grid : public ::testing::TestWithParam<GridParam> {};

TEST_P(Grid, AllCases)
{
    const GridParam p = GetParam();
    loomtest::RunOptions opts;
    if (std::string(p.net) == "mixed")
        opts.rank_env = [](int rank) {
            return loomtest::EnvList{{"LOOM_HOST_ID", "host" + std::to_string(rank / 2)}};
        };
    else
        opts.env = {{"LOOM_NET", p.net}};
    opts.deadline_s = 60;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks, [&](int rank, int n, loomComm_t comm) { RunGrid(p.coll, rank, n, comm); }, opts));
}

INSTANTIATE_TEST_SUITE_P(Coll, Grid, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<GridParam> &info) {
                             return ParamName(info.param);
                         });

} // namespace

// SPDX-License-Identifier: Apache-2.0
//
// test_hygiene_soak.cc - a soak: 10,000 back-to-back operations on one 4-rank communicator, once
// over shm and once over tcp. Each step draws a collective (all eight kinds, AllToAllv and
// groups of Send/Recv among them, some groups with an all-reduce inside), a datatype, a
// reduction, a root, in-place or not, and a size from 0 to 4 MiB skewed toward small ones. Every
// result is checked bit for bit against tests/harness/verify.h. The plan comes from one seed,
// printed with the case counts; LOOMTEST_SOAK_SEED replays a seed and LOOMTEST_SOAK_OPS changes
// the step count (sanitizer builds default to 2,000). It does not test errors or timing.
// Run by meson's 'hygiene' suite.

#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "loom.h"
#include "mp_fixture.h"
#include "resources.h"
#include "verify.h"

namespace {

using Bytes = std::vector<unsigned char>;
using loomtest::GuardedBuffer;

constexpr int kRanks = 4;
constexpr uint64_t kDefaultSeed = 0x10c0ffee;
constexpr int kDefaultSteps = 10000;
constexpr int kSanitizerSteps = 2000;
constexpr size_t kMaxBytes = size_t{4} << 20;

enum class Kind {
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kBroadcast,
    kReduce,
    kAllToAll,
    kAllToAllv,
    kSendRecv
};

const char *KindName(Kind k)
{
    static const char *const names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                        "Reduce",    "AllToAll",  "AllToAllv",     "SendRecv"};
    return names[static_cast<int>(k)];
}

// Kinds with their weights (per 100 steps).
const std::pair<Kind, int> kKindWeights[] = {{Kind::kAllReduce, 24},     {Kind::kAllGather, 10},
                                             {Kind::kReduceScatter, 10}, {Kind::kBroadcast, 10},
                                             {Kind::kReduce, 10},        {Kind::kAllToAll, 10},
                                             {Kind::kAllToAllv, 10},     {Kind::kSendRecv, 16}};

struct Step {
    Kind kind;
    loomDataType_t dt;
    loomRedOp_t op;
    size_t count; // as the call takes it; AllToAllv and SendRecv: the largest block
    int root;
    bool inplace;
    bool with_allreduce; // SendRecv: an all-reduce of count elements inside the same group
    uint64_t seed;
    size_t bytes; // the size this step was drawn with (bytes per rank buffer)

    std::string Name(size_t index) const
    {
        std::ostringstream os;
        os << "step " << index << ": " << KindName(kind) << " " << loomtest::TypeName(dt);
        if (kind == Kind::kAllReduce || kind == Kind::kReduceScatter || kind == Kind::kReduce)
            os << " " << loomtest::OpName(op);
        os << " count " << count << (inplace ? " in-place" : "") << " root " << root;
        if (with_allreduce)
            os << " with an all-reduce";
        return os.str();
    }
};

class Rng {
  public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t Next()
    {
        state_ += 0x9e3779b97f4a7c15ULL;
        return loomtest::Mix64(state_);
    }
    uint64_t Below(uint64_t n)
    {
        return n ? Next() % n : 0;
    }

  private:
    uint64_t state_;
};

// Mostly small: 2% empty, 83% up to 16 KiB, 13.5% up to 512 KiB, 1.5% up to 4 MiB, each band
// log-uniform (the power of two uniform, then a value within it).
size_t DrawBytes(Rng &rng)
{
    const uint64_t u = rng.Below(1000);
    int lo, hi;
    if (u < 20)
        return 0;
    if (u < 850)
        lo = 0, hi = 14;
    else if (u < 985)
        lo = 14, hi = 19;
    else
        lo = 19, hi = 22;
    const int b = lo + static_cast<int>(rng.Below(static_cast<uint64_t>(hi - lo)));
    const size_t v = (size_t{1} << b) + rng.Below(uint64_t{1} << b);
    return std::min(v, kMaxBytes);
}

std::vector<Step> MakePlan(uint64_t seed, int steps, int n)
{
    Rng rng(seed);
    std::vector<Step> plan;
    plan.reserve(static_cast<size_t>(steps));
    for (int i = 0; i < steps; i++) {
        Step s{};
        uint64_t w = rng.Below(100);
        for (const auto &kw : kKindWeights) {
            s.kind = kw.first;
            if (w < static_cast<uint64_t>(kw.second))
                break;
            w -= static_cast<uint64_t>(kw.second);
        }
        s.dt = loomtest::kAllTypes[rng.Below(std::size(loomtest::kAllTypes))];
        s.op = loomtest::kAllOps[rng.Below(std::size(loomtest::kAllOps))];
        s.bytes = DrawBytes(rng);
        const size_t es = loomtest::TypeSize(s.dt);
        // Kinds whose buffers hold one block per rank divide the size among the ranks.
        const bool per_rank = s.kind == Kind::kAllGather || s.kind == Kind::kReduceScatter ||
                              s.kind == Kind::kAllToAll || s.kind == Kind::kAllToAllv ||
                              s.kind == Kind::kSendRecv;
        s.count = s.bytes / es / (per_rank ? static_cast<size_t>(n) : 1);
        if (s.count == 0 && s.bytes > 0)
            s.count = 1; // count 0 only where it was drawn

        s.root = static_cast<int>(rng.Below(static_cast<uint64_t>(n)));
        s.inplace = rng.Below(2) != 0 && s.kind != Kind::kAllToAll && s.kind != Kind::kAllToAllv &&
                    s.kind != Kind::kSendRecv;
        s.with_allreduce = s.kind == Kind::kSendRecv && rng.Below(4) == 0;
        s.seed = rng.Next();
        plan.push_back(s);
    }
    return plan;
}

// ---- one step on one rank
// ------------------------------------------------------------------------

Bytes ReduceInput(const Step &s, int rank, size_t count)
{
    Bytes b(count * loomtest::TypeSize(s.dt));
    loomtest::FillReduceInput(b.data(), s.dt, s.op, rank, s.seed, 0, count);
    return b;
}

Bytes Pattern(uint64_t seed, int who, size_t nbytes, size_t first = 0)
{
    Bytes b(nbytes);
    loomtest::FillPattern(b.data(), nbytes, who, seed, first);
    return b;
}

void Expect(const void *got, const void *want, size_t count, loomDataType_t dt,
            const std::string &what)
{
    if (count == 0 || memcmp(got, want, count * loomtest::TypeSize(dt)) == 0)
        return;
    XT_CHECK_MSG(false, what + ": " + loomtest::CompareElements(got, want, count, dt));
}

// Elements rank a sends to rank b in an AllToAllv or Send/Recv step; -1: no message at all
// (Send/Recv only). Zero-length messages are drawn on purpose.
long long Block(const Step &s, int a, int b)
{
    const uint64_t h =
        loomtest::Mix64(s.seed ^ (static_cast<uint64_t>(a) << 8) ^ static_cast<uint64_t>(b));
    if (h % 5 == 0)
        return s.kind == Kind::kSendRecv ? -1 : 0;
    if (h % 7 == 0)
        return 0;
    return static_cast<long long>((h >> 16) % (s.count + 1));
}

void RunAllToAllv(const Step &s, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(s.dt), un = static_cast<size_t>(n);
    std::vector<size_t> scount(un), sdispl(un), rcount(un), rdispl(un);
    size_t stotal = 0, rtotal = 0;
    for (size_t p = 0; p < un; p++) { // one element of gap before every other block
        stotal += p % 2;
        sdispl[p] = stotal;
        scount[p] = static_cast<size_t>(Block(s, rank, static_cast<int>(p)));
        stotal += scount[p];
        rtotal += (p + 1) % 2;
        rdispl[p] = rtotal;
        rcount[p] = static_cast<size_t>(Block(s, static_cast<int>(p), rank));
        rtotal += rcount[p];
    }
    Bytes send(stotal * es);
    for (size_t p = 0; p < un; p++)
        loomtest::FillPattern(send.data() + sdispl[p] * es, scount[p] * es,
                              rank * 64 + static_cast<int>(p), s.seed);
    GuardedBuffer recv(rtotal * es);
    XT_CHECK_LOOM(loomAllToAllv(send.data(), scount.data(), sdispl.data(), recv.data(),
                                rcount.data(), rdispl.data(), s.dt, comm, nullptr));
    for (size_t p = 0; p < un; p++)
        Expect(recv.bytes() + rdispl[p] * es,
               Pattern(s.seed, static_cast<int>(p) * 64 + rank, rcount[p] * es).data(), rcount[p],
               s.dt, "block from rank " + std::to_string(p));
    XT_CHECK(recv.GuardsIntact());
}

// A group of Send/Recv with every peer (self included) that Block() gives a message, posted in
// an order of this rank's own, optionally with an all-reduce among them.
void RunSendRecv(const Step &s, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(s.dt);
    struct Msg {
        bool send;
        int peer;
        size_t count;
    };
    std::vector<Msg> msgs;
    for (int p = 0; p < n; p++) {
        if (Block(s, rank, p) >= 0)
            msgs.push_back({true, p, static_cast<size_t>(Block(s, rank, p))});
        if (Block(s, p, rank) >= 0)
            msgs.push_back({false, p, static_cast<size_t>(Block(s, p, rank))});
    }
    Rng order(s.seed ^ static_cast<uint64_t>(rank + 1));
    for (size_t i = msgs.size(); i > 1; i--)
        std::swap(msgs[i - 1], msgs[order.Below(i)]);
    const size_t ar_at = order.Below(msgs.size() + 1);

    std::vector<Bytes> out(msgs.size());
    std::vector<GuardedBuffer> in;
    in.reserve(msgs.size());
    for (size_t i = 0; i < msgs.size(); i++) {
        in.emplace_back(msgs[i].send ? 0 : msgs[i].count * es);
        if (msgs[i].send)
            out[i] = Pattern(s.seed, rank * 64 + msgs[i].peer, msgs[i].count * es);
    }
    const size_t ar_count = std::min<size_t>(s.count, 4096);
    const Step ar{Kind::kAllReduce, loomFloat32, loomSum, ar_count, 0, false, false, s.seed, 0};
    const Bytes ar_in = ReduceInput(ar, rank, ar_count);
    Bytes ar_out(ar_count * 4);

    XT_CHECK_LOOM(loomGroupStart());
    for (size_t i = 0; i <= msgs.size(); i++) {
        if (i == ar_at && s.with_allreduce)
            XT_CHECK_LOOM(loomAllReduce(ar_in.data(), ar_out.data(), ar_count, loomFloat32, loomSum,
                                        comm, nullptr));
        if (i == msgs.size())
            break;
        if (msgs[i].send)
            XT_CHECK_LOOM(
                loomSend(out[i].data(), msgs[i].count, s.dt, msgs[i].peer, comm, nullptr));
        else
            XT_CHECK_LOOM(loomRecv(in[i].data(), msgs[i].count, s.dt, msgs[i].peer, comm, nullptr));
    }
    XT_CHECK_LOOM(loomGroupEnd());
    for (size_t i = 0; i < msgs.size(); i++) {
        if (msgs[i].send)
            continue;
        Expect(in[i].data(), Pattern(s.seed, msgs[i].peer * 64 + rank, msgs[i].count * es).data(),
               msgs[i].count, s.dt, "message from rank " + std::to_string(msgs[i].peer));
        XT_CHECK(in[i].GuardsIntact());
    }
    if (s.with_allreduce) {
        Bytes want(ar_count * 4);
        loomtest::FillReduceExpected(want.data(), loomFloat32, loomSum, n, s.seed, 0, ar_count);
        Expect(ar_out.data(), want.data(), ar_count, loomFloat32, "all-reduce in the group");
    }
}

void RunStep(const Step &s, int rank, int n, loomComm_t comm)
{
    const size_t es = loomtest::TypeSize(s.dt), bytes = s.count * es;
    const size_t un = static_cast<size_t>(n), ur = static_cast<size_t>(rank);
    switch (s.kind) {
    case Kind::kAllReduce: {
        Bytes in = ReduceInput(s, rank, s.count), want(bytes);
        loomtest::FillReduceExpected(want.data(), s.dt, s.op, n, s.seed, 0, s.count);
        GuardedBuffer out(bytes);
        void *dst = s.inplace ? in.data() : out.data();
        XT_CHECK_LOOM(loomAllReduce(in.data(), dst, s.count, s.dt, s.op, comm, nullptr));
        Expect(dst, want.data(), s.count, s.dt, "result");
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kAllGather: {
        Bytes want(un * bytes);
        for (int r = 0; r < n; r++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(r) * bytes, bytes, r, s.seed);
        GuardedBuffer out(un * bytes);
        Bytes mine = Pattern(s.seed, rank, bytes);
        const void *src = mine.data();
        if (s.inplace) {
            if (bytes)
                memcpy(out.bytes() + ur * bytes, mine.data(), bytes);
            src = out.bytes() + ur * bytes;
        }
        XT_CHECK_LOOM(loomAllGather(src, out.data(), s.count, s.dt, comm, nullptr));
        Expect(out.data(), want.data(), un * s.count, s.dt, "result");
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kReduceScatter: {
        Bytes in = ReduceInput(s, rank, un * s.count), want(bytes);
        loomtest::FillReduceExpected(want.data(), s.dt, s.op, n, s.seed, ur * s.count, s.count);
        GuardedBuffer out(bytes);
        void *dst = s.inplace ? in.data() + ur * bytes : out.data();
        XT_CHECK_LOOM(loomReduceScatter(in.data(), dst, s.count, s.dt, s.op, comm, nullptr));
        Expect(dst, want.data(), s.count, s.dt, "result");
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kBroadcast: {
        const Bytes data = Pattern(s.seed, s.root, bytes);
        Bytes buf = rank == s.root ? data : Bytes(bytes, 0xcd);
        GuardedBuffer out(bytes);
        void *dst = s.inplace ? buf.data() : out.data();
        XT_CHECK_LOOM(loomBroadcast(buf.data(), dst, s.count, s.dt, s.root, comm, nullptr));
        Expect(dst, data.data(), s.count, s.dt, "result");
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kReduce: {
        Bytes in = ReduceInput(s, rank, s.count);
        GuardedBuffer out(bytes);
        void *dst = s.inplace ? in.data() : out.data();
        XT_CHECK_LOOM(loomReduce(in.data(), dst, s.count, s.dt, s.op, s.root, comm, nullptr));
        if (rank == s.root) {
            Bytes want(bytes);
            loomtest::FillReduceExpected(want.data(), s.dt, s.op, n, s.seed, 0, s.count);
            Expect(dst, want.data(), s.count, s.dt, "result on the root");
        }
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kAllToAll: {
        const Bytes mine = Pattern(s.seed, rank, un * bytes);
        Bytes want(un * bytes);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, s.seed,
                                  ur * bytes);
        GuardedBuffer out(un * bytes);
        XT_CHECK_LOOM(loomAllToAll(mine.data(), out.data(), s.count, s.dt, comm, nullptr));
        Expect(out.data(), want.data(), un * s.count, s.dt, "result");
        XT_CHECK(out.GuardsIntact());
        break;
    }
    case Kind::kAllToAllv:
        RunAllToAllv(s, rank, n, comm);
        break;
    case Kind::kSendRecv:
        RunSendRecv(s, rank, n, comm);
        break;
    }
}

// ---- the test
// ------------------------------------------------------------------------------------

uint64_t EnvNumber(const char *name, uint64_t fallback)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, nullptr, 0) : fallback;
}

double Now()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

std::string Summary(const std::vector<Step> &plan)
{
    std::map<std::string, int> kinds;
    int empty = 0, large = 0, inplace = 0, with_ar = 0;
    size_t total = 0, biggest = 0;
    for (const Step &s : plan) {
        kinds[KindName(s.kind)]++;
        empty += s.count == 0;
        large += s.bytes >= (size_t{512} << 10);
        inplace += s.inplace;
        with_ar += s.with_allreduce;
        total += s.bytes;
        biggest = std::max(biggest, s.bytes);
    }
    std::ostringstream os;
    for (const auto &k : kinds)
        os << k.first << " " << k.second << ", ";
    os << "\n  count 0: " << empty << ", >= 512 KiB: " << large << ", in-place: " << inplace
       << ", groups with an all-reduce: " << with_ar << ", largest " << biggest << " bytes, mean "
       << (plan.empty() ? 0 : total / plan.size()) << " bytes";
    return os.str();
}

class Soak : public ::testing::TestWithParam<const char *> {};

TEST_P(Soak, MixedCollectivesVerifiedExactly)
{
    const uint64_t seed = EnvNumber("LOOMTEST_SOAK_SEED", kDefaultSeed);
    const int steps = static_cast<int>(EnvNumber(
        "LOOMTEST_SOAK_OPS", loomtest::UnderSanitizer() ? kSanitizerSteps : kDefaultSteps));
    const std::vector<Step> plan = MakePlan(seed, steps, kRanks);
    printf(
        "soak over %s: %d steps on %d ranks, seed 0x%llx (LOOMTEST_SOAK_SEED replays it)\n  %s\n",
        GetParam(), steps, kRanks, static_cast<unsigned long long>(seed), Summary(plan).c_str());
    fflush(stdout);
    loomtest::RunOptions opts;
    opts.env = {{"LOOM_NET", GetParam()}};
    opts.deadline_s = 280;
    loomtest::ParentReport report;
    const double t0 = Now();
    XT_ASSERT_RUN(loomtest::RunRanks(
        kRanks,
        [&](int rank, int n, loomComm_t comm) {
            for (size_t i = 0; i < plan.size(); i++) {
                loomtest::SetContext(plan[i].Name(i));
                RunStep(plan[i], rank, n, comm);
            }
            if (rank == 0)
                report.Send("  rank 0 verified all " + std::to_string(plan.size()) + " steps");
        },
        opts));
    printf("%s  %.1f s\n", report.Collect().c_str(), Now() - t0);
}

INSTANTIATE_TEST_SUITE_P(Net, Soak, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<const char *> &info) {
                             return std::string(info.param);
                         });

} // namespace

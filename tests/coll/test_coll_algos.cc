// SPDX-License-Identifier: Apache-2.0
//
// test_coll_algos.cc - every collective algorithm, forced with LOOM_ALGO (and LOOM_DETERMINISTIC=0,
// so that those with an order of their own run too), at 1, 2, 3, 4, 5 and 8 ranks over shared
// memory and at 3 and 5 over tcp, for counts 0, 1, nranks-1, small odd primes and a few MiB, with
// fp32 sum, int32 max, bf16 sum, fp64 avg and fp32 max over signed zeros, in place and out of
// place. Reductions use inputs whose sums depend on the grouping of the additions (random
// mantissas and exponents) and, for max, on the order of the operands of each combine (+0 and
// -0 compare equal), and the expected value of each element is computed here in the order
// docs/ALGORITHMS.md documents for that algorithm (a tree per algorithm, rebuilt from the
// documentation, not from the code), so a result is right only if the algorithm reduces in its
// documented order; results must be bitwise equal. Also checked: identical outputs on every rank,
// identical reruns, untouched send buffers and guard bytes, and (from the COLL trace) that the
// forced algorithm really ran. Data-movement collectives move random bit patterns. Run by meson's
// 'coll' suite.

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

using loomtest::GuardedBuffer;

// ---- Reduction order, as docs/ALGORITHMS.md states it -----------------------------------------

// A reduction tree in postfix: a rank's input (>= 0) or kCombine, which pops b, pops a and pushes
// a op b (a is the accumulator, b the incoming partial).
constexpr int kCombine = -1;
using Program = std::vector<int>;

// ((x0 op x1) op x2) ... op x[n-1]: the direct algorithms (rank order, one owner).
Program Linear(int n)
{
    Program p{0};
    for (int r = 1; r < n; r++) {
        p.push_back(r);
        p.push_back(kCombine);
    }
    return p;
}

// Ring: block b starts at rank b+1 and travels the ring: ((x[b+1] op x[b+2]) op ...) op x[b];
// with two ranks, x0 op x1 for both blocks (rank order).
Program RingChain(int n, int b)
{
    if (n == 2)
        return Linear(n);
    Program p{(b + 1) % n};
    for (int k = 2; k <= n; k++) {
        p.push_back((b + k) % n);
        p.push_back(kCombine);
    }
    return p;
}

// Butterfly (recursive doubling / halving): fold n onto p = 2^floor(log2 n) virtual ranks (the
// first 2(n-p) ranks in pairs, even rank first), then pairs at distance p/2, p/4, ..., 1, the
// lower virtual rank's partial first.
Program Butterfly(int n)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    const int rem = n - p;
    std::vector<Program> val(static_cast<size_t>(p));
    for (int v = 0; v < p; v++)
        val[v] = v < rem ? Program{2 * v, 2 * v + 1, kCombine} : Program{v + rem};
    for (int d = p / 2; d >= 1; d /= 2)
        for (int v = 0; v < p; v++)
            if ((v & d) == 0) {
                val[v].insert(val[v].end(), val[v + d].begin(), val[v + d].end());
                val[v].push_back(kCombine);
            }
    return val[0];
}

// Binomial tree in ranks relative to the root: node vr takes its own data and adds its children
// vr+1, vr+2, vr+4, ... (below vr's lowest set bit, or n for the root) in that order.
void BinomialAt(int n, int root, int vr, Program &p)
{
    p.push_back((vr + root) % n);
    int top = 1;
    if (vr == 0)
        while (top < n)
            top <<= 1;
    else
        top = vr & -vr;
    for (int m = 1; m < top && vr + m < n; m <<= 1) {
        BinomialAt(n, root, vr + m, p);
        p.push_back(kCombine);
    }
}

Program Binomial(int n, int root)
{
    Program p;
    BinomialAt(n, root, 0, p);
    return p;
}

// loom_split: part r of count over n parts.
void Split(size_t count, int n, int r, size_t *off, size_t *len)
{
    const size_t base = count / static_cast<size_t>(n), rem = count % static_cast<size_t>(n);
    const size_t ur = static_cast<size_t>(r);
    *len = base + (ur < rem ? 1 : 0);
    *off = ur * base + (ur < rem ? ur : rem);
}

// ---- Order-sensitive inputs -------------------------------------------------------------------

// kF32MaxZero: float max over mostly +0 and -0, which compare equal; the kernels then keep the
// incoming operand, so the sign of the result tells which operand each combine took last.
enum class Pair { kF32Sum, kI32Max, kBf16Sum, kF64Avg, kF32MaxZero };
constexpr Pair kPairs[] = {Pair::kF32Sum, Pair::kI32Max, Pair::kBf16Sum, Pair::kF64Avg,
                           Pair::kF32MaxZero};

loomDataType_t PairType(Pair p)
{
    switch (p) {
    case Pair::kF32Sum:
    case Pair::kF32MaxZero:
        return loomFloat32;
    case Pair::kI32Max:
        return loomInt32;
    case Pair::kBf16Sum:
        return loomBfloat16;
    default:
        return loomFloat64;
    }
}

loomRedOp_t PairOp(Pair p)
{
    if (p == Pair::kI32Max || p == Pair::kF32MaxZero)
        return loomMax;
    return p == Pair::kF64Avg ? loomAvg : loomSum;
}

uint64_t Hash(uint64_t seed, int rank, size_t i)
{
    return loomtest::Mix64(seed ^ (static_cast<uint64_t>(rank) << 48) ^
                           loomtest::Mix64(static_cast<uint64_t>(i) + 0x9e37));
}

// A value with a random sign, a random mantissa and an exponent in [-6, 6]: sums of such
// values round differently in different orders. Exact in the target format.
double RandomReal(uint64_t h, int mant_bits)
{
    static const double kPow2[13] = {1.0 / 64, 1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1,
                                     2,        4,        8,        16,      32,      64};
    const double frac = static_cast<double>(h >> (64 - mant_bits)) / std::ldexp(1.0, mant_bits);
    return ((h & 1) ? -1.0 : 1.0) * (1.0 + frac) * kPow2[(h >> 4) % 13];
}

void FillInput(void *buf, Pair pair, int rank, uint64_t seed, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const uint64_t h = Hash(seed, rank, i);
        switch (pair) {
        case Pair::kF32Sum:
            static_cast<float *>(buf)[i] = static_cast<float>(RandomReal(h, 23));
            break;
        case Pair::kI32Max:
            static_cast<int32_t *>(buf)[i] = static_cast<int32_t>(h >> 32);
            break;
        case Pair::kBf16Sum: // the bits of RandomReal(h, 7), built directly
            static_cast<uint16_t *>(buf)[i] =
                static_cast<uint16_t>((h & 1) << 15 | (127 - 6 + (h >> 4) % 13) << 7 | h >> 57);
            break;
        case Pair::kF64Avg:
            static_cast<double *>(buf)[i] = RandomReal(h, 52);
            break;
        case Pair::kF32MaxZero:
            static_cast<float *>(buf)[i] =
                (h >> 8) % 8 ? ((h & 1) ? -0.0f : 0.0f) : static_cast<float>(RandomReal(h, 23));
            break;
        }
    }
}

// Evaluates prog for element i in the accumulator type A (float for fp32 and bf16, double for
// fp64), exactly as the kernels do: inputs widened, one operation per combine; max keeps the
// incoming operand unless the accumulator is greater (kernels.h).
template <typename A>
A Eval(const Program &prog, const std::vector<const void *> &in, Pair pair, size_t i)
{
    A stack[64];
    int sp = 0;
    for (int op : prog) {
        if (op == kCombine) {
            sp--;
            const A acc = stack[sp - 1], in = stack[sp];
            stack[sp - 1] = pair == Pair::kF32MaxZero ? (acc > in ? acc : in) : acc + in;
            continue;
        }
        A x;
        if (pair == Pair::kBf16Sum)
            x = static_cast<A>(loomtest::RefBf16ToFloat(static_cast<const uint16_t *>(in[op])[i]));
        else if (pair == Pair::kF32Sum || pair == Pair::kF32MaxZero)
            x = static_cast<A>(static_cast<const float *>(in[op])[i]);
        else
            x = static_cast<A>(static_cast<const double *>(in[op])[i]);
        stack[sp++] = x;
    }
    return stack[0];
}

// The expected result of element i, reduced along prog over n ranks' inputs.
void ExpectElement(void *out, size_t j, const Program &prog, const std::vector<const void *> &in,
                   Pair pair, size_t i, int n)
{
    switch (pair) {
    case Pair::kF32Sum:
    case Pair::kF32MaxZero:
        static_cast<float *>(out)[j] = Eval<float>(prog, in, pair, i);
        break;
    case Pair::kBf16Sum:
        static_cast<uint16_t *>(out)[j] = loomtest::RefFloatToBf16(Eval<float>(prog, in, pair, i));
        break;
    case Pair::kF64Avg:
        static_cast<double *>(out)[j] = Eval<double>(prog, in, pair, i) / n;
        break;
    case Pair::kI32Max: {
        int32_t m = static_cast<const int32_t *>(in[0])[i];
        for (int r = 1; r < n; r++)
            m = std::max(m, static_cast<const int32_t *>(in[r])[i]);
        static_cast<int32_t *>(out)[j] = m;
        break;
    }
    }
}

// ---- Cases ------------------------------------------------------------------------------------

struct Case {
    Pair pair;
    size_t count; // the API's count (per rank for AllGather, ReduceScatter, AllToAll)
    bool inplace;
    int root;
    uint64_t seed;

    std::string Name(loomCollective_t coll) const
    {
        return std::string(loomtest::CollSpelling(coll)) + " " +
               loomtest::TypeName(PairType(pair)) + " " + loomtest::OpName(PairOp(pair)) +
               " count " + std::to_string(count) + (inplace ? " in-place" : " out-of-place") +
               " root " + std::to_string(root);
    }
};

// A few MiB of data in all: the per-rank count of the collective for about 2 MiB (1 MiB above
// 4 ranks, where every rank computes the expected values of more inputs on the same cores).
size_t BigCount(loomCollective_t coll, Pair pair, int n)
{
    const size_t mib = n > 4 ? 1 : 2;
    const size_t elems = (mib << 20) / loomtest::TypeSize(PairType(pair)) + 3;
    const bool per_rank =
        coll == loomCollAllGather || coll == loomCollReduceScatter || coll == loomCollAllToAll;
    return per_rank ? elems / static_cast<size_t>(n) + 1 : elems;
}

std::vector<Case> MakeCases(loomCollective_t coll, int n)
{
    std::vector<size_t> counts{0, 1, 2, 7, 13, 1031};
    if (n > 3)
        counts.push_back(static_cast<size_t>(n - 1));
    std::vector<Case> cases;
    uint64_t k = 0;
    auto add = [&](Pair pair, size_t count, bool inplace) {
        if (inplace && coll == loomCollAllToAll)
            inplace = false;
        int root = static_cast<int>(loomtest::Mix64(k) % static_cast<uint64_t>(n));
        cases.push_back({pair, count, inplace, root, loomtest::Mix64(k * 977 + 5)});
        k++;
    };
    // Every pair at every count, alternating in place and out of place; both at count 13.
    for (size_t i = 0; i < counts.size(); i++)
        for (size_t j = 0; j < sizeof(kPairs) / sizeof(kPairs[0]); j++) {
            add(kPairs[j], counts[i], (i + j) % 2 != 0);
            if (counts[i] == 13)
                add(kPairs[j], counts[i], (i + j) % 2 == 0);
        }
    // The large cases: order-sensitive float sums, one out of place and one in place.
    add(Pair::kF32Sum, BigCount(coll, Pair::kF32Sum, n), false);
    add(Pair::kBf16Sum, BigCount(coll, Pair::kBf16Sum, n), true);
    return cases;
}

// ---- One case on one rank ---------------------------------------------------------------------

struct Outcome {
    std::string failure;
    uint64_t checksum = 0;
};

void Check(Outcome &o, const void *got, const void *want, size_t count, loomDataType_t dt,
           const std::string &what)
{
    const std::string diff = loomtest::CompareElements(got, want, count, dt);
    if (!diff.empty() && o.failure.empty())
        o.failure = what + ": " + diff;
}

void CheckTrue(Outcome &o, bool ok, const std::string &what)
{
    if (!ok && o.failure.empty())
        o.failure = what;
}

std::vector<std::vector<unsigned char>> AllInputs(const Case &c, int n, size_t count)
{
    const size_t es = loomtest::TypeSize(PairType(c.pair));
    std::vector<std::vector<unsigned char>> in(static_cast<size_t>(n));
    for (int r = 0; r < n; r++) {
        in[r].resize(count * es);
        FillInput(in[r].data(), c.pair, r, c.seed, count);
    }
    return in;
}

std::vector<const void *> Pointers(const std::vector<std::vector<unsigned char>> &in)
{
    std::vector<const void *> p;
    for (const auto &v : in)
        p.push_back(v.data());
    return p;
}

Outcome RunReducing(loomCollective_t coll, const std::string &algo, const Case &c, int rank, int n,
                    loomComm_t comm)
{
    Outcome o;
    const loomDataType_t dt = PairType(c.pair);
    const loomRedOp_t op = PairOp(c.pair);
    const size_t es = loomtest::TypeSize(dt);
    const size_t un = static_cast<size_t>(n), ur = static_cast<size_t>(rank);
    const size_t in_count = coll == loomCollReduceScatter ? un * c.count : c.count;
    const auto inputs = AllInputs(c, n, in_count);
    const auto ptrs = Pointers(inputs);
    const auto &mine = inputs[ur];
    GuardedBuffer send(mine.size()), recv(c.count * es);
    if (!mine.empty())
        memcpy(send.data(), mine.data(), mine.size());

    // Which elements this rank checks, and the tree of each.
    const size_t first = coll == loomCollReduceScatter ? ur * c.count : 0;
    std::vector<unsigned char> want(c.count * es);
    const bool checks = coll != loomCollReduce || rank == c.root;
    if (checks) {
        Program fixed;
        if (algo == "direct" || algo == "reduce_bcast" || algo == "rd" || algo == "chain")
            fixed = Linear(n);
        else if (algo == "rhd")
            fixed = Butterfly(n);
        else if (algo == "binomial")
            fixed = Binomial(n, c.root);
        else if (coll == loomCollReduceScatter) // ring: the block is this rank's
            fixed = RingChain(n, rank);
        int block = -1;
        size_t block_end = 0;
        Program ring;
        for (size_t j = 0; j < c.count; j++) {
            const Program *prog = &fixed;
            if (algo == "ring" && coll == loomCollAllReduce) {
                if (j >= block_end) { // next block of loom_split(count, n)
                    size_t off = 0, len = 0;
                    do
                        Split(c.count, n, ++block, &off, &len);
                    while (off + len <= j);
                    block_end = off + len;
                    ring = RingChain(n, block);
                }
                prog = &ring;
            }
            ExpectElement(want.data(), j, *prog, ptrs, c.pair, first + j, n);
        }
    }

    void *out = nullptr;
    switch (coll) {
    case loomCollAllReduce:
        out = c.inplace ? send.data() : recv.data();
        XT_CHECK_LOOM(loomAllReduce(send.data(), out, c.count, dt, op, comm, nullptr));
        break;
    case loomCollReduceScatter:
        out = c.inplace ? send.bytes() + ur * c.count * es : recv.data();
        XT_CHECK_LOOM(loomReduceScatter(send.data(), out, c.count, dt, op, comm, nullptr));
        break;
    default:
        out = c.inplace ? send.data() : recv.data();
        XT_CHECK_LOOM(loomReduce(send.data(), out, c.count, dt, op, c.root, comm, nullptr));
        break;
    }
    if (checks) {
        Check(o, out, want.data(), c.count, dt, "wrong result");
        o.checksum = loomtest::Checksum(out, c.count * es);
    }
    if (!c.inplace || (coll == loomCollReduce && rank != c.root))
        Check(o, send.data(), mine.data(), in_count, dt, "send buffer changed");
    CheckTrue(o, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
    return o;
}

Outcome RunMoving(loomCollective_t coll, const Case &c, int rank, int n, loomComm_t comm)
{
    Outcome o;
    const loomDataType_t dt = PairType(c.pair);
    const size_t es = loomtest::TypeSize(dt), bytes = c.count * es;
    const size_t un = static_cast<size_t>(n), ur = static_cast<size_t>(rank);
    switch (coll) {
    case loomCollAllGather: {
        std::vector<unsigned char> want(un * bytes);
        for (int r = 0; r < n; r++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(r) * bytes, bytes, r, c.seed);
        GuardedBuffer send(bytes), recv(un * bytes);
        if (bytes)
            memcpy(send.data(), want.data() + ur * bytes, bytes);
        const void *sendp = send.data();
        if (c.inplace) {
            if (bytes)
                memcpy(recv.bytes() + ur * bytes, want.data() + ur * bytes, bytes);
            sendp = recv.bytes() + ur * bytes;
        }
        XT_CHECK_LOOM(loomAllGather(sendp, recv.data(), c.count, dt, comm, nullptr));
        Check(o, recv.data(), want.data(), un * c.count, dt, "wrong result");
        CheckTrue(o, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        o.checksum = loomtest::Checksum(recv.data(), un * bytes);
        break;
    }
    case loomCollBroadcast: {
        std::vector<unsigned char> data(bytes);
        loomtest::FillPattern(data.data(), bytes, c.root, c.seed);
        GuardedBuffer send(bytes), recv(bytes);
        if (rank == c.root && bytes)
            memcpy(send.data(), data.data(), bytes);
        void *recvp = c.inplace ? send.data() : recv.data();
        XT_CHECK_LOOM(loomBroadcast(send.data(), recvp, c.count, dt, c.root, comm, nullptr));
        Check(o, recvp, data.data(), c.count, dt, "wrong result");
        CheckTrue(o, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        o.checksum = loomtest::Checksum(recvp, bytes);
        break;
    }
    default: { // AllToAll
        std::vector<unsigned char> mine(un * bytes), want(un * bytes);
        loomtest::FillPattern(mine.data(), un * bytes, rank, c.seed);
        for (int j = 0; j < n; j++)
            loomtest::FillPattern(want.data() + static_cast<size_t>(j) * bytes, bytes, j, c.seed,
                                  ur * bytes);
        GuardedBuffer send(un * bytes), recv(un * bytes);
        if (bytes)
            memcpy(send.data(), mine.data(), un * bytes);
        XT_CHECK_LOOM(loomAllToAll(send.data(), recv.data(), c.count, dt, comm, nullptr));
        Check(o, recv.data(), want.data(), un * c.count, dt, "wrong result");
        Check(o, send.data(), mine.data(), un * c.count, dt, "send buffer changed");
        CheckTrue(o, send.GuardsIntact() && recv.GuardsIntact(), "write outside the buffers");
        o.checksum = loomtest::Checksum(recv.data(), un * bytes);
        break;
    }
    }
    return o;
}

Outcome RunCase(loomCollective_t coll, const std::string &algo, const Case &c, int rank, int n,
                loomComm_t comm)
{
    return loomtest::Reducing(coll) ? RunReducing(coll, algo, c, rank, n, comm)
                                    : RunMoving(coll, c, rank, n, comm);
}

// Every trace line of the forced collective names the forced algorithm; returns how many.
int CountTraced(const std::string &path, loomCollective_t coll, const std::string &algo,
                std::string *bad)
{
    std::ifstream f(path);
    std::string line;
    const std::string head = std::string(" ") + loomtest::CollSpelling(coll) + " seq ";
    int count = 0;
    while (std::getline(f, line)) {
        if (line.find(head) == std::string::npos)
            continue;
        if (line.find(" algo " + algo + " ") == std::string::npos && bad->empty())
            *bad = line;
        count++;
    }
    return count;
}

void RunAlgo(loomCollective_t coll, const std::string &algo, int rank, int n, loomComm_t comm)
{
    const std::vector<Case> cases = MakeCases(coll, n);
    std::vector<uint64_t> sums;
    int failures = 0;
    auto report = [&](const Case &c, const std::string &what) {
        if (failures++ < 20)
            fprintf(stderr, "rank %d: FAIL %s (%s): %s\n", rank, c.Name(coll).c_str(), algo.c_str(),
                    what.c_str());
    };
    for (size_t k = 0; k < cases.size(); k++) {
        const Case &c = cases[k];
        loomtest::SetContext(c.Name(coll) + " algo " + algo);
        Outcome first = RunCase(coll, algo, c, rank, n, comm);
        if (!first.failure.empty())
            report(c, first.failure);
        if (k % 7 == 3 || k + 2 == cases.size()) { // reruns give the same bits
            Outcome again = RunCase(coll, algo, c, rank, n, comm);
            if (again.checksum != first.checksum)
                report(c, "second run differs from the first");
        }
        sums.push_back(first.checksum);
    }
    // Identical results on every rank where the collective gives every rank the same output.
    if (coll == loomCollAllReduce || coll == loomCollAllGather || coll == loomCollBroadcast) {
        loomtest::SetContext("comparing checksums across ranks");
        std::vector<uint64_t> all(sums.size() * static_cast<size_t>(n));
        XT_CHECK_LOOM(
            loomAllGather(sums.data(), all.data(), sums.size(), loomUint64, comm, nullptr));
        for (size_t k = 0; k < sums.size(); k++)
            for (int r = 0; r < n; r++)
                if (all[static_cast<size_t>(r) * sums.size() + k] != sums[k])
                    report(cases[k], "output differs from rank " + std::to_string(r) + "'s");
    }
    std::string bad;
    const int traced = CountTraced(loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log",
                                   coll, algo, &bad);
    XT_CHECK_MSG(bad.empty(), "another algorithm ran: " + bad);
    XT_CHECK_MSG(traced >= static_cast<int>(cases.size()), "too few trace lines");
    fprintf(stderr, "rank %d: %zu cases, %d failures\n", rank, cases.size(), failures);
    XT_CHECK_EQ(failures, 0);
}

// ---- The gtest grid ---------------------------------------------------------------------------

struct AlgoParam {
    loomCollective_t coll;
    const char *algo;
    int nranks;
    const char *net; // LOOM_NET: the point-to-point transport under the algorithm
};

std::string ParamName(const AlgoParam &p)
{
    return std::string(loomtest::CollSpelling(p.coll)) + "_" + p.algo + "_" +
           std::to_string(p.nranks) + "ranks" +
           (std::string(p.net) == "shm" ? "" : std::string("_") + p.net);
}

void PrintTo(const AlgoParam &p, std::ostream *os)
{
    *os << ParamName(p);
}

std::vector<AlgoParam> AllParams()
{
    const std::pair<loomCollective_t, const char *> algos[] = {
        {loomCollAllReduce, "rd"},
        {loomCollAllReduce, "rhd"},
        {loomCollAllReduce, "ring"},
        {loomCollAllReduce, "direct"},
        {loomCollAllReduce, "reduce_bcast"},
        {loomCollAllGather, "rd"},
        {loomCollAllGather, "ring"},
        {loomCollAllGather, "direct"},
        {loomCollReduceScatter, "rhd"},
        {loomCollReduceScatter, "ring"},
        {loomCollReduceScatter, "direct"},
        {loomCollBroadcast, "binomial"},
        {loomCollBroadcast, "scatter_allgather"},
        {loomCollBroadcast, "direct"},
        {loomCollReduce, "binomial"},
        {loomCollReduce, "chain"},
        {loomCollReduce, "direct"},
        {loomCollAllToAll, "bruck"},
        {loomCollAllToAll, "pairwise"}};
    std::vector<AlgoParam> params;
    for (const auto &a : algos)
        for (int n : {1, 2, 3, 4, 5, 8})
            params.push_back({a.first, a.second, n, "shm"});
    // The order is the algorithm's, whatever carries its messages.
    for (const auto &a : algos)
        for (int n : {3, 5})
            params.push_back({a.first, a.second, n, "tcp"});
    return params;
}

class Algos : public ::testing::TestWithParam<AlgoParam> {};

TEST_P(Algos, ForcedAlgorithm)
{
    const AlgoParam p = GetParam();
    loomtest::RunOptions opts;
    // A small chunk makes the larger cases use several pipeline segments and rounds. Every
    // algorithm runs, also those with an order of their own (LOOM_DETERMINISTIC=0).
    opts.env = {{"LOOM_NET", "shm"},
                {"LOOM_ALGO", std::string(loomtest::CollSpelling(p.coll)) + ":" + p.algo},
                {"LOOM_DETERMINISTIC", "0"},
                {"LOOM_CHUNK_BYTES", "65536"},
                {"LOOM_COLL_TRACE", "1"},
                {"LOOM_DEBUG", "INFO"},
                {"LOOM_DEBUG_SUBSYS", "COLL"}};
    opts.rank_env = [](int rank) {
        return loomtest::EnvList{
            {"LOOM_DEBUG_FILE", loomtest::RunDir() + "/trace" + std::to_string(rank) + ".log"}};
    };
    opts.deadline_s = 60;
    const std::string algo = p.algo;
    XT_ASSERT_RUN(loomtest::RunRanks(
        p.nranks, [&](int rank, int n, loomComm_t comm) { RunAlgo(p.coll, algo, rank, n, comm); },
        opts));
}

// The paced exchanges (AllGather and AllToAll direct, Broadcast direct) cut each transfer into
// pieces that both ends must agree on: when rank 0 passes a smaller count than the others, the
// first message of its call already says so (the call stamps, docs/reliability.md): the ranks
// that receive from it fail with InvalidUsage naming the count, and rank 0 fails too; nothing
// hangs.
TEST(Paced, DifferentCountsAreAnError)
{
    for (const char *algo : {"allgather:direct", "alltoall:pairwise"}) {
        loomtest::RunOptions opts;
        opts.env = {{"LOOM_NET", "shm"},
                    {"LOOM_SHM_COLL", "0"},
                    {"LOOM_ALGO", algo},
                    {"LOOM_CHUNK_BYTES", "4096"},
                    {"LOOM_TIMEOUT_MS", "20000"}};
        opts.create_comm = false;
        opts.deadline_s = 60;
        const std::string name = algo;
        XT_ASSERT_RUN(loomtest::RunRanks(
            3,
            [&](int rank, int n, loomComm_t) {
                loomComm_t comm = loomtest::CreateComm();
                const size_t count = rank == 0 ? 3000 : 3001; // one piece short on the last
                std::vector<float> send(count * static_cast<size_t>(n), 1.0f),
                    recv(count * static_cast<size_t>(n) + 64);
                const loomResult_t res =
                    name == "allgather:direct"
                        ? loomAllGather(send.data(), recv.data(), count, loomFloat32, comm, nullptr)
                        : loomAllToAll(send.data(), recv.data(), count, loomFloat32, comm, nullptr);
                XT_CHECK_MSG(res != loomSuccess, name + ": different counts were accepted");
                if (rank != 0 && res == loomInvalidUsage) {
                    const std::string msg = loomGetLastError(comm);
                    XT_CHECK_MSG(msg.find("differ in count") != std::string::npos, msg);
                }
                loomCommDestroy(comm); // may report the broken connections
            },
            opts));
    }
}

INSTANTIATE_TEST_SUITE_P(Coll, Algos, ::testing::ValuesIn(AllParams()),
                         [](const ::testing::TestParamInfo<AlgoParam> &info) {
                             return ParamName(info.param);
                         });

} // namespace
